// libFuzzer target for the folded reader as the CLI uses it: any bytes must parse to a profile plus
// errors (never a crash), and the profile must render as SVG and folded text again.
// Build:
//   clang++ -std=c++17 -g -O1 -fsanitize=fuzzer,address,undefined -Iinclude
//     tests/fuzz/cli_folded_fuzz.cpp -o cli_folded_fuzz
// Run (the first directory receives new inputs; tests/golden only seeds it):
//   mkdir -p /tmp/corpus && ./cli_folded_fuzz -max_total_time=60 /tmp/corpus tests/golden/
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "selfprof/output/folded.hpp"
#include "selfprof/output/folded_parse.hpp"
#include "selfprof/output/svg.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size > 1 << 16) return 0;  // rendering is linear, but keep each run short
  const std::string text(reinterpret_cast<const char*>(data), size);
  selfprof::folded_parse_result r = selfprof::parse_folded(text, "fuzz");
  if (r.ignored_lines < r.errors.size()) std::abort();
  for (const auto& e : r.errors)
    if (e.line == 0 || e.line > r.lines) std::abort();  // errors name a real line
  selfprof::svg_options o;
  o.javascript = false;
  const std::string svg = selfprof::detail::write_svg(r.prof, o);
  if (svg.find("</svg>") == std::string::npos) std::abort();
  (void)selfprof::write_folded(r.prof);
  return 0;
}
