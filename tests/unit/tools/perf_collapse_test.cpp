// Unit tests of the perf-script collapser (tools/selfprof/perf_collapse.hpp): the regex
// emulations and edge cases, each expectation checked against stackcollapse-perf.pl's real output.
#include <doctest/doctest.h>

#include <string>

#include "args.hpp"
#include "perf_collapse.hpp"

using selfprof_cli::perf_collapse_options;
using selfprof_cli::perf_collapser;

namespace {
std::string collapse(const std::string& text, perf_collapse_options o = {}) {
  perf_collapser c(o);
  c.feed_text(text);
  return c.result();
}

const char* const mixed =
    "V8 WorkerThread 24636/25607 [000] 94564.109216: 100 cycles:\n"
    "\t7f00 foo+0x1a (/usr/lib/libfoo.so)\n"
    "\t7f01 [unknown] (/usr/lib/libbar.so.1)\n"
    "\t7f02 [unknown] ([unknown])\n"
    "\t7f03 bar(int, char) (/usr/bin/app)\n"
    "\t7f04 net/http.(*Client).Do (/usr/bin/go)\n"
    "\t7f05 (anonymous namespace)::f(int) (/usr/bin/app)\n"
    "\t7f06 a;b'\"c (/usr/bin/app)\n"
    "\t7f07 (sh) (/usr/bin/app)\n"
    "\n"
    "java 12688/12764 6544038.708352: 10309278 cpu-clock:\n"
    "\tffffffff8103ce3b native_safe_halt ([kernel.kallsyms])\n"
    "\t7f722d142778 Ljava/io/PrintStream;::print (/tmp/perf-19982.map)\n"
    "\t7f722d142779 Lfoo/A;::x->Lfoo/B;::y->z (/tmp/perf-19982.map)\n"
    "\t8c3453 tcp_sendmsg (/lib/modules/4.3.0/build/vmlinux)\n"
    "\n"
    "swapper     0/0     [000] 1.0:          0 cycles:\n"
    "\tffffffff81 cpu_idle ([kernel.kallsyms])\n"
    "\n"
    "perf 5 1.0: 7 instructions:\n"
    "\t1 x (m)\n"
    "\n"
    "perf 5 1.0: 18446744073709551615 cycles:\n"
    "\t1 x (m)\n"
    "\n"
    "perf 5 1.0: 18446744073709551615 cycles:\n"
    "\t1 x (m)\n"
    "\n"
    "garbage here\n";
}  // namespace

TEST_CASE("perf collapse: tidying, unknown frames, first-event filtering, Perl number overflow") {
  perf_collapser c;
  c.feed_text(mixed);
  CHECK(c.result() ==
        "V8_WorkerThread;a:bc;net/http.(*Client).Do;bar;[unknown];[libbar.so.1];foo 100\n"
        "perf;x 3.68934881474191e+19\n"
        "swapper;cpu_idle 1\n");
  CHECK(c.kept_event() == "cycles");
  CHECK(c.filtered_event() == "cpu-clock");
  CHECK(c.unrecognized_lines() == 1);
  REQUIRE(c.unrecognized().size() == 1);
  CHECK(c.unrecognized()[0].line == 29);
  CHECK(c.unrecognized()[0].text == "garbage here");
}

TEST_CASE("perf collapse: --pid --tid --addrs --kernel root frames and annotations") {
  perf_collapse_options o;
  o.tid = true;
  CHECK(collapse(mixed, o).find("swapper-?/0;cpu_idle 1\n") !=
        std::string::npos);  // tid "0" is false in Perl
  CHECK(collapse(mixed, o).find("V8_WorkerThread-24636/25607;") == 0);
  o = {};
  o.pid = true;
  CHECK(collapse(mixed, o).find("perf-?;x ") != std::string::npos);
  o = {};
  o.addrs = true;
  CHECK(collapse(mixed, o).find(";[unknown <7f02>];[libbar.so.1 <7f01>];foo 100") != std::string::npos);
  o = {};
  o.kernel = o.jit = true;
  o.event_filter = "cpu-clock";
  CHECK(collapse(mixed, o) ==
        "java;tcp_sendmsg_[k];foo/A:::x_[j];foo/B:::y_[i];z_[i];java/io/"
        "PrintStream:::print_[j];native_safe_halt_[k] "
        "10309278\n");
}

TEST_CASE("perf collapse: periods, zero periods and a last event without a blank line") {
  // No blank line after the last event: Perl never stores it.
  CHECK(collapse("prog 1 x: 5 ev:\n\t1 f (m)\n").empty());
  // comm needs two bytes, so "a 1 x:" is the comm here; "00" is true in Perl and adds 0.
  CHECK(collapse("a 1 x: 00 ev:\n\t1 f (m)\n\n") == "a_1_x:;f 0\n");
  // "0" is false: counted as 1. No period printed: 1.
  CHECK(collapse("prog 7 1.0: 0 ev:\n\t1 f (m)\n\nprog 7 1.0: ev:\n\t1 f (m)\n\n") == "prog;f 2\n");
  // An event with no frames still counts for the process.
  CHECK(collapse("prog 7 1.0: 3 ev:\n\n") == "prog 3\n");
  // Stack lines before any event line are ignored.
  CHECK(collapse("\t1 f (m)\n\n").empty());
}

TEST_CASE("perf collapse: inline chains, empty parts and regex backtracking corners") {
  // split /->/ keeps inner empty parts and drops trailing ones; "ab (m)" splits into pc "a", symbol "b";
  // "1  (m)" gives the symbol " ".
  CHECK(collapse("a 1/2 x: 1 ev:\n\tab (m)\n\t12 c->->d-> (m)\n\t1  (m)\n\n") ==
        "a_1/2_x:; ;c;_[i];d_[i];b 1\n");
}

TEST_CASE("perf script line matchers") {
  namespace cli = selfprof_cli;
  cli::perf_event_match ev;
  REQUIRE(cli::match_perf_event_line("kworker/0:1 123 [000] 1.0: 5 cycles:", ev));
  CHECK(ev.comm == "kworker/0:1");
  CHECK(ev.pid == "123");
  CHECK(ev.tid.empty());
  CHECK_FALSE(cli::match_perf_event_line("\tffff foo (bar)", ev));
  CHECK_FALSE(cli::match_perf_event_line("x", ev));

  cli::perf_period_match pm;
  REQUIRE(cli::match_perf_period("sh 31036  1877.944109:    1001001 cpu-clock:ppp: ", pm));
  CHECK(pm.period == "1001001");
  CHECK(pm.event == "cpu-clock:ppp");
  REQUIRE(cli::match_perf_period("java 1 2.0: cycles:", pm));
  CHECK(pm.period.empty());
  CHECK_FALSE(cli::match_perf_period("perf 1 1.0: 1 sched:sched_switch: prev=1", pm));

  cli::perf_stack_match st;
  REQUIRE(cli::match_perf_stack_line("\t    7f00 foo (bar) (/lib/x.so)", st));
  CHECK(st.pc == "7f00");
  CHECK(st.rawfunc == "foo (bar)");
  CHECK(st.module == "/lib/x.so");
  CHECK_FALSE(cli::match_perf_stack_line("\t7f00 foo", st));

  CHECK(cli::strip_symbol_offset("main+0x1f") == "main");
  CHECK(cli::strip_symbol_offset("main+0x1F") == "main+0x1F");  // uppercase is not stripped
  CHECK(cli::looks_like_go_method("net/http.(*Client).Do"));
  CHECK_FALSE(cli::looks_like_go_method("f(int).x"));
}

TEST_CASE("perf collapse: memory follows distinct stacks, not samples") {
  perf_collapser c;
  for (int i = 0; i < 5000; ++i) c.feed_text("pr 1 1.0: 2 ev:\n\t1 a (m)\n\t2 b (m)\n\n");
  CHECK(c.distinct_stacks() == 1);
  CHECK(c.samples() == 5000);
  CHECK(c.result() == "pr;b;a 10000\n");
}

TEST_CASE("cli args: long, short, prefixes, values and errors") {
  using namespace selfprof_cli;
  const std::vector<option_spec> specs = {
      {"colors", 0, true}, {"countname", 0, true}, {"inverted", 'i', false}, {"output", 'o', true}};
  auto run = [&](std::vector<const char*> v, parsed_args& a) {
    v.insert(v.begin(), {"selfprof", "cmd"});
    return parse_args(static_cast<int>(v.size()), const_cast<char**>(v.data()), 2, specs, a);
  };
  parsed_args a;
  REQUIRE(run({"--color=java", "-i", "-o", "x.svg", "in.folded", "-"}, a));
  CHECK(a.get("colors") == "java");
  CHECK(a.has("inverted"));
  CHECK(a.get("output") == "x.svg");
  CHECK(a.positional == std::vector<std::string>{"in.folded", "-"});
  parsed_args b;
  selfprof::status st = run({"--co=x"}, b);
  CHECK_FALSE(st);
  CHECK(st.message().find("ambiguous") != std::string::npos);
  parsed_args c;
  CHECK_FALSE(run({"--nope"}, c));
  parsed_args d;
  CHECK_FALSE(run({"--output"}, d));
}
