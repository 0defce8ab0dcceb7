// What each part of a perf_event sample costs the sampled thread: a task-clock sampling event on this
// thread at a high rate, its ring drained as the loop runs, with sample_type growing from IP|TID|TIME to
// + the call chain (the kernel walks the user frame pointers), + REGS_USER|STACK_USER (a copy of the user
// stack, as perf record --call-graph dwarf asks), both (what selfprof's ring source asks), and the copy
// with only the kernel part of the chain (exclude_callchain_user, as dwarf asks). The loop runs at the
// bottom of a frame-pointer recursion of DEPTH frames. Prints the thread's CPU per configuration against
// the first, alternated over REPEATS; not a test (nothing asserts on time).
// Context: benchmark program (bench/README.md).
//
// Usage: bench_sample_parts [DEPTH 45] [REPEATS 5] [ITERATIONS 600000000] [STACK_BYTES 8192] [HZ 10000]
#include <linux/perf_event.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace {

double thread_cpu_s() {
  struct timespec ts {};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return double(ts.tv_sec) + double(ts.tv_nsec) / 1e9;
}

volatile std::uint64_t g_sink;

__attribute__((noinline)) std::uint64_t spin(long n) {
  std::uint64_t x = 0;
  for (long i = 0; i < n; ++i) {
    x += static_cast<std::uint64_t>(i) * static_cast<std::uint64_t>(i);
    __asm__ volatile("" : "+r"(x));
  }
  return x;
}

__attribute__((noinline)) std::uint64_t deep(int d, long n) {
  if (d == 0) return spin(n);
  std::uint64_t r = deep(d - 1, n);
  __asm__ volatile("" : "+r"(r));  // not a tail call: every level keeps its frame
  return r + 1;
}

enum parts : unsigned { chain = 1, copy = 2, kernel_chain_only = 4 };

struct config {
  const char* name;
  int parts;  // -1: no event at all
};

int open_event(unsigned p, unsigned stack_bytes, double hz) {
  struct perf_event_attr a;
  std::memset(&a, 0, sizeof a);
  a.size = sizeof a;
  a.type = PERF_TYPE_SOFTWARE;
  a.config = PERF_COUNT_SW_TASK_CLOCK;
  a.sample_period = static_cast<std::uint64_t>(1e9 / hz);
  a.sample_type = PERF_SAMPLE_IP | PERF_SAMPLE_TID | PERF_SAMPLE_TIME;
  if (p & chain) a.sample_type |= PERF_SAMPLE_CALLCHAIN;
  if (p & copy) {
    a.sample_type |= PERF_SAMPLE_REGS_USER | PERF_SAMPLE_STACK_USER;
    a.sample_regs_user = (1u << 6) | (1u << 7) | (1u << 8);  // bp, sp, ip
    a.sample_stack_user = stack_bytes;
  }
  if (p & kernel_chain_only) a.exclude_callchain_user = 1;
  a.exclude_hv = 1;
  a.watermark = 1;
  a.wakeup_watermark = 1u << 30;  // nobody polls
  return static_cast<int>(syscall(SYS_perf_event_open, &a, 0, -1, -1, PERF_FLAG_FD_CLOEXEC));
}

}  // namespace

int main(int argc, char** argv) {
  const int depth = argc > 1 ? std::atoi(argv[1]) : 45;
  const int repeats = argc > 2 ? std::atoi(argv[2]) : 5;
  const long iterations = argc > 3 ? std::atol(argv[3]) : 600000000L;
  const unsigned stack_bytes = argc > 4 ? static_cast<unsigned>(std::atoi(argv[4])) : 8192;
  const double hz = argc > 5 ? std::atof(argv[5]) : 10000;
  const config configs[] = {{"no event", -1},
                            {"IP|TID|TIME", 0},
                            {"+ call chain", chain},
                            {"+ stack copy", copy},
                            {"+ call chain + stack copy", chain | copy},
                            {"+ stack copy + kernel chain only", chain | copy | kernel_chain_only}};
  constexpr int n = sizeof configs / sizeof configs[0];
  double total[n] = {};
  constexpr std::size_t kPages = 256;  // data pages: the ring is drained every 1/400 of the loop
  const std::size_t len = (kPages + 1) * 4096;
  for (int r = 0; r < repeats; ++r) {
    for (int k = 0; k < n; ++k) {
      const int c = r % 2 ? n - 1 - k : k;  // alternate the order
      int fd = -1;
      void* ring = nullptr;
      if (configs[c].parts >= 0) {
        fd = open_event(static_cast<unsigned>(configs[c].parts), stack_bytes, hz);
        if (fd < 0) {
          std::perror("perf_event_open");
          return 1;
        }
        ring = mmap(nullptr, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
        if (ring == MAP_FAILED) {
          std::perror("mmap");
          return 1;
        }
      }
      const double c0 = thread_cpu_s();
      for (int i = 0; i < 400; ++i) {
        g_sink = g_sink + deep(depth, iterations / 400);
        if (ring) {  // drop what was written: the kernel never finds the ring full
          auto* head = static_cast<perf_event_mmap_page*>(ring);
          __atomic_store_n(&head->data_tail, __atomic_load_n(&head->data_head, __ATOMIC_ACQUIRE),
                           __ATOMIC_RELEASE);
        }
      }
      total[c] += thread_cpu_s() - c0;
      if (ring) munmap(ring, len);
      if (fd >= 0) close(fd);
    }
  }
  std::printf(
      "| sample_type, %g Hz, depth %d, copy %u bytes | thread CPU, s | against IP|TID|TIME | per sample, us "
      "|\n",
      hz, depth, stack_bytes);
  std::printf("|---|---|---|---|\n");
  for (int k = 0; k < n; ++k) {
    const double s = total[k] / repeats, base = total[1] / repeats, none = total[0] / repeats;
    std::printf("| %s | %.4f | %+.1f%% | %.2f |\n", configs[k].name, s, 100 * (s / base - 1),
                k == 0 ? 0.0 : (s - none) / (none * hz) * 1e6);
  }
  return 0;
}
