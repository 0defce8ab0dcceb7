// The bounded, deterministic stand-in for libFuzzer that CI runs: mutates the perf-script fixtures and
// a few folded seeds with a fixed-seed generator (byte flips, inserted separators, duplicated and cut
// lines) and feeds each mutant to both CLI fuzz targets. Same inputs on every run; no clock involved.
// Build:
//   g++ -std=c++17 -O1 -fsanitize=address,undefined -Iinclude -Itools/selfprof tests/fuzz/cli_fuzz_loop.cpp
//     -o cli_fuzz_loop
// Run (defaults: 3000 iterations, built-in seeds):
//   ./cli_fuzz_loop [ITERATIONS] [SEED_FILE...]
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#define LLVMFuzzerTestOneInput perf_script_target
#include "cli_perf_script_fuzz.cpp"
#undef LLVMFuzzerTestOneInput
#define LLVMFuzzerTestOneInput folded_target
#include "cli_folded_fuzz.cpp"
#undef LLVMFuzzerTestOneInput

namespace {

struct rng {
  std::uint64_t s;
  std::uint64_t next() {  // splitmix64
    std::uint64_t z = (s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  }
  std::size_t below(std::size_t n) { return n ? static_cast<std::size_t>(next() % n) : 0; }
};

const char* const tokens[] = {
    " ",      "\t",   "\n",        "\n\n",  "(",         ")",    " (",
    ":",      ";",    "->",        "+0x1f", "[unknown]", "0",    "18446744073709551616",
    "/",      "_[k]", "\r",        "\"",    "'",         ".(",   ").",
    " 5",     " 1.5", "[x tid=1]", "#",     "# ",        "\xff", "/tmp/perf-1.map",
    "vmlinux"};

std::string mutate(std::string s, rng& r) {
  const int edits = 1 + static_cast<int>(r.below(8));
  for (int e = 0; e < edits; ++e) {
    const std::size_t pos = r.below(s.size() + 1);
    switch (r.below(5)) {
      case 0:
        if (!s.empty()) s[r.below(s.size())] = static_cast<char>(r.next());
        break;
      case 1:
        s.insert(pos, tokens[r.below(sizeof tokens / sizeof *tokens)]);
        break;
      case 2:
        s.erase(pos, r.below(16));
        break;
      case 3: {  // duplicate a slice
        const std::size_t len = r.below(200);
        s.insert(pos, s.substr(r.below(s.size() + 1), len));
        break;
      }
      default:
        s.resize(pos);
        break;
    }
  }
  return s;
}

}  // namespace

int main(int argc, char** argv) {
  long iterations = argc > 1 ? std::atol(argv[1]) : 3000;
  std::vector<std::string> seeds = {
      "sh 31036  1877.944109:    1001001 cpu-clock:ppp: \n\tffffffff8225fc27 exc_page_fault+0xd7 "
      "([kernel.kallsyms])\n"
      "\t98109 _int_malloc+0xda9 (/usr/lib/x86_64-linux-gnu/libc.so.6)\n\t0 [unknown] ([unknown])\n\n",
      "java 12688/12764 6544038.708352: 10309278 cpu-clock:\n\t7f722d142779 Lfoo/A;::x->Lfoo/B;::y->z "
      "(/tmp/perf-1.map)\n\n",
      "main;a;b 70\nmain;a 20\nmain;c 10\n",
      "[w tid=3];a_[k];b_[j] 3 4\n# c\n\nx 1.5\n",
  };
  for (int i = 2; i < argc; ++i) {
    std::ifstream f(argv[i], std::ios::binary);
    std::stringstream ss;
    ss << f.rdbuf();
    std::string text = ss.str();
    if (text.size() > 8192) text.resize(8192);  // keep each run short
    if (!text.empty()) seeds.push_back(text);
  }
  rng r{12345};
  for (long it = 0; it < iterations; ++it) {
    const std::string m = mutate(seeds[r.below(seeds.size())], r);
    const auto* d = reinterpret_cast<const std::uint8_t*>(m.data());
    perf_script_target(d, m.size());
    folded_target(d, m.size());
  }
  std::printf("cli_fuzz_loop: %ld mutants, %zu seeds: no crash\n", iterations, seeds.size());
  return 0;
}
