// The ring source's unwinding of one sample (unwind_sample): the copied stack walked with frame records,
// continued with the kernel's frame-pointer chain where the copy ends, at the position where both agree
// (so repeated return addresses of a recursion are not taken twice), and never past max_depth; a frame
// larger than the copy walked on over the live stack while the bytes both hold agree; a stack that goes
// on past the copy with nothing to continue it marked truncated, and asking for the kernel's user chain
// where a frame pointer leads on past the copy.
#include <doctest/doctest.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

#include <selfprof/sources/perf_ring.hpp>

using selfprof::detail::row_cfa_rsp;
using selfprof::detail::row_no_info;
using selfprof::detail::row_outermost;
using selfprof::detail::unwind_module;
using selfprof::detail::unwind_row;
using selfprof::detail::unwind_table_set;

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

TEST_CASE(
    "unwind_sample: a kernel chain that disagrees with the copy is not joined; the stack is marked cut") {
  ring_fake_stack s(0x401000, 0x402000);
  // A chain of code without frame pointers: it went wrong after the leaf.
  const std::uint64_t chain[] = {kRingPc, 0x999000, 0x998000, 0x997000};
  std::uint64_t out[16];
  bool truncated = false, spliced = true;
  const std::size_t d = selfprof::detail::unwind_sample(nullptr, kRingPc, kRingSp, kRingBp, s.data(), 32,
                                                        chain, 4, out, 16, truncated, spliced);
  CHECK(d == 3);
  CHECK_FALSE(spliced);
  CHECK(truncated);  // the copy ended before the stack did, and nothing went on from there
  CHECK(out[1] == 0x401000);
  CHECK(out[2] == 0x402000);
}

TEST_CASE("unwind_sample: a stack that ends inside the copy is whole, without a chain") {
  ring_fake_stack s(0x401000, 0x402000);
  s.words[2] = 0;  // the outermost frame record: saved rbp 0
  std::uint64_t out[16];
  bool truncated = true, spliced = true;
  const std::size_t d = selfprof::detail::unwind_sample(nullptr, kRingPc, kRingSp, kRingBp, s.data(), 32,
                                                        nullptr, 0, out, 16, truncated, spliced);
  CHECK(d == 3);
  CHECK_FALSE(truncated);
  CHECK_FALSE(spliced);
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
  CHECK_FALSE(truncated);
}

TEST_CASE("unwind_sample: no copy and no chain past the leaf: the leaf, marked truncated") {
  const std::uint64_t chain[] = {kRingPc};
  std::uint64_t out[8];
  bool truncated = false, spliced = true;
  const std::size_t d = selfprof::detail::unwind_sample(nullptr, kRingPc, kRingSp, kRingBp, nullptr, 0, chain,
                                                        1, out, 8, truncated, spliced);
  CHECK(d == 1);
  CHECK(truncated);
  CHECK_FALSE(spliced);
}

namespace {

// The live memory behind ring_fake_stack's copy: the frame records go on past it (0x7020 -> 0x7030 ->
// 0x7040), and each return address follows a `call rel32` unless `calls` is false.
struct chain_fake_memory {
  std::uint64_t stack[8] = {0x7010, 0x401010, 0x7020, 0x401020, 0x7030, 0x401030, 0x7040, 0x401040};
  unsigned char code[0x40] = {};  // [0x401010, 0x401050)
  explicit chain_fake_memory(bool calls) {
    if (calls)
      for (std::size_t ra = 0x10; ra <= 0x40; ra += 0x10) code[ra - 5] = 0xe8;  // call rel32 just before each
  }
  static std::size_t read(void* ctx, std::uintptr_t addr, void* out, std::size_t len) {
    auto* m = static_cast<chain_fake_memory*>(ctx);
    if (addr >= 0x7000 && addr + len <= 0x7000 + sizeof m->stack) {
      std::memcpy(out, reinterpret_cast<const unsigned char*>(m->stack) + (addr - 0x7000), len);
      return len;
    }
    if (addr >= 0x401000 && addr + len <= 0x401000 + sizeof m->code) {
      std::memcpy(out, m->code + (addr - 0x401000), len);
      return len;
    }
    return 0;
  }
};

}  // namespace

TEST_CASE("unwind_sample: a stack cut at the copy where frame records go on asks for the user chain") {
  ring_fake_stack s(0x401010, 0x401020);  // frame 2's saved rbp (0x7020) leads on past the copy
  chain_fake_memory mem(true);
  selfprof::detail::live_stack_reader live;
  live.read = chain_fake_memory::read;
  live.ctx = &mem;
  std::uint64_t out[16];
  bool truncated = false, spliced = false;
  selfprof::detail::copy_end end;
  std::size_t d = selfprof::detail::unwind_sample(nullptr, kRingPc, kRingSp, kRingBp, s.data(), 32, nullptr,
                                                  0, out, 16, truncated, spliced, &live, &end);
  CHECK(d == 3);
  CHECK(truncated);
  CHECK(end.reached);
  CHECK(end.chain_would);
  // With a chain that continues it: spliced, and nothing more is wanted.
  const std::uint64_t chain[] = {kRingPc, 0x401010, 0x401020, 0x401030};
  d = selfprof::detail::unwind_sample(nullptr, kRingPc, kRingSp, kRingBp, s.data(), 32, chain, 4, out, 16,
                                      truncated, spliced, &live, &end);
  CHECK(d == 4);
  CHECK(spliced);
  CHECK(end.reached);
  CHECK_FALSE(end.chain_would);
  // Return addresses that follow no call (code without frame pointers keeping a stack address in rbp):
  // cut, and no chain asked for.
  chain_fake_memory data(false);
  live.ctx = &data;
  d = selfprof::detail::unwind_sample(nullptr, kRingPc, kRingSp, kRingBp, s.data(), 32, nullptr, 0, out, 16,
                                      truncated, spliced, &live, &end);
  CHECK(truncated);
  CHECK(end.reached);
  CHECK_FALSE(end.chain_would);
  // Without a reader nothing can be told.
  d = selfprof::detail::unwind_sample(nullptr, kRingPc, kRingSp, kRingBp, s.data(), 32, nullptr, 0, out, 16,
                                      truncated, spliced, nullptr, &end);
  CHECK_FALSE(end.chain_would);
  // A stack that ends inside the copy never reached its end.
  s.words[2] = 0;
  d = selfprof::detail::unwind_sample(nullptr, kRingPc, kRingSp, kRingBp, s.data(), 32, nullptr, 0, out, 16,
                                      truncated, spliced, &live, &end);
  CHECK(d == 3);
  CHECK_FALSE(truncated);
  CHECK_FALSE(end.reached);
}

TEST_CASE("chain_switch: asked for after kChainWantedSamples cut stacks, given back when it continues few") {
  using selfprof::detail::chain_switch;
  using selfprof::detail::copy_end;
  const copy_end would{true, true}, reached{true, false};
  chain_switch c;
  CHECK(c.due() == chain_switch::action::none);
  for (std::uint64_t i = 0; i + 1 < selfprof::detail::kChainWantedSamples; ++i) c.note(would, false, 0);
  c.note(reached, false, 0);  // cut where no frame chain goes on: not counted
  CHECK(c.due() == chain_switch::action::none);
  c.note(would, false, 0);
  CHECK(c.due() == chain_switch::action::ask);
  CHECK(c.on());
  c.handed_over(10);
  // Samples taken before the hand-over (still in a ring, without the chain) are not part of the trial.
  for (std::uint64_t i = 0; i < 2 * selfprof::detail::kChainTrialSamples; ++i) c.note(reached, false, 9);
  CHECK(c.due() == chain_switch::action::none);
  CHECK(c.on());
  CHECK(c.cut() == selfprof::detail::kChainWantedSamples);
  // The trial: a quarter or more continued keeps it.
  chain_switch kept = c;
  for (std::uint64_t i = 0; i < selfprof::detail::kChainTrialSamples; ++i) kept.note(reached, i % 4 == 0, 10);
  CHECK(kept.due() == chain_switch::action::none);
  CHECK(kept.on());
  for (std::uint64_t i = 0; i < 100; ++i) kept.note(reached, false, 10);  // the trial is over
  CHECK(kept.due() == chain_switch::action::none);
  // Fewer: given back, and never asked for again.
  for (std::uint64_t i = 0; i < selfprof::detail::kChainTrialSamples; ++i) c.note(reached, i == 0, 10);
  CHECK(c.due() == chain_switch::action::give_back);
  CHECK_FALSE(c.on());
  CHECK(c.given_back());
  for (int i = 0; i < 10; ++i) c.note(would, false, 0);
  CHECK(c.due() == chain_switch::action::none);
  CHECK_FALSE(c.on());
  // Asked for from the start: nothing to switch.
  chain_switch fixed;
  fixed.start_on();
  for (std::uint64_t i = 0; i < selfprof::detail::kChainTrialSamples; ++i) fixed.note(reached, false, 10);
  CHECK(fixed.due() == chain_switch::action::none);
  CHECK(fixed.on());
}

namespace {

// A thread's whole stack at a made-up address, of which a sample copied the first `copy_words`; the
// reader gives what is there "now" (`now`, a copy the test may change after the sample), and the code
// bytes of [kLiveCode, kLiveCode + 0x1000) (`code`).
constexpr std::uintptr_t kLiveBase = 0x7f0000100000, kLiveCode = 0x500000;
struct live_fake_stack {
  std::vector<std::uint64_t> then, now;
  std::vector<unsigned char> code = std::vector<unsigned char>(0x1000, 0x90);
  std::size_t reads = 0;
  explicit live_fake_stack(std::size_t words) : then(words, 0x1111) {}
  void publish() { now = then; }
  // A `call rel32` that ends at `ret` (kLiveCode-relative) and calls `target`.
  void call(std::uint32_t ret, std::uint32_t target) {
    code[ret - 5] = 0xe8;
    const std::int32_t rel = static_cast<std::int32_t>(target) - static_cast<std::int32_t>(ret);
    std::memcpy(&code[ret - 4], &rel, 4);
  }
  static std::size_t read(void* ctx, std::uintptr_t addr, void* out, std::size_t len) {
    auto* self = static_cast<live_fake_stack*>(ctx);
    if (addr >= kLiveCode && addr + len <= kLiveCode + self->code.size()) {
      std::memcpy(out, &self->code[addr - kLiveCode], len);
      return len;
    }
    ++self->reads;
    const std::uintptr_t end = kLiveBase + self->now.size() * 8;
    if (addr < kLiveBase || addr >= end) return 0;
    const std::size_t n = std::min<std::size_t>(len, end - addr);
    std::memcpy(out, reinterpret_cast<const unsigned char*>(self->now.data()) + (addr - kLiveBase), n);
    return n;
  }
};

// Rows: 0x000 a frameless leaf (rsp+8), 0x100 a frame of `big` bytes (rsp+big), 0x200 rsp+16, 0x300
// outermost.
struct live_fake_code {
  unwind_row rows[6];
  unwind_module module;
  unwind_table_set set;
  explicit live_fake_code(std::int32_t big)
      : rows{{0x000, 8, 0, row_cfa_rsp, 0},  {0x100, big, 0, row_cfa_rsp, 0},
             {0x200, 16, 0, row_cfa_rsp, 0}, {0x300, 0, 0, row_outermost, 0},
             {0x400, 0, 0, row_no_info, 0},  {0x1000, 0, 0, row_no_info, 0}},
        module{kLiveCode, kLiveCode + 0x1000, rows, 6, nullptr, 0},
        set{&module, 1} {}
};

// The stack of leaf -> big frame -> rsp+16 frame -> outermost, its frames laid out as the rows say.
live_fake_stack big_frame_stack(std::size_t big) {
  live_fake_stack s(big / 8 + 64);
  s.then[0] = kLiveCode + 0x101;            // the leaf's return address, into the big frame
  s.then[big / 8] = kLiveCode + 0x201;      // the big frame's, at sp+8 + big - 8
  s.then[big / 8 + 2] = kLiveCode + 0x301;  // the rsp+16 frame's, into the outermost function
  s.call(0x201, 0x100);                     // the rsp+16 function called the big frame's function
  s.publish();
  return s;
}

std::size_t walk_live(const live_fake_code& code, live_fake_stack& s, std::size_t copy_bytes,
                      selfprof::detail::live_stack_reader* live, std::uint64_t* out) {
  bool truncated = false, spliced = false;
  return selfprof::detail::unwind_sample(&code.set, kLiveCode + 0x10, kLiveBase, 0,
                                         reinterpret_cast<const unsigned char*>(s.then.data()), copy_bytes,
                                         nullptr, 0, out, 16, truncated, spliced, live);
}

}  // namespace

TEST_CASE("unwind_sample: a frame larger than the copy is walked on over the live stack while it agrees") {
  const live_fake_code code(0x3000);  // a 12 KiB frame: the copy of 8 KiB ends inside it
  live_fake_stack s = big_frame_stack(0x3000);
  selfprof::detail::live_stack_reader live;
  live.read = live_fake_stack::read;
  live.ctx = &s;
  std::uint64_t out[16];
  // Without a reader the walk stops at the big frame, as it did before.
  CHECK(walk_live(code, s, 8192, nullptr, out) == 2);
  REQUIRE(walk_live(code, s, 8192, &live, out) == 4);
  CHECK(out[1] == kLiveCode + 0x101);
  CHECK(out[2] == kLiveCode + 0x201);
  CHECK(out[3] == kLiveCode + 0x301);
  CHECK(live.continued == 1);
  // The thread left the frame since: a word the copy and the live stack share differs. Not walked on.
  s.now[1000] = 0x2222;
  CHECK(walk_live(code, s, 8192, &live, out) == 2);
  CHECK(live.continued == 1);
  // The thread returned from the big frame and called another function from elsewhere: the return
  // address past the copy is not a call into the big frame's function, though the dead frame's bytes
  // stayed. Not walked on.
  s.publish();
  s.now[0x3000 / 8] = kLiveCode + 0x281;
  s.call(0x281, 0x380);
  CHECK(walk_live(code, s, 8192, &live, out) == 2);
  CHECK(live.continued == 1);
  // Nothing to read (the thread is gone): not walked on either.
  s.now.clear();
  CHECK(walk_live(code, s, 8192, &live, out) == 2);
  // A copy shorter than the bytes to compare is never continued.
  s.publish();
  CHECK(walk_live(code, s, 56, &live, out) == 2);
}

TEST_CASE("unwind_sample: each read of the live stack reaches twice as far, within kLiveMaxBytes") {
  using selfprof::detail::kLiveFirstBytes;
  using selfprof::detail::kLiveMaxBytes;
  // A 40 KiB frame: its return address lies 32 KiB past the 8 KiB copy.
  const live_fake_code code(0xa000);
  live_fake_stack s = big_frame_stack(0xa000);
  selfprof::detail::live_stack_reader live;
  live.read = live_fake_stack::read;
  live.ctx = &s;
  std::uint64_t out[16];
  REQUIRE(walk_live(code, s, 8192, &live, out) == 4);
  CHECK(out[3] == kLiveCode + 0x301);
  CHECK(s.reads == 5);  // reaching 4, 8, 16, 32 and 64 KiB past the copy
  // A frame beyond the budget: the walk stops there, after a bounded number of reads.
  const std::size_t huge = 8192 + kLiveMaxBytes + 0x1000;
  const live_fake_code far(static_cast<std::int32_t>(huge));
  live_fake_stack t = big_frame_stack(huge);
  live.ctx = &t;
  CHECK(walk_live(far, t, 8192, &live, out) == 2);
  CHECK(t.reads == 6);  // 4 KiB to kLiveMaxBytes (128 KiB)
  static_assert(kLiveFirstBytes << 5 == kLiveMaxBytes, "the reads counted above");
}
