// Picks the tick source: `auto` takes the cheapest mechanism that honours the request (rate, kernel
// time, even coverage of threads) and records why each earlier one was refused.
// Context: setup only.
#pragma once

#include <signal.h>

#include <cstdio>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "selfprof/sources/cpu_timer.hpp"
#include "selfprof/sources/itimer.hpp"
#include "selfprof/sources/perf_event.hpp"
#include "selfprof/sources/perf_ring.hpp"
#include "selfprof/sources/source.hpp"

namespace selfprof {
namespace detail {

struct source_choice {
  std::unique_ptr<tick_source> source;
  std::string reason;                // why this one was taken
  std::vector<std::string> refused;  // why earlier ones were not
};

inline std::unique_ptr<tick_source> make_source(source_kind k) {
  switch (k) {
    case source_kind::perf:
      return std::unique_ptr<tick_source>(new perf_event_source());
    case source_kind::timer:
      return std::unique_ptr<tick_source>(new cpu_timer_source());
    case source_kind::itimer:
      return std::unique_ptr<tick_source>(new itimer_source());
    case source_kind::ring:
      return std::unique_ptr<tick_source>(new perf_ring_source());
    default:
      return nullptr;
  }
}

// The decision (bench/overhead.cpp measures it; figures in docs/measurements.md). First the ring: the
// kernel writes samples into buffers that the collector reads, so no signal ever reaches the program (no
// EINTR, no handler to conflict with, nothing pending at exec) and the cost per sample is perf record's.
// Where it cannot open (perf_event refused, descriptors or locked memory used up), the signal sources: a
// CPU-timer tick costs far less than a perf_event tick, whose hrtimer interrupt is expensive in virtual
// machines. Up to the kernel tick rate both deliver the requested rate and count kernel time, so the
// timer wins. Above it a CPU timer fires at most once per tick (the rest only show up as si_overrun), so
// perf_event is taken: with kernel time when it opens; user-only otherwise, which delivers the rate but
// cannot see time spent in syscalls (said in the reason). The itimer is the last resort: one signal per
// tick for the whole process, uneven across threads.
// `signal_ready`, when given, is called once before the first signal source is tried: it installs the
// sampling handler and sets cfg.signal_number, so a process the ring samples never has selfprof's handler
// (and does not pay for installing it); its error refuses every signal source.
inline source_choice choose_source(source_kind requested, source_config cfg,
                                   const std::function<status(source_config&)>& signal_ready = nullptr) {
  source_choice out;
  char buf[160];
  const double tick = kernel_tick_hz();
  std::vector<std::pair<source_kind, bool>> order;  // kind, allow user-only perf
  // `auto` and SELFPROF_SOURCE=ring try the ring first; where it cannot open, the signal sources follow,
  // and the refusal says why.
  const bool ring_forced = requested == source_kind::ring;
  const bool ring_first = ring_forced || requested == source_kind::automatic;
  if (ring_forced) requested = source_kind::automatic;
  if (ring_first) {
    auto ring = make_source(source_kind::ring);
    status st = ring->open(cfg);
    if (st) {
      out.reason = ring_forced ? "forced by SELFPROF_SOURCE/options"
                               : "the kernel writes samples into ring buffers: no signal reaches the program";
      out.source = std::move(ring);
      return out;
    }
    out.refused.push_back(std::string(source_name(source_kind::ring)) + ": " + st.message());
  }
  if (signal_ready) {
    status st = signal_ready(cfg);
    if (!st) {
      out.refused.push_back("signal sources: " + st.message());
      return out;
    }
  }
  if (requested == source_kind::automatic) {
    if (cfg.hz <= tick)
      order = {{source_kind::timer, false}, {source_kind::perf, false}, {source_kind::itimer, false}};
    else
      order = {{source_kind::perf, false},
               {source_kind::perf, true},
               {source_kind::timer, false},
               {source_kind::itimer, false}};
    // The itimer delivers SIGPROF only: tried here when that is the sampling signal; otherwise the caller
    // takes SIGPROF and asks for the itimer itself when nothing else opened.
    if (cfg.signal_number != SIGPROF) order.pop_back();
  } else {
    order = {{requested, requested == source_kind::perf}};
  }
  for (auto& o : order) {
    auto src = make_source(o.first);
    cfg.allow_user_only = o.second;
    status st = src->open(cfg);
    if (!st) {
      std::string name = source_name(o.first);
      if (o.first == source_kind::perf) name += o.second ? " (user-only)" : " (with kernel time)";
      out.refused.push_back(name + ": " + st.message());
      continue;
    }
    if (requested != source_kind::automatic) {
      out.reason = std::string("forced by SELFPROF_SOURCE/options");
    } else if (o.first == source_kind::timer && cfg.hz <= tick) {
      std::snprintf(buf, sizeof buf,
                    "cheapest source that honours %g Hz (<= kernel tick %g Hz) and counts kernel time",
                    cfg.hz, tick);
      out.reason = buf;
    } else if (o.first == source_kind::perf) {
      std::snprintf(buf, sizeof buf, "%g Hz is above the kernel tick (%g Hz) that limits CPU timers", cfg.hz,
                    tick);
      out.reason = buf;
      if (src->counts_kernel_time() == false)
        out.reason += "; user-only event: time in the kernel is not sampled";
    } else if (o.first == source_kind::timer) {
      std::snprintf(buf, sizeof buf,
                    "perf_event unavailable; timer ticks are limited to %g Hz and weighted by overruns",
                    tick);
      out.reason = buf;
    } else {
      out.reason = "last resort: per-thread sources unavailable (samples are uneven across threads)";
    }
    if (ring_first && !out.refused.empty())
      out.reason = "fell back from the ring source (" + out.refused.front() + "); " + out.reason;
    out.source = std::move(src);
    return out;
  }
  return out;
}

// Wall mode (wall/sampler.hpp): on-CPU stacks come only from a user-only software task clock, whose
// ticks never land in the kernel, so they cannot turn a blocking call into EINTR. CPU timers and the
// itimer can, and are refused even when asked for. No usable event: no signals at all (CPU time is then
// counted without stacks), which the reason says.
inline source_choice choose_wall_source(source_kind requested, source_config cfg) {
  source_choice out;
  if (requested == source_kind::timer || requested == source_kind::itimer) {
    out.refused.push_back(std::string(source_name(requested)) +
                          ": refused in wall mode (it can fire while a thread is in the kernel on its way to "
                          "sleep, and the blocking call then fails with EINTR)");
    return out;
  }
  cfg.user_clock_only = true;
  auto src = make_source(source_kind::perf);
  status st = src->open(cfg);
  if (!st) {
    out.refused.push_back("perf (user-only task clock): " + st.message());
    return out;
  }
  out.reason = "wall mode: a user-only task clock never interrupts a blocking call";
  out.source = std::move(src);
  return out;
}

}  // namespace detail
}  // namespace selfprof
