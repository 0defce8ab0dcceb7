// Dump path templates: the fields of one dump (%p %t %n %f %%), comma-separated lists, and the tag a
// companion file gets before the extension.
#include <doctest/doctest.h>

#include <unistd.h>

#include <string>

#include <selfprof/dump/dump.hpp>
#include <selfprof/dump/paths.hpp>

using namespace selfprof::detail;

TEST_CASE("paths: templates expand %p %t %n %f and %%, the same values for every file of a dump") {
  path_fields f = fields_now(7);
  CHECK(expand_path_template("cpu-%p-%n-%%.folded", f) == "cpu-" + std::to_string(getpid()) + "-7-%.folded");
  CHECK(expand_path_template("a%t", f) == "a" + std::to_string(f.unix_time));
  CHECK(expand_path_template("w%f.svg", f) == "w%f.svg");  // no rank in this dump: left as written
  f.rank = "2";
  CHECK(expand_path_template("w%f-%%f.svg", f) == "w2-%f.svg");
  CHECK(expand_path_template("odd%", f) == "odd%");
  CHECK(expand_path_template("%q.txt", f) == "%q.txt");
  f.pid = 4242;  // another process's profile (selfprof record names its children's)
  CHECK(expand_path_template("p-%p-%%p.folded", f) == "p-4242-%p.folded");
}

TEST_CASE("paths: lists split on commas, empty entries dropped") {
  auto parts = split_paths("a.svg,b.folded,,c.txt");
  REQUIRE(parts.size() == 3);
  CHECK(parts[2] == "c.txt");
  CHECK(split_paths("").empty());
}

TEST_CASE("paths: a companion's tag goes before the extension of each path") {
  CHECK(insert_before_extension("cpu.svg", "-slow") == "cpu-slow.svg");
  CHECK(insert_before_extension("out/cpu.pb.gz", "-slow") == "out/cpu-slow.pb.gz");
  CHECK(insert_before_extension("dir.d/noext", "-frame1") == "dir.d/noext-frame1");
  CHECK(insert_before_extension("p-%p.svg", "-frame2") == "p-%p-frame2.svg");
  CHECK(companion_paths("a.folded,b.txt", "-slow") == "a-slow.folded,b-slow.txt");
}

TEST_CASE("paths: dump numbers grow by one per dump") {
  const unsigned long a = next_dump_number();
  CHECK(next_dump_number() == a + 1);
}
