// Tests of the ELF reader, symbol table and debug-file lookup against the fixture library, cross-checked
// with readelf, nm and objdump; truncated and mutated inputs must yield errors, never crashes.
#include <doctest/doctest.h>

#include <cstring>
#include <random>
#include <string>

#include "fixtures/symbols_fixture.hpp"
#include "selfprof/symbols/debug_file.hpp"
#include "selfprof/symbols/elf.hpp"
#include "selfprof/symbols/symbol_table.hpp"

using selfprof::detail::byte_view;
using selfprof::detail::elf_image;
using selfprof::detail::symbol_table;

namespace {

byte_view view(const std::string& bytes) {
  return byte_view{reinterpret_cast<const unsigned char*>(bytes.data()), bytes.size()};
}

// Builds the symbol table the registry would build from one image (symtab, dynsym, PLT).
void fill_table(const elf_image& image, symbol_table& table) {
  if (const auto* s = image.find_section_type(SHT_SYMTAB)) table.add_symbols(image, *s);
  if (const auto* s = image.find_section_type(SHT_DYNSYM)) table.add_symbols(image, *s);
  table.add_plt(image);
  table.finish();
}

std::string name_at(symbol_table& table, unsigned long long vaddr) {
  symbol_table::hit hit;
  if (!table.lookup(vaddr, hit)) return "<none>";
  return table.name(hit.index);
}

}  // namespace

TEST_CASE("elf: fixture headers, sections and build-id agree with readelf") {
  std::string path = selfprof_test::fixture_library();
  REQUIRE(!path.empty());
  std::string bytes = selfprof_test::read_file(path);
  elf_image image;
  REQUIRE(image.parse(view(bytes), path));
  CHECK(image.type() == ET_DYN);
  REQUIRE(image.find_section(".text") != nullptr);
  CHECK((image.find_section(".text")->flags & SHF_EXECINSTR) != 0);
  CHECK(image.find_section_type(SHT_SYMTAB) != nullptr);
  CHECK(image.find_section_type(SHT_DYNSYM) != nullptr);
  CHECK(image.find_section(".no-such-section") == nullptr);
  CHECK(image.build_id() == selfprof_test::readelf_build_id(path));
  CHECK(image.build_id().size() == 40);  // sha1
  bool exec_load = false;
  for (const auto& seg : image.segments()) exec_load |= seg.type == PT_LOAD && (seg.flags & PF_X) != 0;
  CHECK(exec_load);
  std::string link;
  std::uint32_t crc = 0;
  CHECK_FALSE(image.debuglink(link, crc));  // the unstripped fixture has none
}

TEST_CASE("elf: symbol sizes, a gap after a function, zero-size and static symbols (nm agrees)") {
  std::string path = selfprof_test::fixture_library();
  REQUIRE(!path.empty());
  auto nm = selfprof_test::nm_symbols(path);
  REQUIRE(nm.count("selfprof_fixture_sized") == 1);
  REQUIRE(nm.count("fixture_static_fn") == 1);
  std::string bytes = selfprof_test::read_file(path);
  elf_image image;
  REQUIRE(image.parse(view(bytes), path));
  symbol_table table;
  fill_table(image, table);

  auto sized = nm["selfprof_fixture_sized"].address;
  CHECK(nm["selfprof_fixture_sized"].size == 16);
  CHECK(name_at(table, sized) == "selfprof_fixture_sized");
  CHECK(name_at(table, sized + 15) == "selfprof_fixture_sized");
  CHECK(name_at(table, sized + 16) == "<none>");  // past its end: the 48-byte gap is nobody's
  CHECK(name_at(table, sized + 63) == "<none>");
  CHECK(name_at(table, nm["selfprof_fixture_after_gap"].address) == "selfprof_fixture_after_gap");
  auto zero = nm["selfprof_fixture_zero_size"].address;  // size 0: runs to the next symbol
  CHECK(name_at(table, zero) == "selfprof_fixture_zero_size");
  CHECK(name_at(table, zero + 31) == "selfprof_fixture_zero_size");
  CHECK(name_at(table, zero + 32) == "selfprof_fixture_last");
  // A NOTYPE label of size 0 (ld.so's _dl_start_user is one) names the code up to the next symbol; a
  // label inside a sized function does not split it.
  REQUIRE(nm.count("selfprof_fixture_label") == 1);
  auto label = nm["selfprof_fixture_label"].address;
  CHECK(name_at(table, label) == "selfprof_fixture_label");
  CHECK(name_at(table, label + 15) == "selfprof_fixture_label");
  CHECK(name_at(table, label + 16) == "selfprof_fixture_with_inner");
  CHECK(name_at(table, nm["selfprof_fixture_inner_label"].address) == "selfprof_fixture_with_inner");
  CHECK(name_at(table, label + 31) == "selfprof_fixture_with_inner");
  auto stat = nm["fixture_static_fn"];
  CHECK(name_at(table, stat.address + stat.size - 1) == "fixture_static_fn");
  // Aliases at one address get perf's choice: the longer of two globals, a local over a weak symbol.
  auto copy = nm["selfprof_fixture_copy_alias"].address;
  CHECK(nm["selfprof_fixture_move_alias_longer"].address == copy);
  CHECK(name_at(table, copy) == "selfprof_fixture_move_alias_longer");
  CHECK(nm["fixture_local_alias"].address == nm["selfprof_fixture_weak_alias"].address);
  CHECK(name_at(table, nm["selfprof_fixture_weak_alias"].address + 8) == "fixture_local_alias");
  for (const auto& entry : nm) {
    const std::string& name = entry.first;
    const auto& sym = entry.second;
    if (sym.size == 0 || name == "_init" || name == "_fini") continue;
    if (name == "selfprof_fixture_copy_alias" || name == "selfprof_fixture_weak_alias") continue;
    if (name.rfind("selfprof_fixture", 0) == 0 || name == "fixture_static_fn") {
      INFO(name);
      CHECK(name_at(table, sym.address + sym.size / 2) == name);
    }
  }
}

TEST_CASE("elf: PLT stubs are named like objdump names them") {
  std::string path = selfprof_test::fixture_library();
  REQUIRE(!path.empty());
  std::string dis;
  REQUIRE(selfprof_test::run_command("objdump -d '" + path + "' 2>/dev/null", &dis) == 0);
  std::string bytes = selfprof_test::read_file(path);
  elf_image image;
  REQUIRE(image.parse(view(bytes), path));
  symbol_table table;
  fill_table(image, table);
  int compared = 0;
  std::size_t at = 0;
  while ((at = dis.find("@plt>:\n", at)) != std::string::npos) {
    std::size_t line = dis.rfind('\n', at) + 1;
    std::size_t lt = dis.find(" <", line);
    std::string name = dis.substr(lt + 2, at + 4 - (lt + 2));
    unsigned long long addr = std::stoull(dis.substr(line, lt - line), nullptr, 16);
    at += 6;
    // objdump also names .plt.got entries; we synthesize names for the .plt/.plt.sec stubs only.
    const auto* plt_got = image.find_section(".plt.got");
    if (plt_got != nullptr && addr >= plt_got->addr && addr < plt_got->addr + plt_got->size) continue;
    INFO(name);
    CHECK(name_at(table, addr) == name);
    ++compared;
  }
  CHECK(compared >= 1);  // getenv@plt at least
}

TEST_CASE("elf: a .dynsym-only library does not charge a static function to its neighbour") {
  selfprof_test::temp_dir dir;
  selfprof_test::fixture_variants v;
  REQUIRE(selfprof_test::make_fixture_variants(dir, v));
  auto nm = selfprof_test::nm_symbols(selfprof_test::fixture_library());
  std::string bytes = selfprof_test::read_file(v.stripped);
  elf_image image;
  REQUIRE(image.parse(view(bytes), v.stripped));
  CHECK(image.find_section_type(SHT_SYMTAB) == nullptr);
  symbol_table table;
  fill_table(image, table);
  CHECK(name_at(table, nm["selfprof_fixture_add"].address) == "selfprof_fixture_add");
  CHECK(name_at(table, nm["fixture_static_fn"].address) == "<none>");
}

TEST_CASE("elf: debuglink CRC-32 and debug-file candidate paths") {
  const std::string check = "123456789";
  CHECK(selfprof::detail::debuglink_crc32(view(check)) == 0xCBF43926u);  // the standard CRC-32 check value
  auto by_id = selfprof::detail::build_id_debug_paths({"/r1", "/r2"}, "abcdef01");
  REQUIRE(by_id.size() == 2);
  CHECK(by_id[0] == "/r1/.build-id/ab/cdef01.debug");
  auto by_link =
      selfprof::detail::debuglink_paths({"/usr/lib/debug"}, "/usr/lib/x/libz.so.1", "libz.so.1.debug");
  REQUIRE(by_link.size() == 3);
  CHECK(by_link[0] == "/usr/lib/x/libz.so.1.debug");
  CHECK(by_link[1] == "/usr/lib/x/.debug/libz.so.1.debug");
  CHECK(by_link[2] == "/usr/lib/debug/usr/lib/x/libz.so.1.debug");
  CHECK(selfprof::detail::debuglink_paths({"/d"}, "/lib/a.so", "../evil").empty());
  CHECK(selfprof::detail::debuglink_paths({"/d"}, "relative.so", "a.debug").empty());
}

TEST_CASE("elf: debug files are found by build-id and by debuglink, and the CRC is checked") {
  selfprof_test::temp_dir dir;
  selfprof_test::fixture_variants v;
  REQUIRE(selfprof_test::make_fixture_variants(dir, v));
  auto check_found = [](const std::string& lib, const std::vector<std::string>& roots, bool expect) {
    std::string bytes = selfprof_test::read_file(lib);
    elf_image image;
    REQUIRE(image.parse(view(bytes), lib));
    selfprof::detail::debug_file debug;
    bool found = selfprof::detail::find_debug_file(roots, lib, image, debug);
    CHECK(found == expect);
    if (found) CHECK(debug.image.find_section_type(SHT_SYMTAB) != nullptr);
    return debug.path;
  };
  CHECK(check_found(v.buildid_lib, {v.buildid_root}, true).find("/.build-id/") != std::string::npos);
  CHECK(check_found(v.debuglink_lib, {dir / "nothing"}, true).find("/.debug/libfx_dl.debug") !=
        std::string::npos);
  CHECK(check_found(v.rootlink_lib, {v.rootlink_root}, true).find("/dlroot/") != std::string::npos);
  check_found(v.rootlink_lib, {dir / "nothing"}, false);
  check_found(v.stripped, {dir / "nothing"}, false);
  // Corrupt the debug file behind the debuglink: the CRC no longer matches, so it is not used.
  std::string debug_path = dir / "dl/.debug/libfx_dl.debug";
  std::string debug = selfprof_test::read_file(debug_path);
  REQUIRE(debug.size() > 100);
  debug[debug.size() - 1] = static_cast<char>(debug[debug.size() - 1] ^ 0x5a);
  REQUIRE(selfprof_test::write_file(debug_path, debug));
  check_found(v.debuglink_lib, {dir / "nothing"}, false);
}

TEST_CASE("elf: every truncation of the fixture is an error or a bounded parse, never a crash") {
  std::string path = selfprof_test::fixture_library();
  REQUIRE(!path.empty());
  std::string bytes = selfprof_test::read_file(path);
  Elf64_Ehdr eh;
  REQUIRE(bytes.size() > sizeof eh);
  std::memcpy(&eh, bytes.data(), sizeof eh);
  std::uint64_t headers_end = eh.e_shoff + std::uint64_t{eh.e_shnum} * eh.e_shentsize;
  std::size_t errors = 0;
  for (std::size_t len = 0; len < bytes.size(); len += (len < 256 ? 1 : 7)) {
    std::string cut = bytes.substr(0, len);
    elf_image image;
    auto st = image.parse(view(cut), "cut");
    if (len < sizeof(Elf64_Ehdr) || len < headers_end) {
      INFO(len);
      CHECK_FALSE(st);
      CHECK(!st.message().empty());
    }
    if (!st) {
      ++errors;
      continue;
    }
    symbol_table table;
    fill_table(image, table);
    name_at(table, 0x1100);
  }
  CHECK(errors > 0);
}

TEST_CASE("elf: thousands of random mutations of a real ELF file parse without crashing") {
  std::string path = selfprof_test::fixture_library();
  REQUIRE(!path.empty());
  const std::string original = selfprof_test::read_file(path);
  REQUIRE(original.size() > 1024);
  Elf64_Ehdr eh;
  std::memcpy(&eh, original.data(), sizeof eh);
  std::mt19937_64 rng(12345);
  std::size_t parsed = 0, rejected = 0, symbols_found = 0;
  for (int iteration = 0; iteration < 5000; ++iteration) {
    std::string bytes = original;
    int mutations = 1 + static_cast<int>(rng() % 8);
    for (int m = 0; m < mutations; ++m) {
      std::size_t where;
      switch (rng() % 4) {
        case 0:
          where = rng() % sizeof(Elf64_Ehdr);
          break;  // ELF header
        case 1:
          where = (eh.e_shoff + rng() % (std::uint64_t{eh.e_shnum} * eh.e_shentsize));
          break;  // sections
        case 2:
          where = (eh.e_phoff + rng() % (std::uint64_t{eh.e_phnum} * eh.e_phentsize));
          break;  // segments
        default:
          where = rng() % bytes.size();
          break;
      }
      if (where >= bytes.size()) continue;
      unsigned char value = static_cast<unsigned char>(rng());
      if (rng() % 3 == 0) value = static_cast<unsigned char>(rng() % 2 ? 0xff : 0x00);
      bytes[where] = static_cast<char>(value);
    }
    if (rng() % 8 == 0) bytes.resize(rng() % bytes.size());
    elf_image image;
    if (!image.parse(view(bytes), "mutant")) {
      ++rejected;
      continue;
    }
    ++parsed;
    symbol_table table;
    fill_table(image, table);
    symbols_found += table.size() != 0;
    for (unsigned long long a = 0x1000; a < 0x1300; a += 0x10) name_at(table, a);
    (void)image.build_id();
    std::string link;
    std::uint32_t crc;
    (void)image.debuglink(link, crc);
    for (const auto& s : image.sections()) (void)image.section_bytes(s);
    (void)image.load_bias(0x7f0000000000, 0x1000);
  }
  MESSAGE("mutants parsed: " << parsed << ", rejected: " << rejected << ", with symbols: " << symbols_found);
  CHECK(parsed > 0);
  CHECK(rejected > 0);
  CHECK(symbols_found > 0);
}
