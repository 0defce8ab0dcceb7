// Tests of reading ELF files with pread (symbols/mapped_file.hpp) while they change on disk: a module or
// debug file truncated in place (to 0 or to half), extended or rewritten before, during or after it is
// read gives correct symbols or an error naming it ("changed while being read"), never SIGBUS (which
// would kill this test process). Covers the low-level reader, the module registry, the debug-file
// lookup and, with libdw, the DWARF reader.
#include <doctest/doctest.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <functional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "fixtures/symbols_fixture.hpp"
#include "selfprof/detail/sys.hpp"
#include "selfprof/symbols/debug_file.hpp"
#include "selfprof/symbols/dwarf_lines.hpp"
#include "selfprof/symbols/elf.hpp"
#include "selfprof/symbols/mapped_file.hpp"
#include "selfprof/symbols/modules.hpp"
#include "selfprof/symbols/symbol_table.hpp"
#include "test_support.hpp"

namespace mapped_file_test {

using selfprof::detail::elf_image;
using selfprof::detail::mapped_file;
using selfprof::detail::module_registry;
using selfprof::detail::symbol_table;

bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

// Reads every symbol source of `image` into `table`, as the registry does.
void fill(const elf_image& image, symbol_table& table) {
  if (const auto* s = image.find_section_type(SHT_SYMTAB)) table.add_symbols(image, *s);
  if (const auto* s = image.find_section_type(SHT_DYNSYM)) table.add_symbols(image, *s);
  table.add_plt(image);
  table.finish();
}

std::string name_at(const symbol_table& table, std::uint64_t vaddr) {
  symbol_table::hit hit;
  return table.lookup(vaddr, hit) ? std::string(table.raw_name(hit.index)) : "<none>";
}

// The ways a file is changed under the reader, each keeping its inode.
struct change {
  const char* what;
  std::function<bool(const std::string& path, const std::string& original)> apply;
};

std::vector<change> changes() {
  using symbols_test::rewrite_in_place;
  using symbols_test::truncate_in_place;
  return {
      {"truncated to 0", [](const std::string& p, const std::string&) { return truncate_in_place(p, 0); }},
      {"truncated to half",
       [](const std::string& p, const std::string& o) { return truncate_in_place(p, o.size() / 2); }},
      {"rewritten with other bytes",
       [](const std::string& p, const std::string& o) {
         return rewrite_in_place(p, std::string(o.size(), 'x'));
       }},
      {"rewritten shorter, as ELF",
       [](const std::string& p, const std::string& o) {
         return rewrite_in_place(p, o.substr(0, o.size() / 3));
       }},
      {"extended", [](const std::string& p, const std::string& o) { return rewrite_in_place(p, o + o); }},
  };
}

// A copy of `from` at `to`, which tests change in place.
bool copy_file(const std::string& from, const std::string& to) {
  return selfprof_test::write_file(to, selfprof_test::read_file(from));
}

// Opens sys().open to a hook for one test, restoring the real table on destruction.
struct open_hook {
  static std::function<void(const char*)>& before_open() {
    static std::function<void(const char*)> f;
    return f;
  }
  explicit open_hook(std::function<void(const char*)> f) {
    before_open() = std::move(f);
    selfprof::detail::sys().open = [](const char* path, int flags, mode_t mode) {
      if (before_open()) before_open()(path);
      return selfprof::detail::default_open(path, flags, mode);
    };
  }
  ~open_hook() {
    selfprof::detail::sys() = selfprof::detail::default_syscalls();
    before_open() = nullptr;
  }
  open_hook(const open_hook&) = delete;
  open_hook& operator=(const open_hook&) = delete;
};

TEST_CASE("mapped_file: ranges are read on demand and kept; check() sees any change since") {
  std::string lib = selfprof_test::fixture_library();
  REQUIRE(!lib.empty());
  selfprof_test::temp_dir dir;
  const std::string path = dir / "lib.so";
  const std::string original = selfprof_test::read_file(lib);
  REQUIRE(copy_file(lib, path));

  mapped_file file;
  REQUIRE(file.open(path));
  CHECK(file.path() == path);
  CHECK(file.size() == original.size());
  auto head = file.read(0, 16);
  REQUIRE(head.size == 16);
  CHECK(std::memcmp(head.data, original.data(), 16) == 0);
  CHECK(file.read(4, 4).data == head.data + 4);  // served from the range already read
  CHECK(file.read(original.size() - 1, 2).size == 0);
  CHECK(file.read(original.size() + 1, 0).size == 0);
  std::uint32_t crc = 0;
  std::size_t streamed = 0;
  CHECK(file.read_all([&](selfprof::detail::byte_view b) {
    crc = selfprof::detail::debuglink_crc32(b, crc);
    streamed += b.size;
  }));
  CHECK(streamed == original.size());
  CHECK(crc == selfprof::detail::debuglink_crc32(selfprof::detail::byte_view{
                   reinterpret_cast<const unsigned char*>(original.data()), original.size()}));
  CHECK(file.check());

  for (const change& c : changes()) {
    INFO(c.what);
    REQUIRE(selfprof_test::write_file(path, original));
    REQUIRE(file.open(path));
    auto kept = file.read(0, 64);
    REQUIRE(kept.size == 64);
    REQUIRE(c.apply(path, original));
    auto status = file.check();
    CHECK_FALSE(status);
    CHECK(contains(status.message(), path + ": changed while being read"));
    CHECK(std::memcmp(kept.data, original.data(), 64) == 0);  // owned memory, still readable
  }
  // The bytes kept are bounded (twice the file's size), whatever overlapping ranges a header asks for.
  REQUIRE(selfprof_test::write_file(path, original));
  REQUIRE(file.open(path));
  const std::size_t n = original.size();
  CHECK(file.read(0, n - 1).size == n - 1);
  CHECK(file.read(1, n - 1).size == n - 1);
  CHECK(file.read(2, n - 2).size == n - 2);  // inside the second range: nothing new kept
  CHECK(file.read(0, n).size == 0);
  CHECK(file.check());
  // Rewritten with the same bytes: what was read still matches the file.
  REQUIRE(selfprof_test::write_file(path, original));
  REQUIRE(file.open(path));
  REQUIRE(file.read(0, 64).size == 64);
  REQUIRE(symbols_test::rewrite_in_place(path, original));
  CHECK(file.check());
}

TEST_CASE("mapped_file: files that cannot be read give errors naming them") {
  selfprof_test::temp_dir dir;
  mapped_file file;
  auto missing = file.open(dir / "missing");
  CHECK_FALSE(missing);
  CHECK(contains(missing.message(), dir / "missing"));
  CHECK(contains(file.open(dir.path()).message(), "not a regular file"));
  REQUIRE(selfprof_test::write_file(dir / "empty", ""));
  CHECK(contains(file.open(dir / "empty").message(), "empty file"));
  REQUIRE(selfprof_test::write_file(dir / "some", "bytes"));
  CHECK(contains(file.open(dir / "some", 1).message(), "inode changed"));
  CHECK_FALSE(file.is_open());
  CHECK(file.read(0, 1).size == 0);
  CHECK_FALSE(file.check());
}

TEST_CASE("mapped_file: an ELF file changed between open and parse, or between parse and the symbol reads") {
  std::string lib = selfprof_test::fixture_library();
  REQUIRE(!lib.empty());
  selfprof_test::temp_dir dir;
  const std::string path = dir / "lib.so";
  const std::string original = selfprof_test::read_file(lib);
  auto nm = selfprof_test::nm_symbols(lib);
  REQUIRE(nm.count("selfprof_fixture_sized") == 1);
  const std::uint64_t sized = nm["selfprof_fixture_sized"].address;

  for (bool before_parse : {true, false}) {
    for (const change& c : changes()) {
      INFO(c.what << (before_parse ? ", before parse" : ", after parse"));
      REQUIRE(selfprof_test::write_file(path, original));
      mapped_file file;
      REQUIRE(file.open(path));
      elf_image image;
      if (before_parse) REQUIRE(c.apply(path, original));
      auto parsed = image.parse(file, path);
      if (!before_parse) {
        REQUIRE(parsed);
        REQUIRE(c.apply(path, original));
      }
      symbol_table table;
      if (parsed) {
        fill(image, table);
        (void)image.build_id();
        std::string link;
        std::uint32_t crc = 0;
        (void)image.debuglink(link, crc);
        for (const auto& s : image.sections()) (void)image.section_bytes(s);
      }
      auto status = file.check();
      if (before_parse && !parsed) {
        CHECK(contains(parsed.message(), path));  // read as changed, or not ELF as it is now
      } else {
        CHECK_FALSE(status);
        CHECK(contains(status.message(), path + ": changed while being read"));
      }
    }
  }

  // Unchanged until every read is done: a truncation afterwards does not touch what was read.
  REQUIRE(selfprof_test::write_file(path, original));
  mapped_file file;
  REQUIRE(file.open(path));
  elf_image image;
  REQUIRE(image.parse(file, path));
  symbol_table table;
  fill(image, table);
  REQUIRE(file.check());
  const auto* strtab = image.section_at(image.find_section_type(SHT_SYMTAB)->link);
  REQUIRE(strtab != nullptr);
  auto strings = image.section_bytes(*strtab);
  REQUIRE(strings.size > 0);
  REQUIRE(symbols_test::truncate_in_place(path, 0));
  CHECK(name_at(table, sized) == "selfprof_fixture_sized");
  CHECK(std::memcmp(strings.data, original.data() + strtab->offset, strings.size) == 0);
}

TEST_CASE("mapped_file: a module file changed in place while the registry reads it: no symbols, a warning") {
  selfprof_test::temp_dir dir;
  selfprof_test::fixture_variants v;
  REQUIRE(selfprof_test::make_fixture_variants(dir, v));
  const std::string module_path = dir / "mod/libfx.so";
  REQUIRE(selfprof_test::run_command("mkdir -p '" + dir / "mod" + "'") == 0);
  const std::string original = selfprof_test::read_file(v.buildid_lib);  // stripped: debug file by build-id
  auto nm = selfprof_test::nm_symbols(selfprof_test::fixture_library());
  const std::uint64_t sized = nm["selfprof_fixture_sized"].address;
  REQUIRE(sized != 0);
  selfprof::detail::module_registry_options options;
  options.debug_roots = {v.buildid_root};
  options.maps_path = dir / "maps";

  for (const change& c : changes()) {
    INFO(c.what);
    REQUIRE(selfprof_test::write_file(module_path, original));
    REQUIRE(symbols_test::write_maps_for(options.maps_path, module_path));
    std::vector<std::string> warnings;
    {
      // The module is open and half read when its debug file is opened: change it then.
      bool changed = false;
      open_hook hook([&](const char* opened) {
        if (!changed && contains(opened, "/.build-id/")) changed = c.apply(module_path, original);
      });
      module_registry registry(options);
      registry.rescan();
      registry.load_all();
      CHECK(changed);
      REQUIRE(registry.modules().size() == 1);
      const auto& m = registry.modules()[0];
      REQUIRE(m.symbols);
      CHECK(m.symbols->table.size() == 0);
      warnings = registry.take_warnings();
    }
    bool named = false;
    for (const auto& w : warnings) named |= contains(w, module_path + ": changed while being read");
    CHECK(named);
  }

  // Unchanged again (same inode): a new registry reads it whole, with its debug file's symbols.
  REQUIRE(symbols_test::rewrite_in_place(module_path, original));
  module_registry registry(options);
  registry.rescan();
  registry.load_all();
  CHECK(registry.take_warnings().empty());
  REQUIRE(registry.modules().size() == 1);
  REQUIRE(registry.modules()[0].symbols);
  CHECK(name_at(registry.modules()[0].symbols->table, sized) == "selfprof_fixture_sized");
  // Truncated afterwards: the symbols are copies and stay.
  REQUIRE(symbols_test::truncate_in_place(module_path, 0));
  CHECK(name_at(registry.modules()[0].symbols->table, sized) == "selfprof_fixture_sized");
}

TEST_CASE("mapped_file: a debug file changed in place after it was found yields no symbols from it") {
  selfprof_test::temp_dir dir;
  selfprof_test::fixture_variants v;
  REQUIRE(selfprof_test::make_fixture_variants(dir, v));
  const std::string root = dir / "root";
  REQUIRE(selfprof_test::run_command("cp -r '" + v.buildid_root + "' '" + root + "'") == 0);
  const std::string module_bytes = selfprof_test::read_file(v.buildid_lib);
  elf_image module;
  REQUIRE(
      module.parse(selfprof::detail::byte_view{reinterpret_cast<const unsigned char*>(module_bytes.data()),
                                               module_bytes.size()},
                   v.buildid_lib));
  std::string debug_original;
  for (const change& c : changes()) {
    INFO(c.what);
    selfprof::detail::debug_file debug;
    REQUIRE(selfprof::detail::find_debug_file({root}, v.buildid_lib, module, debug));
    if (debug_original.empty()) debug_original = selfprof_test::read_file(debug.path);
    REQUIRE(c.apply(debug.path, debug_original));
    const auto* symtab = debug.image.find_section_type(SHT_SYMTAB);
    REQUIRE(symtab != nullptr);
    symbol_table table;
    table.add_symbols(debug.image, *symtab);
    auto status = debug.file.check();
    CHECK_FALSE(status);
    CHECK(contains(status.message(), debug.path + ": changed while being read"));
    REQUIRE(symbols_test::rewrite_in_place(debug.path, debug_original));
  }
}

TEST_CASE("mapped_file: files changed over and over while registries read them: symbols right or none") {
  std::string lib = selfprof_test::fixture_library();
  REQUIRE(!lib.empty());
  selfprof_test::temp_dir dir;
  const std::string path = dir / "lib.so";
  const std::string original = selfprof_test::read_file(lib);
  REQUIRE(copy_file(lib, path));
  const std::uint64_t sized = selfprof_test::nm_symbols(lib)["selfprof_fixture_sized"].address;
  selfprof::detail::module_registry_options options;
  options.debug_roots = {};
  options.maps_path = dir / "maps";
  REQUIRE(symbols_test::write_maps_for(options.maps_path, path));
  std::atomic<bool> stop{false};
  std::thread writer([&] {
    for (std::size_t i = 0; !stop.load(); ++i) {
      symbols_test::truncate_in_place(path, i % 2 == 0 ? 0 : original.size() / 2);
      symbols_test::rewrite_in_place(path, original);
      std::this_thread::sleep_for(std::chrono::microseconds(200));  // whole for a moment
    }
  });
  int named = 0, refused = 0;
  for (int i = 0; i < 300; ++i) {
    module_registry registry(options);
    registry.rescan();
    registry.load_all();
    REQUIRE(registry.modules().size() == 1);
    const auto& table = registry.modules()[0].symbols->table;
    if (table.size() != 0) {
      CHECK(name_at(table, sized) == "selfprof_fixture_sized");
      ++named;
    } else {
      auto warnings = registry.take_warnings();
      REQUIRE(warnings.size() == 1);
      CHECK(contains(warnings[0], path));
      ++refused;
    }
  }
  stop = true;
  writer.join();
  MESSAGE("read whole: " << named << ", refused: " << refused);
}

#if SELFPROF_HAS_LIBDW

// A registry over `maps` and a dwarf_lines over its only module, and the source chains of `vaddrs` as
// "function file:line" text (empty for none).
struct dwarf_reader {
  module_registry registry;
  selfprof::detail::dwarf_lines lines;
  dwarf_reader(const std::string& maps, std::vector<std::string> roots)
      : registry(selfprof::detail::module_registry_options{roots, maps, nullptr}), lines(roots) {
    registry.rescan();
    registry.load_all();
  }
  std::string chain(std::uint64_t vaddr) {
    REQUIRE(registry.modules().size() == 1);
    const auto* c = lines.lookup(registry.modules()[0], vaddr);
    std::string out;
    if (c != nullptr)
      for (const auto& f : *c) out += f.function + " " + f.file + ":" + std::to_string(f.line) + "; ";
    return out;
  }
};

TEST_CASE("mapped_file: libdw's files truncated in place after their DWARF was opened, never SIGBUS") {
  selfprof_test::temp_dir dir;
  selfprof_test::fixture_variants v;
  REQUIRE(selfprof_test::make_fixture_variants(dir, v));
  auto nm = selfprof_test::nm_symbols(selfprof_test::fixture_library());
  std::vector<std::uint64_t> vaddrs;
  for (const auto& entry : nm)
    if (entry.first.rfind("selfprof_fixture", 0) == 0 && entry.second.size != 0)
      vaddrs.push_back(entry.second.address);
  REQUIRE(vaddrs.size() > 3);
  // DWARF in the module file itself, then in a debug file found by build-id.
  const std::string module_path = dir / "libdwarf.so", stripped = dir / "libstripped.so", root = dir / "root";
  REQUIRE(copy_file(selfprof_test::fixture_library(), module_path));
  REQUIRE(copy_file(v.buildid_lib, stripped));
  REQUIRE(selfprof_test::run_command("cp -r '" + v.buildid_root + "' '" + root + "'") == 0);
  std::string id = selfprof_test::readelf_build_id(module_path);
  const std::string debug_path = root + "/.build-id/" + id.substr(0, 2) + "/" + id.substr(2) + ".debug";

  for (const auto& [mapped, changed] :
       {std::make_pair(module_path, module_path), std::make_pair(stripped, debug_path)}) {
    INFO(mapped);
    REQUIRE(symbols_test::write_maps_for(dir / "maps", mapped));
    std::vector<std::string> expected;
    {
      dwarf_reader reference(dir / "maps", {root});
      for (std::uint64_t a : vaddrs) expected.push_back(reference.chain(a));
    }
    CHECK(!expected[0].empty());
    dwarf_reader reader(dir / "maps", {root});
    CHECK(reader.chain(vaddrs[0]) == expected[0]);  // the DWARF is open now
    const std::string bytes = selfprof_test::read_file(changed);
    REQUIRE(symbols_test::truncate_in_place(changed, 0));
    for (std::size_t i = 0; i < vaddrs.size(); ++i) {
      INFO(symbols_test::hex(vaddrs[i]));
      CHECK(reader.chain(vaddrs[i]) == expected[i]);  // read before the truncation
    }
    // Truncated before a session opens: no DWARF, no crash.
    dwarf_reader late(dir / "maps", {root});
    for (std::uint64_t a : vaddrs) (void)late.chain(a);
    REQUIRE(symbols_test::rewrite_in_place(changed, bytes));
  }
}

#endif  // SELFPROF_HAS_LIBDW

}  // namespace mapped_file_test
