// The public API: start and stop sampling, take a profile, write it to files, read the counters.
// Context: any thread (not the signal handler).
#pragma once

#include <unistd.h>

#include <cstdio>
#include <ctime>
#include <string>
#include <vector>

#include "selfprof/collect/collector.hpp"
#include "selfprof/frames.hpp"
#include "selfprof/jit.hpp"
#include "selfprof/options.hpp"
#include "selfprof/output/diff.hpp"
#include "selfprof/output/dump_paths.hpp"
#include "selfprof/output/format.hpp"
#include "selfprof/output/markers.hpp"
#include "selfprof/output/sink.hpp"
#include "selfprof/profile.hpp"
#include "selfprof/status.hpp"

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
  jit::flush();  // the perf map is complete whenever a profile is
  profile p = snapshot();
  detail::add_marker_frames(p, detail::profiler_core::instance().thread_roots());
  return detail::write_profile(p, paths, detail::dump_output_options(p));
}

// [wall] SELFPROF_MODE=wall (options::mode = "wall"): profiles count microseconds of wall time, on and
// off the CPU; stacks of time off the CPU end in a [blocked: <system call>] frame (wall/sampler.hpp).

// The off-CPU part of the wall profile collected so far: where threads waited (empty in cpu mode).
inline profile snapshot_offcpu() { return detail::offcpu_view(snapshot()); }

// Writes the off-CPU profile like dump() writes the whole one (the SVG in the io palette, counts in us).
inline status dump_offcpu(const std::string& paths) {
  profile p = snapshot();
  detail::add_marker_frames(p, detail::profiler_core::instance().thread_roots());
  profile off = detail::offcpu_view(p);
  return detail::write_profile(off, paths, detail::dump_output_options(off));
}
// [/wall]

// [frames] Game and engine frames (see frames.hpp for SELFPROF_FRAME / frame_mark).

// Duration statistics of every loop marked with frame_mark, per loop name and thread.
inline std::vector<frame_loop_stats> frame_stats() {
  return detail::profiler_core::instance().snapshot_raw().info.frame_loops;
}

// The "slow frames" profile: only samples taken during frames longer than SELFPROF_FRAME_BUDGET_MS.
// Its unit is samples at SELFPROF_FRAME_HZ when that is set (info.hz says which rate).
inline profile snapshot_slow_frames() {
  auto& core = detail::profiler_core::instance();
  return core.symbolize(core.slow_frames_raw());
}

// Writes the slow-frames profile like dump() writes the all-frames one (same formats and templates).
inline status dump_slow_frames(const std::string& paths) {
  profile p = snapshot_slow_frames();
  detail::add_marker_frames(p, detail::profiler_core::instance().thread_roots());
  output_options oo = detail::dump_output_options(p);
  oo.svg.title = "Slow frames: " + oo.svg.title;
  return detail::write_profile(p, paths, oo);
}

// The `n` longest frames seen so far (at most detail::kWorstFramesKept), longest first; each profile
// holds one frame's samples in the order they were taken (info.view names the frame and its duration).
inline std::vector<profile> worst_frames(std::size_t n) {
  auto& core = detail::profiler_core::instance();
  std::vector<detail::kept_frame> kept = core.worst_frames(n);
  std::vector<profile> out;
  detail::raw_snapshot base = core.snapshot_raw();
  for (std::size_t i = 0; i < kept.size(); ++i) {
    const detail::kept_frame& k = kept[i];
    detail::frame_sequence seq = detail::make_frame_sequence(k);
    detail::raw_snapshot raw;
    raw.table = seq.table;
    raw.thread_names = base.thread_names;
    raw.info = base.info;
    raw.info.hz = core.frame_sample_hz();
    raw.info.period_ns = static_cast<std::uint64_t>(detail::period_ns_for(raw.info.hz));
    raw.info.duration_s = static_cast<double>(k.end_ns - k.start_ns) / 1e9;
    char buf[160];
    std::snprintf(buf, sizeof buf, "frame %llu of %s (tid %u): %.2f ms, worst %zu of %zu, time order",
                  static_cast<unsigned long long>(k.seq), k.loop.c_str(), static_cast<unsigned>(k.tid),
                  k.duration_ms(), i + 1, kept.size());
    raw.info.view = buf;
    profile p = core.symbolize(raw);
    detail::reorder_frame_profile(p, seq);
    out.push_back(std::move(p));
  }
  return out;
}

// Writes the `n` longest frames, one file each, as flame charts (x is time within the frame) in the
// format of the extension. `%f` in the template becomes the rank (1 = longest); without it, "-frame<rank>"
// goes before the extension ("frames.svg" -> "frames-frame1.svg", ...). No kept frame: nothing is written.
inline status dump_worst_frames(const std::string& path_template, std::size_t n = 3) {
  std::vector<profile> frames = worst_frames(n);
  std::string errors;
  for (std::size_t i = 0; i < frames.size(); ++i) {
    profile& p = frames[i];
    detail::add_marker_frames(p, detail::profiler_core::instance().thread_roots());
    const std::string rank = std::to_string(i + 1);
    std::string paths = path_template;
    if (paths.find("%f") == std::string::npos) {
      paths = detail::insert_before_extension(paths, "-frame" + rank);
    } else {
      for (std::size_t at; (at = paths.find("%f")) != std::string::npos;) paths.replace(at, 2, rank);
    }
    output_options oo = detail::dump_output_options(p);
    oo.svg.flamechart = true;
    oo.svg.title = "Flame chart of " + p.info.view;
    status st = detail::write_profile(p, paths, oo);
    if (!st) errors += (errors.empty() ? "" : "\n") + st.message();
  }
  return errors.empty() ? status::ok() : status::error(errors);
}
// [/frames]

// Writes what changed between two profiles (e.g. two snapshot()s, before and after a change): `.svg` gives
// a differential flame graph (red grew, blue shrank, baseline-only stacks still shown), `.folded` or
// `.diff` difffolded's `stack before after` lines. Atomic, mode 0600, like dump().
inline status dump_diff(const profile& before, const profile& after, const std::string& path,
                        const diff_options& options = {}) {
  const bool svg = detail::ends_with_ci(path, ".svg");
  if (!svg && !detail::ends_with_ci(path, ".folded") && !detail::ends_with_ci(path, ".diff"))
    return status::error("selfprof: cannot write " + path + ": a diff is written as .svg, .folded or .diff");
  profile b = before, a = after;
  detail::add_marker_frames(b, false);
  detail::add_marker_frames(a, false);
  std::string bytes = svg ? detail::write_diff_svg(b, a, detail::dump_output_options(a).svg, options)
                          : detail::write_diff_folded(b, a, options);
  return detail::write_file_atomic(path, bytes);
}

}  // namespace selfprof

// Start sampling with SELFPROF_* environment overrides; evaluates to a selfprof::status.
#define SELFPROF_START() ::selfprof::start_from_env()
#define SELFPROF_STOP() ::selfprof::stop()
