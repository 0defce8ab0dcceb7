// selfprof: the command-line tool. Collapses `perf script` output, renders folded stacks as flame
// graphs, diffs, top lists and pprof, and records unmodified programs through the preload library.
#include <cstdio>
#include <cstring>
#include <string>

#include "commands.hpp"
#include "selfprof/version.hpp"

namespace selfprof_cli {

int fail(const char* cmd, const std::string& message, int code) {
  std::fprintf(stderr, "selfprof %s: %s\n", cmd, message.c_str());
  return code;
}

}  // namespace selfprof_cli

namespace {

const char* const usage_text =
    "usage: selfprof <command> [options] [args]\n"
    "\n"
    "The FlameGraph toolkit in one fast binary, plus a recorder for unmodified programs.\n"
    "\n"
    "commands:\n"
    "  collapse [FILE|-]         perf script text -> folded stacks (like stackcollapse-perf.pl)\n"
    "  flamegraph [FILE...|-]    folded stacks -> interactive SVG on stdout (like flamegraph.pl)\n"
    "  diff BEFORE AFTER         differential flame graph, or difffolded's columns with --folded\n"
    "  top FILE                  flat self/total ranking of the functions of a folded profile\n"
    "  pprof FILE -o OUT.pb.gz   folded stacks -> gzipped pprof protobuf (go tool pprof, Pyroscope)\n"
    "  record [-F HZ] [-o OUT] -- CMD [ARGS...]\n"
    "                            run CMD under the selfprof preload library; no root, no perf\n"
    "  dump PID [-o OUT] [--seconds N]\n"
    "                            ask a profiled process for its profile (no signal sent)\n"
    "\n"
    "Typical pipelines:\n"
    "  perf record -F 99 -g -- ./app && perf script | selfprof collapse | selfprof flamegraph > app.svg\n"
    "  selfprof record -o app.svg -- ./app\n"
    "\n"
    "`selfprof <command> --help` describes each command. `selfprof --version` prints the version.\n";

int dispatch(int argc, char** argv) {
  using namespace selfprof_cli;
  if (argc < 2) {
    std::fputs(usage_text, stderr);
    return 2;
  }
  const std::string cmd = argv[1];
  if (cmd == "--help" || cmd == "-h" || cmd == "help") {
    if (cmd == "help" && argc >= 3) {
      char help[] = "--help";
      char* args[] = {argv[0], argv[2], help, nullptr};
      return dispatch(3, args);
    }
    std::fputs(usage_text, stdout);
    return 0;
  }
  if (cmd == "--version" || cmd == "-V") {
    std::printf("selfprof %s\n", SELFPROF_VERSION_STRING);
    return 0;
  }
  if (cmd == "collapse") return run_collapse(argc, argv);
  if (cmd == "flamegraph") return run_flamegraph(argc, argv);
  if (cmd == "diff") return run_diff(argc, argv);
  if (cmd == "top") return run_top(argc, argv);
  if (cmd == "pprof") return run_pprof(argc, argv);
  if (cmd == "record") return run_record(argc, argv);
  if (cmd == "dump") return run_dump(argc, argv);
  std::fprintf(stderr, "selfprof: unknown command '%s'\n\n%s", cmd.c_str(), usage_text);
  return 2;
}

}  // namespace

int main(int argc, char** argv) { return dispatch(argc, argv); }
