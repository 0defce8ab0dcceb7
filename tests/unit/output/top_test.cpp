// Tests of the top-list writer: self/total semantics (recursion counted once), sorting, header,
// per-module table, limit, golden bytes, locale independence.
#include <doctest/doctest.h>

#include <clocale>
#include <string>

#include "fixtures.hpp"
#include "selfprof/output/text.hpp"
#include "selfprof/output/top.hpp"

namespace {
using output_fixtures::add_frame;
using output_fixtures::add_stack;
using output_fixtures::basic_profile;
using output_fixtures::check_golden;

// The table row that ends with "  <name>".
std::string row_of(const std::string& text, const std::string& name) {
  std::size_t pos = 0;
  while (pos < text.size()) {
    const auto nl = text.find('\n', pos);
    const std::string line = text.substr(pos, nl - pos);
    if (line.size() > name.size() + 2 &&
        line.compare(line.size() - name.size() - 2, std::string::npos, "  " + name) == 0)
      return line;
    pos = nl + 1;
  }
  return "";
}
}  // namespace

TEST_CASE("top: golden bytes of the basic profile, plain and per module") {
  const auto p = basic_profile();
  check_golden("basic.txt", selfprof::write_top(p));
  selfprof::top_options opts;
  opts.by_module = true;
  check_golden("basic_modules.txt", selfprof::write_top(p, opts));
}

TEST_CASE("top: self and total like perf report --no-children") {
  const auto text = selfprof::write_top(basic_profile());
  // hot_loop is the leaf of 50+25+3+6 = 84 samples and on the stack of 91 (the 7 inlined ones too).
  CHECK(row_of(text, "hot_loop<int>()") == " 80.00%  86.67%     84     91  hot_loop<int>()");
  // run(int) recurses in one stack (3 samples): counted once, so total is 75+7+4+6+3 = 95, not 101.
  CHECK(row_of(text, "run(int)") == "  0.00%  90.48%      0     95  run(int)");
  CHECK(row_of(text, "entry_SYSCALL_64_[k]") == "  3.81%   3.81%      4      4  entry_SYSCALL_64_[k]");
  CHECK(text.find("# samples: 105  dropped: 3  truncated: 6\n") != std::string::npos);
  CHECK(text.find("# mode: cpu  unit: samples  source: timer  hz: 99  duration: 2.500 s\n") !=
        std::string::npos);
  CHECK(text.find("# note: perf_event refused: perf_event_paranoid=3\n") != std::string::npos);
  // Sorted by self, descending: hot_loop is the first row.
  const auto header = text.find("  function\n");
  REQUIRE(header != std::string::npos);
  CHECK(text.compare(text.find('\n', header) + 1, 16, " 80.00%  86.67% ") == 0);
}

TEST_CASE("top: per-module table and limit") {
  selfprof::top_options opts;
  opts.by_module = true;
  opts.limit = 2;
  const auto text = selfprof::write_top(basic_profile(), opts);
  // Every stack has an app frame; app is the leaf module of all but the kernel (4) and JIT (3) stacks.
  CHECK(row_of(text, "/usr/bin/app") == " 93.33% 100.00%     98    105  /usr/bin/app");
  CHECK(row_of(text, "[kernel.kallsyms]") == "  3.81%   3.81%      4      4  [kernel.kallsyms]");
  CHECK(text.find("... 12 more (limit 2)\n") != std::string::npos);  // 14 functions
  CHECK(text.find("... 2 more (limit 2)\n") != std::string::npos);   // 4 modules
}

TEST_CASE("top: thread-root markers are not functions; empty profiles say so") {
  selfprof::profile p;
  add_frame(p, "[main tid=1]", "", 0, selfprof::frame_kind::marker);
  add_frame(p, "f", "", 0);
  add_stack(p, {0, 1}, 4);
  add_stack(p, {0}, 1);
  const auto text = selfprof::write_top(p);
  CHECK(text.find("[main tid=1]") == std::string::npos);
  CHECK(row_of(text, "f") == " 80.00%  80.00%      4      4  f");
  CHECK(row_of(text, "[unknown]") == " 20.00%  20.00%      1      1  [unknown]");
  CHECK(selfprof::write_top(selfprof::profile{}).find("(no samples)\n") != std::string::npos);
}

TEST_CASE("top: bytes do not depend on LC_NUMERIC") {
  const auto p = basic_profile();
  const auto before = selfprof::write_top(p);
  const char* old = std::setlocale(LC_NUMERIC, nullptr);
  const std::string saved = old ? old : "C";
  bool switched = false;
  for (const char* loc : {"de_DE.UTF-8", "fr_FR.UTF-8", "de_DE"})
    if (std::setlocale(LC_NUMERIC, loc)) {
      switched = true;
      break;
    }
  const auto after = selfprof::write_top(p);
  std::setlocale(LC_NUMERIC, saved.c_str());
  if (!switched) MESSAGE("no de_DE/fr_FR locale installed: the comparison ran under the same locale");
  CHECK(after == before);
}

TEST_CASE("text: locale-free number formatting") {
  using selfprof::detail::format_compact;
  using selfprof::detail::format_fixed;
  CHECK(format_fixed(2.5, 3) == "2.500");
  CHECK(format_fixed(0.005, 2) == "0.01");
  CHECK(format_fixed(99.999, 2) == "100.00");
  CHECK(format_fixed(-1.25, 1) == "-1.3");
  CHECK(format_fixed(-0.0001, 2) == "0.00");
  CHECK(format_fixed(7, 0) == "7");
  CHECK(format_compact(99) == "99");
  CHECK(format_compact(99.5) == "99.5");
  CHECK(format_compact(0.0004) == "0");
}
