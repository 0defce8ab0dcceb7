// Unit tests of include/selfprof/jit/registry.hpp: region history, time-aware lookup, tagged pcs.
#include <doctest/doctest.h>

#include <selfprof/jit/registry.hpp>

#include <cstdint>
#include <random>
#include <string>
#include <vector>

using selfprof::detail::is_jit_tagged;
using selfprof::detail::jit_registry;

namespace {

std::string name_of(const jit_registry& r, std::uint64_t tagged) {
  selfprof::frame f;
  if (!r.name(tagged, f)) return "<none>";
  return f.name;
}

}  // namespace

TEST_CASE("jit registry: nothing registered returns false at once and leaves pc alone") {
  jit_registry r;
  std::uint64_t pc = 0x1000;
  CHECK_FALSE(r.translate(pc, 5));
  CHECK(pc == 0x1000);
  selfprof::frame f;
  CHECK_FALSE(r.name(0xfe00000000000001ull, f));  // tagged-looking, but no such region
}

TEST_CASE("jit registry: a pc inside a live region becomes a tagged value naming it") {
  jit_registry r;
  r.add(0x10000, 0x100, "jit_alpha", 100);
  r.add(0x20000, 0x40, "jit_beta", 100);
  std::uint64_t pc = 0x10010;
  REQUIRE(r.translate(pc, 150));
  CHECK(is_jit_tagged(pc));
  selfprof::frame f;
  REQUIRE(r.name(pc, f));
  CHECK(f.name == "jit_alpha");
  CHECK(f.module == "[jit]");
  CHECK(f.kind == selfprof::frame_kind::jit);
  CHECK(f.address == 0x10010);
  CHECK(f.module_offset == 0x10);
  // build_profile looks up tagged - 1 for return addresses: same region, address pc - 1.
  REQUIRE(r.name(pc - 1, f));
  CHECK(f.name == "jit_alpha");
  CHECK(f.address == 0x1000f);
  // Offset 0, the first byte, and the last byte.
  std::uint64_t first = 0x20000, last = 0x2003f, past = 0x20040, before = 0x1ffff;
  CHECK(r.translate(first, 150));
  CHECK(name_of(r, first) == "jit_beta");
  CHECK(r.translate(last, 150));
  CHECK(name_of(r, last) == "jit_beta");
  CHECK_FALSE(r.translate(past, 150));
  CHECK(past == 0x20040);
  CHECK_FALSE(r.translate(before, 150));
}

TEST_CASE("jit registry: samples before the add or after the remove are not named by the region") {
  jit_registry r;
  r.add(0x5000, 0x10, "jit_timed", 1000);
  CHECK(r.remove(0x5000, 2000));
  CHECK_FALSE(r.remove(0x5000, 2001));  // already gone
  CHECK_FALSE(r.remove(0x6000, 2001));  // never there
  std::uint64_t pc = 0x5004;
  CHECK_FALSE(r.translate(pc, 999));
  CHECK(r.translate(pc, 1000));  // add time is inclusive
  pc = 0x5004;
  CHECK(r.translate(pc, 1999));
  pc = 0x5004;
  CHECK_FALSE(r.translate(pc, 2000));  // remove time is exclusive
}

TEST_CASE("jit registry: remove + re-add at the same address names samples by generation") {
  jit_registry r;
  std::uint32_t g1 = r.add(0x7000, 0x80, "jit_first", 100);
  CHECK(r.remove(0x7000, 200));
  std::uint32_t g2 = r.add(0x7000, 0x80, "jit_second", 300);
  // Re-registering without remove replaces the live region from then on.
  std::uint32_t g3 = r.add(0x7000, 0x20, "jit_third", 400);
  CHECK(g1 < g2);
  CHECK(g2 < g3);
  struct probe {
    std::uint64_t t;
    const char* want;
  };
  for (probe p : {probe{150, "jit_first"}, probe{250, nullptr}, probe{350, "jit_second"},
                  probe{399, "jit_second"}, probe{400, "jit_third"}, probe{100000, "jit_third"}}) {
    CAPTURE(p.t);
    std::uint64_t pc = 0x7010;
    bool hit = r.translate(pc, p.t);
    if (p.want == nullptr) {
      CHECK_FALSE(hit);
    } else {
      REQUIRE(hit);
      CHECK(name_of(r, pc) == p.want);
    }
  }
  // The third region is shorter: past its end at t=400 the second one is no longer in place.
  std::uint64_t pc = 0x7040;
  CHECK_FALSE(r.translate(pc, 450));
  pc = 0x7040;
  CHECK(r.translate(pc, 350));
  CHECK(name_of(r, pc) == "jit_second");
  // Tagged values made earlier stay nameable after later registrations.
  std::uint64_t early = 0x7010;
  REQUIRE(r.translate(early, 150));
  r.add(0x9000, 0x10, "jit_later", 500);
  CHECK(name_of(r, early) == "jit_first");
}

TEST_CASE("jit registry: overlapping live regions resolve to the latest, as perf's last line wins") {
  jit_registry r;
  r.add(0x1000, 0x1000, "jit_cache", 10);  // a whole code cache
  r.add(0x1400, 0x100, "jit_inner", 20);   // a function inside it
  std::uint64_t pc = 0x1450;
  REQUIRE(r.translate(pc, 30));
  CHECK(name_of(r, pc) == "jit_inner");
  pc = 0x1450;
  REQUIRE(r.translate(pc, 15));  // before the inner one existed
  CHECK(name_of(r, pc) == "jit_cache");
  pc = 0x1800;
  REQUIRE(r.translate(pc, 30));
  CHECK(name_of(r, pc) == "jit_cache");
}

TEST_CASE("jit registry: regions too long for the tag keep their raw pcs") {
  jit_registry r;
  r.add(0x100000000ull, std::uint64_t{64} << 20, "jit_huge", 1);
  std::uint64_t near = 0x100000010ull, far = 0x100000000ull + (std::uint64_t{32} << 20);
  CHECK(r.translate(near, 2));
  CHECK_FALSE(r.translate(far, 2));
  CHECK(far == 0x100000000ull + (std::uint64_t{32} << 20));
}

TEST_CASE("jit registry: name() refuses values that are not its tags") {
  jit_registry r;
  r.add(0x3000, 0x10, "jit_small", 1);
  selfprof::frame f;
  CHECK_FALSE(r.name(0x3004, f));                                    // a raw pc
  CHECK_FALSE(r.name(0xffffffff81000000ull, f));                     // a kernel address
  CHECK_FALSE(r.name(0xfe00000000000000ull | (5ull << 24) | 1, f));  // generation 5 does not exist
  CHECK_FALSE(r.name(0xfe00000000000000ull | 0x12, f));              // offset past the region
}

TEST_CASE("jit registry: lookups agree with a brute-force scan across many regions and index merges") {
  jit_registry r;
  struct truth {
    std::uint64_t start, size, add, remove;
  };
  std::vector<truth> all;
  std::mt19937_64 rng(7);
  std::uint64_t now = 1;
  std::vector<std::size_t> live;
  for (int round = 0; round < 40; ++round) {
    int adds = 1 + static_cast<int>(rng() % 300);
    for (int i = 0; i < adds; ++i) {
      std::uint64_t start = 0x400000 + (rng() % 512) * 0x40;
      std::uint64_t size = 0x10 + rng() % 0x100;
      ++now;
      // Re-registering a live start replaces it (the registry's rule); keep the truth in step.
      for (std::size_t k = 0; k < live.size(); ++k)
        if (all[live[k]].start == start) {
          all[live[k]].remove = now;
          live.erase(live.begin() + static_cast<std::ptrdiff_t>(k));
          break;
        }
      r.add(start, size, "jit_f" + std::to_string(all.size()), now);
      all.push_back(truth{start, size, now, ~0ull});
      live.push_back(all.size() - 1);
      if (!live.empty() && rng() % 3 == 0) {
        std::size_t k = rng() % live.size();
        ++now;
        CHECK(r.remove(all[live[k]].start, now));
        all[live[k]].remove = now;
        live.erase(live.begin() + static_cast<std::ptrdiff_t>(k));
      }
    }
    // Probe between batches so that the index is built in several runs and merged.
    for (int q = 0; q < 200; ++q) {
      std::uint64_t pc = 0x400000 + rng() % (512 * 0x40 + 0x200);
      std::uint64_t t = 1 + rng() % (now + 1);
      std::int64_t want = -1;
      for (std::size_t g = 0; g < all.size(); ++g)
        if (pc >= all[g].start && pc < all[g].start + all[g].size && all[g].add <= t && t < all[g].remove)
          want = static_cast<std::int64_t>(g);
      std::uint64_t got = pc;
      bool hit = r.translate(got, t);
      CAPTURE(pc);
      CAPTURE(t);
      REQUIRE(hit == (want >= 0));
      if (hit) CHECK(name_of(r, got) == "jit_f" + std::to_string(want));
    }
  }
  CHECK(r.count() == all.size());
}
