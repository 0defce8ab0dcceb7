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

// Which DWARF a dump reads for file:line and inline frames (with libdw). `automatic`: DWARF stored as
// is; DWARF whose sections are compressed (as Debian's -dbg and -dbgsym packages ship libraries' debug
// files) is skipped, because libdw inflates every section whole before the first lookup, about 100 ms
// for libc's whatever was sampled; those modules are named from their symbols. `all` reads it too;
// `none` reads no DWARF.
enum class lines_mode { automatic, all, none };

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

inline const char* lines_name(lines_mode l) {
  switch (l) {
    case lines_mode::automatic:
      return "auto";
    case lines_mode::all:
      return "all";
    case lines_mode::none:
      return "none";
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
