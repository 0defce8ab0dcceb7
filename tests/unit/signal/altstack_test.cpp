// Tests of selfprof's alternate signal stacks (signal/altstack.hpp): a stack given to a thread is unmapped
// by reap_altstacks() once its thread has ended, never while it lives, wherever its slot falls in the table
// (reap_altstacks looks only at the groups of slots ever used).
#include <doctest/doctest.h>

#include <signal.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <thread>
#include <vector>

#include "selfprof/signal/altstack.hpp"

namespace altstack_test {

// Gives the calling thread a selfprof stack; its base, or 0. A sanitizer gives every thread an alternate
// stack of its own (selfprof then keeps it and installs none): that one is set aside for the install and
// put back after it, as the sanitizer unmaps the thread's alternate stack when the thread ends.
std::uintptr_t install_here() {
  stack_t prev{};
  sigaltstack(nullptr, &prev);
  const bool had = !(prev.ss_flags & SS_DISABLE);
  if (had) {
    stack_t off{};
    off.ss_flags = SS_DISABLE;
    sigaltstack(&off, nullptr);
  }
  const bool ok = selfprof::detail::install_altstack(selfprof::detail::g_altstack.size.load());
  if (had) sigaltstack(&prev, nullptr);
  return ok ? selfprof::detail::altstack_base_of(selfprof::detail::raw_gettid()) : 0;
}

// pthread_join returns once the kernel has cleared the thread's tid word, a little before the kernel
// forgets the thread: until then tgkill still finds it, and its stack is rightly kept. Reaps until `want`
// stacks went, or 2 s passed; the number reaped.
std::size_t reap_at_least(std::size_t want) {
  std::size_t n = 0;
  for (int i = 0; i < 2000 && n < want; ++i) {
    n += selfprof::detail::reap_altstacks();
    if (n < want) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return n;
}

}  // namespace altstack_test

TEST_CASE("altstack: ended threads' stacks are reaped, live ones kept, in every group of slots") {
  selfprof::detail::set_altstack_size(64 * 1024);  // a no-op when another test set it first
  REQUIRE(selfprof::detail::g_altstack.size.load() > 0);
  (void)selfprof::detail::reap_altstacks();  // what earlier tests left
  // Threads until their slots cover several groups (a slot is chosen by tid modulo the table size).
  std::vector<std::uintptr_t> bases;
  std::uint64_t groups = 0;
  for (int i = 0; i < 200 && __builtin_popcountll(groups) < 4; ++i) {
    std::uintptr_t base = 0;
    std::uint32_t tid = 0;
    std::thread([&] {
      base = altstack_test::install_here();
      tid = selfprof::detail::raw_gettid();
    }).join();
    if (base == 0) continue;
    bases.push_back(base);
    groups |=
        std::uint64_t{1} << ((tid % selfprof::detail::kAltstackSlots) / selfprof::detail::kAltstackGroup);
  }
  REQUIRE(bases.size() >= 2);
  // A live thread's stack stays through a reap.
  std::atomic<bool> release{false}, ready{false};
  std::uintptr_t live = 0;
  std::thread holder([&] {
    live = altstack_test::install_here();
    ready = true;
    while (!release) std::this_thread::yield();
  });
  while (!ready) std::this_thread::yield();
  REQUIRE(live != 0);
  const std::uint64_t reaped_before = selfprof::detail::g_altstack.reaped.load();
  const std::size_t n = altstack_test::reap_at_least(bases.size());
  MESSAGE(bases.size() << " ended threads over " << __builtin_popcountll(groups) << " groups of slots: " << n
                       << " stacks reaped");
  CHECK(n >= bases.size());
  CHECK(selfprof::detail::g_altstack.reaped.load() - reaped_before == n);
  // The holder's stack is still in the table, with its base; it goes once the holder has ended.
  bool held = false;
  for (const auto& s : selfprof::detail::g_altstack.slots) held = held || s.base.load() == live;
  CHECK(held);
  release = true;
  holder.join();
  CHECK(altstack_test::reap_at_least(1) >= 1);
  held = false;
  for (const auto& s : selfprof::detail::g_altstack.slots) held = held || s.base.load() == live;
  CHECK_FALSE(held);
}
