// Deterministic synthetic profiles and the golden-file helper shared by the output_*_test.cpp files.
// Context: tests only.
#pragma once

#include <doctest/doctest.h>

#include <cstdint>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>

#include "selfprof/profile.hpp"

namespace output_fixtures {

// SELFPROF_GOLDEN_DIR from the build system, else tests/golden next to this file (works when __FILE__ is
// absolute, or relative to the working dir). No macro is defined here: it would leak into later files
// of a unity build.
inline std::string golden_dir() {
#ifdef SELFPROF_GOLDEN_DIR
  const std::string dir = SELFPROF_GOLDEN_DIR;
  if (!dir.empty()) return dir;
#endif
  std::string file = __FILE__;
  const auto slash = file.find_last_of('/');
  const std::string unit = slash == std::string::npos ? "." : file.substr(0, slash);
  return unit + "/../golden";
}

inline bool read_file(const std::string& path, std::string& out) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return false;
  std::ostringstream s;
  s << in.rdbuf();
  out = s.str();
  return true;
}

// True when the environment variable `name` is "1".
inline bool env_is_one(const char* name) {
  const char* value = std::getenv(name);
  return value != nullptr && std::string(value) == "1";
}

// Compares `actual` with tests/golden/<name>; with SELFPROF_UPDATE_GOLDEN=1 (or its older alias
// SELFPROF_BLESS=1) in the environment it rewrites the file instead (then inspect `git diff tests/golden`
// before committing). The one golden-file helper of the unit tests.
inline void check_golden(const std::string& name, const std::string& actual) {
  const std::string path = golden_dir() + "/" + name;
  if (env_is_one("SELFPROF_UPDATE_GOLDEN") || env_is_one("SELFPROF_BLESS")) {
    std::ofstream(path, std::ios::binary) << actual;
    MESSAGE("golden file rewritten: " << path);
    return;
  }
  std::string expected;
  REQUIRE_MESSAGE(read_file(path, expected),
                  "missing golden file " << path << " (run with SELFPROF_UPDATE_GOLDEN=1 to create it)");
  if (expected != actual) {
    std::ofstream(path + ".actual", std::ios::binary) << actual;
    FAIL_CHECK("golden mismatch: " << path << " (actual bytes in " << path
                                   << ".actual; SELFPROF_UPDATE_GOLDEN=1 rewrites)");
  }
}

inline std::uint32_t add_frame(selfprof::profile& p, const std::string& name, const std::string& module,
                               std::uint64_t address,
                               selfprof::frame_kind kind = selfprof::frame_kind::native,
                               const std::string& file = "", std::uint32_t line = 0) {
  selfprof::frame f;
  f.name = name;
  f.module = module;
  f.address = address;
  f.module_offset = module.empty() ? 0 : address - 0x400000;
  f.kind = kind;
  f.file = file;
  f.line = line;
  p.frames.push_back(f);
  return static_cast<std::uint32_t>(p.frames.size() - 1);
}

inline void add_stack(selfprof::profile& p, std::vector<std::uint32_t> frames, std::uint64_t count,
                      std::uint32_t tid = 0, bool truncated = false) {
  selfprof::stack s;
  s.frames = std::move(frames);
  s.count = count;
  s.tid = tid;
  s.truncated = truncated;
  p.stacks.push_back(s);
}

// A small profile with every feature the writers handle: duplicate names at different addresses,
// kernel/jit/inlined frames, hostile names, zero counts, truncated stacks, two threads.
inline selfprof::profile basic_profile() {
  using selfprof::frame_kind;
  selfprof::profile p;
  const std::string app = "/usr/bin/app", libc = "/usr/lib/x86_64-linux-gnu/libc.so.6";
  const auto start = add_frame(p, "_start", app, 0x401000);
  const auto main_ = add_frame(p, "main", app, 0x401100, frame_kind::native, "app.cpp", 10);
  const auto run = add_frame(p, "run(int)", app, 0x401200, frame_kind::native, "app.cpp", 20);
  const auto hot1 = add_frame(p, "hot_loop<int>()", app, 0x401300, frame_kind::native, "hot.hpp", 5);
  const auto hot2 = add_frame(p, "hot_loop<int>()", app, 0x401310, frame_kind::native, "hot.hpp", 6);
  const auto inl =
      add_frame(p, "std::vector<int>::size() const", app, 0x401310, frame_kind::inlined, "stl_vector.h", 919);
  const auto memcpy_ = add_frame(p, "__memcpy_avx_unaligned", libc, 0x7f0000001000);
  const auto sys =
      add_frame(p, "entry_SYSCALL_64", "[kernel.kallsyms]", 0xffffffff81000000, frame_kind::kernel);
  const auto jit = add_frame(p, "Interp::loop", "", 0x7e0000000000, frame_kind::jit);
  const auto odd = add_frame(p, "a;b<c&d>\"q\" 'x'", app, 0x401400);
  const auto uni = add_frame(p, "na\xC3\xAFve_\xE5\x87\xBD\xE6\x95\xB0", app, 0x401500);
  const auto crlf = add_frame(p, "line\r\nbreak\tand\x01", app, 0x401600);
  const auto digits = add_frame(p, "retry 2", app, 0x401700);
  const auto badutf = add_frame(p, "bad\xFF\xC3(", app, 0x401800);
  const auto empty = add_frame(p, "", app, 0x401900);
  const auto unk = add_frame(p, "[app+0x1a00]", app, 0x401a00);
  p.threads = {{100, "main"}, {101, "worker;1"}};
  add_stack(p, {start, main_, run, hot1}, 50, 100);
  add_stack(p, {start, main_, run, hot2}, 25, 100);  // same names as above: merged when folded
  add_stack(p, {start, main_, run, hot2, inl}, 7, 100);
  add_stack(p, {start, main_, run, memcpy_, sys}, 4, 101);
  add_stack(p, {start, main_, jit}, 3, 101);
  add_stack(p, {start, main_, odd}, 2, 101);
  add_stack(p, {start, main_, uni}, 2, 100);
  add_stack(p, {start, main_, crlf}, 1, 100);
  add_stack(p, {start, main_, digits}, 1, 0);
  add_stack(p, {start, main_, badutf, empty}, 1, 0);
  add_stack(p, {run, hot1}, 6, 101, true);                    // unwinder hit the depth limit
  add_stack(p, {start, main_, unk}, 0, 100);                  // zero: never written
  add_stack(p, {start, main_, run, run, run, hot1}, 3, 100);  // recursion
  p.info.mode = selfprof::profile_mode::cpu;
  p.info.unit = "samples";
  p.info.source = "timer";
  p.info.hz = 99;
  p.info.duration_s = 2.5;
  p.info.period_ns = 10101010;
  p.info.samples = 105;
  p.info.dropped = 3;
  p.info.truncated = 6;
  p.info.start_unix_ns = 1700000000000000000ull;
  p.info.notes = {"perf_event refused: perf_event_paranoid=3"};
  return p;
}

// Thousands of distinct stacks built from a fixed pseudo-random sequence.
inline selfprof::profile many_profile(std::size_t stacks = 5000) {
  selfprof::profile p;
  std::uint64_t state = 88172645463325252ull;
  auto next = [&state] {
    state ^= state << 13;
    state ^= state >> 7;
    state ^= state << 17;
    return state;
  };
  for (int i = 0; i < 300; ++i)
    add_frame(p, "fn_" + std::to_string(i) + (i % 7 == 0 ? "<T&>" : ""), "/usr/bin/many", 0x410000 + 16u * i);
  for (std::size_t i = 0; i < stacks; ++i) {
    std::vector<std::uint32_t> frames{0};
    const std::size_t depth = 1 + next() % 30;
    for (std::size_t d = 0; d < depth; ++d) frames.push_back(static_cast<std::uint32_t>(1 + next() % 299));
    add_stack(p, frames, 1 + next() % 1000, static_cast<std::uint32_t>(1 + i % 4));
  }
  p.info.hz = 999;
  p.info.period_ns = 1001001;
  return p;
}

}  // namespace output_fixtures
