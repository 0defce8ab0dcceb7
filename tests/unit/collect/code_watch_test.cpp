// Tests of the store's view of executable memory: samples outside every known range are noticed once,
// and pcs in anonymous code (only there) are named by the perf map line current at the sample's time.
#include <doctest/doctest.h>

#include <cstdint>

#include "selfprof/collect/code_watch.hpp"

using selfprof::code_range;
using selfprof::detail::code_watch;
using selfprof::detail::perf_map;

TEST_CASE("code watch: unknown code is noticed once; only anonymous code is named by the perf map") {
  perf_map map("/nonexistent/perf-1.map");
  map.parse("1000 100 would_shadow_a_file\n5000 100 jit_fn\n");
  code_watch w;
  w.set_ranges({code_range{0x1000, 0x2000, false}, code_range{0x5000, 0x6000, true}});
  w.set_perf_map(&map);
  std::uint64_t in_file = 0x1010, in_jit = 0x5010, nowhere = 0x9000;
  w.translate(in_file, 1);
  CHECK(in_file == 0x1010);  // a file's code keeps its address: its symbols name it
  CHECK_FALSE(w.take_unknown());
  w.translate(in_jit, 1);
  CHECK(selfprof::detail::is_perf_map_tagged(in_jit));
  perf_map::hit hit;
  REQUIRE(map.name_tagged(in_jit, hit));
  CHECK(hit.name == "jit_fn");
  CHECK(hit.address == 0x5010);
  CHECK_FALSE(w.take_unknown());
  w.translate(nowhere, 1);
  CHECK(nowhere == 0x9000);  // no line covers it
  CHECK(w.take_unknown());
  CHECK_FALSE(w.take_unknown());  // once
  // Tagged values pass through untouched.
  std::uint64_t again = in_jit;
  w.translate(again, 1);
  CHECK(again == in_jit);
  // Before the first scan every pc is unknown; one covered by a line is still named.
  code_watch fresh;
  fresh.set_perf_map(&map);
  std::uint64_t pc = 0x5020;
  fresh.translate(pc, 1);
  CHECK(selfprof::detail::is_perf_map_tagged(pc));
  CHECK(fresh.take_unknown());
}
