// SELFPROF_* environment variables: parsed, validated, and reported by name when wrong.
#include <doctest/doctest.h>

#include <cstdlib>

#include <selfprof/options.hpp>
#include <selfprof/profiler.hpp>

namespace {
struct env_guard {
  const char* name;
  explicit env_guard(const char* n, const char* v) : name(n) { setenv(n, v, 1); }
  ~env_guard() { unsetenv(name); }
};
}  // namespace

TEST_CASE("valid values are taken") {
  env_guard a("SELFPROF_HZ", "997"), b("SELFPROF_SOURCE", "perf"), c("SELFPROF_SIGNAL", "none"),
      d("SELFPROF_MAX_DEPTH", "64"), e("SELFPROF_INTERVAL", "2.5"), f("SELFPROF_OUT", "/tmp/p-%p.folded"),
      g("SELFPROF_SAMPLE_SIGNAL", "40"), h("SELFPROF_VERBOSE", "1");
  std::vector<std::string> warnings;
  selfprof::options o = selfprof::options_from_env(&warnings);
  CHECK(warnings.empty());
  CHECK(o.hz == 997);
  CHECK(o.source == selfprof::source_kind::perf);
  CHECK(o.dump_signal == 0);
  CHECK(o.max_depth == 64);
  CHECK(o.interval_s == 2.5);
  CHECK(o.out == "/tmp/p-%p.folded");
  CHECK(o.sample_signal == 40);
  CHECK(o.verbose);
}

TEST_CASE("a bad value is reported with the variable's name and the default is kept") {
  env_guard a("SELFPROF_HZ", "fast"), b("SELFPROF_SOURCE", "magic"), c("SELFPROF_SIGNAL", "SIGKILL"),
      d("SELFPROF_MAX_DEPTH", "1.5"), e("SELFPROF_HZ_UNRELATED", "1");
  std::vector<std::string> warnings;
  selfprof::options o = selfprof::options_from_env(&warnings);
  REQUIRE(warnings.size() == 4);
  CHECK(warnings[0].find("SELFPROF_HZ=\"fast\"") != std::string::npos);
  CHECK(warnings[1].find("SELFPROF_SOURCE") != std::string::npos);
  CHECK(warnings[2].find("SELFPROF_SIGNAL") != std::string::npos);
  CHECK(warnings[3].find("SELFPROF_MAX_DEPTH") != std::string::npos);
  selfprof::options defaults;
  CHECK(o.hz == defaults.hz);
  CHECK(o.source == defaults.source);
  CHECK(o.dump_signal == defaults.dump_signal);
  CHECK(o.max_depth == defaults.max_depth);
}

TEST_CASE("out of range numbers are refused") {
  env_guard a("SELFPROF_HZ", "0"), b("SELFPROF_MAX_DEPTH", "5000");
  std::vector<std::string> warnings;
  selfprof::options o = selfprof::options_from_env(&warnings);
  CHECK(warnings.size() == 2);
  CHECK(o.hz == 99);
}

TEST_CASE("output path templates expand %p %t %n %f and %%") {
  selfprof::detail::path_fields f = selfprof::detail::fields_now(7);
  std::string s = selfprof::detail::expand_path_template("cpu-%p-%n-%%.folded", f);
  CHECK(s == "cpu-" + std::to_string(getpid()) + "-7-%.folded");
  CHECK(selfprof::detail::expand_path_template("a%t", f) == "a" + std::to_string(f.unix_time));
  CHECK(selfprof::detail::expand_path_template("w%f.svg", f) == "w%f.svg");  // no rank in this dump
  f.rank = "2";
  CHECK(selfprof::detail::expand_path_template("w%f-%%f.svg", f) == "w2-%f.svg");
  auto parts = selfprof::detail::split_paths("a.svg,b.folded,,c.txt");
  REQUIRE(parts.size() == 3);
  CHECK(parts[2] == "c.txt");
}
