// Locale-independent number formatting and UTF-8 checks for the text writers (printf's %f follows LC_NUMERIC,
// which a host program may have set to a locale with a decimal comma; our bytes must not depend on it),
// and the one index sort every writer uses.
// Context: any thread except the signal handler.
#pragma once

#include <algorithm>
#include <cstdint>
#include <limits>
#include <string>
#include <string_view>
#include <vector>

namespace selfprof {
namespace detail {

// `v` rounded to `decimals` places (0..9), with '.' as the decimal point: 2.5 → "2.500".
// NaN and infinities print as "nan", "inf", "-inf"; magnitudes past 2^63 lose precision.
inline std::string format_fixed(double v, int decimals) {
  if (v != v) return "nan";
  if (v > std::numeric_limits<double>::max() || v < -std::numeric_limits<double>::max())
    return v < 0 ? "-inf" : "inf";
  if (decimals < 0) decimals = 0;
  if (decimals > 9) decimals = 9;
  std::uint64_t scale = 1;
  for (int i = 0; i < decimals; ++i) scale *= 10;
  const bool negative = v < 0;
  const long double scaled =
      (negative ? -static_cast<long double>(v) : static_cast<long double>(v)) * scale + 0.5L;
  const std::uint64_t n = scaled >= 18446744073709551615.0L ? UINT64_MAX : static_cast<std::uint64_t>(scaled);
  std::string out = std::to_string(n / scale);
  if (decimals > 0) {
    std::string frac = std::to_string(n % scale);
    out += '.';
    out.append(static_cast<std::size_t>(decimals) - frac.size(), '0');
    out += frac;
  }
  if (negative && n != 0) out.insert(out.begin(), '-');
  return out;
}

// a += b, stopping at the largest count instead of wrapping (counts read from files can be anything).
inline void add_saturating(std::uint64_t& a, std::uint64_t b) { a = (a + b < a) ? UINT64_MAX : a + b; }

// Integral values without decimals ("99"), others with up to `decimals` places, trailing zeros cut.
inline std::string format_compact(double v, int decimals = 3) {
  std::string s = format_fixed(v, decimals);
  if (s.find('.') == std::string::npos) return s;
  while (s.back() == '0') s.pop_back();
  if (s.back() == '.') s.pop_back();
  return s;
}

// Length of the valid UTF-8 sequence starting at s[i], or 0 when it is not valid (overlong forms,
// surrogates and code points above U+10FFFF are invalid); `cp` receives the code point.
inline std::size_t utf8_decode(std::string_view s, std::size_t i, std::uint32_t& cp) {
  const auto b0 = static_cast<unsigned char>(s[i]);
  cp = b0;
  if (b0 < 0x80) return 1;
  std::size_t len;
  if (b0 >= 0xC2 && b0 <= 0xDF) {
    len = 2;
    cp = b0 & 0x1Fu;
  } else if (b0 >= 0xE0 && b0 <= 0xEF) {
    len = 3;
    cp = b0 & 0x0Fu;
  } else if (b0 >= 0xF0 && b0 <= 0xF4) {
    len = 4;
    cp = b0 & 0x07u;
  } else {
    return 0;
  }
  if (i + len > s.size()) return 0;
  for (std::size_t k = 1; k < len; ++k) {
    const auto b = static_cast<unsigned char>(s[i + k]);
    if ((b & 0xC0u) != 0x80u) return 0;
    cp = (cp << 6) | (b & 0x3Fu);
  }
  if ((len == 3 && cp < 0x800) || (len == 4 && (cp < 0x10000 || cp > 0x10FFFF))) return 0;
  if (cp >= 0xD800 && cp <= 0xDFFF) return 0;
  return len;
}

inline std::size_t utf8_sequence_length(std::string_view s, std::size_t i) {
  std::uint32_t cp = 0;
  return utf8_decode(s, i, cp);
}

// Appends `s` with control characters as spaces and invalid UTF-8 bytes as U+FFFD (for header lines).
inline void append_printable(std::string& out, std::string_view s) {
  for (std::size_t i = 0; i < s.size();) {
    const auto u = static_cast<unsigned char>(s[i]);
    if (u >= 0x80) {
      const std::size_t len = utf8_sequence_length(s, i);
      if (len == 0) {
        out += "\xEF\xBF\xBD";
        ++i;
      } else {
        out.append(s.data() + i, len);
        i += len;
      }
      continue;
    }
    out += (u < 0x20 || u == 0x7F) ? ' ' : s[i];
    ++i;
  }
}

// Sorts `order` (indices into something `context` points to) by `less`. The writers sort rows, lines and
// paths through this one function so that the program holds a single std::sort of indices instead of one
// per comparator (each is a few kilobytes of code to compile). Ties keep no particular order: a `less`
// that must be stable breaks them by index.
using index_less = bool (*)(const void* context, std::uint32_t a, std::uint32_t b);

inline void sort_indices(std::vector<std::uint32_t>& order, index_less less, const void* context) {
  struct by_less {
    index_less less;
    const void* context;
    bool operator()(std::uint32_t a, std::uint32_t b) const { return less(context, a, b); }
  };
  std::sort(order.begin(), order.end(), by_less{less, context});
}

// 0, 1, ..., n-1.
inline std::vector<std::uint32_t> identity_order(std::size_t n) {
  std::vector<std::uint32_t> order(n);
  for (std::size_t i = 0; i < n; ++i) order[i] = static_cast<std::uint32_t>(i);
  return order;
}

}  // namespace detail
}  // namespace selfprof
