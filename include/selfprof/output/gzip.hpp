// gzip framing for the pprof writer: zlib's deflate when SELFPROF_HAS_ZLIB is 1, otherwise stored
// (uncompressed) deflate blocks, both with the RFC 1952 header, CRC-32 and size trailer.
// Context: any thread except the signal handler.
//
// SELFPROF_HAS_ZLIB (config.hpp; 0/1, default 0): 1 needs <zlib.h> and linking with -lz (the build sets
// it when it finds zlib). It must have the same value in every translation unit of a program. The
// stored form is about 0.01% larger than its input but needs nothing; every gzip reader accepts it.
// SELFPROF_ZLIB_DLOPEN=1 (the preload library) loads libz.so.1 with dlopen at the first compression
// instead of linking it: a process that never writes a .pb.gz does not map zlib. Without libz.so.1 the
// output is stored blocks.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "selfprof/config.hpp"

#if SELFPROF_HAS_ZLIB
#include <zlib.h>

#include "selfprof/detail/dl_api.hpp"
#endif

namespace selfprof {
namespace detail {

// CRC-32 (ISO-HDLC: reflected polynomial 0xEDB88320, init and final xor 0xFFFFFFFF) as gzip uses it.
// `crc` continues an earlier result (0 to start).
inline std::uint32_t crc32(std::string_view bytes, std::uint32_t crc = 0) {
  struct table_t {
    std::uint32_t v[256];
    table_t() {
      for (std::uint32_t i = 0; i < 256; ++i) {
        std::uint32_t c = i;
        for (int k = 0; k < 8; ++k) c = (c & 1u) ? 0xEDB88320u ^ (c >> 1) : c >> 1;
        v[i] = c;
      }
    }
  };
  static const table_t table;
  crc = ~crc;
  for (const char ch : bytes) crc = table.v[(crc ^ static_cast<unsigned char>(ch)) & 0xFFu] ^ (crc >> 8);
  return ~crc;
}

inline void put_le32(std::string& out, std::uint32_t v) {
  for (int i = 0; i < 4; ++i) out += static_cast<char>((v >> (8 * i)) & 0xFFu);
}

// gzip member with a fixed header (no name, mtime 0, OS 3 = Unix) and stored deflate blocks.
inline std::string gzip_stored(std::string_view bytes) {
  constexpr std::size_t block_max = 65535;  // a stored block's LEN is 16 bits (RFC 1951 §3.2.4)
  std::string out("\x1f\x8b\x08\x00\x00\x00\x00\x00\x00\x03", 10);
  out.reserve(out.size() + bytes.size() + (bytes.size() / block_max + 1) * 5 + 8);
  std::size_t pos = 0;
  do {
    const std::size_t len = bytes.size() - pos < block_max ? bytes.size() - pos : block_max;
    const bool last = pos + len == bytes.size();
    out += static_cast<char>(last ? 1 : 0);  // BFINAL, BTYPE=00; the rest of the byte is padding
    out += static_cast<char>(len & 0xFFu);
    out += static_cast<char>((len >> 8) & 0xFFu);
    out += static_cast<char>(~len & 0xFFu);
    out += static_cast<char>((~len >> 8) & 0xFFu);
    out.append(bytes.data() + pos, len);
    pos += len;
  } while (pos < bytes.size());
  put_le32(out, crc32(bytes));
  put_le32(out, static_cast<std::uint32_t>(bytes.size() & 0xFFFFFFFFu));
  return out;
}

#if SELFPROF_HAS_ZLIB
// The zlib functions gzip_zlib calls: linked, or loaded once from libz.so.1 (SELFPROF_ZLIB_DLOPEN; `ok`
// is false when the library or a function is missing).
#define SELFPROF_ZLIB_FUNCTIONS(X) X(deflateInit2_) X(deflateBound) X(deflate) X(deflateEnd)
struct zlib_api {
  SELFPROF_ZLIB_FUNCTIONS(SELFPROF_DL_MEMBER)
  bool ok = false;
};

inline const zlib_api& zlib() {
  static const zlib_api api = [] {
    zlib_api a;
#if SELFPROF_ZLIB_DLOPEN
    SELFPROF_DL_FILL_LOADED(a, SELFPROF_ZLIB_FUNCTIONS, "libz.so.1");
#else
    SELFPROF_DL_FILL_LINKED(a, SELFPROF_ZLIB_FUNCTIONS);
#endif
    return a;
  }();
  return api;
}
#undef SELFPROF_ZLIB_FUNCTIONS

// zlib deflate with a gzip wrapper; returns an empty string when zlib fails or is missing (the caller
// falls back).
inline std::string gzip_zlib(std::string_view bytes, int level = Z_DEFAULT_COMPRESSION) {
  const zlib_api& z = zlib();
  if (!z.ok) return {};
  z_stream zs{};
  // What the deflateInit2 macro expands to, through the table.
  if (z.deflateInit2_(&zs, level, Z_DEFLATED, 15 + 16, 8, Z_DEFAULT_STRATEGY, ZLIB_VERSION,
                      static_cast<int>(sizeof(z_stream))) != Z_OK)
    return {};
  std::string out(z.deflateBound(&zs, static_cast<uLong>(bytes.size())) + 32, '\0');
  zs.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(bytes.data()));
  zs.avail_in = static_cast<uInt>(bytes.size());
  zs.next_out = reinterpret_cast<Bytef*>(&out[0]);
  zs.avail_out = static_cast<uInt>(out.size());
  const int rc = z.deflate(&zs, Z_FINISH);
  const std::size_t produced = out.size() - zs.avail_out;
  z.deflateEnd(&zs);
  if (rc != Z_STREAM_END) return {};
  out.resize(produced);
  return out;
}
#endif

// gzip of `bytes`: zlib when built with it (and inputs fit its 32-bit sizes), stored blocks otherwise.
inline std::string gzip_compress(std::string_view bytes) {
#if SELFPROF_HAS_ZLIB
  if (bytes.size() < 0xFFFFFFFFu) {
    std::string z = gzip_zlib(bytes);
    if (!z.empty()) return z;
  }
#endif
  return gzip_stored(bytes);
}

}  // namespace detail
}  // namespace selfprof
