// selfprof collapse: `perf script` text -> folded stacks, byte-compatible with stackcollapse-perf.pl.
#include <unistd.h>

#include <cstdio>
#include <string>
#include <vector>

#include "args.hpp"
#include "commands.hpp"
#include "input.hpp"
#include "perf_collapse.hpp"
#include "selfprof/output/sink.hpp"

namespace selfprof_cli {
namespace {

const char* const collapse_help =
    "usage: selfprof collapse [options] [FILE...|-] > out.folded\n"
    "\n"
    "Reads the text of `perf script` (a file, several files read one after the other, or stdin when no\n"
    "file or `-` is given; gzip-compressed input is recognised) and prints one line per distinct stack:\n"
    "the process name as the root frame, then the frames from the outermost caller to the leaf, joined\n"
    "by ';', then a space and the count. The output is byte for byte what stackcollapse-perf.pl prints\n"
    "for the same input and options, so it feeds flamegraph.pl, inferno, speedscope and\n"
    "`selfprof flamegraph`.\n"
    "\n"
    "Counts are the sum of the sample periods perf printed (cycles, or nanoseconds for cpu-clock), or\n"
    "1 per sample when perf printed none. Only the first event type in the input is kept unless\n"
    "--event-filter names another: mixing cycles and page faults in one graph would mislead.\n"
    "Frames: `+0x..` offsets are removed; `a->b->c` inline chains (perf-map-agent) become three frames,\n"
    "the inner ones marked `_[i]`; an [unknown] symbol in a known module becomes [module-basename];\n"
    "arguments in parentheses are cut (except Go methods and (anonymous namespace)); quotes and ';' are\n"
    "removed or replaced.\n"
    "\n"
    "options:\n"
    "  --pid                 root frame is comm-PID\n"
    "  --tid                 root frame is comm-PID/TID (perf script -F comm,pid,tid,...)\n"
    "  --kernel              append _[k] to kernel frames (module [kernel.kallsyms], [mod], *vmlinux)\n"
    "  --jit                 append _[j] to frames named by /tmp/perf-PID.map\n"
    "  --all                 --kernel and --jit\n"
    "  --addrs               keep the address of unknown frames: [module <addr>]\n"
    "  --event-filter=EVENT  keep samples of EVENT (e.g. cycles, task-clock) instead of the first seen\n"
    "  -o, --output=FILE     write to FILE (atomically) instead of stdout\n"
    "  --strict              unrecognized lines are an error (exit 1) instead of a warning\n"
    "  -q, --quiet           no warnings or progress on stderr\n"
    "  -h, --help            this text\n"
    "\n"
    "Lines that are neither a comment, a blank line, an event line (`comm pid[/tid] ...: [period] event:`)\n"
    "nor a stack line (`addr symbol (module)`) are skipped, counted and reported with their file and line\n"
    "number. On a terminal, large inputs show progress on stderr.\n"
    "\n"
    "Exit status: 0 success, 1 unreadable input, write error or (--strict) an unrecognized line, 2 usage.\n"
    "\n"
    "example:\n"
    "  perf record -F 99 -a -g -- sleep 10 && perf script | selfprof collapse --all > out.folded\n";

}  // namespace

int run_collapse(int argc, char** argv) {
  using namespace selfprof::detail;
  static const std::vector<option_spec> specs = {
      {"pid", 0, false},    {"tid", 0, false},     {"kernel", 0, false},      {"jit", 0, false},
      {"all", 0, false},    {"addrs", 0, false},   {"event-filter", 0, true}, {"output", 'o', true},
      {"strict", 0, false}, {"quiet", 'q', false}, {"help", 'h', false},
  };
  parsed_args a;
  selfprof::status st = parse_args(argc, argv, 2, specs, a);
  if (!st) return fail("collapse", st.message(), 2);
  if (a.has("help")) {
    std::fputs(collapse_help, stdout);
    return 0;
  }
  perf_collapse_options o;
  o.pid = a.has("pid");
  o.tid = a.has("tid");
  o.kernel = a.has("kernel") || a.has("all");
  o.jit = a.has("jit") || a.has("all");
  o.addrs = a.has("addrs");
  o.event_filter = a.get("event-filter");
  const bool quiet = a.has("quiet"), strict = a.has("strict");
  std::vector<std::string> inputs = a.positional;
  for (auto& r : a.rest) inputs.push_back(r);
  if (inputs.empty()) inputs.push_back("-");

  perf_collapser c(o);
  std::size_t reported = 0;
  for (const std::string& path : inputs) {
    input_reader in;
    st = in.open(path);
    if (!st) return fail("collapse", st.message());
    progress_meter progress("selfprof collapse " + in.name(), in.size(), !quiet);
    const std::size_t before_lines = c.lines();
    st = for_each_line(
        in, [&](std::string_view line) { c.feed_line(line); }, &progress);
    if (!st) return fail("collapse", st.message());
    // Issues carry the running line number over all inputs; report them against this file.
    for (; reported < c.unrecognized().size(); ++reported) {
      const auto& is = c.unrecognized()[reported];
      if (!quiet || strict)
        std::fprintf(
            stderr,
            "selfprof collapse: %s:%zu: unrecognized line (expected a blank line, a # comment, an event "
            "line 'comm pid[/tid] ...: [period] event:' or a stack line 'addr symbol (module)'): %s\n",
            in.name().c_str(), is.line - before_lines, is.text.c_str());
    }
    if (strict && c.unrecognized_lines() > 0)
      return fail("collapse", std::to_string(c.unrecognized_lines()) + " unrecognized line(s) (--strict)");
  }
  if (!quiet) {
    if (!c.filtered_event().empty())
      std::fprintf(stderr,
                   "selfprof collapse: kept events of type %s; filtered out other types, first %s "
                   "(use --event-filter to choose)\n",
                   c.kept_event().c_str(), c.filtered_event().c_str());
    if (c.unrecognized_lines() > reported)
      std::fprintf(stderr, "selfprof collapse: %zu unrecognized line(s) skipped in all (first %zu shown)\n",
                   c.unrecognized_lines(), reported);
    if (c.samples() == 0) std::fprintf(stderr, "selfprof collapse: no samples found in the input\n");
  }
  const std::string out = c.result();
  const std::string path = a.get("output");
  if (!path.empty()) {
    st = write_file_atomic(path, out);
    if (!st) return fail("collapse", st.message());
    return 0;
  }
  if (write_all(1, out) != 0) return fail("collapse", "cannot write to stdout");
  return 0;
}

}  // namespace selfprof_cli
