// A bounds-checked little-endian reader of call frame information (.eh_frame, .eh_frame_hdr, CFA
// programs): LEB128, DWARF pointer encodings, and the bytes given to parse.
// Context: collector thread or setup only (never the signal handler).
#pragma once

#include <cstddef>
#include <cstdint>

namespace selfprof {
namespace detail {

// Bytes to parse: `size` readable bytes at `data`, which live at runtime address `address` (pc-relative
// pointers are resolved against it; parsing a copy works when `address` is the original's).
struct eh_frame_input {
  const std::uint8_t* data = nullptr;
  std::size_t size = 0;
  std::uintptr_t address = 0;
};

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

}  // namespace detail
}  // namespace selfprof
