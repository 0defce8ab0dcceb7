// The cost of SELFPROF_MODE=wall with 1, 64 and 512 mostly idle threads (not a test: nothing asserts).
//
//   g++ -std=c++17 -O2 -g -fno-omit-frame-pointer -Iinclude bench/wall_overhead.cpp -o /tmp/bench_wall
//   -pthread /tmp/bench_wall [--seconds S] [--repeats N] [--hz HZ]
//
// For each thread count, one busy thread computes a fixed amount of work while the idle threads wait on
// a condition variable. Blocks alternate unprofiled / wall mode, in the same run; a block's cost is the
// process CPU time (every thread, selfprof's included) over its wall time. Printed: the median extra CPU
// of wall mode in % of one core, the sampler's own CPU per tick, and how much slower the busy work ran.
#include <selfprof.hpp>

#include <algorithm>
#include <cmath>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace {

double clock_s(clockid_t c) {
  struct timespec ts;
  clock_gettime(c, &ts);
  return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) / 1e9;
}

__attribute__((noinline)) double busy_work(long units) {
  double x = 0;
  for (long i = 1; i <= units; ++i) x += std::sqrt(static_cast<double>(i % 4096));
  return x;
}

struct idle_threads {
  std::mutex mu;
  std::condition_variable cv;
  bool done = false;
  std::vector<std::thread> threads;
  explicit idle_threads(int n) {
    for (int i = 0; i < n; ++i)
      threads.emplace_back([this] {
        std::unique_lock<std::mutex> l(mu);
        cv.wait(l, [this] { return done; });
      });
  }
  ~idle_threads() {
    {
      std::lock_guard<std::mutex> l(mu);
      done = true;
    }
    cv.notify_all();
    for (auto& t : threads) t.join();
  }
};

struct block {
  double cpu_s = 0, wall_s = 0, busy_s = 0, sampler_us_per_tick = 0;
};

volatile double sink;

block run_block(long units, bool profiled, double hz) {
  block b;
  double c0 = clock_s(CLOCK_PROCESS_CPUTIME_ID), w0 = clock_s(CLOCK_MONOTONIC);
  if (profiled) {
    selfprof::options o;
    o.mode = selfprof::profile_mode::wall;
    o.hz = hz;
    o.dump_signal = 0;
    if (!selfprof::start(o)) std::exit(1);
  }
  double t0 = clock_s(CLOCK_MONOTONIC);
  sink = busy_work(units);
  b.busy_s = clock_s(CLOCK_MONOTONIC) - t0;
  if (profiled) {
    selfprof::stop();
    selfprof::stats s = selfprof::get_stats();
    b.sampler_us_per_tick =
        static_cast<double>(s.wall.cpu_ns) / 1e3 / static_cast<double>(s.wall.ticks ? s.wall.ticks : 1);
  }
  b.cpu_s = clock_s(CLOCK_PROCESS_CPUTIME_ID) - c0;
  b.wall_s = clock_s(CLOCK_MONOTONIC) - w0;
  return b;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  double seconds = 2, hz = 99;
  int repeats = 5;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!std::strcmp(argv[i], "--seconds")) seconds = std::atof(argv[i + 1]);
    if (!std::strcmp(argv[i], "--repeats")) repeats = std::atoi(argv[i + 1]);
    if (!std::strcmp(argv[i], "--hz")) hz = std::atof(argv[i + 1]);
  }
  // Calibrate the busy work to about `seconds`.
  double t0 = clock_s(CLOCK_MONOTONIC);
  sink = busy_work(20000000);
  long units = static_cast<long>(20000000 * seconds / (clock_s(CLOCK_MONOTONIC) - t0));
  std::printf("wall mode at %g Hz, %d repeats of ~%g s of busy work per block\n", hz, repeats, seconds);
  std::printf("%8s %16s %18s %16s\n", "threads", "extra CPU (%)", "sampler us/tick", "busy slowdown");
  for (int n : {1, 64, 512}) {
    idle_threads idle(n);
    std::vector<double> extra, per_tick, slowdown;
    for (int r = 0; r < repeats; ++r) {
      block base = run_block(units, false, hz);
      block prof = run_block(units, true, hz);
      extra.push_back(100 * (prof.cpu_s / prof.wall_s - base.cpu_s / base.wall_s));
      per_tick.push_back(prof.sampler_us_per_tick);
      slowdown.push_back(prof.busy_s / base.busy_s);
    }
    std::printf("%8d %16.2f %18.1f %16.4f\n", n, median(extra), median(per_tick), median(slowdown));
  }
  return 0;
}
