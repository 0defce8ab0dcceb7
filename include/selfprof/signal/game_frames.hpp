// Game/engine frame slots: a preallocated table of per-thread frame counters that frame_mark() writes,
// the signal handler reads to tag each sample with its frame, and the collector drains closed frames from.
// Context: signal handler (game_frame_tag_for: lock-free, no TLS, no allocation); frame_mark runs in the
// marking application thread; the collector thread reads closed frames.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>

namespace selfprof {
namespace detail {

// Threads that can mark frames at the same time. A thread that exits gives its slot back once the
// collector has read its last frames; a marker beyond this many live threads is ignored (and counted).
constexpr std::size_t kGameFrameSlots = 64;
// Closed frames a slot holds until the collector reads them (every 20 ms): 256 covers 12.8 kHz loops.
constexpr std::size_t kClosedGameFrameRing = 256;
// A tag is (slot index + 1) << 48 | frame sequence number; 0 means "not on a marked thread".
constexpr unsigned kGameFrameTagShift = 48;
constexpr std::uint64_t kGameFrameSeqMask = (std::uint64_t(1) << kGameFrameTagShift) - 1;
// The tag of a sample that carries its time instead (taken without code of selfprof's running on the
// thread: the ring source); the collector looks its frame up by time. Its slot part is out of range.
constexpr std::uint64_t kGameFrameTagByTime = ~std::uint64_t(0);

enum game_frame_slot_state : std::uint32_t {
  game_frame_free = 0,
  game_frame_claiming = 1,  // a thread is filling it in
  game_frame_live = 2,      // its thread marks frames
  game_frame_retired = 3,   // its thread exited; the collector frees it after reading the last frames
};

struct closed_game_frame {
  std::uint64_t seq;       // frame number on this thread (1 = the first frame that ended)
  std::uint64_t start_ns;  // CLOCK_MONOTONIC
  std::uint64_t end_ns;
};

// One marking thread. Single producer (the marking thread) for the closed-frame ring and the counters;
// the handler reads `tid` and `seq`; the collector consumes the ring.
struct alignas(64) game_frame_slot {
  std::atomic<std::uint32_t> state{game_frame_free};
  std::atomic<std::uint32_t> tid{0};
  std::atomic<std::uint32_t> generation{0};  // bumped on each claim: the collector notices reuse
  std::atomic<const char*> name{nullptr};    // loop name (a string literal or otherwise static text)
  std::atomic<std::uint64_t> seq{0};         // number of the frame running now (1 from the claim on)
  std::atomic<std::uint64_t> start_ns{0};    // when it started (0: before the first mark)
  std::atomic<std::uint64_t> head{0};        // closed frames written (producer)
  std::atomic<std::uint64_t> tail{0};        // closed frames read (collector)
  std::atomic<std::uint64_t> lost{0};        // closed frames the ring had no room for
  closed_game_frame ring[kClosedGameFrameRing]{};
};

// Constant-initialized, like the handler's globals: valid in any thread at any time. All zero, so it
// lives in .bss and costs a process nothing until a thread marks frames (it is 400 KB: a dynamic
// initializer touched every slot's page at load).
struct game_frame_table {
  std::atomic<std::uint32_t> high_water{0};  // slots [0, high_water) have been used at least once
  std::atomic<std::uint64_t> no_slot{0};     // marks ignored because every slot was taken
  game_frame_slot slots[kGameFrameSlots];
};

inline game_frame_table g_game_frames;

// The tag of the frame `tid` is running now, or 0. Async-signal-safe: a bounded scan of atomics.
inline std::uint64_t game_frame_tag_for(std::uint32_t tid) {
  game_frame_table& t = g_game_frames;
  std::uint32_t n = t.high_water.load(std::memory_order_acquire);
  if (n > kGameFrameSlots) n = kGameFrameSlots;
  for (std::uint32_t i = 0; i < n; ++i) {
    game_frame_slot& s = t.slots[i];
    if (s.tid.load(std::memory_order_relaxed) != tid) continue;
    if (s.state.load(std::memory_order_acquire) != game_frame_live) continue;
    // The handler runs on the marking thread itself (per-thread ticks), so program order suffices.
    return (std::uint64_t(i + 1) << kGameFrameTagShift) |
           (s.seq.load(std::memory_order_relaxed) & kGameFrameSeqMask);
  }
  return 0;
}

inline std::size_t game_frame_tag_slot(std::uint64_t tag) {
  return static_cast<std::size_t>(tag >> kGameFrameTagShift) - 1;
}
inline std::uint64_t game_frame_tag_seq(std::uint64_t tag) { return tag & kGameFrameSeqMask; }

// Claims a free slot for `tid`, or returns nullptr when all are taken. Called once per marking thread.
inline game_frame_slot* claim_game_frame_slot(std::uint32_t tid, const char* name) {
  game_frame_table& t = g_game_frames;
  for (std::size_t i = 0; i < kGameFrameSlots; ++i) {
    game_frame_slot& s = t.slots[i];
    std::uint32_t expected = game_frame_free;
    if (!s.state.compare_exchange_strong(expected, game_frame_claiming, std::memory_order_acq_rel)) continue;
    s.tid.store(tid, std::memory_order_relaxed);
    s.name.store(name, std::memory_order_relaxed);
    s.seq.store(1, std::memory_order_relaxed);
    s.start_ns.store(0, std::memory_order_relaxed);
    s.lost.store(0, std::memory_order_relaxed);
    s.head.store(0, std::memory_order_relaxed);
    s.tail.store(0, std::memory_order_relaxed);
    s.generation.fetch_add(1, std::memory_order_relaxed);
    s.state.store(game_frame_live, std::memory_order_release);
    std::uint32_t hw = t.high_water.load(std::memory_order_relaxed);
    while (hw < i + 1 && !t.high_water.compare_exchange_weak(hw, static_cast<std::uint32_t>(i + 1),
                                                             std::memory_order_acq_rel)) {
    }
    return &s;
  }
  t.no_slot.fetch_add(1, std::memory_order_relaxed);
  return nullptr;
}

// Ends the running frame at `now_ns` and starts the next. Marking thread only; no system call.
inline void close_game_frame(game_frame_slot& s, std::uint64_t now_ns) {
  const std::uint64_t start = s.start_ns.load(std::memory_order_relaxed);
  const std::uint64_t seq = s.seq.load(std::memory_order_relaxed);
  if (start != 0) {
    const std::uint64_t h = s.head.load(std::memory_order_relaxed);
    if (h - s.tail.load(std::memory_order_acquire) < kClosedGameFrameRing) {
      s.ring[h % kClosedGameFrameRing] = closed_game_frame{seq, start, now_ns};
      s.head.store(h + 1, std::memory_order_release);
    } else {
      s.lost.fetch_add(1, std::memory_order_relaxed);
    }
    s.seq.store(seq + 1, std::memory_order_relaxed);
  }
  // The first mark only starts frame 1: the time before it is not a frame.
  s.start_ns.store(now_ns, std::memory_order_relaxed);
}

// The marking thread exits: samples stop being tagged; the collector frees the slot after draining it.
inline void retire_game_frame_slot(game_frame_slot& s) {
  s.state.store(game_frame_retired, std::memory_order_release);
}

}  // namespace detail
}  // namespace selfprof
