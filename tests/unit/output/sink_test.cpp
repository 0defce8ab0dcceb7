// Tests of the atomic file sink: mode, symlinks, shared directories, injected failures, cleanup.
#include <doctest/doctest.h>

#include <signal.h>
#include <stdlib.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include "selfprof/output/sink.hpp"

namespace {

namespace fs = std::filesystem;
using selfprof::detail::write_file_atomic;

struct temp_dir {
  std::string path;
  temp_dir() {
    char tmpl[] = "/tmp/selfprof-sink-XXXXXX";
    const char* p = ::mkdtemp(tmpl);
    REQUIRE(p != nullptr);
    path = p;
  }
  ~temp_dir() {
    std::error_code ec;
    fs::permissions(path, fs::perms::owner_all, ec);
    fs::remove_all(path, ec);
  }
  std::string operator/(const std::string& name) const { return path + "/" + name; }
  // Names in the directory other than `keep` (temp files left behind would show up here).
  int entries() const {
    int n = 0;
    for (const auto& e : fs::directory_iterator(path)) {
      (void)e;
      ++n;
    }
    return n;
  }
};

std::string slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

struct restore_syscalls {
  ~restore_syscalls() { selfprof::detail::sys() = selfprof::detail::default_syscalls(); }
};

}  // namespace

TEST_CASE("sink: writes the bytes with mode 0600 whatever the umask") {
  temp_dir d;
  const mode_t old = ::umask(0);
  const auto st = write_file_atomic(d / "a.folded", std::string("main;f 3\n"));
  ::umask(old);
  REQUIRE_MESSAGE(st.is_ok(), st.message());
  CHECK(slurp(d / "a.folded") == "main;f 3\n");
  struct stat sb {};
  REQUIRE(::lstat((d / "a.folded").c_str(), &sb) == 0);
  CHECK((sb.st_mode & 07777) == 0600);
  CHECK(d.entries() == 1);  // no temp file left behind
}

TEST_CASE("sink: binary bytes with NULs survive") {
  temp_dir d;
  const std::string bytes("a\0b\0\xff", 5);
  REQUIRE(write_file_atomic(d / "x.pb.gz", bytes).is_ok());
  CHECK(slurp(d / "x.pb.gz") == bytes);
}

TEST_CASE("sink: overwrite replaces the content and keeps one file") {
  temp_dir d;
  REQUIRE(write_file_atomic(d / "p.txt", std::string("old content that is longer\n")).is_ok());
  REQUIRE(write_file_atomic(d / "p.txt", std::string("new\n")).is_ok());
  CHECK(slurp(d / "p.txt") == "new\n");
  CHECK(d.entries() == 1);
}

TEST_CASE("sink: a 250-byte file name still gets a temp file") {
  temp_dir d;
  const std::string name = std::string(240, 'n') + ".folded";
  const auto st = write_file_atomic(d / name, std::string("x 1\n"));
  REQUIRE_MESSAGE(st.is_ok(), st.message());
  CHECK(slurp(d / name) == "x 1\n");
  CHECK(d.entries() == 1);
}

TEST_CASE("sink: a relative path without a directory writes into the working directory") {
  temp_dir d;
  const auto cwd = fs::current_path();
  fs::current_path(d.path);
  const auto st = write_file_atomic("rel.folded", std::string("x 1\n"));
  fs::current_path(cwd);
  REQUIRE_MESSAGE(st.is_ok(), st.message());
  CHECK(slurp(d / "rel.folded") == "x 1\n");
}

TEST_CASE("sink: refuses a symlink target and writes nothing through it") {
  temp_dir d;
  REQUIRE(write_file_atomic(d / "victim", std::string("precious\n")).is_ok());
  REQUIRE(::symlink((d / "victim").c_str(), (d / "out.folded").c_str()) == 0);
  const auto st = write_file_atomic(d / "out.folded", std::string("evil\n"));
  CHECK_FALSE(st.is_ok());
  CHECK(st.message().find("cannot write " + (d / "out.folded")) != std::string::npos);
  CHECK(st.message().find("symbolic link") != std::string::npos);
  CHECK(slurp(d / "victim") == "precious\n");
  CHECK(fs::is_symlink(d / "out.folded"));
  CHECK(d.entries() == 2);
}

TEST_CASE("sink: refuses a dangling symlink and does not create its destination") {
  temp_dir d;
  REQUIRE(::symlink((d / "created-by-attacker").c_str(), (d / "out.folded").c_str()) == 0);
  const auto st = write_file_atomic(d / "out.folded", std::string("x 1\n"));
  CHECK_FALSE(st.is_ok());
  CHECK(st.message().find("symbolic link") != std::string::npos);
  CHECK_FALSE(fs::exists(d / "created-by-attacker"));
}

TEST_CASE("sink: refuses a target that is a directory or a FIFO") {
  temp_dir d;
  REQUIRE(::mkdir((d / "dir").c_str(), 0700) == 0);
  auto st = write_file_atomic(d / "dir", std::string("x"));
  CHECK_FALSE(st.is_ok());
  CHECK(st.message().find("not a regular file") != std::string::npos);
  REQUIRE(::mkfifo((d / "fifo").c_str(), 0600) == 0);
  st = write_file_atomic(d / "fifo", std::string("x"));
  CHECK_FALSE(st.is_ok());
  CHECK(st.message().find("not a regular file") != std::string::npos);
}

TEST_CASE("sink: a missing directory names the path and strerror") {
  temp_dir d;
  const std::string path = d / "missing/sub/y.folded";
  const auto st = write_file_atomic(path, std::string("x 1\n"));
  CHECK_FALSE(st.is_ok());
  CHECK(st.message().rfind("selfprof: cannot write " + path + ": ", 0) == 0);
  CHECK(st.message().find("No such file or directory") != std::string::npos);
}

TEST_CASE("sink: empty path and trailing slash are errors, not crashes") {
  CHECK_FALSE(write_file_atomic("", std::string("x")).is_ok());
  temp_dir d;
  const auto st = write_file_atomic(d.path + "/", std::string("x"));
  CHECK_FALSE(st.is_ok());
  CHECK(st.message().find("not a file name") != std::string::npos);
}

TEST_CASE("sink: EACCES injected through the seam (a read-only directory even for root)") {
  temp_dir d;
  REQUIRE(write_file_atomic(d / "keep.folded", std::string("old 1\n")).is_ok());
  restore_syscalls restore;
  selfprof::detail::sys().openat = [](int, const char*, int, mode_t) -> int {
    errno = EACCES;
    return -1;
  };
  const auto st = write_file_atomic(d / "keep.folded", std::string("new 1\n"));
  CHECK_FALSE(st.is_ok());
  CHECK(st.message() == "selfprof: cannot write " + (d / "keep.folded") + ": Permission denied");
  CHECK(slurp(d / "keep.folded") == "old 1\n");
  CHECK(d.entries() == 1);
}

TEST_CASE("sink: EMFILE opening the directory is reported") {
  temp_dir d;
  restore_syscalls restore;
  selfprof::detail::sys().open = [](const char*, int, mode_t) -> int {
    errno = EMFILE;
    return -1;
  };
  const auto st = write_file_atomic(d / "z.folded", std::string("x 1\n"));
  CHECK_FALSE(st.is_ok());
  CHECK(st.message().find("Too many open files") != std::string::npos);
}

namespace {
int g_closes_to_fail = 0;
int failing_close(int fd) {
  ::close(fd);
  if (g_closes_to_fail-- > 0) {
    errno = EIO;
    return -1;
  }
  return 0;
}
}  // namespace

TEST_CASE("sink: a close error (delayed write-back failure) removes the temp file") {
  temp_dir d;
  restore_syscalls restore;
  g_closes_to_fail = 1;  // the first close is the temp file's
  selfprof::detail::sys().close = failing_close;
  const auto st = write_file_atomic(d / "c.folded", std::string("x 1\n"));
  CHECK_FALSE(st.is_ok());
  CHECK(st.message().find("Input/output error (close)") != std::string::npos);
  CHECK(d.entries() == 0);
}

TEST_CASE("sink: a write that fails halfway (file size limit) removes the temp file") {
  temp_dir d;
  REQUIRE(write_file_atomic(d / "big.folded", std::string("old 1\n")).is_ok());
  struct rlimit old {};
  REQUIRE(::getrlimit(RLIMIT_FSIZE, &old) == 0);
  auto old_handler = ::signal(SIGXFSZ, SIG_IGN);
  struct rlimit small = old;
  small.rlim_cur = 16;
  REQUIRE(::setrlimit(RLIMIT_FSIZE, &small) == 0);
  const auto st = write_file_atomic(d / "big.folded", std::string(4096, 'x'));
  ::setrlimit(RLIMIT_FSIZE, &old);
  ::signal(SIGXFSZ, old_handler);
  CHECK_FALSE(st.is_ok());
  CHECK(st.message().find("File too large (write)") != std::string::npos);
  CHECK(slurp(d / "big.folded") == "old 1\n");
  CHECK(d.entries() == 1);
}

TEST_CASE("sink: a directory writable by others without the sticky bit is refused unless allowed") {
  temp_dir d;
  const std::string shared = d / "shared";
  REQUIRE(::mkdir(shared.c_str(), 0700) == 0);
  REQUIRE(::chmod(shared.c_str(), 0777) == 0);
  auto st = write_file_atomic(shared + "/p.folded", std::string("x 1\n"));
  CHECK_FALSE(st.is_ok());
  CHECK(st.message().find("writable by other users") != std::string::npos);
  CHECK_FALSE(fs::exists(shared + "/p.folded"));

  selfprof::sink_options opts;
  opts.allow_shared_dir = true;
  st = write_file_atomic(shared + "/p.folded", std::string("x 1\n"), opts);
  CHECK_MESSAGE(st.is_ok(), st.message());

  REQUIRE(::chmod(shared.c_str(), 01777) == 0);  // sticky, like /tmp
  st = write_file_atomic(shared + "/q.folded", std::string("y 2\n"));
  CHECK_MESSAGE(st.is_ok(), st.message());
  CHECK(slurp(shared + "/q.folded") == "y 2\n");
}

TEST_CASE("sink: in a sticky shared directory a target owned by another user is refused") {
  if (::geteuid() != 0) return;  // needs chown to make a file that belongs to someone else
  temp_dir d;
  const std::string shared = d / "sticky";
  REQUIRE(::mkdir(shared.c_str(), 0700) == 0);
  REQUIRE(::chmod(shared.c_str(), 01777) == 0);
  { std::ofstream(shared + "/planted.folded") << "planted 1\n"; }
  REQUIRE(::chown((shared + "/planted.folded").c_str(), 65534, 65534) == 0);
  const auto st = write_file_atomic(shared + "/planted.folded", std::string("x 1\n"));
  CHECK_FALSE(st.is_ok());
  CHECK(st.message().find("belongs to another user (uid 65534)") != std::string::npos);
  CHECK(slurp(shared + "/planted.folded") == "planted 1\n");
}

TEST_CASE("sink: dir_is_shared classifies modes") {
  struct stat st {};
  st.st_gid = ::getegid();
  st.st_mode = S_IFDIR | 0755;
  CHECK_FALSE(selfprof::detail::dir_is_shared(st));
  st.st_mode = S_IFDIR | 0775;  // user-private group
  CHECK_FALSE(selfprof::detail::dir_is_shared(st));
  st.st_gid = ::getegid() + 1;
  CHECK(selfprof::detail::dir_is_shared(st));
  st.st_mode = S_IFDIR | 01777;
  CHECK(selfprof::detail::dir_is_shared(st));
}
