// The folded ("collapsed") stack reader: turns the folded dialects (flamegraph.pl's, inferno's,
// difffolded's two-count lines; see below) back into a profile, with the reasons for every line it could
// not use.
// Context: any thread except the signal handler (used by the CLI, the diff and SVG writers, tests).
//
// Accepted: `FRAME(;FRAME)* COUNT` with one or more spaces or tabs before the count; CRLF line ends;
// blank lines and `# ` comment lines (skipped); surrounding whitespace; fractional counts like
// flamegraph.pl's `12.5` (truncated to integers as inferno does, with a warning); differential lines
// `STACK COUNT1 COUNT2` (the profile takes COUNT2, the "after" column; COUNT1 goes to before_counts).
// Frames are interned by name: a trailing `_[k]`/`_[j]`/`_[i]` sets frame_kind and is stripped from
// the name; `[name tid=N]` as first frame and `[truncated]` at the root side become marker frames (kept
// in the stack, so writing the profile again gives the same bytes) and set stack::tid / a thread name
// and stack::truncated. Identical lines are merged. Malformed lines are skipped and reported with
// source name and 1-based line number; nothing here throws or crashes on bad input.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "selfprof/output/folded.hpp"
#include "selfprof/profile.hpp"

namespace selfprof {

struct folded_parse_error {
  std::string source;    // the source_name given to parse_folded (a path, "<stdin>", ...)
  std::size_t line = 0;  // 1-based
  std::string message;
  // "source:line: message"
  std::string to_string() const { return source + ":" + std::to_string(line) + ": " + message; }
};

struct folded_parse_result {
  selfprof::profile prof;                    // frames by name, one stack per distinct line
  std::vector<folded_parse_error> errors;    // lines skipped, first `max_reported` of them
  std::vector<folded_parse_error> warnings;  // lines used but changed (the first fractional count)
  std::size_t lines = 0;                     // lines read (the last one may lack its LF)
  std::size_t ignored_lines = 0;             // malformed lines skipped (all of them, reported or not)
  std::size_t comment_lines = 0;             // blank lines and `# ` comments
  std::size_t zero_count_lines = 0;          // well-formed lines whose count is 0 (no stack made)
  std::size_t fractional_lines = 0;          // counts that had a fraction cut off
  bool differential = false;                 // some line had two counts
  std::vector<std::uint64_t> before_counts;  // per stack, COUNT1 of differential lines (else 0)

  static constexpr std::size_t max_reported = 100;
  bool ok() const { return ignored_lines == 0; }
};

namespace detail {

inline bool is_folded_space(char c) { return c == ' ' || c == '\t'; }

// Parses `\d+(\.\d*)?` into an integer (fraction cut). Returns false when the token is not a count
// or overflows; `fractional` is set when digits after the dot were non-zero.
inline bool parse_folded_count(std::string_view tok, std::uint64_t& value, bool& fractional) {
  value = 0;
  fractional = false;
  std::size_t i = 0;
  if (tok.empty() || tok[0] < '0' || tok[0] > '9') return false;
  for (; i < tok.size() && tok[i] >= '0' && tok[i] <= '9'; ++i) {
    const std::uint64_t d = static_cast<std::uint64_t>(tok[i] - '0');
    if (value > (UINT64_MAX - d) / 10) return false;
    value = value * 10 + d;
  }
  if (i == tok.size()) return true;
  if (tok[i] != '.') return false;
  for (++i; i < tok.size(); ++i) {
    if (tok[i] < '0' || tok[i] > '9') return false;
    if (tok[i] != '0') fractional = true;
  }
  return true;
}

// Splits off the last whitespace-separated token of `s` (already trimmed on the right).
inline bool split_last_token(std::string_view s, std::string_view& rest, std::string_view& tok) {
  std::size_t end = s.size();
  std::size_t b = end;
  while (b > 0 && !is_folded_space(s[b - 1])) --b;
  if (b == 0) return false;
  tok = s.substr(b, end - b);
  std::size_t r = b;
  while (r > 0 && is_folded_space(s[r - 1])) --r;
  rest = s.substr(0, r);
  return true;
}

inline frame_kind strip_folded_annotation(std::string_view& name) {
  if (name.size() >= 4 && name.substr(name.size() - 4, 2) == "_[" && name.back() == ']') {
    const char k = name[name.size() - 2];
    frame_kind kind = frame_kind::native;
    if (k == 'k')
      kind = frame_kind::kernel;
    else if (k == 'j')
      kind = frame_kind::jit;
    else if (k == 'i')
      kind = frame_kind::inlined;
    if (kind != frame_kind::native) name.remove_suffix(4);
    return kind;
  }
  return frame_kind::native;
}

class folded_parser {
 public:
  folded_parser(folded_parse_result& r, const std::string& source) : r_(r), source_(source) {}

  void line(std::size_t number, std::string_view text) {
    if (!text.empty() && text.back() == '\r') text.remove_suffix(1);
    while (!text.empty() && is_folded_space(text.front())) text.remove_prefix(1);
    while (!text.empty() && is_folded_space(text.back())) text.remove_suffix(1);
    if (text.empty() || text == "#" || text.substr(0, 2) == "# ") {
      ++r_.comment_lines;
      return;
    }
    std::string_view stack_text, tok;
    if (!split_last_token(text, stack_text, tok)) return error(number, "no count at the end of the line");
    std::uint64_t count = 0, before = 0;
    bool frac = false, frac_before = false, diff = false;
    if (!parse_folded_count(tok, count, frac))
      return error(number, "count '" + std::string(tok.substr(0, 40)) + "' is not a non-negative number");
    std::string_view rest2, tok2;
    if (split_last_token(stack_text, rest2, tok2) && parse_folded_count(tok2, before, frac_before)) {
      diff = true;
      stack_text = rest2;
    }
    if (stack_text.empty()) return error(number, "empty stack before the count");
    if (frac || frac_before) {
      if (r_.fractional_lines++ == 0)
        r_.warnings.push_back({source_, number,
                               "fractional count '" + std::string(tok.substr(0, 40)) +
                                   "' cut to an integer (counts are integers; scale the input first)"});
    }
    if (count == 0 && !diff) {
      ++r_.zero_count_lines;
      return;
    }
    if (count == 0 && before == 0) {
      ++r_.zero_count_lines;
      return;
    }
    if (diff) r_.differential = true;
    add_stack(stack_text, count, before);
  }

 private:
  void error(std::size_t number, std::string message) {
    ++r_.ignored_lines;
    if (r_.errors.size() < folded_parse_result::max_reported)
      r_.errors.push_back({source_, number, std::move(message)});
  }

  std::uint32_t intern(std::string_view name, frame_kind kind) {
    std::string key(1, static_cast<char>('0' + static_cast<int>(kind)));
    key.append(name.data(), name.size());
    auto [it, fresh] = frames_.try_emplace(std::move(key), std::size_t{0});
    if (fresh) {
      it->second = r_.prof.frames.size();
      frame f;
      f.name = std::string(name);
      f.kind = kind;
      r_.prof.frames.push_back(std::move(f));
    }
    return static_cast<std::uint32_t>(it->second);
  }

  void add_stack(std::string_view text, std::uint64_t count, std::uint64_t before) {
    auto found = stacks_.find(std::string(text));
    if (found != stacks_.end()) {
      auto& s = r_.prof.stacks[found->second];
      add_saturating(s.count, count);
      add_saturating(r_.before_counts[found->second], before);
      return;
    }
    stack s;
    s.count = count;
    std::size_t pos = 0, index = 0;
    while (pos <= text.size()) {
      std::size_t semi = text.find(';', pos);
      if (semi == std::string_view::npos) semi = text.size();
      std::string_view name = text.substr(pos, semi - pos);
      frame_kind kind = strip_folded_annotation(name);
      if (kind == frame_kind::native) {
        if (index == 0 && is_thread_root_name(name)) {
          kind = frame_kind::marker;
          note_thread(name, s);
        } else if (name == truncated_marker &&
                   (index == 0 || (index == 1 && (s.tid != 0 || semi < text.size())))) {
          // At the root, or right below a thread's or a recording's process root (`cc1plus;[truncated];
          // ...`) with frames after it; at the leaf (`x;[truncated]`) it is an ordinary name.
          kind = frame_kind::marker;
          s.truncated = true;
        }
      }
      s.frames.push_back(intern(name, kind));
      ++index;
      pos = semi + 1;
    }
    stacks_.try_emplace(std::string(text), r_.prof.stacks.size());
    r_.prof.stacks.push_back(std::move(s));
    r_.before_counts.push_back(before);
  }

  void note_thread(std::string_view root, stack& s) {
    const auto pos = root.rfind("tid=");
    std::uint64_t tid = 0;
    bool frac = false;
    if (!parse_folded_count(root.substr(pos + 4, root.size() - 1 - (pos + 4)), tid, frac) ||
        tid > UINT32_MAX || tid == 0)
      return;
    s.tid = static_cast<std::uint32_t>(tid);
    if (thread_index_.emplace(s.tid, r_.prof.threads.size()).second) {
      thread_info t;
      t.tid = s.tid;
      if (pos > 2) t.name = std::string(root.substr(1, pos - 2));
      r_.prof.threads.push_back(std::move(t));
    }
  }

  folded_parse_result& r_;
  const std::string& source_;
  // Map types shared with the writers and the collector: no instantiation of their own.
  std::unordered_map<std::string, std::size_t> frames_;            // kind digit + name -> frame index
  std::unordered_map<std::string, std::size_t> stacks_;            // line text -> stack index
  std::unordered_map<std::uint32_t, std::uint64_t> thread_index_;  // tid -> index in prof.threads
};

}  // namespace detail

// Reads folded text; `source_name` only labels errors. See the top of this file for the dialects.
inline folded_parse_result parse_folded(std::string_view text, const std::string& source_name) {
  folded_parse_result r;
  r.prof.info.source = "file";
  {
    detail::folded_parser parser(r, source_name);
    std::size_t pos = 0;
    while (pos < text.size()) {
      std::size_t nl = text.find('\n', pos);
      if (nl == std::string_view::npos) nl = text.size();
      parser.line(++r.lines, text.substr(pos, nl - pos));
      pos = nl + 1;
    }
  }
  for (const auto& s : r.prof.stacks) {
    detail::add_saturating(r.prof.info.samples, s.count);
    if (s.truncated) detail::add_saturating(r.prof.info.truncated, s.count);
  }
  return r;
}

namespace detail {
using selfprof::folded_parse_result;  // the brief's spelling: detail::folded_parse_result
using selfprof::parse_folded;
}  // namespace detail

}  // namespace selfprof
