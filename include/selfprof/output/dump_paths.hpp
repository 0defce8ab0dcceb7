// Output path templates (%p pid, %t unix time, %n dump number) and writing one profile to a
// comma-separated list of paths, each in the format of its extension.
// Context: any thread except the signal handler.
#pragma once

#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <ctime>
#include <string>
#include <vector>

#include "selfprof/output/format.hpp"

namespace selfprof {
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
    if (c == 'p')
      out += std::to_string(::getpid());
    else if (c == 't')
      out += std::to_string(static_cast<long long>(std::time(nullptr)));
    else if (c == 'n')
      out += std::to_string(dump_number);
    else if (c == '%')
      out += '%';
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

// What a dump of this process writes: the SVG titled with the program's name and pid, the profile's
// remarks (a refused tick source, kernel time not sampled) as its subtitle.
inline output_options dump_output_options(const profile& p) {
  output_options oo;
  std::string comm;
  std::FILE* f = std::fopen("/proc/self/comm", "r");
  if (f) {
    char buf[64] = {0};
    if (std::fgets(buf, sizeof buf, f)) comm = buf;
    std::fclose(f);
  }
  while (!comm.empty() && (comm.back() == '\n' || comm.back() == ' ')) comm.pop_back();
  const std::string& mode = p.info.mode;
  oo.svg.title = (mode == "cpu"      ? std::string("CPU profile of ")
                  : mode == "wall"   ? std::string("Wall-clock profile of ")
                  : mode == "offcpu" ? std::string("Off-CPU time of ")
                                     : mode + " profile of ") +
                 (comm.empty() ? std::string("this process") : comm) + " (pid " + std::to_string(::getpid()) +
                 ")";
  if (mode == "offcpu") oo.svg.colors = palette::io;  // Gregg's off-CPU convention: blue frames
  if (!p.info.unit.empty() && p.info.unit != "samples") oo.svg.count_name = p.info.unit;
  for (const auto& n : p.info.notes) {
    if (n.find("not sampled") == std::string::npos) continue;
    oo.svg.subtitle += (oo.svg.subtitle.empty() ? "" : "; ") + n;
  }
  return oo;
}

inline unsigned long next_dump_number() {
  static std::atomic<unsigned long> n{0};
  return n.fetch_add(1) + 1;
}

// Writes one profile to every path of a comma-separated list; errors of all paths are joined.
inline status write_profile(const profile& p, const std::string& paths, const output_options& oo,
                            const sink_options& sink = {}) {
  std::vector<std::string> list = split_paths(paths);
  if (list.empty()) return status::error("selfprof: no output path given");
  unsigned long number = next_dump_number();
  std::string errors;
  for (const std::string& tmpl : list) {
    std::string path = expand_path_template(tmpl, number);
    status st = write_profile_file(p, path, oo, sink);
    if (!st) errors += (errors.empty() ? "" : "\n") + st.message();
  }
  return errors.empty() ? status::ok() : status::error(errors);
}

}  // namespace detail
}  // namespace selfprof
