// A minimal protocol-buffers encoder (varints, length-delimited fields, packed repeats): enough to
// write pprof's profile.proto without a third-party library.
// Context: any thread except the signal handler.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace selfprof {
namespace detail {

class proto_writer {
 public:
  enum wire : std::uint32_t { varint_wire = 0, bytes_wire = 2 };

  // An unsigned (or int64 as two's complement: negative values take ten bytes, as in protobuf) field.
  void varint_field(std::uint32_t field, std::uint64_t v) {
    tag(field, varint_wire);
    varint(v);
  }
  // Proto3 leaves fields at their default out: these skip zero / false / empty.
  void varint_field_nz(std::uint32_t field, std::uint64_t v) {
    if (v) varint_field(field, v);
  }
  void int64_field_nz(std::uint32_t field, std::int64_t v) {
    if (v) varint_field(field, static_cast<std::uint64_t>(v));
  }
  void bool_field_nz(std::uint32_t field, bool v) {
    if (v) varint_field(field, 1);
  }
  // Strings, bytes and nested messages; repeated string fields write empty strings too.
  void bytes_field(std::uint32_t field, std::string_view bytes) {
    tag(field, bytes_wire);
    varint(bytes.size());
    out_.append(bytes.data(), bytes.size());
  }
  void message_field(std::uint32_t field, const proto_writer& sub) { bytes_field(field, sub.out_); }
  // A packed repeated varint field (skipped when empty).
  void packed_field(std::uint32_t field, const std::vector<std::uint64_t>& values) {
    if (values.empty()) return;
    proto_writer body;
    for (const auto v : values) body.varint(v);
    bytes_field(field, body.out_);
  }

  void varint(std::uint64_t v) {
    while (v >= 0x80) {
      out_ += static_cast<char>((v & 0x7F) | 0x80);
      v >>= 7;
    }
    out_ += static_cast<char>(v);
  }

  const std::string& bytes() const { return out_; }
  std::string take() { return std::move(out_); }
  void clear() { out_.clear(); }

 private:
  void tag(std::uint32_t field, wire w) { varint((static_cast<std::uint64_t>(field) << 3) | w); }
  std::string out_;
};

}  // namespace detail
}  // namespace selfprof
