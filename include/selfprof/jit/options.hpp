// Settings of selfprof's JIT support (perf map, jitdump, flushing) and their SELFPROF_* environment
// variables.
// Context: setup only.
#pragma once

#include <cstddef>
#include <cstdlib>
#include <string>
#include <vector>

namespace selfprof {
namespace jit {

struct options {
  bool perf_map = true;               // SELFPROF_PERF_MAP=0|1: write /tmp/perf-<pid>.map for perf
  std::string perf_map_dir = "/tmp";  // where perf looks; tests point it elsewhere
  long pid = 0;                       // pid in the file names; 0: getpid(), and the child's own after fork
  bool jitdump = false;               // SELFPROF_JITDUMP=0|1: also write jit-<pid>.dump for perf inject --jit
  std::string jitdump_dir;            // SELFPROF_JITDUMP_DIR; empty: the current directory
  bool background_flush = true;       // a thread writes pending lines; false: only size/age thresholds on
                                      // add(), flush() and exit
  unsigned flush_delay_ms = 50;       // a registration reaches the files at most about this much later
  std::size_t flush_bytes = 64 * 1024;  // pending bytes that trigger a write at once
};

namespace detail {

inline bool parse_flag(const char* text, bool& out) {
  std::string s = text ? text : "";
  if (s == "1" || s == "true" || s == "yes" || s == "on") return out = true, true;
  if (s == "0" || s == "false" || s == "no" || s == "off") return out = false, true;
  return false;
}

}  // namespace detail

// Defaults overridden by SELFPROF_PERF_MAP, SELFPROF_JITDUMP and SELFPROF_JITDUMP_DIR. A value that does
// not parse is described in `warnings` with the variable's name, and the default is kept.
inline options options_from_env(std::vector<std::string>* warnings = nullptr) {
  options o;
  auto flag = [&](const char* name, bool& field) {
    const char* v = std::getenv(name);
    if (v == nullptr) return;
    if (!detail::parse_flag(v, field) && warnings)
      warnings->push_back(std::string("selfprof: ignoring ") + name + "=\"" + v +
                          "\": expected 0 or 1; using the default");
  };
  flag("SELFPROF_PERF_MAP", o.perf_map);
  flag("SELFPROF_JITDUMP", o.jitdump);
  if (const char* d = std::getenv("SELFPROF_JITDUMP_DIR")) o.jitdump_dir = d;
  return o;
}

}  // namespace jit
}  // namespace selfprof
