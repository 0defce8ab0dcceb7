// The stack walker on forged stacks. Without tables (frame pointers only): a clean chain, every bound
// (alignment, order, frame size, stack end), the depth limit, unreadable memory, the prologue/epilogue
// heuristics, and that this mode is the one walker with no rows. Over a copied stack: the scan for a frame
// record when rbp is unknown (stale record vs live one, none, the candidates bound) and a copy that ends
// before the stack does.
#include <doctest/doctest.h>

#include <sys/mman.h>

#include <cstring>
#include <vector>

#include <selfprof/signal/unwind.hpp>
#include <selfprof/unwind/copied_stack.hpp>

using selfprof::detail::cfi_rows;
using selfprof::detail::code_ranges;
using selfprof::detail::frame_pointer_rows;
using selfprof::detail::g_unwind_tables;
using selfprof::detail::kMaxFrameSize;
using selfprof::detail::kMaxRecordCandidates;
using selfprof::detail::live_stack;
using selfprof::detail::plausible_frame_record;
using selfprof::detail::raw_readable;
using selfprof::detail::row_cfa_rbp;
using selfprof::detail::row_cfa_rsp;
using selfprof::detail::row_no_info;
using selfprof::detail::row_outermost;
using selfprof::detail::stack_copy;
using selfprof::detail::unwind_interrupted;
using selfprof::detail::unwind_live;
using selfprof::detail::unwind_module;
using selfprof::detail::unwind_result;
using selfprof::detail::unwind_row;
using selfprof::detail::unwind_stack_copy;
using selfprof::detail::unwind_table_set;
using selfprof::detail::walk_end;
using selfprof::detail::walk_frames;
using selfprof::detail::walk_regs;

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
  unwind_result r = unwind_live(nullptr, kCode, s.at(0), s.at(10), 0, out, 16);
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
  CHECK(unwind_live(nullptr, kCode, s.at(0), s.at(10), 0, out, 16).depth == 2);
  s.record(10, s.at(5), kCode + 1);  // goes down
  CHECK(unwind_live(nullptr, kCode, s.at(0), s.at(10), 0, out, 16).depth == 2);
  CHECK(unwind_live(nullptr, kCode, s.at(12), s.at(10), 0, out, 16).depth == 1);  // fp below sp
  s.record(10, s.at(10) + kMaxFrameSize + 64, kCode + 1);                         // oversized frame
  CHECK(unwind_live(nullptr, kCode, s.at(0), s.at(10), 0, out, 16).depth == 2);
  s.record(10, s.at(20), kCode + 1);
  s.record(20, s.at(30), kCode + 2);
  CHECK(unwind_live(nullptr, kCode, s.at(0), s.at(10), s.at(21), out, 16).depth == 2);  // end cuts frame 20
  s.record(10, s.at(20), 12);  // a "return address" in the zero page
  CHECK(unwind_live(nullptr, kCode, s.at(0), s.at(10), 0, out, 16).depth == 1);
}

TEST_CASE("the depth limit marks the stack truncated only when a frame is left") {
  fp_fake_stack s;
  for (std::size_t i = 0; i < 10; ++i) s.record(10 + 4 * i, s.at(14 + 4 * i), kCode + i);
  s.record(50, 0, kCode + 100);
  std::uint64_t out[32];
  unwind_result r = unwind_live(nullptr, kCode, s.at(0), s.at(10), 0, out, 5);
  CHECK(r.depth == 5);
  CHECK(r.truncated);
  r = unwind_live(nullptr, kCode, s.at(0), s.at(10), 0, out, 32);
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
  unwind_result r = unwind_live(nullptr, kCode, base, base + 64, 0, out, 8);
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
  unwind_result r = unwind_live(nullptr, pc(push_rbp), s.at(0), s.at(10), 0, out, 8);
  REQUIRE(r.depth == 3);
  CHECK(out[1] == kCode + 7);
  CHECK(out[2] == kCode + 9);
  CHECK(r.leaf_fixed);
  r = unwind_live(nullptr, pc(ret), s.at(0), s.at(10), 0, out, 8);
  CHECK(out[1] == kCode + 7);
  r = unwind_live(nullptr, pc(mov), s.at(0), s.at(10), 0, out, 8);
  CHECK(out[1] == kCode + 8);
  r = unwind_live(nullptr, pc(body), s.at(0), s.at(10), 0, out, 8);
  CHECK(r.depth == 2);
  CHECK_FALSE(r.leaf_fixed);
#endif
}

TEST_CASE("frame pointers only is the one walker with no rows, whatever says there are none") {
  fp_fake_stack s;
  s.record(10, s.at(20), kCode + 1);
  s.record(20, s.at(40), kCode + 2);
  s.record(40, 0, 0);  // a null return address ends the chain cleanly
  const unwind_table_set empty{nullptr, 0};
  std::uint64_t a[16], b[16], c[16], d[16];
  unwind_result x = unwind_live(nullptr, kCode, s.at(0), s.at(10), 0, a, 16);
  unwind_result y = unwind_live(&empty, kCode, s.at(0), s.at(10), 0, b, 16);
  REQUIRE(g_unwind_tables.load() == nullptr);
  unwind_result z = unwind_interrupted(kCode, s.at(0), s.at(10), 0, c, 16);
  // The template itself, with the no-rows policy and with a CFI policy over no set.
  live_stack mem(s.at(0), 0);
  walk_regs regs{kCode, s.at(0), s.at(10), true, true};
  unwind_result w = unwind_result{};
  d[w.depth++] = kCode;
  w = walk_frames(mem, frame_pointer_rows{}, regs, w, d, 16);
  REQUIRE(x.depth == 3);
  CHECK(x.end == walk_end::zero_return);
  CHECK(x.clean());
  for (const unwind_result* r : {&y, &z, &w}) {
    CHECK(r->depth == x.depth);
    CHECK(r->end == x.end);
  }
  CHECK(std::memcmp(a, b, x.depth * sizeof a[0]) == 0);
  CHECK(std::memcmp(a, c, x.depth * sizeof a[0]) == 0);
  CHECK(std::memcmp(a, d, x.depth * sizeof a[0]) == 0);
  live_stack mem2(s.at(0), 0);
  walk_regs regs2{kCode, s.at(0), s.at(10), true, true};
  unwind_result v = unwind_result{};
  b[v.depth++] = kCode;
  v = walk_frames(mem2, cfi_rows{nullptr}, regs2, v, b, 16);
  CHECK(v.depth == x.depth);
  CHECK(std::memcmp(a, b, x.depth * sizeof a[0]) == 0);
  // The walk stopped at the frame whose return address was null.
  CHECK(regs.sp == s.at(22));
  CHECK(regs.fp == s.at(40));
}

TEST_CASE("a leaf in its epilogue: rbp's save slot below sp means rbp holds the caller's value again") {
  // Rows over [kCode, kCode + 0x1000): 0x000 an epilogue that popped rbp (CFA = rsp+16, and the CFI
  // still says rbp was saved at CFA-32, now below sp), 0x100 rbp-based, 0x200 outermost, 0x300 a
  // frameless leaf.
  const unwind_row rows[] = {
      {0x000, 16, -32, row_cfa_rsp, 0}, {0x100, 16, -16, row_cfa_rbp, 0}, {0x200, 0, 0, row_outermost, 0},
      {0x300, 8, 0, row_cfa_rsp, 0},    {0x400, 0, 0, row_no_info, 0},    {0x1000, 0, 0, row_no_info, 0},
  };
  const unwind_module module{kCode, kCode + 0x1000, rows, sizeof rows / sizeof rows[0], nullptr, 0};
  const unwind_table_set set{&module, 1};
  fp_fake_stack s;
  s.words[1] = kCode + 0x101;      // the leaf's return address (CFA = sp+16), into the rbp-based caller
  s.record(10, 0, kCode + 0x201);  // the caller's record at rbp, returning into the outermost function
  std::uint64_t out[16];
  unwind_result r = unwind_live(&set, kCode + 0x10, s.at(0), s.at(10), 0, out, 16);
  REQUIRE(r.depth == 3);
  CHECK(out[1] == kCode + 0x101);
  CHECK(out[2] == kCode + 0x201);
  CHECK(r.end == walk_end::outermost);
  // Past the leaf a frame stands at a call, never in an epilogue: a slot below sp there is a bad frame.
  s.words[0] = kCode + 0x11;  // a frameless leaf returns into the epilogue rows
  r = unwind_live(&set, kCode + 0x310, s.at(0), s.at(10), 0, out, 16);
  CHECK(r.depth == 2);
  CHECK(r.end == walk_end::bad_frame);
}

namespace {
// A copied stack at a made-up address: the walker reads only the copy, never that address.
const std::uintptr_t kCopyBase = 0x7f0000100000;
// Made-up code: [kCopyCode, kCopyCode + 0x10000) is "code" for the scan; the table below covers
// [kCopyCfi, kCopyCfi + 0x1000).
const std::uintptr_t kCopyCode = 0x600000, kCopyCfi = 0x608000;
struct copy_fake_code {
  bool contains(std::uintptr_t a) const { return a >= kCopyCode && a < kCopyCode + 0x10000; }
};
// Rows: 0x000 rsp+8 (a frameless leaf), 0x100 rsp+32, 0x200 rbp-based with rbp saved at CFA-16,
// 0x400 outermost.
const unwind_row kCopyRows[] = {
    {0x000, 8, 0, row_cfa_rsp, 0},  {0x100, 32, 0, row_cfa_rsp, 0},  {0x200, 16, -16, row_cfa_rbp, 0},
    {0x300, 0, 0, row_no_info, 0},  {0x400, 0, 0, row_outermost, 0}, {0x500, 0, 0, row_no_info, 0},
    {0x1000, 0, 0, row_no_info, 0},
};
const unwind_module kCopyModule{
    kCopyCfi, kCopyCfi + 0x1000, kCopyRows, sizeof kCopyRows / sizeof kCopyRows[0], nullptr, 0};
const unwind_table_set kCopySet{&kCopyModule, 1};

struct fake_copy {
  std::vector<std::uint64_t> words = std::vector<std::uint64_t>(512, 0);
  std::uintptr_t at(std::size_t word) const { return kCopyBase + 8 * word; }
  void record(std::size_t word, std::uintptr_t next, std::uint64_t ret) {
    words[word] = next;
    words[word + 1] = ret;
  }
  stack_copy copy(std::size_t n_words, std::size_t extra_bytes = 0) const {
    stack_copy c;
    c.base = kCopyBase;
    c.data = reinterpret_cast<const unsigned char*>(words.data());
    c.size = n_words * 8 + extra_bytes;
    return c;
  }
};
}  // namespace

TEST_CASE("copied stack: rbp unknown, no frame record at all: only the pc, scanned, not clean") {
  fake_copy s;
  s.words[3] = 0x1234;         // data, not code
  s.words[7] = kCopyCode + 4;  // a code address, but next to a "saved rbp" pointing down
  s.words[6] = kCopyBase;
  std::uint64_t out[16];
  unwind_result r = unwind_stack_copy(nullptr, kCopyCode + 0x10, s.copy(64), copy_fake_code{}, out, 16);
  CHECK(r.depth == 1);
  CHECK(out[0] == kCopyCode + 0x10);
  CHECK(r.scanned);
  CHECK_FALSE(r.clean());
  CHECK(r.end == walk_end::bad_frame);
}

TEST_CASE("copied stack: a stale frame record below the live one loses to the live one's clean walk") {
  fake_copy s;
  // Stale record (left by an earlier, deeper call) at word 2: its chain goes on for two frames and
  // then into garbage. It is deeper than the live chain, and found first.
  s.record(2, s.at(40), kCopyCode + 0x50);
  s.record(40, s.at(50), kCopyCode + 0x51);
  s.record(50, 0x999, 5);  // a "return address" in the zero page: not a clean end
  // The live record at word 6, whose chain ends in a null return address.
  s.record(6, s.at(20), kCopyCode + 0x60);
  s.record(20, 0, 0);
  CHECK(plausible_frame_record(s.copy(64), s.at(2), copy_fake_code{}));
  CHECK(plausible_frame_record(s.copy(64), s.at(6), copy_fake_code{}));
  std::uint64_t out[16];
  unwind_result r = unwind_stack_copy(nullptr, kCopyCode + 0x10, s.copy(64), copy_fake_code{}, out, 16);
  REQUIRE(r.depth == 2);
  CHECK(out[1] == kCopyCode + 0x60);
  CHECK(r.scanned);
  CHECK(r.clean());
  CHECK(r.end == walk_end::zero_return);

  // With no clean walk among the candidates, the deepest one wins and out[] holds it, even though a
  // shallower candidate was walked after it.
  s.record(20, 0x777, 6);
  r = unwind_stack_copy(nullptr, kCopyCode + 0x10, s.copy(64), copy_fake_code{}, out, 16);
  REQUIRE(r.depth == 3);
  CHECK(out[1] == kCopyCode + 0x50);
  CHECK(out[2] == kCopyCode + 0x51);
  CHECK(r.scanned);
  CHECK_FALSE(r.clean());
}

TEST_CASE("copied stack: at most kMaxRecordCandidates frame records are tried") {
  // n plausible records whose walks end badly (saved rbp 0, then nothing), then a live one whose walk
  // ends cleanly: found when n < kMaxRecordCandidates, never tried otherwise.
  auto walk = [](int n, std::uint64_t* out) {
    fake_copy s;
    std::size_t w = 0;
    for (int i = 0; i < n; ++i, w += 2) s.record(w, 0, kCopyCode + 0x100 + static_cast<std::uint64_t>(i));
    s.record(w, s.at(w + 40), kCopyCode + 0x60);
    s.record(w + 40, 0, 0);
    return unwind_stack_copy(nullptr, kCopyCode + 0x10, s.copy(512), copy_fake_code{}, out, 16);
  };
  std::uint64_t out[16];
  unwind_result r = walk(kMaxRecordCandidates - 1, out);
  REQUIRE(r.depth == 2);
  CHECK(out[1] == kCopyCode + 0x60);
  CHECK(r.clean());
  r = walk(kMaxRecordCandidates, out);
  REQUIRE(r.depth == 2);
  CHECK(out[1] == kCopyCode + 0x100);  // the first of the equally deep bad walks
  CHECK_FALSE(r.clean());
  CHECK(r.scanned);
}

TEST_CASE("copied stack: CFI rows need no scan; a copy that ends before the stack is a clean end") {
  fake_copy s;
  // Leaf at kCopyCfi+0x10 (CFA = sp+8): return address at word 0 -> into a rsp+32 function, whose
  // return address is at word 4 (CFA = word 5).
  s.words[0] = kCopyCfi + 0x121;
  s.words[4] = kCopyCfi + 0x401;  // into an outermost function
  std::uint64_t out[16];
  unwind_result r = unwind_stack_copy(&kCopySet, kCopyCfi + 0x10, s.copy(64), copy_fake_code{}, out, 16);
  REQUIRE(r.depth == 3);
  CHECK(out[1] == kCopyCfi + 0x121);
  CHECK(out[2] == kCopyCfi + 0x401);
  CHECK_FALSE(r.scanned);
  CHECK(r.end == walk_end::outermost);
  // The copy holds words 0..3 only: the second return address lies past its end.
  r = unwind_stack_copy(&kCopySet, kCopyCfi + 0x10, s.copy(4), copy_fake_code{}, out, 16);
  CHECK(r.depth == 2);
  CHECK(r.end == walk_end::ran_off_copy);
  CHECK(r.clean());
  // A scanned frame record whose chain leads past the end of the copy: clean as well.
  fake_copy t;
  t.record(2, t.at(100), kCopyCode + 0x70);
  r = unwind_stack_copy(nullptr, kCopyCode + 0x10, t.copy(64), copy_fake_code{}, out, 16);
  CHECK(r.depth == 2);
  CHECK(r.scanned);
  CHECK(r.end == walk_end::ran_off_copy);
  CHECK(r.clean());
  // A copy that ends inside the word to read: only a read that starts past the end ran off the copy.
  r = unwind_stack_copy(&kCopySet, kCopyCfi + 0x10, s.copy(4, 4), copy_fake_code{}, out, 16);
  CHECK(r.depth == 2);
  CHECK(r.end == walk_end::bad_frame);
  // The depth limit is a clean end too.
  r = unwind_stack_copy(&kCopySet, kCopyCfi + 0x10, s.copy(64), copy_fake_code{}, out, 2);
  CHECK(r.depth == 2);
  CHECK(r.truncated);
  CHECK(r.clean());
}

TEST_CASE("copied stack: an rbp-based row asks for the scan; a row that saves rbp makes it known") {
  fake_copy s;
  // Leaf at kCopyCfi+0x200 (CFA = rbp+16): rbp unknown, so the scan finds the record at word 4.
  s.record(4, s.at(10), kCopyCfi + 0x201);
  // Its caller is rbp-based too: rbp was restored from the record (CFA-16) and leads to word 10.
  s.record(10, 0, kCopyCfi + 0x401);
  std::uint64_t out[16];
  unwind_result r = unwind_stack_copy(&kCopySet, kCopyCfi + 0x200, s.copy(64), copy_fake_code{}, out, 16);
  CHECK(r.scanned);
  REQUIRE(r.depth == 3);
  CHECK(out[1] == kCopyCfi + 0x201);
  CHECK(out[2] == kCopyCfi + 0x401);
  CHECK(r.end == walk_end::outermost);
}

TEST_CASE("code_ranges: this binary's code is code, its data and stack are not") {
  code_ranges code;
  CHECK(code.empty());
  code.refresh();
  REQUIRE_FALSE(code.empty());
  static int data = 0;
  int local = 0;
  CHECK(code.contains(reinterpret_cast<std::uintptr_t>(&raw_readable)));
  CHECK_FALSE(code.contains(reinterpret_cast<std::uintptr_t>(&data)));
  CHECK_FALSE(code.contains(reinterpret_cast<std::uintptr_t>(&local)));
}
