// Choosing the tick source: `auto` takes the CPU timer up to the kernel tick and perf_event above it,
// falls back in order with each refusal recorded, a forced source is the only one tried, and wall mode
// refuses the sources that can cut a blocking call short.
#include <doctest/doctest.h>

#include <signal.h>

#include <cerrno>

#include <selfprof/sources/select.hpp>

namespace {
long refuse_perf(void*, int, int, int, unsigned long) {
  errno = EACCES;
  return -1;
}
int refuse_timer(clockid_t, struct sigevent*, timer_t*) {
  errno = ENOSYS;
  return -1;
}
struct seam_reset {
  ~seam_reset() { selfprof::detail::sys() = selfprof::detail::default_syscalls(); }
};
selfprof::detail::source_config config(double hz) {
  selfprof::detail::source_config c;
  c.hz = hz;
  c.signal_number = SIGPROF;
  return c;
}
}  // namespace

using selfprof::source_kind;
using selfprof::detail::choose_source;
using selfprof::detail::choose_wall_source;
using selfprof::detail::kernel_tick_hz;

TEST_CASE("choose_source: at or below the kernel tick, auto takes the CPU timer") {
  auto c = choose_source(source_kind::automatic, config(kernel_tick_hz() / 2));
  REQUIRE(c.source);
  CHECK(c.source->kind() == source_kind::timer);
  CHECK(c.reason.find("kernel tick") != std::string::npos);
  CHECK(c.refused.empty());
}

TEST_CASE("choose_source: without perf_event and timers, auto falls back to the itimer and says why") {
  struct sigaction ignore {
  }, old{};
  ignore.sa_handler = SIG_IGN;  // the itimer really runs until closed: its SIGPROF must not end the test
  sigaction(SIGPROF, &ignore, &old);
  seam_reset r;
  selfprof::detail::sys().perf_event_open = refuse_perf;
  selfprof::detail::sys().timer_create = refuse_timer;
  auto c = choose_source(source_kind::automatic, config(kernel_tick_hz() * 4));
  REQUIRE(c.source);
  CHECK(c.source->kind() == source_kind::itimer);
  c.source->close();
  REQUIRE(c.refused.size() == 3);  // perf with kernel time, perf user-only, timer
  CHECK(c.refused[0].find("perf") == 0);
  CHECK(c.refused[0].find("Permission denied") != std::string::npos);
  CHECK(c.refused[2].find("timer") == 0);
  CHECK(c.reason.find("last resort") != std::string::npos);
  sigaction(SIGPROF, &old, nullptr);
}

TEST_CASE("choose_source: above the kernel tick without perf_event, the timer and its limit") {
  seam_reset r;
  selfprof::detail::sys().perf_event_open = refuse_perf;
  auto c = choose_source(source_kind::automatic, config(kernel_tick_hz() * 4));
  REQUIRE(c.source);
  CHECK(c.source->kind() == source_kind::timer);
  CHECK(c.source->effective_hz() == doctest::Approx(kernel_tick_hz()));
  CHECK(c.refused.size() == 2);
}

TEST_CASE("choose_source: a forced source is the only one tried") {
  seam_reset r;
  selfprof::detail::sys().timer_create = refuse_timer;
  auto c = choose_source(source_kind::timer, config(99));
  CHECK_FALSE(c.source);
  REQUIRE(c.refused.size() == 1);
  CHECK(c.refused[0].find("timer") == 0);
}

TEST_CASE("choose_wall_source: CPU timers and the itimer are refused, naming EINTR") {
  for (source_kind k : {source_kind::timer, source_kind::itimer}) {
    auto c = choose_wall_source(k, config(99));
    CHECK_FALSE(c.source);
    REQUIRE(c.refused.size() == 1);
    CHECK(c.refused[0].find("EINTR") != std::string::npos);
  }
  seam_reset r;
  selfprof::detail::sys().perf_event_open = refuse_perf;
  auto c = choose_wall_source(source_kind::automatic, config(99));
  CHECK_FALSE(c.source);  // no signals at all then
  REQUIRE(c.refused.size() == 1);
}
