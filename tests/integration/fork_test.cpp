// fork() while profiling: the child starts clean and stopped (no inherited ticks that would kill it,
// no deadlock on the collector's locks), may start again; the parent keeps sampling.
// ctest-labels: no_tsan no_asan
// Not under ASan: its own consistency CHECK (asan_thread.cpp, stack frame magic) fails in a child that
// samples itself after a fork of a busy multi-threaded parent; open, see the issue note.
// Not under TSan: it defers asynchronous signals to its next safe point, so a deferred handler walks
// a stack that is no longer the interrupted one; and it kills children that start threads after fork.
#include <doctest/doctest.h>

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <thread>

#include "workload.hpp"

namespace {
// The child's exit status, 1000 + N when killed by signal N, or -1 when it had not ended after two minutes
// (killed then): a hang fails the test instead of hanging the suite.
int wait_child(pid_t pid) {
  for (int waited_ms = 0; waited_ms < 120000; waited_ms += 10) {
    int status = 0;
    const pid_t got = waitpid(pid, &status, WNOHANG);
    if (got == pid) return WIFSIGNALED(status) ? 1000 + WTERMSIG(status) : WEXITSTATUS(status);
    if (got < 0) return -2;
    usleep(10000);
  }
  kill(pid, SIGKILL);
  waitpid(pid, nullptr, 0);
  return -1;
}
}  // namespace

TEST_CASE("fork while four threads are sampled: the child is stopped, clean, and can profile itself") {
  wl::apply_test_environment();
  selfprof::options o;
  o.hz = 1000;  // perf_event as root: the child must not keep the parent's events
  REQUIRE(selfprof::start(o));
  std::atomic<bool> done{false};
  std::vector<std::thread> ts;
  for (int i = 0; i < 3; ++i)
    ts.emplace_back([&] {
      while (!done) wl::spin_units(5);
    });
  wl::run_rounds(100000000LL);
  pid_t pid = fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    // Child: one thread. Spinning with no ticks armed: a stray tick would now hit SIG_DFL and kill us.
    if (selfprof::running()) _exit(2);
    std::int64_t c0 = wl::thread_cpu_ns();
    while (wl::thread_cpu_ns() - c0 < 200000000LL) wl::spin_units(5);
    if (selfprof::get_stats().samples != 0) _exit(3);
    if (selfprof::get_stats().process_cpu_ns != 0 || selfprof::get_stats().own_cpu_ns != 0) _exit(8);
    selfprof::options again;
    again.hz = 250;
    if (!selfprof::start(again)) _exit(4);
    wl::run_rounds(300000000LL);
    if (!selfprof::stop()) _exit(5);
    selfprof::profile p = selfprof::snapshot();
    if (wl::total_samples(p) < 30) _exit(6);
    if (wl::samples_with_leaf(p, "spin_units") == 0) _exit(7);
    _exit(0);
  }
  wl::run_rounds(200000000LL);
  int child = wait_child(pid);
  CHECK(child == 0);
  std::uint64_t before = selfprof::get_stats().samples;
  wl::run_rounds(200000000LL);
  done = true;
  for (auto& t : ts) t.join();
  REQUIRE(selfprof::stop());
  CHECK(selfprof::get_stats().samples > before);
}

TEST_CASE("twenty forks in a row while sampling at 1 kHz: no deadlock, every child exits cleanly") {
  wl::apply_test_environment();
  selfprof::options o;
  o.hz = 1000;
  REQUIRE(selfprof::start(o));
  std::atomic<bool> done{false};
  std::thread busy([&] {
    while (!done) wl::spin_units(5);
  });
  int failures = 0;
  for (int i = 0; i < 20; ++i) {
    pid_t pid = fork();
    REQUIRE(pid >= 0);
    if (pid == 0) {
      wl::spin_units(50);
      _exit(selfprof::running() ? 1 : 0);
    }
    if (wait_child(pid) != 0) ++failures;
    wl::spin_units(20);
  }
  done = true;
  busy.join();
  REQUIRE(selfprof::stop());
  CHECK(failures == 0);
  CHECK(selfprof::get_stats().samples > 0);
}

TEST_CASE("a fork while another thread is inside the handler: the child can still start and stop") {
  wl::apply_test_environment();
  selfprof::options o;
  o.hz = 250;
  REQUIRE(selfprof::start(o));
  // What a thread caught in the middle of a sample at fork time leaves behind: an in-flight count of
  // a handler that will never finish in the child.
  selfprof::detail::g_handler.in_flight.fetch_add(1);
  std::fflush(nullptr);
  pid_t pid = fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    alarm(60);  // a hang in stop() would otherwise hang the test
    selfprof::options again;
    again.hz = 250;
    if (!selfprof::start(again)) _exit(4);
    wl::run_rounds(100000000LL);
    if (!selfprof::stop()) _exit(5);
    _exit(0);
  }
  selfprof::detail::g_handler.in_flight.fetch_sub(1);
  CHECK(wait_child(pid) == 0);
  REQUIRE(selfprof::stop());
}
