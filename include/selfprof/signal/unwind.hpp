// The stack walker: one loop over a memory policy (the interrupted thread's live stack, or a copy of a
// blocked thread's stack) and the row in effect at each pc (a CFI row, else the frame-pointer row).
// Context: signal handler (async-signal-safe: no locks, no allocation, every live-stack read bounded and
// probed); the walk over a copy also runs on the wall sampler's thread.
#pragma once

#include <cstddef>
#include <cstdint>

#include "selfprof/signal/arch_x86_64.hpp"
#include "selfprof/signal/raw_syscall.hpp"
#include "selfprof/signal/unwind_rows.hpp"

// NO_SANITIZE: see load_word. ALWAYS_INLINE: see apply_row.
#if defined(__clang__) || defined(__GNUC__)
#define SELFPROF_DETAIL_NO_SANITIZE __attribute__((no_sanitize("address", "thread", "undefined")))
#define SELFPROF_DETAIL_ALWAYS_INLINE __attribute__((always_inline)) inline
#else
#define SELFPROF_DETAIL_NO_SANITIZE
#define SELFPROF_DETAIL_ALWAYS_INLINE inline
#endif

namespace selfprof {
namespace detail {

// Every bound of the walk, with its reason.
// A single frame larger than this is taken for a corrupted chain (async-profiler uses 256 KiB too).
constexpr std::uintptr_t kMaxFrameSize = 256 * 1024;
// How far above sp the walk may go when the thread's stack end is unknown (main-thread default
// RLIMIT_STACK is 8 MiB; deeper stacks are still walked when the thread's end is known).
constexpr std::uintptr_t kMaxStackSpan = 16 * 1024 * 1024;
// A known thread stack larger than this is not trusted as a bound (guards against a bogus descriptor).
constexpr std::uintptr_t kMaxKnownStack = 1024ull * 1024 * 1024;
// CFAs and frame records are 16-byte aligned in ABI-conforming x86-64 code; 8 tolerates hand-written
// assembly.
constexpr std::uintptr_t kFrameAlign = 8;
// Return addresses below this are not code: the chain ended in zeroed memory.
constexpr std::uintptr_t kMinCodeAddress = 4096;
// Readability is probed a page at a time: the smallest page size of the supported systems.
constexpr std::uintptr_t kPageSize = 4096;
// Frame records are 16-byte aligned in ABI-conforming x86-64 code (rsp is 16-aligned after `push %rbp`);
// scanning a copy only at those halves the chance of taking data for a record.
constexpr std::uintptr_t kFrameRecordAlign = 16;
// Candidates for a scanned frame record tried per walk: stale records of earlier calls lie below the
// live one, so the first plausible pair is not always right; the one whose walk ends cleanly is.
constexpr int kMaxRecordCandidates = 32;

// Remembers the highest page range already shown readable, so each page is probed once per walk.
struct read_guard {
  std::uintptr_t ok_lo = 1, ok_hi = 0;  // empty

  bool readable(std::uintptr_t addr, std::size_t len) {
    std::uintptr_t end = addr + len;
    if (end < addr) return false;
    if (addr >= ok_lo && end <= ok_hi) return true;
    std::uintptr_t first = addr & ~(kPageSize - 1);
    std::uintptr_t last = (end - 1) & ~(kPageSize - 1);
    for (std::uintptr_t page = first;; page += kPageSize) {
      if (!(page >= ok_lo && page + kPageSize <= ok_hi) && !raw_readable(page)) return false;
      if (page == last) break;
    }
    if (ok_lo <= ok_hi && first >= ok_lo && first <= ok_hi) {
      if (last + kPageSize > ok_hi) ok_hi = last + kPageSize;  // contiguous: extend
    } else {
      ok_lo = first;
      ok_hi = last + kPageSize;
    }
    return true;
  }
};

// Reads of the interrupted thread's stack and code: bounds-checked and probed by the walker, and not
// instrumented, since a sanitizer would take a read of another frame's saved registers for a bug.
SELFPROF_DETAIL_NO_SANITIZE inline std::uint64_t load_word(std::uintptr_t addr) {
  return *reinterpret_cast<const volatile std::uint64_t*>(addr);
}
SELFPROF_DETAIL_NO_SANITIZE inline unsigned char load_byte(std::uintptr_t addr) {
  return *reinterpret_cast<const volatile unsigned char*>(addr);
}

// The highest address the current thread's frames may occupy, or 0 when unknown.
inline std::uintptr_t current_thread_stack_end(std::uintptr_t sp, std::uintptr_t main_end, bool is_main) {
  if (is_main && main_end > sp && main_end - sp <= kMaxKnownStack) return main_end;
  const std::uintptr_t self = thread_descriptor();
  if (self > sp && self - sp <= kMaxKnownStack) return self;
  return 0;
}

// For a leaf without CFI, interrupted in its prologue or epilogue: the slot of the return address the
// code bytes at `pc` tell (prologue_return_slot), or 0. The code page is probed first.
inline std::uintptr_t leaf_return_slot(std::uintptr_t pc, std::uintptr_t sp) {
  if (!kHasPrologueHeuristics) return 0;
  read_guard code_guard;
  if (pc < kMinCodeAddress || !code_guard.readable(pc, kPrologueBytes)) return 0;
  unsigned char code[kPrologueBytes];
  for (std::size_t i = 0; i < kPrologueBytes; ++i) code[i] = load_byte(pc + i);
  return prologue_return_slot(code, sp);
}

// Why a walk ended.
enum class walk_end : std::uint8_t {
  bad_frame,     // a bound or check failed: what follows is not known to be a stack
  outermost,     // an outermost CFI row: the thread's first frame
  zero_return,   // a null return address: the end of the frame chain
  depth_limit,   // out[] is full and a valid frame is left (truncated)
  ran_off_copy,  // the next read lies past the end of a copied stack (which ended before the stack did)
  rbp_unknown,   // a copy's row needs rbp, which the kernel did not report (the walk scans for a record)
};

struct unwind_result {
  std::size_t depth = 0;
  bool truncated = false;
  bool leaf_fixed = false;  // the leaf's caller came from the prologue/epilogue heuristics
  bool scanned = false;     // a frame record was found by scanning (rbp was not known)
  walk_end end = walk_end::bad_frame;
  // The walk ended where a stack ends (outermost row, null return address, depth limit, end of a copy).
  bool clean() const { return end != walk_end::bad_frame && end != walk_end::rbp_unknown; }
};

// The registers of the frame being unwound.
struct walk_regs {
  std::uintptr_t pc, sp, fp;
  bool fp_known;  // false only in a copy, until a row or a scanned frame record tells rbp
  bool leaf;      // the first frame: its pc is not a return address
};

// The CFA `row` gives at (pc, sp, fp), or 0 when that is no step up the stack: it wraps around, is
// misaligned, leaves no room for the return address above sp, or makes a frame over kMaxFrameSize.
inline std::uintptr_t row_cfa(const unwind_row& row, std::uintptr_t pc, std::uintptr_t sp,
                              std::uintptr_t fp) {
  std::uintptr_t base = row.kind == row_cfa_rbp ? fp : sp;
  std::intptr_t off = row.cfa_off;
  if (row.kind == row_cfa_plt && (pc & 15) >= row.plt_threshold) off += 8;
  std::uintptr_t cfa = base + static_cast<std::uintptr_t>(off);
  if ((off >= 0) != (cfa >= base)) return 0;  // wrapped around
  // One unsigned range test for sp + 8 <= cfa <= sp + kMaxFrameSize (below sp, cfa - sp wraps around).
  if (cfa % kFrameAlign != 0 || cfa - sp - 8 > kMaxFrameSize - 8) return 0;
  return cfa;
}

// Memory policy: the interrupted thread's own stack. Every read lies in [sp, min(stack_end, sp +
// kMaxStackSpan)), is 8-aligned, and each new page is probed before it is read.
class live_stack {
 public:
  static constexpr bool kInterruptedPc = true;  // the leaf's pc may sit in a prologue or epilogue
  static constexpr bool kMayLackFp = false;     // rbp comes with the interrupted context

  live_stack(std::uintptr_t sp, std::uintptr_t stack_end) {
    hi_ = sp + kMaxStackSpan;
    if (hi_ < sp) hi_ = ~std::uintptr_t(0);
    if (stack_end != 0 && stack_end < hi_) hi_ = stack_end;
  }
  bool read(std::uintptr_t addr, std::uint64_t& out) {
    if (!fits(addr, 8)) return false;
    out = load_word(addr);
    return true;
  }
  bool read_pair(std::uintptr_t addr, std::uint64_t& first, std::uint64_t& second) {
    if (!fits(addr, 16)) return false;
    first = load_word(addr);
    second = load_word(addr + 8);
    return true;
  }
  bool past_end(std::uintptr_t) const { return false; }  // a failed live read is a bad frame

 private:
  // The lower bound needs no test: the walker reads nothing below the current sp, which starts at the
  // interrupted sp and only grows (row_cfa and apply_row check it).
  bool fits(std::uintptr_t addr, std::size_t len) {
    return addr + len <= hi_ && addr % 8 == 0 && guard_.readable(addr, len);  // readable: no wrap-around
  }
  std::uintptr_t hi_;
  read_guard guard_;
};

// Memory policy: a copy of part of a thread's stack, `size` bytes that were at [base, base + size).
// Reads stay inside the copy; a read past its end means the copy ended before the stack did.
struct stack_copy {
  static constexpr bool kInterruptedPc = false;  // the pc is where a system call returns, not a prologue
  static constexpr bool kMayLackFp = true;       // the kernel reports a blocked thread's sp and pc only

  std::uintptr_t base = 0;
  const unsigned char* data = nullptr;
  std::size_t size = 0;

  bool read(std::uintptr_t addr, std::uint64_t& out) const {
    if (addr < base || addr - base > size || size - (addr - base) < 8) return false;
    __builtin_memcpy(&out, data + (addr - base), 8);
    return true;
  }
  bool read_pair(std::uintptr_t addr, std::uint64_t& first, std::uint64_t& second) const {
    return read(addr, first) && read(addr + 8, second);
  }
  bool past_end(std::uintptr_t addr) const { return addr >= end(); }
  std::uintptr_t end() const { return base + size; }
};

// Row policy: frame pointers only (no tables): every frame takes the frame-pointer row.
struct frame_pointer_rows {
  const unwind_row* find(std::uintptr_t) const { return nullptr; }
};

// Row policy: the CFI rows of `set` where one covers the pc, the frame-pointer row elsewhere.
struct cfi_rows {
  const unwind_table_set* set;
  mutable std::size_t last_module = ~std::size_t{0};  // the module found last (a walk's own object)
  const unwind_row* find(std::uintptr_t pc) const { return find_unwind_row(set, pc, &last_module); }
};

// One step of the walk: applies `row` at `s` and appends the caller's return address. The row gives the
// CFA; the return address is at CFA + kReturnAddressAtCfa, the caller's rbp at CFA + fp_off when the row
// saves it (else rbp still holds it). False, with r.end set, when the walk ends here. Inlined at each
// call so that a constant row (the frame-pointer row) folds into straight-line code.
template <class Memory>
SELFPROF_DETAIL_ALWAYS_INLINE bool apply_row(Memory& mem, const unwind_row& row, walk_regs& s,
                                             unwind_result& r, std::uint64_t* out, std::size_t max_depth,
                                             bool prologue) {
  const std::uintptr_t cfa = row_cfa(row, s.pc, s.sp, s.fp);
  if (cfa == 0) {
    r.end = walk_end::bad_frame;
    return false;
  }
  const std::uintptr_t ra_at = cfa + static_cast<std::uintptr_t>(kReturnAddressAtCfa);
  std::uint64_t ra = 0, next_fp = s.fp;
  // A leaf in its epilogue: rbp was popped back already, but GCC's CFI keeps saying where it was saved
  // (it emits no DW_CFA_restore), so the slot lies below sp. rbp holds the caller's value again.
  const bool popped = row.fp_off != 0 && s.leaf &&
                      cfa + static_cast<std::uintptr_t>(static_cast<std::intptr_t>(row.fp_off)) < s.sp;
  if (row.fp_off == 0 || popped) {
    if (!mem.read(ra_at, ra)) {
      r.end = mem.past_end(ra_at) ? walk_end::ran_off_copy : walk_end::bad_frame;
      return false;
    }
  } else {
    const std::uintptr_t slot = cfa + static_cast<std::uintptr_t>(static_cast<std::intptr_t>(row.fp_off));
    if (slot < s.sp || slot + 8 > ra_at || slot % 8 != 0) {
      r.end = walk_end::bad_frame;
      return false;
    }
    // The saved rbp usually sits right below the return address (push %rbp after the call): one read.
    const bool ok =
        slot + 8 == ra_at ? mem.read_pair(slot, next_fp, ra) : mem.read(ra_at, ra) && mem.read(slot, next_fp);
    if (!ok) {
      r.end = mem.past_end(ra_at) ? walk_end::ran_off_copy : walk_end::bad_frame;
      return false;
    }
    s.fp_known = true;
  }
  if (ra < kMinCodeAddress) {
    r.end = ra == 0 ? walk_end::zero_return : walk_end::bad_frame;
    return false;
  }
  if (r.depth == max_depth) {
    r.truncated = true;  // a valid frame exists beyond the limit
    r.end = walk_end::depth_limit;
    return false;
  }
  out[r.depth++] = ra;
  if (prologue) r.leaf_fixed = true;
  s.sp = cfa;  // row_cfa made it at least sp + 8: every step moves towards the stack end
  s.fp = static_cast<std::uintptr_t>(next_fp);
  s.pc = static_cast<std::uintptr_t>(ra);
  s.leaf = false;
  return true;
}

// The walk loop. Continues at `s` with out[0..r.depth) filled, appending return addresses until the
// stack, a bound or max_depth ends it. Each frame's row is the CFI row at its pc, else (no row, or one
// this walker does not model) the frame-pointer row; at a leaf without CFI the prologue/epilogue bytes may
// give a row first. Returns with `s` at the frame where the walk stopped.
template <class Memory, class Rows>
inline unwind_result walk_frames(Memory& mem, const Rows& rows, walk_regs& s, unwind_result r,
                                 std::uint64_t* out, std::size_t max_depth) {
  // A return address points after its call: past the leaf, look up pc-1, inside the calling instruction.
  const unwind_row* row = rows.find(s.leaf ? s.pc : s.pc - 1);
  if (Memory::kInterruptedPc && s.leaf && max_depth > 1 && (row == nullptr || row->kind == row_unknown)) {
    // Entry or exit of a function without CFI: rbp still belongs to the caller and the return address is
    // at the slot the code bytes tell. Taken only when that slot holds something like one.
    const std::uintptr_t slot = leaf_return_slot(s.pc, s.sp);
    std::uint64_t ra = 0;
    if (slot != 0 && slot % 8 == 0 && mem.read(slot, ra) && ra >= kMinCodeAddress) {
      const auto cfa_off = static_cast<std::int32_t>(slot - s.sp) - std::int32_t(kReturnAddressAtCfa);
      if (!apply_row(mem, unwind_row{0, cfa_off, 0, row_cfa_rsp, 0}, s, r, out, max_depth, true)) return r;
      row = rows.find(s.pc - 1);
    }
  }
  for (;;) {
    if (row != nullptr && row->kind != row_unknown) {
      if (row->kind == row_outermost) {
        r.end = walk_end::outermost;
        return r;
      }
      if (Memory::kMayLackFp && !s.fp_known && row->kind == row_cfa_rbp) {
        r.end = walk_end::rbp_unknown;
        return r;
      }
      if (!apply_row(mem, *row, s, r, out, max_depth, false)) return r;
    } else {
      if (Memory::kMayLackFp && !s.fp_known) {
        r.end = walk_end::rbp_unknown;
        return r;
      }
      if (!apply_row(mem, kFramePointerRow, s, r, out, max_depth, false)) return r;
    }
    row = rows.find(s.pc - 1);
  }
}

// Walks the live stack from an interrupted context with `set`'s rows (nullptr: frame pointers only).
// out[0] = pc, then return addresses, leaf first. `stack_end`: the thread's stack end, 0 when unknown.
inline unwind_result unwind_live(const unwind_table_set* set, std::uintptr_t pc, std::uintptr_t sp,
                                 std::uintptr_t fp, std::uintptr_t stack_end, std::uint64_t* out,
                                 std::size_t max_depth) {
  unwind_result r;
  if (max_depth == 0) return r;
  out[r.depth++] = pc;
  live_stack mem(sp, stack_end);
  walk_regs s{pc, sp, fp, true, true};
  if (set == nullptr) return walk_frames(mem, frame_pointer_rows{}, s, r, out, max_depth);
  return walk_frames(mem, cfi_rows{set}, s, r, out, max_depth);
}

// The handler's entry point: the live walk with the published tables when there are any (SELFPROF_UNWIND=fp
// publishes none: frame pointers only).
inline unwind_result unwind_interrupted(std::uintptr_t pc, std::uintptr_t sp, std::uintptr_t fp,
                                        std::uintptr_t stack_end, std::uint64_t* out, std::size_t max_depth) {
  return unwind_live(g_unwind_tables.load(std::memory_order_acquire), pc, sp, fp, stack_end, out, max_depth);
}

// Does the pair at `a` look like a frame record: a saved rbp that points further up the stack (or is 0,
// the outermost frame) next to a return address into code (`code.contains`)?
template <class Code>
inline bool plausible_frame_record(const stack_copy& mem, std::uintptr_t a, const Code& code) {
  std::uint64_t saved = 0, ra = 0;
  if (!mem.read(a, saved) || !mem.read(a + 8, ra)) return false;
  if (!code.contains(static_cast<std::uintptr_t>(ra))) return false;
  if (saved == 0) return true;
  return saved > a + 8 && saved % 8 == 0 && saved - a <= kMaxStackSpan;
}

// rbp is not known at frame `s`: find its frame record above sp. Candidates are tried upwards from sp;
// the first whose walk ends cleanly wins, else the deepest walk. A stale record left in this frame's
// locals by an earlier, deeper call can still win (it chains into the live frames above): the price of a
// kernel that reports sp and pc but not rbp. It takes a frame-pointer function between the caller and
// the system call to leave one there (libc's wrappers use none; ASan's interceptors do).
template <class Rows, class Code>
inline unwind_result scan_frame_records(const stack_copy& mem, const Rows& rows, const Code& code,
                                        const walk_regs& s, unwind_result r, std::uint64_t* out,
                                        std::size_t max_depth) {
  r.scanned = true;
  r.end = walk_end::bad_frame;
  unwind_result best = r;
  std::uintptr_t best_fp = 0;
  int tried = 0;
  std::uintptr_t a = (s.sp + kFrameRecordAlign - 1) & ~(kFrameRecordAlign - 1);
  for (; a >= s.sp && a - s.sp <= kMaxFrameSize && a + 16 <= mem.end(); a += kFrameRecordAlign) {
    if (!plausible_frame_record(mem, a, code)) continue;
    walk_regs t{s.pc, s.sp, a, true, s.leaf};
    unwind_result w = walk_frames(mem, rows, t, r, out, max_depth);
    if (w.clean()) return w;  // out[] holds this walk
    if (w.depth > best.depth) {
      best = w;
      best_fp = a;
    }
    if (++tried == kMaxRecordCandidates) break;
  }
  if (best_fp == 0) return r;
  walk_regs t{s.pc, s.sp, best_fp, true, s.leaf};
  return walk_frames(mem, rows, t, r, out, max_depth);  // refill out[] with the best walk
}

// Walks a blocked thread's frames from `pc` (its user pc: out[0], looked up as is) and the copy's base (its
// sp), with `set`'s CFI rows where they cover a pc and frame records elsewhere; every read lies in the
// copy. Where a row needs rbp before any frame told it, frame records are scanned for (`code.contains`
// tells a return address from data). out[1..depth) are return addresses, leaf first, as the signal
// handler records them; running off the end of the copy is a clean end.
template <class Code>
inline unwind_result unwind_stack_copy(const unwind_table_set* set, std::uintptr_t pc, const stack_copy& mem,
                                       const Code& code, std::uint64_t* out, std::size_t max_depth) {
  unwind_result r;
  if (max_depth == 0) return r;
  out[r.depth++] = pc;
  const cfi_rows rows{set};
  walk_regs s{pc, mem.base, 0, false, true};
  r = walk_frames(mem, rows, s, r, out, max_depth);
  if (r.end == walk_end::rbp_unknown) r = scan_frame_records(mem, rows, code, s, r, out, max_depth);
  return r;
}

}  // namespace detail
}  // namespace selfprof
