// Game and engine frames: SELFPROF_FRAME() and selfprof::frame_mark(name) mark the end of one frame of a
// loop on the calling thread, so samples can be told apart by frame and slow frames profiled on their own.
// Context: any thread (the thread that runs the loop); costs no system call.
#pragma once

#include <cstdint>

#include "selfprof/signal/clock.hpp"
#include "selfprof/signal/game_frames.hpp"
#include "selfprof/signal/raw_syscall.hpp"

namespace selfprof {
namespace detail {

// The calling thread's slot, cached in a thread_local of the *application* thread (the signal handler
// never touches it). The destructor gives the slot back when the thread exits.
struct game_frame_marker {
  game_frame_slot* slot = nullptr;
  bool refused = false;  // every slot was taken when this thread first marked: stay silent, stay cheap
  ~game_frame_marker() {
    if (slot) retire_game_frame_slot(*slot);
  }
};

inline game_frame_marker& this_thread_game_frames() {
  static thread_local game_frame_marker tls;
  return tls;
}

}  // namespace detail

// Marks the end of a frame of the loop `name` on this thread (and the start of the next one). The first
// call on a thread only starts frame 1. `name` must stay valid for the life of the program (a string
// literal); one loop per thread: a thread keeps the name of its first mark. Safe to call every frame,
// forever, whether the profiler runs or not: a few clock reads and stores, no system call, no allocation
// after the first call.
inline void frame_mark(const char* name = "frame") {
  detail::game_frame_marker& m = detail::this_thread_game_frames();
  if (m.slot == nullptr) {
    if (m.refused) return;
    m.slot = detail::claim_game_frame_slot(detail::raw_gettid(), name ? name : "frame");
    if (m.slot == nullptr) {
      m.refused = true;
      return;
    }
  }
  detail::close_game_frame(*m.slot, detail::monotonic_ns());
}

}  // namespace selfprof

// End of one game/engine frame on this thread (loop name "frame").
#define SELFPROF_FRAME() ::selfprof::frame_mark("frame")
