// The ring source's unwinding of one sample (unwind_sample): the copied stack walked with frame records,
// continued with the kernel's frame-pointer chain where the copy ends, at the position where both agree
// (so repeated return addresses of a recursion are not taken twice), and never past max_depth.
#include <doctest/doctest.h>

#include <cstdint>
#include <cstring>
#include <vector>

#include <selfprof/sources/perf_ring.hpp>

namespace {

// A copy of 0x20 bytes at 0x7000: two frame records, the second chaining out of the copy.
struct ring_fake_stack {
  std::uint64_t words[4];
  ring_fake_stack(std::uint64_t ra1, std::uint64_t ra2) {
    words[0] = 0x7010;  // saved rbp of frame 1
    words[1] = ra1;
    words[2] = 0x7020;  // saved rbp of frame 2: beyond the copy
    words[3] = ra2;
  }
  const unsigned char* data() const { return reinterpret_cast<const unsigned char*>(words); }
};

constexpr std::uint64_t kRingPc = 0x400500, kRingSp = 0x7000, kRingBp = 0x7000;

}  // namespace

TEST_CASE("unwind_sample: the copy's frames, then the kernel's chain past the end of the copy") {
  ring_fake_stack s(0x401000, 0x402000);
  const std::uint64_t chain[] = {kRingPc, 0x401000, 0x402000, 0x403000, 0x404000};
  std::uint64_t out[16];
  bool truncated = true, spliced = false;
  const std::size_t d = selfprof::detail::unwind_sample(nullptr, kRingPc, kRingSp, kRingBp, s.data(), 32,
                                                        chain, 5, out, 16, truncated, spliced);
  REQUIRE(d == 5);
  CHECK(spliced);
  CHECK_FALSE(truncated);
  for (std::size_t i = 0; i < 5; ++i) CHECK(out[i] == chain[i]);
}

TEST_CASE("unwind_sample: a recursion's repeated return addresses are joined by position") {
  ring_fake_stack s(0x401000, 0x401000);  // the same return address twice, as in a recursion
  const std::uint64_t chain[] = {kRingPc, 0x401000, 0x401000, 0x401000, 0x401000, 0x405000};
  std::uint64_t out[16];
  bool truncated = false, spliced = false;
  const std::size_t d = selfprof::detail::unwind_sample(nullptr, kRingPc, kRingSp, kRingBp, s.data(), 32,
                                                        chain, 6, out, 16, truncated, spliced);
  REQUIRE(d == 6);
  CHECK(out[5] == 0x405000);
}

TEST_CASE("unwind_sample: a kernel chain that disagrees with the copy is not joined") {
  ring_fake_stack s(0x401000, 0x402000);
  // A chain of code without frame pointers: it went wrong after the leaf.
  const std::uint64_t chain[] = {kRingPc, 0x999000, 0x998000, 0x997000};
  std::uint64_t out[16];
  bool truncated = false, spliced = true;
  const std::size_t d = selfprof::detail::unwind_sample(nullptr, kRingPc, kRingSp, kRingBp, s.data(), 32,
                                                        chain, 4, out, 16, truncated, spliced);
  CHECK(d == 3);
  CHECK_FALSE(spliced);
  CHECK(out[1] == 0x401000);
  CHECK(out[2] == 0x402000);
}

TEST_CASE("unwind_sample: max_depth cuts the joined stack and says so") {
  ring_fake_stack s(0x401000, 0x402000);
  const std::uint64_t chain[] = {kRingPc, 0x401000, 0x402000, 0x403000, 0x404000};
  std::uint64_t out[4];
  bool truncated = false, spliced = false;
  const std::size_t d = selfprof::detail::unwind_sample(nullptr, kRingPc, kRingSp, kRingBp, s.data(), 32,
                                                        chain, 5, out, 4, truncated, spliced);
  CHECK(d == 4);
  CHECK(truncated);
  CHECK(out[3] == 0x403000);
}

TEST_CASE("unwind_sample: no copy (a sample without user stack) keeps the leaf and the kernel's chain") {
  const std::uint64_t chain[] = {kRingPc, 0x401000, 0x402000};
  std::uint64_t out[8];
  bool truncated = false, spliced = false;
  const std::size_t d = selfprof::detail::unwind_sample(nullptr, kRingPc, kRingSp, kRingBp, nullptr, 0, chain,
                                                        3, out, 8, truncated, spliced);
  CHECK(d == 3);
  CHECK(out[2] == 0x402000);
}
