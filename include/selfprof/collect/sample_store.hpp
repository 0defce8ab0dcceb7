// The sample store: the one consumer of the sample ring. Folds each drained record into the cumulative
// stack table, the time windows and the per-thread totals, and hands game-frame samples to the game-frame
// tracker. JIT code is recorded by what was at each address when the sample was taken (the JIT registry,
// the perf map); a sample outside every known mapping is noted so the collector reads the maps again.
// Memory is bounded (store_config's limits, from SELFPROF_MAX_MEMORY): a new distinct stack past the
// limit is counted under a "[selfprof: memory ceiling]" stack, and once many threads were seen, the
// stacks and totals of threads that ended are merged into one thread (merge_ended_threads).
// Context: the collector thread (drain) and any thread taking a snapshot; every method takes the store's
// lock, which is also the ring's consumer lock.
#pragma once

#include <algorithm>
#include <cstdint>
#include <mutex>
#include <new>
#include <unordered_map>
#include <vector>

#include "selfprof/collect/code_watch.hpp"
#include "selfprof/collect/snapshot.hpp"
#include "selfprof/collect/windows.hpp"
#include "selfprof/detail/stack_table.hpp"
#include "selfprof/game/rates.hpp"
#include "selfprof/game/tracker.hpp"
#include "selfprof/jit/runtime.hpp"
#include "selfprof/signal/clock.hpp"
#include "selfprof/signal/ring.hpp"
#include "selfprof/sources/source.hpp"

namespace selfprof {
namespace detail {

struct store_config {
  bool wall = false;  // counts are microseconds: a tick stands for one period of CPU time
  double hz = 99;
  double window_s = 0;
  double frame_budget_ms = 16.7;
  double frame_hz = 0;
  std::size_t max_depth = 128;
  std::size_t table_limit = 0;   // bytes of the cumulative stack table (0: no limit)
  std::size_t window_limit = 0;  // bytes of all the window buckets together (0: no limit)
};

// Threads with their own per-thread total (and stacks) before ended ones are merged: a program that
// starts a thread per request must not grow with every thread it ever ran.
constexpr std::size_t kThreadEntriesBeforeMerge = 1024;

// What was merged to stay within the memory limits (stats, profile notes).
struct merge_counts {
  std::uint64_t stack_records = 0;  // records of new stacks counted under the memory-ceiling stack
  std::uint64_t samples = 0;        // their weight (samples; microseconds in wall mode)
  std::uint64_t threads = 0;        // ended threads whose stacks and totals were merged into one
};

class sample_store {
 public:
  // Starts a session: forgets every sample.
  void begin(const store_config& c) {
    std::lock_guard<std::mutex> lock(mu_);
    config_ = c;
    period_ns_ = static_cast<std::uint64_t>(period_ns_for(c.hz));
    table_ = stack_table();  // not clear(): the last session's capacity would count against this one's limit
    table_.set_limit(c.table_limit);
    by_thread_.clear();
    threads_merged_ = 0;
    windows_.configure(static_cast<std::uint64_t>(c.window_s * 1e9), c.window_limit);
    games_.clear();
    games_.configure(c.frame_budget_ms, monotonic_ns());
    rates_.configure(c.hz, c.frame_hz);
    pcs_.assign(c.max_depth, 0);
  }

  // Takes every published record out of `ring`. `ended`: nothing writes the ring any more (stop()), so
  // no page is mapped ahead for writers (a short process would fault them in just before it exits).
  void drain(sample_ring& ring, bool ended = false) {
    std::lock_guard<std::mutex> lock(mu_);
    drain_locked(ring, !ended);
  }

  // Executable ranges from the last module scan, and the perf map to name JIT samples with (or null).
  void set_code(std::vector<code_range> ranges, const perf_map* map) {
    std::lock_guard<std::mutex> lock(mu_);
    code_.set_ranges(std::move(ranges));
    code_.set_perf_map(map);
  }
  // True once after a sample landed outside every known executable range.
  bool take_unknown_code() {
    std::lock_guard<std::mutex> lock(mu_);
    return code_.take_unknown();
  }
  // Code whose unwind rows are not parsed yet; samples that reach it are noted for the collector.
  void set_pending_rows(std::vector<pending_code> code) {
    std::lock_guard<std::mutex> lock(mu_);
    code_.set_pending_rows(std::move(code));
  }
  // A pc in each module of that code that samples reached since the last call.
  std::vector<std::uint64_t> take_row_requests() {
    std::lock_guard<std::mutex> lock(mu_);
    return code_.take_row_requests();
  }

  std::uint64_t total() {
    std::lock_guard<std::mutex> lock(mu_);
    return table_.total();
  }

  // Drains `ring` (when given), then copies the table into `out`: the cumulative one, or with
  // `windowed` (and SELFPROF_WINDOW set) the samples of the last window not yet written, whose sequence
  // number goes to window_written() once the dump is written.
  void copy_table(sample_ring* ring, bool windowed, raw_snapshot& out, std::uint64_t* window_seq) {
    std::lock_guard<std::mutex> lock(mu_);
    if (ring) drain_locked(*ring);
    const bool window = windowed && windows_.enabled();
    if (window) {
      const std::uint64_t seq = windows_.take(monotonic_ns(), out.table);
      if (window_seq) *window_seq = seq;
    } else {
      out.table = table_;
    }
    out.info.frame_loops = games_.stats();
    const merge_counts m = merged_locked(window);
    if (m.samples)
      out.info.notes.push_back(std::to_string(m.samples) + (config_.wall ? " us" : " samples") + " of " +
                               std::to_string(m.stack_records) +
                               " records with new stacks counted under [selfprof: memory ceiling] "
                               "(SELFPROF_MAX_MEMORY)");
    if (m.threads)
      out.info.notes.push_back(std::to_string(m.threads) +
                               " ended threads merged into one, [ended threads] (SELFPROF_MAX_MEMORY)");
    if (games_.held_dropped())
      out.info.notes.push_back(std::to_string(games_.held_dropped()) +
                               " samples of open game frames dropped (held-sample memory bound)");
  }
  void window_written(std::uint64_t seq) {
    std::lock_guard<std::mutex> lock(mu_);
    windows_.mark_dumped(seq);
  }
  bool windowed() {
    std::lock_guard<std::mutex> lock(mu_);
    return windows_.enabled();
  }

  // The samples of game frames over budget; `marked` says whether any game frame was marked at all.
  stack_table slow_table(bool& marked) {
    std::lock_guard<std::mutex> lock(mu_);
    marked = games_.any_marked();
    return games_.slow_table();
  }
  // Up to `n` of the longest game frames, longest first, each with its samples in time order.
  std::vector<kept_game_frame> worst(sample_ring* ring, std::size_t n) {
    std::lock_guard<std::mutex> lock(mu_);
    if (ring) drain_locked(*ring);
    std::vector<kept_game_frame> out = games_.worst();
    if (out.size() > n) out.resize(n);
    return out;
  }
  // The rate samples of marking threads are taken at (the common rate unless SELFPROF_FRAME_HZ).
  double game_frame_hz() {
    std::lock_guard<std::mutex> lock(mu_);
    return rates_.boost_hz() > 0 ? rates_.boost_hz() : config_.hz;
  }
  // Threads that mark game frames and were not tried at SELFPROF_FRAME_HZ yet.
  std::vector<std::uint32_t> to_boost() {
    std::lock_guard<std::mutex> lock(mu_);
    return rates_.to_boost(games_.live_tids());
  }
  void boost_tried(std::uint32_t tid, bool applied) {
    std::lock_guard<std::mutex> lock(mu_);
    rates_.tried(tid, applied);
  }
  void forget_boosted() {
    std::lock_guard<std::mutex> lock(mu_);
    rates_.forget_boosted();
  }

  std::unordered_map<std::uint32_t, std::uint64_t> samples_by_thread() {
    std::lock_guard<std::mutex> lock(mu_);
    return by_thread_;
  }
  struct sizes {
    std::uint64_t samples = 0;
    std::size_t unique = 0, bytes = 0;
  };
  sizes size() {
    std::lock_guard<std::mutex> lock(mu_);
    return sizes{table_.total(), table_.unique(), table_.memory_bytes() + windows_.memory_bytes()};
  }
  merge_counts merged() {
    std::lock_guard<std::mutex> lock(mu_);
    return merged_locked();
  }

  // True when ended threads should be merged: many threads have entries of their own, or the tables
  // are past half their limit.
  bool wants_thread_merge() {
    std::lock_guard<std::mutex> lock(mu_);
    if (by_thread_.size() > kThreadEntriesBeforeMerge) return true;
    return table_.limit() != 0 && table_.memory_bytes() > table_.limit() / 2;
  }
  // Merges the stacks and totals of every thread not in `live` (sorted) into thread kMergedThreadsTid.
  void merge_ended_threads(const std::vector<std::uint32_t>& live) {
    std::lock_guard<std::mutex> lock(mu_);
    auto ended = [&live](std::uint32_t tid) { return !std::binary_search(live.begin(), live.end(), tid); };
    std::uint64_t moved = 0;
    for (auto it = by_thread_.begin(); it != by_thread_.end();) {
      if (it->first == kMergedThreadsTid || !ended(it->first)) {
        ++it;
        continue;
      }
      moved += it->second;
      it = by_thread_.erase(it);
      ++threads_merged_;
    }
    if (moved) by_thread_[kMergedThreadsTid] += moved;
    if (by_thread_.bucket_count() > 4 * (by_thread_.size() + kThreadEntriesBeforeMerge))
      by_thread_.rehash(0);  // the buckets of thousands of gone threads
    table_.merge_threads(ended);
    windows_.merge_threads(ended);
  }

  std::mutex& lock_for_fork() { return mu_; }
  // fork(2) child: the samples are the parent's; start empty.
  void abandon_after_fork() {
    new (&mu_) std::mutex();
    table_.clear();
    by_thread_.clear();
    threads_merged_ = 0;
    games_.clear();
    rates_.clear();
    code_.forget();
  }

 private:
  void drain_locked(sample_ring& ring, bool map_ahead = true) {
    const std::uint64_t now = windows_.enabled() ? monotonic_ns() : 0;
    games_.collect_closed();  // before the ring: the samples of these frames are in it
    while (ring_slot* s = ring.peek()) {
      sample_header h = s->header;
      if (h.tag == kGameFrameTagByTime) h.tag = games_.tag_at(h.tid, h.time_ns);
      const std::uint16_t flags = static_cast<std::uint16_t>(h.flags & kSampleKeptFlags);
      std::size_t depth = h.depth <= ring.max_depth() ? h.depth : ring.max_depth();
      if (depth > pcs_.size()) depth = pcs_.size();
      const bool wall_record = (flags & (sample_offcpu | sample_running)) != 0;
      if (depth > 0 || wall_record) {
        const std::uint64_t* raw = s->pcs();
        for (std::size_t i = 0; i < depth; ++i) {
          pcs_[i] = raw[i];
          if (!jit_translate_pc(pcs_[i], h.time_ns)) code_.translate(pcs_[i], h.time_ns);
        }
        games_.add_sample(h, pcs_.data(), depth, flags);
        std::uint64_t w = rates_.common_weight(h.tid, h.weight);
        // Wall mode counts microseconds: the sampler's records already are; a tick stands for one period.
        if (config_.wall && !wall_record) w = (w * period_ns_ + 500) / 1000;
        if (w > 0) {
          table_.add_bounded(h.tid, flags, pcs_.data(), depth, w);
          windows_.add(h.tid, flags, pcs_.data(), depth, w, now);
          by_thread_[h.tid] += w;
        }
      }
      ring.release(s);
    }
    if (map_ahead) ring.map_ahead();
    games_.process_closed();
  }

  // Of the cumulative table, or of the window buckets (`windowed`).
  merge_counts merged_locked(bool windowed = false) const {
    merge_counts m;
    m.stack_records = windowed ? windows_.merged_records() : table_.merged_records();
    m.samples = windowed ? windows_.merged_weight() : table_.merged_weight();
    m.threads = threads_merged_;
    return m;
  }

  std::mutex mu_;
  store_config config_;
  std::uint64_t period_ns_ = 0;
  stack_table table_;
  window_tables windows_;
  std::unordered_map<std::uint32_t, std::uint64_t> by_thread_;
  std::uint64_t threads_merged_ = 0;
  game_frame_tracker games_;
  game_frame_rates rates_;
  std::vector<std::uint64_t> pcs_;  // one record's addresses, translated
  code_watch code_;
};

}  // namespace detail
}  // namespace selfprof
