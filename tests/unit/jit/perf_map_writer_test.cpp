// Unit tests of include/selfprof/jit/perf_map_writer.hpp and safe_file.hpp: the perf map line format
// and the safe creation of /tmp/perf-<pid>.map (symlinks, foreign and stale files; live maps are shared:
// tests/torture/perf_map_owner_test.cpp).
#include <doctest/doctest.h>

#include <fcntl.h>
#include <pwd.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <cerrno>
#include <string>

#include <selfprof/jit/perf_map_writer.hpp>
#include <selfprof/symbols/perf_map.hpp>

#include "test_support.hpp"

using selfprof::detail::append_perf_map_line;
using selfprof::detail::perf_map_writer;

TEST_CASE("jit perf map: lines are bare lower-case hex, single spaces, newline-terminated") {
  std::string out;
  append_perf_map_line(out, 0x7f00deadbeef, 0x1a0, "jit_sum_by_3");
  append_perf_map_line(out, 0, 0, "zero size");
  append_perf_map_line(out, ~0ull, 1, "top");
  CHECK(out == "7f00deadbeef 1a0 jit_sum_by_3\n0 0 zero size\nffffffffffffffff 1 top\n");
}

TEST_CASE("jit perf map: the file is created fresh with mode 0644 and read back by the symbolizer's reader") {
  jit_test::temp_dir dir;
  long pid = jit_test::fake_pid();
  mode_t old_umask = ::umask(077);  // 0644 whatever the umask
  perf_map_writer w(dir.path, pid);
  CHECK(w.path() == dir.path + "/perf-" + std::to_string(pid) + ".map");
  selfprof::status st = w.open();
  ::umask(old_umask);
  REQUIRE_MESSAGE(st, st.message());
  CHECK_FALSE(w.replaced_stale());
  std::string lines;
  append_perf_map_line(lines, 0x1000, 0x100, "jit_old");
  append_perf_map_line(lines, 0x1000, 0x80, "jit_new");  // code reuse: the later line wins
  REQUIRE(w.write(lines));
  struct stat s;
  REQUIRE(::lstat(w.path().c_str(), &s) == 0);
  CHECK((s.st_mode & 07777) == 0644);
  CHECK(s.st_uid == ::geteuid());
  CHECK(jit_test::read_file(w.path()) == lines);
  selfprof::detail::perf_map reader(w.path());
  REQUIRE(reader.reload_if_changed());
  selfprof::detail::perf_map::hit hit;
  REQUIRE(reader.lookup(0x1010, hit));
  CHECK(hit.name == "jit_new");
  REQUIRE(reader.lookup(0x10a0, hit));  // the old line still names what the new one does not cover
  CHECK(hit.name == "jit_old");
}

TEST_CASE("jit perf map: a symlink at the path is refused and nothing is written through it") {
  jit_test::temp_dir dir;
  long pid = jit_test::fake_pid();
  std::string target = dir.file("victim.txt");
  jit_test::write_file(target, "precious\n");
  perf_map_writer w(dir.path, pid);
  REQUIRE(::symlink(target.c_str(), w.path().c_str()) == 0);
  selfprof::status st = w.open();
  REQUIRE_FALSE(st);
  CHECK(st.message().find("symbolic link") != std::string::npos);
  CHECK(st.message().find(w.path()) != std::string::npos);
  CHECK_FALSE(w.is_open());
  CHECK_FALSE(w.write("1000 10 evil\n"));
  CHECK(jit_test::read_file(target) == "precious\n");
  struct stat s;
  REQUIRE(::lstat(w.path().c_str(), &s) == 0);
  CHECK(S_ISLNK(s.st_mode));  // left alone, not removed
  // A dangling symlink (the classic attack: make us create the target) is refused as well.
  std::string absent = dir.file("would-be-created");
  ::unlink(w.path().c_str());
  REQUIRE(::symlink(absent.c_str(), w.path().c_str()) == 0);
  CHECK_FALSE(w.open());
  CHECK(::access(absent.c_str(), F_OK) != 0);
}

TEST_CASE("jit perf map: a stale regular file of ours is replaced, not appended to") {
  jit_test::temp_dir dir;
  long pid = jit_test::fake_pid();
  perf_map_writer w(dir.path, pid);
  jit_test::write_file(w.path(), "5000 10 stale_from_a_dead_process\n");
  // Unlocked and written before this process started (by the pid's previous owner): provably stale.
  struct timespec old[2];
  clock_gettime(CLOCK_REALTIME, &old[0]);
  old[0].tv_sec -= 3600;
  old[1] = old[0];
  REQUIRE(::utimensat(AT_FDCWD, w.path().c_str(), old, AT_SYMLINK_NOFOLLOW) == 0);
  struct stat before;
  REQUIRE(::stat(w.path().c_str(), &before) == 0);
  selfprof::status st = w.open();
  REQUIRE_MESSAGE(st, st.message());
  CHECK(w.replaced_stale());
  REQUIRE(w.write("6000 20 jit_fresh\n"));
  CHECK(jit_test::read_file(w.path()) == "6000 20 jit_fresh\n");
  struct stat after;
  REQUIRE(::stat(w.path().c_str(), &after) == 0);
  CHECK((after.st_mode & 07777) == 0644);
}

TEST_CASE("jit perf map: a file with other hard links or not a regular file is refused") {
  jit_test::temp_dir dir;
  long pid = jit_test::fake_pid();
  perf_map_writer w(dir.path, pid);
  std::string other = dir.file("elsewhere");
  jit_test::write_file(other, "keep\n");
  REQUIRE(::link(other.c_str(), w.path().c_str()) == 0);
  selfprof::status st = w.open();
  REQUIRE_FALSE(st);
  CHECK(st.message().find("hard links") != std::string::npos);
  CHECK(jit_test::read_file(other) == "keep\n");
  ::unlink(w.path().c_str());
  REQUIRE(::mkdir(w.path().c_str(), 0700) == 0);
  st = w.open();
  REQUIRE_FALSE(st);
  CHECK(st.message().find("not a regular file") != std::string::npos);
  ::rmdir(w.path().c_str());
}

TEST_CASE("jit perf map: a file owned by another user is refused (needs root to set up)") {
  if (::geteuid() != 0) {
    MESSAGE("skipped: chown to another user needs root");
    return;
  }
  struct passwd* nobody = ::getpwnam("nobody");
  uid_t other = nobody ? nobody->pw_uid : 65534;
  jit_test::temp_dir dir;
  long pid = jit_test::fake_pid();
  perf_map_writer w(dir.path, pid);
  jit_test::write_file(w.path(), "7000 10 theirs\n");
  REQUIRE(::chown(w.path().c_str(), other, static_cast<gid_t>(-1)) == 0);
  selfprof::status st = w.open();
  REQUIRE_FALSE(st);
  CHECK(st.message().find("owned by uid " + std::to_string(other)) != std::string::npos);
  CHECK(jit_test::read_file(w.path()) == "7000 10 theirs\n");
  struct stat s;
  REQUIRE(::lstat(w.path().c_str(), &s) == 0);
  CHECK(s.st_uid == other);  // neither replaced nor removed
}

namespace {
int fail_open_eacces(const char*, int, mode_t) {
  errno = EACCES;
  return -1;
}
}  // namespace

TEST_CASE("jit perf map: an open failure (EACCES through the syscall seam) is a message naming the file") {
  jit_test::temp_dir dir;
  perf_map_writer w(dir.path, jit_test::fake_pid());
  selfprof::detail::sys().open = fail_open_eacces;
  selfprof::status st = w.open();
  selfprof::detail::sys() = selfprof::detail::default_syscalls();
  REQUIRE_FALSE(st);
  CHECK(st.message().find(w.path()) != std::string::npos);
  CHECK(st.message().find("Permission denied") != std::string::npos);
  CHECK(::access(w.path().c_str(), F_OK) != 0);
}
