// Unit tests of include/selfprof/jit/runtime.hpp and the public selfprof::jit API: batching to the perf
// map, turning it off, refusals, concurrent registration, fork, and the collector/symbolizer hooks.
#include <doctest/doctest.h>

#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include <selfprof/jit.hpp>
#include <selfprof/symbols/perf_map.hpp>

#include "test_support.hpp"

using selfprof::detail::jit_runtime;

namespace {

selfprof::jit::options test_options(const jit_test::temp_dir& dir) {
  selfprof::jit::options o;
  o.perf_map_dir = dir.path;
  o.pid = jit_test::fake_pid();
  o.background_flush = false;
  return o;
}

std::size_t count_lines(const std::string& s) {
  std::size_t n = 0;
  for (char c : s) n += c == '\n';
  return n;
}

const void* fake_code(std::uint64_t addr) {
  return reinterpret_cast<const void*>(static_cast<std::uintptr_t>(addr));
}

}  // namespace

TEST_CASE(
    "jit runtime: add and flush write sanitised perf map lines; re-add at an address wins in perf's "
    "reading") {
  jit_test::temp_dir dir;
  std::string path;
  {
    jit_runtime rt(test_options(dir));
    path = rt.perf_map_path();
    CHECK(path == dir.path + "/perf-" + std::to_string(jit_test::fake_pid()) + ".map");
    CHECK_FALSE(rt.add(nullptr, 16, "null"));
    CHECK_FALSE(rt.add(fake_code(0x1000), 0, "empty"));
    CHECK(rt.add(fake_code(0x10000), 0x40, "jit_first"));
    CHECK(rt.add(fake_code(0x20000), 0x20, "bad\nname"));
    CHECK(rt.add(fake_code(0x30000), 0x10, "f"));
    CHECK(::access(path.c_str(), F_OK) != 0);  // batched: nothing written yet
    REQUIRE(rt.flush());
    CHECK(jit_test::read_file(path) == "10000 40 jit_first\n20000 20 bad_name\n30000 10 jit:f\n");
    CHECK(rt.remove(fake_code(0x10000)));
    CHECK_FALSE(rt.remove(fake_code(0x10000)));
    CHECK(rt.add(fake_code(0x10000), 0x40, "jit_second"));
  }  // the destructor flushes
  std::string text = jit_test::read_file(path);
  CHECK(count_lines(text) == 4);
  selfprof::detail::perf_map reader(path);
  REQUIRE(reader.reload_if_changed());
  selfprof::detail::perf_map::hit hit;
  REQUIRE(reader.lookup(0x10004, hit));
  CHECK(hit.name == "jit_second");
}

TEST_CASE("jit runtime: with the perf map off nothing is written but selfprof still names the code") {
  jit_test::temp_dir dir;
  selfprof::jit::options o = test_options(dir);
  o.perf_map = false;
  jit_runtime rt(o);
  REQUIRE(rt.add(fake_code(0x40000), 0x100, "jit_quiet"));
  CHECK(rt.flush());
  CHECK(::access(rt.perf_map_path().c_str(), F_OK) != 0);
  std::uint64_t pc = 0x40010;
  REQUIRE(rt.registry().translate(pc, selfprof::detail::monotonic_ns()));
  selfprof::frame f;
  REQUIRE(rt.registry().name(pc, f));
  CHECK(f.name == "jit_quiet");
}

TEST_CASE("jit runtime: SELFPROF_PERF_MAP and SELFPROF_JITDUMP are read, bad values reported by name") {
  ::setenv("SELFPROF_PERF_MAP", "0", 1);
  ::setenv("SELFPROF_JITDUMP", "maybe", 1);
  ::setenv("SELFPROF_JITDUMP_DIR", "/somewhere", 1);
  std::vector<std::string> warnings;
  selfprof::jit::options o = selfprof::jit::options_from_env(&warnings);
  ::unsetenv("SELFPROF_PERF_MAP");
  ::unsetenv("SELFPROF_JITDUMP");
  ::unsetenv("SELFPROF_JITDUMP_DIR");
  CHECK_FALSE(o.perf_map);
  CHECK_FALSE(o.jitdump);
  CHECK(o.jitdump_dir == "/somewhere");
  REQUIRE(warnings.size() == 1);
  CHECK(warnings[0].find("SELFPROF_JITDUMP") != std::string::npos);
  CHECK(selfprof::jit::options_from_env().perf_map);  // default on
}

TEST_CASE("jit runtime: a refused perf map is reported on every flush and registration goes on") {
  jit_test::temp_dir dir;
  selfprof::jit::options o = test_options(dir);
  jit_runtime rt(o);
  std::string target = dir.file("target");
  jit_test::write_file(target, "keep\n");
  REQUIRE(::symlink(target.c_str(), rt.perf_map_path().c_str()) == 0);
  REQUIRE(rt.add(fake_code(0x50000), 0x10, "jit_refused"));
  selfprof::status st = rt.flush();
  REQUIRE_FALSE(st);
  CHECK(st.message().find("symbolic link") != std::string::npos);
  REQUIRE(rt.add(fake_code(0x60000), 0x10, "jit_after"));
  CHECK_FALSE(rt.flush());
  CHECK(jit_test::read_file(target) == "keep\n");
  std::uint64_t pc = 0x60001;
  CHECK(rt.registry().translate(pc, selfprof::detail::monotonic_ns()));
}

TEST_CASE("jit runtime: the size threshold writes without flush(); the background thread writes the rest") {
  jit_test::temp_dir dir;
  selfprof::jit::options o = test_options(dir);
  o.flush_bytes = 256;
  o.flush_delay_ms = 1000000;  // never by age in this test
  {
    jit_runtime rt(o);
    for (int i = 0; i < 23; ++i)
      rt.add(fake_code(0x100000 + 0x100 * i), 0x80, "jit_threshold_" + std::to_string(i));
    std::string text = jit_test::read_file(rt.perf_map_path());
    CHECK(count_lines(text) >= 5);  // ~30 bytes a line: several writes of >= 256 bytes
    CHECK(count_lines(text) < 23);  // and the tail still pending
  }
  selfprof::jit::options b = test_options(dir);
  b.pid += 1;
  b.background_flush = true;
  b.flush_delay_ms = 10;
  jit_runtime rt(b);
  rt.add(fake_code(0x200000), 0x80, "jit_background");
  std::string text;
  for (int i = 0; i < 1000 && text.empty(); ++i) {  // up to 10 s: never a timing assertion
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
    text = jit_test::read_file(rt.perf_map_path());
  }
  CHECK(text == "200000 80 jit_background\n");
}

TEST_CASE("jit runtime: jitdump records carry the code bytes registered") {
  jit_test::temp_dir dir;
  selfprof::jit::options o = test_options(dir);
  o.jitdump = true;
  o.jitdump_dir = dir.path;
  static const unsigned char code[] = {0x31, 0xc0, 0xc3};
  jit_runtime rt(o);
  REQUIRE(rt.add(code, sizeof code, "jit_ret0"));
  REQUIRE(rt.flush());
  std::string f = jit_test::read_file(rt.jitdump_path());
  REQUIRE(f.size() == 40 + 16 + 40 + 9 + sizeof code);
  CHECK(f.compare(40 + 56, 9, std::string("jit_ret0\0", 9)) == 0);
  CHECK(f.compare(f.size() - sizeof code, sizeof code, reinterpret_cast<const char*>(code), sizeof code) ==
        0);
}

TEST_CASE("jit runtime: 8 threads register concurrently while a collector translates") {
  jit_test::temp_dir dir;
  selfprof::jit::options o = test_options(dir);
  o.background_flush = true;
  o.flush_delay_ms = 5;
  o.flush_bytes = 4096;
  jit_runtime rt(o);
  constexpr int threads = 8, per_thread = 4000;
  std::atomic<bool> done{false};
  std::atomic<std::uint64_t> translated{0};
  std::thread collector([&] {
    while (!done.load()) {
      for (std::uint64_t a = 0x10000000; a < 0x10000000 + 0x1000000; a += 0x10000) {
        std::uint64_t pc = a + 8;
        if (rt.registry().translate(pc, selfprof::detail::monotonic_ns())) translated.fetch_add(1);
      }
    }
  });
  std::vector<std::thread> workers;
  for (int t = 0; t < threads; ++t)
    workers.emplace_back([&rt, t] {
      for (int i = 0; i < per_thread; ++i) {
        std::uint64_t addr = 0x10000000 + (std::uint64_t(t) * per_thread + std::uint64_t(i)) * 0x40;
        rt.add(fake_code(addr), 0x40, "jit_t" + std::to_string(t) + "_" + std::to_string(i));
        if (i % 3 == 0) rt.remove(fake_code(addr));
      }
    });
  for (auto& w : workers) w.join();
  done.store(true);
  collector.join();
  REQUIRE(rt.flush());
  CHECK(rt.registry().count() == std::uint64_t(threads) * per_thread);
  std::string text = jit_test::read_file(rt.perf_map_path());
  CHECK(count_lines(text) == std::size_t(threads) * per_thread);
  selfprof::detail::perf_map reader(rt.perf_map_path());
  REQUIRE(reader.reload_if_changed());
  CHECK(reader.size() == std::size_t(threads) * per_thread);
  for (int t = 0; t < threads; ++t) {
    int i = per_thread - 2;  // 3998 % 3 != 0: still live
    std::uint64_t addr = 0x10000000 + (std::uint64_t(t) * per_thread + std::uint64_t(i)) * 0x40;
    std::uint64_t pc = addr + 0x3f;
    REQUIRE(rt.registry().translate(pc, selfprof::detail::monotonic_ns()));
    selfprof::frame f;
    REQUIRE(rt.registry().name(pc, f));
    CHECK(f.name == "jit_t" + std::to_string(t) + "_" + std::to_string(i));
    selfprof::detail::perf_map::hit hit;
    REQUIRE(reader.lookup(addr, hit));
    CHECK(hit.name == f.name);
    std::uint64_t gone = addr - 2 * 0x40 + 1;  // i - 2 = 3996 was removed (a multiple of 3)
    CHECK_FALSE(rt.registry().translate(gone, selfprof::detail::monotonic_ns()));
  }
}

// The process-wide runtime behind selfprof::jit::add: configured once, into a directory of its own.
namespace {
jit_test::temp_dir* global_dir_ptr = nullptr;
jit_test::temp_dir& global_dir() {
  if (global_dir_ptr == nullptr) {
    global_dir_ptr = new jit_test::temp_dir();
    // Registered before the runtime's exit-time flush, so it runs after it (atexit is last-in, first-out).
    std::atexit([] { delete global_dir_ptr; });
  }
  return *global_dir_ptr;
}
bool configure_global_once() {
  static bool ok = [] {
    selfprof::jit::options o;
    o.perf_map_dir = global_dir().path;
    return static_cast<bool>(selfprof::jit::configure(o));
  }();
  return ok;
}
}  // namespace

TEST_CASE("jit api: hooks jit_translate_pc/jit_name_tagged name real code registered without profiling") {
  REQUIRE(configure_global_once());
  static const unsigned char code_a[64] = {0xc3};
  static const unsigned char code_b[64] = {0xc3};
  auto pc_of = [](const void* p, std::uint64_t off) {
    return static_cast<std::uint64_t>(reinterpret_cast<std::uintptr_t>(p)) + off;
  };
  std::uint64_t t0 = selfprof::detail::monotonic_ns();
  REQUIRE(selfprof::jit::add(code_a, sizeof code_a, "jit_api_a"));
  std::uint64_t t1 = selfprof::detail::monotonic_ns();
  REQUIRE(selfprof::jit::remove(code_a));
  REQUIRE(selfprof::jit::add(code_a, sizeof code_a, "jit_api_a2"));
  REQUIRE(selfprof::jit::add(code_b, sizeof code_b, "jit_api_b"));
  std::uint64_t t2 = selfprof::detail::monotonic_ns();
  CHECK_FALSE(selfprof::jit::configure(selfprof::jit::options()));  // too late now

  std::uint64_t pc = pc_of(code_a, 5);
  REQUIRE(selfprof::detail::jit_translate_pc(pc, t1));
  selfprof::frame f;
  REQUIRE(selfprof::detail::jit_name_tagged(pc, f));
  CHECK(f.name == "jit_api_a");
  CHECK(f.address == pc_of(code_a, 5));
  pc = pc_of(code_a, 5);
  REQUIRE(selfprof::detail::jit_translate_pc(pc, t2));
  REQUIRE(selfprof::detail::jit_name_tagged(pc - 1, f));  // as looked up for a return address
  CHECK(f.name == "jit_api_a2");
  CHECK(f.address == pc_of(code_a, 4));
  pc = pc_of(code_a, 5);
  CHECK_FALSE(selfprof::detail::jit_translate_pc(pc, t0 - 1));  // before any registration there
  std::uint64_t native = static_cast<std::uint64_t>(reinterpret_cast<std::uintptr_t>(&count_lines));
  CHECK_FALSE(selfprof::detail::jit_translate_pc(native, t2));
  CHECK_FALSE(selfprof::detail::jit_name_tagged(native, f));
  REQUIRE(selfprof::jit::flush());
  std::string text = jit_test::read_file(selfprof::jit::perf_map_path());
  CHECK(text.find(" 40 jit_api_a\n") != std::string::npos);
  CHECK(text.find(" 40 jit_api_a2\n") != std::string::npos);
  CHECK(text.find(" 40 jit_api_b\n") != std::string::npos);
}

TEST_CASE(
    "jit api: a forked child writes its own map with the inherited live code; the parent's is untouched") {
  REQUIRE(configure_global_once());
  static const unsigned char code_c[32] = {0xc3};
  static const unsigned char code_d[32] = {0xc3};
  REQUIRE(selfprof::jit::add(code_c, sizeof code_c, "jit_before_fork"));
  REQUIRE(selfprof::jit::flush());
  std::string parent_map = selfprof::jit::perf_map_path();
  std::string parent_before = jit_test::read_file(parent_map);
  pid_t child = ::fork();
  REQUIRE(child >= 0);
  if (child == 0) {
    bool ok = selfprof::jit::add(code_d, sizeof code_d, "jit_in_child") && selfprof::jit::flush();
    ::_exit(ok ? 0 : 1);
  }
  int status = 0;
  REQUIRE(::waitpid(child, &status, 0) == child);
  CHECK(WIFEXITED(status));
  CHECK(WEXITSTATUS(status) == 0);
  std::string child_map = global_dir().path + "/perf-" + std::to_string(child) + ".map";
  std::string text = jit_test::read_file(child_map);
  ::unlink(child_map.c_str());
  CHECK(text.find(" 20 jit_before_fork\n") != std::string::npos);
  CHECK(text.find(" 20 jit_in_child\n") != std::string::npos);
  CHECK(text.find("jit_api_a\n") == std::string::npos);  // replaced at that address before the fork
  CHECK(jit_test::read_file(parent_map) == parent_before);
}
