// Signal-handler code: the preallocated multi-producer, single-consumer ring of fixed-size sample records.
// Context: producers run in the signal handler (lock-free, never wait); the one consumer is whoever holds
// the collector's table lock.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>

namespace selfprof {
namespace detail {

enum sample_flags : std::uint16_t {
  sample_truncated = 1u << 0,   // root-side frames are missing: the depth limit, or a copied stack ended
  sample_offcpu = 1u << 1,      // wall mode: the thread was not running
  sample_leaf_fixed = 1u << 2,  // the caller of the interrupted frame was recovered by a leaf heuristic
  sample_running = 1u << 3,     // wall mode without on-CPU signals: CPU time of a thread, no stack
};
// Wall mode: off-CPU samples carry the blocking system call in the flags' upper bits (number + 1; 0 when
// the thread was blocked outside a system call), so stacks that wait in different calls stay apart.
constexpr unsigned kSampleCallShift = 4;
constexpr std::uint16_t kSampleCallMask = 0xFFF0;
constexpr std::uint16_t kSampleKeptFlags =
    sample_truncated | sample_offcpu | sample_running | kSampleCallMask;

// One sample, as the handler writes it. `pcs` follows the header in the slot: pcs[0] is the interrupted
// pc, pcs[1..depth) are return addresses, leaf first.
struct sample_header {
  std::uint32_t tid;
  std::uint16_t depth;
  std::uint16_t flags;
  std::uint32_t weight;   // ticks this sample stands for (1 + timer overruns)
  std::uint64_t time_ns;  // CLOCK_MONOTONIC when taken
  std::uint64_t tag;      // frame marker of the thread (game frames), 0 if none
};

struct ring_slot {
  std::atomic<std::uint64_t> seq;
  sample_header header;
  // followed by max_depth std::uint64_t program counters
  std::uint64_t* pcs() { return reinterpret_cast<std::uint64_t*>(this + 1); }
};
static_assert(sizeof(ring_slot) % 8 == 0, "slots must keep 8-byte alignment");

// A bounded MPSC queue (sequence numbers per slot, after D. Vyukov's design). The memory is given by the
// owner and outlives every handler that may still run.
class sample_ring {
 public:
  sample_ring() = default;
  sample_ring(const sample_ring&) = delete;
  sample_ring& operator=(const sample_ring&) = delete;

  static std::size_t stride_for(std::size_t max_depth) {
    return sizeof(ring_slot) + max_depth * sizeof(std::uint64_t);
  }

  // `memory` must hold capacity * stride_for(max_depth) bytes, 8-byte aligned; capacity a power of two.
  // `zeroed`: the memory is all zero bytes (fresh anonymous pages), the initial state as it is, so no
  // slot is touched here and the kernel provides only the pages that samples reach.
  void init(void* memory, std::size_t capacity, std::size_t max_depth, bool zeroed = false) {
    base_ = static_cast<unsigned char*>(memory);
    capacity_ = capacity;
    mask_ = capacity - 1;
    max_depth_ = max_depth;
    stride_ = stride_for(max_depth);
    // std::atomic<uint64_t> is trivially default-constructible: zeroed memory from the owner holds one.
    if (!zeroed)
      for (std::size_t i = 0; i < capacity; ++i) slot(i)->seq.store(0, std::memory_order_relaxed);
    head_.store(0, std::memory_order_relaxed);
    tail_ = 0;
    mapped_ = zeroed ? 0 : capacity;
  }

  std::size_t capacity() const { return capacity_; }
  // The slots map_ahead() maps past the producers (0: a quarter of the ring, for signal handlers, whose
  // bursts nobody bounds). A source the collector reads writes at most what one read finds.
  void set_map_ahead(std::size_t slots) { ahead_.store(slots, std::memory_order_relaxed); }
  std::size_t max_depth() const { return max_depth_; }

  // Producer: claims a slot or returns nullptr when the ring is full. Fill it, then publish(slot, pos).
  ring_slot* claim(std::uint64_t& pos) {
    std::uint64_t p = head_.load(std::memory_order_relaxed);
    for (;;) {
      ring_slot* s = slot(p & mask_);
      const std::uint64_t seq = sequence(s->seq.load(std::memory_order_acquire), p & mask_);
      auto dif = static_cast<std::int64_t>(seq - p);
      if (dif == 0) {
        if (head_.compare_exchange_weak(p, p + 1, std::memory_order_relaxed)) {
          pos = p;
          return s;
        }
      } else if (dif < 0) {
        return nullptr;  // full: the consumer has not freed this slot yet
      } else {
        p = head_.load(std::memory_order_relaxed);
      }
    }
  }
  static void publish(ring_slot* s, std::uint64_t pos) { s->seq.store(pos + 2, std::memory_order_release); }

  // Consumer: the next published slot, or nullptr. Call release() when done with it.
  ring_slot* peek() {
    ring_slot* s = slot(tail_ & mask_);
    const std::uint64_t seq = sequence(s->seq.load(std::memory_order_acquire), tail_ & mask_);
    return seq == tail_ + 1 ? s : nullptr;
  }
  void release(ring_slot* s) {
    s->seq.store(tail_ + capacity_ + 1, std::memory_order_release);
    ++tail_;
  }
  // Consumer: maps the pages of the slots up to a quarter of the ring (or set_map_ahead's count) past the
  // producers by writing each slot's word (a locked no-op), once in the ring's life. A fresh page whose
  // first access is a read (claim() reads the word) maps the shared zero page, and the producer's write
  // that follows replaces it: a copy-on-write fault that flushes the TLB of every CPU the process runs
  // on, an interrupt in each running application thread, page after page. Written first, a page is
  // mapped once, here.
  void map_ahead() {
    const std::size_t want = ahead_.load(std::memory_order_relaxed);
    const std::uint64_t ahead = head_.load(std::memory_order_relaxed) + (want ? want : capacity_ / 4);
    const std::uint64_t until = ahead < capacity_ ? ahead : capacity_;
    for (; mapped_ < until; ++mapped_) slot(mapped_)->seq.fetch_or(0, std::memory_order_relaxed);
  }

 private:
  // A slot's stored word is its sequence number plus one; 0 is the initial state, sequence = the slot's
  // index (Vyukov's initial value), so zeroed memory is a ready ring.
  static std::uint64_t sequence(std::uint64_t stored, std::size_t index) {
    return stored == 0 ? index : stored - 1;
  }

  ring_slot* slot(std::size_t i) { return reinterpret_cast<ring_slot*>(base_ + i * stride_); }

  unsigned char* base_ = nullptr;
  std::size_t capacity_ = 0, mask_ = 0, max_depth_ = 0, stride_ = 0;
  alignas(64) std::atomic<std::uint64_t> head_{0};
  alignas(64) std::uint64_t tail_ = 0;
  std::uint64_t mapped_ = 0;  // slots below it have been written (consumer only)
  std::atomic<std::size_t> ahead_{0};
};

}  // namespace detail
}  // namespace selfprof
