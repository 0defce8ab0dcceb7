// The ring source (SELFPROF_SOURCE=ring, sources/perf_ring.hpp): the known split on 1 and 4 threads with
// full-depth stacks, no signal ever reaching the program (no EINTR, application handlers never called),
// threads created after start() sampled by the kernel, 500 short threads without leaked fds or mappings,
// fork children kept out of the parent's profile, exec, snapshots that hold what the rings hold, and (as
// root) kernel call chains named from kallsyms. Where the ring cannot open (SELFPROF_TEST_NO_PERF=1,
// seccomp, paranoid 3) each case checks the fallback to a signal source and its reason instead.
// ctest-labels: no_tsan
// Not under TSan: the fallback signal sources run its handler late (see sources_test.cpp).
#include <doctest/doctest.h>

#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <sys/epoll.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/select.h>
#include <sys/syscall.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstring>
#include <fstream>
#include <iterator>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "integration/workload.hpp"

namespace ring_test {

selfprof::options ring_options(double hz) {
  selfprof::options o;
  o.hz = hz;
  o.source = selfprof::source_kind::ring;
  return o;
}

// True when the ring source runs; otherwise checks that a signal source took over and said why.
bool ring_running() {
  const selfprof::stats st = selfprof::get_stats();
  if (st.source == selfprof::source_kind::ring) {
    CHECK(st.sample_signal == 0);  // no sampling signal is even installed
    return true;
  }
  MESSAGE("ring source unavailable here: " << st.source_reason);
  CHECK(st.source != selfprof::source_kind::none);
  bool said = false;
  for (const auto& r : st.refused) said = said || r.rfind("ring: ", 0) == 0;
  CHECK(said);
  CHECK(st.source_reason.find("fell back from the ring source") != std::string::npos);
  return false;
}

double ring_share_of(const selfprof::profile& p, const char* leaf) {
  std::uint64_t in = 0, all = 0;
  for (const auto& s : p.stacks) {
    all += s.count;
    if (wl::count_frames(p, s, leaf)) in += s.count;
  }
  return all ? double(in) / double(all) : 0;
}

// Shares of the samples under leaf_a, leaf_b, leaf_c against the CPU time measured around each call;
// every leaf_b sample must carry the whole recursion.
void known_split(int threads) {
  wl::apply_test_environment();
  REQUIRE(selfprof::start(ring_options(997)));
  const bool ring = ring_running();
  const std::int64_t each = threads == 1 ? 1000000000LL : 400000000LL;
  std::vector<wl::truth> truths(static_cast<std::size_t>(threads));
  // The workload threads' CPU time: selfprof's own (the collector unwinds; slow under ASan) is not sampled.
  std::vector<std::int64_t> cpus(static_cast<std::size_t>(threads));
  auto work = [&truths, &cpus, each](int i) {
    const std::int64_t t0 = wl::thread_cpu_ns();
    truths[std::size_t(i)] = wl::run_rounds(each);
    cpus[std::size_t(i)] = wl::thread_cpu_ns() - t0;
  };
  std::vector<std::thread> ts;
  for (int i = 1; i < threads; ++i) ts.emplace_back(work, i);
  work(0);
  for (auto& t : ts) t.join();
  std::int64_t cpu = 0;
  for (auto c : cpus) cpu += c;
  selfprof::stop();
  const selfprof::stats st = selfprof::get_stats();
  const selfprof::profile p = selfprof::snapshot();
  wl::truth all_truth;
  for (auto& t : truths) {
    all_truth.a += t.a;
    all_truth.b += t.b;
    all_truth.c += t.c;
  }
  std::uint64_t in[3] = {0, 0, 0}, all = 0, b = 0, b_full = 0;
  const char* leaves[3] = {"leaf_a", "leaf_b", "leaf_c"};
  for (const auto& s : p.stacks) {
    all += s.count;
    for (std::size_t i = s.frames.size(); i-- > 0;) {
      const std::string& n = p.frames[s.frames[i]].name;
      int k = -1;
      for (int j = 0; j < 3; ++j)
        if (n.find(leaves[j]) != std::string::npos) k = j;
      if (k < 0) continue;
      in[k] += s.count;
      if (k == 1) {
        b += s.count;
        if (wl::count_frames(p, s, "wl::deep") >= std::size_t(wl::kDeepFrames) + 1 &&
            wl::count_frames(p, s, "run_rounds") == 1 && !s.truncated)
          b_full += s.count;
      }
      break;
    }
  }
  const double leaves_total = double(in[0] + in[1] + in[2]);
  REQUIRE(leaves_total > 0.9 * double(all));
  const double rate = double(st.samples) / (double(cpu) / 1e9);
  const double ta = double(all_truth.a) / double(all_truth.total());
  const double tb = double(all_truth.b) / double(all_truth.total());
  MESSAGE(threads << " thread(s), " << st.source_detail << ": " << rate << " samples/CPU-s, lost "
                  << st.kernel_lost << ", dropped " << st.dropped_full << "; a " << in[0] / leaves_total
                  << " (truth " << ta << ") b " << in[1] / leaves_total << " (truth " << tb << ")");
  // 8 points: on this 2-CPU machine under a load average of 6, one thread's shares at ~1000 samples
  // strayed up to 7 points from the truth (more than counting noise: see docs/measurements.md).
  CHECK(std::abs(in[0] / leaves_total - ta) * 100 < 8);
  CHECK(std::abs(in[1] / leaves_total - tb) * 100 < 8);
  REQUIRE(b > 0);
  // Those the ring cut at its stack copy before it asked for the kernel's user chain aside (only where
  // the recursion outgrows the copy, as under ASan; the profile's notes say so).
  MESSAGE(b_full << " of " << b << " deep samples full; " << st.ring_chain_cut
                 << " cut before the user chain");
  CHECK(double(b_full) >= 0.97 * double(b - std::min<std::uint64_t>(st.ring_chain_cut, b)));
  if (!ring) return;
#if !defined(__SANITIZE_ADDRESS__)
  CHECK_FALSE(st.ring_user_chain);  // 45 small frames fit the copy: the kernel's user chain is never paid for
#endif
  CHECK(st.kernel_time == (geteuid() == 0));
  // Samples per CPU-second of the workload threads (start and stop on the main thread add a little).
  CHECK(rate > 997 * 0.9);
  CHECK(rate < 997 * 1.1);
}

// --- no signal reaches the program ---

std::atomic<long> g_ring_app_calls{0};
void ring_app_handler(int) { g_ring_app_calls.fetch_add(1); }

std::set<std::string> list_dir(const char* path) {
  std::set<std::string> out;
  if (DIR* d = ::opendir(path)) {
    while (dirent* e = ::readdir(d))
      if (e->d_name[0] != '.') out.insert(e->d_name);
    ::closedir(d);
  }
  return out;
}

std::size_t perf_mappings() {
  std::ifstream in("/proc/self/maps");
  std::size_t n = 0;
  for (std::string line; std::getline(in, line);)
    if (line.find("anon_inode:[perf_event]") != std::string::npos) ++n;
  return n;
}

WL_NOINLINE double child_only_work(long units) {
  double r = wl::spin_units(units);
  WL_NO_TAIL();
  return r;
}

WL_NOINLINE double late_thread_work(long units) {
  double r = wl::spin_units(units);
  WL_NO_TAIL();
  return r;
}

// A frame-pointer recursion deeper than the ring's 8 KiB stack copy (kBigFrames frames of 512 bytes of
// locals), left and re-entered every round with other bytes in its frames: where a sample's copy ends,
// the live stack no longer holds what was sampled, and only the kernel's user chain can go on.
constexpr int kBigFrames = 40;
WL_NOINLINE double big_deep(int n, long units, unsigned salt) {
  volatile unsigned char pad[512];
  for (unsigned i = 0; i < sizeof pad; i += 8) pad[i] = static_cast<unsigned char>(salt + i);
  double r = n == 0 ? wl::leaf_b(units) : big_deep(n - 1, units, salt);
  WL_NO_TAIL();
  return r + pad[salt % sizeof pad];
}
// A leaf that keeps a number in rbp (as code without frame pointers may), with CFI rows that say where
// the caller's rbp went: the CFI walk of the copy goes through it and finds big_deep's frame records
// on the live stack past the copy, but the kernel's frame-pointer chain starts from rbp, so it
// continues nothing.
extern "C" long ring_test_rbp_leaf(long n);
__asm__(
    ".text\n"
    ".globl ring_test_rbp_leaf\n"
    ".type ring_test_rbp_leaf, @function\n"
    "ring_test_rbp_leaf:\n"
    ".cfi_startproc\n"
    "push %rbp\n"
    ".cfi_def_cfa_offset 16\n"
    ".cfi_offset %rbp, -16\n"
    "mov $0x1235, %rbp\n"
    "mov %rdi, %rax\n"
    "1: dec %rax\n"
    "jnz 1b\n"
    "pop %rbp\n"
    ".cfi_def_cfa_offset 8\n"
    "ret\n"
    ".cfi_endproc\n"
    ".size ring_test_rbp_leaf, .-ring_test_rbp_leaf\n");

WL_NOINLINE double big_deep_rbp(int n, long iterations, unsigned salt) {
  volatile unsigned char pad[512];
  for (unsigned i = 0; i < sizeof pad; i += 8) pad[i] = static_cast<unsigned char>(salt + i);
  double r = n == 0 ? double(ring_test_rbp_leaf(iterations)) : big_deep_rbp(n - 1, iterations, salt);
  WL_NO_TAIL();
  return r + pad[salt % sizeof pad];
}

// Samples under big_deep_rounds' leaf: all, those that hold the whole recursion and its caller, unmarked,
// and those marked [truncated].
struct big_deep_counts {
  std::uint64_t deep = 0, full = 0, marked = 0;
};
big_deep_counts count_big_deep(const selfprof::profile& p) {
  big_deep_counts c;
  for (const auto& s : p.stacks) {
    if (wl::count_frames(p, s, "leaf_b") == 0) continue;
    c.deep += s.count;
    if (wl::count_frames(p, s, "big_deep(") == std::size_t(kBigFrames) + 1 &&
        wl::count_frames(p, s, "big_deep_rounds") == 1 && !s.truncated)
      c.full += s.count;
    if (s.truncated) c.marked += s.count;
  }
  return c;
}

WL_NOINLINE void big_deep_rounds(std::int64_t cpu_ns) {
  unsigned salt = 0;
  const std::int64_t t0 = wl::thread_cpu_ns();
  while (wl::thread_cpu_ns() - t0 < cpu_ns) {
    big_deep(kBigFrames, 1, ++salt);
    wl::leaf_a(1);
  }
  WL_NO_TAIL();
}

}  // namespace ring_test

using namespace ring_test;

TEST_CASE("ring source: the known split and full-depth stacks on one thread") { known_split(1); }

TEST_CASE("ring source: the known split and full-depth stacks on four threads") { known_split(4); }

TEST_CASE("ring source: stacks deeper than the copy get the kernel's user chain, the rest never pay for it") {
  wl::apply_test_environment();
  REQUIRE(selfprof::start(ring_options(997)));
  if (!ring_running()) {
    selfprof::stop();
    return;
  }
  big_deep_rounds(1000000000LL);
  selfprof::stop();
  const selfprof::stats st = selfprof::get_stats();
  const selfprof::profile p = selfprof::snapshot();
  const auto [deep, full, marked] = count_big_deep(p);
  MESSAGE(full << " of " << deep << " deep samples full, " << marked << " marked truncated; "
               << st.ring_chain_cut << " cut before the user chain");
  CHECK(st.ring_user_chain);
  CHECK(st.ring_chain_cut >= selfprof::detail::kChainWantedSamples);
  REQUIRE(deep > 200);
  // The switch comes at one of the collector's first reads: few samples before it.
  CHECK(double(full) >= 0.9 * double(deep));
  // The rest are marked; at most a rare one was continued on a live stack that had re-entered the
  // recursion (its bytes at the copy's end are the same every round) and shows another depth.
  CHECK(deep - full - marked <= deep / 50);
  bool said = false;
  for (const auto& n : p.info.notes) said = said || n.find("user call chain") != std::string::npos;
  CHECK(said);
}

TEST_CASE("ring source: the user chain is given back where it continues nothing") {
  wl::apply_test_environment();
  REQUIRE(selfprof::start(ring_options(997)));
  if (!ring_running()) {
    selfprof::stop();
    return;
  }
  unsigned salt = 0;
  const std::int64_t t0 = wl::thread_cpu_ns();
  while (wl::thread_cpu_ns() - t0 < 1000000000LL) big_deep_rbp(kBigFrames, 300000, ++salt);
  const double cpu_s = double(wl::thread_cpu_ns() - t0) / 1e9;
  selfprof::stop();
  const selfprof::stats st = selfprof::get_stats();
  const selfprof::profile p = selfprof::snapshot();
  MESSAGE(st.ring_chain_cut << " cut before the user chain; given back: " << st.ring_chain_given_back);
  CHECK(st.ring_chain_cut >= selfprof::detail::kChainWantedSamples);
  CHECK(st.ring_chain_given_back);
  CHECK_FALSE(st.ring_user_chain);
  bool said = false;
  for (const auto& n : p.info.notes) said = said || n.find("was given up") != std::string::npos;
  CHECK(said);
  CHECK(wl::samples_with_leaf(p, "ring_test_rbp_leaf") > 500);  // sampling went on after the hand-back
  CHECK(double(wl::total_samples(p)) < 997 * cpu_s * 1.1);      // and no tick was sampled twice
}

TEST_CASE("ring source: no EINTR in blocking calls and application signal handlers never called") {
  wl::apply_test_environment();
  struct sigaction sa {
  }, old_prof{};
  sa.sa_handler = ring_app_handler;
  sigemptyset(&sa.sa_mask);
  std::vector<std::pair<int, struct sigaction>> saved;
  for (int sig = SIGRTMIN; sig <= SIGRTMAX; ++sig) {
    struct sigaction old {};
    if (::sigaction(sig, &sa, &old) == 0) saved.emplace_back(sig, old);
  }
  ::sigaction(SIGPROF, &sa, &old_prof);
  g_ring_app_calls = 0;
  REQUIRE(selfprof::start(ring_options(997)));
  const bool ring = ring_running();
  std::atomic<bool> stop{false};
  std::atomic<long> eintr{0}, calls{0};
  auto failed = [&](int r) {
    calls.fetch_add(1);
    if (r < 0 && errno == EINTR) eintr.fetch_add(1);
  };
  std::vector<std::thread> t;
  t.emplace_back([&] {  // poll, nothing ready
    int p[2];
    if (::pipe(p) != 0) return;
    pollfd f{p[0], POLLIN, 0};
    while (!stop) failed(::poll(&f, 1, 7));
    ::close(p[0]);
    ::close(p[1]);
  });
  t.emplace_back([&] {  // epoll_wait
    int ep = ::epoll_create1(EPOLL_CLOEXEC);
    epoll_event ev[1];
    while (!stop) failed(::epoll_wait(ep, ev, 1, 5));
    ::close(ep);
  });
  t.emplace_back([&] {  // nanosleep, after a burst of CPU
    while (!stop) {
      wl::spin_units(5);
      timespec ts{0, 3000000};
      failed(::nanosleep(&ts, nullptr));
    }
  });
  t.emplace_back([&] {  // select
    while (!stop) {
      timeval tv{0, 4000};
      failed(::select(0, nullptr, nullptr, nullptr, &tv));
    }
  });
  int feed[2];
  REQUIRE(::pipe(feed) == 0);
  t.emplace_back([&] {  // read on a pipe, fed every few ms
    char c;
    while (!stop) failed(static_cast<int>(::read(feed[0], &c, 1)));
  });
  t.emplace_back([&] {  // sigtimedwait on a signal nobody sends
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGUSR1);
    pthread_sigmask(SIG_BLOCK, &set, nullptr);
    while (!stop) {
      timespec ts{0, 5000000};
      const int r = ::sigtimedwait(&set, nullptr, &ts);
      if (r < 0 && errno == EAGAIN) {
        calls.fetch_add(1);
        continue;
      }
      failed(r);
    }
  });
  const std::int64_t end = wl::thread_cpu_ns() + 2500000000LL;
  while (wl::thread_cpu_ns() < end) {  // the main thread computes and feeds the reader
    wl::spin_units(20);
    if (::write(feed[1], "x", 1) != 1) break;
  }
  stop = true;
  if (::write(feed[1], "x", 1) != 1) MESSAGE("pipe write failed");
  for (auto& th : t) th.join();
  ::close(feed[0]);
  ::close(feed[1]);
  selfprof::stop();
  const selfprof::stats st = selfprof::get_stats();
  for (auto& s : saved) ::sigaction(s.first, &s.second, nullptr);
  ::sigaction(SIGPROF, &old_prof, nullptr);
  MESSAGE(calls.load() << " blocking calls, " << st.samples << " samples");
  CHECK(calls.load() > 100);
  if (!ring) return;  // signal sources are covered by wall_eintr_test and conflict_test
  CHECK(st.samples > 500);
  CHECK(eintr.load() == 0);
  CHECK(g_ring_app_calls.load() == 0);
}

TEST_CASE("ring source: threads created after start are sampled; 500 short threads leak nothing") {
  wl::apply_test_environment();
  const std::set<std::string> fds_before = list_dir("/proc/self/fd");
  const std::size_t maps_before = perf_mappings();
  REQUIRE(selfprof::start(ring_options(1000)));
  const bool ring = ring_running();
  std::atomic<pid_t> late_tid{0};
  std::thread late([&] {
    late_tid = static_cast<pid_t>(::syscall(SYS_gettid));
    const std::int64_t end = wl::thread_cpu_ns() + 300000000LL;
    while (wl::thread_cpu_ns() < end) late_thread_work(5);
  });
  late.join();
  for (int round = 0; round < 50; ++round) {
    std::vector<std::thread> ts;
    for (int i = 0; i < 10; ++i) ts.emplace_back([] { wl::spin_units(2); });
    for (auto& th : ts) th.join();
  }
  if (ring) {
    const selfprof::stats mid = selfprof::get_stats();
    CHECK(mid.threads_armed == 0);  // nothing armed thread by thread: the kernel covers them
    CHECK(perf_mappings() > maps_before);
  }
  selfprof::stop();
  const selfprof::stats st = selfprof::get_stats();
  // Before the snapshot: symbolizing keeps debug files open (in the application's range when the soft
  // and hard RLIMIT_NOFILE are equal), which is not the source's doing.
  const std::set<std::string> fds_after = list_dir("/proc/self/fd");
  const selfprof::profile p = selfprof::snapshot();
  CHECK(wl::samples_with_leaf(p, "late_thread_work") + wl::samples_with_leaf(p, "spin_units") > 0);
  if (ring) {
    auto it = st.samples_by_thread.find(static_cast<std::uint32_t>(late_tid.load()));
    const std::uint64_t late_samples = it == st.samples_by_thread.end() ? 0 : it->second;
    MESSAGE("late thread: " << late_samples << " samples");
    CHECK(late_samples > 150);
  }
  if (!ring) return;  // the signal sources' own descriptors are checked by their tests
  for (const auto& fd : fds_after)
    if (!fds_before.count(fd)) {
      char target[256] = {0};
      const std::string link = "/proc/self/fd/" + fd;
      const ssize_t n = ::readlink(link.c_str(), target, sizeof target - 1);
      MESSAGE("new descriptor " << fd << " -> " << std::string(n > 0 ? target : "?"));
    }
  CHECK(fds_after == fds_before);
  CHECK(perf_mappings() == maps_before);
}

TEST_CASE("ring source: a fork child's work stays out of the parent's profile; exec runs the new image") {
  wl::apply_test_environment();
  REQUIRE(selfprof::start(ring_options(997)));
  const bool ring = ring_running();
  const pid_t child = ::fork();
  REQUIRE(child >= 0);
  if (child == 0) {
    const std::int64_t end = wl::thread_cpu_ns() + 400000000LL;
    while (wl::thread_cpu_ns() < end) child_only_work(5);
    ::_exit(0);
  }
  wl::run_rounds(400000000LL);
  int status = 0;
  REQUIRE(::waitpid(child, &status, 0) == child);
  CHECK(WIFEXITED(status));
  const pid_t execer = ::fork();
  REQUIRE(execer >= 0);
  if (execer == 0) {  // the sampled parent's copy, mid-session, replaces itself
    ::execl("/bin/sh", "sh", "-c", "i=0; while [ $i -lt 20000 ]; do i=$((i+1)); done; exit 7", nullptr);
    ::_exit(99);
  }
  REQUIRE(::waitpid(execer, &status, 0) == execer);
  CHECK(WIFEXITED(status));
  CHECK(WEXITSTATUS(status) == 7);
  selfprof::stop();
  const selfprof::stats st = selfprof::get_stats();
  const selfprof::profile p = selfprof::snapshot();
  CHECK(ring_share_of(p, "leaf_a") > 0.3);
  CHECK(ring_share_of(p, "child_only_work") == 0);
  CHECK(st.samples_by_thread.count(static_cast<std::uint32_t>(child)) == 0);
  (void)ring;
}

TEST_CASE("ring source: a process that started sampling and then execs runs the new image normally") {
  wl::apply_test_environment();
  const pid_t pid = ::fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    if (!selfprof::start(ring_options(997))) ::_exit(98);
    wl::run_rounds(100000000LL);
    ::execl("/bin/sh", "sh", "-c", "i=0; while [ $i -lt 20000 ]; do i=$((i+1)); done; exit 7", nullptr);
    ::_exit(99);
  }
  int status = 0;
  REQUIRE(::waitpid(pid, &status, 0) == pid);
  CHECK(WIFEXITED(status));
  CHECK(WEXITSTATUS(status) == 7);
}

TEST_CASE(
    "ring source: a snapshot holds what the kernel sampled up to it, not only what the collector read") {
  wl::apply_test_environment();
  REQUIRE(selfprof::start(ring_options(997)));
  const bool ring = ring_running();
  wl::run_rounds(300000000LL);
  // At once: the collector reads the rings every ~60 ms here, so up to that much is still in them.
  const selfprof::profile before = selfprof::snapshot();
  selfprof::stop();  // reads what is left
  const selfprof::profile after = selfprof::snapshot();
  // The workload's samples only: the first snapshot's own symbolizing is sampled too.
  std::uint64_t n_before = 0, n_after = 0;
  for (const auto& s : before.stacks)
    if (wl::count_frames(before, s, "run_rounds")) n_before += s.count;
  for (const auto& s : after.stacks)
    if (wl::count_frames(after, s, "run_rounds")) n_after += s.count;
  MESSAGE("workload samples in a snapshot while running: " << n_before << "; after stop: " << n_after);
  REQUIRE(n_after > 100);
  if (ring) CHECK(n_before + 3 >= n_after);  // only the instants between the two calls differ
}

// --- kernel call chains, where kernel sampling is permitted (root here) ---

namespace ring_test {

// Writes to /dev/null for `ns` of this thread's CPU time: most of it is spent in the kernel.
WL_NOINLINE long syscall_heavy(std::int64_t ns) {
  const int fd = ::open("/dev/null", O_WRONLY | O_CLOEXEC);
  REQUIRE(fd >= 0);
  char buf[256] = {};
  long n = 0;
  for (const std::int64_t t0 = wl::thread_cpu_ns(); wl::thread_cpu_ns() - t0 < ns;)
    for (int i = 0; i < 64; ++i) n += ::write(fd, buf, sizeof buf);
  ::close(fd);
  WL_NO_TAIL();
  return n;
}

double thread_seconds(const timeval& t) { return double(t.tv_sec) + double(t.tv_usec) / 1e6; }

}  // namespace ring_test

TEST_CASE(
    "ring source as root: kernel frames under a syscall-heavy function, kernel share as getrusage says") {
  wl::apply_test_environment();
  REQUIRE(selfprof::start(ring_options(997)));
  if (!ring_running()) {
    selfprof::stop();
    return;
  }
  if (!selfprof::get_stats().kernel_time) {
    MESSAGE("kernel sampling not permitted here (not root, perf_event_paranoid >= 2): user-only samples");
    selfprof::stop();
    return;
  }
  struct rusage r0 {
  }, r1{};
  ::getrusage(RUSAGE_THREAD, &r0);
  (void)syscall_heavy(1200000000LL);
  wl::run_rounds(400000000LL);  // user time only
  ::getrusage(RUSAGE_THREAD, &r1);
  selfprof::stop();
  const selfprof::profile p = selfprof::snapshot();
  const pid_t self = static_cast<pid_t>(::syscall(SYS_gettid));
  std::uint64_t all = 0, in_kernel = 0, kernel_above_caller = 0, named = 0, kernel_frames = 0;
  for (const auto& s : p.stacks) {
    if (s.tid != static_cast<std::uint32_t>(self)) continue;
    all += s.count;
    std::size_t first_kernel = s.frames.size(), caller = s.frames.size();
    for (std::size_t i = 0; i < s.frames.size(); ++i) {
      const selfprof::frame& f = p.frames[s.frames[i]];
      if (f.kind == selfprof::frame_kind::kernel) {
        if (first_kernel == s.frames.size()) first_kernel = i;
        kernel_frames += s.count;
        if (f.name != "[kernel]") named += s.count;
      } else if (first_kernel != s.frames.size()) {
        first_kernel = s.frames.size() + 1;  // a user frame above a kernel frame: never
      }
      if (f.name.find("syscall_heavy") != std::string::npos) caller = i;
    }
    if (first_kernel >= s.frames.size()) continue;
    in_kernel += s.count;
    if (caller < first_kernel) kernel_above_caller += s.count;
  }
  const double stime = thread_seconds(r1.ru_stime) - thread_seconds(r0.ru_stime);
  const double utime = thread_seconds(r1.ru_utime) - thread_seconds(r0.ru_utime);
  const double share = all ? double(in_kernel) / double(all) : 0, truth = stime / (stime + utime);
  MESSAGE("kernel share of samples " << share << ", getrusage system share " << truth << " (" << all
                                     << " samples, " << in_kernel << " with kernel frames)");
  REQUIRE(all > 0);
  REQUIRE(in_kernel > 0);
  // Kernel chains sit on top of the user frames, under syscall_heavy (a few come from page faults and
  // interrupts elsewhere).
  CHECK(double(kernel_above_caller) >= 0.9 * double(in_kernel));
  // Named from /proc/kallsyms where it shows addresses (root with kptr_restrict <= 1).
  std::string first_line;
  std::ifstream kallsyms("/proc/kallsyms");
  std::getline(kallsyms, first_line);
  if (first_line.compare(0, 16, "0000000000000000") != 0)
    CHECK(double(named) >= 0.95 * double(kernel_frames));
  // The kernel's share of the samples roughly as the kernel accounts system time (tick-based: noisy).
  CHECK(std::abs(share - truth) < 0.15);
  // The folded form marks kernel frames as perf and stackcollapse do.
  char dir[] = "/tmp/selfprof-ring-kernel-XXXXXX";
  REQUIRE(::mkdtemp(dir) != nullptr);
  const std::string path = std::string(dir) + "/k.folded";
  REQUIRE(selfprof::dump(path));
  std::ifstream in(path);
  const std::string folded((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  CHECK(folded.find("_[k]") != std::string::npos);
  ::unlink(path.c_str());
  ::rmdir(dir);
}

// --- each fallback path, through the syscall seam (detail/sys.hpp) ---

namespace ring_test {

struct ring_seam_guard {
  ~ring_seam_guard() {
    selfprof::detail::sys() = selfprof::detail::default_syscalls();
    wl::apply_test_environment();
  }
};

int g_mmap_errno = EPERM;
void* refusing_mmap(void*, std::size_t, int, int, int, off_t) {
  errno = g_mmap_errno;
  return MAP_FAILED;
}
void* small_budget_mmap(void* addr, std::size_t len, int prot, int flags, int fd, off_t off) {
  if (len > 17 * std::size_t(::sysconf(_SC_PAGESIZE))) {  // 16 data pages and the header
    errno = EPERM;
    return MAP_FAILED;
  }
  return ::mmap(addr, len, prot, flags, fd, off);
}
int small_file_limit(int resource, struct rlimit* out) {
  const int r = ::getrlimit(static_cast<__rlimit_resource>(resource), out);
  if (r == 0 && resource == RLIMIT_NOFILE) out->rlim_max = 4;  // a budget of one event
  return r;
}

// A hard RLIMIT_NOFILE whose quarter (the ring's descriptor budget) is one event per thread and CPU: no
// room for the user-chain twins.
rlim_t g_exact_budget = 0;
int exact_file_limit(int resource, struct rlimit* out) {
  const int r = ::getrlimit(static_cast<__rlimit_resource>(resource), out);
  if (r == 0 && resource == RLIMIT_NOFILE) out->rlim_max = 4 * g_exact_budget;
  return r;
}

// Starts with the ring forced, expects a signal source and a refusal naming `why` (or, where perf is
// refused altogether, the open failure, unless `why` is checked before anything is opened).
void expect_fallback(const char* why, bool checked_before_open = false) {
  REQUIRE(selfprof::start(ring_options(997)));
  const selfprof::stats st = selfprof::get_stats();
  wl::run_rounds(50000000LL);
  selfprof::stop();
  const selfprof::stats after = selfprof::get_stats();
  CHECK(st.source != selfprof::source_kind::ring);
  CHECK(st.source != selfprof::source_kind::none);
  CHECK(after.samples > 0);
  REQUIRE_FALSE(st.refused.empty());
  const std::string& refusal = st.refused.front();
  MESSAGE(st.source_reason);
  CHECK(refusal.rfind("ring: ", 0) == 0);
  if (wl::perf_disabled_by_environment() && !checked_before_open)
    CHECK(refusal.find("perf_event_open") != std::string::npos);
  else
    CHECK(refusal.find(why) != std::string::npos);
  CHECK(st.source_reason.find("fell back from the ring source") != std::string::npos);
}

}  // namespace ring_test

TEST_CASE("ring source fallback: perf_event_open refused") {
  ring_seam_guard g;
  selfprof::detail::sys().perf_event_open = wl::failing_perf_event_open;
  REQUIRE(selfprof::start(ring_options(997)));
  const selfprof::stats st = selfprof::get_stats();
  selfprof::stop();
  CHECK(st.source != selfprof::source_kind::ring);
  REQUIRE_FALSE(st.refused.empty());
  CHECK(st.refused.front().find("perf_event_open(task-clock, ring, user only): Permission denied") !=
        std::string::npos);
}

TEST_CASE("ring source fallback: mmap refused, and locked memory used up") {
  ring_seam_guard g;
  wl::apply_test_environment();
  selfprof::detail::sys().mmap = refusing_mmap;
  g_mmap_errno = EINVAL;
  expect_fallback("mmap of CPU 0's ring failed: Invalid argument");
  g_mmap_errno = EPERM;  // what the kernel says when perf_event_mlock_kb and RLIMIT_MEMLOCK are used up
  expect_fallback("locked memory");
  CHECK(perf_mappings() == 0);
}

TEST_CASE("ring source fallback: more events than the descriptor budget") {
  ring_seam_guard g;
  wl::apply_test_environment();
  selfprof::detail::sys().getrlimit = small_file_limit;
  expect_fallback("descriptor budget", true);
}

TEST_CASE(
    "ring source: a descriptor budget without room for the twins asks for the user chain from the start") {
  ring_seam_guard g;
  wl::apply_test_environment();
  const long cpus = ::sysconf(_SC_NPROCESSORS_CONF);
  g_exact_budget = static_cast<rlim_t>(list_dir("/proc/self/task").size()) * static_cast<rlim_t>(cpus);
  selfprof::detail::sys().getrlimit = exact_file_limit;
  REQUIRE(selfprof::start(ring_options(997)));
  if (!ring_running()) {
    selfprof::stop();
    return;
  }
  big_deep_rounds(300000000LL);
  selfprof::stop();
  const selfprof::stats st = selfprof::get_stats();
  const selfprof::profile p = selfprof::snapshot();
  const auto [deep, full, marked] = count_big_deep(p);
  CHECK(marked == 0);
  MESSAGE(full << " of " << deep << " deep samples full");
  CHECK(st.ring_user_chain);
  CHECK(st.ring_chain_cut == 0);  // nothing was cut: the chain came with every sample
  REQUIRE(deep > 50);
  CHECK(double(full) >= 0.97 * double(deep));
}

TEST_CASE("ring source: a small locked-memory budget gives smaller rings, read more often") {
  ring_seam_guard g;
  wl::apply_test_environment();
  selfprof::detail::sys().mmap = small_budget_mmap;
  REQUIRE(selfprof::start(ring_options(997)));
  const bool ring = ring_running();
  wl::run_rounds(300000000LL);
  selfprof::stop();
  const selfprof::stats st = selfprof::get_stats();
  MESSAGE(st.samples << " samples, " << st.kernel_lost << " lost, " << st.collector_wakes << " wakes");
  CHECK(st.samples > 0);
  if (ring) CHECK(st.collector_wakes > 30);  // 16 pages hold ~7 samples: the 5 ms period
}

// Growing rings (see kRingStartShare): the first mmaps are the small rings, a larger one is the growth.
// The grown set opens the spinning thread's events on every CPU first (the lowest tid), then another
// thread's. The first of those waits until the spinning thread has run 20 ms more, so both sets sample it
// for a while, wherever it runs, with whichever event of a pair samples (the user chain's or not); not
// longer than the small rings hold.
std::size_t g_first_map_bytes = 0;
std::atomic<int> g_grown_maps{0};
std::atomic<bool> g_waited{false};
void* slow_growth_mmap(void* addr, std::size_t len, int prot, int flags, int fd, off_t off) {
  if (g_first_map_bytes == 0) g_first_map_bytes = len;
  if (len > g_first_map_bytes) g_grown_maps.fetch_add(1);
  return ::mmap(addr, len, prot, flags, fd, off);
}
clockid_t g_spinner_clock{};
pid_t g_spinner_tid = 0;
long slow_growth_open(void* attr, int pid, int cpu, int group, unsigned long flags) {
  if (g_grown_maps.load() > 0 && pid != g_spinner_tid && !g_waited.exchange(true)) {
    // Until the spinning thread has run 20 ms more (a loaded machine may not run it at once), at most 2 s.
    auto cpu_ns = [] {
      timespec t{};
      ::clock_gettime(g_spinner_clock, &t);
      return std::int64_t(t.tv_sec) * 1000000000 + t.tv_nsec;
    };
    const std::int64_t until = cpu_ns() + 20000000;
    for (int i = 0; i < 2000 && cpu_ns() < until; ++i)
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return selfprof::detail::default_perf_event_open(attr, pid, cpu, group, flags);
}
// Both seams, with the calling thread as the spinning one.
void watch_growth() {
  g_first_map_bytes = 0;
  g_grown_maps = 0;
  g_waited = false;
  selfprof::detail::sys().mmap = slow_growth_mmap;
  selfprof::detail::sys().perf_event_open = slow_growth_open;
  g_spinner_tid = static_cast<pid_t>(::syscall(SYS_gettid));
  REQUIRE(::pthread_getcpuclockid(::pthread_self(), &g_spinner_clock) == 0);
}

TEST_CASE("ring source: rings start small and grow once the program's samples come; no tick twice or lost") {
  ring_seam_guard g;
  wl::apply_test_environment();
  watch_growth();
  // An idle thread, whose events the grown set opens after the spinning thread's (see slow_growth_open).
  std::atomic<bool> done{false};
  std::thread idle([&] {
    while (!done) usleep(2000);
  });
  const double hz = 997;
  REQUIRE(selfprof::start(ring_options(hz)));
  const bool ring = ring_running();
  const std::int64_t t0 = wl::thread_cpu_ns();
  wl::run_rounds(800000000LL);
  const std::int64_t cpu = wl::thread_cpu_ns() - t0;
  selfprof::stop();
  done = true;
  idle.join();
  const selfprof::stats st = selfprof::get_stats();
  const selfprof::profile p = selfprof::snapshot();
  std::uint64_t mine = 0;
  for (const auto& s : p.stacks)
    if (wl::count_frames(p, s, "run_rounds")) mine += s.count;
  const double expected = double(cpu) * hz / 1e9;
  MESSAGE(mine << " samples under run_rounds, " << expected << " expected; ring " << st.ring_pages
               << " pages, first map " << g_first_map_bytes << " bytes, " << g_grown_maps.load()
               << " grown maps, " << st.ring_grow_overlap << " overlap, " << st.kernel_lost
               << " lost; user chain " << std::string(st.ring_user_chain ? "on" : "off"));
  if (!ring) return;
  const std::size_t page = std::size_t(::sysconf(_SC_PAGESIZE));
  const unsigned full = selfprof::detail::ring_pages_for(hz, page);
  CHECK(g_first_map_bytes == (full / selfprof::detail::kRingStartShare + 1) * page);
  // Root, or a RLIMIT_MEMLOCK beyond perf_event_mlock_kb (Debian's 8 MiB), has room for the grown rings.
  struct rlimit lock {};
  ::getrlimit(RLIMIT_MEMLOCK, &lock);
  if (::geteuid() != 0 && lock.rlim_cur < (std::size_t(full) + 1) * page * 4) {
    MESSAGE("RLIMIT_MEMLOCK " << lock.rlim_cur << ": no room to grow the rings is allowed");
    CHECK(double(mine) > expected * 0.9);
    return;
  }
  CHECK(st.ring_pages == full);
  CHECK(g_grown_maps.load() >= 1);
  // Both sets sampled while the second one opened (20 ms of the thread's CPU), with the user chain asked
  // for or not: those ticks were kept once.
  CHECK(st.ring_grow_overlap > 0);
  CHECK(st.kernel_lost == 0);
  CHECK(double(mine) > expected * 0.9);
  // Without the time cut both sets' ticks of those 20 ms would be here.
  CHECK(double(mine) < expected + double(st.ring_grow_overlap) / 2);
}

TEST_CASE("ring source: rings grow neither without samples nor in a session shorter than kRingGrowAfterMs") {
  ring_seam_guard g;
  wl::apply_test_environment();
  watch_growth();
  REQUIRE(selfprof::start(ring_options(997)));
  const bool ring = ring_running();
  std::this_thread::sleep_for(std::chrono::milliseconds(150));  // no CPU time: no sample, nothing grows
  const std::uint64_t before = selfprof::get_stats().collector_wakes;
  selfprof::stop();
  // Samples, then stop within kRingGrowAfterMs of the start: no read grows the rings, nor the last. A loaded
  // machine may stretch the session past it: then once more, up to 5 sessions.
  selfprof::stats st{};
  bool short_session = false;
  for (int i = 0; i < 5 && !short_session; ++i) {
    g_grown_maps = 0;
    const auto t0 = std::chrono::steady_clock::now();
    REQUIRE(selfprof::start(ring_options(997)));
    wl::run_rounds(40000000LL);
    selfprof::stop();
    short_session =
        std::chrono::steady_clock::now() - t0 < std::chrono::milliseconds(selfprof::detail::kRingGrowAfterMs);
    st = selfprof::get_stats();
  }
  MESSAGE(st.samples << " samples, " << before << " wakes in the first session; a session within "
                     << selfprof::detail::kRingGrowAfterMs
                     << " ms: " << std::string(short_session ? "yes" : "no"));
  if (!ring) return;
  CHECK(st.samples > 10);
  if (short_session) CHECK(g_grown_maps.load() == 0);
  CHECK(before > 0);
  const std::size_t page = std::size_t(::sysconf(_SC_PAGESIZE));
  CHECK(g_first_map_bytes ==
        (selfprof::detail::ring_pages_for(997, page) / selfprof::detail::kRingStartShare + 1) * page);
}

TEST_CASE("ring source: a profile taken before the collector's first thread scan still names the threads") {
  wl::apply_test_environment();
  std::atomic<bool> done{false};
  std::thread named([&] {
    pthread_setname_np(pthread_self(), "ring-named");
    while (!done) usleep(1000);
  });
  usleep(20000);  // named before start
  REQUIRE(selfprof::start(ring_options(99)));
  // Right after start: the ring arms no thread, so the first scan is the collector's, at its first wake
  // (at least 5 ms away); a profile taken before then scans itself.
  const selfprof::profile p = selfprof::snapshot();
  const bool ring = ring_running();
  selfprof::stop();
  done = true;
  named.join();
  bool main_named = false, other_named = false;
  for (const auto& t : p.threads) {
    main_named = main_named || (t.tid == static_cast<std::uint32_t>(::getpid()) && !t.name.empty());
    other_named = other_named || t.name == "ring-named";
  }
  if (!ring) return;
  CHECK(main_named);
  CHECK(other_named);
}

TEST_CASE("auto takes the ring source where it opens: no sampling signal is even installed") {
  wl::apply_test_environment();
  selfprof::options o;
  o.hz = 99;
  REQUIRE(selfprof::start(o));
  const bool ring = ring_running();
  wl::run_rounds(300000000LL);
  selfprof::stop();
  const selfprof::stats st = selfprof::get_stats();
  MESSAGE(st.source_detail << ": " << st.source_reason << "; " << st.records << " records");
  CHECK(st.samples > 10);
  if (!ring) return;
  CHECK(st.source_reason.find("no signal reaches the program") != std::string::npos);
  CHECK(st.refused.empty());
  // Records read from the kernel's rings count as the handler's do.
  CHECK(st.records >= st.samples);
}

TEST_CASE("ring source: SELFPROF_FRAME_HZ gives a marking thread a ring of its own, released when it ends") {
  wl::apply_test_environment();
  selfprof::options o = ring_options(100);
  o.frame_hz = 1000;
  o.frame_budget_ms = 1;  // every frame below is slow: its samples make the slow-frame profile
  REQUIRE(selfprof::start(o));
  const bool ring = ring_running();
  const std::size_t maps_before = perf_mappings();
  std::size_t maps_during = 0;
  std::atomic<bool> boosted{false};
  std::thread marker([&] {
    const std::int64_t t0 = wl::thread_cpu_ns();
    while (wl::thread_cpu_ns() - t0 < 600000000LL) {
      wl::spin_units(20);
      selfprof::frame_mark("tick");
      if (!boosted && perf_mappings() > maps_before) {
        maps_during = perf_mappings();
        boosted = true;
      }
    }
  });
  marker.join();
  // The collector releases the ring at a wake after the thread has ended.
  for (int i = 0; i < 100 && perf_mappings() != maps_before; ++i) usleep(20000);
  const std::size_t maps_after = perf_mappings();
  selfprof::stop();
  bool marked = false;
  const selfprof::profile slow = selfprof::snapshot_slow_frames();
  const std::uint64_t slow_samples = wl::total_samples(slow);
  MESSAGE("perf mappings " << maps_before << " -> " << maps_during << " -> " << maps_after << "; "
                           << slow_samples << " slow-frame samples");
  (void)marked;
  if (!ring) return;
  CHECK(maps_during == maps_before + 1);
  CHECK(maps_after == maps_before);
  CHECK(slow_samples > 300);  // ~0.6 s at 1 kHz (at 100 Hz it would be ~60)
}
