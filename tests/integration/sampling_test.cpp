// The known CPU split, measured by sampling: shares per leaf within a few points of the CPU time really
// spent there, full-depth stacks through 45 recursive frames, and the delivered rate.
// ctest-labels: no_tsan smoke
// Not under TSan: it defers asynchronous signals to its next safe point, so a deferred handler walks
// a stack that is no longer the interrupted one; and it kills children that start threads after fork.
#include <doctest/doctest.h>

#include <algorithm>
#include <cstdio>
#include <thread>

#include "workload.hpp"

namespace {

struct shares {
  double a, b, c;
};

void check_split(const selfprof::profile& p, const wl::truth& t, double tolerance_points) {
  // A sample lands in spin_units (the real leaf) below leaf_X: count by the frame above spin_units.
  shares measured{0, 0, 0}, truth{double(t.a) / t.total(), double(t.b) / t.total(), double(t.c) / t.total()};
  std::uint64_t in_a = 0, in_b = 0, in_c = 0, all = 0;
  for (const auto& s : p.stacks) {
    for (std::size_t i = s.frames.size(); i-- > 0;) {
      const std::string& n = p.frames[s.frames[i]].name;
      if (n.find("leaf_a") != std::string::npos) {
        in_a += s.count;
        break;
      }
      if (n.find("leaf_b") != std::string::npos) {
        in_b += s.count;
        break;
      }
      if (n.find("leaf_c") != std::string::npos) {
        in_c += s.count;
        break;
      }
    }
    all += s.count;
  }
  double in_leaves = double(in_a + in_b + in_c);
  REQUIRE(in_leaves > 0.9 * double(all));  // nearly every sample is inside a leaf
  measured = {in_a / in_leaves, in_b / in_leaves, in_c / in_leaves};
  MESSAGE("samples " << all << " in leaves " << in_leaves << "  a " << measured.a << " (truth " << truth.a
                     << ")  b " << measured.b << " (" << truth.b << ")  c " << measured.c << " (" << truth.c
                     << ")");
  CHECK(std::abs(measured.a - truth.a) * 100 < tolerance_points);
  CHECK(std::abs(measured.b - truth.b) * 100 < tolerance_points);
  CHECK(std::abs(measured.c - truth.c) * 100 < tolerance_points);
}

// Each sample in leaf_b must show the whole recursion and the function that started it, but for those the
// ring source cut at its stack copy before it asked for the kernel's user chain (`chain_cut`, said in
// the profile's notes; only where the recursion outgrows the copy, as under ASan).
void check_deep_stacks(const selfprof::profile& p, std::uint64_t chain_cut) {
  std::uint64_t deep_samples = 0, full = 0;
  for (const auto& s : p.stacks) {
    if (wl::count_frames(p, s, "leaf_b") == 0) continue;
    deep_samples += s.count;
    if (wl::count_frames(p, s, "wl::deep") >= std::size_t(wl::kDeepFrames) + 1 &&
        wl::count_frames(p, s, "run_rounds") == 1 && !s.truncated)
      full += s.count;
  }
  REQUIRE(deep_samples > 0);
  MESSAGE(full << " of " << deep_samples << " deep samples full; " << chain_cut
               << " cut before the user chain");
  CHECK(double(full) >= 0.97 * double(deep_samples - std::min(chain_cut, deep_samples)));
}

selfprof::options base_options(double hz) {
  selfprof::options o;
  o.hz = hz;
  return o;
}

}  // namespace

TEST_CASE("one thread: the known split and full-depth stacks at 250 Hz") {
  wl::apply_test_environment();
  REQUIRE(selfprof::start(base_options(250)));
  std::int64_t cpu0 = wl::process_cpu_ns();
  wl::truth t = wl::run_rounds(4000000000LL);
  std::int64_t cpu = wl::process_cpu_ns() - cpu0;
  REQUIRE(selfprof::stop());
  selfprof::profile p = selfprof::snapshot();
  selfprof::stats st = selfprof::get_stats();
  MESSAGE("source " << std::string(selfprof::source_name(st.source)) << ": " << st.source_reason);
  check_split(p, t, 5.0);
  check_deep_stacks(p, st.ring_chain_cut);
  // ~250 samples per CPU-second (±15%: tick jitter, and the clock reads in the workload).
  double rate = double(wl::total_samples(p)) / (double(cpu) / 1e9);
  MESSAGE("delivered " << rate << " samples per CPU-second");
  CHECK(rate > 250 * 0.85);
  CHECK(rate < 250 * 1.15);
  CHECK(st.dropped_full == 0);
  // The stats' CPU times: the session's covers the workload's; selfprof's own threads used some, not
  // most; and the samples are what the application's CPU time (without selfprof's) asked for.
  MESSAGE("process " << st.process_cpu_ns / 1e6 << " ms of CPU, selfprof's threads " << st.own_cpu_ns / 1e6
                     << " ms");
  CHECK(st.process_cpu_ns >= static_cast<std::uint64_t>(cpu));
  CHECK(st.own_cpu_ns > 0);
  CHECK(st.own_cpu_ns < st.process_cpu_ns / 4);
  double asked = double(st.process_cpu_ns - st.own_cpu_ns) / 1e9 * 250;
  CHECK(double(st.samples) > asked * 0.85);
  CHECK(double(st.samples) < asked * 1.15);
  selfprof::stats later = selfprof::get_stats();  // frozen at stop()
  CHECK(later.process_cpu_ns == st.process_cpu_ns);
  CHECK(later.own_cpu_ns == st.own_cpu_ns);
}

TEST_CASE("four threads: the split holds on every thread, samples follow each thread's CPU time") {
  wl::apply_test_environment();
  REQUIRE(selfprof::start(base_options(250)));
  std::vector<wl::truth> truths(4);
  std::vector<std::int64_t> cpu(4);
  std::vector<pid_t> tids(4);
  std::vector<std::thread> threads;
  for (int i = 0; i < 4; ++i)
    threads.emplace_back([&, i] {
      tids[i] = static_cast<pid_t>(gettid());
      std::int64_t c0 = wl::thread_cpu_ns();
      truths[i] = wl::run_rounds(i < 2 ? 1500000000LL : 750000000LL);  // two threads do twice the work
      cpu[i] = wl::thread_cpu_ns() - c0;
    });
  for (auto& t : threads) t.join();
  REQUIRE(selfprof::stop());
  selfprof::profile p = selfprof::snapshot();
  selfprof::stats st = selfprof::get_stats();
  wl::truth all;
  for (auto& t : truths) all.a += t.a, all.b += t.b, all.c += t.c;
  // Four busy threads share two CPUs: they are switched at kernel ticks, and CPU-timer samples land on
  // the tick lattice of each thread's CPU time, so they are less independent than one thread's. Measured
  // here over 19 runs with the CPU timer: the share of leaf_a off by -0.97 points on average, SD 1.2-2.0
  // (binomial: 1.5), worst -5.4 on a loaded CI machine. 7 points is ~3 SD; a sample charged to the wrong
  // leaf or samples bunched at one point of the round move a share by far more. A lost thread is caught
  // by the per-thread counts below.
  check_split(p, all, 7.0);
  check_deep_stacks(p, st.ring_chain_cut);
  for (int i = 0; i < 4; ++i) {
    double expected = double(cpu[i]) / 1e9 * 250;
    double got = double(st.samples_by_thread[static_cast<std::uint32_t>(tids[i])]);
    MESSAGE("thread " << i << ": " << got << " samples for " << cpu[i] / 1e6 << " ms CPU (expected "
                      << expected << ")");
    CHECK(got > expected * 0.8);
    CHECK(got < expected * 1.2);
  }
}

TEST_CASE("the folded output of a run names the leaves and is well formed") {
  wl::apply_test_environment();
  REQUIRE(selfprof::start(base_options(200)));
  wl::run_rounds(500000000LL);
  REQUIRE(selfprof::stop());
  char dir[] = "/tmp/selfprof-sampling-XXXXXX";
  REQUIRE(mkdtemp(dir) != nullptr);
  std::string path = std::string(dir) + "/cpu.folded";
  REQUIRE(selfprof::dump(path));
  std::string text = wl::read_output(path);
  CHECK(text.find("leaf_a") != std::string::npos);
  CHECK(text.find("wl::deep(int, long);wl::deep(int, long);") != std::string::npos);
  // Every line: frames, one space, an integer count.
  std::size_t lines = 0, start = 0;
  while (start < text.size()) {
    std::size_t nl = text.find('\n', start);
    REQUIRE(nl != std::string::npos);
    std::string line = text.substr(start, nl - start);
    std::size_t sp = line.rfind(' ');
    REQUIRE(sp != std::string::npos);
    CHECK(line.find_first_not_of("0123456789", sp + 1) == std::string::npos);
    ++lines;
    start = nl + 1;
  }
  CHECK(lines > 0);
  struct stat st {};
  REQUIRE(stat(path.c_str(), &st) == 0);
  CHECK((st.st_mode & 0777) == 0600);
  std::remove(path.c_str());
  rmdir(dir);
}
