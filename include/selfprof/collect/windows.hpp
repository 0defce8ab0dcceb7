// Time windows: the same samples as the cumulative table, also kept in one-second buckets, so a dump can
// hold "the last N seconds" and consecutive windowed dumps never count a sample twice. The buckets share
// one memory limit: only the newest bucket grows, up to what the others leave of it (past that, new
// stacks go to the memory-ceiling stack).
// Context: collector thread (and dump callers holding the collector's table lock).
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>

#include "selfprof/detail/stack_table.hpp"

namespace selfprof {
namespace detail {

constexpr std::uint64_t kWindowBucketNs = 1000000000ull;

class window_tables {
 public:
  // `limit_bytes`: of all the buckets together (0: no limit).
  void configure(std::uint64_t window_ns, std::size_t limit_bytes = 0) {
    window_ns_ = window_ns;
    buckets_.clear();
    cut_seq_ = 0;
    next_seq_ = 0;
    merged_records_ = 0;
    merged_weight_ = 0;
    limit_ = limit_bytes;
  }
  bool enabled() const { return window_ns_ != 0; }

  void add(std::uint32_t tid, std::uint16_t flags, const std::uint64_t* pcs, std::size_t depth,
           std::uint64_t weight, std::uint64_t now_ns) {
    if (!enabled()) return;
    if (buckets_.empty() || now_ns - buckets_.back().start_ns >= kWindowBucketNs) {
      drop_old(now_ns);  // before the new bucket's limit is set from what the others hold
      open_bucket(now_ns);
    }
    stack_table& t = buckets_.back().table;
    const std::uint64_t before = t.merged_records();
    t.add_bounded(tid, flags, pcs, depth, weight);
    if (t.merged_records() != before) {
      ++merged_records_;
      merged_weight_ += weight;
    }
    buckets_.back().end_ns = now_ns;
  }

  // Samples of the last window not yet handed out by a successful windowed dump. Closes the open
  // bucket, so samples that arrive from now on belong to the next window. Returns the sequence
  // number to pass to mark_dumped() once the dump was written.
  std::uint64_t take(std::uint64_t now_ns, stack_table& out) {
    drop_old(now_ns);
    std::uint64_t last = cut_seq_;
    for (const bucket& b : buckets_) {
      if (b.seq < cut_seq_) continue;
      if (b.end_ns + window_ns_ < now_ns && b.end_ns != 0) continue;
      out.merge(b.table);
      last = b.seq + 1;
    }
    open_bucket(now_ns);
    return last;
  }
  void mark_dumped(std::uint64_t seq) {
    if (seq > cut_seq_) cut_seq_ = seq;
  }

  // See stack_table::merge_threads.
  template <typename Pred>
  void merge_threads(Pred ended) {
    for (bucket& b : buckets_) b.table.merge_threads(ended);
  }
  std::size_t memory_bytes() const {
    std::size_t n = 0;
    for (const bucket& b : buckets_) n += b.table.memory_bytes();
    return n;
  }
  // Records of new stacks counted under the memory-ceiling stack since configure(), and their weight.
  std::uint64_t merged_records() const { return merged_records_; }
  std::uint64_t merged_weight() const { return merged_weight_; }

 private:
  struct bucket {
    std::uint64_t seq = 0, start_ns = 0, end_ns = 0;
    stack_table table;
  };
  void open_bucket(std::uint64_t now_ns) {
    buckets_.emplace_back();
    buckets_.back().seq = next_seq_++;
    buckets_.back().start_ns = now_ns;
    if (limit_ == 0) return;
    const std::size_t used = memory_bytes();
    buckets_.back().table.set_limit(used < limit_ ? limit_ - used : 1);
  }
  void drop_old(std::uint64_t now_ns) {
    while (buckets_.size() > 1 && buckets_.front().end_ns + window_ns_ < now_ns) buckets_.pop_front();
  }

  std::uint64_t window_ns_ = 0, cut_seq_ = 0, next_seq_ = 0;
  std::size_t limit_ = 0;
  std::uint64_t merged_records_ = 0, merged_weight_ = 0;
  std::deque<bucket> buckets_;
};

}  // namespace detail
}  // namespace selfprof
