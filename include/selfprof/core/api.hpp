// The definitions of selfprof's public functions (declared and documented in profiler.hpp): inline in
// header-only mode, compiled once with SELFPROF_COMPILED_LIB.
// Context: any thread (not the signal handler).
#pragma once

#include <cstdio>
#include <string>
#include <vector>

#include "selfprof/config.hpp"
#include "selfprof/core/profiler.hpp"
#include "selfprof/dump/dump.hpp"
#include "selfprof/options.hpp"
#include "selfprof/output/diff.hpp"
#include "selfprof/output/markers.hpp"
#include "selfprof/profile.hpp"
#include "selfprof/stats.hpp"
#include "selfprof/status.hpp"

namespace selfprof {

SELFPROF_API status start(const options& opts) { return detail::profiler_core::instance().start(opts); }

SELFPROF_API status start_from_env() {
  std::vector<std::string> warnings;
  options o = options_from_env(&warnings);
  for (auto& w : warnings) std::fprintf(stderr, "%s\n", w.c_str());
  status st = start(o);
  if (!st) std::fprintf(stderr, "%s\n", st.message().c_str());
  return st;
}

SELFPROF_API status stop() { return detail::profiler_core::instance().stop(); }

SELFPROF_API bool running() { return detail::profiler_core::instance().running(); }

SELFPROF_API status register_thread() { return detail::profiler_core::instance().register_current_thread(); }

SELFPROF_API profile snapshot() { return detail::profiler_core::instance().snapshot(); }

SELFPROF_API stats get_stats() { return detail::profiler_core::instance().get_stats(); }

SELFPROF_API status dump(const std::string& paths) { return detail::profiler_core::instance().dump(paths); }

SELFPROF_API profile snapshot_offcpu() { return detail::offcpu_view(snapshot()); }

namespace detail {
// One profile the API writes on its own (not a whole dump): markers, titles and numbering as a dump's.
// The SVG title is the dump's, after `title_prefix`, or `title` when given.
inline status write_single(profile p, const std::string& paths, const std::string& title_prefix,
                           const std::string& title = "", bool flamechart = false,
                           const std::string& rank = "") {
  profiler_core& core = profiler_core::instance();
  const dump_settings s = core.dump_settings_for(paths);
  add_marker_frames(p, s.thread_roots);
  output_options oo = dump_output_options(p);
  oo.svg.title = title.empty() ? title_prefix + oo.svg.title : title;
  oo.svg.flamechart = flamechart;
  path_fields f = fields_now(next_dump_number());
  f.rank = rank;
  return write_profile_paths(p, paths, f, oo, s.sink);
}
}  // namespace detail

SELFPROF_API status dump_offcpu(const std::string& paths) {
  return detail::write_single(snapshot_offcpu(), paths, "");
}

SELFPROF_API std::vector<frame_loop_stats> frame_stats() {
  return detail::profiler_core::instance().snapshot_raw().info.frame_loops;
}

SELFPROF_API profile snapshot_slow_frames() {
  detail::snapshot_maker& s = detail::profiler_core::instance().snapshots();
  bool marked = false;
  return s.symbolize(s.slow_raw(marked));
}

SELFPROF_API status dump_slow_frames(const std::string& paths) {
  const double budget = detail::profiler_core::instance().snapshots().opts().frame_budget_ms;
  return detail::write_single(snapshot_slow_frames(), paths,
                              "Slow frames (over " + detail::format_compact(budget) + " ms): ");
}

SELFPROF_API std::vector<profile> worst_frames(std::size_t n) {
  return detail::profiler_core::instance().snapshots().worst_game_frames(n);
}

SELFPROF_API status dump_worst_frames(const std::string& path_template, std::size_t n) {
  std::vector<profile> frames = worst_frames(n);
  std::string errors;
  for (std::size_t i = 0; i < frames.size(); ++i) {
    const std::string rank = std::to_string(i + 1);
    const std::string paths = path_template.find("%f") == std::string::npos
                                  ? detail::companion_paths(path_template, "-frame" + rank)
                                  : path_template;
    status st =
        detail::write_single(frames[i], paths, "", "Flame chart of " + frames[i].info.view, true, rank);
    if (!st) errors += (errors.empty() ? "" : "\n") + st.message();
  }
  return errors.empty() ? status::ok() : status::error(errors);
}

SELFPROF_API status dump_diff(const profile& before, const profile& after, const std::string& path,
                              const diff_options& options) {
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
