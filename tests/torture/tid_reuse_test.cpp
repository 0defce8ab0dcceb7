// Torture: a thread is (tid, start time), never a tid alone (issue 15, item 11). A tid is reused once its
// thread has exited; a perf_event opened by tid and owned by tid (F_SETOWN_EX F_OWNER_TID) then measures
// and signals whatever thread has it, possibly in another process. The registry drops a record whose tid
// now has another start time and arms the new thread, and undoes an arm when the tid stops being the
// recorded thread while it was armed.
// Forcing a reuse at a chosen moment is not possible from a test, least of all by a foreign process: the
// cases fake a thread's start time through the read_task_file seam (detail/sys.hpp) and arm with a fake
// tick source that records what it is asked; one case makes the kernel really hand a dead thread's tid to a
// new thread of this process, when pid_max is small enough to go round in seconds.
// ctest-labels: slow
// slow (the real reuse goes round pid_max): run by the gcc stage only.
#include <doctest/doctest.h>

#include <pthread.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "selfprof/collect/thread_registry.hpp"
#include "selfprof/detail/process.hpp"
#include "selfprof/detail/sys.hpp"

#if defined(__has_feature)
#define TID_REUSE_HAS_TSAN __has_feature(thread_sanitizer)
#else
#define TID_REUSE_HAS_TSAN 0
#endif

namespace tid_reuse {

using selfprof::detail::thread_registry;

// A perf-like source (checked on arming, see thread_registry.hpp) that only records.
struct fake_source final : selfprof::detail::tick_source {
  std::vector<std::string> log;  // "arm <tid>", "disarm <tid>"
  std::set<pid_t> armed;
  pid_t hook_tid = 0;
  void (*on_arm)() = nullptr;  // runs when `hook_tid` is armed (a reuse during the arm)

  selfprof::source_kind kind() const override { return selfprof::source_kind::perf; }
  std::string describe() const override { return "fake"; }
  selfprof::status open(const selfprof::detail::source_config&) override { return selfprof::status::ok(); }
  bool per_thread() const override { return true; }
  selfprof::status arm(pid_t tid) override {
    log.push_back("arm " + std::to_string(tid));
    armed.insert(tid);
    if (tid == hook_tid && on_arm) on_arm();
    return selfprof::status::ok();
  }
  void disarm(pid_t tid) override {
    log.push_back("disarm " + std::to_string(tid));
    armed.erase(tid);
  }
  void close() override { armed.clear(); }
  void abandon_after_fork() override {}
  std::size_t armed_count() const override { return armed.size(); }
  double effective_hz() const override { return 99; }
  bool counts_kernel_time() const override { return true; }

  int times(const std::string& what, pid_t tid) const {
    int n = 0;
    for (auto& l : log) n += l == what + " " + std::to_string(tid);
    return n;
  }
};

// The seam: /proc/self/task/<g_fake_tid>/stat says the thread started at g_fake_start.
std::atomic<int> g_fake_tid{0};
std::atomic<std::uint64_t> g_fake_start{0};

long fake_read_task_file(int tid, const char* file, char* buf, std::size_t size) {
  if (tid != g_fake_tid.load() || std::strcmp(file, "stat") != 0)
    return selfprof::detail::default_read_task_file(tid, file, buf, size);
  std::string s = std::to_string(tid) + " (a) b) S";  // a name with ") " in it, as a program may set
  for (int field = 4; field <= 21; ++field) s += " 0";
  s += " " + std::to_string(g_fake_start.load()) + " 0 0\n";
  const std::size_t n = s.size() < size ? s.size() : size;
  std::memcpy(buf, s.data(), n);
  return static_cast<long>(n);
}

struct seam {
  seam() { selfprof::detail::sys().read_task_file = fake_read_task_file; }
  ~seam() {
    g_fake_tid.store(0);
    selfprof::detail::sys() = selfprof::detail::default_syscalls();
  }
};

// A thread that waits until told to finish.
struct parked {
  std::atomic<pid_t> tid{0};
  std::atomic<bool> go{false};
  std::thread t;
  parked() {
    t = std::thread([this] {
      tid.store(static_cast<pid_t>(selfprof::detail::raw_gettid()));
      while (!go.load()) usleep(1000);
    });
    while (tid.load() == 0) usleep(100);
  }
  ~parked() {
    go.store(true);
    t.join();
  }
};

fake_source* begin(thread_registry& r) {
  fake_source* src = new fake_source();
  selfprof::detail::source_config cfg;  // signal 0: no signal mask to look at
  r.begin(std::unique_ptr<selfprof::detail::tick_source>(src), cfg);
  return src;
}

}  // namespace tid_reuse

using namespace tid_reuse;

TEST_CASE("tid reuse: start times are read from field 22 of stat") {
  CHECK(selfprof::detail::parse_start_time(
            "12 (a) b) S 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 4242 0") == 4242);
  CHECK(selfprof::detail::parse_start_time("12 (short) S 1 2") == 0);
  CHECK(selfprof::detail::parse_start_time("") == 0);
  CHECK(selfprof::detail::task_start_time(static_cast<pid_t>(selfprof::detail::raw_gettid())) > 0);
  CHECK(selfprof::detail::task_start_time(0) == 0);
}

TEST_CASE("tid reuse: a known tid with another start time is a new thread, armed again") {
  seam s;
  parked p;
  const pid_t tid = p.tid.load();
  thread_registry r;
  fake_source* src = begin(r);
  r.scan({});
  REQUIRE(src->times("arm", tid) == 1);
  const std::size_t seen = r.counts().seen;
  // The thread exits and another one gets its tid between two scans.
  g_fake_start.store(selfprof::detail::task_start_time(tid) + 1000);
  g_fake_tid.store(tid);
  r.scan({});
  INFO("log: " << src->log.size() << " entries");
  CHECK(src->times("disarm", tid) == 1);
  CHECK(src->times("arm", tid) == 2);
  CHECK(src->armed.count(tid) == 1);
  CHECK(r.counts().seen == seen + 1);
  // The new thread's record holds: the next scan leaves it alone.
  r.scan({});
  CHECK(src->times("arm", tid) == 2);
  r.end();
}

TEST_CASE("tid reuse: a tid that changes thread while it is armed is disarmed at once") {
  seam s;
  parked p;
  const pid_t tid = p.tid.load();
  thread_registry r;
  fake_source* src = begin(r);
  src->hook_tid = tid;
  // Between perf_event_open and the check, the thread exits and its tid goes to another thread.
  src->on_arm = [] { g_fake_start.store(1); };
  g_fake_start.store(selfprof::detail::task_start_time(tid));
  g_fake_tid.store(tid);
  r.scan({});
  CHECK(src->times("arm", tid) == 1);
  CHECK(src->times("disarm", tid) == 1);
  CHECK(src->armed.count(tid) == 0);
  CHECK(r.counts().arm_failed >= 1);
  r.end();
}

TEST_CASE("tid reuse: a thread registering itself replaces a dead thread's record of its tid") {
  seam s;
  const pid_t self = static_cast<pid_t>(selfprof::detail::raw_gettid());
  thread_registry r;
  fake_source* src = begin(r);
  REQUIRE(r.register_current(0, false));
  REQUIRE(src->times("arm", self) == 1);
  g_fake_start.store(selfprof::detail::task_start_time(self) + 7);  // the record is now an older thread's
  g_fake_tid.store(self);
  REQUIRE(r.register_current(0, false));
  CHECK(src->times("disarm", self) == 1);
  CHECK(src->times("arm", self) == 2);
  r.end();
}

TEST_CASE("tid reuse: the contention upgrade does not move a dead thread's tid to the new source") {
  seam s;
  parked p;
  const pid_t tid = p.tid.load();
  thread_registry r;
  fake_source* first = begin(r);
  r.scan({});
  REQUIRE(first->times("arm", tid) == 1);
  g_fake_start.store(selfprof::detail::task_start_time(tid) + 1000);  // exited, tid taken (by anyone)
  g_fake_tid.store(tid);
  fake_source* next = new fake_source();
  r.switch_primary(std::unique_ptr<selfprof::detail::tick_source>(next));
  CHECK(next->armed.count(tid) == 0);
  CHECK(first->armed.count(tid) == 0);
  r.end();
}

// The kernel really gives a dead thread's tid to a new thread of this process: thread ids are handed out
// in a cycle up to pid_max, so about pid_max thread creations come back to it. Not forced where pid_max is
// large (4194304 on most 64-bit systems: minutes of thread creation), nor under TSan (its thread limit).
// A foreign process taking the tid in the microseconds of an arm cannot be forced at all.
TEST_CASE("tid reuse: a new thread of this process with a dead thread's tid is armed") {
#if defined(__SANITIZE_THREAD__) || TID_REUSE_HAS_TSAN
  MESSAGE("not under TSan: it limits the threads a process creates");
  return;
#endif
  const long pid_max =
      std::strtol(selfprof::detail::read_small_file("/proc/sys/kernel/pid_max").c_str(), nullptr, 10);
  if (pid_max <= 0 || pid_max > 131072) {
    MESSAGE("pid_max " << pid_max
                       << ": too many thread creations to make the kernel reuse a tid; not forced");
    return;
  }
  thread_registry r;
  fake_source* src = begin(r);
  pid_t target = 0;
  {
    parked first;
    target = first.tid.load();
    r.scan({});
    REQUIRE(src->times("arm", target) == 1);
  }  // exits, unseen by the registry
  std::atomic<bool> got{false}, release{false};
  pthread_attr_t attr;
  pthread_attr_init(&attr);
  pthread_attr_setstacksize(&attr, 64 * 1024);
  struct arg_t {
    pid_t target;
    std::atomic<bool>* got;
    std::atomic<bool>* release;
  } arg{target, &got, &release};
  auto body = [](void* a) -> void* {
    auto* x = static_cast<arg_t*>(a);
    if (static_cast<pid_t>(selfprof::detail::raw_gettid()) != x->target) return nullptr;
    x->got->store(true);
    while (!x->release->load()) usleep(1000);
    return nullptr;
  };
  pthread_t reused{};
  for (long i = 0; i < 2 * pid_max && !got.load(); ++i) {
    pthread_t t;
    if (pthread_create(&t, &attr, body, &arg) != 0) continue;
    for (;;) {  // the creator learns whether this one got the tid before joining it (it parks if so)
      if (got.load()) {
        reused = t;
        break;
      }
      if (pthread_tryjoin_np(t, nullptr) == 0) break;
      usleep(5);
    }
  }
  pthread_attr_destroy(&attr);
  if (!got.load()) {
    MESSAGE("the kernel did not hand tid " << target << " out again (other processes took it); not forced");
    r.end();
    return;
  }
  r.scan({});
  CHECK(src->times("disarm", target) == 1);
  CHECK(src->times("arm", target) == 2);
  CHECK(src->armed.count(target) == 1);
  release.store(true);
  pthread_join(reused, nullptr);
  r.end();
}
