// Keeps selfprof's long-lived descriptors (one perf_event per thread, the workers' eventfds, the kept
// /proc directories) out of the application's descriptor range: each is moved to the lowest free number
// at or above the soft RLIMIT_NOFILE, so the application's own descriptors get the numbers they would
// have had without selfprof (below 1024, where select() and FD_SET work), and its limit stays as it is.
// Context: any thread except the signal handler (setup, the collector, the wall sampler); one
// process-wide lock serializes the moves.
//
// How. fcntl(F_DUPFD_CLOEXEC, soft) takes the lowest free number >= soft, but the kernel refuses a start
// at or above the soft limit (EINVAL) and never allocates at or above it (EMFILE): RLIMIT_NOFILE bounds
// new allocations only, and descriptors above it stay valid. So the soft limit is raised (to the hard
// limit at most) for that one fcntl and put back right after it; then the original is closed.
//
// The instant the soft limit is raised is process-wide. Another thread that allocates a descriptor in
// that instant still gets the lowest free number, so it lands above the application's limit only where
// every number below it is taken (it would otherwise have failed with EMFILE). Another thread's
// getrlimit() in that instant sees the raised value, and its setrlimit(RLIMIT_NOFILE) is undone when ours
// is restored. A child made by fork() gets the application's limit back in a pthread_atfork child
// handler; one made by vfork(), posix_spawn() or a raw clone() in that instant keeps the raised limit.
//
// No room above the soft limit (it equals the hard limit or the caller's bound, or every number up to
// there is taken): the descriptor stays where it is. keep_fd_high() counts it (fds_in_app_range(); the
// thread registry notes it in the session). The soft limit is never left raised.
#pragma once

#include <fcntl.h>
#include <pthread.h>
#include <sys/resource.h>

#include <atomic>
#include <cerrno>
#include <climits>
#include <cstdint>
#include <mutex>
#include <new>
#include <string>

#include "selfprof/detail/sys.hpp"

namespace selfprof {
namespace detail {

// Where move_fd_high() left a descriptor.
enum class fd_place : std::uint8_t {
  moved,    // at or above the application's soft limit (and below the bound), close-on-exec
  no_room,  // left in place: no free number between the soft limit and min(hard limit, bound)
  failed,   // left in place: getrlimit, setrlimit or fcntl failed (fd_move::error)
};

struct fd_move {
  int fd = -1;  // the descriptor to use: the new one when moved (the original is then closed)
  fd_place place = fd_place::failed;
  int error = 0;                     // errno of the failure (EMFILE for no_room when every number was taken)
  std::uint64_t soft = 0, hard = 0;  // the application's RLIMIT_NOFILE as read (0: not read)
};

struct high_fd_state {
  std::mutex mu;
  std::atomic<bool> raised{false};  // the soft limit is raised now: a fork() child puts it back
  std::atomic<std::uint64_t> app_soft{0}, app_hard{0};
  std::atomic<std::uint64_t> kept{0};  // long-lived descriptors left in the application's range
  std::atomic<std::uint64_t> kept_soft{0}, kept_hard{0};  // the limits when the last one was
};

inline high_fd_state g_high_fd;

// fork() child: the limit the application had, in case the fork came while another thread had it raised.
inline void high_fd_fork_child() {
  new (&g_high_fd.mu) std::mutex();
  if (!g_high_fd.raised.load(std::memory_order_acquire)) return;
  struct rlimit rl {};
  rl.rlim_cur = static_cast<rlim_t>(g_high_fd.app_soft.load(std::memory_order_relaxed));
  rl.rlim_max = static_cast<rlim_t>(g_high_fd.app_hard.load(std::memory_order_relaxed));
  ::setrlimit(RLIMIT_NOFILE, &rl);
  g_high_fd.raised.store(false, std::memory_order_relaxed);
}

// Moves `fd` to the lowest free number at or above the application's soft RLIMIT_NOFILE and below
// `below`; the new descriptor is close-on-exec and the original is closed. Left in place otherwise.
inline fd_move move_fd_high(int fd, long below = INT_MAX) {
  fd_move r;
  r.fd = fd;
  if (fd < 0) {
    r.error = EBADF;
    return r;
  }
  static const bool fork_handler = pthread_atfork(nullptr, nullptr, high_fd_fork_child) == 0;
  (void)fork_handler;
  std::lock_guard<std::mutex> lock(g_high_fd.mu);
  struct rlimit app {};
  if (sys().getrlimit(RLIMIT_NOFILE, &app) != 0) {
    r.error = errno;
    return r;
  }
  r.soft = app.rlim_cur;
  r.hard = app.rlim_max;
  const rlim_t bound = static_cast<rlim_t>(below > 0 ? below : 0);
  const rlim_t top = app.rlim_max < bound ? app.rlim_max : bound;
  const rlim_t number = static_cast<rlim_t>(fd);
  if (number >= app.rlim_cur && number < top) {  // out of the application's range already
    r.place = fd_place::moved;
    return r;
  }
  if (app.rlim_cur >= top || app.rlim_cur > static_cast<rlim_t>(INT_MAX)) {
    r.place = fd_place::no_room;
    return r;
  }
  struct rlimit raised = app;
  raised.rlim_cur = top;
  g_high_fd.app_soft.store(app.rlim_cur, std::memory_order_relaxed);
  g_high_fd.app_hard.store(app.rlim_max, std::memory_order_relaxed);
  g_high_fd.raised.store(true, std::memory_order_release);
  if (sys().setrlimit(RLIMIT_NOFILE, &raised) != 0) {
    r.error = errno;
    g_high_fd.raised.store(false, std::memory_order_release);
    return r;
  }
  const int moved = sys().fcntl_int(fd, F_DUPFD_CLOEXEC, static_cast<long>(app.rlim_cur));
  const int e = errno;
  sys().setrlimit(RLIMIT_NOFILE, &app);  // lowering the soft limit needs no privilege
  g_high_fd.raised.store(false, std::memory_order_release);
  if (moved < 0) {
    r.place = e == EMFILE ? fd_place::no_room : fd_place::failed;
    r.error = e;
    return r;
  }
  sys().close(fd);
  r.fd = moved;
  r.place = fd_place::moved;
  return r;
}

// Counts a long-lived descriptor that stays in the application's range, with the limits `m` read (read
// here when it did not).
inline void count_fd_in_app_range(const fd_move& m = fd_move{}) {
  struct rlimit rl {};
  rl.rlim_cur = static_cast<rlim_t>(m.soft);
  rl.rlim_max = static_cast<rlim_t>(m.hard);
  if (m.hard != 0 || sys().getrlimit(RLIMIT_NOFILE, &rl) == 0) {
    g_high_fd.kept_soft.store(rl.rlim_cur, std::memory_order_relaxed);
    g_high_fd.kept_hard.store(rl.rlim_max, std::memory_order_relaxed);
  }
  g_high_fd.kept.fetch_add(1, std::memory_order_relaxed);
}

// For a descriptor kept for the whole session: moved out of the application's range, or counted where
// it stays. Returns the descriptor to use (`fd` itself when negative).
inline int keep_fd_high(int fd, long below = INT_MAX) {
  if (fd < 0) return fd;
  const fd_move m = move_fd_high(fd, below);
  if (m.place != fd_place::moved) count_fd_in_app_range(m);
  return m.fd;
}

// Long-lived descriptors left in the application's range so far in this process.
inline std::uint64_t fds_in_app_range() { return g_high_fd.kept.load(std::memory_order_relaxed); }

// The session note for `n` such descriptors.
inline std::string fds_in_app_range_note(std::uint64_t n) {
  return std::to_string(n) + " of selfprof's descriptors stay below the soft RLIMIT_NOFILE (" +
         std::to_string(g_high_fd.kept_soft.load(std::memory_order_relaxed)) + ", hard limit " +
         std::to_string(g_high_fd.kept_hard.load(std::memory_order_relaxed)) +
         "): no room above it up to the hard limit (for perf_event fds, up to 65536), so the program's "
         "new descriptors get higher numbers than without selfprof";
}

}  // namespace detail
}  // namespace selfprof
