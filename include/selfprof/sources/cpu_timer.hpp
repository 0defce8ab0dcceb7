// Tick source: one POSIX CPU-time timer per thread (timer_create on the thread's CPU clock, SIGEV_THREAD_ID),
// armed for every thread from one thread, so no code has to run in the target thread.
// Context: setup only and the collector thread.
#pragma once

#include <signal.h>
#include <time.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <string>
#include <unordered_map>

#include "selfprof/detail/sys.hpp"
#include "selfprof/signal/handler.hpp"
#include "selfprof/sources/source.hpp"

namespace selfprof {
namespace detail {

class cpu_timer_source final : public tick_source {
 public:
  ~cpu_timer_source() override { close(); }
  source_kind kind() const override { return source_kind::timer; }
  std::string describe() const override { return "POSIX CPU-time timer per thread"; }
  bool per_thread() const override { return true; }
  bool counts_kernel_time() const override { return true; }
  double effective_hz() const override { return std::min(config_.hz, kernel_tick_hz()); }
  std::size_t armed_count() const override { return timers_.size(); }

  status open(const source_config& config) override {
    config_ = config;
    // Probe: a timer on the calling thread's clock must be creatable (ENOSYS/EPERM under seccomp).
    timer_t probe{};
    if (create(static_cast<pid_t>(raw_gettid()), &probe) != 0)
      return status::error(std::string("timer_create on a thread CPU clock failed: ") + std::strerror(errno));
    sys().timer_delete(probe);
    return status::ok();
  }

  status arm(pid_t tid) override {
    if (timers_.count(tid)) return status::ok();
    timer_t id{};
    if (create(tid, &id) != 0) {
      const int e = errno;
      return status::error(std::string("timer_create: ") + std::strerror(e), e);
    }
    struct itimerspec spec {};
    std::int64_t ns = period_ns_for(config_.hz);
    spec.it_interval.tv_sec = static_cast<time_t>(ns / 1000000000);
    spec.it_interval.tv_nsec = static_cast<long>(ns % 1000000000);
    spec.it_value = spec.it_interval;
    if (sys().timer_settime(id, 0, &spec, nullptr) != 0) {
      int e = errno;
      sys().timer_delete(id);
      return status::error(std::string("timer_settime: ") + std::strerror(e), e);
    }
    timers_.emplace(tid, id);
    return status::ok();
  }

  // A new period for one thread's timer (SELFPROF_FRAME_HZ; the kernel still delivers at most one tick
  // per jiffy, the overrun count weights the sample).
  status set_thread_rate(pid_t tid, double hz) override {
    auto it = timers_.find(tid);
    if (it == timers_.end()) return status::error("timer: thread " + std::to_string(tid) + " is not armed");
    struct itimerspec spec {};
    std::int64_t ns = period_ns_for(hz);
    spec.it_interval.tv_sec = static_cast<time_t>(ns / 1000000000);
    spec.it_interval.tv_nsec = static_cast<long>(ns % 1000000000);
    spec.it_value = spec.it_interval;
    if (sys().timer_settime(it->second, 0, &spec, nullptr) != 0)
      return status::error(std::string("timer_settime: ") + std::strerror(errno));
    return status::ok();
  }

  void disarm(pid_t tid) override {
    auto it = timers_.find(tid);
    if (it == timers_.end()) return;
    sys().timer_delete(it->second);  // also discards a queued tick of this timer
    timers_.erase(it);
    reap_altstacks();  // a thread that ended: its alternate stack can go (signal/altstack.hpp)
  }

  void close() override {
    for (auto& t : timers_) sys().timer_delete(t.second);
    timers_.clear();
    reap_altstacks();
  }

  // POSIX timers are not inherited by fork(2): the child has nothing to release.
  void abandon_after_fork() override { timers_.clear(); }

 private:
  int create(pid_t tid, timer_t* out) {
    struct sigevent sev;
    std::memset(&sev, 0, sizeof sev);
    sev.sigev_notify = SIGEV_THREAD_ID;
    sev.sigev_signo = config_.signal_number;
    sev.sigev_value.sival_ptr = timer_cookie();
    sev._sigev_un._tid = tid;  // glibc's spelling of sigev_notify_thread_id
    return sys().timer_create(thread_cpu_clock(tid), &sev, out);
  }

  source_config config_;
  std::unordered_map<pid_t, timer_t> timers_;
};

}  // namespace detail
}  // namespace selfprof
