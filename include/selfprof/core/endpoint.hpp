// The routes of the profile endpoint and the control socket (serve/server.hpp): Go's
// /debug/pprof/profile and index, and selfprof's flame graph, folded and top forms, each either of the
// next N seconds or (since=start) of everything collected so far. Also the bearer token file.
// Context: the server thread (routes: quick copies only) and the render thread (the jobs); setup reads
// the token file.
//
// A profile of the next N seconds is the difference of two snapshots of the one running session, taken
// when the request arrives and N seconds later: concurrent requests share the same sampling (no second
// profiler) and each costs a copy of the stack table while it waits. A thread that ends meanwhile under
// the memory ceiling's thread merge may move a few of its earlier samples into the window under thread 0.
#pragma once

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <memory>
#include <string>
#include <utility>

#include "selfprof/core/snapshots.hpp"
#include "selfprof/dump/dump.hpp"
#include "selfprof/output/format.hpp"
#include "selfprof/output/markers.hpp"
#include "selfprof/serve/http.hpp"
#include "selfprof/serve/server.hpp"

namespace selfprof {
namespace detail {

constexpr double kDefaultProfileSeconds = 30;  // Go's default for /debug/pprof/profile

// Reads the bearer token from `path`: a regular file of ours that no one else may read (mode 0600 or
// 0400), its first line without surrounding blanks, at least 16 characters.
inline status read_token_file(const std::string& path, std::string& token) {
  auto bad = [&](const std::string& why) {
    return status::error("selfprof: SELFPROF_HTTP_TOKEN_FILE=\"" + path + "\": " + why);
  };
  const int fd = ::open(path.c_str(), O_RDONLY | O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) return bad(std::strerror(errno));
  struct stat sb {};
  std::string text;
  if (::fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode)) {
    ::close(fd);
    return bad("not a regular file");
  }
  if (sb.st_uid != ::geteuid()) {
    ::close(fd);
    return bad("belongs to uid " + std::to_string(sb.st_uid) + ", not to this process's user");
  }
  if (sb.st_mode & 077) {
    ::close(fd);
    return bad("other users may read or write it (chmod 600 it)");
  }
  char buf[4097];
  const ssize_t n = ::read(fd, buf, sizeof buf);
  ::close(fd);
  if (n < 0) return bad(std::strerror(errno));
  if (n > 4096) return bad("longer than 4096 bytes");
  text.assign(buf, static_cast<std::size_t>(n));
  const std::size_t eol = text.find('\n');
  if (eol != std::string::npos) text.resize(eol);
  while (!text.empty() && (text.back() == '\r' || text.back() == ' ' || text.back() == '\t')) text.pop_back();
  std::size_t start = 0;
  while (start < text.size() && (text[start] == ' ' || text[start] == '\t')) ++start;
  text.erase(0, start);
  if (text.size() < 16) return bad("the token must be at least 16 characters");
  for (char c : text)
    if (static_cast<unsigned char>(c) < 0x21 || static_cast<unsigned char>(c) > 0x7e)
      return bad("the token must be printable ASCII without spaces");
  token = std::move(text);
  return status::ok();
}

// What a profile route serves.
struct profile_route {
  output_format format = output_format::pprof;
  const char* content_type = "application/octet-stream";
  const char* extra = "";  // more response fields
};

inline bool find_profile_route(const std::string& path, profile_route& r) {
  if (path == "/debug/pprof/profile" || path == "/debug/selfprof/profile.pb.gz") {
    r = {output_format::pprof, "application/octet-stream",
         "Content-Disposition: attachment; filename=\"profile\"\r\n"};
    return true;
  }
  if (path == "/debug/selfprof/flamegraph.svg") {
    r = {output_format::svg, "image/svg+xml", ""};
    return true;
  }
  if (path == "/debug/selfprof/folded") {
    r = {output_format::folded, "text/plain; charset=utf-8", ""};
    return true;
  }
  if (path == "/debug/selfprof/top") {
    r = {output_format::top, "text/plain; charset=utf-8", ""};
    return true;
  }
  return false;
}

inline std::string endpoint_index(const options& o) {
  const bool wall = o.mode == profile_mode::wall;
  std::string b =
      "<html><head><title>/debug/pprof/</title></head><body>\n/debug/pprof/ "
      "(selfprof " SELFPROF_VERSION_STRING
      ")<br>\n<br>\nProfile descriptions:\n<ul>\n"
      "<li><div><a href=\"profile?seconds=30\">profile</a>: ";
  b += wall ? "Wall-clock profile (on and off the CPU, in nanoseconds)" : "CPU profile";
  b += ". You can specify the duration in the seconds GET parameter (at most " +
       format_compact(o.http_max_seconds) +
       "); since=start gives everything since profiling started. After you get the profile file, use the "
       "go tool pprof command to investigate the profile.</div></li>\n"
       "<li><div><a href=\"/debug/selfprof/flamegraph.svg?seconds=30\">flamegraph.svg</a>: the same as an "
       "interactive flame graph</div></li>\n"
       "<li><div><a href=\"/debug/selfprof/folded?seconds=30\">folded</a>: folded stacks "
       "(flamegraph.pl's input)</div></li>\n"
       "<li><div><a href=\"/debug/selfprof/top?seconds=30\">top</a>: functions ranked by self and total "
       "samples</div></li>\n";
  if (wall) b += "<li><div>view=offcpu on any of them: only the time threads spent off the CPU</div></li>\n";
  b += "</ul>\n</body></html>\n";
  return b;
}

// The response bytes for a profile: symbolized, marker frames added, the off-CPU view when asked.
inline std::string profile_response(snapshot_maker& snapshots, const raw_snapshot& raw,
                                    const profile_route& r, bool offcpu, bool thread_roots) {
  profile p = snapshots.symbolize(raw);
  add_marker_frames(p, thread_roots);
  if (offcpu) p = offcpu_view(p);
  const std::string body = render(p, r.format, dump_output_options(p));
  return http_response_head(200, r.content_type, body.size(), r.extra) + body;
}

// The route of both listeners: see the top of this file.
inline http_answer answer_request(snapshot_maker& snapshots, const options& o, const http_request& req) {
  http_answer a;
  auto bad = [&](int code, const std::string& why) {
    a.bytes = http_error_response(code, why);
    return a;
  };
  if (req.path == "/debug/pprof/" || req.path == "/debug/pprof" || req.path == "/") {
    const std::string body = endpoint_index(o);
    a.bytes = http_response_head(200, "text/html; charset=utf-8", body.size()) + body;
    return a;
  }
  profile_route route;
  if (!find_profile_route(req.path, route))
    return bad(404, "no such page: " + req.path + " (see /debug/pprof/)");
  for (const auto& kv : req.query)
    if (kv.first != "seconds" && kv.first != "since" && kv.first != "view")
      return bad(400, "unknown query parameter \"" + kv.first + "\" (seconds, since, view)");
  bool since_start = false;
  if (const std::string* s = req.param("since")) {
    if (*s != "start") return bad(400, "since=\"" + *s + "\": the one value is since=start");
    since_start = true;
  }
  bool offcpu = false;
  if (const std::string* v = req.param("view")) {
    if (*v == "offcpu" && o.mode == profile_mode::wall)
      offcpu = true;
    else if (!(*v == "wall" && o.mode == profile_mode::wall) && !(*v == "cpu" && o.mode == profile_mode::cpu))
      return bad(400, "view=\"" + *v + "\": " +
                          (o.mode == profile_mode::wall ? "wall or offcpu"
                                                        : "cpu (offcpu needs SELFPROF_MODE=wall)"));
  }
  double seconds = kDefaultProfileSeconds;
  if (const std::string* s = req.param("seconds")) {
    if (since_start) return bad(400, "seconds and since=start cannot be combined");
    double v = 0;
    if (!parse_double(s->c_str(), 0, 1e9, v) || !(v > 0))
      return bad(400, "seconds=\"" + *s + "\": expected a number of seconds greater than 0");
    if (v > o.http_max_seconds)
      return bad(400, "seconds=" + *s + " is over this server's maximum, " +
                          format_compact(o.http_max_seconds) + " (SELFPROF_HTTP_MAX_SECONDS)");
    seconds = v;
  }
  if (seconds > o.http_max_seconds) seconds = o.http_max_seconds;
  const bool roots = o.thread_roots || o.mode == profile_mode::wall;
  snapshot_maker* maker = &snapshots;
  if (since_start) {
    a.due = serve_clock::now();
    a.job = [maker, route, offcpu, roots] {
      return profile_response(*maker, maker->raw(), route, offcpu, roots);
    };
    return a;
  }
  auto before = std::make_shared<raw_snapshot>(snapshots.raw());
  a.due = serve_clock::now() +
          std::chrono::duration_cast<serve_clock::duration>(std::chrono::duration<double>(seconds));
  a.job = [maker, route, offcpu, roots, before] {
    raw_snapshot after = maker->raw();
    after.table = stack_table::difference(after.table, before->table);
    after.info.duration_s -= before->info.duration_s;
    after.info.dropped =
        after.info.dropped > before->info.dropped ? after.info.dropped - before->info.dropped : 0;
    after.info.start_unix_ns =
        before->info.start_unix_ns + static_cast<std::uint64_t>(before->info.duration_s * 1e9);
    return profile_response(*maker, after, route, offcpu, roots);
  };
  return a;
}

}  // namespace detail
}  // namespace selfprof
