// The folded ("collapsed") stack writer: `root;...;leaf COUNT` lines that flamegraph.pl, inferno,
// speedscope and Pyroscope read, keeping the rules each of them imposes on a line (listed below).
// Context: any thread except the signal handler (a pure function of the profile).
//
// What it promises:
//  - One line per distinct stack *by name*: stacks that differ only in addresses, modules or source
//    lines are merged (their counts added, saturating at 2^64-1). Lines are sorted bytewise, counts
//    are decimal integers, zero counts are omitted, LF line endings. Same profile in, same bytes out.
//  - Counts are whatever `profile_info::unit` says (samples for cpu/wall profiles); never periods.
//  - Frame names are made safe (`folded_frame_name`): `;` becomes `:`, CR/LF/NUL are removed, other
//    control characters become spaces, invalid UTF-8 bytes become U+FFFD, trailing spaces are cut, an
//    ending "<space><digits>" gets `_` instead of the space (so no reader mistakes it for a count
//    column), an empty name becomes `[unknown]`. Kinds get the flamegraph.pl annotations: kernel
//    `_[k]`, jit `_[j]`, inlined `_[i]`; markers and native frames get none.
//  - `folded_options::thread_roots` adds a root frame per thread in async-profiler's `-t` convention,
//    `[name tid=N]` (or `[tid=N]` when the thread has no name). We chose it over stackcollapse-perf's
//    `comm-PID/TID` because the profile is of one process (the PID adds nothing), because the
//    brackets mark the frame as synthetic, and because it cannot be confused with a function name.
//    Stacks with tid 0 (merged/unknown) get no thread root.
//  - A stack with `truncated` set gets a `[truncated]` marker right after its thread root (at the
//    root side, where frames are missing). A stack whose frames already start with such markers
//    (e.g. one read back by parse_folded) does not get them twice, so write→parse→write is stable.
//  - Every line, LF included, is at most `max_line_bytes` (default 65535, under Pyroscope's 64 KiB
//    scanner limit). A longer line loses frames at the root side (the thread root is kept) and gets
//    the `[truncated]` marker instead; a single frame longer than the limit is cut at a UTF-8 boundary.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "selfprof/output/text.hpp"
#include "selfprof/profile.hpp"

namespace selfprof {

struct folded_options {
  bool thread_roots = false;           // prefix `[name tid=N]` (see above)
  bool annotate = true;                // `_[k]` `_[j]` `_[i]` suffixes
  std::size_t max_line_bytes = 65535;  // per line including LF; 0 = no limit
};

namespace detail {

inline constexpr std::string_view truncated_marker = "[truncated]";
inline constexpr std::string_view unknown_frame = "[unknown]";

// Appends `name` made safe for a folded line (the rules in the header comment, without annotation).
inline void append_folded_name(std::string& out, std::string_view name) {
  const std::size_t start = out.size();
  for (std::size_t i = 0; i < name.size();) {
    const char c = name[i];
    const auto u = static_cast<unsigned char>(c);
    if (u >= 0x80) {
      const std::size_t len = utf8_sequence_length(name, i);
      if (len == 0) {
        out += "\xEF\xBF\xBD";
        ++i;
      } else {
        out.append(name.data() + i, len);
        i += len;
      }
      continue;
    }
    if (c == '\r' || c == '\n' || c == '\0') {
    } else if (c == ';') {
      out += ':';
    } else if (u < 0x20 || u == 0x7F) {
      out += ' ';
    } else {
      out += c;
    }
    ++i;
  }
  while (out.size() > start && out.back() == ' ') out.pop_back();
  // "<space><digits>[.<digits>]" at the end would read as a count column: replace that space.
  std::size_t j = out.size();
  while (j > start && out[j - 1] >= '0' && out[j - 1] <= '9') --j;
  if (j < out.size() && j > start && out[j - 1] == '.') {
    std::size_t k = j - 1;
    while (k > start && out[k - 1] >= '0' && out[k - 1] <= '9') --k;
    if (k < j - 1) j = k;
  }
  if (j < out.size() && j > start && out[j - 1] == ' ') out[j - 1] = '_';
  if (out.size() == start) out += unknown_frame;
}

inline std::string_view kind_annotation(frame_kind kind) {
  switch (kind) {
    case frame_kind::kernel:
      return "_[k]";
    case frame_kind::jit:
      return "_[j]";
    case frame_kind::inlined:
      return "_[i]";
    default:
      return {};
  }
}

// The folded text of one frame: the safe name plus its annotation.
inline std::string folded_frame_name(const frame& f, bool annotate = true) {
  std::string out;
  append_folded_name(out, f.name);
  if (annotate) out += kind_annotation(f.kind);
  return out;
}

// `[name tid=N]` or `[tid=N]`; the name is made safe like a frame name.
inline std::string thread_root_name(std::uint32_t tid, const std::string& name) {
  std::string out = "[";
  if (!name.empty()) {
    std::string safe;
    append_folded_name(safe, name);
    if (safe != unknown_frame) {
      out += safe;
      out += ' ';
    }
  }
  out += "tid=";
  out += std::to_string(tid);
  out += ']';
  return out;
}

inline bool is_thread_root_name(std::string_view name) {
  if (name.size() < 7 || name.front() != '[' || name.back() != ']') return false;
  const auto pos = name.rfind("tid=");
  if (pos == std::string_view::npos || (pos != 1 && name[pos - 1] != ' ')) return false;
  const std::size_t digits_begin = pos + 4, digits_end = name.size() - 1;
  if (digits_begin == digits_end) return false;
  for (std::size_t i = digits_begin; i < digits_end; ++i)
    if (name[i] < '0' || name[i] > '9') return false;
  return true;
}

inline const frame* frame_at(const profile& p, std::uint32_t index) {
  return index < p.frames.size() ? &p.frames[index] : nullptr;
}

inline bool is_marker(const profile& p, std::uint32_t index, bool (*pred)(std::string_view)) {
  const frame* f = frame_at(p, index);
  return f && f->kind == frame_kind::marker && pred(f->name);
}

inline bool is_truncated_name(std::string_view name) { return name == truncated_marker; }

// Does stack `s` carry its [truncated] marker already: at frames[first], or right below a root there (a
// recording's process root keeps its stacks, cut ones too, in one tower; read back from folded text,
// that root is an ordinary frame)?
inline bool has_truncated_marker(const profile& p, const stack& s, std::size_t first) {
  const auto at = [&](std::size_t i) {
    return i < s.frames.size() && is_marker(p, s.frames[i], is_truncated_name);
  };
  return at(first) || at(first + 1);
}

// Cuts `s` to at most `n` bytes without splitting a UTF-8 sequence.
inline void cut_utf8(std::string& s, std::size_t n) {
  if (s.size() <= n) return;
  while (n > 0 && (static_cast<unsigned char>(s[n]) & 0xC0u) == 0x80u) --n;
  s.resize(n);
}

// The folded stack text (without count) of one stack; `names` caches folded_frame_name per frame;
// `thread_root` is the root frame to add (empty: none); `budget` is the most bytes the text may take
// (0 = no limit).
inline std::string folded_stack_text(const profile& p, const stack& s, const std::string& thread_root,
                                     const std::vector<std::string>& names, std::size_t budget) {
  std::vector<std::string_view> parts;
  parts.reserve(s.frames.size() + 2);
  std::size_t first = 0;  // index in s.frames of the first frame after existing root markers
  const bool has_root = !s.frames.empty() && is_marker(p, s.frames[0], is_thread_root_name);
  if (has_root) {
    parts.push_back(names[s.frames[0]]);
    first = 1;
  } else if (!thread_root.empty()) {
    parts.push_back(thread_root);
  }
  const std::size_t root_parts = parts.size();
  if (s.truncated && !has_truncated_marker(p, s, first)) parts.push_back(truncated_marker);
  static const std::string bad = std::string(unknown_frame);
  for (std::size_t i = first; i < s.frames.size(); ++i)
    parts.push_back(s.frames[i] < names.size() ? std::string_view(names[s.frames[i]])
                                               : std::string_view(bad));
  if (parts.empty()) parts.push_back(unknown_frame);

  std::size_t total = 0;
  for (auto part : parts) total += part.size() + 1;
  total -= 1;
  if (budget == 0 || total <= budget) {
    std::string out;
    out.reserve(total);
    for (std::size_t i = 0; i < parts.size(); ++i) {
      if (i) out += ';';
      out.append(parts[i].data(), parts[i].size());
    }
    return out;
  }
  // Too long: keep the thread root and a [truncated] marker, then as many leaf-side frames as fit.
  std::string head;
  for (std::size_t i = 0; i < root_parts; ++i) head.append(parts[i].data(), parts[i].size()) += ';';
  head += truncated_marker;
  std::size_t first_data = root_parts;
  if (first_data < parts.size() && parts[first_data] == truncated_marker) ++first_data;
  if (head.size() > budget) {  // even the head does not fit: drop the thread root
    head = std::string(truncated_marker);
  }
  std::size_t used = head.size();
  std::size_t keep_from = parts.size();
  while (keep_from > first_data && used + 1 + parts[keep_from - 1].size() <= budget) {
    used += 1 + parts[keep_from - 1].size();
    --keep_from;
  }
  std::string out = head;
  if (keep_from == parts.size() && first_data < parts.size()) {
    // Not even the leaf fits next to the marker: cut the leaf itself.
    std::string leaf(parts.back());
    cut_utf8(leaf, budget > head.size() + 1 ? budget - head.size() - 1 : 0);
    while (!leaf.empty() && leaf.back() == ' ') leaf.pop_back();
    if (leaf.empty()) return out;
    out += ';';
    out += leaf;
    return out;
  }
  for (std::size_t i = keep_from; i < parts.size(); ++i)
    (out += ';').append(parts[i].data(), parts[i].size());
  return out;
}

// Stack texts merged by name, with their counts; `order` lists them sorted bytewise.
struct folded_table {
  std::vector<std::string> texts;
  std::vector<std::uint64_t> counts;
  std::vector<std::uint32_t> order;
};

inline folded_table folded_lines(const profile& p, const folded_options& opts = {}) {
  std::vector<std::string> names;
  names.reserve(p.frames.size());
  for (const auto& f : p.frames) names.push_back(folded_frame_name(f, opts.annotate));
  // Budget for the stack text: the line minus " COUNT\n" (space, up to 20 digits, LF).
  std::size_t budget = 0;
  if (opts.max_line_bytes) {
    const std::size_t tail = 2 + 20;
    budget = opts.max_line_bytes > tail + 16 ? opts.max_line_bytes - tail : 16;
  }
  std::unordered_map<std::uint32_t, std::string> roots;  // tid → `[name tid=N]`
  static const std::string no_root;
  folded_table t;
  std::unordered_map<std::string, std::size_t> index;  // text -> its place in t.texts
  index.reserve(p.stacks.size());
  for (const auto& s : p.stacks) {
    if (s.count == 0) continue;
    const std::string* root = &no_root;
    if (opts.thread_roots && s.tid != 0) {
      std::string& text = roots[s.tid];  // never empty once made
      if (text.empty()) text = thread_root_name(s.tid, p.thread_name(s.tid));
      root = &text;
    }
    std::string text = folded_stack_text(p, s, *root, names, budget);
    auto [it, fresh] = index.try_emplace(text, t.texts.size());
    if (fresh) {
      t.texts.push_back(std::move(text));
      t.counts.push_back(0);
    }
    add_saturating(t.counts[it->second], s.count);
  }
  t.order = identity_order(t.texts.size());
  sort_indices(
      t.order,
      [](const void* texts, std::uint32_t a, std::uint32_t b) {
        const auto& x = *static_cast<const std::vector<std::string>*>(texts);
        return x[a] < x[b];
      },
      &t.texts);
  return t;
}

}  // namespace detail

// The folded text of a profile (see the promises at the top of this file).
inline std::string write_folded(const profile& p, const folded_options& opts = {}) {
  const detail::folded_table lines = detail::folded_lines(p, opts);
  std::size_t size = 0;
  for (const auto& text : lines.texts) size += text.size() + 22;
  std::string out;
  out.reserve(size);
  for (const std::uint32_t i : lines.order) {
    out += lines.texts[i];
    out += ' ';
    out += std::to_string(lines.counts[i]);
    out += '\n';
  }
  return out;
}

}  // namespace selfprof
