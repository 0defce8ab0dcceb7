// The top-list writer (`.txt`): the flat ranking `perf report --no-children` prints, self and total
// per function (optionally per module too), under a header with the profile's sampling metadata.
// Context: any thread except the signal handler (a pure function of the profile).
//
// Definitions: self = samples whose leaf is the function; total = samples whose stack contains the
// function, counted once per stack even when it recurses; percentages are of all samples in the
// profile's stacks. Functions are identified by their folded name (so the kinds' `_[k]` `_[j]` `_[i]`
// show and hostile characters are made safe as in the folded output); thread-root markers are not
// functions and are skipped. Rows are sorted by self, then total (both descending), then name
// (bytewise). Numbers are formatted without the C locale's help, so the bytes never depend on it.
#pragma once

#include <algorithm>
#include <cstdint>
#include <string>
#include <unordered_map>
#include <vector>

#include "selfprof/output/folded.hpp"
#include "selfprof/output/text.hpp"
#include "selfprof/profile.hpp"
#include "selfprof/version.hpp"

namespace selfprof {

struct top_options {
  std::size_t limit = 0;   // rows per table; 0 = all
  bool by_module = false;  // add a table ranking modules the same way
};

namespace detail {

struct top_row {
  std::string name;
  std::uint64_t self = 0, total = 0;
};

// Module label of a frame for the per-module table.
inline std::string top_module_name(const frame& f) {
  if (!f.module.empty()) {
    std::string safe;
    append_folded_name(safe, f.module);
    return safe;
  }
  switch (f.kind) {
    case frame_kind::kernel:
      return "[kernel]";
    case frame_kind::jit:
      return "[jit]";
    case frame_kind::marker:
      return "[selfprof]";
    default:
      return "[unknown]";
  }
}

// Self/total rows keyed by `key_of(frame index)`; an index past the frame table counts as "[unknown]".
template <typename KeyOf>
std::vector<top_row> top_rows(const profile& p, std::uint64_t& grand_total, KeyOf key_of) {
  std::unordered_map<std::string, std::size_t> index;
  std::vector<top_row> rows;
  std::vector<std::size_t> seen_mark;  // per row: last stack number that counted it (+1)
  auto row_for = [&](const std::string& key) -> std::size_t {
    auto [it, fresh] = index.try_emplace(key, rows.size());
    if (fresh) {
      rows.push_back({key, 0, 0});
      seen_mark.push_back(0);
    }
    return it->second;
  };
  grand_total = 0;
  std::size_t stack_number = 0;
  for (const auto& s : p.stacks) {
    if (s.count == 0) continue;
    ++stack_number;
    add_saturating(grand_total, s.count);
    std::size_t leaf = static_cast<std::size_t>(-1);
    for (const auto fi : s.frames) {
      const frame* f = frame_at(p, fi);
      if (f && f->kind == frame_kind::marker && is_thread_root_name(f->name)) continue;
      const std::size_t r = row_for(key_of(f));
      if (seen_mark[r] != stack_number) {
        seen_mark[r] = stack_number;
        add_saturating(rows[r].total, s.count);
      }
      leaf = r;
    }
    if (leaf == static_cast<std::size_t>(-1)) {
      leaf = row_for(std::string(unknown_frame));
      add_saturating(rows[leaf].total, s.count);
    }
    add_saturating(rows[leaf].self, s.count);
  }
  std::sort(rows.begin(), rows.end(), [](const top_row& a, const top_row& b) {
    if (a.self != b.self) return a.self > b.self;
    if (a.total != b.total) return a.total > b.total;
    return a.name < b.name;
  });
  return rows;
}

inline std::string top_percent(std::uint64_t part, std::uint64_t whole) {
  const double pct = whole ? 100.0 * static_cast<double>(part) / static_cast<double>(whole) : 0.0;
  return format_fixed(pct, 2) + "%";
}

inline std::string pad_left(const std::string& s, std::size_t width) {
  return s.size() >= width ? s : std::string(width - s.size(), ' ') + s;
}

inline void append_top_table(std::string& out, const std::vector<top_row>& rows, std::uint64_t total,
                             const char* what, std::size_t limit) {
  std::size_t width = 5;
  for (const auto& r : rows) width = std::max(width, std::to_string(r.total).size());
  out += pad_left("self%", 7) + " " + pad_left("total%", 7) + "  " + pad_left("self", width) + "  " +
         pad_left("total", width) + "  " + what + "\n";
  const std::size_t shown = limit && limit < rows.size() ? limit : rows.size();
  for (std::size_t i = 0; i < shown; ++i) {
    const auto& r = rows[i];
    out += pad_left(top_percent(r.self, total), 7) + " " + pad_left(top_percent(r.total, total), 7) + "  " +
           pad_left(std::to_string(r.self), width) + "  " + pad_left(std::to_string(r.total), width) + "  " +
           r.name + "\n";
  }
  if (shown < rows.size())
    out += "... " + std::to_string(rows.size() - shown) + " more (limit " + std::to_string(limit) + ")\n";
}

}  // namespace detail

// The top list of a profile (see the definitions at the top of this file).
inline std::string write_top(const profile& p, const top_options& opts = {}) {
  std::uint64_t total = 0;
  const auto functions = detail::top_rows(p, total, [](const frame* f) {
    return f ? detail::folded_frame_name(*f) : std::string(detail::unknown_frame);
  });
  const auto& info = p.info;
  std::string out =
      "# selfprof " SELFPROF_VERSION_STRING " top: self and total per function (perf report --no-children)\n";
  out += "# mode: " + info.mode + "  unit: " + info.unit +
         "  source: " + (info.source.empty() ? "-" : info.source) +
         "  hz: " + detail::format_compact(info.hz) +
         "  duration: " + detail::format_fixed(info.duration_s, 3) + " s\n";
  out += "# samples: " + std::to_string(total) + "  dropped: " + std::to_string(info.dropped) +
         "  truncated: " + std::to_string(info.truncated) + "\n";
  if (!info.view.empty()) out += "# view: " + info.view + "\n";  // [frames]
  for (const auto& loop : info.frame_loops) {
    out += "# frames: ";
    detail::append_printable(out, frame_stats_line(loop));
    out += "\n";
  }
  for (const auto& note : info.notes) {
    out += "# note: ";
    detail::append_printable(out, note);
    out += "\n";
  }
  out += "\n";
  if (total == 0) return out + "(no samples)\n";
  detail::append_top_table(out, functions, total, "function", opts.limit);
  if (opts.by_module) {
    std::uint64_t module_total = 0;
    const auto modules = detail::top_rows(p, module_total, [](const frame* f) {
      return f ? detail::top_module_name(*f) : std::string("[unknown]");
    });
    out += "\n";
    detail::append_top_table(out, modules, module_total, "module", opts.limit);
  }
  return out;
}

}  // namespace selfprof
