// Turns the raw stack table into a profile value: addresses become frames (pc - 1 for return
// addresses), stacks become root-first frame lists.
// Context: any thread (never the signal handler); runs only when a profile is written.
#pragma once

#include <algorithm>
#include <cstdint>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "selfprof/collect/snapshot.hpp"
#include "selfprof/output/markers.hpp"
#include "selfprof/profile.hpp"
#include "selfprof/signal/ring.hpp"
#include "selfprof/symbols/symbolizer.hpp"
#include "selfprof/wall/syscalls.hpp"

namespace selfprof {
namespace detail {

// The leaf marker of an off-CPU stack: the system call it waits in, "[blocked]" when it waits outside
// one (a page fault, a stop), "[off-cpu]" when the sampler did not see where (no stack).
inline std::string offcpu_marker_name(std::uint16_t flags, std::size_t depth) {
  if (depth == 0) return "[off-cpu]";
  unsigned call = (flags & kSampleCallMask) >> kSampleCallShift;
  if (call == 0) return "[blocked]";
  return "[blocked: " + syscall_name(static_cast<long>(call) - 1) + "]";
}

// Appends to `out` one stack per entry of `table`, root first, with the wall-mode leaf markers; `root`
// (when not null) first in each, and a cut stack's [truncated] marker right below it, so that a root
// keeps its stacks, cut ones too, in one tower (without a root the writers put the marker first).
// `frames(lookup, s)` appends the frames of one address to s.frames (the
// interrupted pc as it is, a return address less one: it points after its call); `marker(name)` gives
// the index of a marker frame. Returns {samples, truncated samples}.
template <class Frames, class Marker>
std::pair<std::uint64_t, std::uint64_t> stacks_from_table(const stack_table& table, const std::uint32_t* root,
                                                          Frames&& frames, Marker&& marker,
                                                          std::vector<selfprof::stack>& out) {
  std::uint64_t samples = 0, truncated = 0;
  for (const auto& e : table.entries()) {
    const std::uint64_t* pcs = table.pcs(e);
    selfprof::stack s;
    s.count = e.count;
    s.tid = e.tid;
    s.truncated = (e.flags & sample_truncated) != 0;
    if (root) {
      s.frames.push_back(*root);
      if (s.truncated) s.frames.push_back(marker(std::string(truncated_marker)));
    }
    // Walk the captured addresses from the outermost return address to the interrupted pc.
    for (std::size_t i = e.depth; i-- > 0;) frames(i == 0 ? pcs[0] : pcs[i] - 1, s);
    if (e.flags & sample_offcpu) {
      s.offcpu = true;
      s.frames.push_back(marker(offcpu_marker_name(e.flags, e.depth)));
    } else if (e.flags & sample_running) {
      s.frames.push_back(marker("[running]"));
    }
    samples += e.count;
    if (s.truncated) truncated += e.count;
    out.push_back(std::move(s));
  }
  return {samples, truncated};
}

inline profile build_profile(const raw_snapshot& raw, symbolizer& sym) {
  profile p;
  p.info = raw.info;
  // lookup address -> [first frame, count) in p.frames
  std::unordered_map<std::uint64_t, std::pair<std::uint32_t, std::uint32_t>> cache;
  std::vector<selfprof::frame> scratch;
  auto frames_for = [&](std::uint64_t lookup) -> std::pair<std::uint32_t, std::uint32_t> {
    auto it = cache.find(lookup);
    if (it != cache.end()) return it->second;
    scratch.clear();
    sym.resolve(lookup, scratch);
    if (scratch.empty()) {
      selfprof::frame f;
      f.name = "[unknown]";
      f.address = lookup;
      scratch.push_back(f);
    }
    std::pair<std::uint32_t, std::uint32_t> range{static_cast<std::uint32_t>(p.frames.size()),
                                                  static_cast<std::uint32_t>(scratch.size())};
    for (auto& f : scratch) p.frames.push_back(std::move(f));
    cache.emplace(lookup, range);
    return range;
  };
  {
    std::vector<std::uint64_t> kernel;
    append_kernel_lookups(raw.table, kernel);
    if (!kernel.empty()) sym.prepare_kernel(std::move(kernel));
  }
  marker_frames marker(p);  // wall mode's leaves: where a thread waited, or time without a stack
  const auto counts = stacks_from_table(
      raw.table, nullptr,
      [&](std::uint64_t lookup, selfprof::stack& s) {
        auto r = frames_for(lookup);
        for (std::uint32_t k = 0; k < r.second; ++k) s.frames.push_back(r.first + k);
      },
      marker, p.stacks);
  const std::uint64_t samples = counts.first, truncated = counts.second;
  for (const auto& t : raw.thread_names) p.threads.push_back(thread_info{t.first, t.second});
  std::sort(p.threads.begin(), p.threads.end(),
            [](const thread_info& a, const thread_info& b) { return a.tid < b.tid; });
  p.info.samples = samples;
  p.info.truncated = truncated;
  for (auto& w : sym.take_warnings()) p.info.notes.push_back(w);
  return p;
}

}  // namespace detail
}  // namespace selfprof
