// Tests of the /tmp/perf-<pid>.map reader: line format, last entry wins on overlap, re-read on change,
// naming by the line known at sample time, reading as the file grows,
// files it must ignore, and that it never creates the file.
#include <doctest/doctest.h>

#include <sys/stat.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <string>
#include <utility>
#include <vector>

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

namespace {
bool append_file(const std::string& path, const std::string& bytes) {
  std::FILE* f = std::fopen(path.c_str(), "ab");
  if (f == nullptr) return false;
  bool ok = std::fwrite(bytes.data(), 1, bytes.size(), f) == bytes.size();
  return std::fclose(f) == 0 && ok;
}
std::string tagged_name(const perf_map& map, std::uint64_t pc, std::uint64_t time_ns) {
  if (!map.tag(pc, time_ns)) return "<untagged>";
  perf_map::hit hit;
  return map.name_tagged(pc, hit) ? std::string(hit.name) : std::string("<none>");
}
}  // namespace

TEST_CASE("perf map: a sample is named by the line known when it was taken, not by a later reuse") {
  selfprof_test::temp_dir dir;
  REQUIRE(!dir.path().empty());
  std::string path = dir / "perf-999997.map";
  perf_map map(path);
  REQUIRE(selfprof_test::write_file(path, "1000 100 sort_compare\n"));
  CHECK(map.reload_if_changed());
  const std::uint64_t during_sort = selfprof::detail::monotonic_ns();
  ::usleep(20000);  // file times are coarse (a scheduler tick): the append must come clearly later
  // The JIT places other code where the comparator was and appends its line.
  REQUIRE(append_file(path, "1000 80 inspect\n"));
  CHECK(map.reload_if_changed());
  const std::uint64_t after = selfprof::detail::monotonic_ns() + 1;
  CHECK(tagged_name(map, 0x1010, during_sort) == "sort_compare");
  CHECK(tagged_name(map, 0x1010, after) == "inspect");
  CHECK(tagged_name(map, 0x1090, after) == "sort_compare");  // beyond the new line: still the old one
  CHECK(name_at(map, 0x1010) == "inspect");                  // without a time: the last line, as perf
  CHECK(tagged_name(map, 0x3000, after) == "<untagged>");
  // A value tagged for a return address and looked up minus one decodes to pc - 1 in the same line.
  std::uint64_t pc = 0x1000;
  REQUIRE(map.tag(pc, during_sort));
  perf_map::hit hit;
  REQUIRE(map.name_tagged(pc - 1, hit));
  CHECK(hit.name == "sort_compare");
  CHECK(hit.address == 0xfff);
  REQUIRE(map.name_tagged(pc, hit));
  CHECK(hit.address == 0x1000);
  CHECK(hit.start == 0x1000);
  CHECK_FALSE(map.name_tagged(0x1000, hit));  // not a tagged value
}

TEST_CASE("perf map: read as it grows; a partial line waits; a rewrite replaces the current lines") {
  selfprof_test::temp_dir dir;
  REQUIRE(!dir.path().empty());
  std::string path = dir / "perf-999996.map";
  perf_map map(path);
  REQUIRE(selfprof_test::write_file(path, "1000 10 one\n2000 10 par"));
  CHECK(map.reload_if_changed());
  CHECK(name_at(map, 0x1000) == "one");
  CHECK(name_at(map, 0x2000) == "<none>");  // the line is not complete yet
  REQUIRE(append_file(path, "tial\n"));
  CHECK(map.reload_if_changed());
  CHECK(name_at(map, 0x2000) == "partial");
  // Rewritten in place with other bytes (same inode, longer): read again from the start.
  REQUIRE(selfprof_test::write_file(path, "5000 10 five\n6000 10 six and more text\n"));
  map.reload_if_changed();
  CHECK(name_at(map, 0x1000) == "<none>");
  CHECK(name_at(map, 0x5000) == "five");
  CHECK(name_at(map, 0x6000) == "six and more text");
}

TEST_CASE("perf map: ranges overlapping in every way keep each address's own history") {
  perf_map map("/nonexistent/perf-1.map");
  std::string text;
  // 200 lines of random ranges in [0, 4096): check every address against a brute-force last-line-wins.
  std::uint64_t seed = 12345;
  auto next = [&seed] {
    seed = seed * 6364136223846793005ull + 1442695040888963407ull;
    return seed >> 33;
  };
  std::vector<std::pair<std::uint64_t, std::uint64_t>> ranges;
  for (int i = 0; i < 200; ++i) {
    std::uint64_t start = next() % 4096, size = 1 + next() % 300;
    ranges.emplace_back(start, start + size);
    char line[64];
    std::snprintf(line, sizeof line, "%llx %llx f%d\n", static_cast<unsigned long long>(start),
                  static_cast<unsigned long long>(size), i);
    text += line;
  }
  map.parse(text);
  int mismatches = 0;
  for (std::uint64_t a = 0; a < 4400; ++a) {
    std::string want = "<none>";
    for (std::size_t i = 0; i < ranges.size(); ++i)
      if (a >= ranges[i].first && a < ranges[i].second) want = "f" + std::to_string(i);
    if (name_at(map, a) != want) ++mismatches;
  }
  CHECK(mismatches == 0);
}
