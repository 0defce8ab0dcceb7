// Time windows: a windowed take holds the last window's samples, consecutive takes never hand out a
// sample twice, an unwritten window is handed out again, and buckets older than the window are dropped.
#include <doctest/doctest.h>

#include <selfprof/collect/windows.hpp>

using selfprof::detail::kWindowBucketNs;
using selfprof::detail::stack_table;
using selfprof::detail::window_tables;

namespace {
void add_one(window_tables& w, std::uint64_t pc, std::uint64_t now_ns, std::uint64_t weight = 1) {
  std::uint64_t pcs[] = {pc};
  w.add(1, 0, pcs, 1, weight, now_ns);
}
}  // namespace

TEST_CASE("windows: off unless configured") {
  window_tables w;
  w.configure(0);
  CHECK_FALSE(w.enabled());
  add_one(w, 1, 10);
  stack_table t;
  w.take(20, t);
  CHECK(t.total() == 0);
}

TEST_CASE("windows: consecutive takes split the samples without counting one twice") {
  window_tables w;
  w.configure(60 * kWindowBucketNs);
  std::uint64_t now = 1000 * kWindowBucketNs;
  for (int i = 0; i < 10; ++i) add_one(w, 1, now + i * kWindowBucketNs / 4);
  stack_table first;
  const std::uint64_t s1 = w.take(now + 3 * kWindowBucketNs, first);
  CHECK(first.total() == 10);
  w.mark_dumped(s1);
  for (int i = 0; i < 5; ++i) add_one(w, 2, now + 4 * kWindowBucketNs + i);
  stack_table second;
  const std::uint64_t s2 = w.take(now + 5 * kWindowBucketNs, second);
  CHECK(second.total() == 5);
  // Not marked written (the dump failed): the next take hands the same samples out again, and more.
  add_one(w, 3, now + 6 * kWindowBucketNs);
  stack_table third;
  w.take(now + 7 * kWindowBucketNs, third);
  CHECK(third.total() == 6);
  CHECK(s2 > s1);
}

TEST_CASE("windows: samples older than the window are not in a take") {
  window_tables w;
  w.configure(2 * kWindowBucketNs);
  const std::uint64_t now = 500 * kWindowBucketNs;
  add_one(w, 1, now, 7);                         // old
  add_one(w, 2, now + 10 * kWindowBucketNs, 3);  // recent
  stack_table t;
  w.take(now + 11 * kWindowBucketNs, t);
  CHECK(t.total() == 3);
}

TEST_CASE("windows: the buckets share one memory limit, and a take keeps every sample") {
  constexpr std::size_t kLimit = 96 * 1024;
  window_tables w;
  w.configure(10 * kWindowBucketNs, kLimit);
  const std::uint64_t now = 1000 * kWindowBucketNs;
  std::uint64_t added = 0;
  for (std::uint64_t i = 0; i < 30000; ++i) {  // 5 buckets of distinct stacks
    add_one(w, 1000 + i, now + i * (kWindowBucketNs / 6000), 1);
    ++added;
    CHECK(w.memory_bytes() <= kLimit + 1024);
  }
  CHECK(w.merged_records() > 0);
  CHECK(w.merged_weight() == w.merged_records());
  stack_table t;
  w.take(now + 6 * kWindowBucketNs, t);
  CHECK(t.total() == added);
  // Ended threads merge in every bucket.
  w.merge_threads([](std::uint32_t tid) { return tid == 1; });
  stack_table u;
  w.mark_dumped(0);
  w.take(now + 6 * kWindowBucketNs, u);
  for (auto& e : u.entries()) CHECK(e.tid == selfprof::detail::kMergedThreadsTid);
}
