// The collector's view of game/engine frames: holds each tagged sample until its frame closes, keeps the
// samples of frames over budget as the "slow frames" table, the worst frames in time order, and the
// frame-duration statistics of every loop.
// Context: collector thread (and dump callers holding the collector's table lock).
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "selfprof/detail/stack_table.hpp"
#include "selfprof/profile.hpp"
#include "selfprof/signal/game_frames.hpp"
#include "selfprof/signal/ring.hpp"

namespace selfprof {
namespace detail {

// Program counters held for frames not closed yet, over all threads (8 bytes each): 16 MiB. Past it,
// the oldest open frame of the thread that adds loses its samples (counted in held_dropped).
constexpr std::size_t kMaxHeldPcs = std::size_t(1) << 21;
// Worst frames kept with their samples in time order, for the per-frame drill-down.
constexpr std::size_t kWorstGameFramesKept = 16;
// Frame verdicts remembered per thread for samples that reach the collector after their frame closed.
constexpr std::size_t kRecentVerdicts = 64;

// Frame durations in log-spaced buckets 1% wide from 1 µs: bounded memory, quantiles within 1%.
class duration_histogram {
 public:
  static constexpr std::size_t kBuckets = 2200;  // 1 µs * 1.01^2200 ≈ 3 hours
  void add(std::uint64_t ns) {
    if (counts_.empty()) counts_.assign(kBuckets, 0);
    ++counts_[index(ns)];
    ++count_;
    if (ns > max_) max_ = ns;
  }
  std::uint64_t count() const { return count_; }
  std::uint64_t max_ns() const { return max_; }
  // The q-quantile (0 < q <= 1): the geometric middle of the bucket holding the rank ceil(q * count).
  double quantile_ns(double q) const {
    if (count_ == 0) return 0;
    const double at = q * static_cast<double>(count_);
    auto rank = static_cast<std::uint64_t>(at);  // rounded up below, without libm's ceil
    if (static_cast<double>(rank) < at) ++rank;
    if (rank < 1) rank = 1;
    std::uint64_t seen = 0;
    for (std::size_t i = 0; i < counts_.size(); ++i) {
      seen += counts_[i];
      if (seen < rank) continue;
      double mid = i == 0 ? 500.0 : bounds()[i - 1] * kSqrtRatio;
      return std::min(mid, static_cast<double>(max_));
    }
    return static_cast<double>(max_);
  }

 private:
  static constexpr double kRatio = 1.01;
  static constexpr double kSqrtRatio = 1.004987562112089;  // the geometric middle of a bucket
  // bounds()[k] = 1 µs * 1.01^k in ns: bucket k + 1 holds [bounds()[k], bounds()[k + 1]). A table and a
  // binary search instead of log() and pow(): the preload library then needs no libm, one library less
  // for every process it is loaded into to map.
  static const double* bounds() {
    struct table {
      double at[kBuckets];
      table() {
        double b = 1000.0;
        for (double& x : at) {
          x = b;
          b *= kRatio;
        }
      }
    };
    static const table t;
    return t.at;
  }
  static std::size_t index(std::uint64_t ns) {
    const double* b = bounds();
    const double* past = std::upper_bound(b, b + kBuckets - 1, static_cast<double>(ns));
    return static_cast<std::size_t>(past - b);  // 0 below 1 µs; at most kBuckets - 1
  }
  std::vector<std::uint64_t> counts_;
  std::uint64_t count_ = 0, max_ = 0;
};

// One sample of a marked thread, as drained from the ring.
struct held_sample {
  std::uint64_t time_ns = 0;
  std::uint32_t tid = 0;
  std::uint16_t flags = 0;
  std::uint32_t weight = 1;
  std::vector<std::uint64_t> pcs;
};

// One closed frame kept whole for the drill-down; samples in the order they were taken.
struct kept_game_frame {
  std::string loop;
  std::uint32_t tid = 0;
  std::uint64_t seq = 0, start_ns = 0, end_ns = 0;
  std::vector<held_sample> samples;
  double duration_ms() const { return static_cast<double>(end_ns - start_ns) / 1e6; }
};

class game_frame_tracker {
 public:
  // budget_ms: a frame longer than this is slow. Call before the first sample of a profile.
  void configure(double budget_ms, std::uint64_t start_ns) {
    budget_ns_ = static_cast<std::uint64_t>(budget_ms * 1e6);
    budget_ms_ = budget_ms;
    start_ns_ = start_ns;
  }
  void clear() {
    loops_.clear();
    stats_.clear();
    slow_.clear();
    worst_.clear();
    pending_.clear();
    held_pcs_ = held_dropped_ = late_ = 0;
  }

  // Step 1 of a drain: take the frames closed so far (before draining the sample ring, so every sample
  // of these frames that the handler published before the mark is in the ring by then).
  void collect_closed() {
    std::uint32_t n = g_game_frames.high_water.load(std::memory_order_acquire);
    for (std::uint32_t i = 0; i < n && i < kGameFrameSlots; ++i) {
      game_frame_slot& s = g_game_frames.slots[i];
      std::uint32_t st = s.state.load(std::memory_order_acquire);
      if (st != game_frame_live && st != game_frame_retired) continue;
      loop_state& ls = loop_for(i, s);
      std::uint64_t head = s.head.load(std::memory_order_acquire);
      for (std::uint64_t t = s.tail.load(std::memory_order_relaxed); t != head; ++t) {
        const closed_game_frame& f = s.ring[t % kClosedGameFrameRing];
        pending_.push_back(closing{i, f});
        ls.history.push_back(f);
        if (ls.history.size() > kRecentVerdicts) ls.history.pop_front();
      }
      s.tail.store(head, std::memory_order_release);
      std::uint64_t lost = s.lost.load(std::memory_order_relaxed);
      if (lost > ls.lost_seen) {
        stats_for(ls).lost += lost - ls.lost_seen;
        ls.lost_seen = lost;
      }
      if (st == game_frame_retired) ls.retire_after_processing = true;
    }
  }

  // The tag of the frame thread `tid` was running at `time_ns`, or 0: for samples that carry a time and
  // no tag (kGameFrameTagByTime: the ring source's, which the kernel wrote without running any code of
  // selfprof's on the thread). Call after collect_closed(). Frames are looked up among those taken
  // already (the history), those closed and not taken yet (the slot's ring from tail to head, which only
  // the collector advances, so the marking thread never writes there), then the running frame, which
  // began where the last closed one ended (or at the first mark). Closed frames the slot's ring had no
  // room for are not known: samples after such a loss are tagged as the frame after the last one known.
  std::uint64_t tag_at(std::uint32_t tid, std::uint64_t time_ns) const {
    for (const auto& l : loops_) {
      const loop_state& ls = l.second;
      if (ls.tid != tid) continue;
      const std::uint64_t slot_bits = std::uint64_t(l.first + 1) << kGameFrameTagShift;
      auto in = [time_ns](const closed_game_frame& f) { return f.start_ns <= time_ns && time_ns < f.end_ns; };
      for (auto it = ls.history.rbegin(); it != ls.history.rend(); ++it)
        if (in(*it)) return slot_bits | (it->seq & kGameFrameSeqMask);
      const game_frame_slot& s = g_game_frames.slots[l.first];
      const closed_game_frame* last = ls.history.empty() ? nullptr : &ls.history.back();
      const std::uint64_t head = s.head.load(std::memory_order_acquire);
      for (std::uint64_t t = s.tail.load(std::memory_order_relaxed); t != head; ++t) {
        const closed_game_frame& f = s.ring[t % kClosedGameFrameRing];
        if (in(f)) return slot_bits | (f.seq & kGameFrameSeqMask);
        last = &f;
      }
      if (last) {
        if (time_ns >= last->end_ns) return slot_bits | ((last->seq + 1) & kGameFrameSeqMask);
        continue;  // before every frame still known
      }
      const std::uint64_t first = s.start_ns.load(std::memory_order_relaxed);
      if (first != 0 && time_ns >= first) return slot_bits | 1;
    }
    return 0;
  }

  // Step 2, for each drained sample: holds a tagged sample until its frame closes. Returns false when
  // the sample is not on a marked thread.
  bool add_sample(const sample_header& h, const std::uint64_t* pcs, std::size_t depth, std::uint16_t flags) {
    if (h.tag == 0) return false;
    std::size_t slot = game_frame_tag_slot(h.tag);
    if (slot >= kGameFrameSlots || !loops_.count(slot))
      return true;  // the collector has not seen the slot yet
    loop_state& ls = loops_[slot];
    std::uint64_t seq = game_frame_tag_seq(h.tag);
    held_sample hs;
    hs.time_ns = h.time_ns;
    hs.tid = h.tid;
    hs.flags = flags;
    hs.weight = h.weight;
    hs.pcs.assign(pcs, pcs + depth);
    if (seq <= ls.last_closed) {  // its frame was decided already (the sample was late in the ring)
      ++late_;
      for (auto& v : ls.recent)
        if (v.first == seq && v.second) slow_.add(hs.tid, hs.flags, pcs, depth, hs.weight);
      return true;
    }
    held_pcs_ += depth;
    ls.open[seq].push_back(std::move(hs));
    while (held_pcs_ > kMaxHeldPcs && !ls.open.empty()) {
      auto oldest = ls.open.begin();
      for (auto& x : oldest->second) {
        held_pcs_ -= x.pcs.size();
        ++held_dropped_;
      }
      ls.open.erase(oldest);
    }
    return true;
  }

  // Step 3: decide the frames taken in step 1: statistics, slow table, worst frames; free retired slots.
  void process_closed() {
    for (closing& c : pending_) {
      auto it = loops_.find(c.slot);
      if (it == loops_.end()) continue;
      loop_state& ls = it->second;
      std::vector<held_sample> samples;
      auto open = ls.open.find(c.frame.seq);
      if (open != ls.open.end()) {
        samples = std::move(open->second);
        ls.open.erase(open);
        for (auto& x : samples) held_pcs_ -= x.pcs.size();
      }
      // Samples of frames before this one can no longer arrive complete: drop them.
      while (!ls.open.empty() && ls.open.begin()->first < c.frame.seq) {
        for (auto& x : ls.open.begin()->second) held_pcs_ -= x.pcs.size();
        ls.open.erase(ls.open.begin());
      }
      ls.last_closed = std::max(ls.last_closed, c.frame.seq);
      if (c.frame.start_ns < start_ns_) continue;  // began before this profile
      const std::uint64_t dur = c.frame.end_ns - c.frame.start_ns;
      frame_loop_acc& acc = stats_for(ls);
      acc.hist.add(dur);
      const bool slow = dur > budget_ns_;
      if (slow) ++acc.over;
      ls.recent.emplace_back(c.frame.seq, slow);
      if (ls.recent.size() > kRecentVerdicts) ls.recent.pop_front();
      if (slow)
        for (auto& x : samples) slow_.add(x.tid, x.flags, x.pcs.data(), x.pcs.size(), x.weight);
      keep_if_worst(ls, c.frame, std::move(samples));
    }
    pending_.clear();
    for (auto it = loops_.begin(); it != loops_.end();) {
      if (!it->second.retire_after_processing) {
        ++it;
        continue;
      }
      for (auto& o : it->second.open)
        for (auto& x : o.second) held_pcs_ -= x.pcs.size();
      game_frame_slot& s = g_game_frames.slots[it->first];
      std::uint32_t expected = game_frame_retired;
      s.state.compare_exchange_strong(expected, game_frame_free, std::memory_order_acq_rel);
      it = loops_.erase(it);
    }
  }

  bool any_marked() const { return !stats_.empty(); }
  const stack_table& slow_table() const { return slow_; }
  std::uint64_t held_dropped() const { return held_dropped_; }
  std::uint64_t late_samples() const { return late_; }
  double budget_ms() const { return budget_ms_; }
  // Threads that mark frames now (the collector may sample them faster).
  std::vector<std::uint32_t> live_tids() const {
    std::vector<std::uint32_t> out;
    for (auto& l : loops_)
      if (!l.second.retire_after_processing) out.push_back(l.second.tid);
    return out;
  }

  std::vector<frame_loop_stats> stats() const {
    std::vector<frame_loop_stats> out;
    for (auto& e : stats_) {
      frame_loop_stats s;
      s.name = e.first.first;
      s.tid = e.first.second;
      s.count = e.second.hist.count();
      s.over_budget = e.second.over;
      s.lost = e.second.lost;
      s.budget_ms = budget_ms_;
      s.p50_ms = e.second.hist.quantile_ns(0.50) / 1e6;
      s.p95_ms = e.second.hist.quantile_ns(0.95) / 1e6;
      s.p99_ms = e.second.hist.quantile_ns(0.99) / 1e6;
      s.max_ms = static_cast<double>(e.second.hist.max_ns()) / 1e6;
      out.push_back(s);
    }
    return out;
  }

  // The worst frames kept so far, longest first.
  const std::vector<kept_game_frame>& worst() const { return worst_; }

 private:
  struct loop_state {
    std::uint32_t generation = 0, tid = 0;
    std::string name;
    std::uint64_t last_closed = 0, lost_seen = 0;
    bool retire_after_processing = false;
    std::map<std::uint64_t, std::vector<held_sample>> open;  // frame seq -> samples
    std::deque<std::pair<std::uint64_t, bool>> recent;       // (seq, slow) of the last frames decided
    std::deque<closed_game_frame> history;                   // the last frames taken, oldest first
  };
  struct frame_loop_acc {
    duration_histogram hist;
    std::uint64_t over = 0, lost = 0;
  };
  struct closing {
    std::size_t slot;
    closed_game_frame frame;
  };

  loop_state& loop_for(std::size_t i, game_frame_slot& s) {
    std::uint32_t gen = s.generation.load(std::memory_order_relaxed);
    auto it = loops_.find(i);
    if (it != loops_.end() && it->second.generation == gen) return it->second;
    loop_state& ls = loops_[i];
    for (auto& o : ls.open)
      for (auto& x : o.second) held_pcs_ -= x.pcs.size();
    ls = loop_state{};
    ls.generation = gen;
    ls.tid = s.tid.load(std::memory_order_relaxed);
    const char* n = s.name.load(std::memory_order_relaxed);
    ls.name = n ? n : "frame";
    ls.lost_seen = s.lost.load(std::memory_order_relaxed);  // losses before this profile are not its own
    stats_for(ls);  // a loop shows in the statistics from its first mark
    return ls;
  }

  frame_loop_acc& stats_for(const loop_state& ls) { return stats_[{ls.name, ls.tid}]; }

  void keep_if_worst(const loop_state& ls, const closed_game_frame& f, std::vector<held_sample> samples) {
    const std::uint64_t dur = f.end_ns - f.start_ns;
    if (worst_.size() >= kWorstGameFramesKept && dur <= worst_.back().end_ns - worst_.back().start_ns) return;
    kept_game_frame k;
    k.loop = ls.name;
    k.tid = ls.tid;
    k.seq = f.seq;
    k.start_ns = f.start_ns;
    k.end_ns = f.end_ns;
    k.samples = std::move(samples);
    auto pos = std::find_if(worst_.begin(), worst_.end(),
                            [&](const kept_game_frame& w) { return w.end_ns - w.start_ns < dur; });
    worst_.insert(pos, std::move(k));
    if (worst_.size() > kWorstGameFramesKept) worst_.pop_back();
  }

  double budget_ms_ = 16.7;
  std::uint64_t budget_ns_ = 16700000, start_ns_ = 0;
  std::map<std::size_t, loop_state> loops_;                                // by slot index
  std::map<std::pair<std::string, std::uint32_t>, frame_loop_acc> stats_;  // by (loop, tid)
  std::vector<closing> pending_;
  stack_table slow_;
  std::vector<kept_game_frame> worst_;
  std::size_t held_pcs_ = 0;
  std::uint64_t held_dropped_ = 0, late_ = 0;
};

// A profile of one kept frame: `table` holds its distinct stacks and `order` lists, sample by sample in
// time order, the table entry and weight. reorder_game_frame_profile() turns the symbolized stacks into that
// sequence, so a flame chart (svg_options::flamechart) shows the frame left to right in time.
struct game_frame_sequence {
  stack_table table;
  std::vector<std::pair<std::uint32_t, std::uint64_t>> order;
};

inline game_frame_sequence make_game_frame_sequence(const kept_game_frame& k) {
  game_frame_sequence out;
  std::map<std::pair<std::uint32_t, std::vector<std::uint64_t>>, std::uint32_t> index;
  for (const held_sample& s : k.samples) {
    auto key = std::make_pair(static_cast<std::uint32_t>(s.flags), s.pcs);
    auto it = index.find(key);
    std::uint32_t at = 0;
    if (it == index.end()) {
      at = static_cast<std::uint32_t>(out.table.unique());  // add() appends a new entry at the end
      out.table.add(s.tid, s.flags, s.pcs.data(), s.pcs.size(), 1);
      index.emplace(std::move(key), at);
    } else {
      at = it->second;
    }
    out.order.emplace_back(at, s.weight);
  }
  return out;
}

// `p` built from game_frame_sequence::table (one stack per entry, in entry order): stacks become the
// sequence.
inline void reorder_game_frame_profile(profile& p, const game_frame_sequence& seq) {
  std::vector<stack> ordered;
  ordered.reserve(seq.order.size());
  std::uint64_t total = 0;
  for (auto& o : seq.order) {
    if (o.first >= p.stacks.size()) continue;
    stack s = p.stacks[o.first];
    s.count = o.second;
    total += o.second;
    ordered.push_back(std::move(s));
  }
  p.stacks = std::move(ordered);
  p.info.samples = total;
}

}  // namespace detail
}  // namespace selfprof
