// Names of JIT code as perf and selfprof accept them: no newline, NUL or other control byte, bounded
// length (cut on a UTF-8 character boundary), and at least three characters (perf drops shorter ones).
// Context: any thread (pure functions).
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

namespace selfprof {
namespace detail {

// Longest name kept, in bytes; a longer one is cut and ends in "...".
constexpr std::size_t jit_name_max = 512;
// perf's map parser skips a line unless more than two characters follow the size (dso__load_perf_map).
constexpr std::size_t jit_name_min = 3;

// Appends the sanitised form of `name` to `out`: control bytes (below 0x20 and 0x7f) become '_', an
// over-long name is cut to jit_name_max bytes on a character boundary, a short one gets a "jit:" prefix
// and an empty one becomes "jit:anonymous".
inline void append_jit_name(std::string& out, std::string_view name) {
  if (name.empty()) {
    out += "jit:anonymous";
    return;
  }
  if (name.size() < jit_name_min) out += "jit:";
  std::size_t n = name.size();
  bool cut = n > jit_name_max;
  if (cut) {
    n = jit_name_max - 3;
    // Do not split a UTF-8 sequence: back up over continuation bytes (10xxxxxx) to a lead byte.
    while (n > 0 && (static_cast<unsigned char>(name[n]) & 0xc0) == 0x80) --n;
  }
  std::size_t first = out.size();
  out.append(name.data(), n);
  for (std::size_t i = first; i < out.size(); ++i) {
    unsigned char c = static_cast<unsigned char>(out[i]);
    if (c < 0x20 || c == 0x7f) out[i] = '_';
  }
  if (cut) out += "...";
}

inline std::string sanitize_jit_name(std::string_view name) {
  std::string out;
  append_jit_name(out, name);
  return out;
}

}  // namespace detail
}  // namespace selfprof
