// Torture: a fiber (makecontext/swapcontext) on a 64 KiB malloc'd stack runs hot code sampled at 999 Hz.
// Without an alternate signal stack every tick's signal frame (AT_MINSIGSTKSZ: 3.4 KiB with AVX-512) and
// the handler's frames land below the fiber's sp, in memory the fiber itself never touches (past the end
// of a tighter fiber stack). selfprof's handler runs with SA_ONSTACK on an alternate stack of its own
// (signal/altstack.hpp): the canary below the fiber's deepest point stays intact, and the samples still
// walk the fiber's frames (issue 15, item 19). Two threads: the one that calls start() (its stack is set
// at start()) and one created later (its stack is set by the handler at its first tick, taken on the
// thread's own stack before it enters the fiber). Each case runs in a child process, for each source.
// ctest-labels: no_tsan
// Not under TSan: TSan does not follow swapcontext, and it defers asynchronous signals.
#include <doctest/doctest.h>

#include <signal.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <ucontext.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>

#include "../integration/workload.hpp"

namespace fiber_torture {

constexpr std::size_t kFiberStack = 64 * 1024;
constexpr unsigned char kCanary = 0xa5;
constexpr std::size_t kSlack = 512;  // left between the fiber's measured deepest point and the canary

ucontext_t g_main_ctx, g_fiber_ctx;
std::int64_t g_cpu_ns = 0;  // how much of the thread's CPU time the fiber runs for
volatile double g_sink = 0;

WL_NOINLINE double fiber_hot(std::int64_t until_ns) {
  double x = 1;
  while (wl::thread_cpu_ns() < until_ns) x += wl::spin_units(1);
  WL_NO_TAIL();
  return x;
}

WL_NOINLINE double fiber_middle(std::int64_t until_ns) {
  const double x = fiber_hot(until_ns);
  WL_NO_TAIL();
  return x + 1;
}

WL_NOINLINE void fiber_entry() {
  g_sink = fiber_middle(wl::thread_cpu_ns() + g_cpu_ns);
  WL_NO_TAIL();
}  // returns to g_main_ctx (uc_link)

// Runs the fiber once on `stack` for `cpu_ns` of CPU time.
void run_fiber(unsigned char* stack, std::int64_t cpu_ns) {
  g_cpu_ns = cpu_ns;
  getcontext(&g_fiber_ctx);
  g_fiber_ctx.uc_stack.ss_sp = stack;
  g_fiber_ctx.uc_stack.ss_size = kFiberStack;
  g_fiber_ctx.uc_link = &g_main_ctx;
  makecontext(&g_fiber_ctx, fiber_entry, 0);
  swapcontext(&g_main_ctx, &g_fiber_ctx);
}

// Offset of the lowest byte of `stack` that is not the canary (kFiberStack: none).
std::size_t lowest_touched(const unsigned char* stack) {
  std::size_t i = 0;
  while (i < kFiberStack && stack[i] == kCanary) ++i;
  return i;
}

// How deep the thread's alternate stack (selfprof's or the program's) was used: its untouched bytes are 0.
std::size_t altstack_used(std::size_t* size) {
  stack_t cur{};
  *size = 0;
  if (sigaltstack(nullptr, &cur) != 0 || (cur.ss_flags & SS_DISABLE)) return 0;
  *size = cur.ss_size;
  const auto* p = static_cast<const unsigned char*>(cur.ss_sp);
  std::size_t i = 0;
  while (i < cur.ss_size && p[i] == 0) ++i;
  return cur.ss_size - i;
}

// Spins on the thread's own stack until it was sampled twice (its first tick gives it selfprof's stack).
bool wait_for_ticks() {
  const std::uint32_t tid = static_cast<std::uint32_t>(syscall(SYS_gettid));
  const auto begin = std::chrono::steady_clock::now();
  for (;;) {
    const std::int64_t until = wl::thread_cpu_ns() + 10 * 1000 * 1000;
    while (wl::thread_cpu_ns() < until) g_sink = wl::spin_units(1);
    const selfprof::profile p = selfprof::snapshot();
    std::uint64_t mine = 0;
    for (const auto& s : p.stacks)
      if (s.tid == tid) mine += s.count;
    if (mine >= 2) return true;
    if (std::chrono::steady_clock::now() - begin > std::chrono::seconds(10)) return false;
  }
}

// The fiber case on the calling thread; its exit status. `wait_for_altstack`: spin on the thread's own
// stack until the handler gave it an alternate stack (a thread the collector armed from outside).
// The fiber's own use of its stack, measured before sampling starts (deterministic code: the same each run).
std::size_t measure_guard() {
  auto* stack = static_cast<unsigned char*>(std::malloc(kFiberStack));
  if (stack == nullptr) return 0;
  g_sink = fiber_middle(0);  // binds the PLT entries it calls here, so the resolver's frame is not counted
  std::memset(stack, kCanary, kFiberStack);
  run_fiber(stack, 20 * 1000 * 1000);
  const std::size_t deepest = lowest_touched(stack);
  std::free(stack);
  return deepest < kSlack + 8 * 1024 ? 0 : deepest - kSlack;  // 0: it used most of its stack
}

// The fiber case on the calling thread; its exit status. The canary covers [0, guard) of the fiber stack.
int fiber_case(std::size_t guard, bool wait_first) {
  if (wait_first && !wait_for_ticks()) return 32;
  auto* stack = static_cast<unsigned char*>(std::malloc(kFiberStack));
  if (stack == nullptr) return 30;
  const std::size_t deepest = guard + kSlack;
  std::memset(stack, kCanary, kFiberStack);
  run_fiber(stack, 1000 * 1000 * 1000);
  const std::size_t damaged = lowest_touched(stack) < guard ? guard - lowest_touched(stack) : 0;
  const selfprof::profile p = selfprof::snapshot();
  std::uint64_t on_fiber = 0, with_frames = 0;
  const auto tid = static_cast<std::uint32_t>(syscall(SYS_gettid));
  std::string root_side;
  for (const auto& s : p.stacks) {
    if (s.tid != 0 && s.tid != tid) continue;
    if (wl::count_frames(p, s, "fiber_hot") == 0) continue;
    on_fiber += s.count;
    if (wl::count_frames(p, s, "fiber_middle") == 1 && wl::count_frames(p, s, "fiber_entry") == 1)
      with_frames += s.count;
    if (root_side.empty())
      for (std::size_t i = 0; i < s.frames.size() && i < 3; ++i)
        root_side += p.frames[s.frames[i]].name + ";";
  }
  std::size_t alt_size = 0;
  const std::size_t alt_used = altstack_used(&alt_size);
  std::fprintf(
      stderr,
      "fiber: own use %zu B of %zu; canary %zu B: %zu B overwritten; %llu samples on the fiber, %llu "
      "with its frames (root side: %s); alternate stack used to %zu B of %zu\n",
      kFiberStack - deepest, kFiberStack, guard, damaged, static_cast<unsigned long long>(on_fiber),
      static_cast<unsigned long long>(with_frames), root_side.c_str(), alt_used, alt_size);
  std::free(stack);
  if (damaged != 0) return 20;  // a signal frame landed below the fiber's own frames
  if (on_fiber < 20) return 21;
  if (with_frames * 10 < on_fiber * 9) return 22;  // the walk lost the fiber's frames
  return 0;
}

// The three threads: kProgramAltstack, the starting thread with an alternate stack of the program's own
// (doctest's, for its SIGSEGV report), shared; kStartingThread, the starting thread without one (selfprof's,
// set by start()); kNewThread, a thread started later (selfprof's, set by the handler at its first tick).
enum thread_case { kProgramAltstack, kStartingThread, kNewThread };

int child_run(const char* source, thread_case which) {
  setenv("SELFPROF_SOURCE", source, 1);
  if (which != kProgramAltstack) {
    stack_t off{};
    off.ss_flags = SS_DISABLE;
    if (sigaltstack(&off, nullptr) != 0) return 33;
  } else {
    stack_t cur{};
    if (sigaltstack(nullptr, &cur) != 0 || (cur.ss_flags & SS_DISABLE)) return 34;  // doctest set none
  }
  const std::size_t guard = measure_guard();
  if (guard == 0) return 31;
  selfprof::options o = selfprof::options_from_env();
  o.hz = 999;
  if (!selfprof::start(o)) return 11;
  int rc = 0;
  if (which == kNewThread) {
    std::thread t([&rc, guard] { rc = fiber_case(guard, true); });
    t.join();
  } else {
    rc = fiber_case(guard, false);
  }
  selfprof::stop();
  return rc;
}

// Runs child_run in a child (wl::run_in_child: its exit status, or -1 when killed after 60 s).
int run_in_child(const char* source, thread_case which) {
  return wl::run_in_child([=] { return child_run(source, which); }, 60000);
}

}  // namespace fiber_torture

using namespace fiber_torture;

TEST_CASE("torture: a fiber on a 64 KiB heap stack sampled at 999 Hz keeps its canary and its frames") {
  wl::apply_test_environment();
  const char* const sources[] = {"timer", "perf"};
  for (const char* source : sources) {
    if (std::strcmp(source, "perf") == 0 && wl::perf_disabled_by_environment()) {
      MESSAGE("perf_event source skipped (SELFPROF_TEST_NO_PERF=1)");
      continue;
    }
    const char* const names[] = {"the starting thread, with the program's alternate stack",
                                 "the starting thread, without one", "a thread started after start()"};
    for (thread_case which : {kProgramAltstack, kStartingThread, kNewThread}) {
      const int rc = run_in_child(source, which);
      INFO("source " << source << ", " << names[which] << ": exit status " << rc
                     << " (20: canary overwritten; 21/22: samples or frames missing; 11: source refused)");
      if (rc == 11 && std::strcmp(source, "perf") == 0) {
        MESSAGE("perf_event refused here: skipped");
        continue;
      }
      CHECK(rc == 0);
    }
  }
}
