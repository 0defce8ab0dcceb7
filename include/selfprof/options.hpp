// Profiler options and their SELFPROF_* environment variables (parsed, validated, reported by name).
// Context: setup only.
#pragma once

#include <signal.h>

#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "selfprof/modes.hpp"

namespace selfprof {

struct options {
  double hz = 99;                               // SELFPROF_HZ: samples per CPU-second per thread
  source_kind source = source_kind::automatic;  // SELFPROF_SOURCE: auto|ring|perf|timer|itimer
  std::string out;                              // SELFPROF_OUT: dump path template(s), comma-separated
  int dump_signal = SIGUSR2;              // SELFPROF_SIGNAL: USR2 (default), USR1, a number, or none (0)
  profile_mode mode = profile_mode::cpu;  // SELFPROF_MODE: cpu|wall
  double interval_s = 0;                  // SELFPROF_INTERVAL: seconds between periodic dumps (0: off)
  double window_s = 0;                    // SELFPROF_WINDOW: dumps hold only the last N seconds (0: all)
  bool allow_shared_dir = false;          // SELFPROF_ALLOW_SHARED_DIR: write into others-writable dirs
  unsigned max_depth = 128;               // SELFPROF_MAX_DEPTH: frames kept per sample (2..1024)
  int sample_signal = 0;                  // SELFPROF_SAMPLE_SIGNAL: 0 picks SIGPROF or a free RT signal
  unwind_mode unwind = unwind_mode::automatic;  // SELFPROF_UNWIND: fp|dwarf|auto
  lines_mode lines = lines_mode::automatic;     // SELFPROF_LINES: auto|all|none (modes.hpp)
  bool thread_roots = false;                    // SELFPROF_THREAD_ROOTS: per-thread root frames in output
  bool verbose = false;                         // SELFPROF_VERBOSE: echo the configuration once on start
  std::size_t ring_slots = 0;                   // sample ring capacity (0: sized from hz)
  double frame_budget_ms = 16.7;  // SELFPROF_FRAME_BUDGET_MS: a game frame longer than this is slow
  double frame_hz = 0;            // SELFPROF_FRAME_HZ: rate on threads that mark game frames (0: hz)
  // SELFPROF_MAX_MEMORY (bytes, K/M/G suffixes): the ceiling on what sampling collects. The sample ring
  // gets at most a quarter (it is clipped to fewer slots: samples the collector cannot take in time are
  // dropped and counted); of the rest, the stack table gets 40% (a dump briefly holds a copy of the same
  // size) and the rest is for per-thread totals and names. With SELFPROF_WINDOW the table's part is
  // shared with the window buckets. Past its part, a new distinct stack is counted under one
  // "[selfprof: memory ceiling]" stack, and when many threads were seen the stacks of ended threads are
  // merged into one thread; both are counted in the stats and said in the profile notes. The default,
  // 64 MiB, keeps the default ring (0.5 MB at 99 Hz) whole and lets the table hold about 100,000
  // distinct stacks, more than long runs of large programs show, while a runaway (a thread per request,
  // an absurd rate or depth) stays small next to the program. Values under 1 MiB are raised to 1 MiB.
  std::size_t max_memory = std::size_t{64} << 20;
  // The profile endpoint (core/endpoint.hpp, serve/server.hpp): off unless an address is given.
  std::string http;                 // SELFPROF_HTTP: 127.0.0.1:PORT, [::1]:PORT, unix:/path ("" off)
  std::string http_token_file;      // SELFPROF_HTTP_TOKEN_FILE: bearer token (0600 file); needed off loopback
  double http_max_seconds = 300;    // SELFPROF_HTTP_MAX_SECONDS: the longest ?seconds= served
  double http_head_timeout_s = 10;  // a client must send its request head within this (slowloris)
  // SELFPROF_CONTROL: the control socket "@selfprof-<pid>" that `selfprof dump PID` asks (same uid or root).
  bool control = true;
};

// The smallest ceiling: room for the smallest ring at the deepest stacks and a useful table.
constexpr std::size_t kMinMaxMemory = std::size_t{1} << 20;

namespace detail {

inline bool parse_double(const char* text, double lo, double hi, double& out) {
  if (text == nullptr || *text == '\0') return false;
  errno = 0;
  char* end = nullptr;
  double v = std::strtod(text, &end);
  if (errno != 0 || end == text || *end != '\0' || !(v >= lo && v <= hi)) return false;
  out = v;
  return true;
}

// A byte count: digits with an optional K, M or G (powers of 1024; "KiB", "MB" and lowercase work too).
inline bool parse_bytes(const char* text, std::uint64_t lo, std::uint64_t hi, std::uint64_t& out) {
  if (text == nullptr || *text < '0' || *text > '9') return false;
  errno = 0;
  char* end = nullptr;
  const unsigned long long v = std::strtoull(text, &end, 10);
  if (errno != 0 || end == text) return false;
  std::string unit = end;
  for (char& c : unit) c = static_cast<char>(c >= 'a' && c <= 'z' ? c - 'a' + 'A' : c);
  unsigned shift = 0;
  if (unit.empty() || unit == "B")
    shift = 0;
  else if (unit == "K" || unit == "KB" || unit == "KIB")
    shift = 10;
  else if (unit == "M" || unit == "MB" || unit == "MIB")
    shift = 20;
  else if (unit == "G" || unit == "GB" || unit == "GIB")
    shift = 30;
  else
    return false;
  if (v > (hi >> shift)) return false;
  const std::uint64_t bytes = static_cast<std::uint64_t>(v) << shift;
  if (bytes < lo || bytes > hi) return false;
  out = bytes;
  return true;
}

inline bool parse_bool(const char* text, bool& out) {
  std::string s = text ? text : "";
  if (s == "1" || s == "true" || s == "yes" || s == "on") return out = true, true;
  if (s == "0" || s == "false" || s == "no" || s == "off") return out = false, true;
  return false;
}

// Signals selfprof never takes for sampling or dumps: the kernel raises the fault signals for the
// program's own faults (a handler of ours would turn a crash into an endless loop), SIGKILL and SIGSTOP
// cannot be caught, and the others mean something to every process (children, job control, abort).
inline bool reserved_signal(int s) {
  switch (s) {
    case SIGSEGV:
    case SIGBUS:
    case SIGFPE:
    case SIGILL:
    case SIGTRAP:
    case SIGSYS:
    case SIGABRT:
    case SIGCHLD:
    case SIGKILL:
    case SIGSTOP:
    case SIGCONT:
    case SIGTSTP:
    case SIGTTIN:
    case SIGTTOU:
    case SIGINT:
    case SIGQUIT:
    case SIGTERM:
    case SIGHUP:
    case SIGPIPE:
      return true;
    default:
      return false;
  }
}

inline bool parse_signal(const char* text, bool allow_none, int& out) {
  std::string s = text ? text : "";
  if (allow_none && (s == "none" || s == "0")) return out = 0, true;
  if (s.rfind("SIG", 0) == 0) s = s.substr(3);
  if (s == "USR1") return out = SIGUSR1, true;
  if (s == "USR2") return out = SIGUSR2, true;
  if (s == "PROF") return out = SIGPROF, true;
  if (s == "VTALRM") return out = SIGVTALRM, true;
  double v = 0;
  if (parse_double(s.c_str(), 1, SIGRTMAX, v) && v == static_cast<int>(v) &&
      !reserved_signal(static_cast<int>(v)))
    return out = static_cast<int>(v), true;
  return false;
}

}  // namespace detail

// Options from the SELFPROF_* environment variables. A value that does not parse is described in
// `warnings` (with the variable's name) and the default is kept.
inline options options_from_env(std::vector<std::string>* warnings = nullptr) {
  options o;
  auto bad = [&](const char* name, const char* value, const char* expected) {
    if (warnings)
      warnings->push_back(std::string("selfprof: ignoring ") + name + "=\"" + value + "\": expected " +
                          expected + "; using the default");
  };
  double d = 0;
  bool b = false;
  int sig = 0;
  if (const char* v = std::getenv("SELFPROF_HZ")) {
    if (detail::parse_double(v, 1, 100000, d))
      o.hz = d;
    else
      bad("SELFPROF_HZ", v, "a rate in Hz from 1 to 100000");
  }
  if (const char* v = std::getenv("SELFPROF_SOURCE")) {
    std::string s = v;
    if (s == "auto")
      o.source = source_kind::automatic;
    else if (s == "perf")
      o.source = source_kind::perf;
    else if (s == "timer")
      o.source = source_kind::timer;
    else if (s == "itimer")
      o.source = source_kind::itimer;
    else if (s == "ring")
      o.source = source_kind::ring;
    else
      bad("SELFPROF_SOURCE", v, "auto, ring, perf, timer or itimer");
  }
  if (const char* v = std::getenv("SELFPROF_OUT")) o.out = v;
  if (const char* v = std::getenv("SELFPROF_SIGNAL")) {
    if (detail::parse_signal(v, true, sig))
      o.dump_signal = sig;
    else
      bad("SELFPROF_SIGNAL", v,
          "USR1, USR2, a signal number (not a fault, job-control or termination signal) or none");
  }
  if (const char* v = std::getenv("SELFPROF_MODE")) {
    std::string s = v;
    if (s == "cpu")
      o.mode = profile_mode::cpu;
    else if (s == "wall")
      o.mode = profile_mode::wall;
    else
      bad("SELFPROF_MODE", v, "cpu or wall");
  }
  if (const char* v = std::getenv("SELFPROF_INTERVAL")) {
    if (detail::parse_double(v, 0, 86400 * 365.0, d))
      o.interval_s = d;
    else
      bad("SELFPROF_INTERVAL", v, "seconds between dumps (0 disables)");
  }
  if (const char* v = std::getenv("SELFPROF_WINDOW")) {
    if (detail::parse_double(v, 0, 86400 * 365.0, d))
      o.window_s = d;
    else
      bad("SELFPROF_WINDOW", v, "seconds of recent samples per dump (0: everything since start)");
  }
  if (const char* v = std::getenv("SELFPROF_ALLOW_SHARED_DIR")) {
    if (detail::parse_bool(v, b))
      o.allow_shared_dir = b;
    else
      bad("SELFPROF_ALLOW_SHARED_DIR", v, "0 or 1");
  }
  if (const char* v = std::getenv("SELFPROF_MAX_DEPTH")) {
    if (detail::parse_double(v, 2, 1024, d) && d == static_cast<unsigned>(d))
      o.max_depth = static_cast<unsigned>(d);
    else
      bad("SELFPROF_MAX_DEPTH", v, "a whole number of frames from 2 to 1024");
  }
  if (const char* v = std::getenv("SELFPROF_SAMPLE_SIGNAL")) {
    if (detail::parse_signal(v, false, sig))
      o.sample_signal = sig;
    else
      bad("SELFPROF_SAMPLE_SIGNAL", v,
          "PROF, a signal number (not a fault, job-control or termination signal)");
  }
  if (const char* v = std::getenv("SELFPROF_UNWIND")) {
    std::string s = v;
    if (s == "fp")
      o.unwind = unwind_mode::fp;
    else if (s == "dwarf")
      o.unwind = unwind_mode::dwarf;
    else if (s == "auto")
      o.unwind = unwind_mode::automatic;
    else
      bad("SELFPROF_UNWIND", v, "fp, dwarf or auto");
  }
  if (const char* v = std::getenv("SELFPROF_LINES")) {
    std::string s = v;
    if (s == "auto")
      o.lines = lines_mode::automatic;
    else if (s == "all")
      o.lines = lines_mode::all;
    else if (s == "none")
      o.lines = lines_mode::none;
    else
      bad("SELFPROF_LINES", v, "auto, all or none");
  }
  if (const char* v = std::getenv("SELFPROF_THREAD_ROOTS")) {
    if (detail::parse_bool(v, b))
      o.thread_roots = b;
    else
      bad("SELFPROF_THREAD_ROOTS", v, "0 or 1");
  }
  if (const char* v = std::getenv("SELFPROF_VERBOSE")) {
    if (detail::parse_bool(v, b))
      o.verbose = b;
    else
      bad("SELFPROF_VERBOSE", v, "0 or 1");
  }
  if (const char* v = std::getenv("SELFPROF_FRAME_BUDGET_MS")) {
    if (detail::parse_double(v, 0.01, 3600000, d))
      o.frame_budget_ms = d;
    else
      bad("SELFPROF_FRAME_BUDGET_MS", v, "a frame budget in milliseconds from 0.01 to 3600000");
  }
  if (const char* v = std::getenv("SELFPROF_FRAME_HZ")) {
    if (detail::parse_double(v, 0, 100000, d))
      o.frame_hz = d;
    else
      bad("SELFPROF_FRAME_HZ", v, "a rate in Hz from 0 (same as SELFPROF_HZ) to 100000");
  }
  if (const char* v = std::getenv("SELFPROF_HTTP")) o.http = v;
  if (const char* v = std::getenv("SELFPROF_HTTP_TOKEN_FILE")) o.http_token_file = v;
  if (const char* v = std::getenv("SELFPROF_HTTP_MAX_SECONDS")) {
    if (detail::parse_double(v, 1, 86400, d))
      o.http_max_seconds = d;
    else
      bad("SELFPROF_HTTP_MAX_SECONDS", v, "seconds from 1 to 86400");
  }
  if (const char* v = std::getenv("SELFPROF_CONTROL")) {
    if (detail::parse_bool(v, b))
      o.control = b;
    else
      bad("SELFPROF_CONTROL", v, "0 or 1");
  }
  if (const char* v = std::getenv("SELFPROF_MAX_MEMORY")) {
    std::uint64_t bytes = 0;
    if (detail::parse_bytes(v, kMinMaxMemory, std::uint64_t{1} << 40, bytes))
      o.max_memory = static_cast<std::size_t>(bytes);
    else
      bad("SELFPROF_MAX_MEMORY", v, "a size in bytes with an optional K, M or G suffix, from 1M to 1024G");
  }
  return o;
}

}  // namespace selfprof
