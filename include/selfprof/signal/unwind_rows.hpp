// The unwind row model: per-module tables of CFA rules (built from .eh_frame off the signal path by
// unwind/tables.hpp), the published set the handler reads, and the lookup of the row in effect at a pc.
// Context: signal handler (async-signal-safe: reads the immutable published set only).
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>

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
// The return address is always at CFA + kReturnAddressAtCfa; rows where it is not are row_unknown.
struct unwind_row {
  std::uint32_t pc;
  std::int32_t cfa_off;
  std::int16_t fp_off;  // the caller's rbp is saved at CFA + fp_off; 0: rbp still holds it
  std::uint8_t kind;    // unwind_row_kind
  std::uint8_t plt_threshold;
};
static_assert(sizeof(unwind_row) == 12, "rows are packed: a libc has tens of thousands of them");

// The frame-pointer step as a row (async-profiler's default frame): a frame record {caller's rbp, return
// address} at rbp, so CFA = rbp + 16 and the caller's rbp is at CFA-16. Used wherever no CFI row covers
// the pc, and for every frame when there are no tables.
inline constexpr unwind_row kFramePointerRow{0, 16, -16, row_cfa_rbp, 0};

// Blocks of 1 << kRowIndexShift bytes of code, each indexed to the rows that can be in effect in it: a
// lookup searches a few rows instead of the module's tens of thousands.
constexpr unsigned kRowIndexShift = 8;

// The rows of one module, covering the runtime addresses [start, end).
struct unwind_module {
  std::uintptr_t start;
  std::uintptr_t end;
  const unwind_row* rows;  // sorted by pc; the last one is row_no_info at `end - start`
  std::size_t count;
  // Optional (null: search every row): index[b] = the number of rows whose pc <= b << kRowIndexShift,
  // for b in [0, index_count); covers [start, end) with one entry to spare.
  const std::uint32_t* index;
  std::size_t index_count;
};

// Every module's rows, sorted by start and not overlapping. Immutable once published.
struct unwind_table_set {
  const unwind_module* modules;
  std::size_t count;
};

// The set the handler reads; published by unwind/tables.hpp, never freed while profiling runs.
inline std::atomic<const unwind_table_set*> g_unwind_tables{nullptr};

// The rows each index entry of `m` leads to, for a table of `count` rows: the number of rows whose pc is
// at most each block's first offset (see unwind_module::index). `out` gets (end - start) >> shift + 2
// entries. Built off the signal path.
template <class Vector>
inline void build_row_index(const unwind_row* rows, std::size_t count, std::uintptr_t size, Vector& out) {
  const std::size_t blocks = static_cast<std::size_t>(size >> kRowIndexShift) + 2;
  out.assign(blocks, 0);
  std::size_t r = 0;
  for (std::size_t b = 0; b < blocks; ++b) {
    const std::uint64_t at = static_cast<std::uint64_t>(b) << kRowIndexShift;
    while (r < count && rows[r].pc <= at) ++r;
    out[b] = static_cast<std::uint32_t>(r);
  }
}

// The row in effect at `pc`, or nullptr when no CFI covers it. Binary searches; reads only the set.
// `hint` (may be null) holds the module found last: consecutive frames are mostly in one module.
inline const unwind_row* find_unwind_row(const unwind_table_set* set, std::uintptr_t pc,
                                         std::size_t* hint = nullptr) {
  if (set == nullptr || set->count == 0) return nullptr;
  std::size_t lo = 0, hi = set->count;  // first module with start > pc
  if (hint != nullptr && *hint < set->count && pc >= set->modules[*hint].start &&
      pc < set->modules[*hint].end) {
    lo = *hint + 1;
  } else {
    while (lo < hi) {
      std::size_t mid = lo + (hi - lo) / 2;
      if (set->modules[mid].start <= pc)
        lo = mid + 1;
      else
        hi = mid;
    }
  }
  if (lo == 0) return nullptr;
  if (hint != nullptr) *hint = lo - 1;
  const unwind_module& m = set->modules[lo - 1];
  if (pc >= m.end || m.count == 0) return nullptr;
  const std::uint32_t off = static_cast<std::uint32_t>(pc - m.start);
  lo = 0;
  hi = m.count;  // first row with pc > off
  const std::size_t block = static_cast<std::size_t>(off >> kRowIndexShift);
  if (m.index != nullptr && block + 1 < m.index_count) {  // the answer lies in [index[b], index[b + 1]]
    lo = m.index[block];
    hi = m.index[block + 1];
    if (hi > m.count) hi = m.count;
    if (lo > hi) lo = hi;
  }
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

}  // namespace detail
}  // namespace selfprof
