// Every thread covered: threads created after start, 500 short threads at 1 kHz without leaks,
// register_thread() for immediate coverage, thread names, and threads that block the signal.
// ctest-labels: no_tsan
// Not under TSan: it defers asynchronous signals to its next safe point, so a deferred handler walks
// a stack that is no longer the interrupted one; and it kills children that start threads after fork.
#include <doctest/doctest.h>

#include <pthread.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <thread>
#include <vector>

#include "workload.hpp"

namespace {
selfprof::options opts(double hz) {
  selfprof::options o;
  o.hz = hz;
  return o;
}
}  // namespace

TEST_CASE("a thread created after start is found, sampled for its CPU time, and named") {
  wl::apply_test_environment();
  REQUIRE(selfprof::start(opts(99)));
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  pid_t tid = 0;
  std::int64_t cpu = 0;
  std::thread late([&] {
    pthread_setname_np(pthread_self(), "late-worker");
    tid = static_cast<pid_t>(gettid());
    std::int64_t c0 = wl::thread_cpu_ns();
    wl::run_rounds(1000000000LL);
    cpu = wl::thread_cpu_ns() - c0;
  });
  late.join();
  REQUIRE(selfprof::stop());
  selfprof::stats st = selfprof::get_stats();
  double got = double(st.samples_by_thread[static_cast<std::uint32_t>(tid)]);
  double expected = double(cpu) / 1e9 * 99;
  MESSAGE("late thread: " << got << " samples, expected about " << expected);
  // Found within one collector wake (20 ms), so at most a few samples of the start are missed.
  CHECK(got > expected * 0.85);
  CHECK(got < expected * 1.15);
  selfprof::profile p = selfprof::snapshot();
  CHECK(p.thread_name(static_cast<std::uint32_t>(tid)) == "late-worker");
}

TEST_CASE("while ticks arrive, the handler finds new threads and the collector sleeps") {
  wl::apply_test_environment();
  wl::signal_sources signals;  // the handler watches the thread count
  std::atomic<bool> done{false};
  std::thread busy([&] {
    while (!done.load()) wl::spin_units(1);
  });
  REQUIRE(selfprof::start(opts(99)));
  std::this_thread::sleep_for(std::chrono::seconds(2));
  selfprof::stats a = selfprof::get_stats();
  MESSAGE("2 s of one busy thread: " << a.records << " records, " << a.collector_wakes << " collector wakes, "
                                     << a.thread_checks << " thread-count checks in the handler");
  REQUIRE(a.records > 50);  // ticks arrive, so the handler watches the thread count
  CHECK(a.thread_checks > 10);
  // 500 ms periods while ticks arrive: about 4 wakes (a 50 ms period would make 40). A slower machine
  // makes fewer, never more.
  CHECK(a.collector_wakes <= 12);
  // Threads born one at a time: the handler sees the count change (the collector's own 500 ms scan
  // may come first for one of them, hardly for all five), and every one is armed.
  const std::size_t armed_before = a.threads_armed;
  std::vector<std::thread> late;
  for (int i = 0; i < 5; ++i) {
    late.emplace_back([&] {
      while (!done.load()) wl::spin_units(1);
    });
    auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (selfprof::get_stats().threads_armed < armed_before + i + 1 &&
           std::chrono::steady_clock::now() < deadline)
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  selfprof::stats b = selfprof::get_stats();
  done.store(true);
  busy.join();
  for (auto& t : late) t.join();
  REQUIRE(selfprof::stop());
  MESSAGE("5 new threads: " << b.thread_wakes << " handler wake-ups, armed " << armed_before << " -> "
                            << b.threads_armed);
  CHECK(b.threads_armed == armed_before + 5);
  CHECK(b.thread_wakes >= 1);
}

TEST_CASE("500 short threads at 1 kHz: no crash, no leaked descriptors or timers") {
  wl::apply_test_environment();
  int fds_before = wl::count_dir("/proc/self/fd");
  int timers_before = wl::count_posix_timers();
  REQUIRE(selfprof::start(opts(1000)));
  std::atomic<std::int64_t> short_cpu{0};
  for (int round = 0; round < 50; ++round) {
    std::vector<std::thread> ts;
    for (int i = 0; i < 10; ++i)
      ts.emplace_back([&short_cpu] {
        wl::spin_units(20);
        short_cpu += wl::thread_cpu_ns();
      });
    for (auto& t : ts) t.join();
  }
  selfprof::stats during = selfprof::get_stats();
  // Sampling goes on after the churn: 60 ms of CPU in this thread, armed from the start by every source.
  const std::int64_t t0 = wl::thread_cpu_ns();
  while (wl::thread_cpu_ns() - t0 < 60000000) wl::spin_units(1);
  const std::int64_t main_cpu = wl::thread_cpu_ns() - t0;
  REQUIRE(selfprof::stop());
  selfprof::stats st = selfprof::get_stats();
  CHECK(wl::count_dir("/proc/self/fd") == fds_before);
  CHECK(wl::count_posix_timers() == timers_before);
  CHECK(st.threads_armed == 0);
  const selfprof::profile p = selfprof::snapshot();
  const auto me = static_cast<std::uint32_t>(::syscall(SYS_gettid));
  std::uint64_t main_samples = 0, short_samples = 0;
  for (const auto& s : p.stacks)
    if (wl::count_frames(p, s, "spin_units")) (s.tid == me ? main_samples : short_samples) += s.count;
  const double period = double(p.info.period_ns);
  MESSAGE("source " << std::string(selfprof::source_name(st.source)) << ", threads seen "
                    << during.threads_seen << "; short threads: " << short_samples << " samples for "
                    << short_cpu / 1000000 << " ms of CPU; this thread after them: " << main_samples
                    << " samples for " << main_cpu / 1000000 << " ms; a sample stands for " << period / 1e6
                    << " ms");
  REQUIRE(period > 0);
  CHECK(double(main_samples) > double(main_cpu) / period * 0.5);
  // The ring follows every thread from its clone and the itimer counts the process's CPU time: the short
  // threads' time is in the profile. The per-thread signal sources find a new thread within 20 to 50 ms
  // (the handler's thread count, the collector's scan), after these 1 ms threads have ended.
  if (st.source == selfprof::source_kind::ring || st.source == selfprof::source_kind::itimer)
    CHECK(double(short_samples) > double(short_cpu) / period * 0.5);
  CHECK(during.threads_seen >= 2);
}

TEST_CASE("register_thread() arms the calling thread at once") {
  wl::apply_test_environment();
  selfprof::options o = opts(250);
  REQUIRE(selfprof::start(o));
  pid_t tid = 0;
  std::thread t([&] {
    tid = static_cast<pid_t>(gettid());
    REQUIRE(selfprof::register_thread());
    wl::run_rounds(60000000LL);  // 60 ms of CPU: shorter than a full scan period
  });
  t.join();
  REQUIRE(selfprof::stop());
  selfprof::stats st = selfprof::get_stats();
  double got = double(st.samples_by_thread[static_cast<std::uint32_t>(tid)]);
  MESSAGE("registered thread: " << got << " samples for 60 ms of CPU at 250 Hz");
  CHECK(got >= 10);
}

TEST_CASE("a thread that blocks the sampling signal is counted, and register_thread unblocks it") {
  wl::apply_test_environment();
  wl::signal_sources signals;  // the ring sends no signal to block
  REQUIRE(selfprof::start(opts(99)));
  std::atomic<int> phase{0};
  pid_t tid = 0;
  std::thread t([&] {
    tid = static_cast<pid_t>(gettid());
    sigset_t all;
    sigfillset(&all);
    pthread_sigmask(SIG_BLOCK, &all, nullptr);
    phase = 1;
    while (phase == 1) wl::spin_units(1);
    selfprof::register_thread();
    std::int64_t c0 = wl::thread_cpu_ns();
    while (wl::thread_cpu_ns() - c0 < 300000000LL) wl::spin_units(1);
    phase = 3;
  });
  while (phase != 1) std::this_thread::yield();
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  selfprof::stats blocked = selfprof::get_stats();
  CHECK(blocked.threads_blocking_signal >= 1);
  std::uint64_t before = blocked.samples_by_thread[static_cast<std::uint32_t>(tid)];
  CHECK(before == 0);
  phase = 2;
  t.join();
  REQUIRE(selfprof::stop());
  selfprof::stats st = selfprof::get_stats();
  CHECK(st.samples_by_thread[static_cast<std::uint32_t>(tid)] >= 15);
}

TEST_CASE("start and stop are idempotent and restartable; each start begins a new profile") {
  wl::apply_test_environment();
  REQUIRE(selfprof::start(opts(200)));
  REQUIRE(selfprof::start(opts(200)));
  wl::run_rounds(200000000LL);
  REQUIRE(selfprof::stop());
  REQUIRE(selfprof::stop());
  std::uint64_t first = selfprof::get_stats().samples;
  CHECK(first > 0);
  CHECK_FALSE(selfprof::running());
  REQUIRE(selfprof::start(opts(200)));
  CHECK(selfprof::running());
  wl::run_rounds(100000000LL);
  REQUIRE(selfprof::stop());
  std::uint64_t second = selfprof::get_stats().samples;
  CHECK(second > 0);
  CHECK(second < first);
}
