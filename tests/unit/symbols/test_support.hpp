// Test helpers shared by the symbols_*_test.cpp files: canonical paths, hex text, symbolizer options.
// Context: tests only.
#pragma once

#include <climits>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <utility>
#include <vector>

#include "selfprof/symbols/symbolizer.hpp"

namespace symbols_test {

// realpath(3) of `path`, or empty when it does not resolve.
inline std::string real_path(const char* path) {
  char buffer[PATH_MAX];
  return ::realpath(path, buffer) != nullptr ? std::string(buffer) : std::string();
}

// `v` as 0x-prefixed lower-case hex, as addr2line takes and prints addresses.
inline std::string hex(std::uint64_t v) {
  char b[32];
  std::snprintf(b, sizeof b, "0x%llx", static_cast<unsigned long long>(v));
  return b;
}

// Symbolizer options with the given debug-file roots and the perf map off.
inline selfprof::symbolizer_options options_with_roots(std::vector<std::string> roots) {
  selfprof::symbolizer_options o;
  o.debug_roots = std::move(roots);
  o.use_perf_map = false;
  return o;
}

}  // namespace symbols_test
