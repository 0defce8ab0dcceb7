// The JIT code registry: every region ever registered (start, size, name, add and remove times in
// CLOCK_MONOTONIC ns), kept for the life of the process so that a sample is named by the code that was
// at its address when the sample was taken, plus the tagged-pc encoding that carries (region, offset).
// Context: any thread. Writers (add, remove, for_each_live) must be serialised by the caller; lookups
// (translate) serialise among themselves on an internal lock and never wait for writers; name() is lock-free.
// Regions are at most 4 GiB - 1 long.
#pragma once

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstring>
#include <memory>
#include <mutex>
#include <new>
#include <string>
#include <string_view>
#include <vector>

#include "selfprof/profile.hpp"

namespace selfprof {
namespace detail {

// A tagged pc: 0xfe in the top byte (never a canonical x86-64 or AArch64 user or kernel address), the
// region's generation in the next 32 bits and offset+1 in the low 24 bits. offset+1 so that `tagged - 1`,
// which build_profile() looks up for return addresses, still decodes to the same region (at pc - 1).
constexpr std::uint64_t jit_tag_marker = std::uint64_t{0xfe} << 56;
constexpr unsigned jit_tag_offset_bits =
    24;  // regions longer than 16 MiB - 1 keep raw pcs (perf map names them)
constexpr std::uint64_t jit_tag_offset_mask = (std::uint64_t{1} << jit_tag_offset_bits) - 1;
constexpr std::uint64_t jit_live = ~std::uint64_t{0};  // remove time of a region still in place

inline bool is_jit_tagged(std::uint64_t v) { return (v >> 56) == 0xfe; }

struct jit_region {
  std::uint64_t start = 0;
  std::uint64_t add_ns = 0;
  std::atomic<std::uint64_t> remove_ns{jit_live};
  const char* meta = nullptr;  // in the registry's arena: u32 size, u32 name length, the name bytes

  std::uint64_t size() const {
    std::uint32_t v;
    std::memcpy(&v, meta, 4);
    return v;
  }
  std::string_view name() const {
    std::uint32_t n;
    std::memcpy(&n, meta + 4, 4);
    return std::string_view(meta + 8, n);
  }
};

// Start address -> generation of the live region there: open addressing with linear probing, no node
// allocation per entry (registration is meant to be cheap enough for every compiled function).
class live_index {
 public:
  static constexpr std::uint32_t none = ~std::uint32_t{0};

  // The generation stored for `key` (none if absent), inserting the key when absent.
  std::uint32_t& slot(std::uint64_t key) {
    if ((used_ + 1) * 4 > keys_.size() * 3) grow();
    std::size_t mask = keys_.size() - 1, grave = keys_.size();
    for (std::size_t i = hash(key) & mask;; i = (i + 1) & mask) {
      if (keys_[i] == key && vals_[i] != none) return vals_[i];
      if (keys_[i] == key) {  // a tombstone of this very key: reuse it
        ++size_;
        return vals_[i];
      }
      if (vals_[i] == none && keys_[i] == empty) {
        if (grave != keys_.size())
          i = grave;
        else
          ++used_;
        keys_[i] = key;
        vals_[i] = none;
        ++size_;
        return vals_[i];
      }
      if (vals_[i] == none && grave == keys_.size()) grave = i;  // a tombstone: reusable
    }
  }

  // Removes `key` and returns its generation, or none.
  std::uint32_t take(std::uint64_t key) {
    if (keys_.empty()) return none;
    std::size_t mask = keys_.size() - 1;
    for (std::size_t i = hash(key) & mask;; i = (i + 1) & mask) {
      if (keys_[i] == key && vals_[i] != none) {
        std::uint32_t v = vals_[i];
        vals_[i] = none;  // tombstone: the key stays so that probing goes on past it
        --size_;
        return v;
      }
      if (keys_[i] == empty && vals_[i] == none) return none;
    }
  }

  std::vector<std::uint32_t> values() const {
    std::vector<std::uint32_t> out;
    out.reserve(size_);
    for (std::size_t i = 0; i < keys_.size(); ++i)
      if (vals_[i] != none) out.push_back(vals_[i]);
    return out;
  }
  std::size_t size() const { return size_; }

 private:
  static constexpr std::uint64_t empty = ~std::uint64_t{0};  // never the start of user-space code
  static std::size_t hash(std::uint64_t k) {
    k ^= k >> 33;
    k *= 0xff51afd7ed558ccdull;
    k ^= k >> 33;
    return static_cast<std::size_t>(k);
  }
  void grow() {
    std::size_t cap = 64;
    while (cap < size_ * 2) cap *= 2;
    std::vector<std::uint64_t> keys(cap, empty);
    std::vector<std::uint32_t> vals(keys.size(), none);
    std::size_t mask = keys.size() - 1;
    for (std::size_t j = 0; j < keys_.size(); ++j) {
      if (vals_[j] == none) continue;
      std::size_t i = hash(keys_[j]) & mask;
      while (keys[i] != empty) i = (i + 1) & mask;
      keys[i] = keys_[j];
      vals[i] = vals_[j];
    }
    keys_.swap(keys);
    vals_.swap(vals);
    used_ = size_;
  }

  std::vector<std::uint64_t> keys_;
  std::vector<std::uint32_t> vals_;  // none: free (key empty) or tombstone (key kept)
  std::size_t size_ = 0;             // live keys
  std::size_t used_ = 0;             // slots with a key (live or tombstone)
};

class jit_registry {
 public:
  jit_registry() = default;
  jit_registry(const jit_registry&) = delete;
  jit_registry& operator=(const jit_registry&) = delete;
  ~jit_registry() {
    for (auto& b : buckets_) delete[] b.load(std::memory_order_relaxed);
  }

  // Writer. Registers [start, start+size) under an already sanitised name at time now_ns and returns its
  // generation. A live region with the same start is replaced (removed at now_ns), as perf's last line wins.
  std::uint32_t add(std::uint64_t start, std::uint32_t size, std::string_view name, std::uint64_t now_ns) {
    std::uint32_t gen = static_cast<std::uint32_t>(count_.load(std::memory_order_relaxed));
    std::uint32_t& live = live_.slot(start);
    if (live != live_index::none) slot_for(live).remove_ns.store(now_ns, std::memory_order_release);
    live = gen;
    jit_region& r = slot_for(gen);
    r.start = start;
    r.add_ns = now_ns;
    r.remove_ns.store(jit_live, std::memory_order_relaxed);
    r.meta = store_meta(static_cast<std::uint32_t>(size), name);
    std::uint64_t end = start + size < start ? ~std::uint64_t{0} : start + size;
    if (gen == 0 || start < lo_.load(std::memory_order_relaxed)) lo_.store(start, std::memory_order_relaxed);
    if (end > hi_.load(std::memory_order_relaxed)) hi_.store(end, std::memory_order_relaxed);
    count_.store(std::uint64_t{gen} + 1, std::memory_order_release);  // publishes the slot to readers
    return gen;
  }

  // Writer. Marks the live region starting at `start` removed at now_ns; false when there is none.
  bool remove(std::uint64_t start, std::uint64_t now_ns) {
    std::uint32_t gen = live_.take(start);
    if (gen == live_index::none) return false;
    slot_for(gen).remove_ns.store(now_ns, std::memory_order_release);
    return true;
  }

  // Writer side: calls f(const jit_region&) for each live region, oldest first.
  template <typename F>
  void for_each_live(F f) const {
    std::vector<std::uint32_t> gens = live_.values();
    std::sort(gens.begin(), gens.end());
    for (std::uint32_t g : gens) f(region(g));
  }

  std::uint64_t count() const { return count_.load(std::memory_order_acquire); }
  std::size_t live_count() const { return live_.size(); }  // writer side

  // Region of a generation below count().
  const jit_region& region(std::uint32_t gen) const {
    std::uint64_t v = std::uint64_t{gen} + (std::uint64_t{1} << first_bucket_bits);
    unsigned p = 63u - static_cast<unsigned>(__builtin_clzll(v));
    return buckets_[p - first_bucket_bits].load(std::memory_order_acquire)[v - (std::uint64_t{1} << p)];
  }

  // Lookup. When `pc` lies in a region that was in place at time_ns (add time <= time_ns < remove time;
  // the latest such region if several overlap), rewrites pc to its tagged value and returns true.
  // Returns false at once, without a lock, when nothing was ever registered or pc is outside every region.
  bool translate(std::uint64_t& pc, std::uint64_t time_ns) {
    std::uint64_t n = count_.load(std::memory_order_acquire);
    if (n == 0 || pc < lo_.load(std::memory_order_relaxed) || pc >= hi_.load(std::memory_order_relaxed))
      return false;
    std::lock_guard<std::mutex> lock(index_mu_);
    if (n > indexed_) catch_up(n);
    std::uint64_t best = jit_live;
    for (const auto& run : runs_) find_in(run, pc, time_ns, best);
    if (best == jit_live) return false;
    std::uint64_t offset = pc - region(static_cast<std::uint32_t>(best)).start;
    if (offset + 1 > jit_tag_offset_mask) return false;
    pc = jit_tag_marker | (best << jit_tag_offset_bits) | (offset + 1);
    return true;
  }

  // After fork(): a lookup in the parent may have held the index lock mid-update; the child starts a
  // fresh index (the old one is leaked on purpose rather than freed in an unknown state).
  void reset_lookup_after_fork() {
    new (&index_mu_) std::mutex();
    new (&runs_) std::vector<run>();
    indexed_ = 0;
  }

  // Names a tagged value (or a tagged value minus one): kind jit, module "[jit]", address the original.
  bool name(std::uint64_t tagged, frame& out) const {
    if (!is_jit_tagged(tagged)) return false;
    std::uint64_t gen = (tagged >> jit_tag_offset_bits) & 0xffffffffu;
    std::uint64_t field = tagged & jit_tag_offset_mask;  // offset + 1, or offset for `tagged - 1`
    if (gen >= count()) return false;
    const jit_region& r = region(static_cast<std::uint32_t>(gen));
    if (field > r.size()) return false;
    out.name.assign(r.name());
    out.module = "[jit]";
    out.address = r.start + field - 1;
    out.module_offset = field == 0 ? 0 : field - 1;
    out.file.clear();
    out.line = 0;
    out.kind = frame_kind::jit;
    return true;
  }

 private:
  struct index_entry {
    std::uint64_t start, end, max_end;  // max_end: the largest end among this entry and those before it
    std::uint32_t gen;
  };
  using run = std::vector<index_entry>;

  static constexpr unsigned first_bucket_bits = 8;  // bucket b holds 256 << b regions
  static constexpr unsigned bucket_count = 26;      // enough for 2^32 generations

  // Writer: the slot of a generation, allocating its bucket on first use.
  jit_region& slot_for(std::uint32_t gen) {
    std::uint64_t v = std::uint64_t{gen} + (std::uint64_t{1} << first_bucket_bits);
    unsigned p = 63u - static_cast<unsigned>(__builtin_clzll(v));
    unsigned b = p - first_bucket_bits;
    jit_region* bucket = buckets_[b].load(std::memory_order_acquire);
    if (bucket == nullptr) {  // only a writer reaches a bucket not yet published
      bucket = new jit_region[std::size_t{1} << p];
      buckets_[b].store(bucket, std::memory_order_release);
    }
    return bucket[v - (std::uint64_t{1} << p)];
  }

  const char* store_meta(std::uint32_t size, std::string_view name) {
    std::size_t need = 8 + name.size();
    if (need > arena_left_) {
      std::size_t block = std::max<std::size_t>(arena_block, need);
      arena_.emplace_back(new char[block]);
      arena_next_ = arena_.back().get();
      arena_left_ = block;
    }
    char* p = arena_next_;
    std::uint32_t len = static_cast<std::uint32_t>(name.size());
    std::memcpy(p, &size, 4);
    std::memcpy(p + 4, &len, 4);
    if (len != 0) std::memcpy(p + 8, name.data(), len);
    arena_next_ += need;
    arena_left_ -= need;
    return p;
  }

  // Indexes generations [indexed_, n) as a new sorted run, then merges runs so that each is more than
  // twice the size of the next (a binary counter): O(log n) runs, O(log n) amortised work per region.
  void catch_up(std::uint64_t n) {
    run fresh;
    fresh.reserve(static_cast<std::size_t>(n - indexed_));
    for (std::uint64_t g = indexed_; g < n; ++g) {
      const jit_region& r = region(static_cast<std::uint32_t>(g));
      std::uint64_t end = r.start + r.size() < r.start ? ~std::uint64_t{0} : r.start + r.size();
      fresh.push_back(index_entry{r.start, end, end, static_cast<std::uint32_t>(g)});
    }
    indexed_ = n;
    std::sort(fresh.begin(), fresh.end(), by_start);
    runs_.push_back(std::move(fresh));
    while (runs_.size() >= 2 && runs_[runs_.size() - 2].size() <= 2 * runs_.back().size()) {
      run& a = runs_[runs_.size() - 2];
      const run& b = runs_.back();
      run merged(a.size() + b.size());
      std::merge(a.begin(), a.end(), b.begin(), b.end(), merged.begin(), by_start);
      a.swap(merged);
      runs_.pop_back();
    }
    run& last = runs_.back();
    std::uint64_t m = 0;
    for (auto& e : last) e.max_end = m = std::max(m, e.end);
  }

  static bool by_start(const index_entry& a, const index_entry& b) {
    return a.start != b.start ? a.start < b.start : a.gen < b.gen;
  }

  void find_in(const run& r, std::uint64_t pc, std::uint64_t time_ns, std::uint64_t& best) const {
    auto it = std::upper_bound(r.begin(), r.end(), pc,
                               [](std::uint64_t v, const index_entry& e) { return v < e.start; });
    while (it != r.begin()) {
      --it;
      if (it->max_end <= pc) break;  // nothing at or before this entry reaches pc
      if (it->end <= pc || (best != jit_live && it->gen <= best)) continue;
      const jit_region& g = region(it->gen);
      if (g.add_ns <= time_ns && time_ns < g.remove_ns.load(std::memory_order_acquire)) best = it->gen;
    }
  }

  static constexpr std::size_t arena_block = 256 * 1024;

  // Writers' state (serialised by the caller).
  live_index live_;  // start -> generation of the live region there
  std::vector<std::unique_ptr<char[]>> arena_;
  char* arena_next_ = nullptr;
  std::size_t arena_left_ = 0;

  // Published to readers.
  std::atomic<jit_region*> buckets_[bucket_count] = {};
  std::atomic<std::uint64_t> count_{0};
  std::atomic<std::uint64_t> lo_{0}, hi_{0};

  // Lookup index (index_mu_).
  std::mutex index_mu_;
  std::vector<run> runs_;
  std::uint64_t indexed_ = 0;
};

}  // namespace detail
}  // namespace selfprof
