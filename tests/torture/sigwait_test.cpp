// Torture: a program that waits for a signal with sigwait() must get every one it is sent, and none of
// selfprof's ticks: selfprof never picks a sampling signal the starting thread blocks, and a thread that
// blocks the sampling signal is not armed and keeps its mask when the preload library arms new threads
// (issue 15, item 10). Each case runs in a child process.
// ctest-labels: no_tsan
// Not under TSan: it defers asynchronous signals, and kills children that start threads after fork.
#include <doctest/doctest.h>

#include <pthread.h>
#include <signal.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <thread>

#include "../integration/workload.hpp"

namespace sigwait_torture {

constexpr int kSends = 20;

// Waits for SIGURG (blocked in this thread) until `stop`; counts what arrives.
void waiter(std::atomic<int>* got, std::atomic<bool>* stop, std::atomic<bool>* still_blocked, bool arm) {
  if (arm)
    (void)selfprof::detail::profiler_core::instance().register_current_thread(false);  // as the preload
  sigset_t urg;
  sigemptyset(&urg);
  sigaddset(&urg, SIGURG);
  const struct timespec step { 0, 20 * 1000 * 1000 };
  while (!stop->load()) {
    if (sigtimedwait(&urg, nullptr, &step) == SIGURG) got->fetch_add(1);
  }
  sigset_t now;
  pthread_sigmask(SIG_BLOCK, nullptr, &now);
  still_blocked->store(sigismember(&now, SIGURG) == 1);
}

// `block_first`: SIGURG is blocked before start() (else after it, as in a program started under the
// preload library). Exit status 0 when the waiter got exactly what was sent and kept its mask.
int child(bool block_first) {
  sigset_t urg;
  sigemptyset(&urg);
  sigaddset(&urg, SIGURG);
  if (block_first) pthread_sigmask(SIG_BLOCK, &urg, nullptr);
  selfprof::options o;
  o.hz = 99;  // the default: what a program under the preload library gets
  if (!selfprof::start(o)) return 10;
  const int sampling = selfprof::detail::profiler_core::instance().sample_signal();
  if (block_first && sampling == SIGURG) return 11;  // a blocked signal was taken for sampling
  if (!block_first) pthread_sigmask(SIG_BLOCK, &urg, nullptr);
  std::atomic<int> got{0};
  std::atomic<bool> stop{false}, still_blocked{false};
  std::thread t(waiter, &got, &stop, &still_blocked, !block_first);
  for (int i = 0; i < kSends; ++i) {
    wl::run_rounds(20000000LL);  // CPU time in between: ticks keep coming
    pthread_kill(t.native_handle(), SIGURG);
    struct timespec pause {
      0, 5 * 1000 * 1000
    };
    nanosleep(&pause, nullptr);
  }
  struct timespec settle {
    0, 100 * 1000 * 1000
  };
  nanosleep(&settle, nullptr);
  stop.store(true);
  t.join();
  selfprof::stop();
  if (!still_blocked.load()) return 12;
  if (got.load() != kSends) return 20 + (got.load() < kSends ? 0 : 1);  // 20: lost, 21: extra
  return 0;
}

int run(bool block_first) {
  std::fflush(nullptr);
  const pid_t pid = fork();
  if (pid == 0) _exit(child(block_first));
  int status = 0;
  waitpid(pid, &status, 0);
  return WIFEXITED(status) ? WEXITSTATUS(status) : 100 + WTERMSIG(status);
}

}  // namespace sigwait_torture

TEST_CASE("torture: sigwait() for a signal selfprof could sample with gets exactly what the program sends") {
  wl::apply_test_environment();
  const int before = sigwait_torture::run(true);
  INFO("SIGURG blocked before start(): exit "
       << before << " (11: taken for sampling, 12: mask changed, 20 lost, 21 extra)");
  CHECK(before == 0);
  const int after = sigwait_torture::run(false);
  INFO("SIGURG blocked after start(), thread armed as the preload does: exit " << after);
  CHECK(after == 0);
}
