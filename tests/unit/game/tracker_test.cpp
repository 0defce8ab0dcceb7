// Frame slots, tags and the collector's frame tracker, driven by hand (no signals): tags follow the
// marks, closed frames reach the tracker, slow frames keep their samples, statistics and worst frames.
#include <doctest/doctest.h>

#include <thread>

#include <selfprof/frames.hpp>
#include <selfprof/game/tracker.hpp>
#include <selfprof/profile.hpp>

namespace {

using selfprof::detail::claim_game_frame_slot;
using selfprof::detail::duration_histogram;
using selfprof::detail::g_game_frames;
using selfprof::detail::game_frame_free;
using selfprof::detail::game_frame_sequence;
using selfprof::detail::game_frame_slot;
using selfprof::detail::game_frame_tag_for;
using selfprof::detail::game_frame_tag_seq;
using selfprof::detail::game_frame_tag_slot;
using selfprof::detail::game_frame_tracker;
using selfprof::detail::held_sample;
using selfprof::detail::kClosedGameFrameRing;
using selfprof::detail::kept_game_frame;
using selfprof::detail::kGameFrameSlots;
using selfprof::detail::kGameFrameTagShift;
using selfprof::detail::raw_gettid;
using selfprof::detail::sample_header;

sample_header header_for(std::uint32_t tid, std::uint64_t time_ns) {
  sample_header h{};
  h.tid = tid;
  h.depth = 2;
  h.weight = 1;
  h.time_ns = time_ns;
  h.tag = game_frame_tag_for(tid);
  return h;
}

// Runs `body` on a fresh thread (each thread gets its own frame slot, returned at exit).
template <class F>
void on_thread(F body) {
  std::thread t(body);
  t.join();
}

}  // namespace

TEST_CASE("frames: a thread's tag is 0 before its first mark, then names slot and frame") {
  on_thread([] {
    const std::uint32_t tid = raw_gettid();
    CHECK(game_frame_tag_for(tid) == 0);
    selfprof::frame_mark("tags");
    std::uint64_t t1 = game_frame_tag_for(tid);
    REQUIRE(t1 != 0);
    CHECK(game_frame_tag_seq(t1) == 1);
    selfprof::frame_mark("tags");
    std::uint64_t t2 = game_frame_tag_for(tid);
    CHECK(game_frame_tag_seq(t2) == 2);
    CHECK(game_frame_tag_slot(t2) == game_frame_tag_slot(t1));
    CHECK(game_frame_tag_for(tid + 1000000) == 0);  // an unmarked thread
  });
}

TEST_CASE("frames: a thread that exits gives its slot back after the tracker read it") {
  game_frame_tracker tr;
  tr.configure(10, 0);
  std::uint32_t tid = 0;
  on_thread([&] {
    tid = raw_gettid();
    selfprof::frame_mark("exiting");
    selfprof::frame_mark("exiting");
  });
  CHECK(game_frame_tag_for(tid) == 0);  // retired: samples are no longer tagged
  tr.collect_closed();
  tr.process_closed();
  auto stats = tr.stats();
  bool found = false;
  for (auto& s : stats)
    if (s.name == "exiting" && s.tid == tid) found = s.count == 1;
  CHECK(found);
  for (std::size_t i = 0; i < kGameFrameSlots; ++i)
    CHECK_FALSE(
        (g_game_frames.slots[i].tid.load() == tid && g_game_frames.slots[i].state.load() != game_frame_free));
}

TEST_CASE("frames: samples of a slow frame go to the slow table, those of a fast frame do not") {
  on_thread([] {
    const std::uint32_t tid = raw_gettid();
    game_frame_tracker tr;
    tr.configure(5.0, 0);  // 5 ms budget
    std::uint64_t pcs_fast[2] = {0x1000, 0x2000}, pcs_slow[2] = {0x3000, 0x4000};
    game_frame_slot* slot = claim_game_frame_slot(tid, "unit");
    REQUIRE(slot != nullptr);
    const std::uint64_t ms = 1000000;
    close_game_frame(*slot, 100 * ms);  // starts frame 1
    tr.collect_closed();                // the tracker sees the slot
    tr.process_closed();
    // Frame 1: 2 ms, fast. Frame 2: 9 ms, slow.
    sample_header h = header_for(tid, 101 * ms);
    CHECK(tr.add_sample(h, pcs_fast, 2, 0));
    close_game_frame(*slot, 102 * ms);
    h = header_for(tid, 103 * ms);
    tr.add_sample(h, pcs_slow, 2, 0);
    h = header_for(tid, 104 * ms);
    tr.add_sample(h, pcs_slow, 2, 0);
    close_game_frame(*slot, 111 * ms);
    tr.collect_closed();
    tr.process_closed();
    CHECK(tr.slow_table().total() == 2);
    REQUIRE(tr.slow_table().unique() == 1);
    CHECK(tr.slow_table().pcs(tr.slow_table().entries()[0])[0] == 0x3000);
    auto stats = tr.stats();
    const selfprof::frame_loop_stats* l = nullptr;
    for (auto& s : stats)
      if (s.name == "unit" && s.tid == tid) l = &s;
    REQUIRE(l != nullptr);
    CHECK(l->count == 2);
    CHECK(l->over_budget == 1);
    CHECK(l->max_ms == doctest::Approx(9.0));
    REQUIRE(!tr.worst().empty());
    CHECK(tr.worst()[0].duration_ms() == doctest::Approx(9.0));
    CHECK(tr.worst()[0].samples.size() == 2);
    // A sample that reaches the tracker after its (slow) frame was decided still counts there.
    sample_header late{};
    late.tid = tid;
    late.weight = 1;
    late.tag = (std::uint64_t(game_frame_tag_slot(game_frame_tag_for(tid)) + 1) << kGameFrameTagShift) | 2;
    tr.add_sample(late, pcs_slow, 2, 0);
    CHECK(tr.late_samples() == 1);
    CHECK(tr.slow_table().total() == 3);
    // An untagged sample is not the tracker's.
    sample_header none{};
    none.tid = tid + 1000000;
    CHECK_FALSE(tr.add_sample(none, pcs_fast, 2, 0));
    retire_game_frame_slot(*slot);
    tr.collect_closed();
    tr.process_closed();
  });
}

TEST_CASE("frames: losses before the tracker saw the slot are not the profile's") {
  on_thread([] {
    const std::uint32_t tid = raw_gettid();
    game_frame_slot* slot = claim_game_frame_slot(tid, "before");
    REQUIRE(slot != nullptr);
    for (std::uint64_t i = 1; i <= kClosedGameFrameRing + 6; ++i) close_game_frame(*slot, i * 1000);
    game_frame_tracker tr;
    tr.configure(1, 0);
    tr.collect_closed();
    tr.process_closed();
    for (auto& s : tr.stats())
      if (s.tid == tid) CHECK(s.lost == 0);
    retire_game_frame_slot(*slot);
    tr.collect_closed();
    tr.process_closed();
  });
}

TEST_CASE("frames: frames that began before the profile started are not counted") {
  on_thread([] {
    const std::uint32_t tid = raw_gettid();
    game_frame_slot* slot = claim_game_frame_slot(tid, "early");
    REQUIRE(slot != nullptr);
    close_game_frame(*slot, 1000);
    close_game_frame(*slot, 5000);  // frame 1: [1000, 5000), before the start
    game_frame_tracker tr;
    tr.configure(1, 4000);
    close_game_frame(*slot, 9000);  // frame 2: [5000, 9000)
    tr.collect_closed();
    tr.process_closed();
    std::uint64_t count = 0;
    for (auto& s : tr.stats())
      if (s.tid == tid) count = s.count;
    CHECK(count == 1);
    retire_game_frame_slot(*slot);
    tr.collect_closed();
    tr.process_closed();
  });
}

TEST_CASE("frames: the closed-frame ring counts what it has no room for") {
  on_thread([] {
    const std::uint32_t tid = raw_gettid();
    game_frame_slot* slot = claim_game_frame_slot(tid, "burst");
    REQUIRE(slot != nullptr);
    game_frame_tracker tr;
    tr.configure(1, 0);
    tr.collect_closed();  // the tracker knows the slot before the burst
    tr.process_closed();
    for (std::uint64_t i = 1; i <= kClosedGameFrameRing + 11; ++i) close_game_frame(*slot, i * 1000);
    tr.collect_closed();
    tr.process_closed();
    for (auto& s : tr.stats())
      if (s.tid == tid) {
        CHECK(s.count == kClosedGameFrameRing);
        CHECK(s.lost == 10);  // the first mark opened frame 1: kClosedGameFrameRing + 10 closed
      }
    retire_game_frame_slot(*slot);
    tr.collect_closed();
    tr.process_closed();
  });
}

TEST_CASE("frames: duration histogram quantiles are within 1% and max is exact") {
  duration_histogram h;
  for (std::uint64_t i = 1; i <= 1000; ++i) h.add(i * 100000);  // 0.1 ms .. 100 ms
  CHECK(h.count() == 1000);
  CHECK(h.max_ns() == 100000000);
  CHECK(h.quantile_ns(0.5) == doctest::Approx(50e6).epsilon(0.01));
  CHECK(h.quantile_ns(0.95) == doctest::Approx(95e6).epsilon(0.01));
  CHECK(h.quantile_ns(0.99) == doctest::Approx(99e6).epsilon(0.01));
  CHECK(h.quantile_ns(1.0) <= 100e6);
  duration_histogram empty;
  CHECK(empty.quantile_ns(0.5) == 0);
}

TEST_CASE("frames: a frame sequence keeps time order and rebuilds it from symbolized stacks") {
  kept_game_frame k;
  auto sample = [](std::uint64_t pc, std::uint32_t w) {
    held_sample s;
    s.pcs = {pc, 0x9000};
    s.weight = w;
    return s;
  };
  k.samples = {sample(0xA, 1), sample(0xB, 2), sample(0xA, 1)};
  game_frame_sequence seq = make_game_frame_sequence(k);
  CHECK(seq.table.unique() == 2);
  REQUIRE(seq.order.size() == 3);
  CHECK(seq.order[0].first == 0);
  CHECK(seq.order[1].first == 1);
  CHECK(seq.order[2].first == 0);
  selfprof::profile p;
  p.stacks.resize(2);
  p.stacks[0].frames = {7};
  p.stacks[1].frames = {8};
  reorder_game_frame_profile(p, seq);
  REQUIRE(p.stacks.size() == 3);
  CHECK(p.stacks[0].frames[0] == 7);
  CHECK(p.stacks[1].frames[0] == 8);
  CHECK(p.stacks[1].count == 2);
  CHECK(p.stacks[2].frames[0] == 7);
  CHECK(p.info.samples == 4);
}

TEST_CASE("frames: the statistics line names loop, thread and budget") {
  selfprof::frame_loop_stats s;
  s.name = "render";
  s.tid = 42;
  s.count = 600;
  s.p50_ms = 16.25;
  s.max_ms = 43.5;
  s.over_budget = 9;
  s.budget_ms = 16.7;
  std::string line = selfprof::frame_stats_line(s);
  CHECK(line.find("render (tid 42): 600 frames, p50 16.25 ms") == 0);
  CHECK(line.find("max 43.50 ms, 9 over 16.7 ms") != std::string::npos);
}
