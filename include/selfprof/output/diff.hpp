// Differential profiles: difffolded's `stack c1 c2` text and the red/blue differential flame graph SVG.
// Context: any thread (pure functions; run on the dump path or by the CLI).
#pragma once

#include <algorithm>
#include <cctype>
#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "selfprof/output/flame_tree.hpp"
#include "selfprof/output/svg.hpp"
#include "selfprof/profile.hpp"

namespace selfprof {

// Which count sets a frame's width in the differential SVG.
enum class diff_width : std::uint8_t {
  larger,  // max(before, after) per stack (default): stacks that vanished stay visible
  after,   // the new profile, as flamegraph.pl draws difffolded output
  before,  // the baseline
};

struct diff_options {
  bool normalize = false;  // difffolded -n: scale "before" counts by total_after/total_before (truncated)
  bool strip_hex = false;  // difffolded -s: every 0x[0-9a-fA-F]+ becomes 0x... before matching stacks
  bool negate = false;     // flamegraph.pl --negate: swap the hues and the sign shown
  bool inclusive = false;  // colour by each frame's inclusive change instead of its self change
  diff_width widths = diff_width::larger;
};

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

// Adds each stack of `p` as a folded key into `counts` (channel 0: before, 1: after); returns the total.
inline std::uint64_t fold_into(std::map<std::string, std::pair<std::uint64_t, std::uint64_t>>& counts,
                               const profile& p, int channel, bool strip_hex) {
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
    auto& c = counts[key];
    (channel == 0 ? c.first : c.second) += s.count;
    total += s.count;
  }
  return total;
}

struct diff_table {
  std::map<std::string, std::pair<std::uint64_t, std::uint64_t>> counts;  // stack -> (before, after), sorted
  std::uint64_t total_before = 0, total_after = 0;                        // after normalisation
};

inline diff_table diff_counts(const profile& before, const profile& after, const diff_options& o) {
  diff_table t;
  std::uint64_t t1 = fold_into(t.counts, before, 0, o.strip_hex);
  std::uint64_t t2 = fold_into(t.counts, after, 1, o.strip_hex);
  t.total_after = t2;
  if (o.normalize && t1 != t2 && t1 != 0) {
    const std::uint64_t original = t1;
    t1 = 0;
    for (auto& kv : t.counts) {  // as difffolded: int(c1 * total2 / total1), in double arithmetic
      double scaled =
          static_cast<double>(kv.second.first) * static_cast<double>(t2) / static_cast<double>(original);
      kv.second.first = static_cast<std::uint64_t>(scaled);
      t1 += kv.second.first;
    }
  }
  t.total_before = t1;
  return t;
}

// difffolded output: `stack before after` for every stack of either profile, sorted by bytes.
inline std::string write_diff_folded(const profile& before, const profile& after, const diff_options& o) {
  diff_table t = diff_counts(before, after, o);
  std::string out;
  for (const auto& kv : t.counts) {
    out += kv.first;
    out += ' ';
    out += std::to_string(kv.second.first);
    out += ' ';
    out += std::to_string(kv.second.second);
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
  for (const auto& kv : t.counts) {
    const std::string& key = kv.first;
    path.clear();
    std::size_t start = 0;
    while (start <= key.size()) {
      std::size_t semi = key.find(';', start);
      if (semi == std::string::npos) semi = key.size();
      path.push_back(tree.intern(key.substr(start, semi - start)));
      start = semi + 1;
    }
    if (so.reverse) std::reverse(path.begin(), path.end());
    std::uint64_t c1 = kv.second.first, c2 = kv.second.second;
    std::uint64_t w = o.widths == diff_width::after    ? c2
                      : o.widths == diff_width::before ? c1
                                                       : std::max(c1, c2);
    tree.add(path.data(), path.size(), c1, c2, w);
  }
  tree.build(true);
  svg_options opt = so;
  if (opt.title.empty()) opt.title = "Differential Flame Graph";
  if (opt.subtitle.empty())
    opt.subtitle = std::string(o.negate ? "blue: grew, red: shrank" : "red: grew, blue: shrank") +
                   (o.inclusive ? " (inclusive change)" : " (self change)") + "; widths: " +
                   (o.widths == diff_width::after    ? "after"
                    : o.widths == diff_width::before ? "before"
                                                     : "larger of before and after");
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
