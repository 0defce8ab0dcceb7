// Counters and choices of the running (or last) profiling session, as selfprof::get_stats() returns them.
// Context: any thread (a value type).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <unordered_map>
#include <vector>

#include "selfprof/options.hpp"

namespace selfprof {

// What the wall-clock sampler did (wall mode).
struct wall_stats {
  std::uint64_t ticks = 0;       // sampler wake-ups
  std::uint64_t looks = 0;       // thread looks (a bounded number per tick)
  std::uint64_t unchanged = 0;   // looks that found the CPU clock unmoved and reused the stack
  std::uint64_t proc_reads = 0;  // /proc/self/task/<tid>/syscall reads
  std::uint64_t copies = 0;      // blocked stacks copied and unwound
  std::uint64_t raced = 0;       // copies dropped because the thread ran while they were taken
  std::uint64_t scanned = 0;     // unwinds that had to find a frame record by scanning
  std::uint64_t deferred = 0;    // thread looks left to a later tick by the per-tick bound
  std::uint64_t dropped = 0;     // records lost: the ring was full
  std::uint64_t offcpu_us = 0;   // off-CPU time recorded
  std::uint64_t cpu_ns = 0;      // CPU time of the sampler thread itself
};

// What the profile endpoint and the control socket did (serve/server.hpp).
struct http_stats {
  std::string address;  // the endpoint as bound ("" none), e.g. "127.0.0.1:6060"
  std::string control;  // the control socket ("" none), e.g. "@selfprof-1234"
  std::uint64_t connections = 0, requests = 0;
  std::uint64_t bad_requests = 0;  // refused by the parser (400, 405, 414, 431, 505) or unknown pages
  std::uint64_t unauthorized = 0;  // 401 (token) and 403 (peer uid)
  std::uint64_t refused = 0;       // over the connection limit (503)
  std::uint64_t timeouts = 0;      // clients dropped for being too slow
  std::uint64_t failures = 0;      // accept, write or render failures, clients gone early
};

struct stats {
  bool running = false;
  profile_mode mode = profile_mode::cpu;
  source_kind source = source_kind::none;  // the tick source in use (none: not started, or wall mode without)
  std::string source_detail;               // what was opened
  std::string source_reason;               // why it was chosen
  std::vector<std::string> refused;        // why earlier sources were not
  std::vector<std::string> notes;          // other remarks (signals left alone, ...)
  double hz = 0, effective_hz = 0;
  int sample_signal = 0;
  bool kernel_time = true;               // samples include time spent in the kernel
  unwind_mode unwind = unwind_mode::fp;  // dwarf (CFI rows, frame pointers where none) or fp
  // What start() cost the thread that called it (CPU and wall time; threads it started not counted).
  double start_cpu_ms = 0, start_wall_ms = 0;
  // The CFI rows (unwind dwarf): modules parsed, modules whose code no sample reached yet (not parsed),
  // rows published, and the wall time spent parsing them.
  std::size_t unwind_modules_parsed = 0, unwind_modules_pending = 0, unwind_rows = 0;
  double unwind_parse_ms = 0;
  // CPU time since start() (until stop()): the whole process's, and selfprof's own threads' (collector,
  // dumper, server, wall sampler, JIT flusher; never sampled). In cpu mode, samples / ((process_cpu_ns -
  // own_cpu_ns) * hz / 1e9) is the share of the requested samples that were taken.
  std::uint64_t process_cpu_ns = 0, own_cpu_ns = 0;
  std::uint64_t samples = 0;  // sample weight folded into the table
  std::uint64_t records = 0;  // records written by the handler, or read from the kernel's rings
  std::uint64_t dropped_full = 0, dropped_inactive = 0, foreign_signals = 0, truncated = 0;
  std::size_t unique_stacks = 0, table_bytes = 0;  // table_bytes: the stack table and window buckets
  // The memory ceiling (options::max_memory, SELFPROF_MAX_MEMORY) and what staying under it took.
  std::size_t max_memory = 0;
  std::size_t ring_slots = 0, ring_bytes = 0;  // the sample ring as allocated (clipped to its part)
  bool ring_clipped = false;                   // fewer slots than the rate and depth asked for
  std::uint64_t stacks_merged = 0;   // records of new stacks counted under [selfprof: memory ceiling]
  std::uint64_t samples_merged = 0;  // their weight (samples; microseconds in wall mode)
  std::uint64_t threads_merged = 0;  // ended threads whose stacks and totals were merged into one (tid 0)
  std::size_t threads_seen = 0, threads_armed = 0, threads_fallback = 0, threads_arm_failed = 0;
  std::size_t threads_blocking_signal = 0;  // live threads blocking the sampling signal (never sampled)
  std::uint64_t collector_wakes = 0;        // times the collector thread woke
  std::uint64_t kernel_lost = 0;  // ring source: samples lost (PERF_RECORD_LOST; a record that did not parse)
  std::uint64_t kernel_throttles = 0;  // ring source: PERF_RECORD_THROTTLE records
  // ring source: the kernel's user call chain is asked for (from the start, or since stacks outgrew the
  // stack copy: ring_chain_cut samples ended there before it was); given back: it was asked for, then
  // continued few of those stacks and was given up
  bool ring_user_chain = false, ring_chain_given_back = false;
  std::uint64_t ring_chain_cut = 0;
  // ring source: data pages of a CPU ring now (they start at an eighth and grow once the program takes
  // samples, at least 100 ms after start), and samples taken twice while they grew (by the old and the
  // new events; each kept once)
  std::uint64_t ring_pages = 0, ring_grow_overlap = 0;
  std::uint64_t thread_checks = 0;    // thread-count checks made by the handler
  std::uint64_t thread_wakes = 0;     // ... that saw the count change and woke the collector
  std::uint64_t rate_capped = 0;      // perf ticks taken at a period stretched to the handler's cost
  std::uint64_t periods_skipped = 0;  // requested periods left unsampled by that stretch
  int dump_signal = 0;                // signal that triggers a dump (0: none taken)
  unsigned long dumps_written = 0, dumps_failed = 0;  // signal and interval dumps
  std::unordered_map<std::uint32_t, std::uint64_t> samples_by_thread;
  wall_stats wall;  // wall mode: what the wall sampler did
  http_stats http;  // the profile endpoint and the control socket
};

}  // namespace selfprof
