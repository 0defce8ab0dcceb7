// The public API: start and stop sampling, take a profile, write it to files, read the counters.
// Context: any thread (not the signal handler).
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include "selfprof/config.hpp"
#include "selfprof/frames.hpp"
#include "selfprof/options.hpp"
#include "selfprof/output/diff_options.hpp"
#include "selfprof/profile.hpp"
#include "selfprof/stats.hpp"
#include "selfprof/status.hpp"

namespace selfprof {

// Starts sampling every thread of the process (existing and future ones). Idempotent: a second call
// while running does nothing. Restartable after stop(); each start begins a new profile.
SELFPROF_API status start(const options& opts);

// Starts with defaults overridden by the SELFPROF_* environment variables; a bad value is reported
// once on stderr with the variable's name, and so is a failure to start.
SELFPROF_API status start_from_env();

// Stops sampling; what was collected stays available to snapshot() and dump(), and is written to
// SELFPROF_OUT at exit when that is set. Idempotent.
SELFPROF_API status stop();

SELFPROF_API bool running();

// Arms the calling thread now, without waiting for the next thread scan (a few tens of ms), and
// unblocks the sampling signal in it.
SELFPROF_API status register_thread();

// The profile collected so far, symbolized. Sampling goes on.
SELFPROF_API profile snapshot();

SELFPROF_API stats get_stats();

// Writes the profile collected so far; the format follows the extension (.folded .collapsed .svg
// .txt .pb.gz), several paths may be given separated by commas, and %p %t %n are expanded. A wall
// profile also writes its off-CPU part ("-offcpu" before the extension), and when game frames were
// marked the slow ones ("-slow"), all under one dump number: the same files a dump on the signal, on the
// interval or at exit writes. Atomic (temporary file + rename), mode 0600, never through a symlink.
// Nothing collected is lost when it fails.
SELFPROF_API status dump(const std::string& paths);

// Wall mode (options::mode = profile_mode::wall, SELFPROF_MODE=wall): profiles count microseconds of wall
// time, on and off the CPU; stacks of time off the CPU end in a [blocked: <system call>] frame.

// The off-CPU part of the wall profile collected so far: where threads waited (empty in cpu mode).
SELFPROF_API profile snapshot_offcpu();

// Writes the off-CPU profile like dump() writes the whole one (the SVG in the io palette, counts in us).
SELFPROF_API status dump_offcpu(const std::string& paths);

// Game and engine frames (see frames.hpp for SELFPROF_FRAME / frame_mark).

// Duration statistics of every loop marked with frame_mark, per loop name and thread.
SELFPROF_API std::vector<frame_loop_stats> frame_stats();

// The "slow frames" profile: only samples taken during game frames longer than SELFPROF_FRAME_BUDGET_MS.
// Its unit is samples at SELFPROF_FRAME_HZ when that is set (info.hz says which rate).
SELFPROF_API profile snapshot_slow_frames();

// Writes the slow-frames profile like dump() writes the all-frames one (same formats and templates).
SELFPROF_API status dump_slow_frames(const std::string& paths);

// The `n` longest game frames seen so far (at most 16), longest first; each profile holds one game
// frame's samples in the order they were taken (info.view names the frame and its duration).
SELFPROF_API std::vector<profile> worst_frames(std::size_t n);

// Writes the `n` longest game frames, one file each, as flame charts (x is time within the frame) in the
// format of the extension. `%f` in the template becomes the rank (1 = longest); without it, "-frame<rank>"
// goes before the extension ("frames.svg" -> "frames-frame1.svg", ...). No kept frame: nothing is written.
SELFPROF_API status dump_worst_frames(const std::string& path_template, std::size_t n = 3);

// Writes what changed between two profiles (e.g. two snapshot()s, before and after a change): `.svg` gives
// a differential flame graph (red grew, blue shrank, baseline-only stacks still shown), `.folded` or
// `.diff` difffolded's `stack before after` lines. Atomic, mode 0600, like dump().
SELFPROF_API status dump_diff(const profile& before, const profile& after, const std::string& path,
                              const diff_options& options = {});

}  // namespace selfprof

// Start sampling with SELFPROF_* environment overrides; evaluates to a selfprof::status.
#define SELFPROF_START() ::selfprof::start_from_env()
#define SELFPROF_STOP() ::selfprof::stop()

#if SELFPROF_DETAIL_WITH_IMPLEMENTATION
#include "selfprof/core/api.hpp"
#endif
