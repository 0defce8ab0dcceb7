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

namespace detail {

// %p pid, %t unix time, %n dump number, %% a percent sign.
inline std::string expand_path_template(const std::string& tmpl, unsigned long dump_number) {
  std::string out;
  for (std::size_t i = 0; i < tmpl.size(); ++i) {
    if (tmpl[i] != '%' || i + 1 == tmpl.size()) {
      out += tmpl[i];
      continue;
    }
    char c = tmpl[++i];
    if (c == 'p') out += std::to_string(::getpid());
    else if (c == 't') out += std::to_string(static_cast<long long>(std::time(nullptr)));
    else if (c == 'n') out += std::to_string(dump_number);
    else if (c == '%') out += '%';
    else {
      out += '%';
      out += c;
    }
  }
  return out;
}

inline std::vector<std::string> split_paths(const std::string& list) {
  std::vector<std::string> out;
  std::size_t start = 0;
  while (start <= list.size()) {
    std::size_t comma = list.find(',', start);
    std::string part = list.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
    if (!part.empty()) out.push_back(part);
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  return out;
}

inline unsigned long next_dump_number() {
  static std::atomic<unsigned long> n{0};
  return n.fetch_add(1) + 1;
}

// Writes one profile to every path of a comma-separated list, each in the format of its extension.
inline status write_profile(const profile& p, const std::string& paths, const output_options& oo) {
  std::vector<std::string> list = split_paths(paths);
  if (list.empty()) return status::error("selfprof: no output path given");
  unsigned long number = next_dump_number();
  std::string errors;
  for (const std::string& tmpl : list) {
    std::string path = expand_path_template(tmpl, number);
    status st = write_profile_file(p, path, oo);
    if (!st) errors += (errors.empty() ? "" : "\n") + st.message();
  }
  return errors.empty() ? status::ok() : status::error(errors);
}

}  // namespace detail

// Writes the profile collected so far; the format follows the extension (.folded .collapsed .svg
// .txt .pb.gz), several paths may be given separated by commas, and %p %t %n are expanded. Atomic
// (temporary file + rename), mode 0600, never through a symlink. Nothing collected is lost when it fails.
inline status dump(const std::string& paths) {
  profile p = snapshot();
  detail::add_marker_frames(p, detail::profiler_core::instance().thread_roots());
  output_options oo;
  return detail::write_profile(p, paths, oo);
}

}  // namespace selfprof

// Start sampling with SELFPROF_* environment overrides; evaluates to a selfprof::status.
#define SELFPROF_START() ::selfprof::start_from_env()
#define SELFPROF_STOP() ::selfprof::stop()
