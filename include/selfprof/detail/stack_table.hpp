// The stack table: raw stacks (addresses, thread, flags) folded into counts. Memory grows with unique
// stacks, not with samples, and never past a limit when one is set (set_limit): a new distinct stack that
// would pass it is counted under one "[selfprof: memory ceiling]" stack instead (add_bounded), so the
// table's total stays right. Threads that ended can be folded into one entry per stack (merge_threads).
// Context: any thread except the signal handler (the collector folds into it under the sample store's lock).
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <vector>

namespace selfprof {
namespace detail {

// The one frame of the stacks merged at the memory ceiling: 0xfc in the top byte is never a canonical
// user or kernel address, nor a JIT (0xfe) or perf map (0xfd) tag. Named when a profile is symbolized.
constexpr std::uint64_t kMemoryCeilingPc = std::uint64_t{0xfc} << 56;
// Kernel code addresses (the ring source's kernel call chains) have 0xff in the top byte on x86-64 (from
// 0xffff800000000000) and AArch64: above every tag, and above user code. x86-64's [vsyscall] page sits
// there too but is a user mapping, named like one.
inline bool is_kernel_address(std::uint64_t a) {
  return (a >> 56) == 0xff && (a & ~std::uint64_t{0xfff}) != 0xffffffffff600000ull;
}
// The thread the stacks of ended threads are merged into (see merge_threads), and the ceiling stacks'.
constexpr std::uint32_t kMergedThreadsTid = 0;

class stack_table {
 public:
  struct entry {
    std::uint64_t hash;
    std::uint64_t count;
    std::uint32_t offset;  // into pcs_
    std::uint32_t tid;
    std::uint16_t depth;
    std::uint16_t flags;
  };

  // The most bytes the table may hold (entries, addresses, index); 0: no limit. Applies to new stacks.
  void set_limit(std::size_t bytes) { limit_ = bytes; }
  std::size_t limit() const { return limit_; }

  // Counts `weight` for the stack. False (and nothing counted) when it is new and there is no room.
  bool add(std::uint32_t tid, std::uint16_t flags, const std::uint64_t* pcs, std::size_t depth,
           std::uint64_t weight) {
    return add_hashed(hash(tid, flags, pcs, depth), tid, flags, pcs, depth, weight, false);
  }

  // add(), and a stack with no room is counted under the memory-ceiling stack of its kind (on-CPU,
  // off-CPU, running) in thread kMergedThreadsTid, so the total stays right.
  void add_bounded(std::uint32_t tid, std::uint16_t flags, const std::uint64_t* pcs, std::size_t depth,
                   std::uint64_t weight) {
    if (add(tid, flags, pcs, depth, weight)) return;
    ++merged_records_;
    merged_weight_ += weight;
    const std::uint64_t ceiling = kMemoryCeilingPc;
    const auto kind = static_cast<std::uint16_t>(flags & kCeilingKeptFlags);
    add_hashed(hash(kMergedThreadsTid, kind, &ceiling, 1), kMergedThreadsTid, kind, &ceiling, 1, weight,
               true);
  }

  void merge(const stack_table& other) {
    for (const entry& e : other.entries_) add(e.tid, e.flags, other.pcs(e), e.depth, e.count);
  }

  // Moves every stack of a thread for which `ended(tid)` is true to thread kMergedThreadsTid, merging
  // those that become equal, in place (no second table). Returns how many entries that freed.
  template <typename Pred>
  std::size_t merge_threads(Pred ended) {
    if (entries_.empty()) return 0;
    std::fill(index_.begin(), index_.end(), 0u);
    const std::size_t mask = index_.size() - 1;
    std::size_t kept = 0, pcs_end = 0;
    for (std::size_t r = 0; r < entries_.size(); ++r) {
      entry e = entries_[r];
      if (e.tid != kMergedThreadsTid && ended(e.tid)) {
        e.tid = kMergedThreadsTid;
        e.hash = hash(e.tid, e.flags, pcs(e), e.depth);
      }
      std::size_t i = e.hash & mask;
      bool merged = false;
      for (; index_[i] != 0; i = (i + 1) & mask) {
        entry& k = entries_[index_[i] - 1];
        if (same(k, e.hash, e.tid, e.flags, pcs(e), e.depth)) {
          k.count += e.count;
          merged = true;
          break;
        }
      }
      if (merged) continue;
      // Kept entries only move towards the front, so this never overwrites addresses not read yet.
      if (e.depth > 0) std::memmove(pcs_.data() + pcs_end, pcs(e), e.depth * sizeof(std::uint64_t));
      e.offset = static_cast<std::uint32_t>(pcs_end);
      pcs_end += e.depth;
      entries_[kept++] = e;
      index_[i] = static_cast<std::uint32_t>(kept);
    }
    const std::size_t freed = entries_.size() - kept;
    entries_.resize(kept);
    pcs_.resize(pcs_end);
    return freed;
  }

  // The count of a stack (0 when the table does not hold it).
  std::uint64_t count_of(std::uint32_t tid, std::uint16_t flags, const std::uint64_t* pcs,
                         std::size_t depth) const {
    if (index_.empty()) return 0;
    const std::uint64_t h = hash(tid, flags, pcs, depth);
    const std::size_t mask = index_.size() - 1;
    for (std::size_t i = h & mask; index_[i] != 0; i = (i + 1) & mask) {
      const entry& e = entries_[index_[i] - 1];
      if (same(e, h, tid, flags, pcs, depth)) return e.count;
    }
    return 0;
  }

  // What `later` counted past `earlier` (a table of the same session taken before it), stack by stack:
  // the samples of the time between the two. A stack whose count did not grow is left out. Unbounded:
  // it is never larger than `later`.
  static stack_table difference(const stack_table& later, const stack_table& earlier) {
    stack_table d;
    for (const entry& e : later.entries_) {
      const std::uint64_t before = earlier.count_of(e.tid, e.flags, later.pcs(e), e.depth);
      if (e.count > before) d.add(e.tid, e.flags, later.pcs(e), e.depth, e.count - before);
    }
    return d;
  }

  const std::vector<entry>& entries() const { return entries_; }
  const std::uint64_t* pcs(const entry& e) const { return pcs_.data() + e.offset; }
  std::size_t unique() const { return entries_.size(); }
  std::uint64_t total() const { return total_; }
  std::size_t memory_bytes() const {
    return entries_.capacity() * sizeof(entry) + pcs_.capacity() * 8 + index_.capacity() * 4;
  }
  // New stacks counted under the memory-ceiling stack: add() calls that found no room, and their weight.
  std::uint64_t merged_records() const { return merged_records_; }
  std::uint64_t merged_weight() const { return merged_weight_; }
  void clear() {
    entries_.clear();
    pcs_.clear();
    index_.assign(index_.size(), 0);
    total_ = 0;
    merged_records_ = 0;
    merged_weight_ = 0;
  }

 private:
  static constexpr std::uint16_t kCeilingKeptFlags = 0x2 | 0x8;  // sample_offcpu | sample_running
  static constexpr std::size_t kFirstIndexSlots = 1024;

  static std::uint64_t hash(std::uint32_t tid, std::uint16_t flags, const std::uint64_t* pcs,
                            std::size_t depth) {
    std::uint64_t h =
        0x9E3779B97F4A7C15ull ^ (std::uint64_t(tid) << 16) ^ flags ^ (std::uint64_t(depth) << 48);
    for (std::size_t i = 0; i < depth; ++i) {
      h ^= pcs[i] + 0x9E3779B97F4A7C15ull + (h << 6) + (h >> 2);
      h *= 0xff51afd7ed558ccdull;
    }
    return h ^ (h >> 33);
  }

  bool same(const entry& e, std::uint64_t h, std::uint32_t tid, std::uint16_t flags, const std::uint64_t* pcs,
            std::size_t depth) const {
    return e.hash == h && e.tid == tid && e.flags == flags && e.depth == depth &&
           (depth == 0 || std::memcmp(pcs_.data() + e.offset, pcs, depth * sizeof(std::uint64_t)) == 0);
  }

  // `always`: the few memory-ceiling stacks, added past the limit in the smallest steps.
  bool add_hashed(std::uint64_t h, std::uint32_t tid, std::uint16_t flags, const std::uint64_t* pcs,
                  std::size_t depth, std::uint64_t weight, bool always) {
    if (!index_.empty()) {
      const std::size_t mask = index_.size() - 1;
      for (std::size_t i = h & mask; index_[i] != 0; i = (i + 1) & mask) {
        entry& e = entries_[index_[i] - 1];
        if (same(e, h, tid, flags, pcs, depth)) {
          e.count += weight;
          total_ += weight;
          return true;
        }
      }
    }
    if (!make_room(depth, always)) return false;
    const std::size_t mask = index_.size() - 1;
    std::size_t i = h & mask;
    while (index_[i] != 0) i = (i + 1) & mask;
    entries_.push_back(entry{h, weight, static_cast<std::uint32_t>(pcs_.size()), tid,
                             static_cast<std::uint16_t>(depth), flags});
    pcs_.insert(pcs_.end(), pcs, pcs + depth);
    index_[i] = static_cast<std::uint32_t>(entries_.size());
    total_ += weight;
    return true;
  }

  // Capacity for one more entry of `depth` addresses, within the limit unless `always`. Near the limit
  // the vectors grow into what is left in one step, so adding never turns into copying on every stack.
  bool make_room(std::size_t depth, bool always) {
    const std::size_t n = entries_.size() + 1, p_need = pcs_.size() + depth;
    std::size_t slots = !index_.empty() ? index_.size() : always && limit_ ? 8 : kFirstIndexSlots;
    while (n * 10 > slots * 7) slots *= 2;
    // The ceiling stacks take a free slot past the load limit rather than double the index.
    if (always && !index_.empty() && n < index_.size()) slots = index_.size();
    if (limit_ == 0) {
      if (slots != index_.size()) rehash(slots);
      return true;
    }
    if (always) {
      reserve(std::max(entries_.capacity(), n + 2), std::max(pcs_.capacity(), p_need + 2), slots);
      return true;
    }
    if (slots * 4 > limit_) return false;
    const std::size_t budget = limit_ - slots * 4;
    const std::size_t e_min = std::max(entries_.capacity(), n), p_min = std::max(pcs_.capacity(), p_need);
    if (e_min * sizeof(entry) + p_min * 8 > budget) return false;
    std::size_t e_cap = e_min, p_cap = p_min;
    if (n > entries_.capacity()) {
      const std::size_t spare = (budget - e_min * sizeof(entry) - p_min * 8) / 2 / sizeof(entry);
      e_cap = std::min(grown(entries_.capacity(), n, sizeof(entry)), e_min + spare);
    }
    if (p_need > pcs_.capacity()) {
      const std::size_t spare = (budget - e_cap * sizeof(entry) - p_min * 8) / 8;
      p_cap = std::min(grown(pcs_.capacity(), p_need, 8), p_min + spare);
    }
    reserve(e_cap, p_cap, slots);
    return true;
  }

  // Capacity after growing from `cap` to hold `need`: by half again, at least a page's worth.
  static std::size_t grown(std::size_t cap, std::size_t need, std::size_t elem) {
    return std::max(need, std::max(cap + cap / 2, 4096 / elem));
  }

  void reserve(std::size_t entries_cap, std::size_t pcs_cap, std::size_t slots) {
    entries_.reserve(entries_cap);
    pcs_.reserve(pcs_cap);
    if (slots != index_.size()) rehash(slots);
  }

  void rehash(std::size_t n) {
    std::vector<std::uint32_t>(n, 0).swap(index_);
    for (std::size_t k = 0; k < entries_.size(); ++k) {
      for (std::size_t i = entries_[k].hash & (n - 1);; i = (i + 1) & (n - 1)) {
        if (index_[i] == 0) {
          index_[i] = static_cast<std::uint32_t>(k + 1);
          break;
        }
      }
    }
  }

  std::vector<entry> entries_;
  std::vector<std::uint64_t> pcs_;
  std::vector<std::uint32_t> index_;
  std::uint64_t total_ = 0;
  std::size_t limit_ = 0;
  std::uint64_t merged_records_ = 0, merged_weight_ = 0;
};

}  // namespace detail
}  // namespace selfprof
