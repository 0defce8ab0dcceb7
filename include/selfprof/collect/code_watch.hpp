// What the sample store knows of executable memory while sampling: the ranges mapped at the last module
// scan, whether a sample has landed outside all of them since (then the collector reads the maps again,
// so code mapped and unmapped between two dumps, such as V8's second mapping of its builtins, is
// recorded with its symbols while it exists), the perf map that names a pc in anonymous code by the
// line that was current when the sample was taken, and which modules with unparsed unwind rows samples
// reached (the collector parses their rows next: unwind/tables.hpp builds lazily).
// Context: the sample store, under its lock (translate); the collector thread (set_ranges, via the store).
#pragma once

#include <algorithm>
#include <cstdint>
#include <utility>
#include <vector>

#include "selfprof/detail/stack_table.hpp"
#include "selfprof/jit/registry.hpp"
#include "selfprof/symbols/perf_map.hpp"
#include "selfprof/symbols/symbolizer.hpp"
#include "selfprof/unwind/tables.hpp"

namespace selfprof {
namespace detail {

class code_watch {
 public:
  void set_ranges(std::vector<code_range> ranges) {
    ranges_ = std::move(ranges);
    last_ = 0;
  }
  void set_perf_map(const perf_map* map) { map_ = map; }
  // Code of modules whose unwind rows are not parsed yet (by start address).
  void set_pending_rows(std::vector<pending_code> code) {
    pending_ = std::move(code);
    asked_.assign(pending_.size(), false);
  }

  // Notes whether `pc` lies in known code; a pc in anonymous (or unknown) memory becomes a perf-map
  // tagged value when a line covers it. Values already tagged by the JIT registry pass through.
  void translate(std::uint64_t& pc, std::uint64_t time_ns) {
    // Kernel pcs (the ring source's kernel call chains) are named from kallsyms, not from mappings.
    if (is_jit_tagged(pc) || is_perf_map_tagged(pc) || is_kernel_address(pc)) return;
    const code_range* r = find(pc);
    if (r == nullptr) unknown_ = true;
    if ((r == nullptr || r->anonymous) && map_ != nullptr) map_->tag(pc, time_ns);
    if (!pending_.empty()) note_pending(pc);
  }

  // A pc in each pending module samples reached since the last call (once per module).
  std::vector<std::uint64_t> take_row_requests() { return std::exchange(requests_, {}); }

  // True once since a sample landed outside every known range.
  bool take_unknown() { return std::exchange(unknown_, false); }
  void forget() {
    ranges_.clear();
    last_ = 0;
    unknown_ = false;
    pending_.clear();
    asked_.clear();
    requests_.clear();
  }

 private:
  void note_pending(std::uint64_t pc) {
    const pending_code* c = find_pending(pending_, pc);
    if (c == nullptr) return;
    const std::size_t i = static_cast<std::size_t>(c - pending_.data());
    if (asked_[i]) return;
    asked_[i] = true;
    requests_.push_back(pc);
  }

  const code_range* find(std::uint64_t pc) {
    if (last_ < ranges_.size() && pc >= ranges_[last_].start && pc < ranges_[last_].end)
      return &ranges_[last_];
    auto it = std::upper_bound(ranges_.begin(), ranges_.end(), pc,
                               [](std::uint64_t a, const code_range& r) { return a < r.start; });
    if (it == ranges_.begin()) return nullptr;
    --it;
    if (pc >= it->end) return nullptr;
    last_ = static_cast<std::size_t>(it - ranges_.begin());
    return &*it;
  }

  std::vector<code_range> ranges_;  // by start address
  std::size_t last_ = 0;            // the range found last: consecutive pcs are mostly in one module
  const perf_map* map_ = nullptr;
  bool unknown_ = false;
  std::vector<pending_code> pending_;    // code whose unwind rows are not parsed, by start address
  std::vector<bool> asked_;              // per pending_ entry: already in requests_ since it was set
  std::vector<std::uint64_t> requests_;  // a pc in each pending module samples reached
};

}  // namespace detail
}  // namespace selfprof
