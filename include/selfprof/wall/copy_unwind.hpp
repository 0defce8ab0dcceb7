// Unwinding a thread that is blocked in the kernel, from a copy of its stack: the pc and sp come from
// /proc/self/task/<tid>/syscall, the frames from the same CFI rows the signal handler uses. The kernel
// does not tell rbp, so the first frame that needs it is found by scanning the copy for a frame record.
// Context: the wall sampler thread (never the signal handler).
#pragma once

#include <link.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <utility>
#include <vector>

#include "../signal/unwind_dwarf.hpp"

namespace selfprof {
namespace detail {

// A copy of part of a thread's stack: `size` bytes that were at [base, base + size).
struct stack_copy {
  std::uintptr_t base = 0;
  const unsigned char* data = nullptr;
  std::size_t size = 0;

  bool read(std::uintptr_t addr, std::uint64_t& out) const {
    if (addr < base || addr - base > size || size - (addr - base) < 8) return false;
    std::memcpy(&out, data + (addr - base), 8);
    return true;
  }
  std::uintptr_t end() const { return base + size; }
};

// The executable segments of every loaded module (dl_iterate_phdr), to tell a return address from data.
class code_ranges {
 public:
  void refresh() {
    ranges_.clear();
    dl_iterate_phdr(
        [](struct dl_phdr_info* info, std::size_t, void* self) {
          auto* r = static_cast<std::vector<std::pair<std::uintptr_t, std::uintptr_t>>*>(self);
          for (int i = 0; i < info->dlpi_phnum; ++i) {
            const ElfW(Phdr)& ph = info->dlpi_phdr[i];
            if (ph.p_type != PT_LOAD || !(ph.p_flags & PF_X) || ph.p_memsz == 0) continue;
            std::uintptr_t start = info->dlpi_addr + ph.p_vaddr;
            r->emplace_back(start, start + ph.p_memsz);
          }
          return 0;
        },
        &ranges_);
    std::sort(ranges_.begin(), ranges_.end());
  }
  bool contains(std::uintptr_t addr) const {
    auto it = std::upper_bound(ranges_.begin(), ranges_.end(), std::make_pair(addr, ~std::uintptr_t(0)));
    return it != ranges_.begin() && addr < std::prev(it)->second;
  }
  bool empty() const { return ranges_.empty(); }

 private:
  std::vector<std::pair<std::uintptr_t, std::uintptr_t>> ranges_;
};

// Frame records are 16-byte aligned in ABI-conforming x86-64 code (rsp is 16-aligned after `push %rbp`);
// scanning only those halves the chance of taking data for a record.
constexpr std::uintptr_t kFrameRecordAlign = 16;

// The lowest frame record at or above `sp` in the copy: a saved rbp that points further up the stack
// (or is 0, the outermost frame) next to a return address into code, whose own record, when it lies in
// the copy, holds a return address into code as well. False when none lies within kMaxFrameSize.
inline bool find_frame_record(const stack_copy& mem, std::uintptr_t sp, const code_ranges& code,
                              std::uintptr_t& fp) {
  std::uintptr_t a = (sp + kFrameRecordAlign - 1) & ~(kFrameRecordAlign - 1);
  for (; a >= sp && a - sp <= kMaxFrameSize; a += kFrameRecordAlign) {
    std::uint64_t saved = 0, ra = 0;
    if (!mem.read(a, saved) || !mem.read(a + 8, ra)) return false;
    if (!code.contains(static_cast<std::uintptr_t>(ra))) continue;
    if (saved == 0) {
      fp = a;
      return true;
    }
    if (saved <= a + 8 || saved % 8 != 0 || saved - a > kMaxStackSpan) continue;
    std::uint64_t next_ra = 0;
    if (mem.read(saved + 8, next_ra) && !code.contains(static_cast<std::uintptr_t>(next_ra))) continue;
    fp = a;
    return true;
  }
  return false;
}

struct copy_unwind_result {
  std::size_t depth = 0;
  bool truncated = false;
  bool scanned = false;  // a frame record was found by scanning (rbp was not known)
};

// Walks a blocked thread's frames from `pc` (its user pc: out[0], looked up as is) and the copy's base
// (its sp), with `set`'s CFI rows where they cover a pc and frame records elsewhere; every read lies in
// the copy. out[1..depth) are return addresses, leaf first, as the signal handler records them.
inline copy_unwind_result unwind_stack_copy(const unwind_table_set* set, std::uintptr_t pc,
                                            const stack_copy& mem, const code_ranges& code,
                                            std::uint64_t* out, std::size_t max_depth) {
  copy_unwind_result r;
  if (max_depth == 0) return r;
  out[r.depth++] = pc;
  std::uintptr_t sp = mem.base, fp = 0;
  bool fp_known = false, leaf = true;
  for (;;) {
    const unwind_row* row = find_unwind_row(set, leaf ? pc : pc - 1);
    if (row != nullptr && row->kind == row_outermost) break;
    std::uint64_t ra = 0, next_fp = fp;
    std::uintptr_t next_sp = 0;
    bool next_fp_known = fp_known;
    if (row != nullptr && row->kind != row_unknown) {
      if (row->kind == row_cfa_rbp && !fp_known) {
        if (!find_frame_record(mem, sp, code, fp)) break;
        fp_known = r.scanned = true;
        next_fp = fp;
        next_fp_known = true;
      }
      std::uintptr_t base = row->kind == row_cfa_rbp ? fp : sp;
      std::intptr_t off = row->cfa_off;
      if (row->kind == row_cfa_plt && (pc & 15) >= row->plt_threshold) off += 8;
      std::uintptr_t cfa = base + static_cast<std::uintptr_t>(off);
      if ((off >= 0) != (cfa >= base)) break;
      if (cfa < sp + 8 || cfa % 8 != 0 || cfa - sp > kMaxFrameSize) break;
      if (!mem.read(cfa - 8, ra)) break;
      if (row->fp_off != 0) {
        if (!mem.read(cfa + static_cast<std::uintptr_t>(static_cast<std::intptr_t>(row->fp_off)), next_fp))
          break;
        next_fp_known = true;
      }
      next_sp = cfa;
    } else {  // no CFI here: one frame-pointer step, from a scanned record when rbp is not known
      if (!fp_known) {
        if (!find_frame_record(mem, sp, code, fp)) break;
        fp_known = r.scanned = true;
      }
      if (fp < sp || fp % 8 != 0 || fp - sp > kMaxFrameSize) break;
      if (!mem.read(fp, next_fp) || !mem.read(fp + 8, ra)) break;
      next_fp_known = true;
      next_sp = fp + 16;
    }
    if (ra < kMinCodeAddress) break;
    if (r.depth == max_depth) {
      r.truncated = true;
      break;
    }
    out[r.depth++] = ra;
    if (next_sp <= sp) break;  // the walk must move towards the stack end
    sp = next_sp;
    fp = static_cast<std::uintptr_t>(next_fp);
    fp_known = next_fp_known;
    pc = static_cast<std::uintptr_t>(ra);
    leaf = false;
  }
  return r;
}

}  // namespace detail
}  // namespace selfprof
