// Lazy unwind rows (issue 19): the collector parses a module's .eh_frame only once samples reached its
// code. A library with a large .eh_frame (30,000 FDEs, tests/fixtures/big_eh_frame.S) is loaded while
// sampling; the program calls back through its one frameless function, which leaves %rbp holding no
// frame record. Stacks through it reach the caller once its rows are parsed (frame pointers alone stop
// there), other modules' rows are never parsed, and the stats report what start() cost. With the ring
// source, the first samples through it are complete too: their walk waits for the rows.
// ctest-labels: no_tsan
// Not under TSan: where the ring source cannot open, the signal sources run its handler late.
#include <doctest/doctest.h>

#include <dlfcn.h>
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <string>

#include <selfprof.hpp>

#include "workload.hpp"

namespace lazy_rows_test {

using call_fn = void (*)(void (*)(void*), void*);

// The fixture: built by the build system (SELFPROF_BIG_EH_FIXTURE_LIB), else here with the C compiler.
std::string fixture_path() {
#if defined(SELFPROF_BIG_EH_FIXTURE_LIB)
  return SELFPROF_BIG_EH_FIXTURE_LIB;
#else
  std::string out = "/tmp/selfprof_big_eh_fixture_" + std::to_string(getpid()) + ".so";
  std::string cmd =
      std::string("cc -shared -fPIC -o ") + out + " " SELFPROF_TEST_SOURCE_DIR "/fixtures/big_eh_frame.S";
  return std::system(cmd.c_str()) == 0 ? out : std::string();
#endif
}

// Called back from the frameless function: spins for the CPU time *arg (nanoseconds).
WL_NOINLINE void lazy_rows_spin(void* arg) {
  const std::int64_t until = wl::thread_cpu_ns() + *static_cast<std::int64_t*>(arg);
  while (wl::thread_cpu_ns() < until) wl::spin_units(1);
  WL_NO_TAIL();
}

WL_NOINLINE void lazy_rows_driver(call_fn call, std::int64_t cpu_ns) {
  call(&lazy_rows_spin, &cpu_ns);
  WL_NO_TAIL();
}

// Samples in lazy_rows_spin, and of those the ones whose stack also holds lazy_rows_driver.
struct through {
  std::uint64_t leaf = 0, complete = 0;
};
through count_through(const selfprof::profile& p) {
  through t;
  for (const auto& s : p.stacks) {
    if (wl::count_frames(p, s, "lazy_rows_spin") == 0) continue;
    t.leaf += s.count;
    if (wl::count_frames(p, s, "lazy_rows_driver") > 0) t.complete += s.count;
  }
  return t;
}

}  // namespace lazy_rows_test

namespace lrt = lazy_rows_test;

TEST_CASE("lazy rows: a library with 30,000 FDEs loaded while sampling is parsed once samples reach it") {
  wl::apply_test_environment();
  const std::string path = lrt::fixture_path();
  REQUIRE_MESSAGE(!path.empty(), "could not build tests/fixtures/big_eh_frame.S");
  selfprof::options o;
  o.hz = 250;
  o.unwind = selfprof::unwind_mode::automatic;
  REQUIRE(selfprof::start(o));
  void* lib = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  REQUIRE(lib != nullptr);
  auto call = reinterpret_cast<lrt::call_fn>(dlsym(lib, "selfprof_big_eh_call"));
  REQUIRE(reinterpret_cast<void*>(call) != nullptr);

  // Until its rows are parsed, a sample's stack ends at the frameless function (frame pointers alone).
  // Run until a complete stack shows up: the collector parsed the rows after samples reached the code.
  lrt::through first;
  for (int round = 0; round < 100 && first.complete == 0; ++round) {
    lrt::lazy_rows_driver(call, 50000000);
    first = lrt::count_through(selfprof::snapshot());
  }
  REQUIRE_MESSAGE(first.complete > 0, "no stack through the fixture reached its caller");

  // From then on every stack through it is complete.
  lrt::lazy_rows_driver(call, 1000000000);
  const lrt::through after = lrt::count_through(selfprof::snapshot());
  const selfprof::stats st = selfprof::get_stats();
  REQUIRE(selfprof::stop());
  const std::uint64_t leaf = after.leaf - first.leaf, complete = after.complete - first.complete;
  MESSAGE("before the rows: " << first.leaf << " samples, " << first.complete << " complete; after: " << leaf
                              << " samples, " << complete << " complete; start() " << st.start_cpu_ms
                              << " ms CPU, " << st.start_wall_ms << " ms wall; rows of "
                              << st.unwind_modules_parsed << " modules parsed in " << st.unwind_parse_ms
                              << " ms, " << st.unwind_modules_pending << " never sampled, " << st.unwind_rows
                              << " rows");
  CHECK(leaf >= 100);  // ~1 s at 250 Hz
  CHECK(complete >= leaf * 98 / 100);
  CHECK(st.unwind == selfprof::unwind_mode::dwarf);
  CHECK(st.unwind_modules_parsed >= 1);
  CHECK(st.unwind_modules_pending >= 1);  // the test links libraries it never runs: their rows wait
  CHECK(st.unwind_rows >= 30000);         // the fixture's rows are published
  CHECK(st.unwind_parse_ms > 0);
  CHECK(st.start_cpu_ms > 0);
  CHECK(st.start_wall_ms > 0);
  dlclose(lib);
#if !defined(SELFPROF_BIG_EH_FIXTURE_LIB)
  std::remove(path.c_str());
#endif
}

// The ring source walks its samples on the collector thread, after the kernel copied them: a sample that
// reached a module whose rows were never parsed has them parsed there and is walked again. So the very
// first samples through the frameless function reach its caller, where the signal sources (which walk
// in the handler) walk them by frame pointers until the collector's next wake.
TEST_CASE("lazy rows: with the ring source, a module's first samples are walked by its rows") {
  wl::apply_test_environment();
  const std::string built = lrt::fixture_path();
  REQUIRE_MESSAGE(!built.empty(), "could not build tests/fixtures/big_eh_frame.S");
  // A copy under a name of its own: rows parsed for the fixture by an earlier test stay kept while it
  // is loaded, and this test needs a module no sample reached yet.
  wl::temp_dir dir;
  const std::string path = dir.path + "/libselfprof_big_eh_first.so";
  REQUIRE(std::system(("cp '" + built + "' '" + path + "'").c_str()) == 0);
  selfprof::options o;
  o.hz = 250;
  o.source = selfprof::source_kind::ring;
  o.unwind = selfprof::unwind_mode::automatic;
  REQUIRE(selfprof::start(o));
  if (selfprof::get_stats().source != selfprof::source_kind::ring) {  // refused: start() fell back
    REQUIRE(selfprof::stop());
    MESSAGE("skipped: the ring source does not open here");
    return;
  }
  void* lib = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  REQUIRE(lib != nullptr);
  auto call = reinterpret_cast<lrt::call_fn>(dlsym(lib, "selfprof_big_eh_call"));
  REQUIRE(reinterpret_cast<void*>(call) != nullptr);
  lrt::lazy_rows_driver(call, 400000000);  // 0.4 s of CPU: its first samples come before any parse
  const lrt::through t = lrt::count_through(selfprof::snapshot());
  const selfprof::stats st = selfprof::get_stats();
  REQUIRE(selfprof::stop());
  dlclose(lib);
  MESSAGE(t.leaf << " samples through the fixture, " << t.complete << " complete; rows of "
                 << st.unwind_modules_parsed << " modules parsed");
  CHECK(st.source == selfprof::source_kind::ring);
  CHECK(t.leaf >= 40);  // ~100 at 250 Hz
  CHECK(t.complete >= t.leaf * 98 / 100);
}
