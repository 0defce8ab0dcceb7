// Dumps in production: 100 SIGUSR2 dumps while threads work (complete files, monotone totals),
// windowed dumps that never count a sample twice, failed dumps that lose nothing, periodic dumps,
// the exit dump, and a SIGKILL that leaves the last periodic dump intact.
// ctest-labels: no_tsan smoke
// Not under TSan: it defers asynchronous signals to its next safe point, so a deferred handler walks
// a stack that is no longer the interrupted one; and it kills children that start threads after fork.
#include <doctest/doctest.h>

#include <dirent.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <map>
#include <thread>

#include <selfprof/output/folded_parse.hpp>

#include "workload.hpp"

namespace {

using wl::temp_dir;

// Total samples of a folded file; fails the test when it does not parse cleanly.
std::uint64_t folded_total(const std::string& path) {
  std::string text = wl::read_output(path);
  auto r = selfprof::detail::parse_folded(text, path);
  CHECK(r.errors.empty());
  CHECK((text.empty() || text.back() == '\n'));
  std::uint64_t n = 0;
  for (auto& s : r.prof.stacks) n += s.count;
  return n;
}

struct workers {
  std::atomic<bool> stop{false};
  std::vector<std::thread> threads;
  explicit workers(int n) {
    for (int i = 0; i < n; ++i)
      threads.emplace_back([this] {
        while (!stop) wl::spin_units(5);
      });
  }
  void join() {
    stop = true;
    for (auto& t : threads)
      if (t.joinable()) t.join();
  }
  ~workers() { join(); }
};

void wait_written(unsigned long n) {
  for (int i = 0; i < 2000 && selfprof::get_stats().dumps_written + selfprof::get_stats().dumps_failed < n;
       ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  selfprof::detail::profiler_core::instance().flush_dumps();
}

}  // namespace

TEST_CASE("100 SIGUSR2 dumps while four threads work: every file complete, totals monotone") {
  wl::apply_test_environment();
  temp_dir dir;
  selfprof::options o;
  o.hz = 250;
  o.out = dir.path + "/cpu-%n.folded";
  REQUIRE(selfprof::start(o));
  CHECK(selfprof::get_stats().dump_signal == SIGUSR2);
  workers w(4);
  for (unsigned long i = 1; i <= 100; ++i) {
    REQUIRE(kill(getpid(), SIGUSR2) == 0);
    wait_written(i);
  }
  w.join();
  REQUIRE(selfprof::stop());
  CHECK(selfprof::get_stats().dumps_written == 100);
  std::vector<std::pair<unsigned long, std::string>> numbered;
  for (auto& f : dir.files()) {
    unsigned long n = std::strtoul(f.c_str() + 4, nullptr, 10);
    numbered.emplace_back(n, f);
  }
  std::sort(numbered.begin(), numbered.end());
  REQUIRE(numbered.size() == 100);
  std::uint64_t previous = 0;
  int non_monotone = 0;
  for (auto& f : numbered) {
    std::uint64_t total = folded_total(dir.path + "/" + f.second);
    if (total < previous) ++non_monotone;
    previous = total;
  }
  CHECK(non_monotone == 0);
  CHECK(previous > 100);
}

TEST_CASE("windowed dumps: consecutive windows never count a sample twice, and lose none") {
  wl::apply_test_environment();
  temp_dir dir;
  selfprof::options o;
  o.hz = 250;
  o.window_s = 60;
  o.out = dir.path + "/w-%n.folded";
  REQUIRE(selfprof::start(o));
  workers w(3);
  for (unsigned long i = 1; i <= 15; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(40));
    REQUIRE(kill(getpid(), SIGUSR2) == 0);
    wait_written(i);
  }
  w.join();
  REQUIRE(selfprof::stop());
  std::uint64_t seq = 0;
  selfprof::detail::raw_snapshot rest = selfprof::detail::profiler_core::instance().snapshot_raw(true, &seq);
  std::uint64_t sum = rest.table.total();
  for (auto& f : dir.files()) sum += folded_total(dir.path + "/" + f);
  std::uint64_t total = selfprof::get_stats().samples;
  MESSAGE("windows add up to " << sum << ", the cumulative profile has " << total);
  CHECK(dir.files().size() == 15);
  CHECK(total > 100);
  CHECK(sum == total);
}

namespace {
int g_fail_errno = 0;
int failing_openat(int dirfd, const char* path, int flags, mode_t mode) {
  if (g_fail_errno) {
    errno = g_fail_errno;
    return -1;
  }
  return selfprof::detail::default_openat(dirfd, path, flags, mode);
}
}  // namespace

TEST_CASE("failed dumps name the path and the reason, and lose nothing") {
  wl::apply_test_environment();
  temp_dir dir;
  selfprof::options o;
  o.hz = 250;
  REQUIRE(selfprof::start(o));
  wl::run_rounds(200000000LL);
  std::uint64_t before = selfprof::get_stats().samples;

  selfprof::status missing = selfprof::dump(dir.path + "/no/such/dir/cpu.folded");
  REQUIRE_FALSE(missing);
  CHECK(missing.message().find(dir.path + "/no/such/dir/cpu.folded") != std::string::npos);
  CHECK(missing.message().find("No such file or directory") != std::string::npos);

  std::string target = dir.path + "/elsewhere.folded";
  REQUIRE(symlink(target.c_str(), (dir.path + "/link.folded").c_str()) == 0);
  selfprof::status link = selfprof::dump(dir.path + "/link.folded");
  REQUIRE_FALSE(link);
  CHECK(link.message().find("link.folded") != std::string::npos);
  struct stat st {};
  CHECK(lstat(target.c_str(), &st) != 0);  // nothing written through the link

  selfprof::detail::sys().openat = failing_openat;  // a read-only directory, even for root
  g_fail_errno = EACCES;
  selfprof::status denied = selfprof::dump(dir.path + "/cpu.folded");
  g_fail_errno = 0;
  selfprof::detail::sys() = selfprof::detail::default_syscalls();
  wl::apply_test_environment();
  REQUIRE_FALSE(denied);
  CHECK(denied.message().find("Permission denied") != std::string::npos);

  wl::run_rounds(100000000LL);
  REQUIRE(selfprof::stop());
  REQUIRE(selfprof::dump(dir.path + "/good.folded"));
  std::uint64_t written = folded_total(dir.path + "/good.folded");
  CHECK(written >= before);
  CHECK(written == selfprof::get_stats().samples);
}

TEST_CASE("periodic dumps keep coming while the program runs") {
  wl::apply_test_environment();
  temp_dir dir;
  selfprof::options o;
  o.hz = 250;
  o.interval_s = 0.15;
  o.dump_signal = 0;
  o.out = dir.path + "/p-%n.folded,p-%n.svg";
  o.out = dir.path + "/p-%n.folded," + dir.path + "/p-%n.svg";
  REQUIRE(selfprof::start(o));
  CHECK(selfprof::get_stats().dump_signal == 0);
  wl::run_rounds(800000000LL);
  REQUIRE(selfprof::stop());
  std::size_t folded = 0, svg = 0;
  for (auto& f : dir.files()) {
    if (f.find(".folded") != std::string::npos) ++folded, folded_total(dir.path + "/" + f);
    if (f.find(".svg") != std::string::npos) ++svg;
  }
  MESSAGE(folded << " periodic folded dumps, " << svg << " SVGs");
  CHECK(folded >= 3);
  CHECK(svg == folded);
}

TEST_CASE("a normal exit writes SELFPROF_OUT; SIGKILL leaves the last periodic dump intact") {
  wl::apply_test_environment();
  temp_dir dir;
  std::fflush(nullptr);
  pid_t child = fork();
  REQUIRE(child >= 0);
  if (child == 0) {
    setenv("SELFPROF_OUT", (dir.path + "/exit.folded").c_str(), 1);
    setenv("SELFPROF_HZ", "250", 1);
    if (!SELFPROF_START()) _exit(3);
    wl::run_rounds(300000000LL);
    std::exit(0);  // atexit writes the profile
  }
  int status = 0;
  REQUIRE(waitpid(child, &status, 0) == child);
  CHECK(WIFEXITED(status));
  CHECK(WEXITSTATUS(status) == 0);
  CHECK(folded_total(dir.path + "/exit.folded") > 30);

  std::fflush(nullptr);
  pid_t victim = fork();
  REQUIRE(victim >= 0);
  if (victim == 0) {
    setenv("SELFPROF_OUT", (dir.path + "/k-%n.folded").c_str(), 1);
    setenv("SELFPROF_INTERVAL", "0.05", 1);
    if (!SELFPROF_START()) _exit(3);
    for (;;) wl::spin_units(10);
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(800));
  kill(victim, SIGKILL);
  REQUIRE(waitpid(victim, &status, 0) == victim);
  CHECK(WIFSIGNALED(status));
  unsigned long last = 0;
  std::string last_file;
  for (auto& f : dir.files()) {
    if (f.rfind("k-", 0) != 0 || f.find(".tmp") != std::string::npos) continue;
    unsigned long n = std::strtoul(f.c_str() + 2, nullptr, 10);
    if (n > last) last = n, last_file = f;
  }
  REQUIRE(last >= 3);
  CHECK(folded_total(dir.path + "/" + last_file) > 0);
}
