// The mixed CFI/frame-pointer unwinder on forged stacks and tables: rsp- and rbp-based frames, saved rbp,
// frameless leaves, PLT rows, outermost frames, the FP fallback where no row exists, every bound, the depth
// limit; and on this thread's real stack through the tables built from memory.
#include <doctest/doctest.h>

#include <ucontext.h>

#include <cstring>
#include <vector>

#include <selfprof/signal/unwind.hpp>
#include <selfprof/unwind/tables.hpp>

using selfprof::detail::current_thread_stack_end;
using selfprof::detail::find_unwind_row;
using selfprof::detail::g_unwind_tables;
using selfprof::detail::kMaxFrameSize;
using selfprof::detail::row_cfa_plt;
using selfprof::detail::row_cfa_rbp;
using selfprof::detail::row_cfa_rsp;
using selfprof::detail::row_no_info;
using selfprof::detail::row_outermost;
using selfprof::detail::row_unknown;
using selfprof::detail::unwind_interrupted;
using selfprof::detail::unwind_live;
using selfprof::detail::unwind_module;
using selfprof::detail::unwind_result;
using selfprof::detail::unwind_row;
using selfprof::detail::unwind_table_set;

namespace {
struct fake_stack {
  std::vector<std::uint64_t> words = std::vector<std::uint64_t>(4096, 0);
  std::uintptr_t at(std::size_t word) { return reinterpret_cast<std::uintptr_t>(&words[word]); }
};

// Fake code: module A [0x400000, 0x401000) with CFI, nothing at 0x500000 (frame-pointer code).
const std::uintptr_t kA = 0x400000, kNoCfi = 0x500000;
// Rows of A: 0x000 leaf without frame (CFA=rsp+8), 0x100 rsp+32 (rbp untouched), 0x200 rbp-based frame
// with rbp saved at CFA-16, 0x300 PLT, 0x400 outermost, 0x500 unknown, 0x600.. gap.
const unwind_row kRows[] = {
    {0x000, 8, 0, row_cfa_rsp, 0},  {0x100, 32, 0, row_cfa_rsp, 0},  {0x200, 16, -16, row_cfa_rbp, 0},
    {0x300, 8, 0, row_cfa_plt, 11}, {0x400, 0, 0, row_outermost, 0}, {0x500, 0, 0, row_unknown, 0},
    {0x600, 0, 0, row_no_info, 0},  {0x800, 8, 0, row_cfa_rsp, 0},   {0x1000, 0, 0, row_no_info, 0},
};
const unwind_module kModule{kA, kA + 0x1000, kRows, sizeof kRows / sizeof kRows[0], nullptr, 0};
const unwind_table_set kSet{&kModule, 1};
}  // namespace

TEST_CASE("find_unwind_row: module and row binary search, gaps and no_info rows") {
  CHECK(find_unwind_row(&kSet, kA - 1) == nullptr);
  CHECK(find_unwind_row(&kSet, kA)->cfa_off == 8);
  CHECK(find_unwind_row(&kSet, kA + 0xff)->cfa_off == 8);
  CHECK(find_unwind_row(&kSet, kA + 0x100)->cfa_off == 32);
  CHECK(find_unwind_row(&kSet, kA + 0x250)->kind == row_cfa_rbp);
  CHECK(find_unwind_row(&kSet, kA + 0x650) == nullptr);
  CHECK(find_unwind_row(&kSet, kA + 0x900)->kind == row_cfa_rsp);
  CHECK(find_unwind_row(&kSet, kA + 0x1000) == nullptr);
  CHECK(find_unwind_row(nullptr, kA) == nullptr);
  const unwind_table_set empty{nullptr, 0};
  CHECK(find_unwind_row(&empty, kA) == nullptr);
}

TEST_CASE("a frameless leaf keeps its caller; rsp- and rbp-based frames and the FP fallback chain up") {
  fake_stack s;
  // Leaf at kA+0x10 (CFA = sp+8): return address at word 0 -> into a rsp+32 function at kA+0x120.
  s.words[0] = kA + 0x121;
  // That frame: CFA = word 1 + 32 bytes = word 5; return address at word 4 -> rbp-based function.
  s.words[4] = kA + 0x201;
  // rbp-based frame: rbp = word 10, CFA = rbp + 16 = word 12, caller's rbp saved at CFA-16 = word 10,
  // return address at word 11 -> code without CFI.
  s.words[10] = s.at(20);
  s.words[11] = kNoCfi + 0x10;
  // Frame-pointer code: record at word 20 {next fp, ra}.
  s.words[20] = s.at(30);
  s.words[21] = kNoCfi + 0x20;
  s.words[30] = 0;
  s.words[31] = kA + 0x401;  // ends in an outermost function (its row says: stop)
  std::uint64_t out[16];
  unwind_result r = unwind_live(&kSet, kA + 0x10, s.at(0), s.at(10), 0, out, 16);
  REQUIRE(r.depth == 6);
  CHECK(out[0] == kA + 0x10);
  CHECK(out[1] == kA + 0x121);
  CHECK(out[2] == kA + 0x201);
  CHECK(out[3] == kNoCfi + 0x10);
  CHECK(out[4] == kNoCfi + 0x20);
  CHECK(out[5] == kA + 0x401);
  CHECK_FALSE(r.truncated);

  // Frame pointers alone lose the leaf's caller (kA+0x121) and the rsp-based frame's return address.
  unwind_result f = unwind_live(nullptr, kA + 0x10, s.at(0), s.at(10), 0, out, 16);
  CHECK(f.depth < r.depth);

  // The depth limit: truncated only when a frame is left.
  r = unwind_live(&kSet, kA + 0x10, s.at(0), s.at(10), 0, out, 3);
  CHECK(r.depth == 3);
  CHECK(r.truncated);
  r = unwind_live(&kSet, kA + 0x10, s.at(0), s.at(10), 0, out, 6);
  CHECK(r.depth == 6);
  CHECK_FALSE(r.truncated);
  CHECK(unwind_live(&kSet, kA + 0x10, s.at(0), s.at(10), 0, out, 0).depth == 0);
}

TEST_CASE("PLT rows add 8 past the push, by pc & 15") {
  fake_stack s;
  s.words[0] = kA + 0x801;  // return address when CFA = sp+8
  s.words[1] = kA + 0x811;  // return address when CFA = sp+16 (after the PLT's push)
  std::uint64_t out[4];
  unwind_result r = unwind_live(&kSet, kA + 0x300 + 6, s.at(0), 0, 0, out, 2);
  REQUIRE(r.depth == 2);
  CHECK(out[1] == kA + 0x801);
  r = unwind_live(&kSet, kA + 0x300 + 11, s.at(0), 0, 0, out, 2);
  REQUIRE(r.depth == 2);
  CHECK(out[1] == kA + 0x811);
}

TEST_CASE("bounds: CFA past the stack end, oversized, misaligned, saved rbp outside the frame, zero page") {
  fake_stack s;
  std::uint64_t out[8];
  s.words[3] = kA + 0x801;
  // rsp+32 frame: CFA = word 4, return address in word 3; a stack end below the CFA stops the walk.
  CHECK(unwind_live(&kSet, kA + 0x100, s.at(0), 0, s.at(3), out, 8).depth == 1);
  CHECK(unwind_live(&kSet, kA + 0x100, s.at(0), 0, s.at(4), out, 8).depth >= 2);
  // rbp-based frame with rbp below sp, or far above it.
  CHECK(unwind_live(&kSet, kA + 0x200, s.at(8), s.at(2), 0, out, 8).depth == 1);
  CHECK(unwind_live(&kSet, kA + 0x200, s.at(0), s.at(0) + kMaxFrameSize + 64, 0, out, 8).depth == 1);
  // Misaligned rbp.
  CHECK(unwind_live(&kSet, kA + 0x200, s.at(0), s.at(10) + 4, 0, out, 8).depth == 1);
  // A return address in the zero page ends the walk.
  s.words[0] = 12;
  CHECK(unwind_live(&kSet, kA + 0x10, s.at(0), 0, 0, out, 8).depth == 1);
  // An "unknown" row falls back to the frame-pointer row, checked like a walk without tables.
  s.words[10] = 0;
  s.words[11] = kNoCfi + 0x30;
  unwind_result r = unwind_live(&kSet, kA + 0x510, s.at(0), s.at(10), 0, out, 8);
  REQUIRE(r.depth == 2);
  CHECK(out[1] == kNoCfi + 0x30);
  CHECK(unwind_live(&kSet, kA + 0x510, s.at(12), s.at(10), 0, out, 8).depth == 1);  // fp below sp
}

TEST_CASE("unwind_interrupted without published tables is the walk without tables") {
  REQUIRE(g_unwind_tables.load() == nullptr);
  fake_stack s;
  s.words[10] = s.at(20);
  s.words[11] = kNoCfi + 1;
  s.words[20] = 0;
  s.words[21] = kNoCfi + 2;
  std::uint64_t a[8], b[8];
  unwind_result x = unwind_interrupted(kNoCfi, s.at(0), s.at(10), 0, a, 8);
  unwind_result y = unwind_live(nullptr, kNoCfi, s.at(0), s.at(10), 0, b, 8);
  REQUIRE(x.depth == y.depth);
  CHECK(x.depth == 3);
  CHECK(std::memcmp(a, b, x.depth * sizeof a[0]) == 0);
}

namespace {
void* g_ra[3];
std::uint64_t g_out[64];
unwind_result g_result;

// Captures this thread's registers and walks from them with the published tables.
__attribute__((noinline)) void walk_here() {
  ucontext_t uc;
  getcontext(&uc);
  g_ra[0] = __builtin_return_address(0);
  std::uintptr_t pc = static_cast<std::uintptr_t>(uc.uc_mcontext.gregs[REG_RIP]);
  std::uintptr_t sp = static_cast<std::uintptr_t>(uc.uc_mcontext.gregs[REG_RSP]);
  std::uintptr_t fp = static_cast<std::uintptr_t>(uc.uc_mcontext.gregs[REG_RBP]);
  g_result = unwind_interrupted(pc, sp, fp, current_thread_stack_end(sp, 0, false), g_out, 64);
  __asm__ volatile("" ::: "memory");
}
__attribute__((noinline)) void level2() {
  g_ra[1] = __builtin_return_address(0);
  walk_here();
  __asm__ volatile("" ::: "memory");
}
__attribute__((noinline)) void level1() {
  g_ra[2] = __builtin_return_address(0);
  level2();
  __asm__ volatile("" ::: "memory");
}
}  // namespace

TEST_CASE("the real stack of this thread is walked through the tables built from memory") {
  REQUIRE(selfprof::build_unwind_tables());
  level1();
  selfprof::release_unwind_tables();
  REQUIRE(g_result.depth >= 5);
  // out[0] is the pc in walk_here; then its return address into level2, level2's into level1, ...
  CHECK(g_out[1] == reinterpret_cast<std::uint64_t>(g_ra[0]));
  CHECK(g_out[2] == reinterpret_cast<std::uint64_t>(g_ra[1]));
  CHECK(g_out[3] == reinterpret_cast<std::uint64_t>(g_ra[2]));
  // The walk reaches the thread's first frame (doctest's main, then libc's start code) without a bound
  // tripping: it ends at an outermost row or the end of the frame chain, not the depth limit.
  CHECK_FALSE(g_result.truncated);
}
