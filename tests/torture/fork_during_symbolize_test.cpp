// Torture: fork() while another thread is naming frames for a dump. fork() used to wait for the whole
// symbolization (seconds for a large program) because selfprof takes its locks before a fork; now it
// waits only briefly for the symbolizer, and a child that did not get it starts with a fresh one that
// works (issue 15, smaller items). The long symbolization is stood for by a thread that holds the
// symbolizer's lock until the fork returned (a watchdog releases it after 10 s and fails the test).
// ctest-labels: no_tsan
// Not under TSan: it kills children that start threads after fork.
#include <doctest/doctest.h>

#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <thread>

#include "../integration/workload.hpp"

TEST_CASE("torture: fork() while the symbolizer is busy returns, and the child can profile and name frames") {
  wl::apply_test_environment();
  selfprof::options o;
  o.hz = 250;
  REQUIRE(selfprof::start(o));
  wl::run_rounds(50000000LL);
  auto& core = selfprof::detail::profiler_core::instance();

  std::mutex mu;
  std::condition_variable cv;
  bool holding = false, forked = false, by_watchdog = false;
  std::thread busy([&] {
    core.symbols().locked([&] {
      std::unique_lock<std::mutex> lock(mu);
      holding = true;
      cv.notify_all();
      by_watchdog = !cv.wait_for(lock, std::chrono::seconds(10), [&] { return forked; });
    });
  });
  {
    std::unique_lock<std::mutex> lock(mu);
    cv.wait(lock, [&] { return holding; });
  }
  std::fflush(nullptr);
  const pid_t child = fork();
  if (child == 0) {
    // The child: a new session whose profile names this test's own functions.
    selfprof::stop();
    selfprof::options c;
    c.hz = 499;
    if (!selfprof::start(c)) _exit(3);
    wl::run_rounds(200000000LL);
    selfprof::profile p = selfprof::snapshot();
    selfprof::stop();
    std::uint64_t named = 0;  // samples under the workload's leaf_a/b/c, named by the fresh symbolizer
    for (const auto& st : p.stacks)
      if (wl::count_frames(p, st, "leaf_") > 0) named += st.count;
    _exit(named > 0 ? 0 : 4);
  }
  {
    std::lock_guard<std::mutex> lock(mu);
    forked = true;
  }
  cv.notify_all();
  busy.join();
  REQUIRE(child > 0);
  int status = 0;
  REQUIRE(waitpid(child, &status, 0) == child);
  CHECK_FALSE(by_watchdog);  // fork() returned while the symbolizer was still held
  CHECK(WIFEXITED(status));
  CHECK(WEXITSTATUS(status) == 0);
  selfprof::stop();
}
