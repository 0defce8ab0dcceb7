// A CPU workload with a known split across three leaf functions reached at different stack depths
// (one of them more than 40 frames deep), and the helpers the integration tests share.
// Context: test code.
#pragma once

#include <dirent.h>
#include <linux/perf_event.h>
#include <signal.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include <selfprof.hpp>
#include <selfprof/core/profiler.hpp>  // the tests look at internals too (compiled mode included)

namespace wl {

// Keeps the compiler from turning calls into jumps (a tail call has no frame to find).
#define WL_NO_TAIL() __asm__ volatile("" ::: "memory")
// No inlining, no specialised clones: the names stay the plain ones.
#if defined(__clang__)
#define WL_NOINLINE __attribute__((noinline))
#else
#define WL_NOINLINE __attribute__((noipa))
#endif

inline std::int64_t thread_cpu_ns() {
  struct timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return std::int64_t(ts.tv_sec) * 1000000000 + ts.tv_nsec;
}
inline std::int64_t process_cpu_ns() {
  struct timespec ts;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return std::int64_t(ts.tv_sec) * 1000000000 + ts.tv_nsec;
}

WL_NOINLINE inline double spin_units(long units) {
  volatile double x = 1;
  for (long i = 0; i < units * 20000; ++i) x = x * 1.0000001 + 0.5;
  return x;
}

WL_NOINLINE inline double leaf_a(long u) {
  double r = spin_units(u);
  WL_NO_TAIL();
  return r;
}
WL_NOINLINE inline double leaf_b(long u) {
  double r = spin_units(u);
  WL_NO_TAIL();
  return r;
}
WL_NOINLINE inline double leaf_c(long u) {
  double r = spin_units(u);
  WL_NO_TAIL();
  return r;
}

constexpr int kDeepFrames = 45;  // leaf_b sits below this many frames of `deep`

WL_NOINLINE inline double deep(int n, long u) {
  double r = n == 0 ? leaf_b(u) : deep(n - 1, u);
  WL_NO_TAIL();
  return r;
}

// CPU time spent in each leaf, measured around each call on the calling thread: the truth.
struct truth {
  std::int64_t a = 0, b = 0, c = 0;
  std::int64_t total() const { return a + b + c; }
};

// Runs rounds of a:b:c = 6:3:1 units (each varied by one unit at random, so no period of the work can
// line up with the kernel tick) until `cpu_ns` of this thread's CPU time has passed.
WL_NOINLINE inline truth run_rounds(std::int64_t cpu_ns) {
  truth t;
  std::uint32_t rng = 12345u + static_cast<std::uint32_t>(thread_cpu_ns());
  auto jitter = [&rng](long base) {
    rng = rng * 1664525u + 1013904223u;
    return base - 1 + static_cast<long>((rng >> 16) % 3);
  };
  std::int64_t start = thread_cpu_ns();
  while (thread_cpu_ns() - start < cpu_ns) {
    std::int64_t t0 = thread_cpu_ns();
    leaf_a(jitter(6));
    std::int64_t t1 = thread_cpu_ns();
    deep(kDeepFrames, jitter(3));
    std::int64_t t2 = thread_cpu_ns();
    leaf_c(jitter(1));
    std::int64_t t3 = thread_cpu_ns();
    t.a += t1 - t0;
    t.b += t2 - t1;
    t.c += t3 - t2;
  }
  WL_NO_TAIL();
  return t;
}

// x86-64 machine code for the JIT tests: uint64_t f(uint64_t n) { s = 0; for (i = 0; i < n; ++i)
// s += i * k; return s; } with a frame pointer.
inline std::vector<unsigned char> emit_sum_by(std::int32_t k) {
  std::vector<unsigned char> c = {0x55, 0x48, 0x89, 0xe5, 0x31, 0xc0, 0x31, 0xc9, 0x48, 0x69, 0xd1};
  for (int i = 0; i < 4; ++i)
    c.push_back(static_cast<unsigned char>((static_cast<std::uint32_t>(k) >> (8 * i)) & 0xff));
  const unsigned char tail[] = {0x48, 0x01, 0xd0, 0x48, 0xff, 0xc1, 0x48, 0x39, 0xf9, 0x72, 0xee, 0x5d, 0xc3};
  c.insert(c.end(), tail, tail + sizeof tail);
  return c;
}

// Samples whose leaf frame's name contains `needle`.
inline std::uint64_t samples_with_leaf(const selfprof::profile& p, const std::string& needle) {
  std::uint64_t n = 0;
  for (const auto& s : p.stacks)
    if (!s.frames.empty() && p.frames[s.frames.back()].name.find(needle) != std::string::npos) n += s.count;
  return n;
}

inline std::uint64_t total_samples(const selfprof::profile& p) {
  std::uint64_t n = 0;
  for (const auto& s : p.stacks) n += s.count;
  return n;
}

inline std::size_t count_frames(const selfprof::profile& p, const selfprof::stack& s,
                                const std::string& needle) {
  std::size_t n = 0;
  for (auto f : s.frames)
    if (p.frames[f].name.find(needle) != std::string::npos) ++n;
  return n;
}

// A fresh directory under /tmp, removed with what it holds when the object goes.
struct temp_dir {
  std::string path;
  explicit temp_dir(const char* prefix = "selfprof-test") {
    std::string t = std::string("/tmp/") + prefix + "-XXXXXX";
    if (::mkdtemp(&t[0]) == nullptr) std::abort();
    path = t;
  }
  temp_dir(const temp_dir&) = delete;
  temp_dir& operator=(const temp_dir&) = delete;
  ~temp_dir() {
    const std::string cmd = "rm -rf '" + path + "'";
    int r = std::system(cmd.c_str());
    (void)r;
  }
  // The names of the files in it, sorted.
  std::vector<std::string> files() const {
    std::vector<std::string> out;
    if (DIR* d = ::opendir(path.c_str())) {
      while (dirent* e = ::readdir(d))
        if (e->d_name[0] != '.') out.push_back(e->d_name);
      ::closedir(d);
    }
    std::sort(out.begin(), out.end());
    return out;
  }
};

// A file the profiler wrote, whole: read_small_file's default limit (1 MiB) would cut a dump of deep
// stacks (under ASan, say), and the cut last line would fail the parse, not the profiler.
inline std::string read_output(const std::string& path) {
  return selfprof::detail::read_small_file(path, ~std::size_t(0));
}

inline int count_dir(const char* path) {
  int n = 0;
  if (DIR* d = opendir(path)) {
    while (dirent* e = readdir(d))
      if (e->d_name[0] != '.') ++n;
    closedir(d);
  }
  return n;
}

// Lines in /proc/self/timers that start a timer ("ID: n").
inline int count_posix_timers() {
  std::string s = selfprof::detail::read_small_file("/proc/self/timers");
  int n = 0;
  for (std::size_t at = s.find("ID:"); at != std::string::npos; at = s.find("ID:", at + 1)) ++n;
  return n;
}

// Tests make perf_event_open fail when SELFPROF_TEST_NO_PERF=1 (CI runs the suite that way too).
inline long failing_perf_event_open(void*, int, int, int, unsigned long) {
  errno = EACCES;
  return -1;
}
inline void apply_test_environment() {
  const char* v = std::getenv("SELFPROF_TEST_NO_PERF");
  if (v && std::string(v) == "1") selfprof::detail::sys().perf_event_open = failing_perf_event_open;
}

// The signal sources, as `auto` picks them where the ring source cannot open: for tests of the sampling
// handler, of the sampling signal and of `auto`'s fallbacks. While one lives, perf_event_open refuses
// the ring's events (the only ones that copy user stacks) and passes the others to what was there before
// (the real call, or the refusal of SELFPROF_TEST_NO_PERF=1).
inline long (*&perf_open_under_signal_sources())(void*, int, int, int, unsigned long) {
  static long (*next)(void*, int, int, int, unsigned long) = nullptr;
  return next;
}
inline long refuse_ring_events(void* attr, int pid, int cpu, int group, unsigned long flags) {
  if (static_cast<const perf_event_attr*>(attr)->sample_type & PERF_SAMPLE_STACK_USER) {
    errno = EACCES;
    return -1;
  }
  return perf_open_under_signal_sources()(attr, pid, cpu, group, flags);
}
struct signal_sources {
  signal_sources() {
    auto& open = selfprof::detail::sys().perf_event_open;
    if (open == refuse_ring_events) return;
    perf_open_under_signal_sources() = open;
    open = refuse_ring_events;
    owner = true;
  }
  ~signal_sources() {
    if (owner) selfprof::detail::sys().perf_event_open = perf_open_under_signal_sources();
  }
  signal_sources(const signal_sources&) = delete;
  signal_sources& operator=(const signal_sources&) = delete;
  bool owner = false;
};
// Runs `body` in a forked child and returns the status it exits with (100 + N when killed by signal N),
// or -1 when it had not ended after `timeout_ms` and was killed: a hang fails the test instead of
// hanging the suite.
template <typename F>
int run_in_child(F&& body, int timeout_ms = 60000) {
  std::fflush(nullptr);
  const pid_t child = fork();
  if (child == 0) _exit(body());
  if (child < 0) return -2;
  for (int waited_ms = 0; waited_ms < timeout_ms; waited_ms += 10) {
    int status = 0;
    if (waitpid(child, &status, WNOHANG) == child)
      return WIFEXITED(status) ? WEXITSTATUS(status) : 100 + WTERMSIG(status);
    usleep(10000);
  }
  kill(child, SIGKILL);
  waitpid(child, nullptr, 0);
  return -1;
}

inline bool perf_disabled_by_environment() {
  const char* v = std::getenv("SELFPROF_TEST_NO_PERF");
  return v && std::string(v) == "1";
}

}  // namespace wl
