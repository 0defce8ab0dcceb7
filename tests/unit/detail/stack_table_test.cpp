// The stack table: identical stacks fold, different threads or flags stay apart, growth keeps counts.
#include <doctest/doctest.h>

#include <vector>

#include <selfprof/detail/stack_table.hpp>

using selfprof::detail::stack_table;

TEST_CASE("stack table folds identical stacks and keeps distinct ones apart") {
  stack_table t;
  std::uint64_t a[] = {1, 2, 3}, b[] = {1, 2, 4};
  t.add(10, 0, a, 3, 1);
  t.add(10, 0, a, 3, 2);
  t.add(10, 0, b, 3, 1);
  t.add(11, 0, a, 3, 1);  // other thread
  t.add(10, 1, a, 3, 1);  // truncated flag
  t.add(10, 0, a, 2, 1);  // shorter
  CHECK(t.unique() == 5);
  CHECK(t.total() == 7);
  std::uint64_t count_a = 0;
  for (auto& e : t.entries())
    if (e.tid == 10 && e.flags == 0 && e.depth == 3 && t.pcs(e)[2] == 3) count_a = e.count;
  CHECK(count_a == 3);
}

TEST_CASE("stack table grows past its first index and merges") {
  stack_table t;
  for (std::uint64_t i = 0; i < 50000; ++i) {
    std::uint64_t s[] = {i, i * 7, 42};
    t.add(1, 0, s, 3, 1);
    t.add(1, 0, s, 3, 1);
  }
  CHECK(t.unique() == 50000);
  CHECK(t.total() == 100000);
  stack_table u;
  u.merge(t);
  u.merge(t);
  CHECK(u.unique() == 50000);
  CHECK(u.total() == 200000);
  t.clear();
  CHECK(t.unique() == 0);
  CHECK(t.total() == 0);
}
