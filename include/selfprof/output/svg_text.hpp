// Text helpers for the SVG writers: UTF-8 sanitizing, XML and JS escaping, number formatting, label
// truncation.
// Context: any thread (pure functions).
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <string>
#include <string_view>

#include "selfprof/output/text.hpp"

namespace selfprof {
namespace detail {

inline void append_replacement_char(std::string& out) { out += "\xEF\xBF\xBD"; }

// Copies `in` as valid UTF-8 holding only characters legal in XML 1.0 text: invalid sequences,
// surrogates, U+FFFE/U+FFFF and control characters (tab, LF and CR included: names are one line)
// become U+FFFD.
inline std::string sanitize_utf8(std::string_view in) {
  std::string out;
  out.reserve(in.size());
  std::size_t i = 0, n = in.size();
  while (i < n) {
    unsigned char c = static_cast<unsigned char>(in[i]);
    if (c < 0x80) {
      if (c < 0x20 || c == 0x7f)
        append_replacement_char(out);
      else
        out += static_cast<char>(c);
      ++i;
      continue;
    }
    std::uint32_t cp = 0;
    const std::size_t len = utf8_decode(in, i, cp);
    // Valid UTF-8 that XML still refuses: U+FFFE, U+FFFF and the C1 controls.
    const bool ok = len != 0 && !(cp == 0xFFFE || cp == 0xFFFF || (cp >= 0x80 && cp <= 0x9F));
    if (!ok) {
      append_replacement_char(out);
      ++i;  // resynchronise on the next byte
      continue;
    }
    out.append(in.data() + i, len);
    i += len;
  }
  return out;
}

// Escapes for XML text and attribute values (input must already be sanitized).
inline void append_xml_escaped(std::string& out, std::string_view s) {
  for (char c : s) {
    switch (c) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&quot;";
        break;
      default:
        out += c;
    }
  }
}

inline std::string xml_escape(std::string_view s) {
  std::string out;
  append_xml_escaped(out, sanitize_utf8(s));
  return out;
}

// A JavaScript string literal (with quotes) safe inside CDATA and <script>: <, >, & and every
// non-printable become \u escapes, so `]]>` and `</script>` can never appear.
inline std::string js_string(std::string_view raw) {
  std::string s = sanitize_utf8(raw);
  std::string out = "\"";
  for (char ch : s) {
    unsigned char c = static_cast<unsigned char>(ch);
    if (c == '"' || c == '\\' || c == '<' || c == '>' || c == '&' || c == '\'' || c < 0x20) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\u%04x", c);
      out += buf;
    } else {
      out += ch;
    }
  }
  out += '"';
  return out;
}

// 1234567 -> "1,234,567" (flamegraph.pl's tooltip style).
inline std::string with_commas(std::uint64_t v) {
  std::string digits = std::to_string(v);
  std::string out;
  for (std::size_t i = 0; i < digits.size(); ++i) {
    if (i != 0 && (digits.size() - i) % 3 == 0) out += ',';
    out += digits[i];
  }
  return out;
}

inline std::string fixed(double v, int decimals) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.*f", decimals, v);
  return buf;
}

// Appends `v` with `decimals` digits, dropping trailing zeros (and the dot): 12.5000 -> 12.5, 3.0 -> 3.
inline void append_trimmed(std::string& out, double v, int decimals) {
  char buf[64];
  int n = std::snprintf(buf, sizeof buf, "%.*f", decimals, v);
  if (n <= 0) return;
  std::string_view s(buf, static_cast<std::size_t>(n));
  if (s.find('.') != std::string_view::npos) {
    while (!s.empty() && s.back() == '0') s.remove_suffix(1);
    if (!s.empty() && s.back() == '.') s.remove_suffix(1);
  }
  if (s == "-0") s = "0";
  out.append(s.data(), s.size());
}

inline std::size_t utf8_length(std::string_view s) {
  std::size_t n = 0;
  for (char c : s)
    if ((static_cast<unsigned char>(c) & 0xC0) != 0x80) ++n;
  return n;
}

// Byte offset of the first `chars` code points of `s` (s must be valid UTF-8).
inline std::size_t utf8_prefix_bytes(std::string_view s, std::size_t chars) {
  std::size_t seen = 0;
  for (std::size_t i = 0; i < s.size(); ++i) {
    if ((static_cast<unsigned char>(s[i]) & 0xC0) != 0x80) {
      if (seen == chars) return i;
      ++seen;
    }
  }
  return s.size();
}

// flamegraph.pl's server-side label: whole name when it fits `max_chars`, else the first
// max_chars-2 characters and "..", and nothing below 3 characters. `left` keeps the end instead.
inline std::string truncate_label(std::string_view name, std::size_t max_chars, bool left) {
  if (max_chars < 3) return std::string();
  std::size_t len = utf8_length(name);
  if (len <= max_chars) return std::string(name);
  if (left) return ".." + std::string(name.substr(utf8_prefix_bytes(name, len - (max_chars - 2))));
  return std::string(name.substr(0, utf8_prefix_bytes(name, max_chars - 2))) + "..";
}

}  // namespace detail
}  // namespace selfprof
