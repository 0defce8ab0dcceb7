// selfprof and other owners of signals: an application's own SIGPROF handler is never replaced, a
// forced taken signal is refused clearly, another copy of selfprof is recognised, and the previous
// action comes back on stop.
#include <doctest/doctest.h>

#include <signal.h>

#include <cerrno>

#include <atomic>

#include "workload.hpp"

namespace {
std::atomic<int> g_app_handler_calls{0};
void app_handler(int) { g_app_handler_calls.fetch_add(1); }

struct action_guard {
  int sig;
  struct sigaction saved {};
  explicit action_guard(int s) : sig(s) { sigaction(s, nullptr, &saved); }
  ~action_guard() { sigaction(sig, &saved, nullptr); }
};
}  // namespace

TEST_CASE("application SIGURG and SIGPROF handlers installed first are left alone; selfprof takes another") {
  wl::apply_test_environment();
  wl::signal_sources signals;  // the handler and its signal are under test
  action_guard g(SIGPROF), gu(SIGURG);
  struct sigaction act {};
  act.sa_handler = app_handler;
  sigemptyset(&act.sa_mask);
  REQUIRE(sigaction(SIGPROF, &act, nullptr) == 0);
  REQUIRE(sigaction(SIGURG, &act, nullptr) == 0);

  selfprof::options o;
  o.hz = 250;
  REQUIRE(selfprof::start(o));
  selfprof::stats st = selfprof::get_stats();
  CHECK(st.sample_signal != SIGPROF);
  CHECK(st.sample_signal != SIGURG);
  CHECK(st.sample_signal >= SIGRTMIN);
  bool noted = false;
  for (auto& n : st.notes) noted = noted || n.find("SIGPROF") != std::string::npos;
  CHECK(noted);
  wl::run_rounds(300000000LL);
  raise(SIGPROF);
  CHECK(g_app_handler_calls.load() == 1);
  REQUIRE(selfprof::stop());
  CHECK(selfprof::get_stats().samples > 30);
  struct sigaction now {};
  sigaction(SIGPROF, nullptr, &now);
  CHECK(reinterpret_cast<void*>(now.sa_handler) == reinterpret_cast<void*>(&app_handler));
  struct sigaction rt {};
  sigaction(st.sample_signal, nullptr, &rt);
  CHECK(reinterpret_cast<void*>(rt.sa_handler) ==
        reinterpret_cast<void*>(SIG_DFL));  // the signal selfprof borrowed is given back
}

TEST_CASE("asking for a signal the application owns is refused with a clear message") {
  wl::apply_test_environment();
  wl::signal_sources signals;  // the handler and its signal are under test
  action_guard g(SIGPROF);
  struct sigaction act {};
  act.sa_handler = app_handler;
  sigemptyset(&act.sa_mask);
  REQUIRE(sigaction(SIGPROF, &act, nullptr) == 0);
  selfprof::options o;
  o.sample_signal = SIGPROF;
  selfprof::status st = selfprof::start(o);
  REQUIRE_FALSE(st);
  CHECK(st.message().find("in use") != std::string::npos);
  CHECK_FALSE(selfprof::running());
  selfprof::options it;
  it.source = selfprof::source_kind::itimer;  // needs SIGPROF, which is taken
  selfprof::status st2 = selfprof::start(it);
  REQUIRE_FALSE(st2);
  CHECK(st2.message().find("SIGPROF") != std::string::npos);
  struct sigaction now {};
  sigaction(SIGPROF, nullptr, &now);
  CHECK(reinterpret_cast<void*>(now.sa_handler) == reinterpret_cast<void*>(&app_handler));
}

namespace {
void other_copy_handler(int, siginfo_t*, void*) {}
}  // namespace

TEST_CASE("only the itimer left: selfprof moves to SIGPROF, the one signal it delivers") {
  wl::apply_test_environment();
  wl::signal_sources signals;  // the handler and its signal are under test
  action_guard g(SIGPROF), gu(SIGURG);
  signal(SIGPROF, SIG_DFL);
  signal(SIGURG, SIG_DFL);
  struct seam {
    ~seam() {
      selfprof::detail::sys() = selfprof::detail::default_syscalls();
      wl::apply_test_environment();
    }
  } reset;
  selfprof::detail::sys().perf_event_open = [](void*, int, int, int, unsigned long) -> long {
    errno = EACCES;
    return -1;
  };
  selfprof::detail::sys().timer_create = [](clockid_t, struct sigevent*, timer_t*) -> int {
    errno = ENOSYS;
    return -1;
  };
  REQUIRE(selfprof::start(selfprof::options{}));
  const selfprof::stats st = selfprof::get_stats();
  CHECK(st.source == selfprof::source_kind::itimer);
  CHECK(st.sample_signal == SIGPROF);
  struct sigaction urg {};
  sigaction(SIGURG, nullptr, &urg);
  CHECK(reinterpret_cast<void*>(urg.sa_handler) == reinterpret_cast<void*>(SIG_DFL));  // given back
  REQUIRE(selfprof::stop());
}

namespace {
std::atomic<int> g_late_handler_calls{0};
void late_handler(int) { g_late_handler_calls.fetch_add(1); }
}  // namespace

TEST_CASE(
    "a program that installs its own handler for the sampling signal later keeps it, and gets no ticks") {
  wl::apply_test_environment();
  wl::signal_sources signals;  // the handler and its signal are under test
  action_guard g(SIGURG);
  signal(SIGURG, SIG_DFL);
  selfprof::options o;
  o.hz = 250;
  REQUIRE(selfprof::start(o));
  REQUIRE(selfprof::get_stats().sample_signal == SIGURG);
  wl::run_rounds(50000000LL);
  struct sigaction mine {};
  mine.sa_handler = late_handler;
  sigemptyset(&mine.sa_mask);
  REQUIRE(sigaction(SIGURG, &mine, nullptr) == 0);  // no preload library here to see it happen
  // The collector notices at its next wake (at most kCollectorBusyWakeMs) and closes every source.
  bool noticed = false;
  for (int i = 0; i < 40 && !noticed; ++i) {
    wl::run_rounds(20000000LL);
    for (auto& n : selfprof::get_stats().notes)
      noticed = noticed || n.find("own handler for signal") != std::string::npos;
  }
  CHECK(noticed);
  const int calls = g_late_handler_calls.load();
  wl::run_rounds(200000000LL);  // CPU time that would have brought ~50 ticks
  CHECK(g_late_handler_calls.load() == calls);
  REQUIRE(selfprof::stop());
  struct sigaction now {};
  sigaction(SIGURG, nullptr, &now);
  CHECK(reinterpret_cast<void*>(now.sa_handler) ==
        reinterpret_cast<void*>(&late_handler));  // not restored over
}

TEST_CASE("another copy of selfprof already profiling the process is recognised and deferred to") {
  wl::apply_test_environment();
  wl::signal_sources signals;  // the handler and its signal are under test
  action_guard g(SIGPROF);
  struct sigaction act {};
  act.sa_sigaction = other_copy_handler;  // what another build of selfprof installs
  act.sa_flags = SA_SIGINFO | SA_RESTART;
  sigemptyset(&act.sa_mask);
  sigaddset(&act.sa_mask, SIGRTMAX);
  REQUIRE(sigaction(SIGPROF, &act, nullptr) == 0);
  selfprof::status st = selfprof::start(selfprof::options{});
  REQUIRE_FALSE(st);
  CHECK(st.message().find("another copy of selfprof") != std::string::npos);
  CHECK_FALSE(selfprof::running());
}

TEST_CASE("selfprof samples on SIGURG (default action: ignore) by default; the default comes back on stop") {
  wl::apply_test_environment();
  wl::signal_sources signals;  // the handler and its signal are under test
  action_guard g(SIGURG);
  signal(SIGURG, SIG_DFL);
  REQUIRE(selfprof::start(selfprof::options{}));
  CHECK(selfprof::get_stats().sample_signal == SIGURG);
  struct sigaction during {};
  sigaction(SIGURG, nullptr, &during);
  CHECK((during.sa_flags & SA_SIGINFO) != 0);
  wl::run_rounds(100000000LL);
  REQUIRE(selfprof::stop());
  CHECK(selfprof::get_stats().samples > 0);
  struct sigaction after {};
  sigaction(SIGURG, nullptr, &after);
  CHECK((after.sa_flags & SA_SIGINFO) == 0);
  CHECK(reinterpret_cast<void*>(after.sa_handler) == reinterpret_cast<void*>(SIG_DFL));
}
