// One dump, whatever asked for it (the API, the dump signal, the interval, exit): the JIT perf map is
// flushed first, then every file is written under one dump number and one time — the profile in each
// format of the path list, the off-CPU part of a wall profile ("-offcpu" before the extension) and the
// slow game frames when frames were marked ("-slow") — each with the same titles.
// Context: any thread except the signal handler (the dumper thread, an API caller, exit).
#pragma once

#include <unistd.h>

#include <cstdio>
#include <string>
#include <vector>

#include "selfprof/dump/paths.hpp"
#include "selfprof/jit/runtime.hpp"
#include "selfprof/output/format.hpp"
#include "selfprof/output/markers.hpp"
#include "selfprof/output/sink.hpp"
#include "selfprof/output/text.hpp"
#include "selfprof/profile.hpp"
#include "selfprof/status.hpp"

namespace selfprof {
namespace detail {

struct dump_settings {
  std::string paths;  // comma-separated path templates
  sink_options sink;
  bool thread_roots = false;      // a root frame per thread
  double frame_budget_ms = 16.7;  // named in the slow-frames title
};

// What one dump holds: the profile and, when game frames were marked, the samples of the slow ones.
struct dump_contents {
  profile main;
  bool slow_marked = false;
  profile slow;
};

// The name of this program for titles: /proc/self/comm.
inline std::string program_name() {
  std::string comm;
  std::FILE* f = std::fopen("/proc/self/comm", "r");
  if (f) {
    char buf[64] = {0};
    if (std::fgets(buf, sizeof buf, f)) comm = buf;
    std::fclose(f);
  }
  while (!comm.empty() && (comm.back() == '\n' || comm.back() == ' ')) comm.pop_back();
  return comm;
}

// What a dump of this process writes: the SVG titled with the program's name and pid, and what the
// samples do not cover (kernel time) as its subtitle.
inline output_options dump_output_options(const profile& p) {
  output_options oo;
  const std::string comm = program_name();
  const profile_mode mode = p.info.mode;
  oo.svg.title = (mode == profile_mode::cpu    ? std::string("CPU profile of ")
                  : mode == profile_mode::wall ? std::string("Wall-clock profile of ")
                                               : std::string("Off-CPU time of ")) +
                 (comm.empty() ? std::string("this process") : comm) + " (pid " + std::to_string(::getpid()) +
                 ")";
  if (mode == profile_mode::offcpu) oo.svg.colors = palette::io;  // Gregg's off-CPU convention: blue frames
  if (!p.info.unit.empty() && p.info.unit != "samples") oo.svg.count_name = p.info.unit;
  if (!p.info.kernel_time) oo.svg.subtitle = "time spent in the kernel is not sampled (user-only ticks)";
  return oo;
}

// Writes `p` to every path of the list `paths` (templates expanded with `fields`), each in the format of
// its extension. Errors of all paths are joined; the others are still written.
inline status write_profile_paths(const profile& p, const std::string& paths, const path_fields& fields,
                                  const output_options& oo, const sink_options& sink) {
  const std::vector<std::string> list = split_paths(paths);
  if (list.empty()) return status::error("selfprof: no output path given");
  std::string errors;
  for (const std::string& tmpl : list) {
    status st = write_profile_file(p, expand_path_template(tmpl, fields), oo, sink);
    if (!st) errors += (errors.empty() ? "" : "\n") + st.message();
  }
  return errors.empty() ? status::ok() : status::error(errors);
}

// `paths` with `tag` before each path's extension.
inline std::string companion_paths(const std::string& paths, const std::string& tag) {
  std::string out;
  for (const std::string& p : split_paths(paths))
    out += (out.empty() ? "" : ",") + insert_before_extension(p, tag);
  return out;
}

// The one dump: see the top of this file. Every file is attempted even when an earlier one failed;
// the errors are joined. Nothing collected is lost either way (`c` is a copy).
inline status write_dump(dump_contents& c, const dump_settings& s) {
  if (jit_runtime_slot().load(std::memory_order_acquire) != nullptr) {
    status j = jit_global().flush();  // the perf map is complete whenever a profile is
    (void)j;                          // reported on stderr once by the runtime; the profile is still written
  }
  const path_fields fields = fields_now(next_dump_number());
  std::string errors;
  auto keep = [&](const status& st) {
    if (!st) errors += (errors.empty() ? "" : "\n") + st.message();
  };
  add_marker_frames(c.main, s.thread_roots);
  keep(write_profile_paths(c.main, s.paths, fields, dump_output_options(c.main), s.sink));
  if (c.main.info.mode == profile_mode::wall) {
    const profile off = offcpu_view(c.main);
    keep(write_profile_paths(off, companion_paths(s.paths, "-offcpu"), fields, dump_output_options(off),
                             s.sink));
  }
  if (c.slow_marked) {
    add_marker_frames(c.slow, s.thread_roots);
    output_options oo = dump_output_options(c.slow);
    oo.svg.title = "Slow frames (over " + format_compact(s.frame_budget_ms) + " ms): " + oo.svg.title;
    keep(write_profile_paths(c.slow, companion_paths(s.paths, "-slow"), fields, oo, s.sink));
  }
  return errors.empty() ? status::ok() : status::error(errors);
}

}  // namespace detail
}  // namespace selfprof
