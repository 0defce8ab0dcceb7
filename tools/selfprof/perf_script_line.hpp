// Line matchers for `perf script` text: the event line, the stack line and the frame-name tidying of
// stackcollapse-perf.pl, as closed-form scans that give exactly the captures its regexes would.
// Context: any thread except the signal handler (used by the CLI collapser, tests and fuzzers).
//
// Perl reads the input as bytes, so its classes are ASCII: \s = [ \t\n\v\f\r], \d = [0-9],
// \w = [A-Za-z0-9_], `.` = any byte but LF (no line here holds one). Each matcher below states the
// pattern it stands for and why its scan picks the same captures as Perl's backtracking would.
#pragma once

#include <string.h>

#include <cstddef>
#include <string>
#include <string_view>

namespace selfprof_cli {

inline bool perl_space(char c) {
  return c == ' ' || c == '\t' || c == '\n' || c == '\v' || c == '\f' || c == '\r';
}
inline bool perl_digit(char c) { return c >= '0' && c <= '9'; }
inline bool perl_word(char c) {
  return perl_digit(c) || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_';
}

// `^(\S.+?)\s+(\d+)\/*(\d+)*\s+` (the event line). The lazy comm is the shortest prefix of at least
// two bytes followed by: a whitespace run, a digit run (pid), slashes, an optional digit run (tid) and
// one more whitespace byte. Backtracking inside the tail cannot help: every shorter split of the
// digits needs whitespace where a digit or slash already failed.
struct perf_event_match {
  std::string_view comm, pid, tid;  // tid empty when the `(\d+)*` group did not take part
};

inline bool match_perf_event_line(std::string_view s, perf_event_match& m) {
  const std::size_t n = s.size();
  if (n < 2 || perl_space(s[0])) return false;
  for (std::size_t c = 2; c < n; ++c) {
    if (!perl_space(s[c])) continue;
    if (perl_space(s[c - 1]) && c > 2) continue;  // inside a whitespace run: same tail as its start
    std::size_t e = c;
    while (e < n && perl_space(s[e])) ++e;
    std::size_t d = e;
    while (d < n && perl_digit(s[d])) ++d;
    if (d == e) continue;
    std::size_t sl = d;
    while (sl < n && s[sl] == '/') ++sl;
    std::size_t d2 = sl;
    while (d2 < n && perl_digit(s[d2])) ++d2;
    if (d2 >= n || !perl_space(s[d2])) continue;
    m.comm = s.substr(0, c);
    m.pid = s.substr(e, d - e);
    m.tid = s.substr(sl, d2 - sl);
    return true;
  }
  return false;
}

// `:\s*(\d+)*\s+(\S+):\s*$` (period and event name, anywhere in the line). The event is the last
// whitespace-delimited token of the line without its final ':' (the ':' must be the last non-space
// byte and the token must hold something before it); the match starts at the leftmost ':' from which
// only whitespace, an optional digit run (the period) and whitespace lead up to that token.
struct perf_period_match {
  std::string_view period;  // empty when no digits were printed
  std::string_view event;
};

inline bool match_perf_period(std::string_view s, perf_period_match& m) {
  std::size_t end = s.size();
  while (end > 0 && perl_space(s[end - 1])) --end;
  if (end < 2 || s[end - 1] != ':') return false;
  const std::size_t colon = end - 1;
  std::size_t tok = colon;
  while (tok > 0 && !perl_space(s[tok - 1])) --tok;
  if (tok == colon || tok == 0) return false;  // empty event, or no whitespace before it
  // s[tok-1] is whitespace. Walk back over: whitespace+ , digits* , whitespace* , then a ':'.
  std::size_t i = tok;
  while (i > 0 && perl_space(s[i - 1])) --i;
  const std::size_t ws1 = i;  // start of the whitespace before the token
  std::size_t dstart = i;
  while (dstart > 0 && perl_digit(s[dstart - 1])) --dstart;
  // Candidates for the ':' are: just before the digits' leading whitespace (with digits), or, without
  // digits, anywhere inside/before the whitespace run. Perl takes the leftmost start, so prefer the
  // one furthest left that works.
  std::size_t k = dstart;
  while (k > 0 && perl_space(s[k - 1])) --k;
  if (dstart < ws1 && k > 0 && s[k - 1] == ':') {
    // `:` ws* digits ws+ token
    m.period = s.substr(dstart, ws1 - dstart);
    m.event = s.substr(tok, colon - tok);
    return true;
  }
  if (dstart == ws1) {
    // No digits: `:` then at least one whitespace byte before the token. The leftmost ':' that is
    // followed only by whitespace up to the token is the one just before the run.
    if (ws1 > 0 && s[ws1 - 1] == ':') {
      m.period = std::string_view();
      m.event = s.substr(tok, colon - tok);
      return true;
    }
    return false;
  }
  // Digits present but not preceded by ws*':' : the group may match zero times only if the ':' sits
  // right before the whitespace run, which a digit already occupies; no match.
  return false;
}

// `^\s*(\w+)\s*(.+) \((.*)\)` (a stack line). Let L be the last ')' and R the last " (" with
// R + 2 <= L: greedy `.+` ends at R and greedy `(.*)` at L. The word (pc) is the maximal \w run after
// the leading whitespace; `.+` needs one byte, so when R falls right after the word the word gives up
// its last byte (Perl backtracks \w+), and when R falls inside the whitespace after the word the
// optional \s* gives up bytes instead.
struct perf_stack_match {
  std::string_view pc, rawfunc, module;
};

inline bool match_perf_stack_line(std::string_view s, perf_stack_match& m) {
  const std::size_t n = s.size();
  const std::size_t close = s.rfind(')');
  if (close == std::string_view::npos || close < 2) return false;
  std::size_t r = std::string_view::npos;
  for (std::size_t limit = close; limit > 1;) {  // the last '(' before the ')' that follows a space
    const void* hit = ::memrchr(s.data() + 1, '(', limit - 1);
    if (!hit) break;
    const std::size_t open = static_cast<std::size_t>(static_cast<const char*>(hit) - s.data());
    if (s[open - 1] == ' ') {
      r = open - 1;
      break;
    }
    limit = open;
  }
  if (r == std::string_view::npos) return false;
  std::size_t i0 = 0;
  while (i0 < n && perl_space(s[i0])) ++i0;
  std::size_t w_end = i0;
  while (w_end < n && perl_word(s[w_end])) ++w_end;
  if (w_end == i0) return false;
  std::size_t q_max = w_end;
  while (q_max < n && perl_space(s[q_max])) ++q_max;
  if (r >= w_end + 1) {
    const std::size_t q = q_max < r - 1 ? q_max : r - 1;
    m.pc = s.substr(i0, w_end - i0);
    m.rawfunc = s.substr(q, r - q);
  } else if (r == w_end && w_end - i0 >= 2) {
    m.pc = s.substr(i0, w_end - 1 - i0);
    m.rawfunc = s.substr(w_end - 1, 1);
  } else {
    return false;
  }
  m.module = s.substr(r + 2, close - (r + 2));
  return true;
}

// `s/\+0x[\da-f]+$//`: strips one trailing "+0x<lowercase hex>".
inline std::string_view strip_symbol_offset(std::string_view f) {
  std::size_t i = f.size();
  while (i > 0 && (perl_digit(f[i - 1]) || (f[i - 1] >= 'a' && f[i - 1] <= 'f'))) --i;
  if (i == f.size() || i < 3) return f;
  if (f[i - 1] == 'x' && f[i - 2] == '0' && f[i - 3] == '+') return f.substr(0, i - 3);
  return f;
}

// `m/\.\(.*\)\./`: a Go method such as "net/http.(*Client).Do".
inline bool looks_like_go_method(std::string_view f) {
  const std::size_t open = f.find(".(");
  if (open == std::string_view::npos) return false;
  const std::size_t close = f.rfind(").");
  return close != std::string_view::npos && close >= open + 2;
}

// `s/\((?!anonymous namespace\)).*//`: cuts from the first '(' that does not open
// "(anonymous namespace)".
inline void cut_at_parenthesis(std::string& f) {
  static constexpr std::string_view anon = "anonymous namespace)";
  for (std::size_t p = f.find('('); p != std::string::npos; p = f.find('(', p + 1)) {
    if (std::string_view(f).substr(p + 1, anon.size()) != anon) {
      f.resize(p);
      return;
    }
  }
}

}  // namespace selfprof_cli
