// Wall-clock profiling: where the threads of a request pipeline wait, not only where they run.
//
//   ./example_wall [seconds] [output-prefix]
//
// A request thread waits on a mutex that a slow worker holds, and on a pipe that a timer thread feeds
// slowly (scenario.hpp). A CPU profile would show only the worker's computing; the wall profile also
// shows the request's two waits, and the off-CPU profile (written next to it) shows nothing else.
#include <selfprof.hpp>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "scenario.hpp"

int main(int argc, char** argv) {
  double seconds = argc > 1 ? std::atof(argv[1]) : 3;
  std::string prefix = argc > 2 ? argv[2] : "wall";
  selfprof::options o = selfprof::options_from_env();
  o.mode = selfprof::profile_mode::wall;
  if (selfprof::status st = selfprof::start(o); !st) {
    std::fprintf(stderr, "%s\n", st.message().c_str());
    return 1;
  }
  wall_scenario::requests r;
  int served = r.run(seconds);
  selfprof::stop();

  selfprof::stats s = selfprof::get_stats();
  std::printf("served %d requests in %.1f s (source: %s)\n", served, seconds, s.source_detail.c_str());
  std::printf(
      "wall sampler: %llu ticks, %llu looks (%llu unchanged), %llu stacks copied, %.2f ms of its own CPU\n",
      static_cast<unsigned long long>(s.wall.ticks), static_cast<unsigned long long>(s.wall.looks),
      static_cast<unsigned long long>(s.wall.unchanged), static_cast<unsigned long long>(s.wall.copies),
      static_cast<double>(s.wall.cpu_ns) / 1e6);

  // Where the request thread waited: off-CPU time by the leaf-most named function.
  selfprof::profile off = selfprof::snapshot_offcpu();
  struct row {
    std::string where;
    std::uint64_t us;
  };
  std::vector<row> rows;
  for (const auto& st : off.stacks) {
    if (off.thread_name(st.tid) != "request" || st.frames.size() < 2) continue;
    std::string where;
    for (auto i = st.frames.size(); i-- > 0;) {
      const std::string& n = off.frames[st.frames[i]].name;
      if (n == "wall_scenario::requests::read_reply()" || n == "wall_scenario::requests::take_lock()") {
        where = n + " " + off.frames[st.frames.back()].name;
        break;
      }
    }
    if (where.empty()) where = "elsewhere " + off.frames[st.frames.back()].name;
    auto it = std::find_if(rows.begin(), rows.end(), [&](const row& r) { return r.where == where; });
    if (it == rows.end())
      rows.push_back({where, st.count});
    else
      it->us += st.count;
  }
  std::sort(rows.begin(), rows.end(), [](const row& a, const row& b) { return a.us > b.us; });
  std::printf("off-CPU time of the request thread:\n");
  for (const auto& r : rows)
    std::printf("  %10.1f ms  %s\n", static_cast<double>(r.us) / 1e3, r.where.c_str());

  // A wall profile's dump also writes its off-CPU part: <prefix>-offcpu.svg and .folded.
  std::string paths = prefix + ".svg," + prefix + ".folded";
  selfprof::status st = selfprof::dump(paths);
  if (!st) {
    std::fprintf(stderr, "%s\n", st.message().c_str());
    return 1;
  }
  std::printf("wrote %s.svg (wall clock, [blocked: ...] frames in blue) and %s-offcpu.svg (off-CPU only)\n",
              prefix.c_str(), prefix.c_str());
  return 0;
}
