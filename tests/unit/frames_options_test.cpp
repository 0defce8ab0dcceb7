// SELFPROF_FRAME_BUDGET_MS and SELFPROF_FRAME_HZ: parsed, defaulted, and a bad value named in a warning.
#include <doctest/doctest.h>

#include <cstdlib>

#include <selfprof/options.hpp>

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
