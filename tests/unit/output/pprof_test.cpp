// Tests of the pprof writer, its protobuf encoder and gzip framing: golden bytes, a decode of the
// structure with a small independent reader, CRC-32 vectors, stored blocks, and zlib when built in.
// (tests/output/pprof_check.sh reads the files back with `go tool pprof`.)
#include <doctest/doctest.h>

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "fixtures.hpp"
#include "selfprof/output/gzip.hpp"
#include "selfprof/output/pprof.hpp"
#include "selfprof/output/protobuf.hpp"

namespace {

using output_fixtures::add_frame;
using output_fixtures::add_stack;
using output_fixtures::basic_profile;
using output_fixtures::check_golden;
using output_fixtures::many_profile;

std::string to_hex(const std::string& bytes) {
  static const char* digits = "0123456789abcdef";
  std::string out;
  for (std::size_t i = 0; i < bytes.size(); ++i) {
    const auto b = static_cast<unsigned char>(bytes[i]);
    out += digits[b >> 4];
    out += digits[b & 15];
    if (i % 32 == 31 || i + 1 == bytes.size()) out += '\n';
  }
  return out;
}

// A protobuf message decoded one level: field number → values (varints) or bytes.
struct decoded {
  std::multimap<std::uint32_t, std::uint64_t> ints;
  std::multimap<std::uint32_t, std::string> bytes;
  bool ok = true;
};

std::uint64_t read_varint(const std::string& s, std::size_t& i, bool& ok) {
  std::uint64_t v = 0;
  for (int shift = 0; shift < 64; shift += 7) {
    if (i >= s.size()) break;
    const auto b = static_cast<unsigned char>(s[i++]);
    v |= static_cast<std::uint64_t>(b & 0x7F) << shift;
    if (!(b & 0x80)) return v;
  }
  ok = false;
  return 0;
}

decoded decode(const std::string& s) {
  decoded d;
  std::size_t i = 0;
  while (i < s.size() && d.ok) {
    const std::uint64_t tag = read_varint(s, i, d.ok);
    const auto field = static_cast<std::uint32_t>(tag >> 3);
    if ((tag & 7) == 0) {
      d.ints.emplace(field, read_varint(s, i, d.ok));
    } else if ((tag & 7) == 2) {
      const std::uint64_t len = read_varint(s, i, d.ok);
      if (len > s.size() - i) {
        d.ok = false;
        break;
      }
      d.bytes.emplace(field, s.substr(i, len));
      i += len;
    } else {
      d.ok = false;
    }
  }
  return d;
}

std::vector<std::uint64_t> packed(const std::string& s) {
  std::vector<std::uint64_t> out;
  std::size_t i = 0;
  bool ok = true;
  while (i < s.size() && ok) out.push_back(read_varint(s, i, ok));
  return out;
}

std::uint32_t le32(const std::string& s, std::size_t at) {
  std::uint32_t v = 0;
  for (int k = 3; k >= 0; --k) v = (v << 8) | static_cast<unsigned char>(s[at + k]);
  return v;
}

// Inflates a gzip member made only of stored blocks; returns false on any structural error.
bool gunzip_stored(const std::string& gz, std::string& out) {
  if (gz.size() < 18 || gz.compare(0, 3, "\x1f\x8b\x08") != 0 || gz[3] != 0) return false;
  std::size_t i = 10;
  out.clear();
  for (;;) {
    if (i + 5 > gz.size()) return false;
    const auto head = static_cast<unsigned char>(gz[i]);
    if ((head & 6) != 0) return false;  // not BTYPE 00
    const unsigned len = static_cast<unsigned char>(gz[i + 1]) | static_cast<unsigned char>(gz[i + 2]) << 8;
    const unsigned nlen = static_cast<unsigned char>(gz[i + 3]) | static_cast<unsigned char>(gz[i + 4]) << 8;
    if ((len ^ 0xFFFFu) != nlen || i + 5 + len > gz.size()) return false;
    out.append(gz, i + 5, len);
    i += 5 + len;
    if (head & 1) break;
  }
  if (i + 8 != gz.size()) return false;
  return le32(gz, i) == selfprof::detail::crc32(out) && le32(gz, i + 4) == out.size();
}

}  // namespace

#if SELFPROF_HAS_ZLIB
#include <zlib.h>
namespace {
std::string gunzip_zlib(const std::string& gz) {
  z_stream zs{};
  REQUIRE(inflateInit2(&zs, 15 + 16) == Z_OK);
  std::string out;
  char buf[65536];
  zs.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(gz.data()));
  zs.avail_in = static_cast<uInt>(gz.size());
  int rc;
  do {
    zs.next_out = reinterpret_cast<Bytef*>(buf);
    zs.avail_out = sizeof buf;
    rc = inflate(&zs, Z_NO_FLUSH);
    out.append(buf, sizeof buf - zs.avail_out);
  } while (rc == Z_OK);
  inflateEnd(&zs);
  CHECK(rc == Z_STREAM_END);
  return out;
}
}  // namespace

TEST_CASE("gzip: the zlib path inflates back to the input and is smaller") {
  const std::string raw = selfprof::detail::encode_pprof(many_profile(1000));
  const std::string gz = selfprof::detail::gzip_compress(raw);
  CHECK(gz.size() < raw.size() * 3 / 4);  // the stored form is larger than raw
  CHECK(gunzip_zlib(gz) == raw);
  CHECK(gunzip_zlib(selfprof::detail::gzip_stored(raw)) == raw);  // zlib accepts our stored form
}
#endif

TEST_CASE("gzip: CRC-32 check values") {
  CHECK(selfprof::detail::crc32("") == 0u);
  CHECK(selfprof::detail::crc32("123456789") == 0xCBF43926u);
  CHECK(selfprof::detail::crc32("The quick brown fox jumps over the lazy dog") == 0x414FA339u);
  CHECK(selfprof::detail::crc32("6789", selfprof::detail::crc32("12345")) == 0xCBF43926u);
}

TEST_CASE("gzip: stored blocks frame any size, including empty and several blocks") {
  for (std::size_t size :
       {std::size_t(0), std::size_t(1), std::size_t(65535), std::size_t(65536), std::size_t(200000)}) {
    std::string in;
    for (std::size_t i = 0; i < size; ++i) in += static_cast<char>((i * 7 + i / 251) & 0xFF);
    const std::string gz = selfprof::detail::gzip_stored(in);
    std::string out;
    CHECK_MESSAGE(gunzip_stored(gz, out), "size " << size);
    CHECK(out == in);
    CHECK(gz.size() == 18 + in.size() + 5 * (in.size() == 0 ? 1 : (in.size() + 65534) / 65535));
  }
  // A flipped payload byte breaks the CRC.
  std::string gz = selfprof::detail::gzip_stored("hello pprof");
  gz[16] ^= 1;
  std::string out;
  CHECK_FALSE(gunzip_stored(gz, out));
}

TEST_CASE("protobuf: varints and field framing") {
  selfprof::detail::proto_writer w;
  w.varint_field(1, 150);
  CHECK(w.bytes() == std::string("\x08\x96\x01", 3));
  w.clear();
  w.bytes_field(2, "testing");
  CHECK(w.bytes() == std::string("\x12\x07testing", 9));
  w.clear();
  w.varint_field_nz(3, 0);
  w.int64_field_nz(4, 0);
  w.bool_field_nz(5, false);
  w.packed_field(6, {});
  CHECK(w.bytes().empty());
  w.int64_field_nz(1, -1);
  CHECK(w.bytes().size() == 11);  // negative int64: ten-byte varint
  w.clear();
  w.packed_field(4, {3, 270, 86942});
  CHECK(w.bytes() == std::string("\x22\x06\x03\x8e\x02\x9e\xa7\x05", 8));
}

TEST_CASE("pprof: golden protobuf bytes of the basic profile") {
  check_golden("basic.pprof.hex", to_hex(selfprof::detail::encode_pprof(basic_profile())));
}

TEST_CASE("pprof: structure of the basic profile") {
  const auto p = basic_profile();
  const decoded top = decode(selfprof::detail::encode_pprof(p));
  REQUIRE(top.ok);
  std::vector<std::string> strings;
  for (auto [it, end] = top.bytes.equal_range(6); it != end; ++it) strings.push_back(it->second);
  REQUIRE(!strings.empty());
  CHECK(strings[0].empty());
  auto str = [&](std::uint64_t i) { return i < strings.size() ? strings[i] : std::string("<bad>"); };

  std::vector<std::pair<std::string, std::string>> types;
  for (auto [it, end] = top.bytes.equal_range(1); it != end; ++it) {
    const decoded vt = decode(it->second);
    types.emplace_back(str(vt.ints.find(1)->second), str(vt.ints.find(2)->second));
  }
  CHECK(types ==
        std::vector<std::pair<std::string, std::string>>{{"samples", "count"}, {"cpu", "nanoseconds"}});
  CHECK(top.ints.count(9) == 1);
  CHECK(top.ints.find(9)->second == p.info.start_unix_ns);
  CHECK(top.ints.find(10)->second == 2500000000u);
  CHECK(top.ints.find(12)->second == p.info.period_ns);
  const decoded pt = decode(top.bytes.find(11)->second);
  CHECK(str(pt.ints.find(1)->second) == "cpu");
  CHECK(str(pt.ints.find(2)->second) == "nanoseconds");

  // Samples: counts add up, values are [n, n*period], thread labels present.
  std::uint64_t total = 0;
  std::map<std::string, std::uint64_t> label_keys;
  std::vector<std::uint64_t> location_refs;
  for (auto [it, end] = top.bytes.equal_range(2); it != end; ++it) {
    const decoded s = decode(it->second);
    const auto values = packed(s.bytes.find(2)->second);
    REQUIRE(values.size() == 2);
    CHECK(values[1] == values[0] * p.info.period_ns);
    total += values[0];
    for (auto l : packed(s.bytes.find(1)->second)) location_refs.push_back(l);
    for (auto [lt, lend] = s.bytes.equal_range(3); lt != lend; ++lt)
      ++label_keys[str(decode(lt->second).ints.find(1)->second)];
  }
  CHECK(total == 105);
  CHECK(label_keys["thread_id"] == 10);
  CHECK(label_keys["thread_name"] == 10);

  // Ids are 1..n; every referenced id exists; mappings carry has_functions.
  const std::size_t locations = top.bytes.count(4), functions = top.bytes.count(5);
  for (auto l : location_refs) CHECK((l >= 1 && l <= locations));
  std::size_t mapping_count = 0;
  for (auto [it, end] = top.bytes.equal_range(3); it != end; ++it) {
    const decoded m = decode(it->second);
    ++mapping_count;
    CHECK(m.ints.find(1)->second == mapping_count);
    CHECK(m.ints.count(7) == 1);  // has_functions
  }
  CHECK(mapping_count == 2);
  std::map<std::string, int> function_names;
  for (auto [it, end] = top.bytes.equal_range(5); it != end; ++it) {
    const decoded f = decode(it->second);
    CHECK(f.ints.find(1)->second <= functions);
    ++function_names[str(f.ints.find(2)->second)];
  }
  CHECK(function_names["hot_loop<int>()"] == 1);  // one function, two locations
  CHECK(function_names["[truncated]"] == 1);
  CHECK(function_names["a;b<c&d>\"q\" 'x'"] == 1);  // names are data here, not folded text
  // The inlined frame shares the location of its physical caller: two Lines, callee first.
  bool found_inline = false;
  for (auto [it, end] = top.bytes.equal_range(4); it != end; ++it) {
    const decoded loc = decode(it->second);
    if (loc.bytes.count(4) == 2) {
      found_inline = true;
      auto lines = loc.bytes.equal_range(4);
      CHECK(decode(lines.first->second).ints.find(2)->second == 919);
      CHECK(loc.ints.find(3)->second == 0x401310);
    }
  }
  CHECK(found_inline);
}

TEST_CASE("pprof: the same profile gives the same bytes; gzip and raw agree") {
  const auto p = many_profile(2000);
  const std::string raw = selfprof::detail::encode_pprof(p);
  CHECK(selfprof::detail::encode_pprof(p) == raw);
  selfprof::pprof_options opts;
  opts.gzip = false;
  CHECK(selfprof::write_pprof(p, opts) == raw);
  const std::string gz = selfprof::write_pprof(p);
  REQUIRE(gz.size() > 2);
  CHECK(gz.compare(0, 2, "\x1f\x8b") == 0);
#if !SELFPROF_HAS_ZLIB
  std::string out;
  CHECK(gunzip_stored(gz, out));
  CHECK(out == raw);
#endif
}

TEST_CASE("pprof: wall and time-unit profiles, bad indices, empty profile") {
  auto p = basic_profile();
  p.info.mode = selfprof::profile_mode::wall;
  p.info.period_ns = 0;
  p.info.hz = 20;
  decoded top = decode(selfprof::detail::encode_pprof(p));
  REQUIRE(top.ok);
  CHECK(top.ints.find(12)->second == 50000000u);  // 1e9 / 20 Hz

  selfprof::profile q;
  q.info.mode = selfprof::profile_mode::offcpu;
  q.info.unit = "us";
  add_frame(q, "read", "", 0);
  add_stack(q, {0, 42}, 3);  // index 42 does not exist
  top = decode(selfprof::detail::encode_pprof(q));
  REQUIRE(top.ok);
  CHECK(top.bytes.count(1) == 1);
  const decoded s = decode(top.bytes.find(2)->second);
  CHECK(packed(s.bytes.find(2)->second) == std::vector<std::uint64_t>{3000});

  const decoded empty = decode(selfprof::detail::encode_pprof(selfprof::profile{}));
  CHECK(empty.ok);
  CHECK(empty.bytes.count(2) == 0);
  CHECK(empty.bytes.find(6)->second.empty());
}
