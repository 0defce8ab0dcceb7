// The process's one symbolizer behind a lock: the collector refreshes its module snapshot while
// libraries come and go (so samples in a library unloaded later keep their names), dumps read it.
// Context: any thread except the signal handler.
#pragma once

#include <mutex>
#include <new>
#include <utility>
#include <vector>

#include "selfprof/symbols/symbolizer.hpp"

namespace selfprof {
namespace detail {

class shared_symbolizer {
 public:
  // Re-reads the mapped modules (parsing the new ones).
  void refresh() {
    std::lock_guard<std::mutex> lock(mu_);
    sym_.refresh();
  }
  // Runs `use(symbolizer&)` under the lock, after a refresh.
  template <class Use>
  auto with_fresh(Use&& use) -> decltype(use(std::declval<symbolizer&>())) {
    std::lock_guard<std::mutex> lock(mu_);
    sym_.refresh();
    return use(sym_);
  }
  // Runs `work` under the lock (work that fork() must not cut in half: the unwind-row rebuild).
  template <class Work>
  void locked(Work&& work) {
    std::lock_guard<std::mutex> lock(mu_);
    work();
  }
  std::mutex& lock_for_fork() { return mu_; }
  void abandon_after_fork() { new (&mu_) std::mutex(); }

 private:
  std::mutex mu_;
  symbolizer sym_;
};

}  // namespace detail
}  // namespace selfprof
