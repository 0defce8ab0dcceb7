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

namespace {
std::uint64_t count_at(const stack_table& t, std::uint32_t tid, std::uint64_t leaf) {
  std::uint64_t n = 0;
  for (auto& e : t.entries())
    if (e.tid == tid && e.depth > 0 && t.pcs(e)[0] == leaf) n += e.count;
  return n;
}
}  // namespace

TEST_CASE("a limited table stays within its limit; new stacks past it go to the ceiling stack") {
  constexpr std::size_t kLimit = 64 * 1024;
  stack_table t;
  t.set_limit(kLimit);
  for (std::uint64_t i = 0; i < 20000; ++i) {
    std::uint64_t s[] = {i + 100, 7, 8, 9};
    t.add_bounded(static_cast<std::uint32_t>(i % 3 + 1), 0, s, 4, 2);
    CHECK(t.memory_bytes() <= kLimit + 256);  // the ceiling stack may pass it by a few entries
  }
  CHECK(t.total() == 40000);  // nothing lost
  CHECK(t.merged_records() > 0);
  CHECK(t.merged_weight() == 2 * t.merged_records());
  CHECK(count_at(t, selfprof::detail::kMergedThreadsTid, selfprof::detail::kMemoryCeilingPc) ==
        t.merged_weight());
  CHECK(t.memory_bytes() > kLimit / 2);  // the limit is used, not left mostly empty
  // A stack already in the table is still counted where it is.
  std::uint64_t first[] = {100, 7, 8, 9};
  const std::uint64_t merged = t.merged_records();
  t.add_bounded(1, 0, first, 4, 5);
  CHECK(t.merged_records() == merged);
  CHECK(count_at(t, 1, 100) == 7);
  // Off-CPU stacks have a ceiling stack of their own: the off-CPU view keeps its total.
  std::uint64_t off[] = {999999, 1};
  t.add_bounded(4, 0x2, off, 2, 3);
  bool offcpu_ceiling = false;
  for (auto& e : t.entries())
    offcpu_ceiling = offcpu_ceiling || (e.flags == 0x2 && t.pcs(e)[0] == selfprof::detail::kMemoryCeilingPc);
  CHECK(offcpu_ceiling);
}

TEST_CASE("merge_threads folds the stacks of ended threads into one thread, in place") {
  stack_table t;
  for (std::uint32_t tid = 1; tid <= 1000; ++tid) {
    std::uint64_t a[] = {1, 2, 3}, b[] = {4, 5};
    t.add(tid, 0, a, 3, 1);
    t.add(tid, 0, b, 2, 2);
  }
  CHECK(t.unique() == 2000);
  const std::size_t freed = t.merge_threads([](std::uint32_t tid) { return tid > 10; });
  CHECK(freed == 2000 - 22);
  CHECK(t.unique() == 22);
  CHECK(t.total() == 3000);
  CHECK(count_at(t, 0, 1) == 990);
  CHECK(count_at(t, 0, 4) == 1980);
  CHECK(count_at(t, 5, 4) == 2);
  // Still a working table: lookups find the merged entries, new ones go in.
  std::uint64_t a[] = {1, 2, 3}, c[] = {6};
  t.add(0, 0, a, 3, 10);
  t.add(11, 0, c, 1, 1);
  CHECK(count_at(t, 0, 1) == 1000);
  CHECK(t.unique() == 23);
  for (auto& e : t.entries())
    if (e.tid == 0 && e.depth == 3) CHECK(t.pcs(e)[2] == 3);
}

TEST_CASE("stack table difference: what the later table counted past the earlier one") {
  stack_table before, after;
  std::uint64_t a[] = {1, 2, 3}, b[] = {1, 2, 4}, c[] = {9};
  before.add(10, 0, a, 3, 5);
  before.add(10, 0, b, 3, 2);
  after.add(10, 0, a, 3, 8);  // grew by 3
  after.add(10, 0, b, 3, 2);  // did not grow: left out
  after.add(11, 0, c, 1, 4);  // new
  CHECK(after.count_of(10, 0, a, 3) == 8);
  CHECK(after.count_of(12, 0, a, 3) == 0);
  CHECK(stack_table().count_of(10, 0, a, 3) == 0);
  const stack_table d = stack_table::difference(after, before);
  CHECK(d.unique() == 2);
  CHECK(d.total() == 7);
  CHECK(d.count_of(10, 0, a, 3) == 3);
  CHECK(d.count_of(11, 0, c, 1) == 4);
  CHECK(d.count_of(10, 0, b, 3) == 0);
  CHECK(stack_table::difference(after, after).unique() == 0);
}
