// Dumps the program does not ask for itself: on the dump signal (SIGUSR2 by default) and every
// SELFPROF_INTERVAL seconds, written by the dumper thread ("selfprof-dump") through the one dump path
// (dump/dump.hpp), so the collector keeps draining while a dump is symbolized and written. Requests that
// arrive while a dump is being written are answered together by the next one. The dumper also watches
// the control socket (`selfprof dump PID`, another way to ask for a dump) until its first client, and
// then has the server start its thread (serve/server.hpp: a process nobody asks runs no server thread).
// Context: setup only (start/stop, serve_on_demand); launch() from the watching thread; the dumper
// thread; flush() from any thread; fork child.
//
// Started on demand (the profiler's way), the dumper thread itself starts only at the first request: until
// then another thread (the collector) watches watch_fd(), which turns readable with the dumper's eventfd,
// the signalfd or the control socket, and calls launch(). A process that never asks for a dump runs one
// selfprof thread fewer: creating and ending a thread is a good part of what selfprof costs a short-lived
// process (docs/measurements.md).
//
// The dump signal is taken by the dumper thread, not by an application thread. A process-directed signal
// goes to some thread that does not block it, and a handler run there cuts that thread's blocking call
// short: sleep(), nanosleep(), poll() and epoll_wait() return early whatever SA_RESTART says. So start()
// blocks the signal in the thread that calls it (threads it creates afterwards inherit the block), and the
// dumper reads it from a signalfd: the signal is blocked in every selfprof thread too, so a handler the
// program installs for it later never runs on one (the preload library gives the signal up when the program
// claims it). stop() on the starting thread takes the block off again. Limits, documented in README.md:
// a thread created before start() by another thread keeps the signal unblocked and may still take a request
// (counted all the same); a program that unblocks it takes it back; a child started by posix_spawn(),
// system() or popen() from a blocking thread inherits the block across exec (a fork child drops it, and so
// does exec under the preload library). A signal the starting thread already blocks is one the program may
// wait for (sigwait, signalfd): selfprof does not take it.
#pragma once

#include <pthread.h>
#include <signal.h>
#include <sys/epoll.h>
#include <sys/signalfd.h>
#include <sys/types.h>
#include <time.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <mutex>
#include <new>
#include <string>

#include "selfprof/core/snapshots.hpp"
#include "selfprof/detail/high_fd.hpp"
#include "selfprof/detail/sys.hpp"
#include "selfprof/detail/worker.hpp"
#include "selfprof/dump/dump.hpp"
#include "selfprof/options.hpp"
#include "selfprof/serve/server.hpp"
#include "selfprof/signal/dump_request.hpp"
#include "selfprof/signal/raw_syscall.hpp"

namespace selfprof {
namespace detail {

class auto_dumps {
 public:
  // `exit_dump` writes the exit profile; run on this thread when the process ends through _exit() (see
  // exit_dump_by_dumper in signal/dump_request.hpp).
  auto_dumps(snapshot_maker& snapshots, void (*exit_dump)()) : snapshots_(snapshots), exit_dump_(exit_dump) {}

  // Takes the dump signal when no one else handles it (else a note says so) and starts the dumper thread,
  // or with `on_demand` (and no interval) only prepares it: watch_fd() then tells when to launch() it.
  status start(const options& o, session_info& session, bool on_demand = false) {
    opts_ = o;
    settings_.paths = o.out.empty() ? kDefaultDumpTemplate : o.out;
    settings_.sink.allow_shared_dir = o.allow_shared_dir;
    settings_.thread_roots = o.thread_roots;
    settings_.frame_budget_ms = o.frame_budget_ms;
    written_.store(0);
    failed_.store(0);
    {
      std::lock_guard<std::mutex> lock(mu_);
      handled_ = g_dump_requests.requests.load();
      done_ = handled_;
      busy_ = false;
    }
    on_demand_.store(nullptr, std::memory_order_relaxed);  // serve_on_demand() after this, if at all
    take_signal(o.dump_signal, session);
    status st = worker_.prepare("selfprof-dump");
    if (!st) {
      give_signal_back();
      return st;
    }
    g_dump_requests.exit_requested.store(0, std::memory_order_relaxed);
    g_dump_requests.exit_done.store(0, std::memory_order_relaxed);
    g_dump_requests.exit_dump_wanted.store(o.out.empty() ? 0 : 1, std::memory_order_relaxed);
    g_dump_requests.wake_fd.store(worker_.wake_fd(), std::memory_order_release);
    g_dump_requests.dumper_tid.store(0, std::memory_order_release);
    if (on_demand && o.interval_s <= 0) make_watch_fd();
    if (watch_fd_ < 0) {
      st = launch();
      if (!st) {
        g_dump_requests.wake_fd.store(-1, std::memory_order_seq_cst);
        worker_.stop();
        give_signal_back();
        return st;
      }
    }
    if (watch_fd_ < 0 || requests_waiting())
      worker_.wake();  // one the handler counted before wake_fd was set
    return status::ok();
  }

  // Readable when the dumper, not started yet, has something to do; -1 once it runs (or when started
  // without on_demand). Watched by one other thread, which calls launch() when it turns readable.
  int watch_fd() const { return watch_fd_; }

  // Starts the dumper thread if it is prepared and not running yet (else does nothing).
  status launch() {
    std::lock_guard<std::mutex> lock(launch_mu_);
    if (worker_.running() || worker_.wake_fd() < 0) return status::ok();
    status st = worker_.launch(&auto_dumps::main, this);
    if (st) {
      g_dump_requests.dumper_tid.store(static_cast<int>(worker_.tid()), std::memory_order_release);
    } else {
      std::fprintf(stderr, "%s: dump requests are not answered\n", st.message().c_str());
    }
    return st;
  }
  // launch() for a watcher that holds a plain function pointer.
  static void launch_from(void* self) { (void)static_cast<auto_dumps*>(self)->launch(); }

  // Answers what was requested, stops the thread, and gives the dump signal back to the application —
  // unless `keep_signal` (the exit dump: a late request must not meet the default action, terminate,
  // while the last profile is written; the handler then only counts it).
  void stop(bool keep_signal = false) {
    bool never_launched = false;
    {  // the lock orders this read with a launch() by flush() on another thread or by a watcher still running
      std::lock_guard<std::mutex> lock(launch_mu_);
      never_launched = !worker_.running() && worker_.wake_fd() >= 0;
    }
    if (never_launched) {
      // Never launched: requests that arrived since the watcher stopped are still answered.
      if (sfd_ >= 0) read_signalfd();
      if (requests_waiting()) (void)launch();
    }
    g_dump_requests.dumper_tid.store(0, std::memory_order_release);
    g_dump_requests.wake_fd.store(-1, std::memory_order_seq_cst);
    // A handler that read the descriptor before the store writes it before the thread closes it.
    for (int waited_us = 0;
         g_dump_requests.in_flight.load(std::memory_order_seq_cst) != 0 && waited_us < 1000000;
         waited_us += 100) {
      struct timespec step {
        0, 100 * 1000
      };
      ::nanosleep(&step, nullptr);
    }
    worker_.stop();
    close_watch_fd();
    if (!keep_signal) give_signal_back();
  }

  // Waits until every dump requested so far is written (tests, exit); at most `limit`.
  void flush(std::chrono::milliseconds limit = std::chrono::milliseconds(30000)) {
    (void)launch();  // requests may be waiting for the watcher to start the dumper
    std::unique_lock<std::mutex> lock(mu_);
    const std::uint64_t want = g_dump_requests.requests.load();
    worker_.wake();
    done_cv_.wait_for(lock, limit, [&] { return !worker_.running() || (done_ >= want && !busy_); });
  }

  void abandon_after_fork() {
    on_demand_.store(nullptr, std::memory_order_relaxed);
    g_dump_requests.dumper_tid.store(0, std::memory_order_release);
    g_dump_requests.wake_fd.store(-1, std::memory_order_release);
    worker_.abandon_after_fork();
    close_watch_fd();
    new (&mu_) std::mutex();
    new (&launch_mu_) std::mutex();
    new (&done_cv_) std::condition_variable();
    if (signal_ != 0) {
      sys().sigaction(signal_, &previous_, nullptr);
      if (sfd_ >= 0) ::close(sfd_);
      sfd_ = -1;
      // The child's only thread is a copy of the forking one: it blocks the signal only because of
      // selfprof (start() never takes a signal its thread blocks), and an exec'd program must not inherit
      // that. routed_signal stays: a child that puts its saved mask back before exec (shells do) gets the
      // block off again from the preload library's exec hooks.
      if (blocked_) unblock_here(signal_);
    }
    signal_ = 0;
    blocked_ = false;
  }

  // Watch `server`'s lazy_listener() and call its start_on_demand() when a client connects (null: stop
  // watching). The server may stop meanwhile: it then starts nothing.
  void serve_on_demand(http_server* server) {
    on_demand_.store(server, std::memory_order_release);
    if (server && watch_fd_ >= 0) watch(server->lazy_listener());  // a client starts the dumper first
    // A running dumper's next wait watches it; one not started must not be woken (the wake would start it).
    std::lock_guard<std::mutex> lock(launch_mu_);
    if (worker_.running()) worker_.wake();
  }

  int signal_number() const { return signal_; }
  pid_t tid() const { return worker_.tid(); }
  unsigned long written() const { return written_.load(); }
  unsigned long failed() const { return failed_.load(); }
  const dump_settings& settings() const { return settings_; }

 private:
  static void main(void* self) { static_cast<auto_dumps*>(self)->loop(); }

  bool requests_waiting() {
    std::lock_guard<std::mutex> lock(mu_);
    return g_dump_requests.requests.load() != handled_;
  }

  // An epoll set of the eventfd and the signalfd (and the control socket, see serve_on_demand): readable
  // when any of them is. Left at -1 when it cannot be made: the dumper then starts at once.
  void make_watch_fd() {
    watch_fd_ = keep_fd_high(::epoll_create1(EPOLL_CLOEXEC));
    if (watch_fd_ >= 0 && (!watch(worker_.wake_fd()) || (sfd_ >= 0 && !watch(sfd_)))) close_watch_fd();
  }
  bool watch(int fd) {
    if (fd < 0) return true;
    struct epoll_event ev {};
    ev.events = EPOLLIN;
    ev.data.fd = fd;
    return ::epoll_ctl(watch_fd_, EPOLL_CTL_ADD, fd, &ev) == 0;
  }
  void close_watch_fd() {
    if (watch_fd_ >= 0) ::close(watch_fd_);
    watch_fd_ = -1;
  }

  static sigset_t only(int sig) {
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, sig);
    return set;
  }
  static void unblock_here(int sig) {
    const sigset_t set = only(sig);
    pthread_sigmask(SIG_UNBLOCK, &set, nullptr);
  }

  // Installs the dump handler when the signal is free (no handler of the program's, not blocked by the
  // calling thread), and blocks it in the calling thread so that only the dumper takes it.
  void take_signal(int sig, session_info& session) {
    if (sig <= 0) return;
    struct sigaction cur {};
    sys().sigaction(sig, nullptr, &cur);
    sigset_t mask;
    pthread_sigmask(SIG_BLOCK, nullptr, &mask);
    const char* why = nullptr;
    if ((cur.sa_flags & SA_SIGINFO) || (cur.sa_handler != SIG_DFL && cur.sa_handler != SIG_IGN))
      why = "already has a handler installed by the application";
    else if (sigismember(&mask, sig) == 1)
      why =
          "is blocked by the thread that starts selfprof (the program may wait for it with sigwait or "
          "signalfd)";
    if (why) {
      std::string n = "signal " + std::to_string(sig) + " " + why +
                      ": dumps on that signal are off (set SELFPROF_SIGNAL to another one)";
      session.note(n);
      std::fprintf(stderr, "selfprof: %s\n", n.c_str());
      return;
    }
    struct sigaction act {};
    act.sa_sigaction = &dump_signal_handler;
    act.sa_flags = SA_SIGINFO | SA_RESTART;
    sigfillset(&act.sa_mask);  // no application handler runs inside it (and jumps out)
    sigdelset(&act.sa_mask, SIGSYS);
    if (sys().sigaction(sig, &act, &previous_) != 0) return;
    signal_ = sig;
    const sigset_t set = only(sig);
    sfd_ = keep_fd_high(::signalfd(-1, &set, SFD_CLOEXEC | SFD_NONBLOCK));
    if (sfd_ < 0) return;  // the handler alone then: a request may land on any thread
    blocked_ = pthread_sigmask(SIG_BLOCK, &set, nullptr) == 0;
    blocker_tid_ = static_cast<pid_t>(raw_gettid());
    if (blocked_) g_dump_requests.routed_signal.store(sig, std::memory_order_release);
  }

  // Counts the dump signals waiting in the signalfd as requests.
  void read_signalfd() {
    struct signalfd_siginfo info[8];
    for (;;) {
      const ssize_t n = ::read(sfd_, info, sizeof info);
      if (n <= 0) return;
      g_dump_requests.requests.fetch_add(static_cast<std::uint64_t>(n) / sizeof info[0],
                                         std::memory_order_acq_rel);
    }
  }

  // Gives the signal back: requests already pending for blocked threads are taken here (counted, as the
  // handler would) so none meets the program's action, then the action is restored and, on the thread
  // that blocked it, the block is taken off. Another thread cannot change the starting thread's mask:
  // there the block stays (README.md says so).
  void give_signal_back() {
    if (signal_ == 0) return;
    const sigset_t set = only(signal_);
    sigset_t mask;
    pthread_sigmask(SIG_BLOCK, nullptr, &mask);
    if (sfd_ >= 0) {
      read_signalfd();
      ::close(sfd_);
      sfd_ = -1;
    }
    if (sigismember(&mask, signal_) == 1) {
      const struct timespec zero {};
      while (sigtimedwait(&set, nullptr, &zero) == signal_) g_dump_requests.requests.fetch_add(1);
    }
    sys().sigaction(signal_, &previous_, nullptr);
    if (blocked_ && blocker_tid_ == static_cast<pid_t>(raw_gettid())) {
      unblock_here(signal_);
      g_dump_requests.routed_signal.store(0, std::memory_order_release);
    }
    signal_ = 0;
    blocked_ = false;
  }

  std::chrono::steady_clock::duration interval() const {
    return std::chrono::duration_cast<std::chrono::steady_clock::duration>(
        std::chrono::duration<double>(opts_.interval_s));
  }

  void loop() {
    auto next = std::chrono::steady_clock::now() + interval();
    for (;;) {
      int timeout = -1;
      if (opts_.interval_s > 0) {
        const auto left = next - std::chrono::steady_clock::now();
        timeout =
            left <= std::chrono::steady_clock::duration::zero()
                ? 0
                : static_cast<int>(std::chrono::duration_cast<std::chrono::milliseconds>(left).count()) + 1;
      }
      bool signalled = false, connecting = false;
      http_server* server = on_demand_.load(std::memory_order_acquire);
      const int lazy = server ? server->lazy_listener() : -1;
      const bool stopping = !worker_.wait(timeout, sfd_, &signalled, lazy, &connecting);
      if (signalled) read_signalfd();
      if (connecting) server->start_on_demand();
      if (g_dump_requests.exit_requested.load(std::memory_order_acquire)) {
        exit_dump_();  // the process ends when this is written; nothing after it matters
        g_dump_requests.exit_done.store(1, std::memory_order_release);
        return;
      }
      const auto now = std::chrono::steady_clock::now();
      const bool due = !stopping && opts_.interval_s > 0 && now >= next;
      if (due) next = now + interval();
      const std::uint64_t requests = g_dump_requests.requests.load(std::memory_order_acquire);
      {
        std::lock_guard<std::mutex> lock(mu_);
        if (requests == handled_ && !due) {
          if (stopping) return;
          continue;
        }
        handled_ = requests;
        busy_ = true;
      }
      write();
      {
        std::lock_guard<std::mutex> lock(mu_);
        done_ = requests;
        busy_ = false;
      }
      done_cv_.notify_all();
      if (stopping) return;  // a request that came before stop() was answered
    }
  }

  void write() {
    std::uint64_t window_seq = 0;
    const bool windowed = opts_.window_s > 0;
    dump_contents c = snapshots_.contents(windowed, &window_seq);
    status st = write_dump(c, settings_);
    if (st) {
      ++written_;
      if (windowed) snapshots_.window_written(window_seq);
    } else {
      ++failed_;  // the cumulative profile is intact, and an unwritten window stays for the next dump
      std::fprintf(stderr, "%s\n", st.message().c_str());
    }
  }

  snapshot_maker& snapshots_;
  void (*exit_dump_)();
  std::atomic<http_server*> on_demand_{nullptr};
  options opts_;
  dump_settings settings_;
  worker worker_;
  std::mutex launch_mu_;  // launch() from the watcher, flush() and stop()
  int watch_fd_ = -1;     // see watch_fd()
  int signal_ = 0;
  int sfd_ = -1;           // signalfd of signal_, read by the dumper
  bool blocked_ = false;   // the starting thread's block of signal_ is selfprof's
  pid_t blocker_tid_ = 0;  // that thread
  struct sigaction previous_ {};
  std::mutex mu_;
  std::condition_variable done_cv_;
  std::uint64_t handled_ = 0, done_ = 0;
  bool busy_ = false;
  std::atomic<unsigned long> written_{0}, failed_{0};
};

}  // namespace detail
}  // namespace selfprof
