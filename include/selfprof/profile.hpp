// The profile value: symbolized stacks with counts, thread names and sampling metadata.
// Context: any thread (built by the collector or the CLI; read by the writers).
#pragma once

#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "selfprof/modes.hpp"

namespace selfprof {

// What kind of code a frame is in; writers map it to the folded annotations of
// flamegraph.pl (`_[k]`, `_[j]`, `_[i]`) and to palettes.
enum class frame_kind : std::uint8_t {
  native,   // ordinary machine code of a mapped module
  kernel,   // kernel code (`_[k]`)
  jit,      // code named by a perf map or selfprof::jit (`_[j]`)
  inlined,  // an inlined call expanded by the symbolizer (`_[i]`)
  marker,   // synthetic frame made by selfprof itself: thread roots, [truncated], [blocked: ...]
};

struct frame {
  std::string name;                 // demangled function name, or "[module+0xoffset]" when nothing names it
  std::string module;               // path of the module (empty for markers)
  std::uint64_t address = 0;        // absolute address looked up (pc, or pc-1 for return addresses)
  std::uint64_t module_offset = 0;  // address relative to the module's load bias
  std::string file;                 // source file when known (libdw), else empty
  std::uint32_t line = 0;           // source line when known, else 0
  frame_kind kind = frame_kind::native;
};

struct stack {
  std::vector<std::uint32_t> frames;  // indices into profile::frames; root first, leaf last
  std::uint64_t count = 0;            // samples (or the profile's unit, see profile_info::unit)
  std::uint32_t tid = 0;              // thread the samples came from (0 when merged/unknown)
  bool truncated = false;             // root-side frames are missing (depth limit, or a stack copy ended)
  bool offcpu = false;                // wall mode: time the thread spent off the CPU (leaf: [blocked: call])
};

struct thread_info {
  std::uint32_t tid = 0;
  std::string name;
};

// Frame statistics of one game/engine loop on one thread (selfprof::frame_mark), from the marks' own
// CLOCK_MONOTONIC times: exact counts; percentiles from a log histogram (within 1%); max exact.
struct frame_loop_stats {
  std::string name;               // loop name given to frame_mark
  std::uint32_t tid = 0;          // marking thread
  std::uint64_t count = 0;        // frames that ended while profiling
  std::uint64_t over_budget = 0;  // of those, longer than budget_ms
  std::uint64_t lost = 0;         // frames the collector could not read in time (not in count)
  double budget_ms = 0;
  double p50_ms = 0, p95_ms = 0, p99_ms = 0, max_ms = 0;
};

// One line for headers and footers: "render (tid 12): 600 frames, p50 16.2 ms, ... 9 over 16.7 ms".
inline std::string frame_stats_line(const frame_loop_stats& s) {
  char buf[256];
  std::snprintf(
      buf, sizeof buf,
      "%s (tid %u): %llu frames, p50 %.2f ms, p95 %.2f ms, p99 %.2f ms, max %.2f ms, %llu over %.1f ms",
      s.name.c_str(), static_cast<unsigned>(s.tid), static_cast<unsigned long long>(s.count), s.p50_ms,
      s.p95_ms, s.p99_ms, s.max_ms, static_cast<unsigned long long>(s.over_budget), s.budget_ms);
  std::string line = buf;
  if (s.lost) line += " (" + std::to_string(s.lost) + " lost)";
  return line;
}

struct profile_info {
  profile_mode mode = profile_mode::cpu;  // cpu, wall, or offcpu (the off-CPU part of a wall profile)
  std::string unit = "samples";           // what stack::count counts
  std::string source;                     // tick source that produced the samples (perf, timer, itimer, file)
  double hz = 0;                          // requested sampling rate
  double duration_s = 0;                  // wall time covered by the profile
  std::uint64_t period_ns = 0;            // CPU time one sample stands for
  std::uint64_t samples = 0;              // samples counted in the stacks (sum of weights)
  std::uint64_t dropped = 0;              // samples lost (ring full, unwinder refused, ...)
  std::uint64_t truncated = 0;            // samples whose stack hit the depth limit
  std::uint64_t start_unix_ns = 0;        // when the profile started
  bool kernel_time = true;                // samples include time spent in the kernel (false: user-only ticks)
  std::vector<std::string> notes;         // human-readable remarks (why a source was refused, ...)
  std::string view;  // what the stacks hold: "" all samples, "slow frames", "frame ..." one frame
  std::vector<frame_loop_stats> frame_loops;  // game/engine loops marked with frame_mark (empty: none)
};

struct profile {
  std::vector<frame> frames;
  std::vector<stack> stacks;
  std::vector<thread_info> threads;
  profile_info info;

  // Name of a thread, or an empty string when unknown.
  const std::string& thread_name(std::uint32_t tid) const {
    static const std::string empty;
    for (const auto& t : threads)
      if (t.tid == tid) return t.name;
    return empty;
  }
};

}  // namespace selfprof
