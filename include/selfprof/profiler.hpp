// The public API: start and stop sampling, take a profile, write it to files, read the counters.
// Context: any thread (not the signal handler).
#pragma once

#include <unistd.h>

#include <cstdio>
#include <ctime>
#include <string>
#include <vector>

#include "collect/collector.hpp"
#include "options.hpp"
#include "output/dump_paths.hpp"
#include "output/format.hpp"
#include "output/markers.hpp"
#include "output/sink.hpp"
#include "profile.hpp"
#include "status.hpp"

namespace selfprof {

// Starts sampling every thread of the process (existing and future ones). Idempotent: a second call
// while running does nothing. Restartable after stop(); each start begins a new profile.
inline status start(const options& opts) { return detail::profiler_core::instance().start(opts); }

// Starts with defaults overridden by the SELFPROF_* environment variables; a bad value is reported
// once on stderr with the variable's name, and so is a failure to start.
inline status start_from_env() {
  std::vector<std::string> warnings;
  options o = options_from_env(&warnings);
  for (auto& w : warnings) std::fprintf(stderr, "%s\n", w.c_str());
  status st = start(o);
  if (!st) std::fprintf(stderr, "%s\n", st.message().c_str());
  return st;
}

// Stops sampling; what was collected stays available to snapshot() and dump(). Idempotent.
inline status stop() { return detail::profiler_core::instance().stop(); }

inline bool running() { return detail::profiler_core::instance().running(); }

// Arms the calling thread now, without waiting for the next thread scan (a few tens of ms), and
// unblocks the sampling signal in it.
inline status register_thread() { return detail::profiler_core::instance().register_current_thread(); }

// The profile collected so far, symbolized. Sampling goes on.
inline profile snapshot() { return detail::profiler_core::instance().snapshot(); }

inline stats get_stats() { return detail::profiler_core::instance().get_stats(); }


// Writes the profile collected so far; the format follows the extension (.folded .collapsed .svg
// .txt .pb.gz), several paths may be given separated by commas, and %p %t %n are expanded. Atomic
// (temporary file + rename), mode 0600, never through a symlink. Nothing collected is lost when it fails.
inline status dump(const std::string& paths) {
  profile p = snapshot();
  detail::add_marker_frames(p, detail::profiler_core::instance().thread_roots());
  return detail::write_profile(p, paths, detail::dump_output_options(p));
}

}  // namespace selfprof

// Start sampling with SELFPROF_* environment overrides; evaluates to a selfprof::status.
#define SELFPROF_START() ::selfprof::start_from_env()
#define SELFPROF_STOP() ::selfprof::stop()
