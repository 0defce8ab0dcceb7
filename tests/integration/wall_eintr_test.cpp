// Wall mode injects no EINTR: threads that block in poll, epoll_wait, select, nanosleep, sem_timedwait
// and read (and threads that compute in short bursts right before blocking, where a signal is most likely
// to meet a system call) treat any EINTR as a failure, for several seconds at 99 Hz and at 997 Hz. A
// first case shows the check can fail: a signal sent to a thread blocked in poll does give EINTR.
// ctest-labels: no_tsan
#include <doctest/doctest.h>

#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <semaphore.h>
#include <signal.h>
#include <sys/epoll.h>
#include <sys/select.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "integration/workload.hpp"

namespace {

struct blocking_calls {
  std::atomic<bool> stop{false};
  std::atomic<long> eintr{0};
  std::atomic<long> calls{0};
  std::atomic<long> other_errors{0};
  std::string first_eintr;
  std::atomic<bool> have_first{false};

  void failed(const char* what, int e) {
    if (e == EINTR) {
      eintr.fetch_add(1);
      bool expected = false;
      if (have_first.compare_exchange_strong(expected, true)) first_eintr = what;
    } else {
      other_errors.fetch_add(1);
    }
  }
};

// Spins for about `us` microseconds of CPU, right before the next blocking call.
void burst(long us) {
  const std::int64_t end = wl::thread_cpu_ns() + us * 1000;
  while (wl::thread_cpu_ns() < end) wl::spin_units(50);
}

// Runs one thread per kind of blocking call (two with CPU bursts before each call) until c.stop.
std::vector<std::thread> start_blockers(blocking_calls& c, int feed[2]) {
  std::vector<std::thread> t;
  t.emplace_back([&c] {  // poll with a timeout, nothing ready
    int p[2];
    if (::pipe(p) != 0) return;
    while (!c.stop.load()) {
      struct pollfd f {
        p[0], POLLIN, 0
      };
      if (::poll(&f, 1, 7) < 0) c.failed("poll", errno);
      c.calls.fetch_add(1);
    }
    ::close(p[0]);
    ::close(p[1]);
  });
  t.emplace_back([&c] {  // epoll_wait
    int ep = ::epoll_create1(EPOLL_CLOEXEC);
    while (!c.stop.load()) {
      struct epoll_event ev[4];
      if (::epoll_wait(ep, ev, 4, 7) < 0) c.failed("epoll_wait", errno);
      c.calls.fetch_add(1);
    }
    ::close(ep);
  });
  t.emplace_back([&c] {  // select
    while (!c.stop.load()) {
      struct timeval tv {
        0, 7000
      };
      if (::select(0, nullptr, nullptr, nullptr, &tv) < 0) c.failed("select", errno);
      c.calls.fetch_add(1);
    }
  });
  t.emplace_back([&c] {  // nanosleep (a restart with the remainder would hide EINTR: none here)
    while (!c.stop.load()) {
      struct timespec d {
        0, 5000000
      };
      if (::nanosleep(&d, nullptr) != 0) c.failed("nanosleep", errno);
      c.calls.fetch_add(1);
    }
  });
  t.emplace_back([&c] {  // sem_timedwait (a futex wait with a timeout)
    sem_t s;
    sem_init(&s, 0, 0);
    while (!c.stop.load()) {
      struct timespec at;
      clock_gettime(CLOCK_REALTIME, &at);
      at.tv_nsec += 6000000;
      if (at.tv_nsec >= 1000000000) {
        at.tv_nsec -= 1000000000;
        ++at.tv_sec;
      }
      if (sem_timedwait(&s, &at) != 0 && errno != ETIMEDOUT) c.failed("sem_timedwait", errno);
      c.calls.fetch_add(1);
    }
    sem_destroy(&s);
  });
  t.emplace_back([&c, feed] {  // read from a pipe a writer feeds every 3 ms
    char b;
    while (!c.stop.load()) {
      ssize_t n = ::read(feed[0], &b, 1);
      if (n < 0) c.failed("read", errno);
      c.calls.fetch_add(1);
    }
  });
  t.emplace_back([&c, feed] {  // the writer
    while (!c.stop.load()) {
      struct timespec d {
        0, 3000000
      };
      if (::nanosleep(&d, nullptr) != 0) c.failed("nanosleep (writer)", errno);
      if (::write(feed[1], "x", 1) < 0) c.failed("write", errno);
    }
    ssize_t w = ::write(feed[1], "x", 1);  // the reader may be waiting for one more
    (void)w;
  });
  for (int k = 0; k < 2; ++k)
    t.emplace_back([&c, k] {  // bursts of computing, each followed by a short poll or sleep
      while (!c.stop.load()) {
        burst(300 + 200 * k);
        if (k == 0) {
          if (::poll(nullptr, 0, 1) < 0) c.failed("poll after a burst", errno);
        } else {
          struct timespec d {
            0, 700000
          };
          if (::nanosleep(&d, nullptr) != 0) c.failed("nanosleep after a burst", errno);
        }
        c.calls.fetch_add(1);
      }
    });
  return t;
}

void run_for(double seconds) {
  for (int i = 0; i < static_cast<int>(seconds * 10); ++i) {
    struct timespec d {
      0, 100000000
    };
    while (::nanosleep(&d, &d) != 0) {
    }
  }
}

void noop_handler(int) {}

}  // namespace

TEST_CASE("the EINTR check can fail: a signal sent to a thread blocked in poll interrupts it") {
  struct sigaction sa {
  }, old{};
  sa.sa_handler = noop_handler;
  sa.sa_flags = SA_RESTART;
  sigemptyset(&sa.sa_mask);
  REQUIRE(sigaction(SIGUSR1, &sa, &old) == 0);
  std::atomic<pid_t> tid{0};
  std::atomic<int> result{0}, err{0};
  std::thread t([&] {
    tid.store(static_cast<pid_t>(::syscall(SYS_gettid)));
    struct pollfd f {
      - 1, 0, 0
    };
    result.store(::poll(&f, 1, 3000));
    err.store(errno);
  });
  while (tid.load() == 0) std::this_thread::yield();
  struct timespec d {
    0, 200000000
  };
  nanosleep(&d, nullptr);  // the thread is in poll by now
  ::syscall(SYS_tgkill, ::getpid(), tid.load(), SIGUSR1);
  t.join();
  sigaction(SIGUSR1, &old, nullptr);
  CHECK(result.load() == -1);
  CHECK(err.load() == EINTR);  // even with SA_RESTART: poll is never restarted (signal(7))
}

TEST_CASE("wall mode at 99 Hz and at 997 Hz: no blocking call fails with EINTR") {
  wl::apply_test_environment();
  for (double hz : {99.0, 997.0}) {
    CAPTURE(hz);
    blocking_calls c;
    int feed[2];
    REQUIRE(::pipe(feed) == 0);
    selfprof::options o;
    o.mode = selfprof::profile_mode::wall;
    o.hz = hz;
    o.dump_signal = 0;
    REQUIRE(selfprof::start(o));
    std::vector<std::thread> threads = start_blockers(c, feed);
    run_for(hz < 100 ? 4 : 2);
    c.stop.store(true);
    for (auto& t : threads) t.join();
    REQUIRE(selfprof::stop());
    ::close(feed[0]);
    ::close(feed[1]);
    selfprof::stats s = selfprof::get_stats();
    MESSAGE(hz << " Hz: " << c.calls.load() << " blocking calls, " << s.records << " on-CPU signals, "
               << s.wall.looks << " looks, " << s.wall.copies << " stacks copied");
    INFO("first EINTR from " << c.first_eintr);
    CHECK(c.eintr.load() == 0);
    CHECK(c.other_errors.load() == 0);
    CHECK(c.calls.load() > 1000);
    CHECK(s.wall.copies > 0);  // blocked threads were sampled
    // The signals were really there: the burst threads ran on the CPU under a perf_event (unless the
    // suite runs with perf_event_open failing, where wall mode sends no signal at all).
    if (!wl::perf_disabled_by_environment() && s.source == selfprof::source_kind::perf) CHECK(s.records > 20);
  }
}
