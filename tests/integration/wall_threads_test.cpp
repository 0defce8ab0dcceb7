// Wall mode's cost is bounded whatever the number of threads: at most kWallThreadsPerTick looks per tick,
// so 512 idle threads cost the sampler about what 1 does per tick (the stated bound: at most 3x, plus
// 50 us; CPU time of the sampler thread, not wall-clock time), and every one of them is still seen.
// The per-tick cost is measured once every thread has had its first look (a /proc read and a stack
// copy, once per thread): that one-time cost is not per tick, and on a fast CPU it would dominate.
// ctest-labels: no_tsan
#include <doctest/doctest.h>

#include <pthread.h>

#include <condition_variable>
#include <mutex>
#include <set>
#include <thread>
#include <vector>

#include "integration/workload.hpp"

namespace {

struct idle_pool {
  std::mutex mu;
  std::condition_variable cv;
  bool done = false;
  std::vector<std::thread> threads;

  explicit idle_pool(int n) {
    for (int i = 0; i < n; ++i)
      threads.emplace_back([this] {
        std::unique_lock<std::mutex> l(mu);
        cv.wait(l, [this] { return done; });
      });
  }
  ~idle_pool() {
    {
      std::lock_guard<std::mutex> l(mu);
      done = true;
    }
    cv.notify_all();
    for (auto& t : threads) t.join();
  }
};

struct measured {
  double us_per_tick = 0;
  selfprof::stats stats;
  std::set<std::uint32_t> offcpu_threads;
};

void sleep_for_s(double seconds) {
  struct timespec d {
    0, 50000000
  };
  for (int i = 0; i < static_cast<int>(seconds * 20); ++i) nanosleep(&d, nullptr);
}

// `warmup` seconds for every thread's first look (at least n / kWallThreadsPerTick ticks), then
// `seconds` measured.
measured profile_idle(int n, double warmup, double seconds) {
  idle_pool pool(n);
  selfprof::options o;
  o.mode = selfprof::profile_mode::wall;
  o.dump_signal = 0;
  REQUIRE(selfprof::start(o));
  sleep_for_s(warmup);
  const selfprof::wall_stats before = selfprof::get_stats().wall;
  sleep_for_s(seconds);
  const selfprof::wall_stats after = selfprof::get_stats().wall;
  REQUIRE(selfprof::stop());
  measured m;
  m.stats = selfprof::get_stats();
  const std::uint64_t ticks = after.ticks - before.ticks;
  m.us_per_tick =
      static_cast<double>(after.cpu_ns - before.cpu_ns) / 1e3 / static_cast<double>(ticks ? ticks : 1);
  selfprof::profile p = selfprof::snapshot();
  for (const auto& s : p.stacks)
    if (s.offcpu && s.count > 0) m.offcpu_threads.insert(s.tid);
  return m;
}

}  // namespace

TEST_CASE("wall: 1, 64 and 512 idle threads: bounded looks per tick, every thread seen") {
  wl::apply_test_environment();
  measured one = profile_idle(1, 0.5, 1.5);
  measured many64 = profile_idle(64, 0.5, 1.5);
  measured many = profile_idle(512, 0.7, 1.5);  // 513 first looks at 16 per tick: ~33 ticks, 0.33 s
  for (auto* m : {&one, &many64, &many}) {
    const auto& w = m->stats.wall;
    MESSAGE(m->stats.threads_seen << " threads: " << w.ticks << " ticks, " << w.looks << " looks ("
                                  << w.unchanged << " unchanged, " << w.deferred << " deferred), "
                                  << m->us_per_tick
                                  << " us of sampler CPU per tick once every thread was seen");
    CHECK(w.ticks > 50);
    CHECK(w.looks <= w.ticks * selfprof::detail::kWallThreadsPerTick);
    CHECK(w.dropped == 0);
  }
  // All 512 pool threads (and the main thread) were looked at more than once: each has off-CPU time.
  CHECK(many.offcpu_threads.size() >= 513);
  CHECK(many64.offcpu_threads.size() >= 65);
  CHECK(many.stats.wall.deferred > 0);
  // Idle threads are the cheap case: nearly every look finds the CPU clock unmoved.
  CHECK(many.stats.wall.unchanged * 10 > many.stats.wall.looks * 8);
  CHECK(many.us_per_tick <= 3 * one.us_per_tick + 50);
}
