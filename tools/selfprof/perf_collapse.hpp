// The perf-script collapser: `perf script` text in, folded stacks out, byte for byte what
// stackcollapse-perf.pl prints for the same input and options (its golden files are in tests/cli/).
// Context: any thread except the signal handler (the CLI, tests and fuzzers; one collapser per thread).
//
// Streaming: feed it one line at a time (without the LF); memory grows with the number of distinct
// stacks, never with the number of samples. Counts follow Perl's numbers: integer sums while they fit
// in 64 bits, then a double printed like Perl's "%.15g". Lines the Perl script would warn about
// ("Unrecognized line") are counted and the first few kept with their line numbers. Not supported:
// --inline/--context (they run addr2line per frame) and --srcline.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "perf_script_line.hpp"

namespace selfprof_cli {

struct perf_collapse_options {
  bool pid = false;          // --pid: root frame "comm-PID"
  bool tid = false;          // --tid: root frame "comm-PID/TID"
  bool kernel = false;       // --kernel: `_[k]` on kernel frames
  bool jit = false;          // --jit: `_[j]` on frames of /tmp/perf-N.map
  bool addrs = false;        // --addrs: "[module <pc>]" for unknown symbols
  std::string event_filter;  // --event-filter: keep only this event (default: the first one seen)
};

struct perf_collapse_issue {
  std::size_t line = 0;  // 1-based
  std::string text;      // the line, cut to 200 bytes
};

// A Perl scalar holding a sum of sample periods: UV while exact, NV (double) after an overflow.
struct perl_count {
  std::uint64_t uv = 0;
  double nv = 0;
  bool is_nv = false;

  void add(std::uint64_t v, bool v_is_nv, double v_nv) {
    if (!is_nv && !v_is_nv && uv <= UINT64_MAX - v) {
      uv += v;
      return;
    }
    const double a = is_nv ? nv : static_cast<double>(uv);
    const double b = v_is_nv ? v_nv : static_cast<double>(v);
    nv = a + b;
    is_nv = true;
  }

  void append_to(std::string& out) const {
    if (!is_nv) {
      char buf[24];
      int n = std::snprintf(buf, sizeof buf, "%llu", static_cast<unsigned long long>(uv));
      out.append(buf, static_cast<std::size_t>(n));
      return;
    }
    char buf[40];
    int n = std::snprintf(buf, sizeof buf, "%.15g", nv);
    out.append(buf, static_cast<std::size_t>(n));
  }
};

class perf_collapser {
 public:
  explicit perf_collapser(perf_collapse_options o = {}) : opts_(std::move(o)) { event_ = opts_.event_filter; }

  // One input line, without its LF.
  void feed_line(std::string_view line) {
    ++lines_;
    if (!line.empty() && line[0] == '#') return;
    if (line.empty()) return end_of_event();
    perf_event_match ev;
    if (match_perf_event_line(line, ev)) return event_line(line, ev);
    perf_stack_match st;
    if (match_perf_stack_line(line, st)) return stack_line(st);
    ++unrecognized_;
    if (issues_.size() < max_issues) issues_.push_back({lines_, std::string(line.substr(0, 200))});
  }

  // Feeds a whole buffer; a last line without LF is fed too (as Perl's `<>` would give it).
  void feed_text(std::string_view text) {
    std::size_t pos = 0;
    while (pos < text.size()) {
      std::size_t nl = text.find('\n', pos);
      if (nl == std::string_view::npos) nl = text.size();
      feed_line(text.substr(pos, nl - pos));
      pos = nl + 1;
    }
  }

  // The folded text: "stack count\n" per distinct stack, sorted bytewise.
  std::string result() const {
    std::vector<const std::pair<const std::string, perl_count>*> rows;
    rows.reserve(stacks_.size());
    std::size_t bytes = 0;
    for (const auto& kv : stacks_) {
      rows.push_back(&kv);
      bytes += kv.first.size() + 24;
    }
    std::sort(rows.begin(), rows.end(), [](const auto* a, const auto* b) { return a->first < b->first; });
    std::string out;
    out.reserve(bytes);
    for (const auto* r : rows) {
      out += r->first;
      out += ' ';
      r->second.append_to(out);
      out += '\n';
    }
    return out;
  }

  std::size_t lines() const { return lines_; }
  std::size_t samples() const { return samples_; }  // events whose stack was kept
  std::size_t distinct_stacks() const { return stacks_.size(); }
  std::size_t unrecognized_lines() const { return unrecognized_; }
  const std::vector<perf_collapse_issue>& unrecognized() const { return issues_; }
  // The first event type dropped by first-event filtering ("Filtering for events of type: X"), or "".
  const std::string& filtered_event() const { return filtered_event_; }
  const std::string& kept_event() const { return event_; }

  static constexpr std::size_t max_issues = 20;

 private:
  void end_of_event() {
    if (!have_pname_) return;
    key_.assign(pname_);
    for (std::size_t i = frame_ends_.size(); i-- > 0;) {
      const std::size_t b = i == 0 ? 0 : frame_ends_[i - 1];
      key_ += ';';
      key_.append(frames_, b, frame_ends_[i] - b);
    }
    auto it = stacks_.find(key_);
    if (it == stacks_.end()) it = stacks_.emplace(key_, perl_count{}).first;
    it->second.add(period_uv_, period_is_nv_, period_nv_);
    ++samples_;
    frames_.clear();
    frame_ends_.clear();
    have_pname_ = false;
  }

  void event_line(std::string_view line, const perf_event_match& ev) {
    std::string_view pid = ev.pid, tid = ev.tid;
    if (tid.empty() || tid == "0") {  // Perl: `if (not $tid)`; "0" is false too
      tid = pid;
      pid = "?";
    }
    std::string_view period;
    perf_period_match pm;
    if (match_perf_period(line, pm)) {
      period = pm.period;
      if (event_.empty()) {
        event_.assign(pm.event);  // by default only the first event type seen is kept
      } else if (pm.event != std::string_view(event_)) {
        if (opts_.event_filter.empty() && filtered_event_.empty()) filtered_event_.assign(pm.event);
        return;  // filtered: the stack state is left as it was, as Perl's `next` does
      }
    }
    set_period(period);
    pname_.assign(ev.comm);
    if (opts_.tid) {
      pname_ += '-';
      pname_.append(pid);
      pname_ += '/';
      pname_.append(tid);
    } else if (opts_.pid) {
      pname_ += '-';
      pname_.append(pid);
    }
    std::replace(pname_.begin(), pname_.end(), ' ', '_');
    have_pname_ = true;
    java_ = pname_.compare(0, 4, "java") == 0;
  }

  // Perl: `$period = 1 if not $period`, then `+=` on the string as a number.
  void set_period(std::string_view p) {
    period_is_nv_ = false;
    period_nv_ = 0;
    if (p.empty() || p == "0") {
      period_uv_ = 1;
      return;
    }
    std::uint64_t v = 0;
    for (char c : p) {
      const std::uint64_t d = static_cast<std::uint64_t>(c - '0');
      if (v > (UINT64_MAX - d) / 10) {
        period_is_nv_ = true;
        period_nv_ = std::strtod(std::string(p).c_str(), nullptr);
        period_uv_ = 0;
        return;
      }
      v = v * 10 + d;
    }
    period_uv_ = v;
  }

  void stack_line(const perf_stack_match& st) {
    if (!have_pname_) return;
    std::string_view raw = strip_symbol_offset(st.rawfunc);
    if (!raw.empty() && raw[0] == '(') return;
    // split /->/ (trailing empty fields dropped), parts pushed in reverse so that the final reversal
    // of the whole stack puts them back in order after their caller.
    parts_.clear();
    std::size_t pos = 0;
    while (true) {
      std::size_t arrow = raw.find("->", pos);
      if (arrow == std::string_view::npos) {
        parts_.push_back(raw.substr(pos));
        break;
      }
      parts_.push_back(raw.substr(pos, arrow - pos));
      pos = arrow + 2;
    }
    while (!parts_.empty() && parts_.back().empty()) parts_.pop_back();
    const bool kernel_mod = opts_.kernel && !st.module.empty() &&
                            (st.module[0] == '[' || ends_with(st.module, "vmlinux")) &&
                            st.module.find("unknown") == std::string_view::npos;
    const bool jit_mod = opts_.jit && is_perf_map(st.module);
    for (std::size_t i = parts_.size(); i-- > 0;) {
      tidy(parts_[i], st, i > 0, kernel_mod, jit_mod);
      frames_ += func_;
      frame_ends_.push_back(frames_.size());
    }
  }

  void tidy(std::string_view part, const perf_stack_match& st, bool inlined, bool kernel_mod, bool jit_mod) {
    func_.clear();
    if (part == "[unknown]") {
      func_ += '[';
      if (st.module != "[unknown]") {
        std::size_t slash = st.module.rfind('/');
        func_.append(slash == std::string_view::npos ? st.module : st.module.substr(slash + 1));
      } else {
        func_ += "unknown";
      }
      if (opts_.addrs) {
        func_ += " <";
        func_.append(st.pc);
        func_ += '>';
      }
      func_ += ']';
    } else {
      func_.assign(part);
    }
    std::replace(func_.begin(), func_.end(), ';', ':');
    if (!looks_like_go_method(func_)) cut_at_parenthesis(func_);
    func_.erase(std::remove_if(func_.begin(), func_.end(), [](char c) { return c == '"' || c == '\''; }),
                func_.end());
    if (java_ && !func_.empty() && func_[0] == 'L' && func_.find('/') != std::string::npos) func_.erase(0, 1);
    if (inlined) {
      if (func_.find("_[i]") == std::string::npos) func_ += "_[i]";
    } else if (kernel_mod) {
      func_ += "_[k]";
    } else if (jit_mod) {
      if (func_.find("_[j]") == std::string::npos) func_ += "_[j]";
    }
  }

  static bool ends_with(std::string_view s, std::string_view suf) {
    return s.size() >= suf.size() && s.substr(s.size() - suf.size()) == suf;
  }

  // m:/tmp/perf-\d+\.map: anywhere in the module. `\.` is a literal dot, so \d+ cannot give digits
  // back: the maximal digit run must be followed by ".map".
  static bool is_perf_map(std::string_view m) {
    static constexpr std::string_view pre = "/tmp/perf-";
    for (std::size_t p = m.find(pre); p != std::string_view::npos; p = m.find(pre, p + 1)) {
      std::size_t i = p + pre.size(), d = i;
      while (d < m.size() && perl_digit(m[d])) ++d;
      if (d > i && m.substr(d, 4) == ".map") return true;
    }
    return false;
  }

  perf_collapse_options opts_;
  std::unordered_map<std::string, perl_count> stacks_;
  std::string pname_, key_, frames_, func_, event_, filtered_event_;
  std::vector<std::size_t> frame_ends_;
  std::vector<std::string_view> parts_;
  std::vector<perf_collapse_issue> issues_;
  std::uint64_t period_uv_ = 1;
  double period_nv_ = 0;
  bool period_is_nv_ = false;
  bool have_pname_ = false, java_ = false;
  std::size_t lines_ = 0, samples_ = 0, unrecognized_ = 0;
};

}  // namespace selfprof_cli
