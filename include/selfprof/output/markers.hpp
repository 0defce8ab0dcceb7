// Marker frames made explicit: per-thread root frames and `[truncated]` become frames of the profile,
// so every writer (folded, SVG, top, pprof) shows the same stacks.
// Context: any thread except the signal handler.
#pragma once

#include <map>
#include <string>

#include "selfprof/output/folded.hpp"
#include "selfprof/profile.hpp"

namespace selfprof {
namespace detail {

// Synthetic frames (frame_kind::marker) added to a profile once per name: marker(name) is its index.
class marker_frames {
 public:
  explicit marker_frames(profile& p) : p_(p) {}
  std::uint32_t operator()(const std::string& name) {
    auto it = made_.find(name);
    if (it != made_.end()) return it->second;
    frame f;
    f.name = name;
    f.kind = frame_kind::marker;
    p_.frames.push_back(f);
    auto index = static_cast<std::uint32_t>(p_.frames.size() - 1);
    made_.emplace(name, index);
    return index;
  }

 private:
  profile& p_;
  std::map<std::string, std::uint32_t> made_;
};

inline void add_marker_frames(profile& p, bool thread_roots) {
  marker_frames marker(p);
  for (stack& s : p.stacks) {
    std::size_t first = 0;
    bool has_root = !s.frames.empty() && is_marker(p, s.frames[0], is_thread_root_name);
    if (has_root) first = 1;
    std::vector<std::uint32_t> head;
    if (thread_roots && !has_root) head.push_back(marker(thread_root_name(s.tid, p.thread_name(s.tid))));
    if (s.truncated && !has_truncated_marker(p, s, first))
      head.push_back(marker(std::string(truncated_marker)));
    if (head.empty()) continue;
    s.frames.insert(s.frames.begin() + static_cast<std::ptrdiff_t>(first), head.begin(), head.end());
  }
}

// The off-CPU part of a wall profile: only the stacks of time spent off the CPU, same frames and threads.
inline profile offcpu_view(const profile& wall) {
  profile p;
  p.frames = wall.frames;
  p.threads = wall.threads;
  p.info = wall.info;
  p.info.mode = profile_mode::offcpu;
  std::uint64_t total = 0, truncated = 0;
  for (const stack& s : wall.stacks) {
    if (!s.offcpu) continue;
    p.stacks.push_back(s);
    total += s.count;
    if (s.truncated) truncated += s.count;
  }
  p.info.samples = total;
  p.info.truncated = truncated;
  return p;
}

}  // namespace detail
}  // namespace selfprof
