// The frame-pointer walk on forged stacks: a clean chain, every bound (alignment, order, frame size,
// stack end), the depth limit, unreadable memory, and the prologue/epilogue heuristics.
#include <doctest/doctest.h>

#include <sys/mman.h>

#include <cstring>
#include <vector>

#include <selfprof/signal/unwind_fp.hpp>

using selfprof::detail::kMaxFrameSize;
using selfprof::detail::raw_readable;
using selfprof::detail::unwind_fp;
using selfprof::detail::unwind_result;

namespace {
// A fake stack: frame records at given word offsets, each {next fp, return address}.
struct fp_fake_stack {
  std::vector<std::uint64_t> words = std::vector<std::uint64_t>(4096, 0);
  std::uintptr_t at(std::size_t word) { return reinterpret_cast<std::uintptr_t>(&words[word]); }
  void record(std::size_t word, std::uintptr_t next, std::uint64_t ret) {
    words[word] = next;
    words[word + 1] = ret;
  }
};
const std::uintptr_t kCode = 0x400000;  // a plain "return address" (not dereferenced)
}  // namespace

TEST_CASE("a clean chain is walked to its end") {
  fp_fake_stack s;
  s.record(10, s.at(20), kCode + 1);
  s.record(20, s.at(40), kCode + 2);
  s.record(40, 0, kCode + 3);  // next = 0 ends the chain after this frame
  std::uint64_t out[16];
  unwind_result r = unwind_fp(kCode, s.at(0), s.at(10), 0, out, 16);
  REQUIRE(r.depth == 4);
  CHECK(out[0] == kCode);
  CHECK(out[1] == kCode + 1);
  CHECK(out[2] == kCode + 2);
  CHECK(out[3] == kCode + 3);
  CHECK_FALSE(r.truncated);
}

TEST_CASE("bounds: below sp, misaligned, non-monotone, oversized frames and the stack end stop the walk") {
  fp_fake_stack s;
  std::uint64_t out[16];
  s.record(10, s.at(20) + 4, kCode + 1);  // misaligned next
  CHECK(unwind_fp(kCode, s.at(0), s.at(10), 0, out, 16).depth == 2);
  s.record(10, s.at(5), kCode + 1);  // goes down
  CHECK(unwind_fp(kCode, s.at(0), s.at(10), 0, out, 16).depth == 2);
  CHECK(unwind_fp(kCode, s.at(12), s.at(10), 0, out, 16).depth == 1);  // fp below sp
  s.record(10, s.at(10) + kMaxFrameSize + 64, kCode + 1);              // oversized frame
  CHECK(unwind_fp(kCode, s.at(0), s.at(10), 0, out, 16).depth == 2);
  s.record(10, s.at(20), kCode + 1);
  s.record(20, s.at(30), kCode + 2);
  CHECK(unwind_fp(kCode, s.at(0), s.at(10), s.at(21), out, 16).depth == 2);  // end cuts frame 20
  s.record(10, s.at(20), 12);  // a "return address" in the zero page
  CHECK(unwind_fp(kCode, s.at(0), s.at(10), 0, out, 16).depth == 1);
}

TEST_CASE("the depth limit marks the stack truncated only when a frame is left") {
  fp_fake_stack s;
  for (std::size_t i = 0; i < 10; ++i) s.record(10 + 4 * i, s.at(14 + 4 * i), kCode + i);
  s.record(50, 0, kCode + 100);
  std::uint64_t out[32];
  unwind_result r = unwind_fp(kCode, s.at(0), s.at(10), 0, out, 5);
  CHECK(r.depth == 5);
  CHECK(r.truncated);
  r = unwind_fp(kCode, s.at(0), s.at(10), 0, out, 32);
  CHECK(r.depth == 12);
  CHECK_FALSE(r.truncated);
}

TEST_CASE("an unreadable page in the chain is probed, not read") {
  void* mem = mmap(nullptr, 3 * 4096, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  REQUIRE(mem != MAP_FAILED);
  auto base = reinterpret_cast<std::uintptr_t>(mem);
  auto* words = static_cast<std::uint64_t*>(mem);
  words[8] = base + 4096 + 64;  // next frame in the second page
  words[9] = kCode + 1;
  REQUIRE(mprotect(reinterpret_cast<void*>(base + 4096), 4096, PROT_NONE) == 0);
  std::uint64_t out[8];
  unwind_result r = unwind_fp(kCode, base, base + 64, 0, out, 8);
  CHECK(r.depth == 2);
  CHECK_FALSE(raw_readable(base + 4096));
  CHECK(raw_readable(base));
  munmap(mem, 3 * 4096);
}

TEST_CASE("x86-64: at a function's first instruction or on ret, the caller comes from [sp]") {
#if defined(__x86_64__)
  fp_fake_stack s;
  unsigned char push_rbp[] = {0x55, 0x48, 0x89, 0xE5}, ret[] = {0xC3, 0, 0, 0},
                mov[] = {0x48, 0x89, 0xE5, 0x90}, body[] = {0x90, 0x90, 0x90, 0x90};
  s.words[0] = kCode + 7;  // [sp]: the caller's return address
  s.words[1] = kCode + 8;  // [sp+8]
  s.record(10, 0, kCode + 9);
  std::uint64_t out[8];
  auto pc = [](unsigned char* c) { return reinterpret_cast<std::uintptr_t>(c); };
  unwind_result r = unwind_fp(pc(push_rbp), s.at(0), s.at(10), 0, out, 8);
  REQUIRE(r.depth == 3);
  CHECK(out[1] == kCode + 7);
  CHECK(out[2] == kCode + 9);
  CHECK(r.leaf_fixed);
  r = unwind_fp(pc(ret), s.at(0), s.at(10), 0, out, 8);
  CHECK(out[1] == kCode + 7);
  r = unwind_fp(pc(mov), s.at(0), s.at(10), 0, out, 8);
  CHECK(out[1] == kCode + 8);
  r = unwind_fp(pc(body), s.at(0), s.at(10), 0, out, 8);
  CHECK(r.depth == 2);
  CHECK_FALSE(r.leaf_fixed);
#endif
}
