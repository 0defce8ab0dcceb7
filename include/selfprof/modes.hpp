// The enums that name what a profile counts, how stacks are walked and which tick source samples, with
// their names as the environment variables and the writers spell them.
// Context: any thread (values only).
#pragma once

namespace selfprof {

// What a profile counts. Profiles made from a wall profile's off-CPU stacks say `offcpu`; options take
// only `cpu` or `wall`.
enum class profile_mode { cpu, wall, offcpu };

// How the signal handler walks stacks: `dwarf` follows .eh_frame rows (frame pointers where a module
// has none), `fp` frame pointers only, `automatic` dwarf when the rows build.
enum class unwind_mode { automatic, fp, dwarf };

// The mechanism that delivers ticks (sources/). `none`: wall mode without on-CPU ticks.
enum class source_kind { automatic, perf, timer, itimer, none, ring };

inline const char* mode_name(profile_mode m) {
  switch (m) {
    case profile_mode::cpu:
      return "cpu";
    case profile_mode::wall:
      return "wall";
    case profile_mode::offcpu:
      return "offcpu";
  }
  return "?";
}

inline const char* unwind_name(unwind_mode u) {
  switch (u) {
    case unwind_mode::automatic:
      return "auto";
    case unwind_mode::fp:
      return "fp";
    case unwind_mode::dwarf:
      return "dwarf";
  }
  return "?";
}

inline const char* source_name(source_kind k) {
  switch (k) {
    case source_kind::automatic:
      return "auto";
    case source_kind::perf:
      return "perf";
    case source_kind::timer:
      return "timer";
    case source_kind::itimer:
      return "itimer";
    case source_kind::none:
      return "none";
    case source_kind::ring:
      return "ring";
  }
  return "?";
}

}  // namespace selfprof
