// Torture: an application signal handler that siglongjmp()s out (the timeout idiom) 5,000 times a second
// while selfprof samples at 999 Hz. Its signal used to interrupt selfprof's handler and jump out of it,
// leaving `in_flight` raised (stop() then never returned) or a perf event un-refreshed (sampling
// stopped). selfprof's handlers now block every signal while they run, and stop() waits a bounded time:
// sampling goes on to the end and stop() returns (issue 15, item 2).
// ctest-labels: no_tsan
// Not under TSan: it defers asynchronous signals to its next safe point.
#include <doctest/doctest.h>

#include <setjmp.h>
#include <signal.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstdlib>

#include "../integration/workload.hpp"

namespace longjmp_handler {

sigjmp_buf g_jump;
volatile sig_atomic_t g_armed = 0;

void jump_out(int) {
  if (!g_armed) return;
  g_armed = 0;  // the jump buffer is good for one jump: its frame is gone after it
  siglongjmp(g_jump, 1);
}

std::uint64_t total(const selfprof::profile& p) { return wl::total_samples(p); }

// Hot work until the application's SIGALRM handler jumps out of it; 1 when it did.
__attribute__((noinline)) std::uint64_t work_until_jump() {
  static volatile std::uint64_t sink = 0;
  if (sigsetjmp(g_jump, 1) != 0) return 1;
  g_armed = 1;
  for (std::uint64_t i = 0; i < 2000000; ++i) sink = sink + i * 7;
  g_armed = 0;
  return 0;
}

// The child: returns its exit status. 0: sampling survived both halves and stop() returned.
int child_run(const char* source) {
  if (source != nullptr) setenv("SELFPROF_SOURCE", source, 1);
  struct sigaction act {};
  act.sa_handler = jump_out;
  sigemptyset(&act.sa_mask);
  if (sigaction(SIGALRM, &act, nullptr) != 0) return 10;
  selfprof::options o = selfprof::options_from_env();
  o.hz = 999;
  if (!selfprof::start(o)) return 11;
  struct itimerval every {
    {0, 200}, { 0, 200 }
  };
  if (setitimer(ITIMER_REAL, &every, nullptr) != 0) return 12;
  std::uint64_t half = 0;
  std::uint64_t jumps = 0;
  const auto start = std::chrono::steady_clock::now();
  while (std::chrono::steady_clock::now() - start < std::chrono::milliseconds(2000)) {
    if (half == 0 && std::chrono::steady_clock::now() - start > std::chrono::milliseconds(1000)) {
      half = total(selfprof::snapshot());
      if (half == 0) half = 1;
    }
    jumps += work_until_jump();
  }
  g_armed = 0;
  struct itimerval off {};
  setitimer(ITIMER_REAL, &off, nullptr);
  const std::uint64_t all = total(selfprof::snapshot());
  selfprof::stop();                      // must return: the parent kills a child that hangs
  if (jumps < 1000) return 13;           // the application's jumps did happen
  if (half <= 1) return 14;              // samples in the first second
  if (all < half + half / 4) return 15;  // and in the second: sampling did not stop
  return 0;
}

// Runs child_run in a child (wl::run_in_child: its exit status, or -1 when killed after 30 s).
int run_in_child(const char* source) {
  return wl::run_in_child([=] { return child_run(source); }, 30000);
}

}  // namespace longjmp_handler

using namespace longjmp_handler;

TEST_CASE("torture: an application handler that siglongjmps out 5,000 times a second") {
  wl::apply_test_environment();
  const int timer = run_in_child("timer");
  INFO("exit status (timer source): " << timer << " (-1 hung in stop(); 14/15 sampling stopped)");
  CHECK(timer == 0);
  if (wl::perf_disabled_by_environment()) {
    MESSAGE("perf_event source skipped (SELFPROF_TEST_NO_PERF=1)");
    return;
  }
  const int perf = run_in_child("perf");
  INFO("exit status (perf source): " << perf);
  CHECK((perf == 0 || perf == 11));  // 11: perf_event_open refused here
}
