// selfprof dump: asks a running profiled process for its profile over its control socket
// (@selfprof-<pid>, serve/server.hpp) — no signal is sent, so no thread of it sees EINTR.
#include <unistd.h>

#include <cstdio>
#include <string>
#include <vector>

#include "args.hpp"
#include "commands.hpp"
#include "selfprof/output/format.hpp"
#include "selfprof/output/sink.hpp"
#include "selfprof/serve/client.hpp"

namespace selfprof_cli {
namespace {

const char* const dump_help =
    "usage: selfprof dump PID [-o OUT] [--seconds N] [--format svg|folded|pprof|top] [--view wall|offcpu]\n"
    "\n"
    "Asks process PID, profiled by selfprof (linked in, or run under `selfprof record`), for its profile\n"
    "through its control socket @selfprof-PID. Unlike kill -USR2 no signal is sent: no thread of the\n"
    "process has a blocking call cut short. The process must run as your user (or you as root); the\n"
    "socket is checked to belong to PID.\n"
    "\n"
    "options:\n"
    "  -o, --output=PATH     write there (atomically, mode 0600) instead of stdout; its extension picks\n"
    "                        the format (.svg .folded .txt .pb.gz) unless --format says\n"
    "  --seconds=N           the profile of the next N seconds (default: everything since profiling\n"
    "                        started, like kill -USR2)\n"
    "  --format=FORMAT       svg (default), folded, pprof or top\n"
    "  --view=VIEW           wall mode only: wall (default) or offcpu\n"
    "  --timeout=SECONDS     give up after this long past --seconds (default 60)\n"
    "  -h, --help            this text\n"
    "\n"
    "examples:\n"
    "  selfprof dump 1234 -o now.svg\n"
    "  selfprof dump 1234 --seconds 10 --format pprof -o cpu.pb.gz && go tool pprof -top cpu.pb.gz\n";

}  // namespace

int run_dump(int argc, char** argv) {
  static const std::vector<option_spec> specs = {
      {"output", 'o', true}, {"seconds", 0, true}, {"format", 0, true},
      {"view", 0, true},     {"timeout", 0, true}, {"help", 'h', false},
  };
  parsed_args a;
  selfprof::status st = parse_args(argc, argv, 2, specs, a);
  if (!st) return fail("dump", st.message(), 2);
  if (a.has("help")) {
    std::fputs(dump_help, stdout);
    return 0;
  }
  if (a.positional.size() != 1) return fail("dump", "expected one PID (see selfprof dump --help)", 2);
  unsigned long long pid = 0;
  if (!parse_uint_arg(a.positional[0], 1, 4194304, pid))
    return fail("dump", "'" + a.positional[0] + "' is not a process id", 2);
  const std::string out = a.get("output");
  std::string format = a.get("format");
  if (format.empty() && !out.empty()) {
    const selfprof::format_lookup f = selfprof::format_for_path(out);
    if (!f.result) return fail("dump", f.result.message(), 2);
    format = selfprof::format_name(f.format);
  }
  if (format.empty()) format = "svg";
  std::string path;
  if (format == "svg")
    path = "/debug/selfprof/flamegraph.svg";
  else if (format == "folded")
    path = "/debug/selfprof/folded";
  else if (format == "pprof")
    path = "/debug/pprof/profile";
  else if (format == "top")
    path = "/debug/selfprof/top";
  else
    return fail("dump", "--format: expected svg, folded, pprof or top, not '" + format + "'", 2);
  double seconds = 0, timeout = 60;
  if (a.has("seconds") && !parse_double_arg(a.get("seconds"), 0.001, 86400, seconds))
    return fail("dump", "--seconds: expected seconds from 0.001 to 86400, not '" + a.get("seconds") + "'", 2);
  if (a.has("timeout") && !parse_double_arg(a.get("timeout"), 0.001, 86400, timeout))
    return fail("dump", "--timeout: expected seconds, not '" + a.get("timeout") + "'", 2);
  std::string target =
      path + (a.has("seconds") ? "?seconds=" + a.get("seconds") : std::string("?since=start"));
  if (a.has("view")) {
    const std::string view = a.get("view");
    if (view != "wall" && view != "offcpu" && view != "cpu")
      return fail("dump", "--view: expected wall or offcpu, not '" + view + "'", 2);
    target += "&view=" + view;
  }

  socklen_t len = 0;
  const sockaddr_un un = selfprof::detail::control_socket_address(static_cast<long>(pid), len);
  selfprof::detail::http_reply reply;
  st = selfprof::detail::http_get(reinterpret_cast<const sockaddr*>(&un), len, target, seconds + timeout,
                                  reply, {}, static_cast<long>(pid));
  if (!st) {
    std::string why = "process " + std::to_string(pid) + ": " + st.message();
    if (st.code() == ECONNREFUSED || st.code() == ENOENT)
      why += " (no control socket @" + selfprof::detail::control_socket_name(static_cast<long>(pid)) +
             ": is the process running, profiled by selfprof, and without SELFPROF_CONTROL=0?)";
    return fail("dump", why);
  }
  if (reply.status != 200) {
    std::string body = reply.body;
    while (!body.empty() && body.back() == '\n') body.pop_back();
    return fail("dump",
                "process " + std::to_string(pid) + " answered " + std::to_string(reply.status) + ": " + body);
  }
  if (out.empty()) {
    if (std::fwrite(reply.body.data(), 1, reply.body.size(), stdout) != reply.body.size() ||
        std::fflush(stdout) != 0)
      return fail("dump", "cannot write to stdout");
    return 0;
  }
  st = selfprof::detail::write_file_atomic(out, reply.body);
  if (!st) return fail("dump", st.message());
  return 0;
}

}  // namespace selfprof_cli
