// The tick-source interface: what every sampling mechanism (perf_event, CPU timer, itimer) provides.
// Context: setup only and the collector thread (never the signal handler).
#pragma once

#include <sys/types.h>
#include <time.h>

#include <cstdint>
#include <string>
#include <vector>

#include "selfprof/detail/process.hpp"
#include "selfprof/options.hpp"
#include "selfprof/signal/ring.hpp"
#include "selfprof/status.hpp"

namespace selfprof {

namespace detail {

struct source_config {
  double hz = 99;
  int signal_number = 0;
  bool allow_user_only = false;  // perf: accept an event that excludes kernel time
  // perf, wall mode: only a software task clock that excludes the kernel, whose ticks land in user code
  // only (wall/sampler.hpp explains why that keeps EINTR away from blocking calls).
  bool user_clock_only = false;
  std::size_t max_depth = 0;  // ring: the kernel's call-chain depth (0: its default)
};

// A source that pulls samples (the ring): what it read, as the handler's counters say it for signals.
struct pulled_stats {
  std::uint64_t records = 0;    // samples written into the sample ring
  std::uint64_t truncated = 0;  // of them, stacks cut by the depth limit
  std::uint64_t full = 0;       // samples dropped: the sample ring was full
  std::uint64_t lost = 0;       // the kernel's PERF_RECORD_LOST counts, and records that did not parse
  std::uint64_t throttles = 0;  // PERF_RECORD_THROTTLE records
  std::uint64_t user_chain_since_ns = 0;  // CLOCK_MONOTONIC since the kernel's user chain is asked for, or 0
  std::uint64_t chain_cut = 0;    // samples cut where that chain (not asked for then) would have gone on
  bool chain_given_back = false;  // it was asked for, then continued too few stacks, and was given up
  std::uint64_t ring_pages = 0;   // data pages of the largest CPU ring now (the rings grow, see perf_ring)
  std::uint64_t overlap = 0;      // samples both sets of events took while the rings grew (kept once)
};

// What a pulling source may ask of the collector while it unwinds the samples it read, when rows are
// parsed lazily: whether a pc lies in code whose rows were never parsed (such a walk went on by frame
// pointers, which code without them does not keep), and to parse them now. Collector thread only.
class row_requests {
 public:
  virtual ~row_requests() = default;
  virtual bool unparsed(std::uint64_t pc) const = 0;
  // True when the rows of the module holding `pc` were parsed now (and published for the next walk).
  virtual bool parse(std::uint64_t pc) = 0;
};

class tick_source {
 public:
  virtual ~tick_source() = default;
  virtual source_kind kind() const = 0;
  // A short description of what was opened (e.g. "perf task-clock (user+kernel)").
  virtual std::string describe() const = 0;
  // Process-wide setup; checks that the mechanism works (opens one probe for the calling thread).
  virtual status open(const source_config& config) = 0;
  // Per-thread sources arm one thread by tid, from any thread of the process. A failure carries the errno
  // (status::code): EMFILE, ENFILE or ENOMEM mean "out of resources", which a fallback source may cover.
  virtual bool per_thread() const = 0;
  virtual status arm(pid_t tid) = 0;
  virtual void disarm(pid_t tid) = 0;
  // Disarms every thread and releases every kernel object. Idempotent.
  virtual void close() = 0;
  // A forked child holds copies of the parent's kernel objects: forget them without touching the
  // parent's (no disable ioctl); just release this process's references.
  virtual void abandon_after_fork() = 0;
  virtual std::size_t armed_count() const = 0;
  // Sampling rate really delivered per CPU-second (may be lower than requested: timer above the tick).
  virtual double effective_hz() const = 0;
  virtual bool counts_kernel_time() const = 0;
  // Samples one armed thread at `hz` instead (SELFPROF_FRAME_HZ on threads that mark game frames).
  // Sources that send no signal (sources/perf_ring.hpp): the collector reads their samples into the
  // sample ring (`skip`: selfprof's own threads, dropped), every collect_period_ms(). With `rows`, a
  // sample whose walk met code with unparsed rows has them parsed and is walked again.
  virtual bool pulls_samples() const { return false; }
  virtual std::size_t collect(sample_ring& out, const std::vector<pid_t>& skip,
                              row_requests* rows = nullptr) {
    (void)out;
    (void)skip;
    (void)rows;
    return 0;
  }
  virtual std::size_t collect_again(sample_ring& out) {  // with the last `skip` (at stop)
    (void)out;
    return 0;
  }
  // The most samples one collect() may write into the sample ring now (0: not bounded).
  virtual std::size_t records_per_read() const { return 0; }
  virtual unsigned collect_period_ms() const { return 50; }
  virtual pulled_stats pulled() const { return {}; }  // what collect() read, for stats
  virtual status set_thread_rate(pid_t tid, double hz) {
    (void)tid;
    (void)hz;
    return status::error(std::string(source_name(kind())) + ": no per-thread rate");
  }
};

// Kernel tick rate (CONFIG_HZ), read from the resolution of the coarse clock, which advances by one tick.
inline double kernel_tick_hz() {
  struct timespec res {};
  if (clock_getres(CLOCK_MONOTONIC_COARSE, &res) == 0 && (res.tv_sec > 0 || res.tv_nsec > 0))
    return 1e9 / (static_cast<double>(res.tv_sec) * 1e9 + static_cast<double>(res.tv_nsec));
  return 250;  // the most common CONFIG_HZ
}

inline std::int64_t period_ns_for(double hz) {
  if (!(hz > 0)) hz = 99;
  double ns = 1e9 / hz;
  return ns < 1000 ? 1000 : static_cast<std::int64_t>(ns);
}

}  // namespace detail
}  // namespace selfprof
