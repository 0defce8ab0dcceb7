// One dump path for every trigger: the dump signal, the interval, the API and exit write the same files
// (the profile, its companions, one dump number per dump) with the same bytes for the same samples.
// ctest-labels: no_tsan
// Not under TSan: it defers asynchronous signals to its next safe point.
#include <doctest/doctest.h>

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <chrono>
#include <map>
#include <set>
#include <thread>

#include "workload.hpp"

namespace {

// The file's bytes with the one field that grows while sampling goes on (the duration, in the SVG's footer
// and the top list's header) replaced by a placeholder.
std::string triggers_normalized(const std::string& path) {
  std::string text = wl::read_output(path);
  // The SVG footer's "| 1.23 s |" or "| 456.7 ms |", the top list's "duration: 1.234".
  for (std::size_t at = 0; (at = text.find("| ", at)) != std::string::npos; at += 2) {
    std::size_t end = at + 2;
    while (end < text.size() && (std::isdigit(static_cast<unsigned char>(text[end])) || text[end] == '.'))
      ++end;
    if (end == at + 2) continue;
    const std::size_t unit = text.compare(end, 4, " ms ") == 0 ? 4 : text.compare(end, 3, " s ") == 0 ? 3 : 0;
    if (unit != 0) text.replace(at + 2, end + unit - 1 - (at + 2), "DURATION");
  }
  const std::string key = "duration: ";
  for (std::size_t at = 0; (at = text.find(key, at)) != std::string::npos; at += key.size()) {
    std::size_t end = at + key.size();
    while (end < text.size() && (std::isdigit(static_cast<unsigned char>(text[end])) || text[end] == '.'))
      ++end;
    text.replace(at + key.size(), end - at - key.size(), "DURATION");
  }
  return text;
}

unsigned long triggers_written() { return selfprof::get_stats().dumps_written; }

void triggers_wait(unsigned long n) {
  for (int i = 0; i < 4000 && triggers_written() < n; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  selfprof::detail::profiler_core::instance().flush_dumps();
  REQUIRE(triggers_written() >= n);
}

}  // namespace

TEST_CASE("the dump signal, the interval, the API and exit write the same files with the same bytes") {
  wl::apply_test_environment();
  // Ticks must stop before the four dumps: a blocked sampling signal does that; the kernel would go on
  // writing this thread's samples into the ring source's buffers.
  wl::signal_sources signals;
  wl::temp_dir tmp("selfprof-triggers");
  const std::string& dir = tmp.path;
  selfprof::options o;
  o.hz = 250;
  o.interval_s = 0.3;
  o.frame_budget_ms = 0.5;  // every game frame below is slow: the "-slow" companion is written too
  o.out = dir + "/d-%n.folded," + dir + "/d-%n.svg," + dir + "/d-%n.txt";
  REQUIRE(selfprof::start(o));
  std::atomic<bool> stop{false};
  std::thread worker([&] {
    while (!stop) {
      wl::spin_units(100);  // ~3 ms per game frame, over the 0.5 ms budget
      SELFPROF_FRAME();
    }
  });
  wl::run_rounds(200000000LL);
  stop = true;
  worker.join();
  // No sample arrives from here on: the workers are gone and this thread blocks the sampling signal.
  sigset_t block;
  sigemptyset(&block);
  sigaddset(&block, selfprof::get_stats().sample_signal);
  REQUIRE(pthread_sigmask(SIG_BLOCK, &block, nullptr) == 0);
  // Drains the ring until nothing more comes: on a loaded machine a CPU timer's last signal to a thread
  // can be handled late and carry the overruns of several ticks.
  std::uint64_t records = ~std::uint64_t(0);
  for (int i = 0; i < 30 && records != selfprof::get_stats().records; ++i) {
    records = selfprof::get_stats().records;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    selfprof::detail::profiler_core::instance().snapshot_raw();
  }
  const unsigned long before = triggers_written();

  REQUIRE(kill(getpid(), SIGUSR2) == 0);  // the signal
  triggers_wait(before + 1);
  triggers_wait(triggers_written() + 1);                    // the interval
  REQUIRE(selfprof::dump(o.out));                           // the API
  selfprof::detail::profiler_core::instance().exit_dump();  // what atexit runs: stops and writes
  CHECK_FALSE(selfprof::running());
  pthread_sigmask(SIG_UNBLOCK, &block, nullptr);

  // Every dump wrote the same set of files under its own number: d-N.folded, .svg, .txt, and the slow
  // game frames as d-N-slow.* (the profile is not a wall profile: no -offcpu companion).
  std::map<unsigned long, std::set<std::string>> by_number;
  for (const std::string& f : tmp.files()) {
    const unsigned long n = std::strtoul(f.c_str() + 2, nullptr, 10);
    by_number[n].insert(f.substr(f.find_first_not_of("0123456789", 2)));
  }
  REQUIRE(by_number.size() >= 4);
  const std::set<std::string> expected{".folded", ".svg", ".txt", "-slow.folded", "-slow.svg", "-slow.txt"};
  for (auto& d : by_number) CHECK(d.second == expected);
  // The last four dumps (signal, interval, API, exit; an earlier interval dump may precede them) hold the
  // same samples: their files are equal byte for byte, the growing duration aside.
  std::vector<unsigned long> numbers;
  for (auto& d : by_number) numbers.push_back(d.first);
  const std::vector<unsigned long> last(numbers.end() - 4, numbers.end());
  for (const std::string& suffix : expected) {
    const std::string first = triggers_normalized(dir + "/d-" + std::to_string(last[0]) + suffix);
    CHECK(first.size() > 100);
    for (unsigned long n : last) {
      INFO("dump " << n << suffix);
      CHECK(triggers_normalized(dir + "/d-" + std::to_string(n) + suffix) == first);
    }
  }
}

TEST_CASE("a forked child's exit writes no profile; SELFPROF_STOP() then exit still writes SELFPROF_OUT") {
  wl::apply_test_environment();
  wl::temp_dir tmp("selfprof-triggers");
  const std::string& dir = tmp.path;
  std::fflush(nullptr);
  pid_t child = fork();
  REQUIRE(child >= 0);
  if (child == 0) {
    setenv("SELFPROF_OUT", (dir + "/exit.folded").c_str(), 1);
    setenv("SELFPROF_HZ", "250", 1);
    if (!SELFPROF_START()) _exit(3);
    wl::run_rounds(200000000LL);
    if (!SELFPROF_STOP()) _exit(4);
    std::fflush(nullptr);
    pid_t grandchild = fork();  // exits normally: must not write (or empty) the parent's profile
    if (grandchild == 0) std::exit(0);
    int st = 0;
    if (waitpid(grandchild, &st, 0) != grandchild || !WIFEXITED(st)) _exit(5);
    if (access((dir + "/exit.folded").c_str(), F_OK) == 0) _exit(6);
    std::exit(0);  // atexit writes the stopped session's profile
  }
  int status = 0;
  REQUIRE(waitpid(child, &status, 0) == child);
  REQUIRE(WIFEXITED(status));
  CHECK(WEXITSTATUS(status) == 0);
  const std::string text = wl::read_output(dir + "/exit.folded");
  CHECK(text.find("spin_units") != std::string::npos);
}
