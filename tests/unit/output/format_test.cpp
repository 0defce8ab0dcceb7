// Tests of format selection by extension, render() dispatch and write_profile_file().
#include <doctest/doctest.h>

#include <stdlib.h>

#include <filesystem>
#include <string>

#include "fixtures.hpp"
#include "selfprof/output/format.hpp"

using selfprof::output_format;

TEST_CASE("format: extensions pick the writer") {
  auto fmt = [](const std::string& path) {
    const auto r = selfprof::format_for_path(path);
    REQUIRE_MESSAGE(r.result.is_ok(), r.result.message());
    return r.format;
  };
  CHECK(fmt("cpu.folded") == output_format::folded);
  CHECK(fmt("/x/y/cpu.collapsed") == output_format::folded);
  CHECK(fmt("top.txt") == output_format::top);
  CHECK(fmt("cpu.pb.gz") == output_format::pprof);
  CHECK(fmt("cpu.pprof") == output_format::pprof);
  CHECK(fmt("cpu.SVG") == output_format::svg);
  CHECK(fmt("dir.svg/cpu.Folded") == output_format::folded);
}

TEST_CASE("format: unknown extensions are errors naming the path") {
  for (const char* path : {"cpu.json", "cpu.gz", "noext", "/tmp/a.folded/", ".folded", "x.svg/y"}) {
    const auto r = selfprof::format_for_path(path);
    CHECK_FALSE(r.result.is_ok());
    CHECK(r.result.message().find(std::string("cannot write ") + path + ": unknown output format") !=
          std::string::npos);
  }
}

TEST_CASE("format: render dispatches to each writer") {
  const auto p = output_fixtures::basic_profile();
  CHECK(selfprof::render(p, output_format::folded) == selfprof::write_folded(p));
  CHECK(selfprof::render(p, output_format::top) == selfprof::write_top(p));
  selfprof::output_options o;
  o.pprof.gzip = false;
  CHECK(selfprof::render(p, output_format::pprof, o) == selfprof::detail::encode_pprof(p));
  o.folded.thread_roots = true;
  CHECK(selfprof::render(p, output_format::folded, o).rfind("[main tid=100];", 0) == 0);
  CHECK(selfprof::render(p, output_format::svg).find("<svg") != std::string::npos);
}

TEST_CASE("format: write_profile_file writes each format atomically and reports errors") {
  char tmpl[] = "/tmp/selfprof-format-XXXXXX";
  REQUIRE(::mkdtemp(tmpl) != nullptr);
  const std::string dir = tmpl;
  const auto p = output_fixtures::basic_profile();
  for (const char* name : {"a.folded", "a.txt", "a.pb.gz", "a.svg"}) {
    const auto st = selfprof::write_profile_file(p, dir + "/" + name);
    CHECK_MESSAGE(st.is_ok(), st.message());
  }
  std::string folded;
  REQUIRE(output_fixtures::read_file(dir + "/a.folded", folded));
  CHECK(folded == selfprof::write_folded(p));
  std::string gz;
  REQUIRE(output_fixtures::read_file(dir + "/a.pb.gz", gz));
  CHECK(gz.compare(0, 2, "\x1f\x8b") == 0);
  const auto bad = selfprof::write_profile_file(p, dir + "/a.json");
  CHECK_FALSE(bad.is_ok());
  CHECK_FALSE(std::filesystem::exists(dir + "/a.json"));
  const auto missing = selfprof::write_profile_file(p, dir + "/no/such/a.folded");
  CHECK(missing.message().find("No such file or directory") != std::string::npos);
  std::filesystem::remove_all(dir);
}
