// Game and engine frames, really sampled: a loop with update/physics/render phases and a spike in
// physics::rebuild_broadphase every 50th frame. The slow-frames profile is dominated by the spike, the
// all-frames profile is not; frame statistics agree with the loop's own CLOCK_MONOTONIC timing; two
// threads mark frames of their own loops; the worst frames come out one by one, in time order.
// ctest-labels: no_tsan
// Not under TSan: it defers asynchronous signals to its next safe point, so a deferred handler walks
// a stack that is no longer the interrupted one; and it kills children that start threads after fork.
#include <doctest/doctest.h>
#include <sys/stat.h>

#include <algorithm>
#include <cstdio>
#include <thread>

#include "workload.hpp"

namespace game {

inline std::uint64_t mono_ns() {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return std::uint64_t(ts.tv_sec) * 1000000000ull + std::uint64_t(ts.tv_nsec);
}

// Spins for `ns` of wall time: frame durations stay what the loop asks for on a busy machine, and the
// CPU the thread gets meanwhile is spread evenly over the phases.
WL_NOINLINE inline void burn(std::int64_t ns) {
  std::uint64_t t0 = mono_ns();
  while (mono_ns() - t0 < std::uint64_t(ns)) wl::spin_units(0), wl::spin_units(1);
  WL_NO_TAIL();
}

WL_NOINLINE inline void update_world(std::int64_t ns) {
  burn(ns);
  WL_NO_TAIL();
}
WL_NOINLINE inline void step_physics(std::int64_t ns) {
  burn(ns);
  WL_NO_TAIL();
}
WL_NOINLINE inline void render_scene(std::int64_t ns) {
  burn(ns);
  WL_NO_TAIL();
}

}  // namespace game

namespace physics {
WL_NOINLINE inline void rebuild_broadphase(std::int64_t ns) {
  game::burn(ns);
  WL_NO_TAIL();
}
}  // namespace physics

namespace {

constexpr std::int64_t kMs = 1000000;

struct loop_timing {
  std::vector<double> frame_ms;  // the loop's own measure of each frame (mark to mark)
  std::uint32_t tid = 0;
};

// `frames` frames of 2 + 3 + 3 ms; every 50th (from the 25th) adds a 60 ms broadphase rebuild
// (the budget is 40 ms: far from both, so a busy CI machine that stretches frames does not blur them).
WL_NOINLINE loop_timing run_game_loop(const char* name, int frames, std::int64_t scale = 1) {
  loop_timing t;
  t.tid = static_cast<std::uint32_t>(gettid());
  selfprof::frame_mark(name);  // starts frame 1
  std::uint64_t last = game::mono_ns();
  for (int i = 1; i <= frames; ++i) {
    game::update_world(2 * kMs / scale);
    game::step_physics(3 * kMs / scale);
    if (i % 50 == 25) physics::rebuild_broadphase(60 * kMs / scale);
    game::render_scene(3 * kMs / scale);
    std::uint64_t now = game::mono_ns();
    selfprof::frame_mark(name);
    t.frame_ms.push_back(double(now - last) / 1e6);
    last = now;
  }
  WL_NO_TAIL();
  return t;
}

std::uint64_t samples_in(const selfprof::profile& p, const std::string& needle) {
  std::uint64_t n = 0;
  for (const auto& s : p.stacks)
    for (auto f : s.frames)
      if (p.frames[f].name.find(needle) != std::string::npos) {
        n += s.count;
        break;
      }
  return n;
}

double quantile(std::vector<double> v, double q) {
  std::sort(v.begin(), v.end());
  std::size_t rank = static_cast<std::size_t>(std::ceil(q * double(v.size())));
  return v[rank == 0 ? 0 : rank - 1];
}

const selfprof::frame_loop_stats* find_loop(const std::vector<selfprof::frame_loop_stats>& all,
                                            const char* name, std::uint32_t tid) {
  for (const auto& l : all)
    if (l.name == name && l.tid == tid) return &l;
  return nullptr;
}

selfprof::options frame_options(double hz, double frame_hz = 0) {
  selfprof::options o;
  o.hz = hz;
  o.frame_budget_ms = 40;
  o.frame_hz = frame_hz;
  o.dump_signal = 0;
  return o;
}

// The scenario of examples/game_loop, checked on profiles taken while `loop` ran.
void check_spike_scenario(const selfprof::profile& all, const selfprof::profile& slow) {
  std::uint64_t all_total = wl::total_samples(all), slow_total = wl::total_samples(slow);
  std::uint64_t all_spike = samples_in(all, "rebuild_broadphase"),
                slow_spike = samples_in(slow, "rebuild_broadphase");
  MESSAGE("all frames: " << all_spike << " of " << all_total
                         << " in rebuild_broadphase; slow frames: " << slow_spike << " of " << slow_total);
  REQUIRE(all_total > 50);
  REQUIRE(slow_total > 10);
  CHECK(double(slow_spike) > 0.5 * double(slow_total));  // the spike dominates the slow frames
  CHECK(double(all_spike) < 0.25 * double(all_total));   // and is a minority of everything (~13% of CPU)
  // The slow profile holds only game-loop code of slow frames, never other threads. (Which phases of a
  // slow frame get samples besides the spike depends on where the kernel's ticks fall: a CPU timer ticks
  // with CONFIG_HZ, and these 8 ms frames are exactly two ticks long.)
  CHECK(samples_in(slow, "run_game_loop") == slow_total);
}

}  // namespace

TEST_CASE("slow frames: the spike function dominates them, not the all-frames profile") {
  wl::apply_test_environment();
  REQUIRE(selfprof::start(frame_options(250)));
  loop_timing t = run_game_loop("main", 400);  // ~3.4 s, 8 spikes
  REQUIRE(selfprof::stop());
  selfprof::profile all = selfprof::snapshot();
  selfprof::profile slow = selfprof::snapshot_slow_frames();
  CHECK(slow.info.view == "slow frames");
  check_spike_scenario(all, slow);

  // Frame statistics against the loop's own timing.
  const selfprof::frame_loop_stats* l = find_loop(all.info.frame_loops, "main", t.tid);
  REQUIRE(l != nullptr);
  double own_max = *std::max_element(t.frame_ms.begin(), t.frame_ms.end());
  double own_p50 = quantile(t.frame_ms, 0.5);
  std::size_t own_over = 0;
  for (double d : t.frame_ms) own_over += d > 40 ? 1 : 0;
  MESSAGE(selfprof::frame_stats_line(*l)
          << "  | own: p50 " << own_p50 << " max " << own_max << " over " << own_over);
  CHECK(l->count == t.frame_ms.size());
  CHECK(l->lost == 0);
  CHECK(l->budget_ms == doctest::Approx(40));
  CHECK(l->p50_ms == doctest::Approx(own_p50).epsilon(0.03));  // 1% buckets + a clock read apart
  CHECK(l->max_ms == doctest::Approx(own_max).epsilon(0.01));
  CHECK(l->over_budget == own_over);
  CHECK(l->p50_ms <= l->p95_ms);
  CHECK(l->p95_ms <= l->p99_ms);
  CHECK(l->p99_ms <= l->max_ms + 1e-9);
  // 8 of 400 frames carry the spike (p99 is a spike frame); a preempted frame may add to them.
  CHECK(l->over_budget >= 8);
  CHECK(l->p99_ms > 50);
}

TEST_CASE("SELFPROF_FRAME_HZ: marked threads sampled faster, all-frames profile stays in CPU proportion") {
  wl::apply_test_environment();
  REQUIRE(selfprof::start(frame_options(100, 1000)));
  // An unmarked thread does the same CPU work as the marked one, at the same time.
  std::int64_t other_cpu = 0;
  std::uint32_t other_tid = 0;
  std::thread other([&] {
    other_tid = static_cast<std::uint32_t>(gettid());
    std::int64_t c0 = wl::thread_cpu_ns();
    game::burn(2500 * kMs);
    other_cpu = wl::thread_cpu_ns() - c0;
  });
  std::int64_t c0 = wl::thread_cpu_ns();
  loop_timing t = run_game_loop("main", 300);
  std::int64_t own_cpu = wl::thread_cpu_ns() - c0;
  other.join();
  REQUIRE(selfprof::stop());
  selfprof::stats st = selfprof::get_stats();
  selfprof::profile all = selfprof::snapshot();
  selfprof::profile slow = selfprof::snapshot_slow_frames();
  MESSAGE("source " << std::string(selfprof::source_name(st.source)) << "; slow profile at " << slow.info.hz
                    << " Hz");
  for (auto& n : st.notes) MESSAGE("note: " << n);
  check_spike_scenario(all, slow);
  CHECK(slow.info.hz == doctest::Approx(1000));
  double marked = double(st.samples_by_thread[t.tid]) / (double(own_cpu) / 1e9);
  double unmarked = double(st.samples_by_thread[other_tid]) / (double(other_cpu) / 1e9);
  MESSAGE("all-frames samples per CPU-second: marked " << marked << ", unmarked " << unmarked);
  CHECK(marked == doctest::Approx(unmarked).epsilon(0.25));
  // The slow-frame samples came at the higher rate: ~6 spikes * ~68 ms at ~1000 Hz (or the kernel tick).
  CHECK(wl::total_samples(slow) > 60);
}

TEST_CASE("slow frames and SELFPROF_FRAME_HZ on the signal sources: samples tagged by the handler") {
  wl::apply_test_environment();
  wl::signal_sources signals;  // the cases above run on what auto takes: the ring where it opens
  REQUIRE(selfprof::start(frame_options(100, 1000)));
  run_game_loop("main", 300);
  REQUIRE(selfprof::stop());
  const selfprof::stats st = selfprof::get_stats();
  CHECK(st.source != selfprof::source_kind::ring);
  CHECK(st.sample_signal != 0);
  selfprof::profile slow = selfprof::snapshot_slow_frames();
  check_spike_scenario(selfprof::snapshot(), slow);
  CHECK(slow.info.hz == doctest::Approx(1000));
}

TEST_CASE("two threads mark frames of their own loops: render and sim") {
  wl::apply_test_environment();
  REQUIRE(selfprof::start(frame_options(200)));
  loop_timing render, sim;
  std::thread r([&] { render = run_game_loop("render", 120); });
  std::thread s([&] { sim = run_game_loop("sim", 200, 2); });  // half-length frames
  r.join();
  s.join();
  REQUIRE(selfprof::stop());
  std::vector<selfprof::frame_loop_stats> loops = selfprof::frame_stats();
  const selfprof::frame_loop_stats* lr = find_loop(loops, "render", render.tid);
  const selfprof::frame_loop_stats* ls = find_loop(loops, "sim", sim.tid);
  REQUIRE(lr != nullptr);
  REQUIRE(ls != nullptr);
  CHECK(render.tid != sim.tid);
  CHECK(lr->count == 120);
  CHECK(ls->count == 200);
  CHECK(lr->p50_ms == doctest::Approx(quantile(render.frame_ms, 0.5)).epsilon(0.03));
  CHECK(ls->p50_ms == doctest::Approx(quantile(sim.frame_ms, 0.5)).epsilon(0.03));
  CHECK(ls->p50_ms < lr->p50_ms);
  // Every dump carries the statistics of both loops.
  char dir[] = "/tmp/selfprof-frames-XXXXXX";
  REQUIRE(mkdtemp(dir) != nullptr);
  std::string top = std::string(dir) + "/cpu.txt";
  REQUIRE(selfprof::dump(top));
  std::string text = wl::read_output(top);
  CHECK(text.find("# frames: render (tid " + std::to_string(render.tid) + "): 120 frames") !=
        std::string::npos);
  CHECK(text.find("# frames: sim (tid " + std::to_string(sim.tid) + "): 200 frames") != std::string::npos);
  std::string svg = std::string(dir) + "/cpu.svg";
  REQUIRE(selfprof::dump_slow_frames(svg));
  std::string svg_text = wl::read_output(svg);
  CHECK(svg_text.find("render (tid ") != std::string::npos);
  CHECK(svg_text.find("view: slow frames") != std::string::npos);
  std::remove(top.c_str());
  std::remove(svg.c_str());
  rmdir(dir);
}

TEST_CASE("the worst frames, one file each, samples in time order") {
  wl::apply_test_environment();
  REQUIRE(selfprof::start(frame_options(250, 1000)));
  run_game_loop("main", 200);
  REQUIRE(selfprof::stop());
  std::vector<selfprof::profile> worst = selfprof::worst_frames(3);
  REQUIRE(worst.size() == 3);
  for (const auto& p : worst) {
    MESSAGE(p.info.view << ": " << wl::total_samples(p) << " samples");
    CHECK(p.info.view.find("frame ") == 0);
    CHECK(p.info.duration_s > 0.050);  // the spike frames are the worst
    REQUIRE(wl::total_samples(p) > 0);
    // In time order: update_world comes before rebuild_broadphase, which comes before render_scene.
    auto first_with = [&](const char* needle) {
      for (std::size_t i = 0; i < p.stacks.size(); ++i)
        for (auto f : p.stacks[i].frames)
          if (p.frames[f].name.find(needle) != std::string::npos) return long(i);
      return -1L;
    };
    long spike = first_with("rebuild_broadphase"), render = first_with("render_scene");
    CHECK(spike >= 0);
    if (render >= 0) CHECK(spike < render);
  }
  CHECK(worst[0].info.duration_s >= worst[1].info.duration_s);
  char dir[] = "/tmp/selfprof-worst-XXXXXX";
  REQUIRE(mkdtemp(dir) != nullptr);
  REQUIRE(selfprof::dump_worst_frames(std::string(dir) + "/frame.svg", 2));
  std::string f1 = std::string(dir) + "/frame-frame1.svg", f2 = std::string(dir) + "/frame-frame2.svg";
  std::string text = wl::read_output(f1);
  CHECK(text.find("Flame chart of frame ") != std::string::npos);
  CHECK(text.find("rebuild_broadphase") != std::string::npos);
  struct stat st {};
  CHECK(stat(f2.c_str(), &st) == 0);
  CHECK(wl::count_dir(dir) == 2);
  std::remove(f1.c_str());
  std::remove(f2.c_str());
  rmdir(dir);
}
