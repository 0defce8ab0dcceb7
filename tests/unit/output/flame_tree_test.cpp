// The flame tree: stacks merged by frame name (sorted siblings, or time order for flame charts), self and
// inclusive values, the layout's aggregate of frames too narrow to draw, and sums that saturate.
#include <doctest/doctest.h>

#include <cstdint>
#include <vector>

#include <selfprof/output/flame_tree.hpp>

using selfprof::detail::flame_tree;
using selfprof::detail::no_node;

namespace {
std::uint32_t child(const flame_tree& t, std::uint32_t parent, const char* name) {
  for (auto c = t.nodes()[parent].first_child; c != no_node; c = t.nodes()[c].next_sibling)
    if (t.names()[t.nodes()[c].name] == name) return c;
  return no_node;
}
}  // namespace

TEST_CASE("flame tree: equal prefixes merge, values are inclusive and self") {
  flame_tree t;
  const std::uint32_t m = t.intern("main"), a = t.intern("a"), b = t.intern("b");
  const std::uint32_t s1[] = {m, a}, s2[] = {m, b}, s3[] = {m, a}, s4[] = {m};
  t.add(s1, 2, 3, 3, 3);
  t.add(s2, 2, 1, 1, 1);
  t.add(s3, 2, 2, 2, 2);
  t.add(s4, 1, 4, 4, 4);
  t.build(true);
  CHECK(t.total_width() == 10);
  const std::uint32_t nm = child(t, 0, "main");
  REQUIRE(nm != no_node);
  CHECK(t.nodes()[nm].width == 10);
  CHECK(t.nodes()[nm].self_after == 4);
  const std::uint32_t na = child(t, nm, "a");
  REQUIRE(na != no_node);
  CHECK(t.nodes()[na].width == 5);
  CHECK(t.nodes()[na].self_before == 5);
  // Sorted siblings: a before b.
  CHECK(t.nodes()[nm].first_child == na);
}

TEST_CASE("flame tree: a flame chart keeps time order and merges only adjacent equal prefixes") {
  flame_tree t;
  const std::uint32_t m = t.intern("main"), a = t.intern("a"), b = t.intern("b");
  const std::uint32_t sa[] = {m, a}, sb[] = {m, b};
  t.add(sa, 2, 1, 1, 1);
  t.add(sb, 2, 1, 1, 1);
  t.add(sa, 2, 1, 1, 1);
  t.build(false);
  const std::uint32_t nm = child(t, 0, "main");
  int children = 0;
  for (auto c = t.nodes()[nm].first_child; c != no_node; c = t.nodes()[c].next_sibling) ++children;
  CHECK(children == 3);  // a, b, a again
}

TEST_CASE("flame tree: frames narrower than the minimum become one aggregate frame") {
  flame_tree t;
  const std::uint32_t m = t.intern("main");
  std::vector<std::uint32_t> leaves;
  for (int i = 0; i < 10; ++i) leaves.push_back(t.intern("leaf" + std::to_string(i)));
  const std::uint32_t big[] = {m, leaves[0]};
  t.add(big, 2, 100, 100, 100);
  for (int i = 1; i < 10; ++i) {
    const std::uint32_t s[] = {m, leaves[static_cast<std::size_t>(i)]};
    t.add(s, 2, 1, 1, 1);
  }
  t.build(true);
  auto laid = t.layout(2.0);
  int aggregates = 0, drawn = 0;
  for (auto& f : laid) {
    if (f.node == no_node) {
      ++aggregates;
      CHECK(f.elided == 9);
      CHECK(f.width == 9);
    } else {
      ++drawn;
    }
  }
  CHECK(aggregates == 1);
  CHECK(drawn == 3);  // all, main, leaf0
}

TEST_CASE("flame tree: sums stop at the largest count instead of wrapping") {
  flame_tree t;
  const std::uint32_t m = t.intern("main"), a = t.intern("a"), b = t.intern("b");
  const std::uint32_t sa[] = {m, a}, sb[] = {m, b};
  const std::uint64_t half = std::uint64_t(1) << 63;
  t.add(sa, 2, half, half, half);
  t.add(sb, 2, half, half, half);
  t.add(sb, 2, 2, 2, 2);
  t.build(true);
  CHECK(t.total_width() == UINT64_MAX);
  CHECK(t.nodes()[child(t, 0, "main")].after == UINT64_MAX);
}
