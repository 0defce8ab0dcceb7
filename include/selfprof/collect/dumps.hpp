// Dumps the program does not ask for itself: on the dump signal (SIGUSR2 by default), every
// SELFPROF_INTERVAL seconds, each written by a dumper thread so the collector keeps draining.
// Context: setup only (start/stop) and the collector thread (poll); the dumper thread writes.
#pragma once

#include <pthread.h>
#include <signal.h>

#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <deque>
#include <functional>
#include <mutex>
#include <new>
#include <string>
#include <thread>
#include <vector>

#include "selfprof/collect/frame_tracker.hpp"
#include "selfprof/collect/symbolize.hpp"
#include "selfprof/detail/sys.hpp"
#include "selfprof/options.hpp"
#include "selfprof/output/dump_paths.hpp"
#include "selfprof/output/markers.hpp"
#include "selfprof/signal/dump_request.hpp"
#include "selfprof/signal/raw_syscall.hpp"

namespace selfprof {
namespace detail {

// Where dumps go when SELFPROF_OUT is not set: the working directory, one SVG per dump.
constexpr const char* kDefaultDumpTemplate = "selfprof-%p-%n.svg";

// A wall profile's companion: its off-CPU part written to `out` with "-offcpu" before the extension.
// Nothing to do (ok) for other profiles.
inline status write_offcpu_companion(const profile& p, const std::string& out, const sink_options& so) {
  if (p.info.mode != "wall") return status::ok();
  profile off = offcpu_view(p);
  return write_profile(off, insert_before_extension(out, "-offcpu"), dump_output_options(off), so);
}

class dump_scheduler {
 public:
  struct hooks {
    std::function<raw_snapshot(bool windowed, std::uint64_t& window_seq)> take;
    std::function<profile(const raw_snapshot&)> symbolize;
    std::function<void(std::uint64_t window_seq)> window_written;
    // The slow-frame profile (frames over budget); `marked` says whether any frame was marked at all.
    std::function<raw_snapshot(bool& marked)> take_slow;
  };

  status start(const options& o, hooks h, std::vector<std::string>& notes) {
    opts_ = o;
    hooks_ = std::move(h);
    handled_ = g_dump_requests.requests.load();
    next_interval_ = std::chrono::steady_clock::now() + interval();
    stopping_ = false;
    written_ = failed_ = 0;
    worker_tid_.store(0);
    worker_ = std::thread([this] { worker_loop(); });
    while (worker_tid_.load() == 0) std::this_thread::yield();  // so the thread scan can leave it out
    if (o.dump_signal > 0) {
      struct sigaction cur {};
      sys().sigaction(o.dump_signal, nullptr, &cur);
      bool free = !(cur.sa_flags & SA_SIGINFO) && (cur.sa_handler == SIG_DFL || cur.sa_handler == SIG_IGN);
      if (!free) {
        std::string n = "signal " + std::to_string(o.dump_signal) +
                        " already has a handler installed by the "
                        "application: dumps on that signal are off (set SELFPROF_SIGNAL to another one)";
        notes.push_back(n);
        std::fprintf(stderr, "selfprof: %s\n", n.c_str());
      } else {
        struct sigaction act {};
        act.sa_sigaction = &dump_signal_handler;
        act.sa_flags = SA_SIGINFO | SA_RESTART;
        sigemptyset(&act.sa_mask);
        if (sys().sigaction(o.dump_signal, &act, &previous_) == 0) signal_ = o.dump_signal;
      }
    }
    return status::ok();
  }

  void set_wake_fd(int fd) { g_dump_requests.wake_fd.store(fd, std::memory_order_release); }

  void stop() {
    g_dump_requests.wake_fd.store(-1, std::memory_order_release);
    if (signal_ != 0) {
      sys().sigaction(signal_, &previous_, nullptr);
      signal_ = 0;
    }
    {
      std::lock_guard<std::mutex> l(mu_);
      stopping_ = true;
    }
    cv_.notify_all();
    if (worker_.joinable()) worker_.join();
  }

  // fork child: the worker thread does not exist there; forget it without joining.
  void abandon_after_fork() {
    if (worker_.joinable()) new (&worker_) std::thread();  // the old object is leaked on purpose
    new (&jobs_) std::deque<job>();                        // as are queued jobs and the locks' state
    new (&mu_) std::mutex();
    g_dump_requests.wake_fd.store(-1, std::memory_order_release);
    if (signal_ != 0) sys().sigaction(signal_, &previous_, nullptr);
    signal_ = 0;
  }

  int signal_number() const { return signal_; }
  pid_t worker_tid() const { return worker_tid_.load(); }
  unsigned long written() const { return written_.load(); }
  unsigned long failed() const { return failed_.load(); }

  // Called by the collector after each drain: queue a dump for each signal received and when the
  // interval has passed.
  void poll(std::chrono::steady_clock::time_point now) {
    std::uint64_t requests = g_dump_requests.requests.load(std::memory_order_acquire);
    bool due = opts_.interval_s > 0 && now >= next_interval_;
    if (requests == handled_ && !due) return;
    handled_ = requests;
    if (due) next_interval_ = now + interval();
    enqueue();
  }

  // Time left until the next interval dump is due (a day when there are none), so the collector does
  // not sleep past it.
  std::chrono::steady_clock::duration until_due(std::chrono::steady_clock::time_point now) const {
    if (opts_.interval_s <= 0) return std::chrono::hours(24);
    return next_interval_ > now ? next_interval_ - now : std::chrono::steady_clock::duration::zero();
  }

  // Waits until every queued dump is written (tests, exit).
  void flush() {
    std::unique_lock<std::mutex> l(mu_);
    idle_cv_.wait(l, [&] { return jobs_.empty() && !busy_; });
  }

 private:
  struct job {
    raw_snapshot raw;
    raw_snapshot slow;
    bool slow_marked = false;
    std::uint64_t window_seq = 0;
    bool windowed = false;
  };

  std::chrono::steady_clock::duration interval() const {
    return std::chrono::duration_cast<std::chrono::steady_clock::duration>(
        std::chrono::duration<double>(opts_.interval_s > 0 ? opts_.interval_s : 1));
  }

  void enqueue() {
    job j;
    j.windowed = opts_.window_s > 0;
    j.raw = hooks_.take(j.windowed, j.window_seq);
    if (hooks_.take_slow) j.slow = hooks_.take_slow(j.slow_marked);
    {
      std::lock_guard<std::mutex> l(mu_);
      jobs_.push_back(std::move(j));
    }
    cv_.notify_all();
  }

  void worker_loop() {
    pthread_setname_np(pthread_self(), "selfprof-dump");
    worker_tid_.store(static_cast<pid_t>(raw_gettid()));
    std::unique_lock<std::mutex> l(mu_);
    for (;;) {
      cv_.wait(l, [&] { return stopping_ || !jobs_.empty(); });
      if (jobs_.empty()) break;  // stopping and nothing left
      job j = std::move(jobs_.front());
      jobs_.pop_front();
      busy_ = true;
      l.unlock();
      write(j);
      l.lock();
      busy_ = false;
      idle_cv_.notify_all();
    }
  }

  void write(job& j) {
    profile p = hooks_.symbolize(j.raw);
    add_marker_frames(p, opts_.thread_roots);
    output_options oo = dump_output_options(p);
    sink_options so;
    so.allow_shared_dir = opts_.allow_shared_dir;
    const std::string out = opts_.out.empty() ? kDefaultDumpTemplate : opts_.out;
    status st = write_profile(p, out, oo, so);
    if (st) st = write_offcpu_companion(p, out, so);
    if (st &&
        j.slow_marked) {  // frames were marked: the slow-frame profile too, "-slow" before the extension
      profile sp = hooks_.symbolize(j.slow);
      add_marker_frames(sp, opts_.thread_roots);
      output_options so_oo = dump_output_options(sp);
      so_oo.svg.title = "Slow frames: " + so_oo.svg.title;
      st = write_profile(sp, insert_before_extension(out, "-slow"), so_oo, so);
    }
    if (st) {
      ++written_;
      if (j.windowed) hooks_.window_written(j.window_seq);
    } else {
      ++failed_;  // the cumulative profile is intact, and an unwritten window stays for the next dump
      std::fprintf(stderr, "%s\n", st.message().c_str());
    }
  }

  options opts_;
  hooks hooks_;
  std::uint64_t handled_ = 0;
  std::chrono::steady_clock::time_point next_interval_{};
  int signal_ = 0;
  struct sigaction previous_ {};
  std::thread worker_;
  std::atomic<pid_t> worker_tid_{0};
  std::mutex mu_;
  std::condition_variable cv_, idle_cv_;
  std::deque<job> jobs_;
  bool stopping_ = false, busy_ = false;
  std::atomic<unsigned long> written_{0}, failed_{0};
};

}  // namespace detail
}  // namespace selfprof
