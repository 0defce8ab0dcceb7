// libFuzzer target for the perf-script collapser: any bytes must collapse to folded text without a
// crash, and every output line must be "stack count" with a non-empty stack.
// Build:
//   clang++ -std=c++17 -g -O1 -fsanitize=fuzzer,address,undefined -Iinclude -Itools/selfprof
//     tests/fuzz/cli_perf_script_fuzz.cpp -o cli_perf_script_fuzz
// Run (the first directory receives new inputs; the fixtures only seed it):
//   mkdir -p /tmp/corpus && ./cli_perf_script_fuzz -max_total_time=60 /tmp/corpus tests/cli/fixtures/
// CI runs the bounded deterministic mutation loop of cli_fuzz_loop.cpp over this target instead.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>

#include "perf_collapse.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  std::string_view text(reinterpret_cast<const char*>(data), size);
  selfprof_cli::perf_collapse_options o;
  if (size > 0) {  // the first byte picks the options
    const unsigned char b = data[0];
    o.pid = b & 1;
    o.tid = b & 2;
    o.kernel = b & 4;
    o.jit = b & 8;
    o.addrs = b & 16;
    if (b & 32) o.event_filter = "cycles";
  }
  selfprof_cli::perf_collapser c(o);
  c.feed_text(text);
  const std::string out = c.result();
  std::size_t pos = 0;
  while (pos < out.size()) {
    const std::size_t nl = out.find('\n', pos);
    if (nl == std::string::npos) std::abort();  // every line ends with LF
    const std::string_view line(out.data() + pos, nl - pos);
    const std::size_t sp = line.rfind(' ');
    if (sp == std::string_view::npos || sp == 0 || sp + 1 == line.size()) std::abort();
    pos = nl + 1;
  }
  return 0;
}
