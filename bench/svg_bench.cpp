// Render benchmark: 100,000 unique stacks to the interactive SVG, timed in process (no file I/O).
// Usage: svg_bench OUT_DIR [stacks] — writes OUT_DIR/bench.folded (same stacks, for flamegraph.pl)
// and OUT_DIR/selfprof.svg, and prints timings. bench/svg_bench.sh runs it against flamegraph.pl.
#include <selfprof/output/svg.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <set>
#include <string>
#include <unordered_map>
#include <vector>

namespace {

struct lcg {
  std::uint64_t s = 0x2545F4914F6CDD1DULL;
  std::uint32_t next() {
    s = s * 6364136223846793005ULL + 1442695040888963407ULL;
    return static_cast<std::uint32_t>(s >> 33);
  }
};

// A fixed call graph of 4,000 functions; stacks are random walks from main.
std::vector<std::string> make_names() {
  static const char* const ns[] = {"engine", "physics", "render", "net", "db", "std", "ai", "io"};
  std::vector<std::string> v;
  for (int i = 0; i < 4000; ++i)
    v.push_back(std::string(ns[i % 8]) + "::Class" + std::to_string(i / 8 % 97) + "::method_" +
                std::to_string(i) + "(int, std::string const&)");
  return v;
}

// Plain folded parse (split on ';' and the last space), frames interned by name: the work any
// folded -> SVG renderer has to do before drawing.
selfprof::profile parse(const std::string& text) {
  selfprof::profile p;
  std::unordered_map<std::string, std::uint32_t> ids;
  std::size_t pos = 0;
  while (pos < text.size()) {
    std::size_t nl = text.find('\n', pos);
    if (nl == std::string::npos) nl = text.size();
    std::size_t sp = text.rfind(' ', nl);
    if (sp != std::string::npos && sp > pos) {
      selfprof::stack s;
      s.count = std::strtoull(text.c_str() + sp + 1, nullptr, 10);
      std::size_t a = pos;
      while (a < sp) {
        std::size_t b = text.find(';', a);
        if (b == std::string::npos || b > sp) b = sp;
        std::string name = text.substr(a, b - a);
        auto it = ids.find(name);
        if (it == ids.end()) {
          selfprof::frame f;
          f.name = name;
          p.frames.push_back(f);
          it = ids.emplace(name, static_cast<std::uint32_t>(p.frames.size() - 1)).first;
        }
        s.frames.push_back(it->second);
        a = b + 1;
      }
      p.stacks.push_back(std::move(s));
    }
    pos = nl + 1;
  }
  return p;
}

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: %s OUT_DIR [stacks]\n", argv[0]);
    return 2;
  }
  const std::string dir = argv[1];
  const std::size_t want = argc > 2 ? std::strtoull(argv[2], nullptr, 10) : 100000;
  const auto names = make_names();
  lcg r;
  std::vector<std::vector<std::uint32_t>> callees(names.size());
  for (auto& c : callees)
    for (int k = 0; k < 6; ++k) c.push_back(r.next() % names.size());
  std::set<std::string> seen;
  std::string folded;
  while (seen.size() < want) {
    std::string st = "main";
    std::uint32_t f = r.next() % 16;
    int depth = 6 + static_cast<int>(r.next() % 24);
    for (int d = 0; d < depth; ++d) {
      st += ';';
      st += names[f];
      f = callees[f][r.next() % 6];
    }
    if (!seen.insert(st).second) continue;
  }
  for (const auto& st : seen) {
    std::uint32_t c = r.next() % 100 < 2 ? 1 + r.next() % 5000 : 1 + r.next() % 40;
    folded += st + ' ' + std::to_string(c) + '\n';
  }
  std::ofstream(dir + "/bench.folded", std::ios::binary) << folded;

  selfprof::svg_options o;
  double best_parse = 1e9, best_render = 1e9;
  std::string svg;
  for (int run = 0; run < 5; ++run) {
    auto t0 = std::chrono::steady_clock::now();
    selfprof::profile p = parse(folded);
    best_parse = std::min(best_parse, seconds_since(t0));
    auto t1 = std::chrono::steady_clock::now();
    svg = selfprof::detail::write_svg(p, o);
    best_render = std::min(best_render, seconds_since(t1));
  }
  std::ofstream(dir + "/selfprof.svg", std::ios::binary) << svg;
  std::size_t frames = 0;
  for (std::size_t p = svg.find("<g>"); p != std::string::npos; p = svg.find("<g>", p + 3)) ++frames;
  const double mib = static_cast<double>(folded.size()) / (1024.0 * 1024.0);
  std::printf("stacks=%zu folded_bytes=%zu frames_drawn=%zu\n", seen.size(), folded.size(), frames);
  std::printf("parse_s=%.4f render_s=%.4f total_s=%.4f folded_MiB_per_s=%.1f svg_bytes=%zu\n", best_parse,
              best_render, best_parse + best_render, mib / (best_parse + best_render), svg.size());
  return 0;
}
