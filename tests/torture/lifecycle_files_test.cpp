// Torture: the lifecycle and file items of issue 15 whose fixes landed with unit and integration tests
// only, here exercised end to end through the public API, the way a program meets them:
//  - item 7:  SELFPROF_STOP() then exit, with SELFPROF_OUT set: what was collected reaches SELFPROF_OUT
//             (at exit: profiler.hpp documents stop() that way), and nothing sampled after stop();
//  - item 12: every file of one dump (the wall profile's -offcpu companion, the -slow one) has that
//             dump's %n, whatever triggered the dump (API, signal, interval, exit), even when they overlap;
//  - item 13: folded counts whose sums pass 2^64 render with a saturated total and widths within 100%;
//  - item 17: a dump through a symlinked path component in a world-writable non-sticky directory is
//             refused, the victim's file stays as it was, and the profile is still written elsewhere;
//  - item 18: loaded libraries whose files are rewritten in place (`cp` over them: truncated, same inode)
//             while dumps name their frames, and finally left truncated, never kill the program: each
//             dump completes or fails with a message. (The mmap-based reader this replaced died of
//             SIGBUS in about one run of three of this race.)
// ctest-labels: no_tsan
// Not under TSan: it forks a process that runs threads, and sends the dump signal.
#include <doctest/doctest.h>

#include <dlfcn.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include <selfprof/output/folded_parse.hpp>
#include <selfprof/output/svg.hpp>

#include "../integration/workload.hpp"

namespace lifecycle_files_torture {

// Total samples of a folded file; fails the test when it does not parse cleanly.
inline std::uint64_t folded_total(const std::string& path) {
  const std::string text = wl::read_output(path);
  auto r = selfprof::parse_folded(text, path);
  CHECK_MESSAGE(r.errors.empty(),
                path << (r.errors.empty() ? std::string() : ": " + r.errors[0].to_string()));
  std::uint64_t n = 0;
  for (const auto& s : r.prof.stacks) n += s.count;
  return n;
}

// The lines of a text.
inline std::set<std::string> lines_of(const std::string& text) {
  std::set<std::string> out;
  std::size_t pos = 0;
  while (pos < text.size()) {
    std::size_t nl = text.find('\n', pos);
    if (nl == std::string::npos) nl = text.size();
    if (nl > pos) out.insert(text.substr(pos, nl - pos));
    pos = nl + 1;
  }
  return out;
}

inline bool exists(const std::string& path) {
  struct stat st {};
  return ::lstat(path.c_str(), &st) == 0;
}

inline void write_text(const std::string& path, const std::string& text) {
  std::FILE* f = std::fopen(path.c_str(), "w");
  if (f == nullptr) return;
  std::fputs(text.c_str(), f);
  std::fclose(f);
}

// Runs `body` in a forked child (which must end the process itself) and returns its wait status. A hang
// guard only: a child still running after two minutes is killed (the status then says SIGKILL).
template <class Body>
int run_child(Body body) {
  std::fflush(nullptr);
  const pid_t child = ::fork();
  REQUIRE(child >= 0);
  if (child == 0) {
    body();
    _exit(99);  // the body did not end the process
  }
  int status = 0;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(120);
  for (;;) {
    const pid_t r = ::waitpid(child, &status, WNOHANG);
    if (r == child) return status;
    REQUIRE(r == 0);
    if (std::chrono::steady_clock::now() > deadline) {
      ::kill(child, SIGKILL);
      REQUIRE(::waitpid(child, &status, 0) == child);
      FAIL("the child hung (killed after 120 s)");
      return status;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
}

inline std::string describe_status(int status) {
  if (WIFEXITED(status)) return "exit status " + std::to_string(WEXITSTATUS(status));
  if (WIFSIGNALED(status))
    return "killed by signal " + std::to_string(WTERMSIG(status)) + " (" + strsignal(WTERMSIG(status)) + ")";
  return "wait status " + std::to_string(status);
}

// Work done after stop(): must never show in the profile.
WL_NOINLINE inline double lifecycle_after_stop_spin(std::int64_t cpu_ns) {
  double r = 0;
  const std::int64_t start = wl::thread_cpu_ns();
  while (wl::thread_cpu_ns() - start < cpu_ns) r += wl::spin_units(2);
  WL_NO_TAIL();
  return r;
}

// The frames of an SVG: every `<rect x="X%" ... width="W%"` of a frame, in percent.
struct svg_rect {
  double x = 0, w = 0;
};
inline std::vector<svg_rect> svg_frame_rects(const std::string& svg) {
  std::vector<svg_rect> out;
  const std::string open = "<rect x=\"";
  for (std::size_t at = svg.find(open); at != std::string::npos; at = svg.find(open, at + 1)) {
    const std::size_t end = svg.find('>', at);
    const std::string tag = svg.substr(at, end == std::string::npos ? std::string::npos : end - at);
    if (tag.find("%\"") == std::string::npos) continue;  // the background, not a frame
    svg_rect r;
    r.x = std::strtod(tag.c_str() + open.size(), nullptr);
    const std::size_t w = tag.find(" width=\"");
    if (w == std::string::npos) continue;
    r.w = std::strtod(tag.c_str() + w + 8, nullptr);
    out.push_back(r);
  }
  return out;
}

// The percentages of the frames' tooltips: "name (N samples, P%)".
inline std::vector<double> svg_tooltip_percents(const std::string& svg) {
  std::vector<double> out;
  for (std::size_t at = svg.find("<title>"); at != std::string::npos; at = svg.find("<title>", at + 1)) {
    const std::size_t end = svg.find("</title>", at);
    const std::size_t pct = svg.rfind("%)", end);
    if (end == std::string::npos || pct == std::string::npos || pct < at) continue;
    std::size_t start = svg.rfind(", ", pct);
    if (start == std::string::npos || start < at) continue;
    out.push_back(std::strtod(svg.c_str() + start + 2, nullptr));
  }
  return out;
}

// Copies the bytes of `from` to a new file `to`.
inline bool copy_file(const std::string& from, const std::string& to) {
  const std::string bytes = selfprof::detail::read_small_file(from, std::size_t(64) << 20);
  if (bytes.empty()) return false;
  const int fd = ::open(to.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0755);
  if (fd < 0) return false;
  const bool ok = ::write(fd, bytes.data(), bytes.size()) == static_cast<ssize_t>(bytes.size());
  return ::close(fd) == 0 && ok;
}

using omit_fn = double (*)(long);

WL_NOINLINE inline double lifecycle_fixture_driver(omit_fn fn, std::int64_t cpu_ns) {
  double r = 0;
  const std::int64_t start = wl::thread_cpu_ns();
  while (wl::thread_cpu_ns() - start < cpu_ns) r += fn(300000);
  WL_NO_TAIL();
  return r;
}

inline std::string unwind_fixture_path() {
#if defined(SELFPROF_UNWIND_FIXTURE_LIB)
  return SELFPROF_UNWIND_FIXTURE_LIB;
#else
  return "";
#endif
}

}  // namespace lifecycle_files_torture

namespace lft = lifecycle_files_torture;

TEST_CASE("torture: stop() then exit with SELFPROF_OUT set writes what was collected (issue 15, item 7)") {
  wl::apply_test_environment();
  for (const bool via_env : {true, false}) {
    CAPTURE(via_env);
    wl::temp_dir dir("selfprof-stop-exit");
    const std::string out = dir.path + "/exit.folded", report = dir.path + "/report.txt";
    const int status = lft::run_child([&] {
      if (via_env) {
        setenv("SELFPROF_OUT", out.c_str(), 1);
        setenv("SELFPROF_HZ", "250", 1);
        if (!SELFPROF_START()) _exit(3);
      } else {
        selfprof::options o;
        o.hz = 250;
        o.out = out;
        if (!selfprof::start(o)) _exit(3);
      }
      wl::run_rounds(300000000LL);
      if (!SELFPROF_STOP()) _exit(4);
      const selfprof::stats st = selfprof::get_stats();
      lft::write_text(report, std::to_string(st.samples) + " " + (lft::exists(out) ? "1" : "0") + "\n");
      lft::lifecycle_after_stop_spin(150000000LL);  // not sampled: the profile ended at stop()
      std::exit(0);                                 // the exit dump runs in atexit
    });
    INFO(lft::describe_status(status));
    CHECK(WIFEXITED(status));
    CHECK(WEXITSTATUS(status) == 0);
    unsigned long long at_stop = 0;
    int written_at_stop = -1;
    REQUIRE(std::sscanf(selfprof::detail::read_small_file(report).c_str(), "%llu %d", &at_stop,
                        &written_at_stop) == 2);
    MESSAGE(at_stop << " samples at stop(); the file existed at stop(): "
                    << std::string(written_at_stop ? "yes" : "no") << " (documented: written at exit)");
    REQUIRE(lft::exists(out));
    const std::string text = wl::read_output(out);
    CHECK(at_stop > 20);
    CHECK(lft::folded_total(out) == at_stop);  // everything collected, nothing after stop()
    CHECK(text.find("lifecycle_after_stop_spin") == std::string::npos);
  }
}

TEST_CASE("torture: every file of one dump has its number, whatever triggered it (issue 15, item 12)") {
  wl::apply_test_environment();
  wl::temp_dir dir("selfprof-dump-numbers");
  const std::string report = dir.path + "/report.txt";
  const int status = lft::run_child([&] {
    selfprof::options o;
    o.mode = selfprof::profile_mode::wall;
    o.hz = 199;
    o.out = dir.path + "/p-%n.folded";
    o.interval_s = 0.1;  // dumps on the dumper thread, overlapping the API's and the signal's
    o.frame_budget_ms = 2;
    if (!selfprof::start(o)) _exit(3);
    std::atomic<bool> done{false};
    std::thread game([&] {  // marks game frames, so dumps write a -slow companion too
      while (!done) {
        wl::spin_units(20);
        ::usleep(2000);
        SELFPROF_FRAME();
      }
    });
    int api_ok = 0, api_failed = 0;
    for (int i = 0; i < 8; ++i) {
      if (selfprof::dump(o.out))
        ++api_ok;
      else
        ++api_failed;
      ::kill(::getpid(), SIGUSR2);
      ::usleep(60000);  // off the CPU: the -offcpu companion has content
    }
    done = true;
    game.join();
    if (!selfprof::stop()) _exit(4);
    selfprof::detail::profiler_core::instance().flush_dumps();
    const selfprof::stats st = selfprof::get_stats();
    lft::write_text(report, std::to_string(api_ok) + " " + std::to_string(api_failed) + " " +
                                std::to_string(st.dumps_written) + " " + std::to_string(st.dumps_failed) +
                                "\n");
    std::exit(0);  // and the exit dump: one more
  });
  INFO(lft::describe_status(status));
  REQUIRE(WIFEXITED(status));
  REQUIRE(WEXITSTATUS(status) == 0);
  unsigned long api_ok = 0, api_failed = 0, auto_written = 0, auto_failed = 0;
  REQUIRE(std::sscanf(selfprof::detail::read_small_file(report).c_str(), "%lu %lu %lu %lu", &api_ok,
                      &api_failed, &auto_written, &auto_failed) == 4);
  CHECK(api_failed == 0);
  CHECK(auto_failed == 0);

  // number -> the kinds of file written under it ("", "-offcpu", "-slow")
  std::map<unsigned long, std::set<std::string>> dumps;
  std::vector<std::string> stray;
  for (const std::string& f : dir.files()) {
    if (f == "report.txt") continue;
    unsigned long n = 0;
    int used = 0;
    if (f.rfind("p-", 0) != 0 || std::sscanf(f.c_str() + 2, "%lu%n", &n, &used) != 1) {
      stray.push_back(f);
      continue;
    }
    const std::string tag = f.substr(2 + static_cast<std::size_t>(used));
    if (tag != ".folded" && tag != "-offcpu.folded" && tag != "-slow.folded") {
      stray.push_back(f);
      continue;
    }
    dumps[n].insert(tag.substr(0, tag.size() - 7));
  }
  MESSAGE(api_ok << " API dumps, " << auto_written << " signal and interval dumps, 1 exit dump; "
                 << dumps.size() << " dump numbers in the directory");
  CHECK(stray.empty());
  CHECK(auto_written >= 8);  // the 8 signals at least
  CHECK(dumps.size() == api_ok + auto_written + 1);
  std::size_t with_slow = 0;
  for (const auto& d : dumps) {
    const std::string base = dir.path + "/p-" + std::to_string(d.first);
    CAPTURE(base);
    CHECK(d.second.count("") == 1);
    CHECK(d.second.count("-offcpu") == 1);
    if (d.second.count("-slow")) ++with_slow;
    if (!d.second.count("") || !d.second.count("-offcpu")) continue;
    // Same dump, same snapshot: the companion holds exactly the main file's off-CPU lines, counts
    // included (wall time grows from one snapshot to the next).
    const auto main_lines = lft::lines_of(wl::read_output(base + ".folded"));
    const auto off_lines = lft::lines_of(wl::read_output(base + "-offcpu.folded"));
    std::size_t foreign = 0, missing = 0;
    for (const std::string& l : off_lines) foreign += main_lines.count(l) ? 0 : 1;
    for (const std::string& l : main_lines)
      if (l.find("[blocked: ") != std::string::npos || l.find("[off-cpu]") != std::string::npos)
        missing += off_lines.count(l) ? 0 : 1;
    CHECK(foreign == 0);
    CHECK(missing == 0);
  }
  MESSAGE(with_slow << " of them with a -slow companion");
  CHECK(with_slow * 2 >= dumps.size());  // game frames were marked for most of the run
}

TEST_CASE("torture: folded counts whose sums pass 2^64 render saturated (issue 15, item 13)") {
  struct input {
    const char* what;
    std::string folded;
  };
  const std::string max = "18446744073709551615", half = "9223372036854775808";
  const input inputs[] = {
      {"2^63 + 2^63", "main;a " + half + "\nmain;b " + half + "\n"},
      {"(2^64-1) + 2", "main;a " + max + "\nmain;b 2\n"},
      {"the same stack twice", "main;a " + max + "\nmain;a 5\nmain;b 1\n"},
  };
  wl::temp_dir dir("selfprof-saturate");
  for (const input& in : inputs) {
    CAPTURE(in.what);
    const selfprof::folded_parse_result r = selfprof::parse_folded(in.folded, in.what);
    REQUIRE(r.errors.empty());
    CHECK(r.prof.info.samples == UINT64_MAX);
    selfprof::svg_options so;
    const std::string rendered = selfprof::detail::write_svg(r.prof, so);
    // The dump's route too: the same profile written to a file by the sink.
    const std::string path = dir.path + "/sum.svg";
    REQUIRE(selfprof::detail::write_profile_paths(r.prof, path, selfprof::detail::fields_now(1),
                                                  selfprof::detail::dump_output_options(r.prof),
                                                  selfprof::sink_options{}));
    const std::string written = selfprof::detail::read_small_file(path, std::size_t(16) << 20);
    for (const std::string* svg : {&rendered, &written}) {
      CAPTURE((svg == &rendered ? "write_svg" : "written file"));
      CHECK(svg->find("No stack counts found") == std::string::npos);
      CHECK(svg->find("all (18,446,744,073,709,551,615 samples, 100%)") != std::string::npos);
      CHECK(svg->find("all (1 samples") == std::string::npos);
      CHECK(svg->find("all (0 samples") == std::string::npos);
      const auto rects = lft::svg_frame_rects(*svg);
      CHECK(rects.size() >= 3);  // all, main, a (b may be too narrow to draw)
      double widest = 0;
      for (const auto& rect : rects) {
        CHECK(rect.x >= 0);
        CHECK(rect.w >= 0);
        CHECK(rect.w <= 100.0005);
        CHECK(rect.x + rect.w <= 100.001);
        if (rect.w > widest) widest = rect.w;
      }
      CHECK(widest > 99.99);  // the root spans the graph
      const auto pcts = lft::svg_tooltip_percents(*svg);
      CHECK(pcts.size() >= 3);
      for (double p : pcts) {
        CHECK(p >= 0);
        CHECK(p <= 100.0);
      }
    }
  }
}

TEST_CASE(
    "torture: a dump through a symlinked component of a shared directory is refused (issue 15, item 17)") {
  wl::apply_test_environment();
  wl::temp_dir dir("selfprof-shared-link");
  const std::string shared = dir.path + "/shared", victim_dir = dir.path + "/victim";
  const std::string victim = victim_dir + "/x.svg", target = shared + "/sub/x.svg";
  const std::string victim_bytes = "<svg>the victim's own file</svg>\n";
  REQUIRE(::mkdir(shared.c_str(), 0700) == 0);
  REQUIRE(::chmod(shared.c_str(), 0777) == 0);  // world-writable, no sticky bit, whatever the umask
  REQUIRE(::mkdir(victim_dir.c_str(), 0700) == 0);
  lft::write_text(victim, victim_bytes);
  REQUIRE(::symlink(victim_dir.c_str(), (shared + "/sub").c_str()) == 0);
  struct stat before {};
  REQUIRE(::stat(victim.c_str(), &before) == 0);
  auto victim_untouched = [&] {
    struct stat now {};
    CHECK(::stat(victim.c_str(), &now) == 0);
    CHECK(now.st_ino == before.st_ino);
    CHECK(selfprof::detail::read_small_file(victim) == victim_bytes);
    CHECK(wl::count_dir(victim_dir.c_str()) == 1);  // no temp file left beside it either
  };

  // The API's dump, with the default policy and with shared directories allowed: the symlink is refused
  // either way, and the profile collected so far is still written elsewhere afterwards.
  for (const bool allow_shared : {false, true}) {
    CAPTURE(allow_shared);
    selfprof::options o;
    o.hz = 250;
    o.allow_shared_dir = allow_shared;
    o.dump_signal = 0;
    REQUIRE(selfprof::start(o));
    wl::run_rounds(150000000LL);
    const selfprof::status refused = selfprof::dump(target + "," + shared + "/sub/x.folded");
    wl::run_rounds(50000000LL);
    REQUIRE(selfprof::stop());
    const std::uint64_t collected = selfprof::get_stats().samples;
    CHECK_FALSE(refused);
    MESSAGE(refused.message());
    CHECK(refused.message().find(target) != std::string::npos);
    if (allow_shared)
      CHECK(refused.message().find("symbolic link") != std::string::npos);
    else
      CHECK((refused.message().find("sticky") != std::string::npos ||
             refused.message().find("symbolic link") != std::string::npos));
    victim_untouched();
    CHECK_FALSE(lft::exists(victim_dir + "/x.folded"));
    const std::string elsewhere = dir.path + "/elsewhere-" + std::to_string(allow_shared) + ".folded";
    REQUIRE(selfprof::dump(elsewhere));
    CHECK(collected > 10);
    CHECK(lft::folded_total(elsewhere) == collected);  // nothing already collected was lost
  }

  // The exit dump of a program run with SELFPROF_OUT through the link: refused, said on stderr, and the
  // program's exit status stays its own.
  const std::string err = dir.path + "/stderr.txt";
  const int status = lft::run_child([&] {
    const int fd = ::open(err.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
    if (fd < 0 || ::dup2(fd, 2) < 0) _exit(5);
    setenv("SELFPROF_OUT", target.c_str(), 1);
    setenv("SELFPROF_HZ", "250", 1);
    setenv("SELFPROF_ALLOW_SHARED_DIR", "1", 1);
    if (!SELFPROF_START()) _exit(3);
    wl::run_rounds(100000000LL);
    std::exit(6);
  });
  INFO(lft::describe_status(status));
  CHECK(WIFEXITED(status));
  CHECK(WEXITSTATUS(status) == 6);
  const std::string said = selfprof::detail::read_small_file(err);
  MESSAGE("the exit dump said: " << said);
  CHECK(said.find(target) != std::string::npos);
  CHECK(said.find("symbolic link") != std::string::npos);
  victim_untouched();
}

TEST_CASE("torture: libraries rewritten in place under the symbolizer never kill (issue 15, item 18)") {
  wl::apply_test_environment();
  const std::string fixture = lft::unwind_fixture_path();
  if (fixture.empty() || !lft::exists(fixture)) {
    MESSAGE("no SELFPROF_UNWIND_FIXTURE_LIB built: skipped");
    return;
  }
  const std::string original = selfprof::detail::read_small_file(fixture, std::size_t(64) << 20);
  REQUIRE(original.size() > 4096);
  constexpr int kCopies = 64, kRacers = 4;
  for (int round = 0; round < 3; ++round) {  // the race is won in about one run of three by the old mmap
    CAPTURE(round);
    wl::temp_dir dir("selfprof-truncated-lib");
    auto lib = [&](int i) { return dir.path + "/libtruncated" + std::to_string(i) + ".so"; };
    for (int i = 0; i < kCopies; ++i) REQUIRE(lft::copy_file(fixture, lib(i)));
    const std::string report = dir.path + "/report.txt";
    const int status = lft::run_child([&] {
      selfprof::options o;
      o.hz = 1000;
      o.out = dir.path + "/signal-%n.folded";  // the signal's dumps, written by the dumper thread
      std::vector<ino_t> inodes;
      std::vector<lft::omit_fn> fns;
      for (int i = 0; i < kCopies; ++i) {
        void* h = ::dlopen(lib(i).c_str(), RTLD_NOW | RTLD_LOCAL);
        if (h == nullptr) _exit(3);
        auto fn = reinterpret_cast<lft::omit_fn>(::dlsym(h, "selfprof_unwind_omit_caller"));
        if (fn == nullptr) _exit(4);
        fns.push_back(fn);
        struct stat st {};
        if (::stat(lib(i).c_str(), &st) != 0) _exit(5);
        inodes.push_back(st.st_ino);
      }
      if (!selfprof::start(o)) _exit(6);
      for (lft::omit_fn fn : fns) lft::lifecycle_fixture_driver(fn, 15000000LL);  // samples in every copy
      const std::uint64_t collected = selfprof::get_stats().samples;
      // From here on the program never runs the libraries again (its own pages of a truncated file are gone
      // too), but selfprof has samples in each of them to name, and has read none of them yet.

      // `cp` over every copy, again and again, while dumps name the frames: truncated, then rewritten in
      // chunks (same inode), so the symbolizer finds files shrinking under it.
      std::atomic<bool> done{false};
      std::vector<std::thread> racers;
      for (int r = 0; r < kRacers; ++r)
        racers.emplace_back([&, r] {
          while (!done)
            for (int i = r; i < kCopies && !done; i += kRacers) {
              const int fd = ::open(lib(i).c_str(), O_WRONLY | O_TRUNC | O_CLOEXEC);
              if (fd < 0) continue;
              for (std::size_t at = 0; at < original.size(); at += 2048) {
                const std::size_t n = std::min<std::size_t>(2048, original.size() - at);
                if (::write(fd, original.data() + at, n) != static_cast<ssize_t>(n)) break;
              }
              ::close(fd);
            }
        });
      std::string messages;
      int api_ok = 0;
      auto api_dump = [&](const std::string& name) {
        const selfprof::status st = selfprof::dump(dir.path + "/" + name);
        if (st)
          ++api_ok;
        else
          messages += st.message() + "\n";
      };
      api_dump("racing-1.folded");
      ::kill(::getpid(), SIGUSR2);  // a dump on the dumper thread, naming the frames concurrently
      api_dump("racing-2.folded," + dir.path + "/racing-2.svg");
      selfprof::detail::profiler_core::instance().flush_dumps();
      done = true;
      for (auto& t : racers) t.join();

      // Finally every copy is left truncated to a few garbage bytes, in place.
      for (int i = 0; i < kCopies; ++i) {
        const int fd = ::open(lib(i).c_str(), O_WRONLY | O_TRUNC | O_CLOEXEC);
        if (fd < 0) _exit(7);
        const char garbage[] = "not an ELF file any more";
        if (::write(fd, garbage, sizeof garbage) != static_cast<ssize_t>(sizeof garbage)) _exit(8);
        ::close(fd);
        struct stat st {};
        if (::stat(lib(i).c_str(), &st) != 0 || st.st_ino != inodes[static_cast<std::size_t>(i)]) _exit(9);
      }
      ::kill(::getpid(), SIGUSR2);
      api_dump("truncated.folded," + dir.path + "/truncated.svg");
      selfprof::detail::profiler_core::instance().flush_dumps();
      if (!selfprof::stop()) _exit(10);
      const selfprof::stats st = selfprof::get_stats();
      lft::write_text(report, std::to_string(collected) + " " + std::to_string(api_ok) + " " +
                                  std::to_string(st.dumps_written) + " " + std::to_string(st.dumps_failed) +
                                  "\n" + messages);
      _exit(0);  // not exit(): the libraries' destructors are in pages the truncation took away
    });
    INFO(lft::describe_status(status));
    REQUIRE(WIFEXITED(status));  // never SIGBUS
    REQUIRE(WEXITSTATUS(status) == 0);
    const std::string rep = selfprof::detail::read_small_file(report);
    MESSAGE(rep);
    unsigned long long collected = 0;
    unsigned long api_ok = 0, written = 0, failed = 0;
    REQUIRE(std::sscanf(rep.c_str(), "%llu %lu %lu %lu", &collected, &api_ok, &written, &failed) == 4);
    CHECK(collected > 100);  // samples landed in the libraries
    // Each dump completed, or failed with a message naming selfprof.
    const std::string messages = rep.substr(rep.find('\n') + 1);
    std::size_t said = 0;
    for (std::size_t at = messages.find("selfprof"); at != std::string::npos;
         at = messages.find("selfprof", at + 1))
      ++said;
    CHECK(api_ok + said >= 3);
    CHECK(written + failed == 2);
    std::size_t files = 0;
    for (const std::string& f : dir.files()) {
      if (f.size() < 7 || f.compare(f.size() - 7, 7, ".folded") != 0) continue;
      ++files;
      CHECK(lft::folded_total(dir.path + "/" + f) >= collected);  // nothing collected is lost
    }
    CHECK(files == api_ok + written);
  }
}
