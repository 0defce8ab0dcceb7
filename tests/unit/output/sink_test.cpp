// Tests of the atomic file sink: mode, symlinks, shared directories, injected failures, cleanup.
#include <doctest/doctest.h>

#include <fcntl.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>
#include <string>

#include "selfprof/output/sink.hpp"

namespace {

namespace fs = std::filesystem;
using selfprof::detail::dir_resolver;
using selfprof::detail::write_file_atomic;

// The two ways the directory is opened: openat2 (where the kernel has it) and the component walk.
const dir_resolver k_resolvers[] = {dir_resolver::openat2_first, dir_resolver::walk_only};
const char* resolver_name(dir_resolver how) { return how == dir_resolver::walk_only ? "walk" : "openat2"; }

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

// Gives `path` to uid/gid 65534 (nobody): a directory that belongs to another user. Needs root.
void give_to_nobody(const std::string& path) { REQUIRE(::lchown(path.c_str(), 65534, 65534) == 0); }

bool skip_unless_root() {
  if (::geteuid() == 0) return false;
  MESSAGE("skipped: needs root to chown a directory to another user");
  return true;
}

// A private directory holding a file the attacker wants replaced.
std::string make_victim(const temp_dir& d, const std::string& where) {
  REQUIRE(fs::create_directories(d / where));
  REQUIRE(::chmod((d / where).c_str(), 0700) == 0);
  REQUIRE(write_file_atomic(d / (where + "/x.svg"), std::string("precious\n")).is_ok());
  return d / where;
}

int entries_of(const std::string& dir) {
  int n = 0;
  for (const auto& e : fs::directory_iterator(dir)) {
    (void)e;
    ++n;
  }
  return n;
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
  CHECK(st.message() ==
        "selfprof: cannot write " + path + ": component 'missing': No such file or directory");
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
  // A real EMFILE: the limit is set to the lowest free descriptor, so the next open fails.
  const int lowest = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
  REQUIRE(lowest >= 0);
  ::close(lowest);
  struct rlimit old {};
  REQUIRE(::getrlimit(RLIMIT_NOFILE, &old) == 0);
  struct rlimit low = old;
  low.rlim_cur = static_cast<rlim_t>(lowest);
  REQUIRE(::setrlimit(RLIMIT_NOFILE, &low) == 0);
  const auto st = write_file_atomic(d / "z.folded", std::string("x 1\n"));
  ::setrlimit(RLIMIT_NOFILE, &old);
  CHECK_FALSE(st.is_ok());
  CHECK(st.message().rfind("selfprof: cannot write " + (d / "z.folded") + ": ", 0) == 0);
  CHECK(st.message().find("Too many open files") != std::string::npos);
  CHECK(d.entries() == 0);
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

TEST_CASE("sink: a symlink planted as a component in a shared directory is refused, the victim's file kept") {
  temp_dir d;
  const std::string victim = make_victim(d, "home/victim/out");
  const std::string shared = d / "shared";
  REQUIRE(::mkdir(shared.c_str(), 0700) == 0);
  REQUIRE(::chmod(shared.c_str(), 0777) == 0);  // world-writable, no sticky bit
  REQUIRE(::symlink(victim.c_str(), (shared + "/sub").c_str()) == 0);
  const std::string path = shared + "/sub/x.svg";
  selfprof::sink_options allow;
  allow.allow_shared_dir = true;  // the user accepts a shared directory: a link is still refused
  for (const auto how : k_resolvers) {
    CAPTURE(resolver_name(how));
    auto st = write_file_atomic(path, std::string("evil\n"), allow, how);
    CHECK_FALSE(st.is_ok());
    CHECK(st.message() ==
          "selfprof: cannot write " + path + ": component 'sub' is a symbolic link (refusing to follow it)");
    st = write_file_atomic(path, std::string("evil\n"), {}, how);
    CHECK_FALSE(st.is_ok());
    CHECK(st.message().find("directory '" + shared + "' is writable by other users and has no sticky bit") !=
          std::string::npos);
  }
  // The same, relative to the working directory (the command line's `-o shared/sub/x.svg`).
  const auto cwd = fs::current_path();
  fs::current_path(d.path);
  const auto rel = write_file_atomic("shared/sub/x.svg", std::string("evil\n"), allow);
  fs::current_path(cwd);
  CHECK_FALSE(rel.is_ok());
  CHECK(rel.message().find("component 'sub' is a symbolic link") != std::string::npos);
  CHECK(slurp(victim + "/x.svg") == "precious\n");
  CHECK(entries_of(victim) == 1);
  CHECK(entries_of(shared) == 1);
}

TEST_CASE("sink: a symlink as the last directory component is refused") {
  temp_dir d;
  const std::string victim = make_victim(d, "victim");
  REQUIRE(::symlink(victim.c_str(), (d / "out").c_str()) == 0);
  for (const auto how : k_resolvers) {
    CAPTURE(resolver_name(how));
    const auto st = write_file_atomic(d / "out/x.svg", std::string("evil\n"), {}, how);
    CHECK_FALSE(st.is_ok());
    CHECK(st.message() == "selfprof: cannot write " + (d / "out/x.svg") +
                              ": component 'out' is a symbolic link (refusing to follow it)");
  }
  CHECK(slurp(victim + "/x.svg") == "precious\n");
  CHECK(entries_of(victim) == 1);
}

TEST_CASE("sink: a symlink anywhere in a private path is refused, even to our own directory") {
  temp_dir d;
  REQUIRE(fs::create_directories(d / "real/deeper"));
  REQUIRE(::symlink("real", (d / "link").c_str()) == 0);
  for (const auto how : k_resolvers) {
    CAPTURE(resolver_name(how));
    const auto st = write_file_atomic(d / "link/deeper/x.svg", std::string("x 1\n"), {}, how);
    CHECK_FALSE(st.is_ok());
    CHECK(st.message().find(": component 'link' is a symbolic link") != std::string::npos);
  }
  CHECK(entries_of(d / "real/deeper") == 0);
}

TEST_CASE("sink: '..' cancels the name before it, which is never opened; a leading '..' goes up") {
  temp_dir d;
  const std::string victim = make_victim(d, "elsewhere/victim");
  REQUIRE(::symlink(victim.c_str(), (d / "link").c_str()) == 0);
  // Followed, link/.. would be d/elsewhere; as text it is d.
  const auto st = write_file_atomic(d / "link/../x.svg", std::string("x 1\n"));
  REQUIRE_MESSAGE(st.is_ok(), st.message());
  CHECK(slurp(d / "x.svg") == "x 1\n");
  CHECK_FALSE(fs::exists(d / "elsewhere/x.svg"));

  REQUIRE(::mkdir((d / "build").c_str(), 0700) == 0);
  const auto cwd = fs::current_path();
  fs::current_path(d / "build");
  const auto up = write_file_atomic("../up.svg", std::string("y 2\n"));
  fs::current_path(cwd);
  REQUIRE_MESSAGE(up.is_ok(), up.message());
  CHECK(slurp(d / "up.svg") == "y 2\n");
}

TEST_CASE("sink: a shared directory on the way without the sticky bit is refused, whoever owns it") {
  temp_dir d;
  const std::string shared = d / "shared";
  REQUIRE(::mkdir(shared.c_str(), 0700) == 0);
  REQUIRE(::mkdir((shared + "/mine").c_str(), 0700) == 0);
  REQUIRE(::chmod(shared.c_str(), 0777) == 0);
  const std::string path = shared + "/mine/x.svg";
  auto check_refused = [&] {
    for (const auto how : k_resolvers) {
      CAPTURE(resolver_name(how));
      const auto st = write_file_atomic(path, std::string("x 1\n"), {}, how);
      CHECK_FALSE(st.is_ok());
      CHECK(st.message() == "selfprof: cannot write " + path + ": directory '" + shared +
                                "' is writable by other users and has no sticky bit (refusing; "
                                "allow_shared_dir overrides)");
    }
    CHECK(entries_of(shared + "/mine") == 0);
  };
  check_refused();  // ours: anyone may still rename "mine" away and put their own directory there
  if (::geteuid() == 0) {
    give_to_nobody(shared);
    check_refused();
  } else {
    MESSAGE("the case of a directory that belongs to another user needs root");
  }
  selfprof::sink_options allow;
  allow.allow_shared_dir = true;
  for (const auto how : k_resolvers) {
    const auto st = write_file_atomic(path, std::string("x 1\n"), allow, how);
    CHECK_MESSAGE(st.is_ok(), st.message());
  }
}

TEST_CASE(
    "sink: a sticky shared directory that belongs to another user is refused, on the way or as the "
    "destination") {
  if (skip_unless_root()) return;
  temp_dir d;
  const std::string sticky = d / "sticky";
  REQUIRE(::mkdir(sticky.c_str(), 0700) == 0);
  REQUIRE(::mkdir((sticky + "/mine").c_str(), 0700) == 0);
  REQUIRE(::chmod(sticky.c_str(), 01777) == 0);
  give_to_nobody(sticky);  // its owner may rename or delete anything in it, sticky bit or not
  for (const std::string& path : {sticky + "/x.svg", sticky + "/mine/x.svg"}) {
    for (const auto how : k_resolvers) {
      CAPTURE(path);
      CAPTURE(resolver_name(how));
      auto st = write_file_atomic(path, std::string("x 1\n"), {}, how);
      CHECK_FALSE(st.is_ok());
      CHECK(st.message() == "selfprof: cannot write " + path + ": directory '" + sticky +
                                "' is writable by other users and belongs to another user (uid 65534), who "
                                "may rename or delete entries despite the sticky bit (refusing; "
                                "allow_shared_dir overrides)");
      selfprof::sink_options allow;
      allow.allow_shared_dir = true;
      st = write_file_atomic(path, std::string("x 1\n"), allow, how);
      CHECK_MESSAGE(st.is_ok(), st.message());
    }
  }
}

TEST_CASE("sink: sticky directories like /tmp and others' private directories still work") {
  temp_dir d;
  REQUIRE(d.path.rfind("/tmp/", 0) == 0);  // every test here writes through /tmp (root's, sticky)
  const std::string tmpish = d / "tmpish";
  REQUIRE(::mkdir(tmpish.c_str(), 0700) == 0);
  REQUIRE(::mkdir((tmpish + "/mine").c_str(), 0700) == 0);
  REQUIRE(::chmod(tmpish.c_str(), 01777) == 0);
  for (const auto how : k_resolvers) {
    CAPTURE(resolver_name(how));
    auto st = write_file_atomic(tmpish + "/x.svg", std::string("x 1\n"), {}, how);
    CHECK_MESSAGE(st.is_ok(), st.message());
    st = write_file_atomic(tmpish + "/mine/x.svg", std::string("x 1\n"), {}, how);
    CHECK_MESSAGE(st.is_ok(), st.message());
  }
  if (skip_unless_root()) return;
  // Root writing into a user's home: not shared, so whoever owns it is fine.
  const std::string home = d / "home-of-nobody";
  REQUIRE(::mkdir(home.c_str(), 0755) == 0);
  give_to_nobody(home);
  for (const auto how : k_resolvers) {
    const auto st = write_file_atomic(home + "/x.svg", std::string("x 1\n"), {}, how);
    CHECK_MESSAGE(st.is_ok(), st.message());
  }
}

TEST_CASE("sink: temp names carry 64 random bits") {
  using selfprof::detail::temp_name_for;
  const std::string prefix = ".a.svg.tmp-";
  std::set<std::string> seen;
  std::string last;
  int changed_bits = 0;
  for (int i = 0; i < 200; ++i) {
    const std::string name = temp_name_for("a.svg");
    REQUIRE(name.size() == prefix.size() + 16);
    REQUIRE(name.rfind(prefix, 0) == 0);
    const std::string hex = name.substr(prefix.size());
    REQUIRE(hex.find_first_not_of("0123456789abcdef") == std::string::npos);
    if (!last.empty())
      changed_bits += __builtin_popcountll(std::stoull(hex, nullptr, 16) ^ std::stoull(last, nullptr, 16));
    last = hex;
    seen.insert(name);
  }
  CHECK(seen.size() == 200);
  // A counter changes a bit or two from one name to the next; random names change about half of 64.
  CHECK(changed_bits / 199 > 20);
  CHECK(temp_name_for(std::string(240, 'n')).size() <= 255);
}
