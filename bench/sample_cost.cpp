// Sample-cost benchmark: what one sample costs in nanoseconds at stack depths 16, 64 and 128 — the
// handler's work (frame-pointer walk + ring claim/publish) on a real recursive stack, the whole handler
// function, and the full signal round trip (tgkill to self) with an empty handler and with selfprof's.
// Context: benchmark program (not a test; see bench/README.md for the figures and how to run it).
#include <signal.h>
#include <sys/syscall.h>
#include <time.h>
#include <ucontext.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include <selfprof.hpp>
#include <selfprof/detail/process.hpp>
#include <selfprof/signal/handler.hpp>
#include <selfprof/unwind/tables.hpp>

namespace sc {

#define SC_NO_TAIL() __asm__ volatile("" ::: "memory")
#if defined(__clang__)
#define SC_NOINLINE __attribute__((noinline))
#else
#define SC_NOINLINE __attribute__((noipa))
#endif

namespace d = selfprof::detail;

std::int64_t now_ns() {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return std::int64_t(ts.tv_sec) * 1000000000 + ts.tv_nsec;
}

// The least disturbed of the repeats: on a shared VM other processes only ever add time.
double best(const std::vector<double>& v) { return v.empty() ? 0 : *std::min_element(v.begin(), v.end()); }

// Runs `fn` at the bottom of `n` extra recursive frames.
using bottom_fn = void (*)(void*);
SC_NOINLINE int descend(int n, bottom_fn fn, void* arg) {
  if (n > 0) {
    int r = descend(n - 1, fn, arg);
    SC_NO_TAIL();
    return r + 1;
  }
  fn(arg);
  SC_NO_TAIL();
  return 0;
}

constexpr std::size_t kMaxDepth = 128;  // selfprof's default SELFPROF_MAX_DEPTH
constexpr std::size_t kRingSlots = 1024;

struct ring_holder {
  std::vector<std::uint64_t> memory;
  d::sample_ring ring;
  ring_holder() {
    memory.assign(kRingSlots * d::sample_ring::stride_for(kMaxDepth) / 8, 0);
    ring.init(memory.data(), kRingSlots, kMaxDepth);
  }
};

struct job {
  bool mixed = false;  // unwind_interrupted (CFI rows when published) instead of unwind_live without tables
  long iterations = 0;
  int reps = 7;
  std::vector<double> ns;  // per iteration, one entry per rep
  std::size_t depth = 0;
  bool truncated = false;
  ring_holder* rh = nullptr;
};

// The in-handler work, outside a signal: read the context, claim a slot, walk (frame pointers, or the
// mixed CFI walker the handler uses), fill the header,
// publish — plus the consumer's release so the ring never fills.
void unwind_loop(void* arg) {
  job& j = *static_cast<job*>(arg);
  ucontext_t uc;
  getcontext(&uc);
  const std::uintptr_t pc = static_cast<std::uintptr_t>(uc.uc_mcontext.gregs[REG_RIP]);
  const std::uintptr_t sp = static_cast<std::uintptr_t>(uc.uc_mcontext.gregs[REG_RSP]);
  const std::uintptr_t fp = static_cast<std::uintptr_t>(uc.uc_mcontext.gregs[REG_RBP]);
  const std::uintptr_t end = d::current_thread_stack_end(sp, d::main_stack_end(), true);
  d::sample_ring& ring = j.rh->ring;
  for (int rep = 0; rep < j.reps; ++rep) {
    std::int64_t t0 = now_ns();
    for (long i = 0; i < j.iterations; ++i) {
      std::uint64_t pos = 0;
      d::ring_slot* slot = ring.claim(pos);
      d::unwind_result u = j.mixed ? d::unwind_interrupted(pc, sp, fp, end, slot->pcs(), kMaxDepth)
                                   : d::unwind_live(nullptr, pc, sp, fp, end, slot->pcs(), kMaxDepth);
      slot->header.depth = static_cast<std::uint16_t>(u.depth);
      slot->header.flags = u.truncated ? 1 : 0;
      slot->header.weight = 1;
      d::sample_ring::publish(slot, pos);
      j.depth = u.depth;
      j.truncated = u.truncated;
      ring.release(ring.peek());
    }
    j.ns.push_back(double(now_ns() - t0) / double(j.iterations));
  }
}

// selfprof's whole handler function, called directly with a captured context (no signal delivery).
void handler_loop(void* arg) {
  job& j = *static_cast<job*>(arg);
  ucontext_t uc;
  getcontext(&uc);
  siginfo_t info;
  std::memset(&info, 0, sizeof info);
  info.si_code = SI_TIMER;
  info.si_value.sival_ptr = d::timer_cookie();
  d::sample_ring& ring = j.rh->ring;
  for (int rep = 0; rep < j.reps; ++rep) {
    std::int64_t t0 = now_ns();
    for (long i = 0; i < j.iterations; ++i) {
      d::sample_signal_handler(SIGPROF, &info, &uc);
      d::ring_slot* s = ring.peek();
      j.depth = s->header.depth;
      ring.release(s);
    }
    j.ns.push_back(double(now_ns() - t0) / double(j.iterations));
  }
}

// Signals to self: the handler runs on return from tgkill, on top of this stack.
void tgkill_loop(void* arg) {
  job& j = *static_cast<job*>(arg);
  const long pid = getpid(), tid = static_cast<long>(d::raw_gettid());
  for (int rep = 0; rep < j.reps; ++rep) {
    std::int64_t t0 = now_ns();
    for (long i = 0; i < j.iterations; ++i) d::raw_syscall3(SYS_tgkill, pid, tid, SIGPROF);
    j.ns.push_back(double(now_ns() - t0) / double(j.iterations));
  }
}

void empty_handler(int, siginfo_t*, void*) {}

// Presents a tgkill delivery as one of selfprof's timer ticks (selfprof ignores kill/tgkill senders).
std::size_t g_depth_seen = 0;
void selfprof_handler(int sig, siginfo_t* info, void* ctx) {
  siginfo_t as_tick = *info;
  as_tick.si_code = SI_TIMER;
  as_tick.si_value.sival_ptr = d::timer_cookie();
  as_tick.si_overrun = 0;
  d::sample_signal_handler(sig, &as_tick, ctx);
  d::sample_ring* ring = d::g_handler.ring.load(std::memory_order_relaxed);
  if (d::ring_slot* s = ring->peek()) {  // the consumer's side, so the ring never fills
    g_depth_seen = s->header.depth;
    ring->release(s);
  }
}

void set_handler(void (*h)(int, siginfo_t*, void*)) {
  struct sigaction a {};
  if (h) {
    a.sa_sigaction = h;
    a.sa_flags = SA_SIGINFO | SA_RESTART;
  } else {
    a.sa_handler = SIG_IGN;
  }
  sigemptyset(&a.sa_mask);
  sigaction(SIGPROF, &a, nullptr);
}

double time_loop(long iterations, void (*body)()) {
  std::vector<double> v;
  for (int rep = 0; rep < 7; ++rep) {
    std::int64_t t0 = now_ns();
    for (long i = 0; i < iterations; ++i) body();
    v.push_back(double(now_ns() - t0) / double(iterations));
  }
  return best(v);
}

}  // namespace sc

int main(int argc, char** argv) {
  using namespace sc;
  long iterations = argc > 1 ? std::atol(argv[1]) : 200000;
  if (iterations < 1) iterations = 1;
  ring_holder rh;

  // What the handler's pieces cost on this machine: each is a system call or a vDSO read.
  static std::uintptr_t probe_addr = reinterpret_cast<std::uintptr_t>(&rh);
  double readable_ns = time_loop(iterations, [] { (void)d::raw_readable(probe_addr); });
  double gettid_ns = time_loop(iterations, [] { (void)d::raw_gettid(); });
  double clock_ns = time_loop(iterations, [] {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
  });
  std::printf(
      "# pieces: raw_readable (rt_sigprocmask probe) %.0f ns, raw_gettid %.0f ns, clock_gettime(MONOTONIC) "
      "%.0f ns\n",
      readable_ns, gettid_ns, clock_ns);
  std::printf("# %ld iterations x 7 repeats per figure, the fastest repeat; max_depth %zu\n", iterations,
              kMaxDepth);
  // The CFI rows the handler follows when selfprof runs (parsed from .eh_frame off the signal path).
  selfprof::status tables = selfprof::build_unwind_tables();
  std::printf("# CFI tables: %s\n", tables ? "published" : tables.message().c_str());
  std::printf(
      "| depth | walked | fp walk + ring, ns | CFI walk + ring, ns | handler function, ns | tgkill round "
      "trip, "
      "empty handler, ns | tgkill round trip, selfprof handler, ns | handler inside a signal, ns |\n");
  std::printf("|---|---|---|---|---|---|---|---|\n");

  // The whole handler needs selfprof's globals pointed at our ring (no profiler runs in this process).
  d::g_handler.ring.store(&rh.ring);
  d::g_handler.main_tid.store(static_cast<std::uint32_t>(getpid()));
  d::g_handler.main_stack_end.store(d::main_stack_end());
  d::g_handler.active.store(true);

  // Frames the unwinder sees at the bottom of descend(0) called from here; every loop below runs there.
  job probe;
  probe.iterations = 1;
  probe.reps = 1;
  probe.rh = &rh;
  descend(0, &unwind_loop, &probe);
  const int base_depth = static_cast<int>(probe.depth);

  for (std::size_t depth : {std::size_t(16), std::size_t(64), std::size_t(128)}) {
    int extra = std::max(0, static_cast<int>(depth) - base_depth);
    job unwind;
    unwind.iterations = iterations;
    unwind.rh = &rh;
    descend(extra, &unwind_loop, &unwind);

    job cfi;
    cfi.mixed = true;
    cfi.iterations = iterations;
    cfi.rh = &rh;
    descend(extra, &unwind_loop, &cfi);

    job handler;
    handler.iterations = iterations;
    handler.rh = &rh;
    descend(extra, &handler_loop, &handler);

    long sig_iterations = std::max(1L, iterations / 4);
    job empty;
    empty.iterations = sig_iterations;
    set_handler(&empty_handler);
    descend(extra, &tgkill_loop, &empty);

    job full;
    full.iterations = sig_iterations;
    set_handler(&selfprof_handler);
    g_depth_seen = 0;
    descend(extra, &tgkill_loop, &full);
    set_handler(nullptr);

    char walked[32];
    std::snprintf(walked, sizeof walked, "%zu%s", unwind.depth, unwind.truncated ? " (cut)" : "");
    double e = best(empty.ns), f = best(full.ns);
    std::printf("| %zu | %s | %.0f | %.0f | %.0f | %.0f | %.0f | %.0f |\n", depth, walked, best(unwind.ns),
                best(cfi.ns), best(handler.ns), e, f, f - e);
    if (cfi.depth != unwind.depth || handler.depth != unwind.depth || g_depth_seen + 1 < unwind.depth)
      std::printf(
          "# note: frames found by the fp walk %zu, CFI walk %zu, handler %zu, handler in a signal %zu\n",
          unwind.depth, cfi.depth, std::size_t(handler.depth), g_depth_seen);
  }
  d::g_handler.active.store(false);
  d::g_handler.ring.store(nullptr);
  selfprof::release_unwind_tables();
  std::printf(
      "# tgkill empty: send + deliver + sigreturn of one signal with an empty handler; tgkill selfprof: the\n"
      "# same with selfprof's handler (the difference is the handler's cost inside a signal).\n");
  return 0;
}
