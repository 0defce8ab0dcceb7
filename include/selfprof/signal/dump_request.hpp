// Signal-handler code: the dump signal (SIGUSR2 by default) only counts a request and wakes the dumper
// thread through its eventfd; that thread does the work (a handler that opens files and allocates, as
// some profilers' dump signals do, deadlocks when it interrupts malloc).
// Context: signal handler (async-signal-safe: one atomic add and one write(2)).
#pragma once

#include <signal.h>
#include <unistd.h>

#include <errno.h>
#include <atomic>
#include <cstdint>

namespace selfprof {
namespace detail {

struct dump_request_globals {
  std::atomic<std::uint64_t> requests{0};  // dump signals received
  std::atomic<int> wake_fd{-1};            // the collector's eventfd, -1 when no collector runs
};

inline dump_request_globals g_dump_requests;

inline void dump_signal_handler(int, siginfo_t*, void*) {
  const int saved_errno = errno;
  g_dump_requests.requests.fetch_add(1, std::memory_order_acq_rel);
  int fd = g_dump_requests.wake_fd.load(std::memory_order_acquire);
  if (fd >= 0) {
    std::uint64_t one = 1;
    ssize_t r = ::write(fd, &one, sizeof one);  // write(2) is async-signal-safe
    (void)r;
  }
  errno = saved_errno;
}

}  // namespace detail
}  // namespace selfprof
