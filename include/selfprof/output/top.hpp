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
#include <string_view>
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

// The row key of a frame: its folded name, or its module with `by_module`; no frame is "[unknown]".
inline std::string top_key(const frame* f, bool by_module) {
  if (f == nullptr) return std::string(unknown_frame);
  return by_module ? top_module_name(*f) : folded_frame_name(*f);
}

// Self/total rows per function (per module with `by_module`); an index past the frame table counts as
// "[unknown]". Sorted by self, then total (both descending), then name.
inline std::vector<top_row> top_rows(const profile& p, std::uint64_t& grand_total, bool by_module) {
  std::unordered_map<std::string, std::size_t> index;
  std::vector<top_row> rows;
  std::vector<std::size_t> seen_mark;  // per row: last stack number that counted it (+1)
  auto row_for = [&](std::string key) -> std::size_t {
    auto [it, fresh] = index.try_emplace(key, rows.size());
    if (fresh) {
      rows.push_back({std::move(key), 0, 0});
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
      const std::size_t r = row_for(top_key(f, by_module));
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
  std::vector<std::uint32_t> order = identity_order(rows.size());
  sort_indices(
      order,
      [](const void* all, std::uint32_t ia, std::uint32_t ib) {
        const top_row& a = (*static_cast<const std::vector<top_row>*>(all))[ia];
        const top_row& b = (*static_cast<const std::vector<top_row>*>(all))[ib];
        if (a.self != b.self) return a.self > b.self;
        if (a.total != b.total) return a.total > b.total;
        return a.name < b.name;
      },
      &rows);
  std::vector<top_row> sorted;
  sorted.reserve(rows.size());
  for (std::uint32_t i : order) sorted.push_back(std::move(rows[i]));
  return sorted;
}

inline std::string top_percent(std::uint64_t part, std::uint64_t whole) {
  const double pct = whole ? 100.0 * static_cast<double>(part) / static_cast<double>(whole) : 0.0;
  std::string s = format_fixed(pct, 2);
  s += '%';
  return s;
}

// Appends `s` right-aligned in `width` columns.
inline void append_padded(std::string& out, std::string_view s, std::size_t width) {
  if (s.size() < width) out.append(width - s.size(), ' ');
  out += s;
}

inline void append_top_table(std::string& out, const std::vector<top_row>& rows, std::uint64_t total,
                             const char* what, std::size_t limit) {
  std::size_t width = 5;
  for (const auto& r : rows) width = std::max(width, std::to_string(r.total).size());
  append_padded(out, "self%", 7);
  out += ' ';
  append_padded(out, "total%", 7);
  out += "  ";
  append_padded(out, "self", width);
  out += "  ";
  append_padded(out, "total", width);
  out += "  ";
  out += what;
  out += '\n';
  const std::size_t shown = limit && limit < rows.size() ? limit : rows.size();
  for (std::size_t i = 0; i < shown; ++i) {
    const auto& r = rows[i];
    append_padded(out, top_percent(r.self, total), 7);
    out += ' ';
    append_padded(out, top_percent(r.total, total), 7);
    out += "  ";
    append_padded(out, std::to_string(r.self), width);
    out += "  ";
    append_padded(out, std::to_string(r.total), width);
    out += "  ";
    out += r.name;
    out += '\n';
  }
  if (shown < rows.size()) {
    out += "... ";
    out += std::to_string(rows.size() - shown);
    out += " more (limit ";
    out += std::to_string(limit);
    out += ")\n";
  }
}

}  // namespace detail

// The top list of a profile (see the definitions at the top of this file).
inline std::string write_top(const profile& p, const top_options& opts = {}) {
  std::uint64_t total = 0;
  const auto functions = detail::top_rows(p, total, false);
  const auto& info = p.info;
  std::string out =
      "# selfprof " SELFPROF_VERSION_STRING " top: self and total per function (perf report --no-children)\n";
  out += "# mode: ";
  out += mode_name(info.mode);
  out += "  unit: ";
  out += info.unit;
  out += "  source: ";
  out += info.source.empty() ? "-" : info.source;
  out += "  hz: ";
  out += detail::format_compact(info.hz);
  out += "  duration: ";
  out += detail::format_fixed(info.duration_s, 3);
  out += " s\n# samples: ";
  out += std::to_string(total);
  out += "  dropped: ";
  out += std::to_string(info.dropped);
  out += "  truncated: ";
  out += std::to_string(info.truncated);
  out += '\n';
  if (!info.view.empty()) {
    out += "# view: ";
    out += info.view;
    out += '\n';
  }
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
    const auto modules = detail::top_rows(p, module_total, true);
    out += "\n";
    detail::append_top_table(out, modules, module_total, "module", opts.limit);
  }
  return out;
}

}  // namespace selfprof
