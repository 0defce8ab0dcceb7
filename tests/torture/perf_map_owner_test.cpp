// Torture: a live writer's /tmp/perf-<pid>.map is never deleted or truncated by another writer (issue 15,
// item 15): not by a second writer in the same process (two JIT runtimes, or a second copy of selfprof),
// not by a process that sees the same pid (another container sharing /tmp: simulated by a child process
// writing the map of a fake pid both point at, its file dated back so that only its lock shows it is
// live), not when the map was written by a JIT of this process that takes no lock. A map left by a dead
// writer (no lock, written before this process started) is replaced. The jitdump, which cannot be shared,
// is refused instead of taken over. See include/selfprof/jit/safe_file.hpp for the rule.
#include <doctest/doctest.h>

#include <fcntl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <string>

#include <selfprof/jit/perf_map_writer.hpp>
#include <selfprof/jit/runtime.hpp>

#include "../unit/jit/test_support.hpp"

namespace perf_map_owner_torture {

using selfprof::detail::perf_map_writer;

ino_t inode_of(const std::string& path) {
  struct stat st {};
  return ::lstat(path.c_str(), &st) == 0 ? st.st_ino : 0;
}

// Dates the file back an hour: as if its writer had written it before this process started.
void date_back(const std::string& path) {
  struct timespec t[2];
  clock_gettime(CLOCK_REALTIME, &t[0]);
  t[0].tv_sec -= 3600;
  t[1] = t[0];
  REQUIRE(::utimensat(AT_FDCWD, path.c_str(), t, AT_SYMLINK_NOFOLLOW) == 0);
}

// A child process that writes a map and stays alive (holding it) until told to write once more and exit.
struct child_writer {
  pid_t pid = -1;
  int to_child = -1, from_child = -1;
  child_writer(const std::string& dir, long fake_pid) {
    int up[2], down[2];
    REQUIRE(::pipe(up) == 0);
    REQUIRE(::pipe(down) == 0);
    pid = ::fork();
    REQUIRE(pid >= 0);
    if (pid == 0) {
      ::close(up[0]);
      ::close(down[1]);
      int rc = 0;
      {
        perf_map_writer w(dir, fake_pid);
        if (!w.open() || !w.write("a000 10 child_first\n")) rc = 1;
        char c = rc == 0 ? 'K' : 'E';
        if (::write(up[1], &c, 1) != 1) rc = 2;
        if (::read(down[0], &c, 1) == 1 && !w.write("c000 10 child_last\n")) rc = 3;  // 0 bytes: give up
      }
      ::_exit(rc);
    }
    ::close(up[1]);
    ::close(down[0]);
    from_child = up[0];
    to_child = down[1];
  }
  bool wait_ready() {
    char c = 0;
    return ::read(from_child, &c, 1) == 1 && c == 'K';
  }
  // Tells the child to write its last line and exit; its exit status (-1 when it did not exit normally).
  int finish() {
    if (to_child >= 0) {
      char c = 'x';
      (void)!::write(to_child, &c, 1);
      ::close(to_child);
      to_child = -1;
    }
    int status = 0;
    if (pid > 0 && ::waitpid(pid, &status, 0) == pid) {
      pid = -1;
      return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
    }
    return -1;
  }
  ~child_writer() {
    if (to_child >= 0) ::close(to_child);  // the child's read returns 0: it exits
    to_child = -1;
    if (pid > 0) ::waitpid(pid, nullptr, 0);
    if (from_child >= 0) ::close(from_child);
  }
};

}  // namespace perf_map_owner_torture

using namespace perf_map_owner_torture;

TEST_CASE("a second writer in the same process appends to the live map, never replaces it") {
  jit_test::temp_dir dir;
  const long pid = jit_test::fake_pid();
  perf_map_writer first(dir.path, pid);
  REQUIRE(first.open());
  REQUIRE(first.write("1000 10 first_a\n"));
  const ino_t ino = inode_of(first.path());
  perf_map_writer second(dir.path, pid);  // a second copy of selfprof, or another runtime
  selfprof::status st = second.open();
  REQUIRE_MESSAGE(st, st.message());
  CHECK(second.shared());
  CHECK_FALSE(second.replaced_stale());
  REQUIRE(second.write("2000 10 second\n"));
  REQUIRE(first.write("3000 10 first_b\n"));
  CHECK(inode_of(first.path()) == ino);
  CHECK(jit_test::read_file(first.path()) == "1000 10 first_a\n2000 10 second\n3000 10 first_b\n");
  // The first writer gone, the second still holds the map: a third writer shares it too.
  first.close();
  perf_map_writer third(dir.path, pid);
  REQUIRE(third.open());
  CHECK(third.shared());
  CHECK(inode_of(first.path()) == ino);
}

TEST_CASE("two JIT runtimes in one process both write their code to the one perf map") {
  jit_test::temp_dir dir;
  selfprof::jit::options o;
  o.perf_map_dir = dir.path;
  o.pid = jit_test::fake_pid();
  o.background_flush = false;
  static const unsigned char code_a[64] = {}, code_b[64] = {};
  selfprof::detail::jit_runtime one(o), two(o);
  REQUIRE(one.add(code_a, sizeof code_a, "jit_from_runtime_one"));
  REQUIRE(one.flush());
  REQUIRE(two.add(code_b, sizeof code_b, "jit_from_runtime_two"));
  REQUIRE(two.flush());
  REQUIRE(one.add(code_a + 32, 16, "jit_one_again"));
  REQUIRE(one.flush());
  const std::string text = jit_test::read_file(one.perf_map_path());
  MESSAGE(text);
  CHECK(text.find("jit_from_runtime_one") != std::string::npos);
  CHECK(text.find("jit_from_runtime_two") != std::string::npos);
  CHECK(text.find("jit_one_again") != std::string::npos);
}

TEST_CASE("a live writer in another process keeps its map, even one written before this process started") {
  jit_test::temp_dir dir;
  const long pid = jit_test::fake_pid();  // both processes write the map of this pid, as two containers
  child_writer child(dir.path, pid);
  REQUIRE(child.wait_ready());
  const std::string path = perf_map_writer::path_for(dir.path, pid);
  const ino_t ino = inode_of(path);
  date_back(path);  // its mtime says nothing now: only the child's lock shows the map is in use
  perf_map_writer w(dir.path, pid);
  selfprof::status st = w.open();
  REQUIRE_MESSAGE(st, st.message());
  CHECK(w.shared());
  CHECK_FALSE(w.replaced_stale());
  REQUIRE(w.write("b000 10 parent\n"));
  CHECK(child.finish() == 0);
  CHECK(inode_of(path) == ino);
  CHECK(jit_test::read_file(path) == "a000 10 child_first\nb000 10 parent\nc000 10 child_last\n");
}

TEST_CASE("a map left by a dead writer is replaced") {
  jit_test::temp_dir dir;
  const long pid = jit_test::fake_pid();
  {
    child_writer child(dir.path, pid);
    REQUIRE(child.wait_ready());
    CHECK(child.finish() == 0);  // it wrote both lines and died: its lock went with it
  }
  const std::string path = perf_map_writer::path_for(dir.path, pid);
  REQUIRE(jit_test::read_file(path) == "a000 10 child_first\nc000 10 child_last\n");
  // A dead process that had this pid before us wrote its map before we started.
  date_back(path);
  perf_map_writer w(dir.path, pid);
  selfprof::status st = w.open();
  REQUIRE_MESSAGE(st, st.message());
  CHECK(w.replaced_stale());
  CHECK_FALSE(w.shared());
  REQUIRE(w.write("d000 10 fresh\n"));
  CHECK(jit_test::read_file(path) == "d000 10 fresh\n");
  struct stat s {};
  REQUIRE(::lstat(path.c_str(), &s) == 0);
  CHECK((s.st_mode & 07777) == 0644);
  CHECK(s.st_nlink == 1);
}

TEST_CASE("a map written in this process by a JIT that takes no lock is kept and appended to") {
  jit_test::temp_dir dir;
  const long pid = jit_test::fake_pid();
  const std::string path = perf_map_writer::path_for(dir.path, pid);
  jit_test::write_file(path, "e000 10 other_jit\n");  // as CPython's -X perf writes it: no flock
  REQUIRE(::chmod(path.c_str(), 0644) == 0);
  perf_map_writer w(dir.path, pid);
  selfprof::status st = w.open();
  REQUIRE_MESSAGE(st, st.message());
  CHECK(w.shared());
  CHECK_FALSE(w.replaced_stale());
  REQUIRE(w.write("f000 10 ours\n"));
  CHECK(jit_test::read_file(path) == "e000 10 other_jit\nf000 10 ours\n");
}

TEST_CASE("a live writer's jitdump is refused, not taken over") {
  jit_test::temp_dir dir;
  const std::string path = dir.file("jit-1.dump");
  selfprof::detail::safe_file first, second;
  REQUIRE(selfprof::detail::create_safe_file(path, O_RDWR, "jitdump", first));
  REQUIRE(::write(first.fd, "header", 6) == 6);
  const ino_t ino = inode_of(path);
  selfprof::status st = selfprof::detail::create_safe_file(path, O_RDWR, "jitdump", second);
  CHECK_FALSE(st);
  CHECK(st.message().find(path) != std::string::npos);
  MESSAGE(st.message());
  CHECK(second.fd < 0);
  CHECK(inode_of(path) == ino);
  CHECK(jit_test::read_file(path) == "header");
  ::close(first.fd);
}
