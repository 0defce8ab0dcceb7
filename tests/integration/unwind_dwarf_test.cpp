// The CFI unwinder on real samples: a test signal handler on per-thread CPU timers walks every sample with
// frame pointers only (unwind_live without tables) and with the published tables (unwind_interrupted), from
// the same registers, so each test compares the two on identical samples.
// Covers: a caller's share of CPU under glibc's malloc/free (no frame pointers) against the truth measured
// with the thread CPU clock; a frameless assembly leaf; C code built with -fomit-frame-pointer; samples
// landing in the dynamic loader and in malloc while the tables are rebuilt (no deadlock).
// ctest-labels: no_tsan
// Not under TSan: it defers asynchronous signals to its next safe point, so a deferred handler walks
// a stack that is no longer the interrupted one; and it kills children that start threads after fork.
// ctest-labels: accuracy
// (A 1-point accuracy check over ~32,000 samples: run in the gcc stage, not again in every other one.)
#include <doctest/doctest.h>

#include <dlfcn.h>
#include <pthread.h>
#include <signal.h>
#include <time.h>
#include <ucontext.h>
#include <unistd.h>

#include <atomic>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include <selfprof/signal/raw_syscall.hpp>
#include <selfprof/signal/unwind.hpp>
#include <selfprof/symbols/symbolizer.hpp>
#include <selfprof/unwind/tables.hpp>

#if defined(__clang__)
#define UT_NOINLINE __attribute__((noinline))
#else
#define UT_NOINLINE __attribute__((noipa))
#endif
#define UT_NO_TAIL() __asm__ volatile("" ::: "memory")

// A frameless leaf with CFI (CFA = rsp+8 throughout): %rbp still holds its caller's caller's frame.
__asm__(
    ".text\n"
    ".globl selfprof_unwind_asm_leaf\n"
    ".type selfprof_unwind_asm_leaf, @function\n"
    "selfprof_unwind_asm_leaf:\n"
    ".cfi_startproc\n"
    "  mov %rdi, %rax\n"
    "1: sub $1, %rax\n"
    "  jg 1b\n"
    "  ret\n"
    ".cfi_endproc\n"
    ".size selfprof_unwind_asm_leaf, .-selfprof_unwind_asm_leaf\n");
extern "C" void selfprof_unwind_asm_leaf(long n);

namespace {

using selfprof::detail::unwind_result;

std::int64_t thread_cpu_ns() {
  struct timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return std::int64_t(ts.tv_sec) * 1000000000 + ts.tv_nsec;
}

// Preallocated sample store the test handler writes into (no allocation in the handler).
constexpr int kMaxSamples = 40000;
constexpr int kDepth = 64;
struct samples {
  std::atomic<bool> active{false};
  std::atomic<int> in_flight{0};
  std::atomic<int> next{0};
  std::uint32_t tid[kMaxSamples];
  std::uint16_t fp_depth[kMaxSamples], dw_depth[kMaxSamples];
  std::uint64_t fp[kMaxSamples][kDepth], dw[kMaxSamples][kDepth];
  int count() const { return next.load() < kMaxSamples ? next.load() : kMaxSamples; }
};
samples g_samples;

// The handler's own CPU time is charged to whatever code it interrupted, and it is longer for deep stacks
// (inside malloc): the truth leaves it out. Which region the handler interrupted is told by this flag.
volatile sig_atomic_t g_in_caller = 0;
std::atomic<std::int64_t> g_handler_ns_caller{0}, g_handler_ns_all{0};

void test_handler(int, siginfo_t*, void* context) {
  samples& s = g_samples;
  s.in_flight.fetch_add(1);
  const std::int64_t t0 = thread_cpu_ns();
  if (s.active.load()) {
    int i = s.next.fetch_add(1);
    if (i < kMaxSamples) {
      const ucontext_t* uc = static_cast<const ucontext_t*>(context);
      std::uintptr_t pc = static_cast<std::uintptr_t>(uc->uc_mcontext.gregs[REG_RIP]);
      std::uintptr_t sp = static_cast<std::uintptr_t>(uc->uc_mcontext.gregs[REG_RSP]);
      std::uintptr_t fp = static_cast<std::uintptr_t>(uc->uc_mcontext.gregs[REG_RBP]);
      std::uintptr_t end = selfprof::detail::current_thread_stack_end(sp, 0, false);
      s.tid[i] = selfprof::detail::raw_gettid();
      s.fp_depth[i] = static_cast<std::uint16_t>(
          selfprof::detail::unwind_live(nullptr, pc, sp, fp, end, s.fp[i], kDepth).depth);
      s.dw_depth[i] = static_cast<std::uint16_t>(
          selfprof::detail::unwind_interrupted(pc, sp, fp, end, s.dw[i], kDepth).depth);
    }
  }
  const std::int64_t spent = thread_cpu_ns() - t0;
  g_handler_ns_all.fetch_add(spent);
  if (g_in_caller) g_handler_ns_caller.fetch_add(spent);
  s.in_flight.fetch_sub(1);
}

const int kSignal = SIGRTMIN + 5;

// Installs the handler and a CPU-time timer on the calling thread; stops and waits for handlers on exit.
struct thread_sampler {
  timer_t timer{};
  bool armed = false;
  // CPU-time timers fire on scheduler ticks only (CONFIG_HZ: often 250 Hz); the malloc test needs more
  // samples than that gives in a few seconds, so it samples its (busy) thread on a monotonic hrtimer.
  explicit thread_sampler(long period_ns, clockid_t clock = CLOCK_THREAD_CPUTIME_ID) {
    struct sigevent sev {};
    sev.sigev_notify = SIGEV_THREAD_ID;
    sev.sigev_signo = kSignal;
    sev._sigev_un._tid = static_cast<pid_t>(selfprof::detail::raw_gettid());
    if (timer_create(clock, &sev, &timer) != 0) return;
    struct itimerspec its {};
    its.it_interval.tv_nsec = period_ns;
    its.it_value.tv_nsec = period_ns;
    armed = timer_settime(timer, 0, &its, nullptr) == 0;
  }
  ~thread_sampler() {
    if (armed) timer_delete(timer);
  }
};

void install_handler() {
  struct sigaction sa {};
  sa.sa_sigaction = test_handler;
  sa.sa_flags = SA_SIGINFO | SA_RESTART;
  sigemptyset(&sa.sa_mask);
  REQUIRE(sigaction(kSignal, &sa, nullptr) == 0);
}

void start_sampling() {
  g_samples.next.store(0);
  g_samples.active.store(true);
}
void stop_sampling() {
  g_samples.active.store(false);
  while (g_samples.in_flight.load() != 0) sched_yield();
}

// Names addresses (pc for the leaf, pc-1 for return addresses), cached.
struct namer {
  selfprof::symbolizer sym;
  std::map<std::uint64_t, std::string> cache;
  std::map<std::uint64_t, std::string> modules;
  const std::string& name(std::uint64_t a) {
    auto it = cache.find(a);
    if (it != cache.end()) return it->second;
    selfprof::frame f = sym.resolve_one(a);
    modules[a] = f.module;
    return cache[a] = f.name;
  }
  const std::string& module(std::uint64_t a) {
    name(a);
    return modules[a];
  }
  bool contains(const std::uint64_t* frames, int depth, const std::string& needle) {
    for (int k = 0; k < depth; ++k)
      if (name(k == 0 ? frames[0] : frames[k] - 1).find(needle) != std::string::npos) return true;
    return false;
  }
  // Frames [k] named `inner` directly followed by a frame named `outer`.
  bool called_from(const std::uint64_t* frames, int depth, const std::string& inner,
                   const std::string& outer) {
    for (int k = 0; k + 1 < depth; ++k)
      if (name(k == 0 ? frames[0] : frames[k] - 1).find(inner) != std::string::npos)
        return name(frames[k + 1] - 1).find(outer) != std::string::npos;
    return false;
  }
};

// ---- the malloc-heavy workload ----
void* g_slots[64];
unsigned g_seed = 1;

extern "C" UT_NOINLINE void selfprof_ut_malloc_caller(long n) {
  for (long i = 0; i < n; ++i) {
    g_seed = g_seed * 1103515245u + 12345u;
    unsigned slot = (g_seed >> 8) % 64;
    std::free(g_slots[slot]);
    std::size_t size = 16 + ((g_seed >> 16) % 2048);
    g_slots[slot] = std::malloc(size);
    static_cast<volatile char*>(g_slots[slot])[0] = 1;
  }
  UT_NO_TAIL();
}

extern "C" UT_NOINLINE double selfprof_ut_other_work(long n) {
  volatile double x = 1;
  for (long i = 0; i < n; ++i) x = x * 1.0000001 + 0.5;
  UT_NO_TAIL();
  return x;
}

struct split {
  std::int64_t in_caller = 0, total = 0;  // workload CPU time, the sampling handler's own time left out
  std::int64_t handler = 0;               // CPU time spent in the sampling handler
};

// What reading the thread CPU clock twice costs (a system call each): charged to the caller's interval
// by the measurement itself, so it is taken off the truth.
std::int64_t clock_pair_ns() {
  std::int64_t best = 1 << 30;
  for (int i = 0; i < 2000; ++i) {
    std::int64_t t0 = thread_cpu_ns();
    std::int64_t t1 = thread_cpu_ns();
    if (t1 - t0 < best) best = t1 - t0;
  }
  return best;
}

// Runs rounds of malloc_caller(m) + other_work(w) for `cpu_ns`; m and w give the caller ~13% of the CPU.
// Each round is scaled by a random factor in [0.5, 1.5) so rounds do not lock step with the sampling period.
UT_NOINLINE split run_malloc_workload(std::int64_t cpu_ns, long m, long w) {
  split s;
  const std::int64_t overhead = clock_pair_ns();
  unsigned rnd = 7;
  const std::int64_t handler_caller0 = g_handler_ns_caller.load(), handler_all0 = g_handler_ns_all.load();
  std::int64_t start = thread_cpu_ns();
  while (thread_cpu_ns() - start < cpu_ns) {
    rnd = rnd * 1664525u + 1013904223u;
    double scale = 0.5 + double(rnd >> 8) / double(1u << 24);
    std::int64_t t0 = thread_cpu_ns();
    g_in_caller = 1;
    selfprof_ut_malloc_caller(static_cast<long>(double(m) * scale));
    g_in_caller = 0;
    std::int64_t t1 = thread_cpu_ns();
    selfprof_ut_other_work(static_cast<long>(double(w) * scale));
    s.in_caller += t1 - t0 > overhead ? t1 - t0 - overhead : 0;
  }
  s.total = thread_cpu_ns() - start;
  s.in_caller -= g_handler_ns_caller.load() - handler_caller0;
  s.handler = g_handler_ns_all.load() - handler_all0;
  s.total -= s.handler;
  UT_NO_TAIL();
  return s;
}

// Iterations of each function that take about `ns` of CPU here.
long calibrate(void (*fn)(long), std::int64_t ns) {
  long n = 1000;
  for (;;) {
    std::int64_t t0 = thread_cpu_ns();
    fn(n);
    std::int64_t dt = thread_cpu_ns() - t0;
    if (dt > 2000000) return static_cast<long>(double(n) * double(ns) / double(dt)) + 1;
    n *= 4;
  }
}
void other_work_void(long n) { selfprof_ut_other_work(n); }

}  // namespace

TEST_CASE("a caller's share under glibc malloc/free matches the truth within 1 point with the CFI tables") {
  install_handler();
  REQUIRE(selfprof::build_unwind_tables());
  long m = calibrate(selfprof_ut_malloc_caller, 130000);  // 130 us in the caller per 1 ms round: 13%
  long w = calibrate(other_work_void, 870000);
  start_sampling();
  split truth;
  {
    thread_sampler timer(250000, CLOCK_MONOTONIC);  // 4 kHz while this thread runs
    REQUIRE(timer.armed);
    truth = run_malloc_workload(8000000000, m, w);  // ~32,000 samples: sigma of the share ~0.2 points
  }
  stop_sampling();
  namer n;
  int total = g_samples.count(), fp_hits = 0, dw_hits = 0, in_libc = 0, dw_libc_kept = 0;
  for (int i = 0; i < total; ++i) {
    bool fp_in = n.contains(g_samples.fp[i], g_samples.fp_depth[i], "selfprof_ut_malloc_caller");
    bool dw_in = n.contains(g_samples.dw[i], g_samples.dw_depth[i], "selfprof_ut_malloc_caller");
    fp_hits += fp_in;
    dw_hits += dw_in;
    if (n.module(g_samples.dw[i][0]).find("libc.so") != std::string::npos) {
      ++in_libc;
      dw_libc_kept += dw_in;
    }
  }
  if (std::getenv("SELFPROF_UNWIND_DIAG")) {  // where samples that are in neither function sit
    std::map<std::string, int> hist;
    for (int i = 0; i < total; ++i) {
      if (n.contains(g_samples.dw[i], g_samples.dw_depth[i], "selfprof_ut_")) {
        bool known = n.contains(g_samples.dw[i], g_samples.dw_depth[i], "selfprof_ut_malloc_caller") ||
                     n.contains(g_samples.dw[i], g_samples.dw_depth[i], "selfprof_ut_other_work");
        if (known) continue;
      }
      std::string key;
      for (int k = 0; k < g_samples.dw_depth[i] && k < 4; ++k)
        key += n.name(k ? g_samples.dw[i][k] - 1 : g_samples.dw[i][0]) + " <- ";
      ++hist[key];
    }
    for (auto& h : hist) std::fprintf(stderr, "%6d %s\n", h.second, h.first.c_str());
  }
  double truth_pct = 100.0 * double(truth.in_caller) / double(truth.total);
  double fp_pct = 100.0 * fp_hits / total, dw_pct = 100.0 * dw_hits / total;
  MESSAGE("test handler (fp-only walk + CFI walk + 2 clock reads): " << truth.handler / total
                                                                     << " ns per sample");
  MESSAGE("samples " << total << ", truth " << truth_pct << "%, frame pointers " << fp_pct << "%, CFI tables "
                     << dw_pct << "% (samples in libc: " << in_libc << ", caller kept in " << dw_libc_kept
                     << ")");
  REQUIRE(total > 4000);
  CHECK(truth_pct > 8);
  CHECK(truth_pct < 20);
  CHECK(std::abs(dw_pct - truth_pct) <= 1.0);
  CHECK(in_libc > 0);
  CHECK(dw_libc_kept >= in_libc * 95 / 100);  // the caller survives samples inside malloc/free
  selfprof::release_unwind_tables();
}

namespace {
UT_NOINLINE void selfprof_ut_asm_leaf_caller(std::int64_t cpu_ns) {
  std::int64_t start = thread_cpu_ns();
  while (thread_cpu_ns() - start < cpu_ns) selfprof_unwind_asm_leaf(200000);
  UT_NO_TAIL();
}

using omit_fn = double (*)(long);

// The -fomit-frame-pointer fixture: built by the build system (SELFPROF_UNWIND_FIXTURE_LIB), else here.
std::string omit_fixture_path() {
#if defined(SELFPROF_UNWIND_FIXTURE_LIB)
  return SELFPROF_UNWIND_FIXTURE_LIB;
#else
  std::string out = "/tmp/selfprof_unwind_fixture_" + std::to_string(getpid()) + ".so";
  std::string cmd =
      std::string("cc -O2 -fomit-frame-pointer -fasynchronous-unwind-tables -fPIC -shared -o ") + out +
      " " SELFPROF_TEST_SOURCE_DIR "/fixtures/unwind_omit_fp.c";
  return std::system(cmd.c_str()) == 0 ? out : std::string();
#endif
}

UT_NOINLINE double selfprof_ut_omit_driver(omit_fn caller, std::int64_t cpu_ns) {
  double r = 0;
  std::int64_t start = thread_cpu_ns();
  while (thread_cpu_ns() - start < cpu_ns) r += caller(300000);
  UT_NO_TAIL();
  return r;
}
}  // namespace

TEST_CASE("a frameless leaf keeps its caller") {
  install_handler();
  REQUIRE(selfprof::build_unwind_tables());
  start_sampling();
  {
    thread_sampler timer(250000, CLOCK_MONOTONIC);
    REQUIRE(timer.armed);
    selfprof_ut_asm_leaf_caller(600000000);
  }
  stop_sampling();
  namer n;
  int leaf = 0, fp_kept = 0, dw_kept = 0;
  for (int i = 0; i < g_samples.count(); ++i) {
    if (n.name(g_samples.dw[i][0]) != "selfprof_unwind_asm_leaf") continue;
    ++leaf;
    fp_kept +=
        n.called_from(g_samples.fp[i], g_samples.fp_depth[i], "selfprof_unwind_asm_leaf", "asm_leaf_caller");
    dw_kept +=
        n.called_from(g_samples.dw[i], g_samples.dw_depth[i], "selfprof_unwind_asm_leaf", "asm_leaf_caller");
  }
  MESSAGE("leaf samples " << leaf << ": caller kept by frame pointers in " << fp_kept << ", by CFI tables in "
                          << dw_kept);
  REQUIRE(leaf > 200);
  CHECK(dw_kept == leaf);
  CHECK(fp_kept < leaf / 10);  // frame pointers skip it except on the `ret` byte
  selfprof::release_unwind_tables();
}

TEST_CASE("code built with -fomit-frame-pointer keeps its callers (library loaded after the first build)") {
  install_handler();
  REQUIRE(selfprof::build_unwind_tables());  // before the library: the rebuild must notice it
  std::string path = omit_fixture_path();
  REQUIRE_MESSAGE(!path.empty(), "could not build tests/fixtures/unwind_omit_fp.c");
  void* lib = dlopen(path.c_str(), RTLD_NOW);
  REQUIRE_MESSAGE(lib != nullptr, dlerror());
  auto caller = reinterpret_cast<omit_fn>(dlsym(lib, "selfprof_unwind_omit_caller"));
  REQUIRE(reinterpret_cast<void*>(caller) != nullptr);
  REQUIRE(selfprof::build_unwind_tables());
  start_sampling();
  {
    thread_sampler timer(250000, CLOCK_MONOTONIC);
    REQUIRE(timer.armed);
    selfprof_ut_omit_driver(caller, 600000000);
  }
  stop_sampling();
  namer n;
  int leaf = 0, fp_chain = 0, dw_chain = 0;
  for (int i = 0; i < g_samples.count(); ++i) {
    if (n.name(g_samples.dw[i][0]) != "selfprof_unwind_omit_leaf") continue;
    ++leaf;
    auto chain = [&](const std::uint64_t* f, int d) {
      return n.called_from(f, d, "selfprof_unwind_omit_leaf", "selfprof_unwind_omit_caller") &&
             n.called_from(f, d, "selfprof_unwind_omit_caller", "selfprof_ut_omit_driver") &&
             n.contains(f, d, "DOCTEST_ANON_FUNC");  // and on up to the test case itself
    };
    fp_chain += chain(g_samples.fp[i], g_samples.fp_depth[i]);
    dw_chain += chain(g_samples.dw[i], g_samples.dw_depth[i]);
  }
  MESSAGE("leaf samples " << leaf << ": leaf <- caller <- driver <- test kept by frame pointers in "
                          << fp_chain << ", by CFI tables in " << dw_chain);
  REQUIRE(leaf > 200);
  CHECK(dw_chain == leaf);
  CHECK(fp_chain < leaf / 10);
  selfprof::release_unwind_tables();
  dlclose(lib);
#if !defined(SELFPROF_UNWIND_FIXTURE_LIB)
  std::remove(path.c_str());
#endif
}

TEST_CASE("parsed rows outlive a stop for loaded modules only, and are reused by the next start") {
  selfprof::release_unwind_tables();
  REQUIRE(selfprof::build_unwind_tables());
  const selfprof::unwind_tables_info first = selfprof::get_unwind_tables_info();
  REQUIRE(first.modules > 0);
  std::string path = omit_fixture_path();
  REQUIRE_MESSAGE(!path.empty(), "could not build tests/fixtures/unwind_omit_fp.c");
  void* lib = dlopen(path.c_str(), RTLD_NOW);
  REQUIRE_MESSAGE(lib != nullptr, dlerror());
  REQUIRE(selfprof::build_unwind_tables());
  const std::size_t with_lib = selfprof::get_unwind_tables_info().parsed;
  CHECK(with_lib == first.parsed + 1);
  selfprof::release_unwind_tables();  // stop: the library is still loaded, its rows stay
  selfprof::unwind_tables_info kept = selfprof::get_unwind_tables_info();
  CHECK(!kept.published);
  CHECK(kept.parsed == with_lib);
  REQUIRE(selfprof::build_unwind_tables());  // start again: nothing parsed, every module reused
  kept = selfprof::get_unwind_tables_info();
  CHECK(kept.published);
  CHECK(kept.reused == kept.parsed);
  CHECK(kept.parsed == with_lib);
  selfprof::release_unwind_tables();
  dlclose(lib);
  selfprof::release_unwind_tables();  // the library is gone: so are its rows
  CHECK(selfprof::get_unwind_tables_info().parsed == with_lib - 1);
#if !defined(SELFPROF_UNWIND_FIXTURE_LIB)
  std::remove(path.c_str());
#endif
}

TEST_CASE("samples in the dynamic loader and in malloc, while the tables are rebuilt, never deadlock") {
  install_handler();
  alarm(120);  // a deadlock kills the test instead of hanging it
  std::string path = omit_fixture_path();
  REQUIRE(!path.empty());
  REQUIRE(selfprof::build_unwind_tables());
  start_sampling();
  std::atomic<bool> done{false};
  std::atomic<std::uint32_t> loader_tid{0};
  std::atomic<int> loads{0};
  std::thread loader([&] {
    loader_tid.store(selfprof::detail::raw_gettid());
    thread_sampler timer(100000, CLOCK_MONOTONIC);  // 10 kHz: many samples inside dlopen/dlclose
    for (int i = 0; i < 600; ++i) {
      void* h = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
      if (h) dlclose(h);
      loads.fetch_add(1);
    }
    done.store(true);
  });
  int rebuilds = 0;
  {
    thread_sampler timer(250000, CLOCK_MONOTONIC);
    while (!done.load()) {
      run_malloc_workload(2000000, 2000, 2000);  // samples inside malloc on this thread
      REQUIRE(selfprof::build_unwind_tables());  // the collector's periodic check, racing dlopen/dlclose
      ++rebuilds;
    }
  }
  loader.join();
  stop_sampling();
  alarm(0);
  namer n;
  int loader_samples = 0, in_ld = 0, walked_out_of_ld = 0;
  for (int i = 0; i < g_samples.count(); ++i) {
    if (g_samples.tid[i] != loader_tid.load()) continue;
    ++loader_samples;
    if (n.module(g_samples.dw[i][0]).find("ld-linux") == std::string::npos) continue;
    ++in_ld;
    walked_out_of_ld += n.contains(g_samples.dw[i], g_samples.dw_depth[i], "start_thread");
  }
  selfprof::unwind_tables_info info = selfprof::get_unwind_tables_info();
  MESSAGE("loads " << loads.load() << ", rebuilds " << rebuilds << ", published sets " << info.builds
                   << ", loader-thread samples " << loader_samples << ", in ld.so " << in_ld
                   << ", walked from ld.so to start_thread " << walked_out_of_ld);
  CHECK(loads.load() == 600);
  CHECK(loader_samples > 0);
  CHECK(in_ld > 0);
  CHECK(walked_out_of_ld * 10 >= in_ld * 9);
  CHECK(info.builds > 1);  // module changes were noticed and published while handlers read the tables
  selfprof::release_unwind_tables();
#if !defined(SELFPROF_UNWIND_FIXTURE_LIB)
  std::remove(path.c_str());
#endif
}
