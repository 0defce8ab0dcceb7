// Tests of the /tmp/perf-<pid>.map reader: line format, last entry wins on overlap, re-read on change,
// files it must ignore, and that it never creates the file.
#include <doctest/doctest.h>

#include <sys/stat.h>
#include <unistd.h>

#include <string>

#include "fixtures/symbols_fixture.hpp"
#include "selfprof/symbols/perf_map.hpp"

using selfprof::detail::perf_map;

namespace {
std::string name_at(const perf_map& map, std::uint64_t address) {
  perf_map::hit hit;
  return map.lookup(address, hit) ? std::string(hit.name) : std::string("<none>");
}
}  // namespace

TEST_CASE("perf map: START SIZE name lines, hex without 0x, names with spaces") {
  perf_map map("/nonexistent/perf-1.map");
  map.parse(
      "1000 10 jit_one\n2000 20 LazyCompile:*fn file.js:3\n3000 0 zero_size\nGARBAGE LINE\n4000 10\n"
      "5000 10 crlf_name\r\n");
  CHECK(name_at(map, 0x0fff) == "<none>");
  CHECK(name_at(map, 0x1000) == "jit_one");
  CHECK(name_at(map, 0x100f) == "jit_one");
  CHECK(name_at(map, 0x1010) == "<none>");  // past the end
  CHECK(name_at(map, 0x2010) == "LazyCompile:*fn file.js:3");
  CHECK(name_at(map, 0x3000) == "zero_size");  // size 0 is one byte, as perf reads it
  CHECK(name_at(map, 0x3001) == "<none>");
  CHECK(name_at(map, 0x4000) == "<none>");  // no name: skipped
  CHECK(name_at(map, 0x5000) == "crlf_name");
  CHECK(perf_map::default_path(1234) == "/tmp/perf-1234.map");
}

TEST_CASE("perf map: the last entry wins where ranges overlap") {
  perf_map map("/nonexistent/perf-1.map");
  map.parse("1000 100 old_big\n1040 10 new_small\n1080 100 newer_tail\n1000 8 newest_head\n");
  CHECK(name_at(map, 0x1000) == "newest_head");
  CHECK(name_at(map, 0x1007) == "newest_head");
  CHECK(name_at(map, 0x1008) == "old_big");
  CHECK(name_at(map, 0x1040) == "new_small");
  CHECK(name_at(map, 0x104f) == "new_small");
  CHECK(name_at(map, 0x1050) == "old_big");
  CHECK(name_at(map, 0x1080) == "newer_tail");
  CHECK(name_at(map, 0x1170) == "newer_tail");
  CHECK(name_at(map, 0x1180) == "<none>");
  // Code reused at the same address: the later name replaces the earlier one.
  map.parse("a000 40 first_fn\na000 40 second_fn\n");
  CHECK(name_at(map, 0xa010) == "second_fn");
  CHECK(map.size() == 1);
}

TEST_CASE("perf map: re-read when the file changes, never created, hostile files ignored") {
  selfprof_test::temp_dir dir;
  REQUIRE(!dir.path().empty());
  std::string path = dir / "perf-999999.map";
  perf_map map(path);
  CHECK_FALSE(map.reload_if_changed());
  CHECK(::access(path.c_str(), F_OK) != 0);  // not created
  REQUIRE(selfprof_test::write_file(path, "1000 10 first\n"));
  CHECK(map.reload_if_changed());
  CHECK(name_at(map, 0x1000) == "first");
  CHECK_FALSE(map.reload_if_changed());  // unchanged: not read again
  REQUIRE(selfprof_test::write_file(path, "1000 10 first\n2000 10 second\n"));
  CHECK(map.reload_if_changed());
  CHECK(name_at(map, 0x2000) == "second");
  // A removed file keeps the names read before (samples may still point there).
  REQUIRE(::unlink(path.c_str()) == 0);
  CHECK_FALSE(map.reload_if_changed());
  CHECK(name_at(map, 0x2000) == "second");
  // A symlink at the path is never followed.
  std::string target = dir / "target.map";
  REQUIRE(selfprof_test::write_file(target, "3000 10 via_symlink\n"));
  REQUIRE(::symlink(target.c_str(), path.c_str()) == 0);
  CHECK_FALSE(map.reload_if_changed());
  CHECK(name_at(map, 0x3000) == "<none>");
  // A file owned by another user (not root) is ignored.
  if (::geteuid() == 0) {
    std::string other = dir / "perf-999998.map";
    REQUIRE(selfprof_test::write_file(other, "4000 10 foreign\n"));
    REQUIRE(::chown(other.c_str(), 12345, 12345) == 0);
    perf_map foreign(other);
    CHECK_FALSE(foreign.reload_if_changed());
    CHECK(name_at(foreign, 0x4000) == "<none>");
  }
}
