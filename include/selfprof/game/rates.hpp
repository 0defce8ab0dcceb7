// SELFPROF_FRAME_HZ: threads that mark game frames may be sampled faster than the others, so a slow
// frame has enough samples to show what made it slow. Their samples then enter the all-frames profile at
// the common rate (a fraction of their weight, carried over), so that profile stays proportional to CPU
// time.
// Context: collector thread (and dump callers holding the sample store's lock).
#pragma once

#include <cstdint>
#include <unordered_map>
#include <vector>

namespace selfprof {
namespace detail {

class game_frame_rates {
 public:
  void configure(double hz, double frame_hz) {
    hz_ = hz;
    boost_hz_ = frame_hz > hz ? frame_hz : 0;
    boosted_.clear();
  }
  void clear() { boosted_.clear(); }
  // Forgets which threads were boosted: after a source switch they must be boosted again.
  void forget_boosted() { boosted_.clear(); }

  // The rate of marking threads, or 0 when they run at the common rate.
  double boost_hz() const { return boost_hz_; }

  // Of the threads that mark frames now, those not tried at boost_hz() yet.
  std::vector<std::uint32_t> to_boost(const std::vector<std::uint32_t>& marking) const {
    std::vector<std::uint32_t> out;
    if (boost_hz_ <= 0) return out;
    for (std::uint32_t tid : marking)
      if (!boosted_.count(tid)) out.push_back(tid);
    return out;
  }
  void tried(std::uint32_t tid, bool applied) { boosted_[tid].applied = applied; }

  // The weight a sample of `tid` carries in the all-frames profile.
  std::uint64_t common_weight(std::uint32_t tid, std::uint32_t weight) {
    auto b = boosted_.find(tid);
    if (boost_hz_ <= 0 || b == boosted_.end() || !b->second.applied) return weight;
    double& credit = b->second.credit;
    credit += static_cast<double>(weight) * hz_ / boost_hz_;
    auto whole = static_cast<std::uint64_t>(credit);
    credit -= static_cast<double>(whole);
    return whole;
  }

 private:
  struct boost {
    bool applied = false;
    double credit = 0;
  };
  double hz_ = 99, boost_hz_ = 0;
  std::unordered_map<std::uint32_t, boost> boosted_;
};

}  // namespace detail
}  // namespace selfprof
