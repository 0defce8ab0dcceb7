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

#include "selfprof/signal/unwind_dwarf.hpp"

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

// Does the pair at `a` look like a frame record: a saved rbp that points further up the stack (or is 0,
// the outermost frame) next to a return address into code?
inline bool plausible_frame_record(const stack_copy& mem, std::uintptr_t a, const code_ranges& code) {
  std::uint64_t saved = 0, ra = 0;
  if (!mem.read(a, saved) || !mem.read(a + 8, ra)) return false;
  if (!code.contains(static_cast<std::uintptr_t>(ra))) return false;
  if (saved == 0) return true;
  return saved > a + 8 && saved % 8 == 0 && saved - a <= kMaxStackSpan;
}

struct copy_unwind_result {
  std::size_t depth = 0;
  bool truncated = false;
  bool scanned = false;  // a frame record was found by scanning (rbp was not known)
  bool clean = false;    // the walk ended where a stack ends (outermost CFI row, null frame, depth limit)
};

// Candidates for a scanned frame record tried per walk: stale records of earlier calls lie below the
// live one, so the first plausible pair is not always right; the one whose walk ends cleanly is.
constexpr int kMaxRecordCandidates = 32;

struct copy_walker {
  const unwind_table_set* set;
  const stack_copy& mem;
  const code_ranges& code;
  std::uint64_t* out;
  std::size_t max_depth;

  // Continues a walk at (pc, sp, fp) with out[0..r.depth) filled. `scan`: try several frame records
  // where rbp is unknown (false inside such a trial: the first plausible record is taken).
  copy_unwind_result walk(copy_unwind_result r, std::uintptr_t pc, std::uintptr_t sp, std::uintptr_t fp,
                          bool fp_known, bool leaf, bool scan) const {
    for (;;) {
      const unwind_row* row = find_unwind_row(set, leaf ? pc : pc - 1);
      if (row != nullptr && row->kind == row_outermost) {
        r.clean = true;
        return r;
      }
      const bool cfi = row != nullptr && row->kind != row_unknown;
      if (!fp_known && (!cfi || row->kind == row_cfa_rbp)) return scan_record(r, pc, sp, leaf, scan);
      std::uint64_t ra = 0, next_fp = fp;
      std::uintptr_t next_sp = 0;
      bool next_fp_known = fp_known;
      if (cfi) {
        const std::uintptr_t cfa = row_cfa(row, pc, sp, fp);
        if (cfa == 0) return r;
        if (!mem.read(cfa - 8, ra)) return ran_off_copy(r, cfa - 8);
        if (row->fp_off != 0) {
          std::uintptr_t slot = cfa + static_cast<std::uintptr_t>(static_cast<std::intptr_t>(row->fp_off));
          if (!mem.read(slot, next_fp)) return ran_off_copy(r, slot);
          next_fp_known = true;
        }
        next_sp = cfa;
      } else {  // no CFI here: one frame-pointer step
        if (fp < sp || fp % 8 != 0 || fp - sp > kMaxFrameSize) return r;
        if (!mem.read(fp, next_fp) || !mem.read(fp + 8, ra)) return ran_off_copy(r, fp);
        next_fp_known = true;
        next_sp = fp + 16;
      }
      if (ra < kMinCodeAddress) {
        r.clean = ra == 0;  // a zeroed return address ends the chain
        return r;
      }
      if (r.depth == max_depth) {
        r.truncated = r.clean = true;
        return r;
      }
      out[r.depth++] = ra;
      if (next_sp <= sp) return r;  // the walk must move towards the stack end
      sp = next_sp;
      fp = static_cast<std::uintptr_t>(next_fp);
      fp_known = next_fp_known;
      pc = static_cast<std::uintptr_t>(ra);
      leaf = false;
    }
  }

  // The copy ended before the stack did (a deep stack): what was walked is right, just not all of it.
  copy_unwind_result ran_off_copy(copy_unwind_result r, std::uintptr_t addr) const {
    r.clean = addr >= mem.end();
    return r;
  }

  // rbp is not known at this frame: find its frame record above sp. Candidates are tried upwards from
  // sp; the first whose walk ends cleanly wins, else the deepest walk. A stale record left in this
  // frame's locals by an earlier, deeper call can still win (it chains into the live frames above): the
  // price of a kernel that reports sp and pc but not rbp. It takes a frame-pointer function between the
  // caller and the system call to leave one there (libc's wrappers use none; ASan's interceptors do).
  copy_unwind_result scan_record(copy_unwind_result r, std::uintptr_t pc, std::uintptr_t sp, bool leaf,
                                 bool scan) const {
    r.scanned = true;
    copy_unwind_result best = r;
    std::uintptr_t best_fp = 0;
    int tried = 0;
    std::uintptr_t a = (sp + kFrameRecordAlign - 1) & ~(kFrameRecordAlign - 1);
    for (; a >= sp && a - sp <= kMaxFrameSize && a + 16 <= mem.end(); a += kFrameRecordAlign) {
      if (!plausible_frame_record(mem, a, code)) continue;
      copy_unwind_result t = walk(r, pc, sp, a, true, leaf, false);
      if (!scan || t.clean) return scan ? walk(r, pc, sp, a, true, leaf, true) : t;
      if (t.depth > best.depth) {
        best = t;
        best_fp = a;
      }
      if (++tried == kMaxRecordCandidates) break;
    }
    if (best_fp == 0) return r;
    return walk(r, pc, sp, best_fp, true, leaf, true);  // refill out[] with the best walk
  }
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
  copy_walker w{set, mem, code, out, max_depth};
  return w.walk(r, pc, mem.base, 0, false, true, true);
}

}  // namespace detail
}  // namespace selfprof
