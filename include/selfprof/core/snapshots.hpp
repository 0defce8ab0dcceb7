// Snapshots of the running (or last) session: the folded stacks with what the profile is about — mode,
// unit, source, rate, duration, what was dropped, the notes that belong in every profile — symbolized
// for a dump, with the slow game frames beside them when frames were marked. What the memory ceiling
// merged is named here: the ceiling stack's frame, and thread 0 for the threads that ended.
// Context: any thread except the signal handler (the dumper thread, API callers); begin/end from setup.
#pragma once

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <iterator>
#include <string>
#include <unordered_set>
#include <vector>

#include "selfprof/collect/collector.hpp"
#include "selfprof/collect/handler_counters.hpp"
#include "selfprof/collect/sample_store.hpp"
#include "selfprof/collect/session_info.hpp"
#include "selfprof/collect/snapshot.hpp"
#include "selfprof/collect/thread_registry.hpp"
#include "selfprof/detail/worker.hpp"
#include "selfprof/dump/dump.hpp"
#include "selfprof/dump/symbolize.hpp"
#include "selfprof/options.hpp"
#include "selfprof/symbols/shared_symbolizer.hpp"

namespace selfprof {
namespace detail {

// The parts a snapshot reads; they live as long as the profiler.
struct session_parts {
  sample_ring* ring = nullptr;
  sample_store* store = nullptr;
  thread_registry* threads = nullptr;
  session_info* session = nullptr;
  shared_symbolizer* symbols = nullptr;
  collector* collect = nullptr;  // reads the kernel's rings at a snapshot (the ring source)
};

class snapshot_maker {
 public:
  explicit snapshot_maker(session_parts parts) : parts_(parts) {}

  // A session starts (setup only): what later snapshots say about it.
  void begin(const options& o, const handler_counts& base) {
    opts_ = o;
    base_ = base;
    start_unix_ns_ = static_cast<std::uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(
                                                    std::chrono::system_clock::now().time_since_epoch())
                                                    .count());
    start_ = std::chrono::steady_clock::now();
    running_ = true;
  }
  // The session ends (setup only): its duration stops growing.
  void end() {
    stop_ = std::chrono::steady_clock::now();
    running_ = false;
  }
  bool began() const { return start_unix_ns_ != 0; }

  // Everything collected so far (the ring is drained first), or with `windowed` the last window not yet
  // written (see sample_store::copy_table). `sampled_names`: thread names only where there are samples to
  // name (the raw exit dump: a short process that took none reads no thread's name).
  raw_snapshot raw(bool windowed = false, std::uint64_t* window_seq = nullptr, bool sampled_names = false) {
    raw_snapshot s;
    if (running_ && parts_.collect) parts_.collect->pull_now();  // samples still in the kernel's rings
    parts_.store->copy_table(running_ ? parts_.ring : nullptr, windowed, s, window_seq);
    if (!sampled_names || !s.table.entries().empty()) {
      const bool first = !parts_.threads->scanned();  // before the collector's first wake
      if (first) parts_.threads->scan(running_worker_tids());
      s.thread_names = parts_.threads->names(!first);
    }
    if (parts_.store->merged().threads) {
      // Only the threads still in the table: the merged ones are not, and may be thousands.
      std::unordered_set<std::uint32_t> in_table;
      for (const auto& e : s.table.entries()) in_table.insert(e.tid);
      for (auto it = s.thread_names.begin(); it != s.thread_names.end();)
        it = in_table.count(it->first) ? std::next(it) : s.thread_names.erase(it);
      if (in_table.count(kMergedThreadsTid)) s.thread_names[kMergedThreadsTid] = "ended threads";
    }
    const bool wall = opts_.mode == profile_mode::wall;
    const source_info src = parts_.session->source();
    s.info.mode = opts_.mode;
    s.info.unit = wall ? "us" : "samples";
    s.info.source = source_name(src.kind);
    s.info.hz = opts_.hz;
    s.info.period_ns = static_cast<std::uint64_t>(period_ns_for(opts_.hz));
    s.info.dropped = handler_counts::now().since(base_).full;
    s.info.start_unix_ns = start_unix_ns_;
    s.info.kernel_time =
        wall || src.kernel_time;  // a wall profile counts every microsecond, on or off the CPU
    const auto end = running_ ? std::chrono::steady_clock::now() : stop_;
    s.info.duration_s = began() ? std::chrono::duration<double>(end - start_).count() : 0;
    if (!src.kernel_time && !wall)
      s.info.notes.push_back("time spent in the kernel is not sampled (user-only perf_event)");
    std::vector<std::string> all;
    parts_.session->notes(all, &s.info.notes);
    if (wall && src.kind == source_kind::none)
      s.info.notes.push_back("wall mode without on-CPU stacks: " + src.reason);
    for (auto& r : parts_.session->refused()) s.info.notes.push_back("refused " + r);
    return s;
  }

  profile symbolize(const raw_snapshot& raw) {
    profile p = parts_.symbols->with_fresh([&](symbolizer& sym) { return build_profile(raw, sym); });
    name_ceiling_frame(p);
    return p;
  }

  // The samples of game frames over budget, described like raw(); `marked`: any game frame was marked.
  raw_snapshot slow_raw(bool& marked) {
    raw_snapshot s = raw();
    s.table = parts_.store->slow_table(marked);
    s.info.view = "slow frames";
    const double hz = parts_.store->game_frame_hz();
    s.info.hz = hz;
    s.info.period_ns = static_cast<std::uint64_t>(period_ns_for(hz));
    return s;
  }

  // A windowed dump was written: its samples are not handed out again.
  void window_written(std::uint64_t seq) { parts_.store->window_written(seq); }

  // What one dump writes (dump/dump.hpp).
  dump_contents contents(bool windowed = false, std::uint64_t* window_seq = nullptr) {
    dump_contents c;
    c.main = symbolize(raw(windowed, window_seq));
    raw_snapshot slow = slow_raw(c.slow_marked);
    if (c.slow_marked) c.slow = symbolize(slow);
    return c;
  }

  // The `n` longest game frames as flame charts in time order, longest first.
  std::vector<profile> worst_game_frames(std::size_t n) {
    std::vector<kept_game_frame> kept = parts_.store->worst(running_ ? parts_.ring : nullptr, n);
    std::vector<profile> out;
    const raw_snapshot base = raw();
    const double hz = parts_.store->game_frame_hz();
    for (std::size_t i = 0; i < kept.size(); ++i) {
      const kept_game_frame& k = kept[i];
      game_frame_sequence seq = make_game_frame_sequence(k);
      raw_snapshot r;
      r.table = seq.table;
      r.thread_names = base.thread_names;
      r.info = base.info;
      r.info.hz = hz;
      r.info.period_ns = static_cast<std::uint64_t>(period_ns_for(hz));
      r.info.duration_s = static_cast<double>(k.end_ns - k.start_ns) / 1e9;
      char buf[160];
      std::snprintf(buf, sizeof buf, "frame %llu of %s (tid %u): %.2f ms, worst %zu of %zu, time order",
                    static_cast<unsigned long long>(k.seq), k.loop.c_str(), static_cast<unsigned>(k.tid),
                    k.duration_ms(), i + 1, kept.size());
      r.info.view = buf;
      profile p = symbolize(r);
      reorder_game_frame_profile(p, seq);
      out.push_back(std::move(p));
    }
    return out;
  }

  // The stack that new stacks past the memory ceiling were counted under has one frame, at an address
  // no module holds: the symbolizer left it unnamed.
  static void name_ceiling_frame(profile& p) {
    for (frame& f : p.frames) {
      if (f.address != kMemoryCeilingPc || !f.module.empty()) continue;
      f.name = "[selfprof: memory ceiling]";
      f.kind = frame_kind::marker;
    }
  }

  const options& opts() const { return opts_; }
  handler_counts counts() const { return handler_counts::now().since(base_); }

 private:
  session_parts parts_;
  options opts_;
  handler_counts base_;
  std::uint64_t start_unix_ns_ = 0;
  std::chrono::steady_clock::time_point start_{}, stop_{};
  bool running_ = false;
};

}  // namespace detail
}  // namespace selfprof
