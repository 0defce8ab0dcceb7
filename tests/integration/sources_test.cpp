// Each tick source forced in turn and `auto`, at 99 Hz and 1 kHz, as root or not, with perf_event_open
// made to fail through the syscall seam, and EMFILE falling back to CPU timers per thread.
// ctest-labels: no_tsan
// Not under TSan: it defers asynchronous signals to its next safe point, so a deferred handler walks
// a stack that is no longer the interrupted one; and it kills children that start threads after fork.
#include <doctest/doctest.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <thread>

#include "workload.hpp"

namespace {

struct run_result {
  selfprof::status started;
  selfprof::stats st;
  selfprof::profile p;
  std::int64_t cpu_ns = 0;
};

run_result run_with(selfprof::source_kind kind, double hz, std::int64_t cpu_ns, int threads = 1) {
  run_result r;
  selfprof::options o;
  o.hz = hz;
  o.source = kind;
  r.started = selfprof::start(o);
  if (!r.started) return r;
  std::int64_t c0 = wl::process_cpu_ns();
  std::vector<std::thread> ts;
  for (int i = 1; i < threads; ++i) ts.emplace_back([&] { wl::run_rounds(cpu_ns); });
  wl::run_rounds(cpu_ns);
  for (auto& t : ts) t.join();
  r.cpu_ns = wl::process_cpu_ns() - c0;
  selfprof::stop();
  r.st = selfprof::get_stats();
  r.p = selfprof::snapshot();
  return r;
}

double share_of(const selfprof::profile& p, const char* leaf) {
  std::uint64_t in = 0, all = 0;
  for (const auto& s : p.stacks) {
    all += s.count;
    if (wl::count_frames(p, s, leaf)) in += s.count;
  }
  return all ? double(in) / double(all) : 0;
}

bool perf_with_kernel_expected() { return geteuid() == 0 && !wl::perf_disabled_by_environment(); }
bool perf_user_only_expected() { return !wl::perf_disabled_by_environment(); }

struct seam_guard {
  ~seam_guard() {
    selfprof::detail::sys() = selfprof::detail::default_syscalls();
    wl::apply_test_environment();
  }
};

}  // namespace

TEST_CASE("forced CPU timer: samples, kernel time counted, 99 Hz") {
  wl::apply_test_environment();
  run_result r = run_with(selfprof::source_kind::timer, 99, 1500000000LL);
  REQUIRE(r.started);
  CHECK(r.st.source == selfprof::source_kind::timer);
  CHECK(r.st.kernel_time);
  double rate = double(r.st.samples) / (double(r.cpu_ns) / 1e9);
  MESSAGE("timer: " << rate << " samples/CPU-s");
  CHECK(rate > 99 * 0.8);
  CHECK(rate < 99 * 1.2);
  CHECK(share_of(r.p, "leaf_a") == doctest::Approx(0.6).epsilon(0.25));
}

TEST_CASE("forced itimer: samples with SIGPROF, kernel time counted") {
  wl::apply_test_environment();
  run_result r = run_with(selfprof::source_kind::itimer, 99, 1500000000LL);
  REQUIRE(r.started);
  CHECK(r.st.source == selfprof::source_kind::itimer);
  CHECK(r.st.sample_signal == SIGPROF);
  double rate = double(r.st.samples) / (double(r.cpu_ns) / 1e9);
  MESSAGE("itimer: " << rate << " samples/CPU-s");
  // ITIMER_PROF counts the whole process's CPU time, selfprof's own threads included.
  CHECK(rate > 99 * 0.75);
  CHECK(rate < 99 * 1.25);
  CHECK(share_of(r.p, "leaf_a") == doctest::Approx(0.6).epsilon(0.25));
}

TEST_CASE("forced perf_event: with kernel time as root, user-only otherwise, a clear refusal without perf") {
  wl::apply_test_environment();
  run_result r = run_with(selfprof::source_kind::perf, 99, 1500000000LL);
  if (wl::perf_disabled_by_environment()) {
    REQUIRE_FALSE(r.started);
    CHECK(r.started.message().find("perf_event_open") != std::string::npos);
    CHECK(r.started.message().find("Permission denied") != std::string::npos);
    return;
  }
  REQUIRE(r.started);
  CHECK(r.st.source == selfprof::source_kind::perf);
  CHECK(r.st.kernel_time == perf_with_kernel_expected());
  CHECK(r.st.source_detail.find(perf_with_kernel_expected() ? "user+kernel" : "user only") !=
        std::string::npos);
  double rate = double(r.st.samples) / (double(r.cpu_ns) / 1e9);
  MESSAGE("perf (" << r.st.source_detail << "): " << rate << " samples/CPU-s");
  CHECK(rate > 99 * 0.8);
  CHECK(rate < 99 * 1.2);
}

TEST_CASE("auto at 99 Hz takes the CPU timer and says why") {
  wl::apply_test_environment();
  wl::signal_sources signals;  // what auto takes where the ring cannot open
  run_result r = run_with(selfprof::source_kind::automatic, 99, 300000000LL);
  REQUIRE(r.started);
  CHECK(r.st.source == selfprof::source_kind::timer);
  CHECK(r.st.source_reason.find("kernel tick") != std::string::npos);
  CHECK(r.st.samples > 0);
}

TEST_CASE("auto at 99 Hz: threads that wait for a CPU move from the CPU timer to perf_event") {
  wl::apply_test_environment();
  wl::signal_sources signals;  // what auto takes where the ring cannot open
  // Twice as many busy threads as CPUs, plus one: each waits for a CPU more than half the time, the
  // case where CPU timers sample on the tick lattice.
  const unsigned cpus = std::max(1u, std::thread::hardware_concurrency());
  std::atomic<bool> done{false};
  std::vector<std::thread> busy;
  selfprof::options o;
  o.hz = 99;
  REQUIRE(selfprof::start(o));
  CHECK(selfprof::get_stats().source == selfprof::source_kind::timer);
  for (unsigned i = 0; i < 2 * cpus + 1; ++i)
    busy.emplace_back([&] {
      while (!done.load()) wl::spin_units(1);
    });
  auto decided = [](const selfprof::stats& st) {
    if (st.source == selfprof::source_kind::perf) return true;
    for (const auto& n : st.notes)
      if (n.find("no perf_event with kernel time") != std::string::npos) return true;
    return false;
  };
  selfprof::stats st = selfprof::get_stats();
  for (auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
       !decided(st) && std::chrono::steady_clock::now() < deadline; st = selfprof::get_stats())
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  const std::uint64_t records_at_switch = st.records;
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  selfprof::stats later = selfprof::get_stats();
  done.store(true);
  for (auto& t : busy) t.join();
  REQUIRE(selfprof::stop());
  MESSAGE("source " << std::string(selfprof::source_name(st.source)) << ": " << st.source_reason);
  for (const auto& n : st.notes) MESSAGE("note: " << n);
  MESSAGE("decided after " << records_at_switch << " samples, " << st.collector_wakes << " collector wakes");
  REQUIRE(decided(st));
  // Judged at the first ticks, then every 100 ms while more threads are busy than CPUs: 45-55 samples
  // here. Checks every 500 ms, the first one a baseline, decide at 1.5 s: ~300 samples at 2 CPUs x 99 Hz.
  // Counted in samples, which follow CPU time, so a slow machine does not change it much.
  CHECK(records_at_switch < 250);
  if (perf_with_kernel_expected()) {
    CHECK(st.source == selfprof::source_kind::perf);
    CHECK(st.kernel_time);
    CHECK(st.source_reason.find("switched from the CPU timer") != std::string::npos);
    CHECK(st.threads_armed >= 2 * cpus + 1);
    CHECK(later.records > records_at_switch + 20);  // the moved threads are sampled by their events
  } else {
    CHECK(st.source ==
          selfprof::source_kind::timer);  // no event with kernel time: the timer stays, and a note says why
    CHECK(later.records > records_at_switch + 20);
  }
}

TEST_CASE("auto at 1 kHz: perf_event delivers the rate; without perf, CPU timers weighted by overruns") {
  wl::apply_test_environment();
  wl::signal_sources signals;  // what auto takes where the ring cannot open
  run_result r = run_with(selfprof::source_kind::automatic, 1000, 1500000000LL, 2);
  REQUIRE(r.started);
  double weighted = double(r.st.samples) / (double(r.cpu_ns) / 1e9);
  double distinct = double(r.st.records) / (double(r.cpu_ns) / 1e9);
  MESSAGE("auto 1 kHz -> " << std::string(selfprof::source_name(r.st.source)) << " (" << r.st.source_detail
                           << "): " << weighted << " weighted, " << distinct
                           << " distinct samples/CPU-s; effective " << r.st.effective_hz);
  if (perf_user_only_expected()) {
    CHECK(r.st.source == selfprof::source_kind::perf);
    CHECK(r.st.kernel_time == perf_with_kernel_expected());
    // A user-only event (unprivileged at perf_event_paranoid 2) delivers fewer ticks per CPU-second:
    // 0.6-0.94 of the rate here at 1 kHz, in this session and with the previous handler alike (cause not
    // established; docs/measurements.md). Still far above the CPU timer's 250 Hz.
    CHECK(distinct > 1000 * (perf_with_kernel_expected() ? 0.9 : 0.5));
  } else {
    CHECK(r.st.source == selfprof::source_kind::timer);
    REQUIRE(r.st.refused.size() >= 1);
    CHECK(r.st.refused[0].find("perf") != std::string::npos);
    CHECK(r.st.effective_hz < 1000);
    CHECK(weighted > 1000 * 0.85);  // overruns carry the ticks the signal could not
    CHECK(weighted < 1000 * 1.15);
  }
  CHECK(weighted < 1000 * 1.15);
}

TEST_CASE("perf_event_open failing with EACCES through the seam: auto falls back and reports it") {
  seam_guard restore;
  selfprof::detail::sys().perf_event_open = wl::failing_perf_event_open;
  run_result r = run_with(selfprof::source_kind::automatic, 1000, 300000000LL);
  REQUIRE(r.started);
  CHECK(r.st.source == selfprof::source_kind::timer);
  REQUIRE(r.st.refused.size() >= 2);
  CHECK(r.st.refused[0].find("Permission denied") != std::string::npos);
  run_result forced = run_with(selfprof::source_kind::perf, 99, 1000000LL);
  CHECK_FALSE(forced.started);
}

namespace {
int g_timer_fail_errno = ENOSYS;
int failing_timer_create(clockid_t, struct sigevent*, timer_t*) {
  errno = g_timer_fail_errno;
  return -1;
}
}  // namespace

TEST_CASE("no per-thread sources at all: itimer is the last resort") {
  seam_guard restore;
  selfprof::detail::sys().perf_event_open = wl::failing_perf_event_open;
  selfprof::detail::sys().timer_create = failing_timer_create;
  run_result r = run_with(selfprof::source_kind::automatic, 99, 500000000LL);
  REQUIRE(r.started);
  CHECK(r.st.source == selfprof::source_kind::itimer);
  CHECK(r.st.refused.size() >= 2);
  CHECK(r.st.samples > 0);
}

namespace {
std::atomic<int> g_perf_opens{0};
long perf_open_then_emfile(void* attr, int pid, int cpu, int group, unsigned long flags) {
  long fd = selfprof::detail::default_perf_event_open(attr, pid, cpu, group, flags);
  if (fd >= 0 && g_perf_opens.fetch_add(1) >= 3) {  // the probe, then two threads get perf events
    close(static_cast<int>(fd));
    errno = EMFILE;
    return -1;
  }
  return fd;
}
}  // namespace

TEST_CASE("EMFILE while arming perf events: the remaining threads get CPU timers") {
  if (!perf_user_only_expected()) return;
  seam_guard restore;
  g_perf_opens = 0;
  selfprof::detail::sys().perf_event_open = perf_open_then_emfile;
  run_result r = run_with(selfprof::source_kind::perf, 99, 400000000LL, 4);
  REQUIRE(r.started);
  CHECK(r.st.source == selfprof::source_kind::perf);
  CHECK(r.st.threads_fallback >= 2);
  CHECK(r.st.samples_by_thread.size() >= 4);
}
