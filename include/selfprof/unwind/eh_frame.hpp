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

namespace selfprof {
namespace detail {

// Bytes to parse: `size` readable bytes at `data`, which live at runtime address `address` (pc-relative
// pointers are resolved against it; parsing a copy works when `address` is the original's).
struct eh_frame_input {
  const std::uint8_t* data = nullptr;
  std::size_t size = 0;
  std::uintptr_t address = 0;
};

// A module's rows (pc offsets from `start`) and what the parse met on the way.
struct eh_frame_table {
  std::uintptr_t start = 0, end = 0;  // runtime pc range covered by the FDEs
  std::vector<unwind_row> rows;
  std::size_t cies = 0, fdes = 0;
  std::size_t skipped = 0;  // records left out (malformed, unsupported encoding or augmentation)
  std::size_t unknown = 0;  // rows the handler cannot follow (CFA expressions other than PLT, ...)
  std::string error;        // the first problem, with its offset; empty when none
};

// remember_state nesting kept; deeper nesting makes the rest of that FDE row_unknown.
constexpr std::size_t kMaxRememberDepth = 16;
// A module whose FDEs span more than this cannot be expressed with 32-bit row offsets.
constexpr std::uintptr_t kMaxModuleSpan = 0xFFFFFFF0u;

// A bounds-checked little-endian reader: any read past the end sets ok = false and returns 0.
struct eh_cursor {
  const std::uint8_t* base;  // start of the whole input (offsets are relative to it)
  std::size_t pos, end;
  std::uintptr_t address;  // runtime address of base[0]
  bool ok = true;

  bool has(std::size_t n) const { return ok && pos <= end && end - pos >= n; }
  std::uint64_t fixed(std::size_t n) {
    if (!has(n)) return fail();
    std::uint64_t v = 0;
    for (std::size_t i = 0; i < n; ++i) v |= std::uint64_t(base[pos + i]) << (8 * i);
    pos += n;
    return v;
  }
  std::uint8_t u8() { return static_cast<std::uint8_t>(fixed(1)); }
  std::uint64_t uleb() {
    std::uint64_t v = 0;
    for (unsigned shift = 0;; shift += 7) {
      if (!has(1) || shift > 63) return fail();
      std::uint8_t b = base[pos++];
      v |= std::uint64_t(b & 0x7f) << shift;
      if (!(b & 0x80)) return v;
    }
  }
  std::int64_t sleb() {
    std::uint64_t v = 0;
    unsigned shift = 0;
    std::uint8_t b = 0;
    do {
      if (!has(1) || shift > 63) return static_cast<std::int64_t>(fail());
      b = base[pos++];
      v |= std::uint64_t(b & 0x7f) << shift;
      shift += 7;
    } while (b & 0x80);
    if (shift < 64 && (b & 0x40)) v |= ~std::uint64_t(0) << shift;
    return static_cast<std::int64_t>(v);
  }
  // A DW_EH_PE_* encoded pointer. `apply` = false reads the value only (pc ranges, skipped pointers).
  // Indirect pointers are reported through `indirect` and never dereferenced.
  std::uint64_t pointer(std::uint8_t enc, bool apply = true, bool* indirect = nullptr) {
    if (enc == 0xff) return 0;  // DW_EH_PE_omit
    const std::uintptr_t field = address + pos;
    std::uint64_t v = 0;
    switch (enc & 0x0f) {
      case 0x00:
        v = fixed(8);
        break;  // absptr
      case 0x01:
        v = uleb();
        break;  // uleb128
      case 0x02:
        v = fixed(2);
        break;  // udata2
      case 0x03:
        v = fixed(4);
        break;  // udata4
      case 0x04:
        v = fixed(8);
        break;  // udata8
      case 0x09:
        v = static_cast<std::uint64_t>(sleb());
        break;  // sleb128
      case 0x0a:
        v = static_cast<std::uint64_t>(std::int64_t(std::int16_t(fixed(2))));
        break;  // sdata2
      case 0x0b:
        v = static_cast<std::uint64_t>(std::int64_t(std::int32_t(fixed(4))));
        break;  // sdata4
      case 0x0c:
        v = fixed(8);
        break;  // sdata8
      default:
        return fail();
    }
    if (indirect) *indirect = (enc & 0x80) != 0;
    if (!apply) return v;
    switch (enc & 0x70) {
      case 0x00:
        break;  // absolute
      case 0x10:
        v += field;
        break;  // pcrel
      default:
        return fail();  // textrel/datarel/funcrel/aligned: not used in .eh_frame FDEs
    }
    return v;
  }
  std::uint64_t fail() {
    ok = false;
    return 0;
  }
};

// One parsed CIE: what its FDEs need.
struct eh_cie {
  bool valid = false;
  std::uint64_t code_align = 1;
  std::int64_t data_align = -8;
  std::uint64_t ra_reg = kDwarfRa;
  std::uint8_t fde_enc = 0;  // DW_EH_PE_absptr unless 'R' says otherwise
  bool has_aug_data = false;
  std::size_t insns = 0, insns_end = 0;  // initial instructions, offsets in the input
};

// The register rules the walker cares about, at one pc.
struct cfa_state {
  std::uint8_t kind = row_cfa_rsp;  // row_cfa_rsp, row_cfa_rbp, row_cfa_plt or row_unknown
  std::int64_t cfa_off = 8;
  std::uint8_t plt_threshold = 0;
  std::int64_t fp_off = 0;  // 0: rbp unchanged
  bool fp_unknown = false;  // rbp saved somewhere this walker does not follow
  bool ra_undefined = false;
  bool ra_unusual = false;  // return address not at CFA + kReturnAddressAtCfa

  unwind_row row(std::uint32_t pc) const {
    unwind_row r{pc, 0, 0, row_unknown, 0};
    if (ra_undefined) {
      r.kind = row_outermost;
      return r;
    }
    // rbp saved where this walker cannot follow (an expression, as in stack-realigning DRAP frames):
    // the caller's rbp is unknown, so the row cannot be used; one frame-pointer step instead.
    if (kind == row_unknown || ra_unusual || fp_unknown || cfa_off < -0x7fffffff || cfa_off > 0x7fffffff ||
        fp_off < -0x8000 || fp_off > 0x7fff)
      return r;
    r.kind = kind;
    r.cfa_off = static_cast<std::int32_t>(cfa_off);
    r.fp_off = static_cast<std::int16_t>(fp_off);
    r.plt_threshold = plt_threshold;
    return r;
  }
};

// The PLT CFA expression binutils emits for lazy PLT entries:
//   DW_OP_breg7 (rsp) N; DW_OP_breg16 (rip) 0; DW_OP_lit15; DW_OP_and; DW_OP_lit<T>; DW_OP_ge;
//   DW_OP_lit3; DW_OP_shl; DW_OP_plus   =>   CFA = rsp + N + ((rip & 15) >= T ? 8 : 0)
// Anything else makes the row row_unknown (one frame-pointer step instead).
inline bool match_plt_expression(eh_cursor c, std::size_t end, cfa_state& s) {
  c.end = end;
  if (c.u8() != 0x77) return false;  // DW_OP_breg7
  std::int64_t n = c.sleb();
  if (c.u8() != 0x80 || c.sleb() != 0) return false;   // DW_OP_breg16 0
  if (c.u8() != 0x3f || c.u8() != 0x1a) return false;  // lit15, and
  std::uint8_t lit = c.u8();
  if (lit < 0x30 || lit > 0x3f) return false;
  if (c.u8() != 0x2a || c.u8() != 0x33 || c.u8() != 0x24 || c.u8() != 0x22) return false;  // ge lit3 shl plus
  if (!c.ok || c.pos != end) return false;
  s.kind = row_cfa_plt;
  s.cfa_off = n;
  s.plt_threshold = static_cast<std::uint8_t>(lit - 0x30);
  return true;
}

// Runs CFA instructions [pos, end) from `state`, appending a row at each location change.
// Returns false on a malformed instruction stream (rows so far are kept: they were valid).
inline bool run_cfa_program(eh_cursor c, std::size_t end, const eh_cie& cie, const cfa_state& initial,
                            cfa_state& state, std::uint64_t& loc, std::uint64_t loc_end, std::uint64_t start,
                            std::vector<unwind_row>* rows) {
  c.end = end;
  cfa_state stack[kMaxRememberDepth];
  std::size_t depth = 0;  // may exceed kMaxRememberDepth: those states are not kept
  auto advance = [&](std::uint64_t delta) {
    std::uint64_t next = loc + delta * cie.code_align;
    if (next < loc || next > loc_end) {  // past the FDE: the remaining rules never apply
      if (rows && loc < loc_end) rows->push_back(state.row(static_cast<std::uint32_t>(loc - start)));
      loc = loc_end;
      return false;
    }
    if (rows && next != loc) rows->push_back(state.row(static_cast<std::uint32_t>(loc - start)));
    loc = next;
    return true;
  };
  auto set_offset = [&](std::uint64_t reg, std::int64_t off) {
    if (reg == kDwarfRbp) state.fp_off = off, state.fp_unknown = false;
    if (reg == cie.ra_reg) state.ra_unusual = off != kReturnAddressAtCfa, state.ra_undefined = false;
  };
  auto other_rule = [&](std::uint64_t reg) {  // register / expression rules we do not follow
    if (reg == kDwarfRbp) state.fp_unknown = true, state.fp_off = 0;
    if (reg == cie.ra_reg) state.ra_unusual = true;
  };
  auto restore = [&](std::uint64_t reg) {
    if (reg == kDwarfRbp) state.fp_off = initial.fp_off, state.fp_unknown = initial.fp_unknown;
    if (reg == cie.ra_reg) state.ra_unusual = initial.ra_unusual, state.ra_undefined = initial.ra_undefined;
  };
  while (c.ok && c.pos < end) {
    std::uint8_t op = c.u8();
    std::uint8_t low = op & 0x3f;
    switch (op >> 6) {
      case 1:  // DW_CFA_advance_loc
        if (!advance(low)) return true;
        continue;
      case 2:  // DW_CFA_offset
        set_offset(low, static_cast<std::int64_t>(c.uleb()) * cie.data_align);
        continue;
      case 3:  // DW_CFA_restore
        restore(low);
        continue;
      default:
        break;
    }
    switch (op) {
      case 0x00:
        break;      // nop
      case 0x01: {  // set_loc
        std::uint64_t to = c.pointer(cie.fde_enc);
        if (!c.ok || to < loc) return false;
        if (!advance((to - loc) / (cie.code_align ? cie.code_align : 1))) return true;
        break;
      }
      case 0x02:
        if (!advance(c.u8())) return true;
        break;
      case 0x03:
        if (!advance(c.fixed(2))) return true;
        break;
      case 0x04:
        if (!advance(c.fixed(4))) return true;
        break;
      case 0x05: {  // offset_extended
        std::uint64_t reg = c.uleb();
        set_offset(reg, static_cast<std::int64_t>(c.uleb()) * cie.data_align);
        break;
      }
      case 0x06:
        restore(c.uleb());
        break;      // restore_extended
      case 0x07: {  // undefined
        std::uint64_t reg = c.uleb();
        if (reg == cie.ra_reg) state.ra_undefined = true;
        if (reg == kDwarfRbp) other_rule(reg);
        break;
      }
      case 0x08: {  // same_value
        std::uint64_t reg = c.uleb();
        if (reg == kDwarfRbp) state.fp_off = 0, state.fp_unknown = false;
        if (reg == cie.ra_reg) state.ra_unusual = true;
        break;
      }
      case 0x09: {  // register
        std::uint64_t reg = c.uleb();
        c.uleb();
        other_rule(reg);
        break;
      }
      case 0x0a:  // remember_state
        if (depth < kMaxRememberDepth) stack[depth] = state;
        ++depth;
        break;
      case 0x0b:  // restore_state
        if (depth == 0) return false;
        --depth;
        if (depth < kMaxRememberDepth)
          state = stack[depth];
        else
          state.kind = row_unknown;
        break;
      case 0x0c: {  // def_cfa
        std::uint64_t reg = c.uleb();
        std::uint64_t off = c.uleb();
        state.kind = reg == kDwarfRsp ? row_cfa_rsp : reg == kDwarfRbp ? row_cfa_rbp : row_unknown;
        state.cfa_off = static_cast<std::int64_t>(off);
        break;
      }
      case 0x0d: {  // def_cfa_register
        std::uint64_t reg = c.uleb();
        if (state.kind == row_cfa_plt)
          state.kind = row_unknown;
        else
          state.kind = reg == kDwarfRsp ? row_cfa_rsp : reg == kDwarfRbp ? row_cfa_rbp : row_unknown;
        break;
      }
      case 0x0e:
        state.cfa_off = static_cast<std::int64_t>(c.uleb());
        break;      // def_cfa_offset
      case 0x0f: {  // def_cfa_expression
        std::uint64_t len = c.uleb();
        if (!c.has(len)) return false;
        if (!match_plt_expression(c, c.pos + len, state)) state.kind = row_unknown;
        c.pos += len;
        break;
      }
      case 0x10:    // expression
      case 0x16: {  // val_expression
        std::uint64_t reg = c.uleb();
        std::uint64_t len = c.uleb();
        if (!c.has(len)) return false;
        c.pos += len;
        other_rule(reg);
        break;
      }
      case 0x11: {  // offset_extended_sf
        std::uint64_t reg = c.uleb();
        set_offset(reg, c.sleb() * cie.data_align);
        break;
      }
      case 0x12: {  // def_cfa_sf
        std::uint64_t reg = c.uleb();
        std::int64_t off = c.sleb() * cie.data_align;
        state.kind = reg == kDwarfRsp ? row_cfa_rsp : reg == kDwarfRbp ? row_cfa_rbp : row_unknown;
        state.cfa_off = off;
        break;
      }
      case 0x13:
        state.cfa_off = c.sleb() * cie.data_align;
        break;      // def_cfa_offset_sf
      case 0x14:    // val_offset
      case 0x15: {  // val_offset_sf
        std::uint64_t reg = c.uleb();
        if (op == 0x14)
          c.uleb();
        else
          c.sleb();
        other_rule(reg);
        break;
      }
      case 0x2e:
        c.uleb();
        break;      // GNU_args_size
      case 0x2f: {  // GNU_negative_offset_extended
        std::uint64_t reg = c.uleb();
        set_offset(reg, -static_cast<std::int64_t>(c.uleb()) * cie.data_align);
        break;
      }
      default:
        return false;  // unknown opcode: the rest of this program cannot be decoded
    }
  }
  return c.ok;
}

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
    const eh_cie& cie = parse_cie(id_at - static_cast<std::size_t>(id));
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
    const cfa_state defaults;
    cfa_state initial;
    std::uint64_t loc = begin;
    const std::size_t first = all.size();
    eh_cursor cie_program{in.data, cie.insns, cie.insns_end, in.address};
    if (!run_cfa_program(cie_program, cie.insns_end, cie, defaults, initial, loc, begin + range, begin,
                         nullptr) ||
        loc != begin) {
      note("CIE initial instructions are malformed or advance", at);
      continue;
    }
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
