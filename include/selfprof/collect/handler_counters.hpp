// The signal handler's counters, read together: they only grow for the life of the process, so a session
// reports what changed since it began.
// Context: any thread except the signal handler.
#pragma once

#include <cstdint>

#include "selfprof/signal/handler.hpp"

namespace selfprof {
namespace detail {

struct handler_counts {
  std::uint64_t taken = 0, full = 0, inactive = 0, foreign = 0, truncated = 0;
  std::uint64_t thread_checks = 0, thread_wakes = 0;
  std::uint64_t rate_capped = 0, periods_skipped = 0;

  static handler_counts now() {
    const handler_globals& g = g_handler;
    handler_counts c;
    c.taken = g.taken.load(std::memory_order_relaxed);
    c.full = g.dropped_full.load(std::memory_order_relaxed);
    c.inactive = g.dropped_inactive.load(std::memory_order_relaxed);
    c.foreign = g.foreign.load(std::memory_order_relaxed);
    c.truncated = g.truncated.load(std::memory_order_relaxed);
    c.thread_checks = g.thread_checks.load(std::memory_order_relaxed);
    c.thread_wakes = g.thread_wakes.load(std::memory_order_relaxed);
    c.rate_capped = g.rate_capped.load(std::memory_order_relaxed);
    c.periods_skipped = g.periods_skipped.load(std::memory_order_relaxed);
    return c;
  }
  handler_counts since(const handler_counts& base) const {
    handler_counts d;
    d.taken = taken - base.taken;
    d.full = full - base.full;
    d.inactive = inactive - base.inactive;
    d.foreign = foreign - base.foreign;
    d.truncated = truncated - base.truncated;
    d.thread_checks = thread_checks - base.thread_checks;
    d.thread_wakes = thread_wakes - base.thread_wakes;
    d.rate_capped = rate_capped - base.rate_capped;
    d.periods_skipped = periods_skipped - base.periods_skipped;
    return d;
  }
};

}  // namespace detail
}  // namespace selfprof
