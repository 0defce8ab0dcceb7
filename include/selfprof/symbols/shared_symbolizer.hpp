// The process's one symbolizer behind a lock: the collector refreshes its module snapshot while
// libraries come and go (so samples in a library unloaded later keep their names), dumps read it.
// Context: any thread except the signal handler.
#pragma once

#include <time.h>

#include <mutex>
#include <new>
#include <utility>
#include <vector>

#include "selfprof/symbols/symbolizer.hpp"

namespace selfprof {
namespace detail {

constexpr int kForkWaitMs = 100;

class shared_symbolizer {
 public:
  // Which DWARF later dumps read for file:line and inline frames (SELFPROF_LINES).
  void set_lines(lines_mode mode) {
    std::lock_guard<std::mutex> lock(mu_);
    sym_.set_lines(mode);
  }
  // Re-reads the mapped modules (parsing the new ones).
  void refresh() {
    std::lock_guard<std::mutex> lock(mu_);
    sym_.refresh();
  }
  // Re-reads the maps unconditionally (symbolizer::rescan); returns the executable ranges mapped now.
  std::vector<code_range> rescan() {
    std::lock_guard<std::mutex> lock(mu_);
    sym_.rescan();
    return sym_.code_ranges();
  }
  std::vector<code_range> code_ranges() {
    std::lock_guard<std::mutex> lock(mu_);
    return sym_.code_ranges();
  }
  // The perf map reader, for naming JIT samples while sampling (null when perf maps are not used);
  // internally locked, valid as long as this object. Read on under this lock (poll_jit_map), which
  // fork() takes, so a child never inherits a half-read map.
  perf_map* jit_map() { return sym_.perf_map_if_used(); }
  void poll_jit_map() {
    std::lock_guard<std::mutex> lock(mu_);
    if (perf_map* m = sym_.perf_map_if_used()) m->reload_if_changed();
  }
  // Runs `use(symbolizer&)` under the lock, after a refresh.
  template <class Use>
  auto with_fresh(Use&& use) -> decltype(use(std::declval<symbolizer&>())) {
    std::lock_guard<std::mutex> lock(mu_);
    sym_.refresh();
    return use(sym_);
  }
  // Runs `use(symbolizer&)` under the lock with the modules recorded so far (no refresh: nothing parsed).
  template <class Use>
  auto with_current(Use&& use) -> decltype(use(std::declval<symbolizer&>())) {
    std::lock_guard<std::mutex> lock(mu_);
    return use(sym_);
  }
  // Runs `work` under the lock (work that fork() must not cut in half: the unwind-row rebuild).
  template <class Work>
  void locked(Work&& work) {
    std::lock_guard<std::mutex> lock(mu_);
    work();
  }
  std::mutex& lock_for_fork() { return mu_; }
  // fork(2) prepare: takes the lock if it comes within kForkWaitMs (a module scan or unwind-row build
  // does; naming a large profile may not). Returns whether it was taken.
  bool lock_for_fork_briefly() {
    for (int waited_ms = 0;; ++waited_ms) {
      if (mu_.try_lock()) return true;
      if (waited_ms >= kForkWaitMs) return false;
      struct timespec step {
        0, 1000 * 1000
      };
      ::nanosleep(&step, nullptr);
    }
  }
  // fork(2) child. Without the lock, another thread of the parent may have been inside the symbolizer:
  // it starts afresh here (the old one is leaked, not destroyed half-changed).
  void abandon_after_fork(bool was_locked = true) {
    new (&mu_) std::mutex();
    if (was_locked) {
      sym_.abandon_after_fork();
      return;
    }
    new (&sym_) symbolizer();
  }

 private:
  std::mutex mu_;
  symbolizer sym_;
};

}  // namespace detail
}  // namespace selfprof
