// Signal-handler code: the dump signal (SIGUSR2 by default) only counts a request and wakes the dumper
// thread through its eventfd; that thread does the work (a handler that opens files and allocates, as
// some profilers' dump signals do, deadlocks when it interrupts malloc).
// Context: signal handler (async-signal-safe: atomic adds and one raw write(2), not libc's interposable
// wrapper).
#pragma once

#include <signal.h>
#include <unistd.h>

#include <errno.h>
#include <atomic>
#include <cstdint>

#include "selfprof/signal/raw_syscall.hpp"

namespace selfprof {
namespace detail {

struct dump_request_globals {
  std::atomic<std::uint64_t> requests{0};  // dump signals received
  std::atomic<int> wake_fd{-1};            // the dumper's eventfd, -1 when no dumper runs
  std::atomic<int> in_flight{0};           // handlers running now: the eventfd closes only at zero
};

inline dump_request_globals g_dump_requests;

// in_flight and wake_fd are seq_cst, as the sampling handler's in_flight and active: stop() stores -1 in
// wake_fd and then waits for in_flight to be zero, so a handler either sees -1 or is waited for, and
// never writes into a descriptor number that was closed and reused.
inline void dump_signal_handler(int, siginfo_t*, void*) {
  const int saved_errno = errno;
  g_dump_requests.in_flight.fetch_add(1, std::memory_order_seq_cst);
  g_dump_requests.requests.fetch_add(1, std::memory_order_acq_rel);
  const int fd = g_dump_requests.wake_fd.load(std::memory_order_seq_cst);
  if (fd >= 0) {
    const std::uint64_t one = 1;
    raw_syscall3(SYS_write, fd, reinterpret_cast<long>(&one), sizeof one);
  }
  g_dump_requests.in_flight.fetch_sub(1, std::memory_order_release);
  errno = saved_errno;
}

}  // namespace detail
}  // namespace selfprof
