// Cost of one stack walk: frame pointers only (unwind_live without tables) vs unwind_interrupted (CFI tables)
// on a real stack of 16, 64 and 128 frames, and through glibc code without frame pointers (qsort's
// comparator), in ns per walk.
// Build: g++ -std=c++17 -O2 -fno-omit-frame-pointer -Iinclude bench/unwind_bench.cpp -o /tmp/unwind_bench
#include <ucontext.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>

#include <selfprof/signal/unwind.hpp>
#include <selfprof/unwind/tables.hpp>

using namespace selfprof::detail;

namespace {
constexpr int kWalks = 20000;
std::uint64_t g_out[256];
volatile std::size_t g_sink;

double time_walks(const ucontext_t& uc, bool mixed, std::size_t max_depth, std::size_t& depth) {
  std::uintptr_t pc = static_cast<std::uintptr_t>(uc.uc_mcontext.gregs[REG_RIP]);
  std::uintptr_t sp = static_cast<std::uintptr_t>(uc.uc_mcontext.gregs[REG_RSP]);
  std::uintptr_t fp = static_cast<std::uintptr_t>(uc.uc_mcontext.gregs[REG_RBP]);
  std::uintptr_t end = current_thread_stack_end(sp, 0, false);
  double best = 1e30;
  for (int rep = 0; rep < 5; ++rep) {
    auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < kWalks; ++i) {
      unwind_result r = mixed ? unwind_interrupted(pc, sp, fp, end, g_out, max_depth)
                              : unwind_live(nullptr, pc, sp, fp, end, g_out, max_depth);
      depth = r.depth;
      g_sink = g_sink + r.depth;
    }
    double ns =
        std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - t0).count() / kWalks;
    if (ns < best) best = ns;
  }
  return best;
}

void report(const char* what, const ucontext_t& uc, std::size_t max_depth) {
  std::size_t dfp = 0, dmx = 0;
  double fp = time_walks(uc, false, max_depth, dfp);
  double mx = time_walks(uc, true, max_depth, dmx);
  std::printf("%-34s fp %7.0f ns (%3zu frames)   mixed %7.0f ns (%3zu frames)   mixed/frame %5.1f ns\n", what,
              fp, dfp, mx, dmx, mx / double(dmx ? dmx : 1));
}

__attribute__((noinline)) int recurse(int n, std::size_t max_depth) {
  if (n > 0) {
    int r = recurse(n - 1, max_depth);
    __asm__ volatile("" ::: "memory");
    return r + 1;
  }
  ucontext_t uc;
  getcontext(&uc);
  char what[64];
  std::snprintf(what, sizeof what, "FP-built stack, depth limit %zu", max_depth);
  report(what, uc, max_depth);
  return 0;
}

int compare(const void* a, const void* b) {
  static int done = 0;
  if (!done) {  // once, from inside glibc's qsort (no frame pointers)
    done = 1;
    ucontext_t uc;
    getcontext(&uc);
    report("inside glibc qsort, limit 64", uc, 64);
  }
  return *static_cast<const int*>(a) - *static_cast<const int*>(b);
}
}  // namespace

int main() {
  auto t0 = std::chrono::steady_clock::now();
  selfprof::status st = selfprof::build_unwind_tables();
  double build_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  selfprof::unwind_tables_info info = selfprof::get_unwind_tables_info();
  std::printf("tables: %s, %zu modules, %zu rows, %zu KiB, built in %.1f ms\n",
              st ? "ok" : st.message().c_str(), info.modules, info.rows, info.bytes / 1024, build_ms);
  t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < 1000; ++i) (void)selfprof::build_unwind_tables();
  std::printf("unchanged-modules check: %.0f ns per build_unwind_tables() call\n",
              std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - t0).count() / 1000);
  for (std::size_t d : {16, 64, 128}) recurse(static_cast<int>(d) + 8, d);
  int v[64];
  for (int i = 0; i < 64; ++i) v[i] = (i * 37) % 64;
  qsort(v, 64, sizeof v[0], compare);
  selfprof::release_unwind_tables();
  return 0;
}
