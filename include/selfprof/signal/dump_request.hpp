// Signal-handler code: the dump signal (SIGUSR2 by default) only counts a request and wakes the dumper
// thread through its eventfd; that thread does the work (a handler that opens files and allocates, as
// some profilers' dump signals do, deadlocks when it interrupts malloc).
// Context: signal handler (async-signal-safe: atomic adds and one raw write(2), not libc's interposable
// wrapper).
#pragma once

#include <signal.h>
#include <time.h>
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
  std::atomic<int> dumper_tid{0};          // the dumper thread, 0 when none runs
  std::atomic<int> exit_requested{0};      // the process is ending: write the exit dump, then set exit_done
  std::atomic<int> exit_done{0};
  std::atomic<int> exit_dump_wanted{0};  // the session writes an exit dump (an output path was given)
  // The dump signal while selfprof routes it to the dumper (blocked in the starting thread and so in every
  // thread it creates later), 0 otherwise: a fork child and an exec take the block off (core/auto_dumps.hpp).
  std::atomic<int> routed_signal{0};
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

// The exit dump, asked of the dumper thread by a thread that is ending the process (the preload library's
// _exit: possibly inside a signal handler, or with a libc lock held by the thread it interrupted). No
// dump work happens on the calling thread; it waits for the dumper while the dumper makes progress (its
// CPU time grows) and gives up after `stall_ms` without any, or after `limit_ms` in all: a dumper blocked
// on a lock the caller holds cannot make it wait longer. True when the dump was written.
// Async-signal-safe: atomics, raw write(2), clock_gettime(2) and nanosleep(2).
// A dumper started on demand (core/auto_dumps.hpp) is not running yet: the wake starts it, and the wait
// counts as a stall until its tid is published.
inline bool exit_dump_by_dumper(unsigned stall_ms = 500, unsigned limit_ms = 60000) {
  if (g_dump_requests.exit_dump_wanted.load(std::memory_order_acquire) == 0) return false;
  if (g_dump_requests.dumper_tid.load(std::memory_order_acquire) <= 0 &&
      g_dump_requests.wake_fd.load(std::memory_order_acquire) < 0)
    return false;
  g_dump_requests.in_flight.fetch_add(1, std::memory_order_seq_cst);
  g_dump_requests.exit_requested.store(1, std::memory_order_seq_cst);
  const int fd = g_dump_requests.wake_fd.load(std::memory_order_seq_cst);
  if (fd >= 0) {
    const std::uint64_t one = 1;
    raw_syscall3(SYS_write, fd, reinterpret_cast<long>(&one), sizeof one);
  }
  g_dump_requests.in_flight.fetch_sub(1, std::memory_order_release);
  if (fd < 0) return false;
  long long last_cpu = -1;
  int last_tid = 0;
  unsigned still_ms = 0;
  for (unsigned waited_ms = 0; waited_ms < limit_ms; ++waited_ms) {
    if (g_dump_requests.exit_done.load(std::memory_order_acquire)) return true;
    const int tid = g_dump_requests.dumper_tid.load(std::memory_order_acquire);
    if (tid != last_tid) {
      last_tid = tid;
      last_cpu = -1;
      still_ms = 0;
    }
    if (tid <= 0) {
      if (++still_ms >= stall_ms) return false;
    } else {
      // The thread's CPU clock (clock_getcpuclockid's encoding for a thread: ~tid << 3 | CPUCLOCK_SCHED |
      // CPUCLOCK_PERTHREAD); reading it fails once the thread is gone.
      const clockid_t cpu = static_cast<clockid_t>((~static_cast<unsigned>(tid) << 3) | 6u);
      struct timespec t {};
      if (raw_syscall3(SYS_clock_gettime, cpu, reinterpret_cast<long>(&t), 0) != 0) return false;
      const long long now_cpu = static_cast<long long>(t.tv_sec) * 1000000000 + t.tv_nsec;
      still_ms = now_cpu == last_cpu ? still_ms + 1 : 0;
      if (still_ms >= stall_ms) return false;
      last_cpu = now_cpu;
    }
    struct timespec step {
      0, 1000 * 1000
    };
    raw_syscall3(SYS_nanosleep, reinterpret_cast<long>(&step), 0, 0);
  }
  return false;
}

}  // namespace detail
}  // namespace selfprof
