// Tests of the folded writer and reader: merging, sorting, escaping, annotations, thread roots,
// truncation, the 64 KiB line limit, golden bytes and write→parse→write round trips.
#include <doctest/doctest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "fixtures.hpp"
#include "selfprof/output/folded.hpp"
#include "selfprof/output/folded_parse.hpp"

namespace {

using output_fixtures::add_frame;
using output_fixtures::add_stack;
using output_fixtures::basic_profile;
using output_fixtures::check_golden;
using output_fixtures::many_profile;
using selfprof::folded_options;
using selfprof::frame_kind;
using selfprof::parse_folded;
using selfprof::write_folded;

std::vector<std::string> lines_of(const std::string& text) {
  std::vector<std::string> out;
  std::size_t pos = 0;
  while (pos < text.size()) {
    const auto nl = text.find('\n', pos);
    REQUIRE(nl != std::string::npos);  // every line ends with LF
    out.push_back(text.substr(pos, nl - pos));
    pos = nl + 1;
  }
  return out;
}

bool has_line(const std::string& text, const std::string& line) {
  const auto lines = lines_of(text);
  return std::find(lines.begin(), lines.end(), line) != lines.end();
}

}  // namespace

TEST_CASE("folded: golden bytes of the basic profile, with and without thread roots") {
  const auto p = basic_profile();
  check_golden("basic.folded", write_folded(p));
  folded_options opts;
  opts.thread_roots = true;
  check_golden("basic_threads.folded", write_folded(p, opts));
}

TEST_CASE("folded: stacks with the same names merge; zero counts are omitted") {
  const auto text = write_folded(basic_profile());
  CHECK(has_line(text, "_start;main;run(int);hot_loop<int>() 75"));
  CHECK(text.find("[app+0x1a00]") == std::string::npos);
  CHECK(has_line(text, "_start;main;run(int);hot_loop<int>();std::vector<int>::size() const_[i] 7"));
  CHECK(has_line(text, "_start;main;run(int);__memcpy_avx_unaligned;entry_SYSCALL_64_[k] 4"));
  CHECK(has_line(text, "_start;main;Interp::loop_[j] 3"));
  CHECK(has_line(text, "_start;main;run(int);run(int);run(int);hot_loop<int>() 3"));
}

TEST_CASE("folded: lines are sorted bytewise, LF-terminated, counts are positive integers") {
  const auto text = write_folded(many_profile(3000));
  const auto lines = lines_of(text);
  CHECK(lines.size() > 2000);
  CHECK(std::is_sorted(lines.begin(), lines.end()));
  CHECK(std::adjacent_find(lines.begin(), lines.end()) == lines.end());
  for (const auto& l : lines) {
    const auto sp = l.rfind(' ');
    REQUIRE(sp != std::string::npos);
    const auto count = l.substr(sp + 1);
    CHECK(!count.empty());
    CHECK(count.find_first_not_of("0123456789") == std::string::npos);
    CHECK(count != "0");
  }
  CHECK(text.find('\r') == std::string::npos);
}

TEST_CASE("folded: hostile names are made safe") {
  const auto text = write_folded(basic_profile());
  // ';' in a name becomes ':'; quotes, '<' and '&' are kept verbatim (folded text is not XML).
  CHECK(has_line(text, "_start;main;a:b<c&d>\"q\" 'x' 2"));
  // UTF-8 kept; CR/LF removed; tab and other control characters become spaces.
  CHECK(has_line(text, "_start;main;na\xC3\xAFve_\xE5\x87\xBD\xE6\x95\xB0 2"));
  CHECK(has_line(text, "_start;main;linebreak and 1"));
  // A name ending in " <digits>" would read as a count column.
  CHECK(has_line(text, "_start;main;retry_2 1"));
  // Invalid UTF-8 becomes U+FFFD; an empty name becomes [unknown].
  CHECK(has_line(text, "_start;main;bad\xEF\xBF\xBD\xEF\xBF\xBD(;[unknown] 1"));
}

TEST_CASE("folded: frame name rules one by one") {
  auto name = [](const std::string& n) {
    selfprof::frame f;
    f.name = n;
    return selfprof::detail::folded_frame_name(f);
  };
  CHECK(name("x;y;z") == "x:y:z");
  CHECK(name("   ") == "[unknown]");
  CHECK(name("v 1.5") == "v_1.5");
  CHECK(name("v 15 ") == "v_15");
  CHECK(name("v1 5x") == "v1 5x");
  CHECK(name(std::string("a\0b", 3)) == "ab");
  CHECK(name("\xED\xA0\x80") == "\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD");  // a UTF-16 surrogate
  CHECK(name("\xF0\x9F\x94\xA5") == "\xF0\x9F\x94\xA5");                  // 4-byte sequence kept
  selfprof::frame k;
  k.name = "do_syscall_64";
  k.kind = frame_kind::kernel;
  CHECK(selfprof::detail::folded_frame_name(k) == "do_syscall_64_[k]");
  CHECK(selfprof::detail::folded_frame_name(k, false) == "do_syscall_64");
  k.kind = frame_kind::marker;
  CHECK(selfprof::detail::folded_frame_name(k) == "do_syscall_64");
}

TEST_CASE("folded: thread roots and the truncated marker") {
  const auto p = basic_profile();
  const auto plain = write_folded(p);
  CHECK(has_line(plain, "[truncated];run(int);hot_loop<int>() 6"));
  folded_options opts;
  opts.thread_roots = true;
  const auto text = write_folded(p, opts);
  CHECK(has_line(text, "[main tid=100];_start;main;run(int);hot_loop<int>() 75"));
  CHECK(has_line(text, "[worker:1 tid=101];[truncated];run(int);hot_loop<int>() 6"));
  CHECK(has_line(text, "_start;main;retry_2 1"));  // tid 0: no thread root
  selfprof::profile q = p;
  q.threads.clear();
  CHECK(has_line(write_folded(q, opts), "[tid=101];_start;main;Interp::loop_[j] 3"));
}

TEST_CASE("folded: the same profile in any stack order gives the same bytes") {
  auto p = many_profile(500);
  const auto a = write_folded(p);
  std::reverse(p.stacks.begin(), p.stacks.end());
  CHECK(write_folded(p) == a);
}

TEST_CASE("folded: bad frame indices and empty stacks do not crash") {
  selfprof::profile p;
  add_frame(p, "f", "", 0);
  add_stack(p, {0, 7, 99999}, 2);
  add_stack(p, {}, 3);
  const auto text = write_folded(p);
  CHECK(has_line(text, "f;[unknown];[unknown] 2"));
  CHECK(has_line(text, "[unknown] 3"));
}

TEST_CASE("folded: counts saturate instead of wrapping") {
  selfprof::profile p;
  add_frame(p, "f", "", 0);
  add_stack(p, {0}, UINT64_MAX - 1);
  add_stack(p, {0}, 5);
  CHECK(write_folded(p) == "f 18446744073709551615\n");
}

TEST_CASE("folded: a very deep stack stays under 64 KiB and keeps its leaf side") {
  selfprof::profile p;
  for (int i = 0; i < 20000; ++i) add_frame(p, "frame_number_" + std::to_string(i), "/bin/x", 0x1000 + i);
  std::vector<std::uint32_t> frames;
  for (std::uint32_t i = 0; i < 20000; ++i) frames.push_back(i);
  add_stack(p, frames, 9, 7);
  p.threads = {{7, "deep"}};
  folded_options opts;
  opts.thread_roots = true;
  const auto text = write_folded(p, opts);
  CHECK(text.size() < 65536);
  CHECK(text.size() > 60000);
  CHECK(text.rfind("[deep tid=7];[truncated];frame_number_", 0) == 0);
  CHECK(text.find(";frame_number_19999 9\n") != std::string::npos);
  CHECK(text.find(";frame_number_0;") == std::string::npos);
  // Round trip of the truncated line is stable too.
  const auto r = parse_folded(text, "deep");
  CHECK(r.ok());
  CHECK(r.prof.stacks.at(0).truncated);
  CHECK(write_folded(r.prof, opts) == text);
}

TEST_CASE("folded: a custom line limit and a single frame longer than it") {
  selfprof::profile p;
  add_frame(p, std::string(500, 'a'), "", 0);
  add_frame(p, "b", "", 0);
  add_stack(p, {1, 0}, 1);
  folded_options opts;
  opts.max_line_bytes = 100;
  const auto text = write_folded(p, opts);
  CHECK(text.size() <= 100);
  CHECK(text.rfind("[truncated];aaaa", 0) == 0);
  opts.max_line_bytes = 0;  // no limit
  CHECK(write_folded(p, opts).size() == 2 + 500 + 3);
}

TEST_CASE("folded parse: write → parse → write is byte-identical") {
  for (bool roots : {false, true}) {
    folded_options opts;
    opts.thread_roots = roots;
    for (const auto& p : {basic_profile(), many_profile(2000)}) {
      const auto text = write_folded(p, opts);
      const auto r = parse_folded(text, "mem");
      CHECK(r.ok());
      CHECK(r.warnings.empty());
      CHECK(write_folded(r.prof, opts) == text);
      CHECK(write_folded(r.prof) == write_folded(r.prof, opts));  // roots are now data
    }
  }
}

TEST_CASE("folded parse: frames, kinds, markers, threads and totals") {
  const auto r = parse_folded(
      "[web tid=42];[truncated];a;b_[k] 3\n"
      "[tid=43];a;j_[j];i_[i] 2\n"
      "a;b 1\n"
      "a;b 4\n"
      "x_[w];[truncated] 1\n",
      "t.folded");
  REQUIRE(r.ok());
  const auto& p = r.prof;
  CHECK(p.stacks.size() == 4);
  CHECK(p.info.samples == 11);
  CHECK(p.info.truncated == 3);
  CHECK(p.thread_name(42) == "web");
  CHECK(p.thread_name(43) == "");
  CHECK(p.threads.size() == 2);
  const auto& s0 = p.stacks[0];
  CHECK(s0.tid == 42);
  CHECK(s0.truncated);
  CHECK(p.frames[s0.frames[0]].kind == frame_kind::marker);
  CHECK(p.frames[s0.frames[1]].kind == frame_kind::marker);
  CHECK(p.frames[s0.frames[3]].name == "b");
  CHECK(p.frames[s0.frames[3]].kind == frame_kind::kernel);
  CHECK(p.frames[p.stacks[1].frames[2]].kind == frame_kind::jit);
  CHECK(p.frames[p.stacks[1].frames[3]].kind == frame_kind::inlined);
  CHECK(p.stacks[2].count == 5);  // identical lines merged
  // `_[w]` is not a kind: kept in the name; [truncated] at the leaf side is an ordinary name.
  CHECK(p.frames[p.stacks[3].frames[0]].name == "x_[w]");
  CHECK_FALSE(p.stacks[3].truncated);
  // "a" and "b" (native) are interned once; "b" kernel is a different frame.
  int a_frames = 0;
  for (const auto& f : p.frames) a_frames += f.name == "a";
  CHECK(a_frames == 1);
}

TEST_CASE("folded parse: a recording's process roots keep their cut stacks' [truncated] marker and count") {
  const std::string text =
      "cc1plus;[truncated];f;g 5\n"
      "cc1plus;_start;main;f 3\n"
      "sh;[truncated] 1\n";  // at the leaf: an ordinary name
  const auto r = parse_folded(text, "merged.folded");
  REQUIRE(r.ok());
  const auto& p = r.prof;
  CHECK(p.info.samples == 9);
  CHECK(p.info.truncated == 5);
  REQUIRE(p.stacks.size() == 3);
  CHECK(p.stacks[0].truncated);
  CHECK(p.frames[p.stacks[0].frames[1]].kind == frame_kind::marker);
  CHECK(p.frames[p.stacks[0].frames[0]].kind == frame_kind::native);  // one cc1plus tower
  CHECK(p.stacks[0].frames[0] == p.stacks[1].frames[0]);
  CHECK_FALSE(p.stacks[2].truncated);
  // Written back as read: no second marker above the root.
  CHECK(write_folded(p) == "cc1plus;[truncated];f;g 5\ncc1plus;_start;main;f 3\nsh;[truncated] 1\n");
}

TEST_CASE("folded parse: every dialect: flamegraph.pl, inferno, speedscope, Pyroscope, difffolded") {
  const std::string text =
      "# comment line\n"
      "\n"
      "main;f 10\r\n"     // CRLF
      "main;g\t5\n"       // tab separator
      "  main;h   7  \n"  // surrounding and repeated spaces
      "main;k 2.5\n"      // flamegraph.pl fraction
      "main;m 3.\n"       // Perl accepts "3."
      "main;z 0\n"        // zero: no stack
      "main;last 1";      // no final LF
  const auto r = parse_folded(text, "dialects.folded");
  CHECK(r.ok());
  CHECK(r.lines == 9);
  CHECK(r.comment_lines == 2);
  CHECK(r.zero_count_lines == 1);
  CHECK(r.fractional_lines == 1);
  REQUIRE(r.warnings.size() == 1);
  CHECK(r.warnings[0].to_string().rfind("dialects.folded:6: fractional count '2.5'", 0) == 0);
  CHECK(write_folded(r.prof) == "main;f 10\nmain;g 5\nmain;h 7\nmain;k 2\nmain;last 1\nmain;m 3\n");
}

TEST_CASE("folded parse: malformed lines are skipped and reported with their line numbers") {
  const std::string text =
      "good 1\n"
      "no_count_here\n"
      "bad -1\n"
      "bad 1e3\n"
      " 5\n"
      "huge 99999999999999999999999\n"
      "also good 2\n";
  const auto r = parse_folded(text, "in.folded");
  CHECK_FALSE(r.ok());
  CHECK(r.ignored_lines == 5);
  REQUIRE(r.errors.size() == 5);
  CHECK(r.errors[0].to_string() == "in.folded:2: no count at the end of the line");
  CHECK(r.errors[1].line == 3);
  CHECK(r.errors[1].message.find("'-1'") != std::string::npos);
  CHECK(r.errors[2].line == 4);
  CHECK(r.errors[3].to_string() == "in.folded:5: no count at the end of the line");
  CHECK(r.errors[4].line == 6);
  CHECK(write_folded(r.prof) == "also good 2\ngood 1\n");
}

TEST_CASE("folded parse: differential lines keep both columns") {
  const auto r = parse_folded("a;b 3 5\na;c 4 0\na;d 0 2\n", "diff");
  CHECK(r.ok());
  CHECK(r.differential);
  REQUIRE(r.prof.stacks.size() == 3);
  CHECK(r.before_counts == std::vector<std::uint64_t>{3, 4, 0});
  CHECK(r.prof.stacks[0].count == 5);
  CHECK(r.prof.stacks[1].count == 0);
  CHECK(write_folded(r.prof) == "a;b 5\na;d 2\n");
}

TEST_CASE("folded parse: binary garbage and empty input do not crash") {
  std::string junk;
  for (int i = 0; i < 4096; ++i) junk += static_cast<char>((i * 131 + 7) & 0xFF);
  const auto r = parse_folded(junk, "junk");
  CHECK(r.lines > 0);
  CHECK(r.errors.size() <= selfprof::folded_parse_result::max_reported);
  (void)write_folded(r.prof);
  const auto e = parse_folded("", "empty");
  CHECK(e.ok());
  CHECK(e.lines == 0);
  CHECK(e.prof.stacks.empty());
  CHECK(write_folded(e.prof).empty());
}

TEST_CASE("folded parse: the detail:: spelling of the entry point works") {
  selfprof::detail::folded_parse_result r = selfprof::detail::parse_folded("x 1\n", "s");
  CHECK(r.prof.stacks.size() == 1);
}
