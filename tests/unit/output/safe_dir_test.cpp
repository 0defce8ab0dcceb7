// Tests of opening an output directory without symbolic links: the lexical pass, the judgement of modes
// and owners, openat2 and the walk agreeing on every verdict, and no descriptor leaks.
#include <doctest/doctest.h>

#include <dirent.h>
#include <fcntl.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <string>
#include <system_error>
#include <vector>

#include "selfprof/output/safe_dir.hpp"

namespace safe_dir_test {

using selfprof::detail::dir_path;
using selfprof::detail::dir_resolver;
using selfprof::detail::open_dir_nofollow;
using selfprof::detail::open_dir_walk;
using selfprof::detail::opened_dir;
using selfprof::detail::parse_dir_path;

// A fresh private directory under /tmp, removed with everything in it.
struct scratch {
  std::string path;
  scratch() {
    char tmpl[] = "/tmp/selfprof-safe-dir-XXXXXX";
    const char* p = ::mkdtemp(tmpl);
    REQUIRE(p != nullptr);
    path = p;
  }
  ~scratch() {
    std::error_code ec;
    std::filesystem::remove_all(path, ec);
  }
  std::string operator/(const std::string& name) const { return path + "/" + name; }
};

int open_descriptors() {
  int n = 0;
  if (DIR* d = ::opendir("/proc/self/fd")) {
    while (::readdir(d)) ++n;
    ::closedir(d);
  }
  return n;
}

// The verdict of both ways, which must agree: "" when the directory opened, else the reason.
std::string verdict(const std::string& dir, bool allow_shared = false) {
  const opened_dir a = open_dir_nofollow(dir, allow_shared, dir_resolver::openat2_first);
  const opened_dir b = open_dir_walk(dir, allow_shared);
  CHECK(a.error == b.error);
  CHECK((a.fd.get() >= 0) == a.error.empty());
  CHECK((b.fd.get() >= 0) == b.error.empty());
  if (a.fd.get() >= 0 && b.fd.get() >= 0) {
    CHECK(a.st.st_ino == b.st.st_ino);
    CHECK(a.st.st_dev == b.st.st_dev);
  }
  return a.error;
}

struct stat dir_stat(mode_t mode, uid_t uid, gid_t gid) {
  struct stat st {};
  st.st_mode = S_IFDIR | mode;
  st.st_uid = uid;
  st.st_gid = gid;
  return st;
}

TEST_CASE("safe_dir: '..' cancels the name before it; leading '..' of a relative path remain") {
  dir_path p = parse_dir_path("a/./b//../c/");
  CHECK_FALSE(p.absolute);
  CHECK(p.up == 0);
  CHECK(p.names == std::vector<std::string>{"a", "c"});
  CHECK(p.prefix(0) == ".");
  CHECK(p.prefix(1) == "a");
  CHECK(p.prefix(2) == "a/c");

  p = parse_dir_path("../../x/..");
  CHECK(p.up == 2);
  CHECK(p.names.empty());
  CHECK(p.prefix(0) == "../..");

  p = parse_dir_path("/../tmp/x");
  CHECK(p.absolute);
  CHECK(p.up == 0);
  CHECK(p.names == std::vector<std::string>{"tmp", "x"});
  CHECK(p.prefix(0) == "/");
  CHECK(p.prefix(2) == "/tmp/x");

  CHECK(parse_dir_path("/").prefix(0) == "/");
  CHECK(parse_dir_path(".").prefix(0) == ".");
}

TEST_CASE("safe_dir: dir_is_shared classifies modes") {
  using selfprof::detail::dir_is_shared;
  const uid_t me = ::geteuid();
  const gid_t group = ::getegid();
  CHECK_FALSE(dir_is_shared(dir_stat(0755, me, group)));
  CHECK_FALSE(dir_is_shared(dir_stat(0775, me, group)));  // user-private group
  CHECK(dir_is_shared(dir_stat(0775, me, group + 1)));
  CHECK(dir_is_shared(dir_stat(01777, me, group)));
}

TEST_CASE("safe_dir: a shared directory is judged by its sticky bit and its owner") {
  using selfprof::detail::dir_refusal;
  const uid_t me = ::geteuid();
  const gid_t group = ::getegid();
  const uid_t other = me == 65534 ? 65533 : 65534;
  CHECK(dir_refusal(dir_stat(0700, other, group), false).empty());  // private: whoever owns it
  CHECK(dir_refusal(dir_stat(01777, 0, 0), false).empty());         // /tmp
  CHECK(dir_refusal(dir_stat(01777, me, group), false).empty());
  CHECK(dir_refusal(dir_stat(0777, me, group), false).find("has no sticky bit") != std::string::npos);
  CHECK(dir_refusal(dir_stat(0777, 0, 0), false).find("has no sticky bit") != std::string::npos);
  CHECK(dir_refusal(dir_stat(01777, other, group), false)
            .find("belongs to another user (uid " + std::to_string(other) + ")") != std::string::npos);
  CHECK(dir_refusal(dir_stat(03775, other, group + 1), false).find("belongs to another user") !=
        std::string::npos);
  CHECK(dir_refusal(dir_stat(01777, other, group), true).empty());
  CHECK(dir_refusal(dir_stat(0777, other, group), true).empty());
}

TEST_CASE("safe_dir: openat2 and the walk agree, and every refusal names the component") {
  scratch s;
  REQUIRE(::mkdir((s / "a").c_str(), 0700) == 0);
  REQUIRE(::mkdir((s / "a/b").c_str(), 0700) == 0);
  REQUIRE(::symlink("a", (s / "link").c_str()) == 0);
  REQUIRE(::symlink("/nonexistent", (s / "dangling").c_str()) == 0);
  REQUIRE(::close(::open((s / "file").c_str(), O_CREAT | O_WRONLY, 0600)) == 0);
  REQUIRE(::mkdir((s / "shared").c_str(), 0700) == 0);
  REQUIRE(::mkdir((s / "shared/sub").c_str(), 0700) == 0);
  REQUIRE(::chmod((s / "shared").c_str(), 0777) == 0);

  CHECK(verdict(s / "a/b") == "");
  CHECK(verdict(s.path) == "");
  CHECK(verdict("/") == "");
  CHECK(verdict(s / "link/b/..") == "component 'link' is a symbolic link (refusing to follow it)");
  CHECK(verdict(s / "a/b/../../link") == "component 'link' is a symbolic link (refusing to follow it)");
  CHECK(verdict(s / "dangling") == "component 'dangling' is a symbolic link (refusing to follow it)");
  CHECK(verdict(s / "file/x") == "component 'file' is not a directory");
  CHECK(verdict(s / "missing/x") == "component 'missing': No such file or directory");
  CHECK(verdict("/proc/self/cwd") == "component 'self' is a symbolic link (refusing to follow it)");
  CHECK(verdict("/proc/" + std::to_string(::getpid()) + "/cwd") ==
        "component 'cwd' is a symbolic link (refusing to follow it)");  // a magic link
  const std::string shared_refusal = "directory '" + (s / "shared") +
                                     "' is writable by other users and has no sticky bit (refusing; "
                                     "allow_shared_dir overrides)";
  CHECK(verdict(s / "shared/sub") == shared_refusal);
  CHECK(verdict(s / "shared") == shared_refusal);
  CHECK(verdict(s / "shared/sub", true) == "");

  if (::geteuid() == 0) {
    // A sticky directory of another user, above a directory of ours: its owner may swap "sub".
    REQUIRE(::chmod((s / "shared").c_str(), 01777) == 0);
    REQUIRE(::chown((s / "shared").c_str(), 65534, 65534) == 0);
    CHECK(verdict(s / "shared/sub")
              .find("directory '" + (s / "shared") +
                    "' is writable by other users and belongs to another user (uid "
                    "65534)") == 0);
  } else {
    MESSAGE("skipped the case of another user's sticky directory: needs root to chown");
  }

  // Relative paths start at the working directory; a leading ".." goes up from it.
  char cwd[4096];
  REQUIRE(::getcwd(cwd, sizeof cwd) != nullptr);
  REQUIRE(::chdir((s / "a/b").c_str()) == 0);
  const std::string up = verdict("..");
  const std::string rel = verdict("../../link");
  const opened_dir parent = open_dir_walk("..", false);
  REQUIRE(::chdir(cwd) == 0);
  CHECK(up == "");
  CHECK(rel == "component 'link' is a symbolic link (refusing to follow it)");
  struct stat a {};
  REQUIRE(::stat((s / "a").c_str(), &a) == 0);
  CHECK(parent.st.st_ino == a.st_ino);
}

TEST_CASE("safe_dir: openat2 opens a plain directory and leaves a link to the walk") {
  scratch s;
  REQUIRE(::symlink(s.path.c_str(), (s / "link").c_str()) == 0);
  opened_dir out;
  if (!selfprof::detail::open_dir_openat2(s.path, false, out)) {
    MESSAGE("openat2 is not available here: only the walk was tested");
    return;
  }
  CHECK(out.error.empty());
  CHECK(out.fd.get() >= 0);
  opened_dir refused;
  CHECK_FALSE(selfprof::detail::open_dir_openat2(s / "link", false, refused));
}

TEST_CASE("safe_dir: the directory opens for reading (fsync-able), and no descriptor leaks") {
  scratch s;
  REQUIRE(::mkdir((s / "d").c_str(), 0700) == 0);
  REQUIRE(::symlink("d", (s / "link").c_str()) == 0);
  {
    const opened_dir d = open_dir_walk(s / "d", false);
    REQUIRE(d.fd.get() >= 0);
    CHECK((::fcntl(d.fd.get(), F_GETFL) & O_PATH) == 0);
    CHECK(::fsync(d.fd.get()) == 0);
  }
  const int before = open_descriptors();
  for (const char* dir : {"d", "link", "missing", "d/../d"}) {
    (void)open_dir_nofollow(s / dir, false);
    (void)open_dir_walk(s / dir, false);
  }
  CHECK(open_descriptors() == before);
}

}  // namespace safe_dir_test
