// The wall-clock example's scenario, shared with its test: requests that wait on a mutex held by a slow
// worker and on a pipe that a timer thread feeds slowly.
// Context: example and test code (any thread).
//
// One request, on the thread "request":
//   1. asks for a reply (a byte to the timer thread's pipe) and wakes the worker;
//   2. read_reply(): read() from the reply pipe; the timer thread writes it kReplyMs later;
//   3. take_lock(): pthread_mutex_lock on the mutex the worker took at step 1 and holds for kHoldMs
//      of computing, so the request waits about kHoldMs - kReplyMs for it.
// Per request, then: ~kReplyMs blocked in read and ~(kHoldMs - kReplyMs) blocked in futex, a 1:2 split.
#pragma once

#include <pthread.h>
#include <semaphore.h>
#include <time.h>
#include <unistd.h>

#include <atomic>
#include <cmath>
#include <thread>

namespace wall_scenario {

constexpr int kReplyMs = 30;  // the timer thread's delay before it feeds the reply pipe
constexpr int kHoldMs = 90;   // how long the slow worker holds the lock

inline double now_ms() {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<double>(ts.tv_sec) * 1e3 + static_cast<double>(ts.tv_nsec) / 1e6;
}

class requests {
 public:
  // Serves requests for `seconds` of wall time; returns how many were served.
  int run(double seconds) {
    if (::pipe(ask_) != 0 || ::pipe(reply_) != 0) return -1;
    sem_init(&go_, 0, 0);
    std::thread worker([this] { worker_loop(); });
    std::thread timer([this] { timer_loop(); });
    int served = 0;
    std::thread request([&] {
      pthread_setname_np(pthread_self(), "request");
      const double end = now_ms() + seconds * 1e3;
      while (now_ms() < end) {
        handle_request();
        ++served;
      }
      stop_.store(true);
      sem_post(&go_);                        // the worker: wake up and leave
      ssize_t w = ::write(ask_[1], "q", 1);  // the timer thread too
      (void)w;
    });
    request.join();
    worker.join();
    timer.join();
    for (int fd : {ask_[0], ask_[1], reply_[0], reply_[1]}) ::close(fd);
    sem_destroy(&go_);
    return served;
  }

  // Named stack frames of the request thread (noinline: they must show in the profile).
  __attribute__((noinline)) void handle_request() {
    locked_.store(false);
    sem_post(&go_);
    while (!locked_.load()) sched_yield();  // the worker holds the lock before we ask for the reply
    ssize_t w = ::write(ask_[1], "a", 1);
    (void)w;
    read_reply();
    take_lock();
    handled_.fetch_add(1);  // after the calls: neither is a tail call, so handle_request stays on the stack
  }
  __attribute__((noinline)) void read_reply() {
    char c;
    while (::read(reply_[0], &c, 1) != 1) {
    }
  }
  __attribute__((noinline)) void take_lock() {
    pthread_mutex_lock(&mu_);
    pthread_mutex_unlock(&mu_);
  }

 private:
  __attribute__((noinline)) static double slow_work(double until_ms) {
    double x = 0;
    for (int i = 1; now_ms() < until_ms; ++i) x += std::sqrt(static_cast<double>(i % 1000));
    return x;
  }

  void worker_loop() {
    pthread_setname_np(pthread_self(), "worker");
    for (;;) {
      sem_wait(&go_);
      if (stop_.load()) return;
      pthread_mutex_lock(&mu_);
      locked_.store(true);
      sink_ += slow_work(now_ms() + kHoldMs);
      pthread_mutex_unlock(&mu_);
    }
  }

  void timer_loop() {
    pthread_setname_np(pthread_self(), "timer");
    char c;
    while (::read(ask_[0], &c, 1) == 1 && c == 'a') {
      struct timespec d {
        0, kReplyMs * 1000000L
      };
      while (nanosleep(&d, &d) != 0) {
      }
      ssize_t w = ::write(reply_[1], "r", 1);
      (void)w;
    }
  }

  int ask_[2] = {-1, -1}, reply_[2] = {-1, -1};
  sem_t go_;
  pthread_mutex_t mu_ = PTHREAD_MUTEX_INITIALIZER;
  std::atomic<bool> locked_{false}, stop_{false};
  std::atomic<int> handled_{0};
  double sink_ = 0;
};

}  // namespace wall_scenario
