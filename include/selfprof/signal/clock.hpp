// Signal-handler code: the one clock every sample, game frame and collector decision is stamped with.
// Context: signal handler (clock_gettime is async-signal-safe, and a vDSO call without a system call),
// also any other thread.
#pragma once

#include <time.h>

#include <cstdint>

namespace selfprof {
namespace detail {

// Clock `id` in nanoseconds (0 when it cannot be read: a thread's clock after the thread ended).
inline std::uint64_t clock_ns(clockid_t id) {
  struct timespec ts;
  if (clock_gettime(id, &ts) != 0) return 0;
  return static_cast<std::uint64_t>(ts.tv_sec) * 1000000000ull + static_cast<std::uint64_t>(ts.tv_nsec);
}

// CLOCK_MONOTONIC in nanoseconds.
inline std::uint64_t monotonic_ns() { return clock_ns(CLOCK_MONOTONIC); }

// CPU time of the calling thread in nanoseconds (0 when the clock cannot be read).
inline std::uint64_t this_thread_cpu_ns() { return clock_ns(CLOCK_THREAD_CPUTIME_ID); }

// CPU time of the whole process, every thread, in nanoseconds (0 when the clock cannot be read).
inline std::uint64_t process_cpu_ns() { return clock_ns(CLOCK_PROCESS_CPUTIME_ID); }

}  // namespace detail
}  // namespace selfprof
