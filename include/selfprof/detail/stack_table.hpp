// The stack table: raw stacks (addresses, thread, flags) folded into counts. Memory grows with unique
// stacks, not with samples.
// Context: any thread except the signal handler (the collector folds into it under the sample store's lock).
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <vector>

namespace selfprof {
namespace detail {

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

  void add(std::uint32_t tid, std::uint16_t flags, const std::uint64_t* pcs, std::size_t depth,
           std::uint64_t weight) {
    std::uint64_t h = hash(tid, flags, pcs, depth);
    if ((entries_.size() + 1) * 10 > index_.size() * 7) grow();
    std::size_t mask = index_.size() - 1;
    for (std::size_t i = h & mask;; i = (i + 1) & mask) {
      std::uint32_t slot = index_[i];
      if (slot == 0) {
        entries_.push_back(entry{h, weight, static_cast<std::uint32_t>(pcs_.size()), tid,
                                 static_cast<std::uint16_t>(depth), flags});
        pcs_.insert(pcs_.end(), pcs, pcs + depth);
        index_[i] = static_cast<std::uint32_t>(entries_.size());
        total_ += weight;
        return;
      }
      entry& e = entries_[slot - 1];
      if (e.hash == h && e.tid == tid && e.flags == flags && e.depth == depth &&
          std::memcmp(&pcs_[e.offset], pcs, depth * sizeof(std::uint64_t)) == 0) {
        e.count += weight;
        total_ += weight;
        return;
      }
    }
  }

  void merge(const stack_table& other) {
    for (const entry& e : other.entries_) add(e.tid, e.flags, other.pcs(e), e.depth, e.count);
  }

  const std::vector<entry>& entries() const { return entries_; }
  const std::uint64_t* pcs(const entry& e) const { return pcs_.data() + e.offset; }
  std::size_t unique() const { return entries_.size(); }
  std::uint64_t total() const { return total_; }
  std::size_t memory_bytes() const {
    return entries_.capacity() * sizeof(entry) + pcs_.capacity() * 8 + index_.capacity() * 4;
  }
  void clear() {
    entries_.clear();
    pcs_.clear();
    index_.assign(index_.size(), 0);
    total_ = 0;
  }

 private:
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

  void grow() {
    std::size_t n = index_.empty() ? 1024 : index_.size() * 2;
    index_.assign(n, 0);
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
};

}  // namespace detail
}  // namespace selfprof
