// Torture: selfprof's own threads block every asynchronous signal from their first instruction, so a
// process-directed signal (SIGALRM, SIGCHLD, SIGTERM, SIGPIPE, ...) never runs the application's handler
// on one of them (issue 15, item 9).
// ctest-labels: no_tsan
// Not under TSan: it defers asynchronous signals.
#include <doctest/doctest.h>

#include <signal.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <fstream>
#include <set>
#include <string>
#include <thread>

#include "../integration/workload.hpp"

namespace {
std::atomic<int> g_on_selfprof{0}, g_handled{0};
std::atomic<pid_t> g_selfprof_tids[8];

void on_alarm(int) {
  const pid_t self = static_cast<pid_t>(syscall(SYS_gettid));
  for (auto& t : g_selfprof_tids)
    if (t.load() == self) g_on_selfprof.fetch_add(1);
  g_handled.fetch_add(1);
}

std::string task_file(pid_t tid, const char* name) {
  std::ifstream f("/proc/self/task/" + std::to_string(tid) + "/" + name);
  std::string s((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  return s;
}

// Asynchronous signals a selfprof thread must block (every one but the fault signals).
bool blocks_every_asynchronous_signal(const std::string& status) {
  const std::size_t at = status.find("SigBlk:");
  if (at == std::string::npos) return false;
  const unsigned long long mask = std::strtoull(status.c_str() + at + 7, nullptr, 16);
  for (int s = 1; s <= 64; ++s) {
    if (s == SIGSEGV || s == SIGBUS || s == SIGFPE || s == SIGILL || s == SIGTRAP || s == SIGSYS) continue;
    if (s == SIGKILL || s == SIGSTOP || s == 32 || s == 33) continue;  // cannot be blocked / glibc's own
    if (!((mask >> (s - 1)) & 1)) return false;
  }
  return true;
}
}  // namespace

TEST_CASE("torture: process-directed SIGALRM never runs its handler on a selfprof thread") {
  wl::apply_test_environment();
  selfprof::options o;
  o.hz = 250;
  o.interval_s = 0.05;               // the dumper thread too, busy
  o.out = "/dev/null/never.folded";  // dumps fail fast; they are not what is tested
  o.mode = selfprof::profile_mode::cpu;
  REQUIRE(selfprof::start(o));
  struct sigaction act {
  }, old{};
  act.sa_handler = on_alarm;
  sigemptyset(&act.sa_mask);
  REQUIRE(sigaction(SIGALRM, &act, &old) == 0);
  std::this_thread::sleep_for(std::chrono::milliseconds(100));  // the collector has started
  int selfprof_threads = 0, blocked = 0, i = 0;
  for (pid_t tid : selfprof::detail::list_threads()) {
    const std::string comm = task_file(tid, "comm");  // selfprof's thread names, newline-ended
    if (comm != "selfprof\n" && comm != "selfprof-dump\n" && comm != "selfprof-wall\n" &&
        comm != "selfprof-jit\n")
      continue;
    ++selfprof_threads;
    if (blocks_every_asynchronous_signal(task_file(tid, "status"))) ++blocked;
    if (i < 8) g_selfprof_tids[i++].store(tid);
  }
  CHECK(selfprof_threads >= 2);  // collector and dumper
  CHECK(blocked == selfprof_threads);
  // The main thread blocks SIGALRM while sending, so the kernel must pick another thread: only
  // selfprof's threads and the worker below exist, and selfprof's must never be picked.
  std::atomic<bool> stop{false};
  std::thread worker([&] {
    while (!stop) wl::spin_units(2);
  });
  sigset_t alrm;
  sigemptyset(&alrm);
  sigaddset(&alrm, SIGALRM);
  pthread_sigmask(SIG_BLOCK, &alrm, nullptr);
  for (int k = 0; k < 200; ++k) {
    kill(getpid(), SIGALRM);
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  stop = true;
  worker.join();
  pthread_sigmask(SIG_UNBLOCK, &alrm, nullptr);
  sigaction(SIGALRM, &old, nullptr);
  REQUIRE(selfprof::stop());
  CHECK(g_handled.load() > 0);
  CHECK(g_on_selfprof.load() == 0);
}
