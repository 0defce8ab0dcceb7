// Torture: what sampling collects has a ceiling (options::max_memory, SELFPROF_MAX_MEMORY) (issue 15,
// item 16). 20,000 short threads at 999 Hz grow RSS by less than the ceiling (ended threads are merged);
// more distinct stacks than the table's part are counted under one "[selfprof: memory ceiling]" stack
// with the total intact; an absurd rate x depth starts with a clipped ring, a ring that cannot be
// allocated is an error status (never an exception); 50 dump signals at once are answered together.
// ctest-labels: no_tsan slow
// Not under TSan: it defers asynchronous signals (the ticks, SIGUSR2), and kills children that start threads.
// slow (a minute of 20,000 threads): run by the gcc stage only; the logic is the same elsewhere.
#include <doctest/doctest.h>

#include <signal.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include <selfprof/output/folded_parse.hpp>

#include "../integration/workload.hpp"

namespace memory_ceiling_torture {

// Sanitized builds run fewer threads (the CMake build says so; GCC and Clang say so themselves).
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
constexpr bool kSanitized = true;
#elif defined(SELFPROF_TEST_SANITIZE_ADDRESS) && defined(SELFPROF_TEST_SANITIZE_THREAD)
constexpr bool kSanitized = SELFPROF_TEST_SANITIZE_ADDRESS || SELFPROF_TEST_SANITIZE_THREAD;
#else
constexpr bool kSanitized = false;
#endif

// A field of /proc/self/status in bytes ("VmRSS:   1234 kB"), 0 when missing.
std::size_t status_bytes(const char* field) {
  const std::string s = selfprof::detail::read_small_file("/proc/self/status");
  const std::size_t at = s.find(std::string("\n") + field + ":");
  if (at == std::string::npos) return 0;
  return static_cast<std::size_t>(std::strtoull(s.c_str() + at + std::strlen(field) + 2, nullptr, 10)) * 1024;
}

// Resets VmHWM to the current RSS (Linux 4.0+); false when the kernel does not allow it.
bool reset_peak_rss() {
  FILE* f = std::fopen("/proc/self/clear_refs", "w");
  if (!f) return false;
  const bool ok = std::fputs("5", f) >= 0;
  return std::fclose(f) == 0 && ok;
}

// One short request: arms itself (as a thread-per-request server under the preload library would be
// armed at once) and works about a millisecond of CPU, on deep stacks.
void request() {
  (void)selfprof::register_thread();  // fails harmlessly while not profiling (the warm-up)
  wl::run_rounds(1000000);
}

// `n` short threads, `at_once` at a time.
void churn(int n, int at_once) {
  std::vector<std::thread> batch;
  for (int i = 0; i < n; i += at_once) {
    for (int k = 0; k < at_once && i + k < n; ++k) batch.emplace_back(request);
    for (auto& t : batch) t.join();
    batch.clear();
  }
}

// Distinct stacks without end: each call goes down `levels` frames by one of two call sites per level,
// so 2^levels paths, and every sample lands in a stack of its own.
WL_NOINLINE double branch(int n, unsigned bits);
WL_NOINLINE double branch_a(int n, unsigned bits) {
  double r = branch(n, bits);
  WL_NO_TAIL();
  return r;
}
WL_NOINLINE double branch_b(int n, unsigned bits) {
  double r = branch(n, bits) + 1;
  WL_NO_TAIL();
  return r;
}
WL_NOINLINE double branch(int n, unsigned bits) {
  if (n == 0) return wl::spin_units(1);
  double r = (bits & 1) ? branch_a(n - 1, bits >> 1) : branch_b(n - 1, bits >> 1);
  WL_NO_TAIL();
  return r;
}

std::uint64_t folded_total(const std::string& path) {
  const std::string text = wl::read_output(path);
  auto r = selfprof::detail::parse_folded(text, path);
  CHECK(r.errors.empty());
  std::uint64_t n = 0;
  for (auto& s : r.prof.stacks) n += s.count;
  return n;
}

bool has_note(const std::vector<std::string>& notes, const char* text) {
  return std::any_of(notes.begin(), notes.end(),
                     [&](const std::string& n) { return n.find(text) != std::string::npos; });
}

}  // namespace memory_ceiling_torture

namespace mct = memory_ceiling_torture;

// First, while the process has no other thread: the child forks cleanly.
TEST_CASE("a sample ring that cannot be allocated makes start() return an error, not throw") {
  if (mct::kSanitized)
    return;  // the sanitizers reserve terabytes of address space: RLIMIT_AS would break them
  wl::apply_test_environment();
  const pid_t child = fork();
  REQUIRE(child >= 0);
  if (child == 0) {
    // Room for 64 MiB more: the ring asked for below is 135 MB (16,384 slots of 1,024 frames).
    struct rlimit as {};
    as.rlim_cur = as.rlim_max = mct::status_bytes("VmSize") + (std::size_t{64} << 20);
    if (setrlimit(RLIMIT_AS, &as) != 0) _exit(20);
    selfprof::options o;
    o.hz = 100000;
    o.max_depth = 1024;
    o.max_memory = std::size_t{1} << 30;
    o.dump_signal = 0;
    try {
      selfprof::status st = selfprof::start(o);
      if (st) _exit(21);
      if (st.message().find("sample ring") == std::string::npos) _exit(22);
      if (selfprof::running()) _exit(23);
    } catch (...) {
      _exit(24);
    }
    _exit(0);
  }
  int ws = 0;
  REQUIRE(waitpid(child, &ws, 0) == child);
  CHECK(WIFEXITED(ws));
  CHECK(WEXITSTATUS(ws) == 0);
}

TEST_CASE("20,000 short threads at 999 Hz: RSS grows by less than the ceiling, ended threads merged") {
  wl::apply_test_environment();
  const int threads = mct::kSanitized ? 6000 : 20000;
  constexpr int kAtOnce = 4;
  constexpr std::size_t kCeiling = std::size_t{16} << 20;
  // The same churn without profiling first: glibc's thread stack cache and malloc arenas reach their
  // steady size, so what grows afterwards is selfprof's.
  mct::churn(mct::kSanitized ? 200 : 1000, kAtOnce);
  const bool peak = mct::reset_peak_rss();
  const std::size_t before = mct::status_bytes("VmRSS");
  selfprof::options o;
  o.hz = 999;
  o.max_memory = kCeiling;
  o.dump_signal = 0;
  REQUIRE(selfprof::start(o));
  const auto t0 = std::chrono::steady_clock::now();
  mct::churn(threads, kAtOnce);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::this_thread::sleep_for(std::chrono::milliseconds(1200));  // the collector's next full scans
  // A dump's copy of the table is inside the ceiling too; symbolizing is not (it reads debug info).
  const std::uint64_t copied = selfprof::detail::profiler_core::instance().snapshot_raw().table.total();
  const std::size_t after = peak ? mct::status_bytes("VmHWM") : mct::status_bytes("VmRSS");
  const selfprof::profile p = selfprof::snapshot();
  const selfprof::stats s = selfprof::get_stats();
  REQUIRE(selfprof::stop());
  const double grown_mib = static_cast<double>(after > before ? after - before : 0) / (1 << 20);
  MESSAGE(threads << " threads in " << seconds << " s: " << std::string(peak ? "peak " : "") << "RSS grew "
                  << grown_mib << " MiB (ceiling " << (kCeiling >> 20) << " MiB); " << s.samples
                  << " samples, " << s.unique_stacks << " stacks, table " << s.table_bytes << " bytes, ring "
                  << s.ring_bytes << " bytes; merged: " << s.threads_merged << " threads, " << s.stacks_merged
                  << " stack records; " << s.samples_by_thread.size() << " per-thread totals");
  // ASan keeps freed memory in its quarantine (256 MiB) and every thread's fake stack: RSS says nothing
  // there, so only the ceiling's own accounting is checked.
  if (!mct::kSanitized) CHECK(after - before < kCeiling);
  CHECK(s.ring_bytes <= kCeiling / 4);
  CHECK(s.table_bytes <= kCeiling / 2);
  // The short threads were sampled, and most merged once ended. CPU timers (no perf_event) tick at most
  // once per kernel tick (4 ms at CONFIG_HZ=250): a quarter of the samples, and of the threads sampled.
  const bool perf = s.source == selfprof::source_kind::perf;
  CHECK(copied > static_cast<std::uint64_t>(threads) / (perf ? 4 : 10));
  CHECK(s.threads_merged > static_cast<std::uint64_t>(threads) / (perf ? 2 : 10));
  CHECK(s.samples_by_thread.size() < 2000);  // bounded, not one per thread ever run
  // ditto the stacks (each thread's are its own until merged; the last ~1,000 threads are not merged yet,
  // which weighs more in the sanitizers' shorter run)
  CHECK(s.unique_stacks < static_cast<std::size_t>(threads) / (mct::kSanitized ? 2 : 4));
  std::uint64_t total = 0;
  for (const auto& st : p.stacks) total += st.count;
  CHECK(total == p.info.samples);
  CHECK(mct::has_note(p.info.notes, "ended threads merged"));
}

TEST_CASE("more distinct stacks than the table's part: counted under the ceiling stack, total intact") {
  wl::apply_test_environment();
  constexpr std::size_t kCeiling = std::size_t{1} << 20;
  selfprof::options o;
  o.hz = 2999;
  o.max_memory = kCeiling;
  o.dump_signal = 0;
  REQUIRE(selfprof::start(o));
  // New distinct stacks until the table's part is full (1.5 s of CPU with perf_event; CPU timers tick
  // at most 250 times a second, so longer), 20 s of CPU at most.
  std::uint32_t rng = 1;
  const std::int64_t start = wl::thread_cpu_ns();
  std::int64_t next_check = start + 1500000000LL;
  for (std::int64_t now = start; now - start < 20000000000LL; now = wl::thread_cpu_ns()) {
    rng = rng * 1664525u + 1013904223u;
    mct::branch(14, rng >> 8);
    if (now >= next_check) {
      if (selfprof::get_stats().stacks_merged > 0) break;
      next_check = now + 100000000LL;
    }
  }
  REQUIRE(selfprof::stop());  // first: the profile and the counts then come from the same samples
  const selfprof::profile p = selfprof::snapshot();
  const selfprof::stats s = selfprof::get_stats();
  std::uint64_t total = 0, at_ceiling = 0;
  for (const auto& st : p.stacks) {
    total += st.count;
    if (!st.frames.empty() && p.frames[st.frames.back()].name == "[selfprof: memory ceiling]")
      at_ceiling += st.count;
  }
  MESSAGE(s.samples << " samples, " << s.unique_stacks << " stacks in " << s.table_bytes << " bytes; "
                    << s.stacks_merged << " records (" << s.samples_merged << " samples) at the ceiling");
  CHECK(s.table_bytes <= kCeiling / 2);
  CHECK(s.stacks_merged > 0);
  CHECK(s.samples_merged > 0);
  CHECK(at_ceiling == s.samples_merged);
  CHECK(total == s.samples);  // the flame graph's total is every sample
  CHECK(mct::has_note(p.info.notes, "[selfprof: memory ceiling]"));
}

TEST_CASE("100 kHz x 1024 frames starts with the ring clipped to its part of the ceiling") {
  wl::apply_test_environment();
  selfprof::options o;
  o.hz = 100000;
  o.max_depth = 1024;
  o.dump_signal = 0;
  selfprof::status st;
  CHECK_NOTHROW(st = selfprof::start(o));
  REQUIRE(st);
  wl::run_rounds(100000000LL);
  REQUIRE(selfprof::stop());  // first: the ring source's records are counted when the collector reads them
  const selfprof::stats s = selfprof::get_stats();
  MESSAGE("ring " << s.ring_slots << " slots, " << s.ring_bytes << " bytes; " << s.records << " records, "
                  << s.dropped_full << " dropped");
  CHECK(s.ring_clipped);
  CHECK(s.ring_bytes <= o.max_memory / 4);
  CHECK(s.ring_slots >= 64);
  CHECK(mct::has_note(s.notes, "sample ring clipped"));
  CHECK(s.records > 0);

  o.max_memory = 0;  // below the smallest ceiling: raised to it, and said so
  o.hz = 99;
  o.max_depth = 128;
  REQUIRE(selfprof::start(o));
  const selfprof::stats small = selfprof::get_stats();
  REQUIRE(selfprof::stop());
  CHECK(small.max_memory == selfprof::kMinMaxMemory);
  CHECK(mct::has_note(small.notes, "max_memory raised"));
}

TEST_CASE("50 dump signals at once are answered by a few dumps, the last with everything") {
  wl::apply_test_environment();
  wl::temp_dir dir;
  selfprof::options o;
  o.hz = 999;
  o.out = dir.path + "/d-%n.folded";
  REQUIRE(selfprof::start(o));
  REQUIRE(selfprof::get_stats().dump_signal == SIGUSR2);
  std::thread worker([] { wl::run_rounds(300000000LL); });
  worker.join();
  const std::uint64_t before = selfprof::detail::profiler_core::instance().snapshot_raw().table.total();
  for (int i = 0; i < 50; ++i) REQUIRE(kill(getpid(), SIGUSR2) == 0);
  // A signal sent to the process may reach another thread a little later: stop() answers every request
  // that arrived, and only then are the counters final.
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  selfprof::detail::profiler_core::instance().flush_dumps();
  REQUIRE(selfprof::stop());
  const selfprof::stats s = selfprof::get_stats();
  std::vector<std::pair<unsigned long, std::string>> numbered;
  for (auto& f : dir.files()) numbered.emplace_back(std::strtoul(f.c_str() + 2, nullptr, 10), f);
  std::sort(numbered.begin(), numbered.end());
  MESSAGE("50 requests: " << numbered.size() << " dump files, " << s.dumps_written << " dumps written; "
                          << before << " samples before them");
  REQUIRE(!numbered.empty());
  CHECK(numbered.size() < 50);
  CHECK(s.dumps_written == numbered.size());
  CHECK(mct::folded_total(dir.path + "/" + numbered.back().second) >= before);
}
