// The one kind of background thread selfprof runs (collector, dumper, JIT flusher, wall sampler): created
// with every asynchronous signal blocked, named, its tid known before start() returns, woken through an
// eventfd, joined by stop(), forgotten without a join in a forked child.
// Context: start, launch and stop from setup or from another worker (the server's loop starts at its
// first client, its render thread at the first profile asked for, the dumper at its first request), never
// from the worker itself;
// abandon_after_fork in the child; wait() on the worker's own thread; wake() from any thread (wake_fd()
// may be written from a signal handler).
#pragma once

#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <sys/eventfd.h>
#include <time.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <condition_variable>
#include <cstdint>
#include <cstring>
#include <mutex>
#include <new>
#include <string>
#include <vector>

#include "selfprof/detail/high_fd.hpp"
#include "selfprof/detail/process.hpp"
#include "selfprof/signal/clock.hpp"
#include "selfprof/signal/raw_syscall.hpp"
#include "selfprof/status.hpp"

namespace selfprof {
namespace detail {

// The mask a worker starts with: every signal but the synchronous fault signals, which the kernel
// raises for a fault in this very thread and cannot hold back (a blocked one kills the process without
// running the application's crash handler). So an application's SIGALRM, SIGCHLD, SIGTERM or SIGPIPE
// handler never runs on a selfprof thread, and a timer signal never interrupts one.
inline sigset_t worker_signal_mask() {
  sigset_t set;
  sigfillset(&set);
  for (int s : {SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGTRAP, SIGSYS}) sigdelset(&set, s);
  return set;
}

// The tids of the running workers, whenever they started (the server's render thread starts at its first
// request), so the collector never arms or samples a selfprof thread. A fixed table: no allocation, read
// without a lock.
constexpr std::size_t kMaxWorkers = 16;
inline std::atomic<pid_t> g_worker_tids[kMaxWorkers];

inline void note_worker_tid(pid_t tid) {
  for (auto& slot : g_worker_tids) {
    pid_t none = 0;
    if (slot.compare_exchange_strong(none, tid, std::memory_order_release)) return;
  }
}
inline void forget_worker_tid(pid_t tid) {
  if (tid == 0) return;
  for (auto& slot : g_worker_tids) {
    pid_t was = tid;
    if (slot.compare_exchange_strong(was, 0, std::memory_order_release)) return;
  }
}
// CPU time of the workers that have returned from their body, added as each one ends (see workers_cpu_ns).
inline std::atomic<std::uint64_t> g_ended_workers_cpu_ns{0};

// Every running worker's tid: selfprof's own threads (collector, dumper, JIT flusher, wall sampler, the
// server's), whenever each started. They are never armed, and their samples are dropped.
inline std::vector<pid_t> running_worker_tids() {
  std::vector<pid_t> out;
  for (auto& slot : g_worker_tids)
    if (const pid_t t = slot.load(std::memory_order_acquire)) out.push_back(t);
  return out;
}

// CPU time selfprof's own threads have used since the process started: the ended workers', and each
// running worker's thread clock. A worker that returns between the two reads may be counted twice for the
// moment until stop() forgets its tid: a statistic, never a decision.
inline std::uint64_t workers_cpu_ns() {
  std::uint64_t total = g_ended_workers_cpu_ns.load(std::memory_order_relaxed);
  for (auto& slot : g_worker_tids) {
    const pid_t tid = slot.load(std::memory_order_acquire);
    if (tid != 0) total += clock_ns(thread_cpu_clock(tid));
  }
  return total;
}

class worker {
 public:
  worker() = default;
  worker(const worker&) = delete;
  worker& operator=(const worker&) = delete;
  ~worker() { stop(); }

  // Runs body(context) on a new thread called `name` (at most 15 characters). The thread is created with
  // worker_signal_mask() already in force. Fails when the thread or its eventfd cannot be created.
  status start(const char* name, void (*body)(void*), void* context) {
    status st = prepare(name);
    if (!st) return st;
    st = launch(body, context);
    if (!st) {
      ::close(wake_fd_);
      wake_fd_ = -1;
    }
    return st;
  }

  // The first half of start(), for a worker started on demand: the eventfd alone, so wake_fd() can be
  // written (and watched by another thread) before the thread exists; launch() starts the thread.
  status prepare(const char* name) {
    if (running_ || wake_fd_ >= 0)
      return status::error(std::string("selfprof: thread ") + name + " runs already");
    wake_fd_ = keep_fd_high(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));  // out of the application's range
    if (wake_fd_ < 0) {
      const int e = errno;
      return status::error(std::string("selfprof: eventfd for ") + name + ": " + std::strerror(e), e);
    }
    name_ = name;
    return status::ok();
  }

  // The second half: the thread, after prepare(). A wake written before it is seen by its first wait().
  status launch(void (*body)(void*), void* context) {
    if (running_) return status::ok();
    if (wake_fd_ < 0) return status::error(std::string("selfprof: thread ") + name_ + " was not prepared");
    body_ = body;
    context_ = context;
    stopping_.store(false, std::memory_order_relaxed);
    tid_.store(0, std::memory_order_relaxed);
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    const sigset_t mask = worker_signal_mask();
    sigset_t old;
#if defined(__GLIBC__) && (__GLIBC__ > 2 || (__GLIBC__ == 2 && __GLIBC_MINOR__ >= 32))
    const bool in_attr = pthread_attr_setsigmask_np(&attr, &mask) == 0;
#else
    const bool in_attr = false;
#endif
    if (!in_attr) pthread_sigmask(SIG_SETMASK, &mask, &old);  // inherited by the new thread
    const int rc = pthread_create(&thread_, &attr, &worker::entry, this);
    if (!in_attr) pthread_sigmask(SIG_SETMASK, &old, nullptr);
    pthread_attr_destroy(&attr);
    if (rc != 0)
      return status::error(std::string("selfprof: cannot start thread ") + name_ + ": " + std::strerror(rc),
                           rc);
    running_ = true;
    std::unique_lock<std::mutex> lock(mu_);
    started_.wait(lock, [&] { return tid_.load(std::memory_order_relaxed) != 0; });
    return status::ok();
  }

  // Asks the body to return (stopping() turns true and wait() returns false), then joins. Idempotent.
  void stop() {
    if (!running_) {
      if (wake_fd_ >= 0) ::close(wake_fd_);  // prepared, never launched
      wake_fd_ = -1;
      return;
    }
    stopping_.store(true, std::memory_order_release);
    wake();
    pthread_join(thread_, nullptr);
    running_ = false;
    ::close(wake_fd_);
    wake_fd_ = -1;
    forget_worker_tid(tid_.exchange(0, std::memory_order_relaxed));
  }

  bool running() const { return running_; }
  bool stopping() const { return stopping_.load(std::memory_order_acquire); }
  pid_t tid() const { return tid_.load(std::memory_order_relaxed); }
  int wake_fd() const { return wake_fd_; }

  // The worker's own thread: sleeps until woken, stopped or `timeout_ms` passed (-1: no timeout). Returns
  // false once stop() was asked. `extra_fd` and `extra_fd2` (optional, -1 for none) also end the wait when
  // readable; `*extra_ready` and `*extra_ready2` then say so.
  bool wait(int timeout_ms, int extra_fd = -1, bool* extra_ready = nullptr, int extra_fd2 = -1,
            bool* extra_ready2 = nullptr) {
    return wait_ns(timeout_ms < 0 ? -1 : static_cast<std::int64_t>(timeout_ms) * 1000000, extra_fd,
                   extra_ready, extra_fd2, extra_ready2);
  }
  bool wait_ns(std::int64_t timeout_ns, int extra_fd = -1, bool* extra_ready = nullptr, int extra_fd2 = -1,
               bool* extra_ready2 = nullptr) {
    struct pollfd p[3] = {};
    nfds_t used = 0;
    p[used++] = {wake_fd_, POLLIN, 0};
    const nfds_t at1 = used;
    if (extra_fd >= 0) p[used++] = {extra_fd, POLLIN, 0};
    const nfds_t at2 = used;
    if (extra_fd2 >= 0) p[used++] = {extra_fd2, POLLIN, 0};
    struct timespec ts {
      static_cast<time_t>(timeout_ns / 1000000000), static_cast<long>(timeout_ns % 1000000000)
    };
    const int n = ::ppoll(p, used, timeout_ns < 0 ? nullptr : &ts, nullptr);
    if (n > 0 && (p[0].revents & POLLIN)) {
      std::uint64_t v;
      ssize_t r = ::read(wake_fd_, &v, sizeof v);
      (void)r;
    }
    if (extra_ready) *extra_ready = n > 0 && extra_fd >= 0 && (p[at1].revents & POLLIN);
    if (extra_ready2) *extra_ready2 = n > 0 && extra_fd2 >= 0 && (p[at2].revents & POLLIN);
    return !stopping();
  }

  // Any thread: ends the current or next wait().
  void wake() const {
    if (wake_fd_ < 0) return;
    const std::uint64_t one = 1;
    raw_syscall3(SYS_write, wake_fd_, reinterpret_cast<long>(&one), sizeof one);
  }

  // In a forked child the thread does not exist: forget it without joining; this process's copy of the
  // eventfd is closed. The locks are made anew (a parent thread may have held them at the fork).
  void abandon_after_fork() {
    if (running_) {
      new (&thread_) pthread_t();
      running_ = false;
    }
    if (wake_fd_ >= 0) ::close(wake_fd_);
    wake_fd_ = -1;
    forget_worker_tid(tid_.exchange(0, std::memory_order_relaxed));
    new (&mu_) std::mutex();
    new (&started_) std::condition_variable();
  }

  // True when `start` is the routine every worker thread begins in: the preload library's pthread_create
  // hook leaves selfprof's own threads alone by this.
  static bool is_entry(void* (*start)(void*)) { return start == &worker::entry; }

 private:
  static void* entry(void* self) {
    worker& w = *static_cast<worker*>(self);
    pthread_setname_np(pthread_self(), w.name_);
    const pid_t tid = static_cast<pid_t>(raw_gettid());
    note_worker_tid(tid);
    {
      std::lock_guard<std::mutex> lock(w.mu_);
      w.tid_.store(tid, std::memory_order_relaxed);
    }
    w.started_.notify_all();
    w.body_(w.context_);
    g_ended_workers_cpu_ns.fetch_add(this_thread_cpu_ns(), std::memory_order_relaxed);
    return nullptr;
  }

  pthread_t thread_{};
  bool running_ = false;
  const char* name_ = "";
  void (*body_)(void*) = nullptr;
  void* context_ = nullptr;
  int wake_fd_ = -1;
  std::atomic<bool> stopping_{false};
  std::atomic<pid_t> tid_{0};
  std::mutex mu_;
  std::condition_variable started_;
};

}  // namespace detail
}  // namespace selfprof
