// The game-loop example: a loop with update, physics and render phases marks each frame with
// SELFPROF_FRAME(); about every 50th frame has a spike in physics::rebuild_broadphase. The all-frames
// flame graph hardly shows it; the slow-frames graph is dominated by it; the worst frames come out as
// flame charts (time left to right within the frame).
//
//   ./example_game_loop [output-directory] [frames]
//
// Try SELFPROF_FRAME_HZ=1000 for more samples per slow frame, SELFPROF_FRAME_BUDGET_MS=12 for another budget.
#include <selfprof.hpp>

#include <time.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>

// Each phase keeps its own frame in the stack: not inlined, not cloned, not turned into a tail jump.
#if defined(__clang__)
#define GAME_PHASE __attribute__((noinline))
#else
#define GAME_PHASE __attribute__((noipa))
#endif
#define GAME_NO_TAIL() __asm__ volatile("" ::: "memory")

namespace game {

inline std::uint64_t now_ns() {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<std::uint64_t>(ts.tv_sec) * 1000000000ull + static_cast<std::uint64_t>(ts.tv_nsec);
}

// Stands for real work: computes for `ms` milliseconds of wall time.
GAME_PHASE double work_for(double ms) {
  const std::uint64_t end = now_ns() + static_cast<std::uint64_t>(ms * 1e6);
  volatile double x = 1;
  while (now_ns() < end)
    for (int i = 0; i < 2000; ++i) x = std::sqrt(x * x + 1.0) - 0.5;
  return x;
}

GAME_PHASE void update_entities() {
  work_for(2.0);
  GAME_NO_TAIL();
}
GAME_PHASE void render_frame() {
  work_for(4.0);
  GAME_NO_TAIL();
}

}  // namespace game

namespace physics {

GAME_PHASE void integrate_bodies() {
  game::work_for(2.5);
  GAME_NO_TAIL();
}
// The spike: rebuilt from scratch when too many bodies moved (here: every 50th frame).
GAME_PHASE void rebuild_broadphase() {
  game::work_for(30.0);
  GAME_NO_TAIL();
}

GAME_PHASE void step(long frame) {
  integrate_bodies();
  if (frame % 50 == 49) rebuild_broadphase();
  GAME_NO_TAIL();
}

}  // namespace physics

int main(int argc, char** argv) {
  const std::string dir = argc > 1 ? argv[1] : ".";
  const long frames = argc > 2 ? std::strtol(argv[2], nullptr, 10) : 600;
  selfprof::options o = selfprof::options_from_env();
  if (!std::getenv("SELFPROF_HZ")) o.hz = 250;
  if (!selfprof::start(o)) {
    std::fprintf(stderr, "selfprof did not start\n");
    return 1;
  }
  for (long f = 0; f < frames; ++f) {
    game::update_entities();
    physics::step(f);
    game::render_frame();
    SELFPROF_FRAME();  // end of this frame, start of the next
  }
  selfprof::stop();

  for (const auto& loop : selfprof::frame_stats())
    std::printf("%s\n", selfprof::frame_stats_line(loop).c_str());
  // dump() writes game.svg/.txt (every frame) and, since frames were marked, game-slow.svg/.txt (only
  // the samples of slow frames), like every automatic dump.
  const std::string all = dir + "/game.svg", slow = dir + "/game-slow.svg", worst = dir + "/game-worst.svg";
  int rc = 0;
  for (auto st : {selfprof::dump(all + "," + dir + "/game.txt"), selfprof::dump_worst_frames(worst, 3)}) {
    if (!st) {
      std::fprintf(stderr, "%s\n", st.message().c_str());
      rc = 1;
    }
  }
  std::printf("wrote %s (all frames), %s (slow frames), %s-frame1..3.svg (worst frames, flame charts)\n",
              all.c_str(), slow.c_str(), (dir + "/game-worst").c_str());
  return rc;
}
