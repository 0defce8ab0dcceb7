// Choosing the tick source: `auto` takes the ring first; without it, the CPU timer up to the kernel tick
// and perf_event above it; it falls back in order with each refusal recorded, a forced source is the only
// one tried, and wall mode refuses the sources that can cut a blocking call short.
#include <doctest/doctest.h>

#include <signal.h>

#include <linux/perf_event.h>

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

// perf_event_open refused for the ring's sampling events only (they are the ones that copy user stacks).
long refuse_ring(void* attr, int pid, int cpu, int group, unsigned long flags) {
  auto* a = static_cast<perf_event_attr*>(attr);
  if (a->sample_type & PERF_SAMPLE_STACK_USER) {
    errno = EACCES;
    return -1;
  }
  return selfprof::detail::default_perf_event_open(attr, pid, cpu, group, flags);
}

TEST_CASE("choose_source: auto takes the ring where perf_event opens, and says no signal is sent") {
  auto c = choose_source(source_kind::automatic, config(kernel_tick_hz() / 2));
  REQUIRE(c.source);
  if (c.source->kind() != source_kind::ring) {  // perf_event refused on this machine: the fallbacks below
    REQUIRE_FALSE(c.refused.empty());
    MESSAGE("ring refused here: " << c.refused[0]);
    CHECK(c.refused[0].find("ring") == 0);
    c.source->close();
    return;
  }
  CHECK(c.source->kind() == source_kind::ring);
  CHECK(c.source->pulls_samples());
  CHECK(c.reason.find("no signal") != std::string::npos);
  CHECK(c.refused.empty());
  c.source->close();
}

TEST_CASE("choose_source: at or below the kernel tick without the ring, auto takes the CPU timer") {
  seam_reset r;
  selfprof::detail::sys().perf_event_open = refuse_ring;
  auto c = choose_source(source_kind::automatic, config(kernel_tick_hz() / 2));
  REQUIRE(c.source);
  CHECK(c.source->kind() == source_kind::timer);
  CHECK(c.reason.find("kernel tick") != std::string::npos);
  CHECK(c.reason.find("fell back from the ring source") == 0);
  REQUIRE(c.refused.size() == 1);
  CHECK(c.refused[0].find("ring") == 0);
  CHECK(c.refused[0].find("Permission denied") != std::string::npos);
}

TEST_CASE("choose_source: the sampling signal is prepared only when the ring is refused") {
  selfprof::detail::source_config cfg = config(kernel_tick_hz() / 2);
  cfg.signal_number = 0;  // none installed yet
  int asked = 0;
  auto ready = [&](selfprof::detail::source_config& c) {
    ++asked;
    c.signal_number = SIGPROF;
    return selfprof::status::ok();
  };
  {
    auto c = choose_source(source_kind::automatic, cfg, ready);
    REQUIRE(c.source);
    // The ring needs no signal: asked only where perf_event is refused on this machine.
    CHECK(asked == (c.source->kind() == source_kind::ring ? 0 : 1));
    c.source->close();
  }
  seam_reset r;
  selfprof::detail::sys().perf_event_open = refuse_ring;
  asked = 0;
  auto c = choose_source(source_kind::automatic, cfg, ready);
  REQUIRE(c.source);
  CHECK(asked == 1);
  CHECK(c.source->kind() == source_kind::timer);
  c.source->close();
  // No signal to be had: every signal source is refused with the reason, after the ring's refusal.
  auto none = choose_source(source_kind::automatic, cfg, [](selfprof::detail::source_config&) {
    return selfprof::status::error("every candidate sampling signal is in use");
  });
  CHECK_FALSE(none.source);
  REQUIRE(none.refused.size() == 2);
  CHECK(none.refused[0].find("ring") == 0);
  CHECK(none.refused[1] == "signal sources: every candidate sampling signal is in use");
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
  REQUIRE(c.refused.size() == 4);  // ring, perf with kernel time, perf user-only, timer
  CHECK(c.refused[0].find("ring") == 0);
  CHECK(c.refused[1].find("perf") == 0);
  CHECK(c.refused[1].find("Permission denied") != std::string::npos);
  CHECK(c.refused[3].find("timer") == 0);
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
  CHECK(c.refused.size() == 3);  // ring, perf with kernel time, perf user-only
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
