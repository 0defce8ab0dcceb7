// MiniDebugInfo: a .gnu_debugdata section holding an xz-compressed ELF file whose .symtab names the
// functions a stripped binary's .dynsym lacks (local and static functions). Fedora, CentOS and others ship
// their binaries this way. The section is decompressed with liblzma, loaded with dlopen("liblzma.so.5")
// at the first such section: no build or link dependency, and a process whose modules have none
// (Debian's) never loads it.
// Context: collector or dump thread (dlopen takes the loader lock; never the signal handler).
#pragma once

#include <dlfcn.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string>

#include "selfprof/status.hpp"
#include "selfprof/symbols/elf.hpp"
#include "selfprof/symbols/symbol_table.hpp"

namespace selfprof {
namespace detail {

// Bounds on what a section may cost: its decompressed size, and the memory liblzma's decoder may use.
constexpr std::size_t minidebuginfo_max_bytes = std::size_t{64} << 20;
constexpr std::uint64_t minidebuginfo_memlimit = std::uint64_t{256} << 20;

// liblzma's one-call decoder, lzma_stream_buffer_decode, by its stable ABI (soname 5): lzma_ret is an
// int-sized enum; LZMA_OK (0) is success and LZMA_BUF_ERROR (10) an output buffer too small, in which
// case nothing was written and the call may be repeated with a larger one.
using lzma_buffer_decode_fn = int (*)(std::uint64_t* memlimit, std::uint32_t flags, const void* allocator,
                                      const std::uint8_t* in, std::size_t* in_pos, std::size_t in_size,
                                      std::uint8_t* out, std::size_t* out_pos, std::size_t out_size);
constexpr int lzma_ok = 0;
constexpr int lzma_buf_error = 10;

// Loaded once; null when liblzma.so.5 is missing. The handle is never closed: the symbolizer may need it
// again at any time.
inline lzma_buffer_decode_fn lzma_decoder() {
  static const lzma_buffer_decode_fn fn = [] {
    void* handle = ::dlopen("liblzma.so.5", RTLD_NOW | RTLD_LOCAL);
    if (handle == nullptr) return lzma_buffer_decode_fn{nullptr};
    return reinterpret_cast<lzma_buffer_decode_fn>(::dlsym(handle, "lzma_stream_buffer_decode"));
  }();
  return fn;
}

// Decompresses one .xz stream into `out`; the error says what failed.
inline status xz_decompress(byte_view in, std::string& out) {
  out.clear();
  lzma_buffer_decode_fn decode = lzma_decoder();
  if (decode == nullptr) return status::error("liblzma.so.5 cannot be loaded (Debian: liblzma5)");
  // Symbol tables compress about 4:1; each too-small buffer costs one decode, so start near the end.
  std::size_t size = std::min(std::max<std::size_t>(in.size * 6, 4096), minidebuginfo_max_bytes);
  for (;;) {
    out.resize(size);
    std::uint64_t memlimit = minidebuginfo_memlimit;
    std::size_t in_pos = 0, out_pos = 0;
    int r = decode(&memlimit, 0, nullptr, in.data, &in_pos, in.size, reinterpret_cast<std::uint8_t*>(&out[0]),
                   &out_pos, out.size());
    if (r == lzma_ok) {
      out.resize(out_pos);
      return status::ok();
    }
    if (r == lzma_buf_error && size < minidebuginfo_max_bytes) {
      size = std::min(size * 2, minidebuginfo_max_bytes);
      continue;
    }
    out.clear();
    if (r == lzma_buf_error) return status::error("larger than 64 MiB decompressed");
    return status::error("not a valid xz stream (liblzma error " + std::to_string(r) + ")");
  }
}

// Adds the function symbols of `image`'s MiniDebugInfo to `table`; returns how many (0 without a
// .gnu_debugdata section). `why` is set when the section is there but could not be read.
inline std::size_t add_minidebuginfo(const elf_image& image, const std::string& path, symbol_table& table,
                                     std::string& why) {
  why.clear();
  const elf_section* section = image.find_section(".gnu_debugdata");
  if (section == nullptr || section->type == SHT_NOBITS) return 0;
  std::string bytes;
  status st = xz_decompress(image.section_bytes(*section), bytes);
  if (!st) {
    why = st.message();
    return 0;
  }
  elf_image inner;
  byte_view view{reinterpret_cast<const unsigned char*>(bytes.data()), bytes.size()};
  st = inner.parse(view, path + " (.gnu_debugdata)");
  if (!st) {
    why = st.message();
    return 0;
  }
  const elf_section* symtab = inner.find_section_type(SHT_SYMTAB);
  if (symtab == nullptr) {
    why = "no .symtab in the decompressed file";
    return 0;
  }
  return table.add_symbols(inner, *symtab);  // names are copied: `bytes` may go
}

}  // namespace detail
}  // namespace selfprof
