// The contention upgrade: `auto` took the CPU timer (the cheapest source), and this watches whether the
// sampled threads wait for CPUs; when they do, a perf_event with kernel time should replace the timer.
// Context: the collector thread.
//
// Why. CPU timers are checked only at the scheduler tick. When threads share CPUs they are switched at
// ticks, every slice is a whole number of ticks, and each thread's samples fall on a tick lattice of its
// CPU time: strictly repeated work then aliases with the lattice. A perf_event has an exact period. So the
// monitor reads the run delay of the busiest sampled threads (/proc/self/task/<tid>/schedstat) and says
// "switch" when they waited for a CPU at least kContentionShare of their run time in two checks in a row.
// The first check is at the first wake that sees ticks; while more threads receive samples than the
// process has CPUs, checks come every kContentionFastCheckMs, so an oversubscribed profile switches within
// a few hundred milliseconds.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <iterator>
#include <memory>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "selfprof/detail/process.hpp"
#include "selfprof/sources/perf_event.hpp"

namespace selfprof {
namespace detail {

constexpr unsigned kContentionCheckMs = 500;
constexpr unsigned kContentionFastCheckMs = 100;
constexpr double kContentionShare = 0.25;
constexpr std::size_t kContentionThreads = 64;  // schedstat reads per check: the busiest threads

class contention_monitor {
 public:
  // `active`: the source may be upgraded (auto chose the CPU timer, cpu mode).
  void reset(bool active) {
    active_ = active;
    hits_ = 0;
    fast_ = false;
    cpus_ = usable_cpus();
    last_check_ = std::chrono::steady_clock::now() - std::chrono::milliseconds(kContentionCheckMs);
    schedstat_prev_.clear();
    samples_prev_.clear();
  }
  bool active() const { return active_; }
  std::size_t threads_tracked() const { return samples_prev_.size() + schedstat_prev_.size(); }
  // The collector's longest sleep while the monitor watches.
  unsigned period_ms() const { return fast_ ? kContentionFastCheckMs : kContentionCheckMs; }
  bool due(std::chrono::steady_clock::time_point now) const {
    return active_ && now - last_check_ >= std::chrono::milliseconds(period_ms());
  }

  // One check from the samples each thread got so far. True when the source should be switched now
  // (`delay_share` then says how much the threads waited); the monitor stops watching after that.
  bool check(const std::unordered_map<std::uint32_t, std::uint64_t>& samples_by_thread,
             std::chrono::steady_clock::time_point now, double& delay_share) {
    const auto since_ns = std::chrono::duration_cast<std::chrono::nanoseconds>(now - last_check_).count();
    last_check_ = now;
    std::vector<std::pair<std::uint64_t, std::uint32_t>> busy;  // samples since the last check, tid
    for (auto& kv : samples_by_thread) {
      std::uint64_t& before = samples_prev_[kv.first];
      if (kv.second > before) busy.emplace_back(kv.second - before, kv.first);
      before = kv.second;
    }
    // Threads no longer in the table (ended and merged away) are forgotten: the maps stay as small as the
    // table, whatever the thread churn.
    if (samples_prev_.size() > samples_by_thread.size()) {
      for (auto it = samples_prev_.begin(); it != samples_prev_.end();)
        it = samples_by_thread.count(it->first) ? std::next(it) : samples_prev_.erase(it);
      for (auto it = schedstat_prev_.begin(); it != schedstat_prev_.end();)
        it = samples_by_thread.count(it->first) ? std::next(it) : schedstat_prev_.erase(it);
    }
    fast_ = busy.size() > static_cast<std::size_t>(cpus_);
    if (busy.size() > kContentionThreads) {
      std::partial_sort(busy.begin(), busy.begin() + kContentionThreads, busy.end(),
                        [](const std::pair<std::uint64_t, std::uint32_t>& a,
                           const std::pair<std::uint64_t, std::uint32_t>& b) { return a.first > b.first; });
      busy.resize(kContentionThreads);
    }
    std::uint64_t run = 0, delay = 0;
    for (auto& b : busy) {
      std::uint64_t r = 0, d = 0;
      if (!read_schedstat(static_cast<pid_t>(b.second), r, d)) continue;
      auto prev = schedstat_prev_.find(b.second);
      if (prev != schedstat_prev_.end() && r >= prev->second.first && d >= prev->second.second) {
        run += r - prev->second.first;
        delay += d - prev->second.second;
      }
      schedstat_prev_[b.second] = {r, d};
    }
    // Enough CPU time to judge (a tenth of the time since the last check), and a quarter of it again
    // spent waiting for a CPU.
    const bool contended = since_ns > 0 && run >= static_cast<std::uint64_t>(since_ns) / 10 &&
                           static_cast<double>(delay) >= kContentionShare * static_cast<double>(run);
    hits_ = contended ? hits_ + 1 : 0;
    if (hits_ < 2) return false;
    active_ = false;
    delay_share = static_cast<double>(delay) / static_cast<double>(run);
    return true;
  }

 private:
  bool active_ = false;
  int hits_ = 0;
  bool fast_ = false;  // more threads got samples at the last check than there are CPUs
  int cpus_ = 1;
  std::chrono::steady_clock::time_point last_check_{};
  std::unordered_map<std::uint32_t, std::pair<std::uint64_t, std::uint64_t>> schedstat_prev_;  // run, delay
  std::unordered_map<std::uint32_t, std::uint64_t> samples_prev_;
};

// The source the monitor switches to: a perf_event that counts kernel time, as the timer did. nullptr
// with the reason when none opens here.
inline std::unique_ptr<tick_source> open_upgrade_source(const source_config& base, std::string& why_not) {
  std::unique_ptr<tick_source> perf(new perf_event_source());
  source_config cfg = base;
  cfg.allow_user_only = false;
  status st = perf->open(cfg);
  if (!st) {
    why_not = st.message();
    return nullptr;
  }
  return perf;
}

}  // namespace detail
}  // namespace selfprof
