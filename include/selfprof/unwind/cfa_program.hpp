// CFA programs: the DWARF call frame instructions of a CIE and an FDE run into the register rules the
// walker follows (signal/unwind_rows.hpp), one row per location change, with the PLT expression binutils
// emits recognized and every other expression marked unknown.
// Context: collector thread or setup only (allocates; never the signal handler).
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "selfprof/signal/arch_x86_64.hpp"
#include "selfprof/signal/unwind_rows.hpp"
#include "selfprof/unwind/eh_cursor.hpp"

namespace selfprof {
namespace detail {

// remember_state nesting kept; deeper nesting makes the rest of that FDE row_unknown.
constexpr std::size_t kMaxRememberDepth = 16;

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

}  // namespace detail
}  // namespace selfprof
