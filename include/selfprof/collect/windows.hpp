// Time windows: the same samples as the cumulative table, also kept in one-second buckets, so a dump can
// hold "the last N seconds" and consecutive windowed dumps never count a sample twice.
// Context: collector thread (and dump callers holding the collector's table lock).
#pragma once

#include <cstdint>
#include <deque>

#include "selfprof/detail/stack_table.hpp"

namespace selfprof {
namespace detail {

constexpr std::uint64_t kWindowBucketNs = 1000000000ull;

class window_tables {
 public:
  void configure(std::uint64_t window_ns) {
    window_ns_ = window_ns;
    buckets_.clear();
    cut_seq_ = 0;
    next_seq_ = 0;
  }
  bool enabled() const { return window_ns_ != 0; }

  void add(std::uint32_t tid, std::uint16_t flags, const std::uint64_t* pcs, std::size_t depth,
           std::uint64_t weight, std::uint64_t now_ns) {
    if (!enabled()) return;
    if (buckets_.empty() || now_ns - buckets_.back().start_ns >= kWindowBucketNs) open_bucket(now_ns);
    buckets_.back().table.add(tid, flags, pcs, depth, weight);
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

 private:
  struct bucket {
    std::uint64_t seq = 0, start_ns = 0, end_ns = 0;
    stack_table table;
  };
  void open_bucket(std::uint64_t now_ns) {
    buckets_.emplace_back();
    buckets_.back().seq = next_seq_++;
    buckets_.back().start_ns = now_ns;
  }
  void drop_old(std::uint64_t now_ns) {
    while (buckets_.size() > 1 && buckets_.front().end_ns + window_ns_ < now_ns) buckets_.pop_front();
  }

  std::uint64_t window_ns_ = 0, cut_seq_ = 0, next_seq_ = 0;
  std::deque<bucket> buckets_;
};

}  // namespace detail
}  // namespace selfprof
