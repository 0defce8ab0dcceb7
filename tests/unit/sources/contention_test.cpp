// The contention monitor's per-thread memory follows the sample table: threads that ended (and were
// merged out of the table) are forgotten, so thread churn does not grow it (issue 15, item 16).
#include <doctest/doctest.h>

#include <chrono>
#include <cstdint>
#include <unordered_map>

#include <selfprof/sources/contention.hpp>

TEST_CASE("contention monitor: threads gone from the table are forgotten") {
  selfprof::detail::contention_monitor m;
  m.reset(true);
  std::unordered_map<std::uint32_t, std::uint64_t> table;
  auto now = std::chrono::steady_clock::now();
  double share = 0;
  for (std::uint32_t round = 0; round < 50; ++round) {
    table.clear();
    // 100 short threads per round, with tids that never come back (none of them exists: the schedstat
    // reads fail and only the sample counts are remembered).
    for (std::uint32_t i = 0; i < 100; ++i) table[4000000 + round * 100 + i] = 5;
    now += std::chrono::milliseconds(600);
    (void)m.check(table, now, share);
    CHECK(m.threads_tracked() <= 2 * table.size());
  }
  table.clear();
  table[1] = 10;
  now += std::chrono::milliseconds(600);
  (void)m.check(table, now, share);
  CHECK(m.threads_tracked() <= 2);
}
