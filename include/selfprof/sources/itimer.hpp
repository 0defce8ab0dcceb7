// Tick source: the process-wide setitimer(ITIMER_PROF), the last resort (one signal per tick for the whole
// process, delivered to whichever thread is running: uneven across threads).
// Context: setup only and the collector thread.
#pragma once

#include <sys/time.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <string>

#include "selfprof/detail/sys.hpp"
#include "selfprof/signal/altstack.hpp"
#include "selfprof/sources/source.hpp"

namespace selfprof {
namespace detail {

class itimer_source final : public tick_source {
 public:
  ~itimer_source() override { close(); }
  source_kind kind() const override { return source_kind::itimer; }
  std::string describe() const override { return "process-wide setitimer(ITIMER_PROF)"; }
  bool per_thread() const override { return false; }
  bool counts_kernel_time() const override { return true; }
  double effective_hz() const override { return std::min(config_.hz, kernel_tick_hz()); }
  std::size_t armed_count() const override { return armed_ ? 1 : 0; }

  status open(const source_config& config) override {
    config_ = config;
    if (config.signal_number != SIGPROF)
      return status::error("setitimer(ITIMER_PROF) can only deliver SIGPROF, which is taken");
    struct itimerval v {};
    std::int64_t ns = period_ns_for(config.hz);
    v.it_interval.tv_sec = static_cast<time_t>(ns / 1000000000);
    v.it_interval.tv_usec = static_cast<suseconds_t>((ns % 1000000000) / 1000);
    if (v.it_interval.tv_sec == 0 && v.it_interval.tv_usec == 0) v.it_interval.tv_usec = 1;
    v.it_value = v.it_interval;
    if (sys().setitimer(ITIMER_PROF, &v, nullptr) != 0)
      return status::error(std::string("setitimer(ITIMER_PROF): ") + std::strerror(errno));
    armed_ = true;
    return status::ok();
  }
  status arm(pid_t) override { return status::ok(); }
  void disarm(pid_t) override { reap_altstacks(); }  // a thread that ended (signal/altstack.hpp)
  void close() override {
    reap_altstacks();
    if (!armed_) return;
    struct itimerval off {};
    sys().setitimer(ITIMER_PROF, &off, nullptr);
    armed_ = false;
  }
  // Interval timers are not inherited by fork(2).
  void abandon_after_fork() override { armed_ = false; }

 private:
  source_config config_;
  bool armed_ = false;
};

}  // namespace detail
}  // namespace selfprof
