// SELFPROF_* environment variables: parsed, validated, and reported by name when wrong; signals that
// selfprof must never take are refused.
#include <doctest/doctest.h>

#include <signal.h>

#include <cstdlib>
#include <string>
#include <utility>
#include <vector>

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

TEST_CASE("frames options: defaults, valid values, bad values reported by name") {
  unsetenv("SELFPROF_FRAME_BUDGET_MS");
  unsetenv("SELFPROF_FRAME_HZ");
  selfprof::options d = selfprof::options_from_env();
  CHECK(d.frame_budget_ms == doctest::Approx(16.7));
  CHECK(d.frame_hz == 0);

  setenv("SELFPROF_FRAME_BUDGET_MS", "33.3", 1);
  setenv("SELFPROF_FRAME_HZ", "1000", 1);
  std::vector<std::string> warnings;
  selfprof::options o = selfprof::options_from_env(&warnings);
  CHECK(warnings.empty());
  CHECK(o.frame_budget_ms == doctest::Approx(33.3));
  CHECK(o.frame_hz == doctest::Approx(1000));

  setenv("SELFPROF_FRAME_BUDGET_MS", "fast", 1);
  setenv("SELFPROF_FRAME_HZ", "-5", 1);
  warnings.clear();
  o = selfprof::options_from_env(&warnings);
  REQUIRE(warnings.size() == 2);
  CHECK(warnings[0].find("SELFPROF_FRAME_BUDGET_MS") != std::string::npos);
  CHECK(warnings[1].find("SELFPROF_FRAME_HZ") != std::string::npos);
  CHECK(o.frame_budget_ms == doctest::Approx(16.7));
  CHECK(o.frame_hz == 0);
  unsetenv("SELFPROF_FRAME_BUDGET_MS");
  unsetenv("SELFPROF_FRAME_HZ");
}

TEST_CASE("options: fault, job-control and termination signals are refused, by name of the variable") {
  for (const char* bad :
       {"SIGSEGV", "11", "SEGV", "7", "8", "4", "5", "6", "17", "9", "19", "18", "2", "15", "13"}) {
    INFO(bad);
    setenv("SELFPROF_SIGNAL", bad, 1);
    setenv("SELFPROF_SAMPLE_SIGNAL", bad, 1);
    std::vector<std::string> warnings;
    selfprof::options o = selfprof::options_from_env(&warnings);
    CHECK(o.dump_signal == SIGUSR2);
    CHECK(o.sample_signal == 0);
    REQUIRE(warnings.size() == 2);
    CHECK(warnings[0].find("SELFPROF_SIGNAL") != std::string::npos);
    CHECK(warnings[1].find("SELFPROF_SAMPLE_SIGNAL") != std::string::npos);
  }
  setenv("SELFPROF_SIGNAL", "USR1", 1);
  setenv("SELFPROF_SAMPLE_SIGNAL", "40", 1);
  selfprof::options o = selfprof::options_from_env();
  CHECK(o.dump_signal == SIGUSR1);
  CHECK(o.sample_signal == 40);
  unsetenv("SELFPROF_SIGNAL");
  unsetenv("SELFPROF_SAMPLE_SIGNAL");
}

TEST_CASE("SELFPROF_MAX_MEMORY: sizes with K, M, G suffixes; bad or too small values named and refused") {
  {
    selfprof::options d;
    CHECK(d.max_memory == (std::size_t{64} << 20));
  }
  const char* good[][2] = {{"16M", "16777216"}, {"2G", "2147483648"},   {"4096K", "4194304"},
                           {"8MiB", "8388608"}, {"1048576", "1048576"}, {"3mb", "3145728"}};
  for (auto& g : good) {
    env_guard e("SELFPROF_MAX_MEMORY", g[0]);
    std::vector<std::string> warnings;
    selfprof::options o = selfprof::options_from_env(&warnings);
    CHECK(warnings.empty());
    CHECK(std::to_string(o.max_memory) == g[1]);
  }
  for (const char* bad : {"", "lots", "16X", "-5M", "512K", "0", "2000G", "1.5G", "M"}) {
    env_guard e("SELFPROF_MAX_MEMORY", bad);
    std::vector<std::string> warnings;
    selfprof::options o = selfprof::options_from_env(&warnings);
    REQUIRE(warnings.size() == 1);
    CHECK(warnings[0].find("SELFPROF_MAX_MEMORY") != std::string::npos);
    CHECK(o.max_memory == (std::size_t{64} << 20));
  }
}

TEST_CASE("SELFPROF_LINES: auto by default, all and none taken, anything else named and refused") {
  unsetenv("SELFPROF_LINES");
  CHECK(selfprof::options_from_env().lines == selfprof::lines_mode::automatic);
  for (auto [text, mode] : {std::pair<const char*, selfprof::lines_mode>{"all", selfprof::lines_mode::all},
                            {"none", selfprof::lines_mode::none},
                            {"auto", selfprof::lines_mode::automatic}}) {
    env_guard g("SELFPROF_LINES", text);
    std::vector<std::string> warnings;
    CHECK(selfprof::options_from_env(&warnings).lines == mode);
    CHECK(warnings.empty());
    CHECK(std::string(selfprof::lines_name(mode)) == text);
  }
  env_guard g("SELFPROF_LINES", "some");
  std::vector<std::string> warnings;
  CHECK(selfprof::options_from_env(&warnings).lines == selfprof::lines_mode::automatic);
  REQUIRE(warnings.size() == 1);
  CHECK(warnings[0].find("SELFPROF_LINES=\"some\"") != std::string::npos);
}
