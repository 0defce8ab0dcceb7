// Moving a descriptor above the application's range: the number it gets, the soft limit before and after,
// close-on-exec, the original number freed; no room (soft == hard, the caller's bound, a full range);
// failures of the calls through the seam; a fork() while the limit is raised.
#include <doctest/doctest.h>

#include <fcntl.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>

#include <selfprof/detail/high_fd.hpp>

using selfprof::detail::fd_move;
using selfprof::detail::fd_place;
using selfprof::detail::fds_in_app_range;
using selfprof::detail::keep_fd_high;
using selfprof::detail::move_fd_high;

namespace high_fd_test {

constexpr rlim_t kSoft = 256;  // the application's soft limit in these tests

// Sets the soft RLIMIT_NOFILE for one test and puts the original back (and the seam's defaults).
struct soft_limit {
  struct rlimit saved {};
  bool ok = false;
  explicit soft_limit(rlim_t soft) {
    REQUIRE(::getrlimit(RLIMIT_NOFILE, &saved) == 0);
    if (saved.rlim_max < soft + 64) return;  // no room above it to test with
    struct rlimit rl = saved;
    rl.rlim_cur = soft;
    ok = ::setrlimit(RLIMIT_NOFILE, &rl) == 0;
  }
  ~soft_limit() {
    selfprof::detail::sys() = selfprof::detail::default_syscalls();
    ::setrlimit(RLIMIT_NOFILE, &saved);
  }
};

struct rlimit nofile() {
  struct rlimit rl {};
  ::getrlimit(RLIMIT_NOFILE, &rl);
  return rl;
}

bool is_open(int fd) { return ::fcntl(fd, F_GETFD) != -1; }

int g_fork_child_status = -1;
int fork_then_dup(int fd, int cmd, long arg) {
  if (cmd == F_DUPFD_CLOEXEC) {
    const pid_t child = ::fork();
    if (child == 0) _exit(nofile().rlim_cur == kSoft ? 0 : 1);  // the handler put the limit back
    if (child > 0) ::waitpid(child, &g_fork_child_status, 0);
  }
  return ::fcntl(fd, cmd, arg);
}

int failing_rlimit_get(int, struct rlimit*) {
  errno = EPERM;
  return -1;
}
int failing_rlimit_set(int, const struct rlimit*) {
  errno = EPERM;
  return -1;
}

}  // namespace high_fd_test

TEST_CASE("high_fd: a descriptor moves above the soft limit, which stays as it was") {
  high_fd_test::soft_limit limit(high_fd_test::kSoft);
  if (!limit.ok) {
    MESSAGE("skipped: the hard RLIMIT_NOFILE leaves no room above " << high_fd_test::kSoft);
    return;
  }
  const struct rlimit before = high_fd_test::nofile();
  const int fd = ::open("/dev/null", O_RDONLY);  // not close-on-exec: the move makes it so
  REQUIRE(fd >= 0);
  REQUIRE(fd < static_cast<int>(high_fd_test::kSoft));
  const fd_move m = move_fd_high(fd);
  CHECK(m.place == fd_place::moved);
  CHECK(m.fd >= static_cast<int>(high_fd_test::kSoft));
  const struct rlimit after = high_fd_test::nofile();
  CHECK(after.rlim_cur == before.rlim_cur);
  CHECK(after.rlim_max == before.rlim_max);
  CHECK((::fcntl(m.fd, F_GETFD) & FD_CLOEXEC) != 0);
  CHECK_FALSE(high_fd_test::is_open(fd));
  const int next = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
  CHECK(next == fd);  // the application's next descriptor gets the number it would have had
  char c;
  CHECK(::read(m.fd, &c, 1) == 0);  // still /dev/null
  // Moving again is a no-op: it is out of the application's range already.
  const fd_move again = move_fd_high(m.fd);
  CHECK(again.place == fd_place::moved);
  CHECK(again.fd == m.fd);
  ::close(next);
  ::close(m.fd);
}

TEST_CASE("high_fd: no room below the caller's bound leaves the descriptor in place") {
  high_fd_test::soft_limit limit(high_fd_test::kSoft);
  if (!limit.ok) {
    MESSAGE("skipped: the hard RLIMIT_NOFILE leaves no room above " << high_fd_test::kSoft);
    return;
  }
  const int a = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
  const int b = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
  REQUIRE(a >= 0);
  REQUIRE(b >= 0);
  // The bound at the soft limit: nowhere to go.
  const fd_move at_soft = move_fd_high(a, static_cast<long>(high_fd_test::kSoft));
  CHECK(at_soft.place == fd_place::no_room);
  CHECK(at_soft.fd == a);
  CHECK(high_fd_test::is_open(a));
  // `a` takes the lowest free number above the soft limit; with the bound just above it, every number
  // in the range is taken for `b` (EMFILE).
  const fd_move high = move_fd_high(a);
  REQUIRE(high.place == fd_place::moved);
  const fd_move full = move_fd_high(b, high.fd + 1);
  CHECK(full.place == fd_place::no_room);
  CHECK(full.error == EMFILE);
  CHECK(full.fd == b);
  CHECK(high_fd_test::is_open(b));
  CHECK(high_fd_test::nofile().rlim_cur == high_fd_test::kSoft);
  // keep_fd_high() counts what stays.
  const std::uint64_t counted = fds_in_app_range();
  CHECK(keep_fd_high(b, high.fd + 1) == b);
  CHECK(fds_in_app_range() == counted + 1);
  ::close(b);
  ::close(high.fd);
}

TEST_CASE("high_fd: soft limit == hard limit: the descriptor stays, and so does the limit") {
  // Lowering the hard limit cannot be undone without privileges: in a child.
  const pid_t child = ::fork();
  REQUIRE(child >= 0);
  if (child == 0) {
    struct rlimit rl {};
    rl.rlim_cur = rl.rlim_max = 200;
    if (::setrlimit(RLIMIT_NOFILE, &rl) != 0) _exit(10);
    const int fd = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
    if (fd < 0) _exit(11);
    const std::uint64_t counted = fds_in_app_range();
    const fd_move m = move_fd_high(fd);
    if (m.place != fd_place::no_room || m.fd != fd || !high_fd_test::is_open(fd)) _exit(12);
    if (keep_fd_high(fd) != fd || fds_in_app_range() != counted + 1) _exit(13);
    const struct rlimit after = high_fd_test::nofile();
    if (after.rlim_cur != 200 || after.rlim_max != 200) _exit(14);
    _exit(0);
  }
  int status = 0;
  REQUIRE(::waitpid(child, &status, 0) == child);
  REQUIRE(WIFEXITED(status));
  CHECK(WEXITSTATUS(status) == 0);
}

TEST_CASE("high_fd: failing getrlimit or setrlimit leaves the descriptor and the limit as they were") {
  high_fd_test::soft_limit limit(high_fd_test::kSoft);
  if (!limit.ok) {
    MESSAGE("skipped: the hard RLIMIT_NOFILE leaves no room above " << high_fd_test::kSoft);
    return;
  }
  const int fd = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
  REQUIRE(fd >= 0);
  selfprof::detail::sys().getrlimit = high_fd_test::failing_rlimit_get;
  fd_move m = move_fd_high(fd);
  CHECK(m.place == fd_place::failed);
  CHECK(m.error == EPERM);
  CHECK(m.fd == fd);
  selfprof::detail::sys() = selfprof::detail::default_syscalls();
  selfprof::detail::sys().setrlimit = high_fd_test::failing_rlimit_set;
  m = move_fd_high(fd);
  CHECK(m.place == fd_place::failed);
  CHECK(m.fd == fd);
  CHECK(high_fd_test::is_open(fd));
  CHECK(high_fd_test::nofile().rlim_cur == high_fd_test::kSoft);
  ::close(fd);
}

TEST_CASE("high_fd: a fork() while the limit is raised gives the child the application's limit") {
  high_fd_test::soft_limit limit(high_fd_test::kSoft);
  if (!limit.ok) {
    MESSAGE("skipped: the hard RLIMIT_NOFILE leaves no room above " << high_fd_test::kSoft);
    return;
  }
  const int fd = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
  REQUIRE(fd >= 0);
  high_fd_test::g_fork_child_status = -1;
  selfprof::detail::sys().fcntl_int = high_fd_test::fork_then_dup;  // forks inside the raised instant
  const fd_move m = move_fd_high(fd);
  selfprof::detail::sys() = selfprof::detail::default_syscalls();
  CHECK(m.place == fd_place::moved);
  REQUIRE(WIFEXITED(high_fd_test::g_fork_child_status));
  CHECK(WEXITSTATUS(high_fd_test::g_fork_child_status) == 0);
  CHECK(high_fd_test::nofile().rlim_cur == high_fd_test::kSoft);
  ::close(m.fd);
}
