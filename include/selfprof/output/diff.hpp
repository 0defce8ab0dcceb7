// Differential profiles: difffolded's `stack c1 c2` text and the red/blue differential flame graph SVG.
// Context: any thread (pure functions; run on the dump path or by the CLI).
#pragma once

#include <algorithm>
#include <cctype>
#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "selfprof/output/diff_options.hpp"
#include "selfprof/output/flame_tree.hpp"
#include "selfprof/output/svg.hpp"
#include "selfprof/profile.hpp"

namespace selfprof {
namespace detail {

// A frame name in folded text: annotated, `;` -> `:`, CR/LF/NUL removed, never empty.
inline std::string folded_frame_text(const frame& f) {
  std::string n = annotated_frame_name(f);
  std::string out;
  out.reserve(n.size());
  for (char c : n) {
    if (c == ';')
      out += ':';
    else if (c == '\n' || c == '\r' || c == '\0')
      continue;
    else
      out += c;
  }
  return out.empty() ? std::string("[unknown]") : out;
}

inline std::string strip_hex_numbers(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (std::size_t i = 0; i < s.size();) {
    if (s[i] == '0' && i + 2 < s.size() && s[i + 1] == 'x' &&
        std::isxdigit(static_cast<unsigned char>(s[i + 2]))) {
      std::size_t j = i + 2;
      while (j < s.size() && std::isxdigit(static_cast<unsigned char>(s[j]))) ++j;
      out += "0x...";
      i = j;
    } else {
      out += s[i++];
    }
  }
  return out;
}

// One stack of either profile by its folded text, with its count in each.
struct diff_row {
  std::string stack;
  std::uint64_t before = 0, after = 0;
};

struct diff_table {
  std::vector<diff_row> rows;                       // sorted by stack bytes
  std::uint64_t total_before = 0, total_after = 0;  // after normalisation
};

// Adds each stack of `p` as a folded key to `rows` (channel 0: before, 1: after), `index` finding the
// row of a key; returns the total.
inline std::uint64_t fold_into(std::unordered_map<std::string, std::size_t>& index,
                               std::vector<diff_row>& rows, const profile& p, int channel, bool strip_hex) {
  std::vector<std::string> names(p.frames.size());
  std::vector<bool> named(p.frames.size(), false);
  std::uint64_t total = 0;
  std::string key;
  for (const stack& s : p.stacks) {
    if (s.count == 0) continue;
    key.clear();
    for (std::uint32_t fi : s.frames) {
      if (fi >= p.frames.size()) continue;
      if (!named[fi]) {
        names[fi] = folded_frame_text(p.frames[fi]);
        named[fi] = true;
      }
      if (!key.empty()) key += ';';
      key += names[fi];
    }
    if (key.empty()) key = "[unknown]";
    if (strip_hex) key = strip_hex_numbers(key);
    auto [it, fresh] = index.try_emplace(key, rows.size());
    if (fresh) rows.push_back(diff_row{key, 0, 0});
    diff_row& r = rows[it->second];
    (channel == 0 ? r.before : r.after) += s.count;
    total += s.count;
  }
  return total;
}

inline diff_table diff_counts(const profile& before, const profile& after, const diff_options& o) {
  diff_table t;
  std::vector<diff_row> rows;
  {
    std::unordered_map<std::string, std::size_t> index;
    std::uint64_t t1 = fold_into(index, rows, before, 0, o.strip_hex);
    std::uint64_t t2 = fold_into(index, rows, after, 1, o.strip_hex);
    t.total_after = t2;
    if (o.normalize && t1 != t2 && t1 != 0) {
      const std::uint64_t original = t1;
      t1 = 0;
      for (auto& r : rows) {  // as difffolded: int(c1 * total2 / total1), in double arithmetic
        double scaled =
            static_cast<double>(r.before) * static_cast<double>(t2) / static_cast<double>(original);
        r.before = static_cast<std::uint64_t>(scaled);
        t1 += r.before;
      }
    }
    t.total_before = t1;
  }
  std::vector<std::uint32_t> order = identity_order(rows.size());
  sort_indices(
      order,
      [](const void* all, std::uint32_t a, std::uint32_t b) {
        const auto& r = *static_cast<const std::vector<diff_row>*>(all);
        return r[a].stack < r[b].stack;
      },
      &rows);
  t.rows.reserve(rows.size());
  for (std::uint32_t i : order) t.rows.push_back(std::move(rows[i]));
  return t;
}

// difffolded output: `stack before after` for every stack of either profile, sorted by bytes.
inline std::string write_diff_folded(const profile& before, const profile& after, const diff_options& o) {
  diff_table t = diff_counts(before, after, o);
  std::string out;
  for (const diff_row& r : t.rows) {
    out += r.stack;
    out += ' ';
    out += std::to_string(r.before);
    out += ' ';
    out += std::to_string(r.after);
    out += '\n';
  }
  return out;
}

// The differential flame graph: red frames grew, blue ones shrank (by self change unless
// `inclusive`); tooltips carry before and after counts. `before`-only stacks stay visible unless
// widths follow `after`.
inline std::string write_diff_svg(const profile& before, const profile& after, const svg_options& so,
                                  const diff_options& o) {
  diff_table t = diff_counts(before, after, o);
  flame_tree tree;
  std::vector<std::uint32_t> path;
  for (const diff_row& r : t.rows) {
    const std::string& key = r.stack;
    path.clear();
    std::size_t start = 0;
    while (start <= key.size()) {
      std::size_t semi = key.find(';', start);
      if (semi == std::string::npos) semi = key.size();
      path.push_back(tree.intern(key.substr(start, semi - start)));
      start = semi + 1;
    }
    if (so.reverse) std::reverse(path.begin(), path.end());
    std::uint64_t c1 = r.before, c2 = r.after;
    std::uint64_t w = o.widths == diff_width::after    ? c2
                      : o.widths == diff_width::before ? c1
                                                       : std::max(c1, c2);
    tree.add(path.data(), path.size(), c1, c2, w);
  }
  tree.build(true);
  svg_options opt = so;
  if (opt.title.empty()) opt.title = "Differential Flame Graph";
  if (opt.subtitle.empty()) {
    opt.subtitle = o.negate ? "blue: grew, red: shrank" : "red: grew, blue: shrank";
    opt.subtitle += o.inclusive ? " (inclusive change)" : " (self change)";
    opt.subtitle += "; widths: ";
    opt.subtitle += o.widths == diff_width::after    ? "after"
                    : o.widths == diff_width::before ? "before"
                                                     : "larger of before and after";
  }
  if (tree.total_width() == 0) return render_error_svg(opt, "ERROR: No stack counts found");
  svg_input in;
  in.tree = &tree;
  in.total = std::max<std::uint64_t>(tree.total_width(), so.total);
  in.value_total = t.total_after;
  in.before_total = t.total_before;
  in.diff = true;
  in.negate = o.negate;
  in.inclusive_delta = o.inclusive;
  in.info = &after.info;
  in.frames = tree.layout(min_width_samples(opt, in.total));
  in.frames[0].width = in.total;
  std::int64_t max_delta = 1;
  for (const auto& n : tree.nodes()) {
    std::int64_t d = o.inclusive
                         ? static_cast<std::int64_t>(n.after) - static_cast<std::int64_t>(n.before)
                         : static_cast<std::int64_t>(n.self_after) - static_cast<std::int64_t>(n.self_before);
    if (d < 0) d = -d;
    if (d > max_delta) max_delta = d;
  }
  in.max_delta = max_delta;
  return render_svg(in, opt);
}

}  // namespace detail
}  // namespace selfprof
