// selfprof and other owners of signals: an application's own SIGPROF handler is never replaced, a
// forced taken signal is refused clearly, another copy of selfprof is recognised, and the previous
// action comes back on stop.
#include <doctest/doctest.h>

#include <signal.h>

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

TEST_CASE("an application SIGPROF handler installed first is left alone; selfprof takes another signal") {
  wl::apply_test_environment();
  action_guard g(SIGPROF);
  struct sigaction act {};
  act.sa_handler = app_handler;
  sigemptyset(&act.sa_mask);
  REQUIRE(sigaction(SIGPROF, &act, nullptr) == 0);

  selfprof::options o;
  o.hz = 250;
  REQUIRE(selfprof::start(o));
  selfprof::stats st = selfprof::get_stats();
  CHECK(st.sample_signal != SIGPROF);
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

TEST_CASE("another copy of selfprof already profiling the process is recognised and deferred to") {
  wl::apply_test_environment();
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

TEST_CASE("the default action comes back on stop") {
  wl::apply_test_environment();
  action_guard g(SIGPROF);
  signal(SIGPROF, SIG_DFL);
  REQUIRE(selfprof::start(selfprof::options{}));
  CHECK(selfprof::get_stats().sample_signal == SIGPROF);
  struct sigaction during {};
  sigaction(SIGPROF, nullptr, &during);
  CHECK((during.sa_flags & SA_SIGINFO) != 0);
  wl::run_rounds(100000000LL);
  REQUIRE(selfprof::stop());
  struct sigaction after {};
  sigaction(SIGPROF, nullptr, &after);
  CHECK((after.sa_flags & SA_SIGINFO) == 0);
  CHECK(reinterpret_cast<void*>(after.sa_handler) == reinterpret_cast<void*>(SIG_DFL));
}
