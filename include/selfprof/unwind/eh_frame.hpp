// The .eh_frame / .eh_frame_hdr reader: turns a module's call frame information (CIEs and FDEs, as GCC,
// clang and glibc emit them) into the compact sorted unwind rows the signal handler follows.
// Context: collector thread or setup only (allocates; never the signal handler).
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <string>
#include <unordered_map>
#include <vector>

#include "selfprof/signal/arch_x86_64.hpp"
#include "selfprof/signal/unwind_rows.hpp"
#include "selfprof/unwind/cfa_program.hpp"
#include "selfprof/unwind/eh_cursor.hpp"

namespace selfprof {
namespace detail {

// A module's rows (pc offsets from `start`) and what the parse met on the way.
struct eh_frame_table {
  std::uintptr_t start = 0, end = 0;  // runtime pc range covered by the FDEs
  std::vector<unwind_row> rows;
  std::size_t cies = 0, fdes = 0;
  std::size_t skipped = 0;  // records left out (malformed, unsupported encoding or augmentation)
  std::size_t unknown = 0;  // rows the handler cannot follow (CFA expressions other than PLT, ...)
  std::string error;        // the first problem, with its offset; empty when none
};

// A module whose FDEs span more than this cannot be expressed with 32-bit row offsets.
constexpr std::uintptr_t kMaxModuleSpan = 0xFFFFFFF0u;

// Parses .eh_frame: a CIE/FDE sequence ended by a zero length word or by the end of the input.
// Never reads outside the input; malformed records are counted in `skipped`, never fatal.
inline eh_frame_table parse_eh_frame(const eh_frame_input& in) {
  eh_frame_table t;
  struct fde_rows {
    std::uint64_t begin, end;
    std::size_t first, count;  // in `all`
  };
  std::vector<fde_rows> fdes;
  std::vector<unwind_row> all;  // pcs relative to each FDE's begin for now
  std::unordered_map<std::size_t, eh_cie> cies;
  auto note = [&](const char* what, std::size_t at, bool count = true) {
    if (count) ++t.skipped;
    if (t.error.empty()) {
      char buf[160];
      std::snprintf(buf, sizeof buf, "eh_frame at 0x%zx (offset 0x%zx): %s",
                    static_cast<std::size_t>(in.address), at, what);
      t.error = buf;
    }
  };
  auto parse_cie = [&](std::size_t at) -> const eh_cie& {
    auto found = cies.find(at);
    if (found != cies.end()) return found->second;
    eh_cie& cie = cies[at];
    eh_cursor c{in.data, at, in.size, in.address};
    std::uint64_t len = c.fixed(4);
    bool wide = len == 0xffffffffu;
    if (wide) len = c.fixed(8);
    if (!c.ok || len == 0 || len > c.end - c.pos) return note("truncated CIE", at, false), cie;
    c.end = c.pos + static_cast<std::size_t>(len);
    if (c.fixed(wide ? 8 : 4) != 0) return note("CIE pointer does not point at a CIE", at, false), cie;
    std::uint8_t version = c.u8();
    if (version != 1 && version != 3 && version != 4) return note("unsupported CIE version", at, false), cie;
    std::string aug;
    while (c.has(1) && in.data[c.pos] != 0 && aug.size() < 16) aug += static_cast<char>(in.data[c.pos++]);
    if (c.u8() != 0) return note("unterminated CIE augmentation", at, false), cie;
    if (aug.find("eh") == 0) c.fixed(8);  // old GCC: an eh_ptr word
    if (version == 4 && (c.u8() != 8 || c.u8() != 0))
      return note("CIE address size is not 8", at, false), cie;
    cie.code_align = c.uleb();
    cie.data_align = c.sleb();
    cie.ra_reg = version == 1 ? c.u8() : c.uleb();
    if (!aug.empty() && aug[0] == 'z') {
      cie.has_aug_data = true;
      std::uint64_t aug_len = c.uleb();
      if (!c.has(aug_len)) return note("truncated CIE augmentation data", at, false), cie;
      std::size_t aug_end = c.pos + static_cast<std::size_t>(aug_len);
      for (std::size_t i = 1; i < aug.size() && c.ok; ++i) {
        if (aug[i] == 'R')
          cie.fde_enc = c.u8();
        else if (aug[i] == 'L')
          c.u8();
        else if (aug[i] == 'P')
          c.pointer(c.u8(), false);
        else if (aug[i] == 'S' || aug[i] == 'B' || aug[i] == 'G')
          continue;
        else
          break;  // unknown letter: 'z' says how long the data is, skip the rest
      }
      if (!c.ok || c.pos > aug_end) return note("malformed CIE augmentation data", at, false), cie;
      c.pos = aug_end;
    } else if (!aug.empty() && aug != "eh") {
      return note("unknown CIE augmentation", at, false), cie;
    }
    if (!c.ok || cie.code_align == 0) return note("malformed CIE", at, false), cie;
    cie.insns = c.pos;
    cie.insns_end = c.end;
    cie.valid = true;
    ++t.cies;
    return cie;
  };

  // Most FDEs of a module share one CIE: its state after the initial instructions is kept for the next.
  std::size_t last_cie_at = ~std::size_t{0}, initial_cie_at = ~std::size_t{0};
  const eh_cie* last_cie = nullptr;
  cfa_state last_initial;
  bool last_initial_ok = false;
  // About one row per five bytes of .eh_frame (GCC's output): room for them at once, not by doubling.
  all.reserve(std::min<std::size_t>(in.size / 4, std::size_t{1} << 24));
  fdes.reserve(std::min<std::size_t>(in.size / 16, std::size_t{1} << 22));
  std::size_t pos = 0;
  while (pos < in.size) {
    const std::size_t at = pos;
    eh_cursor c{in.data, pos, in.size, in.address};
    std::uint64_t len = c.fixed(4);
    if (!c.ok) break;     // fewer than 4 bytes left: treat as the end
    if (len == 0) break;  // the terminator
    bool wide = len == 0xffffffffu;
    if (wide) len = c.fixed(8);
    if (!c.ok || len > c.end - c.pos) {
      note("record runs past the end", at);
      break;
    }
    const std::size_t rec_end = c.pos + static_cast<std::size_t>(len);
    pos = rec_end;
    c.end = rec_end;
    const std::size_t id_at = c.pos;
    std::uint64_t id = c.fixed(wide ? 8 : 4);
    if (!c.ok) {
      note("truncated record", at);
      continue;
    }
    if (id == 0) {  // a CIE: parsed when an FDE uses it
      continue;
    }
    if (id > id_at) {
      note("FDE points before the input", at);
      continue;
    }
    const std::size_t cie_at = id_at - static_cast<std::size_t>(id);
    if (cie_at != last_cie_at) {
      last_cie = &parse_cie(cie_at);  // unordered_map: references stay valid
      last_cie_at = cie_at;
    }
    const eh_cie& cie = *last_cie;
    if (!cie.valid) {
      note("FDE of an unusable CIE", at);
      continue;
    }
    bool indirect = false;
    std::uint64_t begin = c.pointer(cie.fde_enc, true, &indirect);
    std::uint64_t range = c.pointer(cie.fde_enc & 0x0f, false);
    if (cie.has_aug_data) {
      std::uint64_t n = c.uleb();
      if (!c.has(n)) {
        note("truncated FDE augmentation data", at);
        continue;
      }
      c.pos += static_cast<std::size_t>(n);
    }
    if (!c.ok || indirect) {
      note("malformed FDE", at);
      continue;
    }
    if (range == 0) continue;  // an empty FDE covers nothing (linkers leave them for discarded code)
    if (begin + range < begin || range > kMaxModuleSpan) {
      note("FDE range overflows", at);
      continue;
    }
    ++t.fdes;
    // Rows are relative to the FDE's begin for now; rebased once the module's start is known.
    std::uint64_t loc = begin;
    const std::size_t first = all.size();
    if (initial_cie_at != cie_at) {  // the initial instructions may not advance: the state is the CIE's
      initial_cie_at = cie_at;
      const cfa_state defaults;
      last_initial = cfa_state();
      eh_cursor cie_program{in.data, cie.insns, cie.insns_end, in.address};
      last_initial_ok = run_cfa_program(cie_program, cie.insns_end, cie, defaults, last_initial, loc,
                                        begin + range, begin, nullptr) &&
                        loc == begin;
      loc = begin;
    }
    if (!last_initial_ok) {
      note("CIE initial instructions are malformed or advance", at);
      continue;
    }
    const cfa_state& initial = last_initial;
    cfa_state state = initial;
    bool good = run_cfa_program(c, rec_end, cie, initial, state, loc, begin + range, begin, &all);
    if (loc < begin + range) all.push_back(state.row(static_cast<std::uint32_t>(loc - begin)));
    if (!good) {
      // The rows before the bad instruction hold; from it on, the function is unknown territory.
      note("malformed CFA instructions", at);
      if (all.size() > first)
        all.back().kind = row_unknown;
      else
        all.push_back(unwind_row{0, 0, 0, row_unknown, 0});
    }
    fdes.push_back({begin, begin + range, first, all.size() - first});
  }
  if (fdes.empty()) return t;

  std::sort(fdes.begin(), fdes.end(), [](const fde_rows& a, const fde_rows& b) { return a.begin < b.begin; });
  std::uint64_t lo = fdes.front().begin, hi = 0;
  for (auto& f : fdes) hi = std::max(hi, f.end);
  if (hi - lo > kMaxModuleSpan) {
    // FDEs spread over more than 4 GiB: keep the span around the first ones and count the rest out.
    std::size_t keep = 0;
    while (keep < fdes.size() && fdes[keep].end - lo <= kMaxModuleSpan) ++keep;
    t.skipped += fdes.size() - keep;
    if (t.error.empty()) t.error = "eh_frame: FDEs span more than 4 GiB; the rest were left out";
    fdes.resize(keep);
    hi = 0;
    for (auto& f : fdes) hi = std::max(hi, f.end);
  }
  t.start = static_cast<std::uintptr_t>(lo);
  t.end = static_cast<std::uintptr_t>(hi);
  t.rows.reserve(all.size() + fdes.size());
  auto push = [&](const unwind_row& r) {
    if (!t.rows.empty() && t.rows.back().pc == r.pc) t.rows.pop_back();  // a later row at the same pc wins
    if (!t.rows.empty()) {
      const unwind_row& b = t.rows.back();
      if (b.kind == r.kind && b.cfa_off == r.cfa_off && b.fp_off == r.fp_off &&
          b.plt_threshold == r.plt_threshold)
        return;  // same rule continues
    }
    t.rows.push_back(r);
  };
  for (std::size_t i = 0; i < fdes.size(); ++i) {
    const fde_rows& f = fdes[i];
    // Overlapping FDEs (broken input): the later one starts where the earlier one is cut.
    std::uint64_t stop = i + 1 < fdes.size() ? std::min(f.end, fdes[i + 1].begin) : f.end;
    if (!t.rows.empty() && f.begin - lo < t.rows.back().pc) continue;  // fully shadowed
    for (std::size_t k = 0; k < f.count; ++k) {
      unwind_row r = all[f.first + k];
      std::uint64_t pc = f.begin + r.pc;
      if (pc >= stop) break;
      r.pc = static_cast<std::uint32_t>(pc - lo);
      push(r);
    }
    if (stop == f.end && (i + 1 == fdes.size() || fdes[i + 1].begin > f.end))
      push(unwind_row{static_cast<std::uint32_t>(f.end - lo), 0, 0, row_no_info, 0});
  }
  if (t.rows.empty() || t.rows.back().kind != row_no_info)
    t.rows.push_back(unwind_row{static_cast<std::uint32_t>(hi - lo), 0, 0, row_no_info, 0});
  t.end = t.start + t.rows.back().pc;  // overlapping FDEs (broken input) may end before `hi`
  for (const unwind_row& r : t.rows)
    if (r.kind == row_unknown) ++t.unknown;
  return t;
}

// Where .eh_frame starts, from the .eh_frame_hdr at `hdr` (runtime address `hdr.address`), and how far the
// FDEs its search table lists reach (0 when the table is absent). False when the header is malformed.
struct eh_frame_hdr_info {
  std::uintptr_t eh_frame = 0;
  std::uintptr_t fde_limit = 0;  // highest FDE start listed in the search table, 0 when none
  std::size_t fde_count = 0;
};

inline bool parse_eh_frame_hdr(const eh_frame_input& hdr, eh_frame_hdr_info& out) {
  eh_cursor c{hdr.data, 0, hdr.size, hdr.address};
  if (c.u8() != 1) return false;  // version
  std::uint8_t ptr_enc = c.u8(), count_enc = c.u8(), table_enc = c.u8();
  std::uint64_t eh = c.pointer(ptr_enc);
  if (!c.ok || eh == 0) return false;
  out.eh_frame = static_cast<std::uintptr_t>(eh);
  if (count_enc == 0xff || table_enc != 0x3b) return true;  // no binary search table we can read
  std::uint64_t count = c.pointer(count_enc);
  if (!c.ok || count > (c.end - c.pos) / 8) return true;
  out.fde_count = static_cast<std::size_t>(count);
  for (std::uint64_t i = 0; i < count; ++i) {
    c.fixed(4);  // initial location (datarel sdata4)
    std::int64_t fde = std::int32_t(c.fixed(4));
    std::uintptr_t at = hdr.address + static_cast<std::uintptr_t>(fde);
    if (c.ok && at > out.fde_limit) out.fde_limit = at;
  }
  return true;
}

}  // namespace detail
}  // namespace selfprof
