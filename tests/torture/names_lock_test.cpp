// Torture: a thread registering itself never waits for /proc reads of other threads (issue 15). A
// snapshot re-reads the name of every live thread, the stats read every thread's signal mask and a scan
// reads what it needs of new threads: at 10,000 threads that takes long, and it used to be done under the
// registry's lock, which register_thread() (the preload library arms every new thread with it) takes.
// Each case makes one /proc read of a parked thread block (the read_task_file seam, detail/sys.hpp) and
// registers another thread while it blocks.
#include <doctest/doctest.h>

#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <functional>
#include <string>
#include <thread>

#include "selfprof/collect/thread_registry.hpp"
#include "selfprof/detail/sys.hpp"

namespace names_lock {

using selfprof::detail::thread_registry;

// Reads of g_file for thread g_tid block, once armed, until released.
std::atomic<int> g_tid{0};
std::atomic<const char*> g_file{nullptr};
std::atomic<bool> g_entered{false}, g_release{false};

long blocking_read_task_file(int tid, const char* file, char* buf, std::size_t size) {
  const char* blocked = g_file.load();
  if (tid == g_tid.load() && blocked && std::strcmp(file, blocked) == 0) {
    g_entered.store(true);
    while (!g_release.load()) usleep(1000);
  }
  return selfprof::detail::default_read_task_file(tid, file, buf, size);
}

// Waits until `flag` (a hang guard: 10 s, never a measure).
bool wait_for(const std::atomic<bool>& flag) {
  const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (!flag.load() && std::chrono::steady_clock::now() < end) usleep(1000);
  return flag.load();
}

// `reader` runs on its own thread and blocks reading `file` of a parked thread (known to the registry
// first when `known`); meanwhile a new thread registers. True when that registration completed while the
// read was still blocked.
bool registers_while_blocked(const char* file, bool known,
                             const std::function<void(thread_registry&)>& reader) {
  g_entered.store(false);
  g_release.store(false);
  g_file.store(nullptr);
  selfprof::detail::sys().read_task_file = blocking_read_task_file;
  thread_registry r;
  selfprof::detail::source_config cfg;
  r.begin(nullptr, cfg);  // nothing to arm: the lock is what is tested
  std::atomic<pid_t> parked_tid{0};
  std::atomic<bool> parked_go{false};
  std::thread parked([&] {
    parked_tid.store(static_cast<pid_t>(selfprof::detail::raw_gettid()));
    while (!parked_go.load()) usleep(1000);
  });
  while (parked_tid.load() == 0) usleep(100);
  if (known) r.scan({});
  g_tid.store(parked_tid.load());
  g_file.store(file);
  std::thread reading([&] { reader(r); });
  bool registered_in_time = false;
  if (wait_for(g_entered)) {
    std::atomic<bool> done{false};
    std::thread registering([&] {
      (void)r.register_current(0, false);
      done.store(true);
    });
    registered_in_time = wait_for(done);
    g_release.store(true);
    registering.join();
  }
  g_release.store(true);
  reading.join();
  parked_go.store(true);
  parked.join();
  r.end();
  g_file.store(nullptr);
  selfprof::detail::sys() = selfprof::detail::default_syscalls();
  return registered_in_time && g_entered.load();
}

}  // namespace names_lock

using namespace names_lock;

TEST_CASE("names lock: register_current() completes while a snapshot reads a thread's name") {
  std::size_t names = 0;
  CHECK(registers_while_blocked("comm", true, [&](thread_registry& r) { names = r.names().size(); }));
  CHECK(names >= 2);  // this thread and the parked one at least
}

TEST_CASE("names lock: register_current() completes while the stats read a thread's signal mask") {
  CHECK(registers_while_blocked("status", true, [](thread_registry& r) { (void)r.blocking(SIGPROF); }));
}

TEST_CASE("names lock: register_current() completes while a scan reads a new thread's name") {
  CHECK(registers_while_blocked("comm", false, [](thread_registry& r) { r.scan({}); }));
}
