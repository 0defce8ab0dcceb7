// Tick source: one perf_event per thread (software task clock, or hardware cycles where a PMU exists)
// whose overflow signal is delivered to that thread (F_SETOWN_EX F_OWNER_TID). The handler re-arms it after
// sampling and caps its rate by the handler's measured cost (signal/handler.hpp, kMinGapPerCost).
// Context: setup only and the collector thread.
#pragma once

#include <linux/perf_event.h>
#include <sys/ioctl.h>
#include <sys/syscall.h>
#include <sys/utsname.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <string>
#include <unordered_map>

#include "selfprof/detail/high_fd.hpp"
#include "selfprof/detail/sys.hpp"
#include "selfprof/signal/handler.hpp"
#include "selfprof/sources/source.hpp"

namespace selfprof {
namespace detail {

// Linux 6.16 and 6.17 hang in the hrtimer path when PERF_EVENT_IOC_REFRESH re-arms a software event
// from its overflow signal (async-profiler issue 1578); selfprof refuses perf_event there.
inline bool kernel_has_refresh_hang() {
  struct utsname u {};
  if (uname(&u) != 0) return false;
  int major = 0, minor = 0;
  if (std::sscanf(u.release, "%d.%d", &major, &minor) != 2) return false;
  return major == 6 && (minor == 16 || minor == 17);
}

class perf_event_source final : public tick_source {
 public:
  ~perf_event_source() override { close(); }
  source_kind kind() const override { return source_kind::perf; }
  bool per_thread() const override { return true; }
  bool counts_kernel_time() const override { return !user_only_; }
  double effective_hz() const override { return config_.hz; }
  std::size_t armed_count() const override { return fds_.size(); }
  std::string describe() const override {
    std::string s = "perf_event ";
    s += hardware_ ? "cpu-cycles" : "task-clock";
    s += user_only_ ? " (user only: time in the kernel is not sampled)" : " (user+kernel)";
    return s;
  }
  status open(const source_config& config) override {
    config_ = config;
    if (kernel_has_refresh_hang())
      return status::error("perf_event refused on Linux 6.16/6.17 (PERF_EVENT_IOC_REFRESH hang)");
    // Probe the calling thread: hardware cycles first, then the software task clock; kernel time
    // included unless the caller accepts user-only events.
    pid_t self = static_cast<pid_t>(raw_gettid());
    int first_errno = 0;
    const bool user_clock = config.user_clock_only;
    for (int user = user_clock ? 1 : 0; user <= (config.allow_user_only || user_clock ? 1 : 0); ++user) {
      for (int hw = user_clock ? 0 : 1; hw >= 0; --hw) {
        hardware_ = hw == 1;
        user_only_ = user == 1;
        int fd = open_event(self);
        if (fd >= 0) {
          sys().close(fd);
          g_handler.perf_freq.store(hardware_, std::memory_order_relaxed);  // the rate cap's units
          return status::ok();
        }
        if (hw == 0 && (user == 0 || user_clock)) first_errno = errno;  // the software event says most
      }
    }
    std::string why = std::string("perf_event_open(task-clock) failed: ") + std::strerror(first_errno);
    if (first_errno == EACCES || first_errno == EPERM)
      why += config.allow_user_only || user_clock
                 ? " (kernel.perf_event_paranoid or seccomp forbids it)"
                 : " (an event including kernel time needs root or kernel.perf_event_paranoid <= 1)";
    return status::error(why, first_errno);
  }

  status arm(pid_t tid) override {
    if (fds_.count(tid)) return status::ok();
    int fd = open_event(tid);
    if (fd < 0) {
      const int e = errno;
      return status::error(std::string("perf_event_open: ") + std::strerror(e), e);
    }
    // One fd per thread: above the application's fds (detail/high_fd.hpp), before O_ASYNC records the
    // number the signals carry in si_fd; below kPerfFdBits, which the handler's bitmap covers.
    const fd_move placed = move_fd_high(fd, handler_globals::kPerfFdBits);
    fd = placed.fd;
    struct f_owner_ex owner {};
    owner.type = F_OWNER_TID;
    owner.pid = tid;
    if (fd >= handler_globals::kPerfFdBits || sys().fcntl_int(fd, F_SETFL, O_ASYNC) != 0 ||
        sys().fcntl_int(fd, F_SETSIG, config_.signal_number) != 0 || ::fcntl(fd, F_SETOWN_EX, &owner) != 0) {
      const int e = fd >= handler_globals::kPerfFdBits ? EMFILE : errno;
      sys().close(fd);
      return status::error(std::string("perf_event fd setup: ") + std::strerror(e), e);
    }
    // The event is bound to the task `tid` named when it was opened, and F_SETOWN_EX to that task's pid
    // struct, which a later task reusing the number does not share. So one check, still disabled, that
    // the tid is a thread of this process (tgkill with signal 0 looks only in our thread group) means no
    // signal ever goes to another process's thread that took a reused tid.
    if (::syscall(SYS_tgkill, ::getpid(), tid, 0) != 0) {
      const int e = errno;
      sys().close(fd);
      return status::error("perf_event: thread " + std::to_string(tid) + " is no longer in this process", e);
    }
    set_bit(fd, true);
    perf_rate_track(g_handler, fd, rate_value(config_.hz));
    // Overflow disables the event (event_limit 1) until the handler refreshes it: no re-entrant ticks.
    if (::ioctl(fd, PERF_EVENT_IOC_REFRESH, 1) != 0) {
      const int e = errno;
      set_bit(fd, false);
      perf_rate_track(g_handler, fd, 0);
      sys().close(fd);
      return status::error(std::string("PERF_EVENT_IOC_REFRESH: ") + std::strerror(e), e);
    }
    if (placed.place != fd_place::moved) count_fd_in_app_range(placed);
    fds_.emplace(tid, fd);
    return status::ok();
  }

  // A new period (task-clock ns) or frequency (cycles) for one thread's event (SELFPROF_FRAME_HZ).
  status set_thread_rate(pid_t tid, double hz) override {
    auto it = fds_.find(tid);
    if (it == fds_.end()) return status::error("perf: thread " + std::to_string(tid) + " is not armed");
    std::uint64_t value = rate_value(hz);
    perf_rate_track(g_handler, it->second, value);  // the handler's cap starts again from this rate
    if (::ioctl(it->second, PERF_EVENT_IOC_PERIOD, &value) != 0)
      return status::error(std::string("PERF_EVENT_IOC_PERIOD: ") + std::strerror(errno));
    return status::ok();
  }

  void disarm(pid_t tid) override {
    auto it = fds_.find(tid);
    if (it == fds_.end()) return;
    release(it->second, true);
    fds_.erase(it);
    reap_altstacks();  // a thread that ended: its alternate stack can go (signal/altstack.hpp)
  }

  void close() override {
    for (auto& f : fds_) release(f.second, true);
    fds_.clear();
    reap_altstacks();
  }

  // The child's fds are copies that still point at the parent's events: close them without disabling.
  void abandon_after_fork() override {
    for (auto& f : fds_) release(f.second, false);
    fds_.clear();
  }

 private:
  int open_event(pid_t tid) {
    struct perf_event_attr attr;
    std::memset(&attr, 0, sizeof attr);
    attr.size = sizeof attr;
    if (hardware_) {
      attr.type = PERF_TYPE_HARDWARE;
      attr.config = PERF_COUNT_HW_CPU_CYCLES;
      attr.freq = 1;
      attr.sample_freq = rate_value(config_.hz);
    } else {
      attr.type = PERF_TYPE_SOFTWARE;
      attr.config = PERF_COUNT_SW_TASK_CLOCK;
      attr.sample_period = rate_value(config_.hz);
    }
    attr.disabled = 1;
    attr.exclude_kernel = user_only_ ? 1 : 0;
    attr.exclude_hv = 1;
    attr.wakeup_events = 1;
    long fd = sys().perf_event_open(&attr, tid, -1, -1, PERF_FLAG_FD_CLOEXEC);
    return static_cast<int>(fd);
  }

  // The event's rate as the kernel takes it: a frequency in Hz (cycles, freq=1) or a period in ns.
  std::uint64_t rate_value(double hz) const {
    return hardware_ ? static_cast<std::uint64_t>(hz > 1 ? hz : 1)
                     : static_cast<std::uint64_t>(period_ns_for(hz));
  }

  void set_bit(int fd, bool on) {
    if (fd < 0 || fd >= handler_globals::kPerfFdBits) return;
    std::uint64_t bit = std::uint64_t(1) << (fd % 64);
    if (on)
      g_handler.perf_fds[fd / 64].fetch_or(bit, std::memory_order_release);
    else
      g_handler.perf_fds[fd / 64].fetch_and(~bit, std::memory_order_release);
  }

  void release(int fd, bool disable) {
    set_bit(fd, false);
    perf_rate_track(g_handler, fd, 0);
    if (disable) ::ioctl(fd, PERF_EVENT_IOC_DISABLE, 0);
    sys().close(fd);
  }

  source_config config_;
  bool hardware_ = false, user_only_ = false;
  std::unordered_map<pid_t, int> fds_;
};

}  // namespace detail
}  // namespace selfprof
