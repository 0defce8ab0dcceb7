// Loading folded stacks for the render commands: every input file parsed with its own name for error
// messages, malformed lines counted and reported (fatal with --strict), several files merged into one.
// Context: setup only (the command-line tool).
#pragma once

#include <cstdio>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "input.hpp"
#include "selfprof/output/folded_parse.hpp"
#include "selfprof/status.hpp"

namespace selfprof_cli {

struct load_options {
  bool strict = false;  // a malformed line is an error
  bool quiet = false;   // no warnings on stderr
};

// Appends the stacks of `src` to `dst`, re-interning frames by (kind, name).
inline void merge_folded(selfprof::folded_parse_result& dst, selfprof::folded_parse_result&& src) {
  if (dst.prof.stacks.empty() && dst.prof.frames.empty()) {
    const std::size_t lines = dst.lines, ignored = dst.ignored_lines;
    dst = std::move(src);
    dst.lines += lines;
    dst.ignored_lines += ignored;
    return;
  }
  std::map<std::pair<int, std::string>, std::uint32_t> index;
  for (std::uint32_t i = 0; i < dst.prof.frames.size(); ++i)
    index.emplace(std::make_pair(static_cast<int>(dst.prof.frames[i].kind), dst.prof.frames[i].name), i);
  std::vector<std::uint32_t> remap(src.prof.frames.size());
  for (std::uint32_t i = 0; i < src.prof.frames.size(); ++i) {
    auto key = std::make_pair(static_cast<int>(src.prof.frames[i].kind), src.prof.frames[i].name);
    auto it = index.find(key);
    if (it == index.end()) {
      it = index.emplace(key, static_cast<std::uint32_t>(dst.prof.frames.size())).first;
      dst.prof.frames.push_back(src.prof.frames[i]);
    }
    remap[i] = it->second;
  }
  for (std::size_t k = 0; k < src.prof.stacks.size(); ++k) {
    selfprof::stack s = std::move(src.prof.stacks[k]);
    for (auto& f : s.frames) f = remap[f];
    dst.prof.stacks.push_back(std::move(s));
    dst.before_counts.push_back(k < src.before_counts.size() ? src.before_counts[k] : 0);
  }
  for (auto& t : src.prof.threads) dst.prof.threads.push_back(std::move(t));
  selfprof::detail::add_saturating(dst.prof.info.samples,
                                   src.prof.info.samples);  // counts from files can be huge
  selfprof::detail::add_saturating(dst.prof.info.truncated, src.prof.info.truncated);
  dst.differential = dst.differential || src.differential;
  dst.lines += src.lines;
  dst.ignored_lines += src.ignored_lines;
  dst.comment_lines += src.comment_lines;
  dst.zero_count_lines += src.zero_count_lines;
  dst.fractional_lines += src.fractional_lines;
}

// Reads and parses the inputs ("-" is stdin). Reports on stderr, as "selfprof CMD: FILE:LINE: ...",
// every malformed line kept by the parser and a total per file.
inline selfprof::status load_folded(const char* cmd, const std::vector<std::string>& paths,
                                    const load_options& o, selfprof::folded_parse_result& out) {
  for (const std::string& path : paths) {
    std::string text;
    selfprof::status st = read_all(path, text);
    if (!st) return st;
    const std::string name = path == "-" ? std::string("<stdin>") : path;
    selfprof::folded_parse_result r = selfprof::parse_folded(text, name);
    if (!o.quiet || o.strict) {
      for (const auto& e : r.errors)
        std::fprintf(stderr, "selfprof %s: %s (expected 'frame;frame;... COUNT')\n", cmd,
                     e.to_string().c_str());
      if (r.ignored_lines > r.errors.size())
        std::fprintf(stderr, "selfprof %s: %s: %zu more malformed line(s) not shown\n", cmd, name.c_str(),
                     r.ignored_lines - r.errors.size());
      if (r.ignored_lines > 0)
        std::fprintf(stderr, "selfprof %s: %s: ignored %zu line(s) with invalid format\n", cmd, name.c_str(),
                     r.ignored_lines);
    }
    if (!o.quiet) {
      for (const auto& w : r.warnings)
        std::fprintf(stderr, "selfprof %s: warning: %s\n", cmd, w.to_string().c_str());
      if (r.fractional_lines > 1)
        std::fprintf(stderr, "selfprof %s: warning: %s: %zu fractional counts truncated in all\n", cmd,
                     name.c_str(), r.fractional_lines);
    }
    if (o.strict && r.ignored_lines > 0)
      return selfprof::status::error(name + ": " + std::to_string(r.ignored_lines) +
                                     " malformed line(s) (--strict makes them fatal)");
    merge_folded(out, std::move(r));
  }
  return selfprof::status::ok();
}

}  // namespace selfprof_cli
