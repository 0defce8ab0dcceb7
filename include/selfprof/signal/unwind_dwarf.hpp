// Signal-handler code: the mixed unwinder that follows pre-built CFI rows (parsed from .eh_frame off the
// signal path) and falls back to one frame-pointer step where a module has no row for the pc.
// Context: signal handler (async-signal-safe: no locks, no allocation; stack reads bounded and probed).
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>

#include "selfprof/signal/unwind_fp.hpp"

namespace selfprof {
namespace detail {

// How the canonical frame address (CFA: the caller's sp, just above the return address) is computed
// at one pc, and what the row means for the walk.
enum unwind_row_kind : std::uint8_t {
  row_cfa_rsp = 0,    // CFA = rsp + cfa_off
  row_cfa_rbp = 1,    // CFA = rbp + cfa_off
  row_cfa_plt = 2,    // PLT entry: CFA = rsp + cfa_off, +8 more once (pc & 15) >= plt_threshold
  row_unknown = 3,    // CFI this walker does not model (expressions, other registers): one FP step
  row_outermost = 4,  // the return address is undefined: the thread's first frame, stop here
  row_no_info = 5,    // a gap between FDEs: no CFI covers the pc, one FP step
};

// One row of a module's table: valid from `pc` (offset from the module's start) to the next row.
// The return address is always at CFA-8 (x86-64); rows where it is not are row_unknown.
struct unwind_row {
  std::uint32_t pc;
  std::int32_t cfa_off;
  std::int16_t fp_off;  // the caller's rbp is saved at CFA + fp_off; 0: rbp still holds it
  std::uint8_t kind;    // unwind_row_kind
  std::uint8_t plt_threshold;
};
static_assert(sizeof(unwind_row) == 12, "rows are packed: libc alone has ~30,000 of them");

// The rows of one module, covering the runtime addresses [start, end).
struct unwind_module {
  std::uintptr_t start;
  std::uintptr_t end;
  const unwind_row* rows;  // sorted by pc; the last one is row_no_info at `end - start`
  std::size_t count;
};

// Every module's rows, sorted by start and not overlapping. Immutable once published.
struct unwind_table_set {
  const unwind_module* modules;
  std::size_t count;
};

// The set the handler reads; published by collect/unwind_tables.hpp, never freed while profiling runs.
inline std::atomic<const unwind_table_set*> g_unwind_tables{nullptr};

// The row in effect at `pc`, or nullptr when no CFI covers it. Binary searches; reads only the set.
inline const unwind_row* find_unwind_row(const unwind_table_set* set, std::uintptr_t pc) {
  if (set == nullptr || set->count == 0) return nullptr;
  std::size_t lo = 0, hi = set->count;  // first module with start > pc
  while (lo < hi) {
    std::size_t mid = lo + (hi - lo) / 2;
    if (set->modules[mid].start <= pc)
      lo = mid + 1;
    else
      hi = mid;
  }
  if (lo == 0) return nullptr;
  const unwind_module& m = set->modules[lo - 1];
  if (pc >= m.end || m.count == 0) return nullptr;
  const std::uint32_t off = static_cast<std::uint32_t>(pc - m.start);
  lo = 0;
  hi = m.count;  // first row with pc > off
  while (lo < hi) {
    std::size_t mid = lo + (hi - lo) / 2;
    if (m.rows[mid].pc <= off)
      lo = mid + 1;
    else
      hi = mid;
  }
  if (lo == 0) return nullptr;
  const unwind_row* row = &m.rows[lo - 1];
  return row->kind == row_no_info ? nullptr : row;
}

// The CFA `row` gives at (pc, sp, fp), or 0 when that is no step up the stack: it wraps around, is
// misaligned, leaves no room for the return address above sp, or makes a frame over kMaxFrameSize.
inline std::uintptr_t row_cfa(const unwind_row* row, std::uintptr_t pc, std::uintptr_t sp,
                              std::uintptr_t fp) {
  std::uintptr_t base = row->kind == row_cfa_rbp ? fp : sp;
  std::intptr_t off = row->cfa_off;
  if (row->kind == row_cfa_plt && (pc & 15) >= row->plt_threshold) off += 8;
  std::uintptr_t cfa = base + static_cast<std::uintptr_t>(off);
  if ((off >= 0) != (cfa >= base)) return 0;  // wrapped around
  if (cfa < sp + 8 || cfa % 8 != 0 || cfa - sp > kMaxFrameSize) return 0;
  return cfa;
}

// Walks from an interrupted context with `set` (nullptr: frame pointers only). Same contract and bounds
// as unwind_fp: out[0] = pc, then return addresses, leaf first; every stack read lies in
// [sp, min(stack_end, sp + kMaxStackSpan)), is 8-aligned, probed, and each frame moves sp up by at most
// kMaxFrameSize.
inline unwind_result unwind_with_tables(const unwind_table_set* set, std::uintptr_t pc, std::uintptr_t sp,
                                        std::uintptr_t fp, std::uintptr_t stack_end, std::uint64_t* out,
                                        std::size_t max_depth) {
  unwind_result r;
  if (max_depth == 0) return r;
  out[r.depth++] = pc;
  std::uintptr_t hi = sp + kMaxStackSpan;
  if (hi < sp) hi = ~std::uintptr_t(0);
  if (stack_end != 0 && stack_end < hi) hi = stack_end;
  read_guard guard;
  bool leaf = true;
  while (true) {
    // A return address points after its call: look up pc-1, inside the calling instruction.
    const unwind_row* row = find_unwind_row(set, leaf ? pc : pc - 1);
    std::uintptr_t ra = 0, next_sp = 0, next_fp = fp;
    bool fixed_leaf = false;
    if (row != nullptr && row->kind == row_outermost) break;
    if (row != nullptr && row->kind != row_unknown) {
      const std::uintptr_t cfa = row_cfa(row, pc, sp, fp);
      if (cfa == 0 || cfa > hi) break;
      if (!guard.readable(cfa - 8, 8)) break;
      ra = load_word(cfa - 8);
      if (row->fp_off != 0) {
        std::uintptr_t slot = cfa + static_cast<std::uintptr_t>(static_cast<std::intptr_t>(row->fp_off));
        if (slot < sp || slot + 8 > cfa - 8 || slot % 8 != 0 || !guard.readable(slot, 8)) break;
        next_fp = load_word(slot);
      }
      next_sp = cfa;
    } else {
      std::uintptr_t slot = leaf && max_depth > 1 ? leaf_return_slot(pc, sp) : 0;
      if (slot != 0) {  // entry or exit of a function without CFI: rbp still belongs to the caller
        if (slot % 8 != 0 || slot + 8 > hi || !guard.readable(slot, 8)) break;
        ra = load_word(slot);
        next_sp = slot + 8;
        fixed_leaf = true;
      } else {  // one frame-pointer step: [fp] = caller's rbp, [fp+8] = return address
        if (fp < sp || fp % kFrameAlign != 0 || fp - sp > kMaxFrameSize) break;
        if (fp + 16 > hi || fp + 16 < fp || !guard.readable(fp, 16)) break;
        next_fp = load_word(fp);
        ra = load_word(fp + 8);
        next_sp = fp + 16;
      }
    }
    if (ra < kMinCodeAddress) break;
    if (r.depth == max_depth) {
      r.truncated = true;  // a valid frame exists beyond the limit
      break;
    }
    out[r.depth++] = ra;
    if (fixed_leaf) r.leaf_fixed = true;
    if (next_sp <= sp) break;  // the walk must move towards the stack end
    sp = next_sp;
    fp = next_fp;
    pc = ra;
    leaf = false;
  }
  return r;
}

// The handler's entry point: unwind_fp's signature, using the published tables when there are any.
inline unwind_result unwind_mixed(std::uintptr_t pc, std::uintptr_t sp, std::uintptr_t fp,
                                  std::uintptr_t stack_end, std::uint64_t* out, std::size_t max_depth) {
  const unwind_table_set* set = g_unwind_tables.load(std::memory_order_acquire);
  if (set == nullptr) return unwind_fp(pc, sp, fp, stack_end, out, max_depth);
  return unwind_with_tables(set, pc, sp, fp, stack_end, out, max_depth);
}

}  // namespace detail
}  // namespace selfprof
