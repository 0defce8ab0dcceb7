// Tests of file:line and inline frames (symbols/dwarf_lines.hpp through selfprof::symbolizer): fixture
// libraries with always_inline C and C++ functions built -O2 -g, every address of their functions checked
// against `addr2line -a -f -C -i`; a plain function's file:line; debug files found by build-id; modules
// without debug info named from symbols only; per-file and per-address caching. Compiled with and without
// SELFPROF_HAS_LIBDW; without it the same addresses must give the one symbol-table frame of before.
#include <doctest/doctest.h>

#include <algorithm>
#include <climits>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <sstream>
#include <string>
#include <vector>

#include "fixtures/symbols_fixture.hpp"
#include "selfprof/symbols/symbolizer.hpp"
#include "test_support.hpp"

namespace {

using selfprof_test::run_command;

struct built_fixtures {
  selfprof_test::temp_dir dir;
  std::string c_lib;    // tests/fixtures/inline_fixture.c as a shared library, -O2 -g
  std::string cpp_lib;  // tests/fixtures/inline_fixture_cpp.cpp likewise
};

// The fixture libraries, compiled once per test run (empty paths when no compiler is available).
const built_fixtures& fixtures() {
  static built_fixtures b;
  static bool built = [] {
    const std::string src = selfprof_test::fixture_source_dir();
    const std::string flags =
        " -shared -fPIC -O2 -g -fvisibility=hidden -fno-omit-frame-pointer -Wl,--build-id=sha1 ";
    std::string c = b.dir / "libselfprof_inline.so";
    std::string cpp = b.dir / "libselfprof_inline_cpp.so";
    if (run_command("cc" + flags + "'" + src + "/inline_fixture.c' -o '" + c + "' 2>&1") == 0) b.c_lib = c;
    if (run_command("c++" + flags + "'" + src + "/inline_fixture_cpp.cpp' -o '" + cpp + "' 2>&1") == 0)
      b.cpp_lib = cpp;
    return true;
  }();
  (void)built;
  return b;
}

std::uint64_t address_of(void* p) { return reinterpret_cast<std::uint64_t>(p); }

// Size of `name` in `module` per nm (an independent reader), 0 when unknown.
std::uint64_t symbol_size(const std::string& module, const std::string& name) {
  auto symbols = selfprof_test::nm_symbols(module);
  auto it = symbols.find(name);
  return it == symbols.end() ? 0 : it->second.size;
}

bool have_binutils() {
  return selfprof_test::have_tool("addr2line") && selfprof_test::have_tool("nm") &&
         selfprof_test::have_tool("objcopy") && selfprof_test::have_tool("strip");
}

#if SELFPROF_HAS_LIBDW

// One level as addr2line prints it, innermost first.
struct a2l_frame {
  std::string function;
  std::string file;  // empty for "??"
  std::uint32_t line = 0;
};

// `addr2line -a -f -C -i -e module offsets...`: for each offset its frames, innermost first.
std::vector<std::vector<a2l_frame>> addr2line_inline(const std::string& module,
                                                     const std::vector<std::uint64_t>& offsets) {
  std::string cmd = "addr2line -a -f -C -i -e '" + module + "'";
  for (auto o : offsets) cmd += " " + symbols_test::hex(o);
  std::string text;
  std::vector<std::vector<a2l_frame>> out;
  if (run_command(cmd + " 2>/dev/null", &text) != 0) return out;
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    if (line.compare(0, 2, "0x") == 0) {
      out.emplace_back();
      continue;
    }
    if (out.empty()) return {};
    a2l_frame f;
    f.function = line;
    std::string where;
    if (!std::getline(in, where)) return {};
    auto disc = where.find(" (discriminator");
    if (disc != std::string::npos) where.erase(disc);
    auto colon = where.rfind(':');
    std::string file = colon == std::string::npos ? where : where.substr(0, colon);
    std::string number = colon == std::string::npos ? std::string() : where.substr(colon + 1);
    f.file = file == "??" ? std::string() : file;
    f.line = !number.empty() && number[0] >= '0' && number[0] <= '9'
                 ? static_cast<std::uint32_t>(std::stoul(number))
                 : 0;
    out.back().push_back(f);
  }
  return out;
}

std::string describe(const std::vector<selfprof::frame>& frames) {
  std::string s;
  for (const auto& f : frames)
    s += (s.empty() ? "" : " ; ") + f.name + (f.kind == selfprof::frame_kind::inlined ? "_[i]" : "") + " @ " +
         f.file + ":" + std::to_string(f.line);
  return s;
}

std::string describe(const std::vector<a2l_frame>& frames) {
  std::string s;
  for (auto it = frames.rbegin(); it != frames.rend(); ++it)
    s += (s.empty() ? "" : " ; ") + it->function + " @ " + it->file + ":" + std::to_string(it->line);
  return s;
}

// Resolves every address of function `name` in the loaded `module` and compares each with addr2line
// -i on the same file offsets; returns the deepest chain seen (0 when the comparison could not run).
std::size_t check_function_against_addr2line(selfprof::symbolizer& sym, const std::string& module,
                                             const selfprof_test::library& lib, const std::string& name) {
  void* entry = lib.symbol(name.c_str());
  std::uint64_t size = symbol_size(module, name);
  REQUIRE(entry != nullptr);
  REQUIRE(size > 0);
  std::vector<std::vector<selfprof::frame>> ours;
  std::vector<std::uint64_t> offsets;
  for (std::uint64_t a = address_of(entry); a < address_of(entry) + size; ++a) {
    std::vector<selfprof::frame> frames;
    sym.resolve(a, frames);
    REQUIRE(!frames.empty());
    offsets.push_back(frames.front().module_offset);
    ours.push_back(std::move(frames));
  }
  auto theirs = addr2line_inline(module, offsets);
  REQUIRE(theirs.size() == ours.size());
  std::size_t deepest = 0;
  for (std::size_t i = 0; i < ours.size(); ++i) {
    const auto& mine = ours[i];
    const auto& ref = theirs[i];
    INFO("address ", symbols_test::hex(offsets[i]), " ours: ", describe(mine),
         "   addr2line: ", describe(ref));
    REQUIRE(mine.size() == ref.size());
    for (std::size_t k = 0; k < mine.size(); ++k) {
      const a2l_frame& r = ref[ref.size() - 1 - k];  // addr2line lists innermost first
      CHECK(mine[k].name == r.function);
      CHECK(mine[k].file == r.file);
      CHECK(mine[k].line == r.line);
      CHECK(mine[k].kind == (k == 0 ? selfprof::frame_kind::native : selfprof::frame_kind::inlined));
      CHECK(mine[k].module_offset == offsets[i]);
    }
    deepest = std::max(deepest, mine.size());
  }
  return deepest;
}

// True when both paths name one existing file (the fixture may be compiled from a relative path).
bool same_file(const std::string& a, const std::string& b) {
  char ra[PATH_MAX], rb[PATH_MAX];
  return !a.empty() && a[0] == '/' && ::realpath(a.c_str(), ra) != nullptr &&
         ::realpath(b.c_str(), rb) != nullptr && std::string(ra) == rb;
}

#endif  // SELFPROF_HAS_LIBDW

}  // namespace

TEST_CASE("symbols libdw: modules without debug info are named from symbols only, one frame, no file:line") {
  const auto& fx = fixtures();
  if (fx.c_lib.empty() || !have_binutils()) {
    MESSAGE("skipped: no C compiler or binutils to build the fixture");
    return;
  }
  selfprof_test::temp_dir dir;
  selfprof_test::temp_dir empty_root;
  const std::string no_dwarf = dir / "libnodwarf.so";    // strip -g: .symtab kept, DWARF gone
  const std::string no_symtab = dir / "libnosymtab.so";  // strip -s: .dynsym only
  REQUIRE(run_command("cp '" + fx.c_lib + "' '" + no_dwarf + "' && strip -g '" + no_dwarf + "' && cp '" +
                      fx.c_lib + "' '" + no_symtab + "' && strip -s '" + no_symtab + "'") == 0);
  for (const std::string& path : {no_dwarf, no_symtab}) {
    INFO(path);
    selfprof_test::library lib(path);
    REQUIRE(lib);
    void* outer = lib.symbol("inline_fixture_outer");
    REQUIRE(outer != nullptr);
    selfprof::symbolizer sym(symbols_test::options_with_roots({empty_root.path()}));
    std::uint64_t size = symbol_size(fx.c_lib, "inline_fixture_outer");
    REQUIRE(size > 0);
    for (std::uint64_t a = address_of(outer); a < address_of(outer) + size; ++a) {
      std::vector<selfprof::frame> frames;
      sym.resolve(a, frames);
      REQUIRE(frames.size() == 1);
      CHECK(frames[0].name == "inline_fixture_outer");
      CHECK(frames[0].file.empty());
      CHECK(frames[0].line == 0);
      CHECK(frames[0].kind == selfprof::frame_kind::native);
    }
    CHECK(sym.source_lines().files_with_dwarf() == 0);
  }
}

#if SELFPROF_HAS_LIBDW

TEST_CASE("symbols libdw: inline chains and file:line of every address agree with addr2line -f -C -i (C)") {
  const auto& fx = fixtures();
  if (fx.c_lib.empty() || !have_binutils()) {
    MESSAGE("skipped: no C compiler or binutils to build the fixture");
    return;
  }
  selfprof_test::library lib(fx.c_lib);
  REQUIRE(lib);
  selfprof::symbolizer sym(symbols_test::options_with_roots({}));
  // inline_fixture_outer -> inline_fixture_middle -> inline_fixture_leaf: three levels somewhere inside.
  CHECK(check_function_against_addr2line(sym, fx.c_lib, lib, "inline_fixture_outer") == 3);

  // The shape spelled out for one address in the leaf loop: the real function first, with the call
  // site of the middle function; the middle one with its call of the leaf; the leaf with its own line.
  std::vector<selfprof::frame> frames;
  std::uint64_t base = address_of(lib.symbol("inline_fixture_outer"));
  std::uint64_t size = symbol_size(fx.c_lib, "inline_fixture_outer");
  for (std::uint64_t a = base; a < base + size && frames.size() != 3; ++a) {
    frames.clear();
    sym.resolve(a, frames);
  }
  REQUIRE(frames.size() == 3);
  CHECK(frames[0].name == "inline_fixture_outer");
  CHECK(frames[0].line == 23);  // `int r = inline_fixture_middle(x);`
  CHECK(frames[1].name == "inline_fixture_middle");
  CHECK(frames[1].kind == selfprof::frame_kind::inlined);
  CHECK((frames[1].line == 17 || frames[1].line == 19));  // either call of inline_fixture_leaf
  CHECK(frames[2].name == "inline_fixture_leaf");
  CHECK(frames[2].kind == selfprof::frame_kind::inlined);
  CHECK(frames[2].line >= 7);
  CHECK(frames[2].line <= 14);
  // resolve_one gives the real function, with the call site of the inline chain it drops.
  selfprof::frame one = sym.resolve_one(frames[0].address);
  CHECK(one.name == "inline_fixture_outer");
  CHECK(one.line == 23);
  CHECK(one.kind == selfprof::frame_kind::native);
  for (const auto& f : frames) {
    CHECK(same_file(f.file, selfprof_test::fixture_source_dir() + "/inline_fixture.c"));
    CHECK(f.module == fx.c_lib);
    CHECK(f.address == frames[0].address);
  }
}

TEST_CASE("symbols libdw: inline frames of C++ code carry demangled names as addr2line -C prints them") {
  const auto& fx = fixtures();
  if (fx.cpp_lib.empty() || !have_binutils()) {
    MESSAGE("skipped: no C++ compiler or binutils to build the fixture");
    return;
  }
  selfprof_test::library lib(fx.cpp_lib);
  REQUIRE(lib);
  selfprof::symbolizer sym(symbols_test::options_with_roots({}));
  CHECK(check_function_against_addr2line(sym, fx.cpp_lib, lib, "inline_fixture_cpp_outer") == 3);
  std::vector<selfprof::frame> frames;
  sym.resolve(address_of(lib.symbol("inline_fixture_cpp_outer")), frames);
  REQUIRE(frames.size() == 3);
  CHECK(frames[1].name == "int inline_fixture_ns::twice<int>(int)");
  CHECK(frames[2].name == "inline_fixture_ns::counter::add(int)");
}

TEST_CASE("symbols libdw: a function without inlined code gets its own file:line") {
  const auto& fx = fixtures();
  if (fx.c_lib.empty() || !have_binutils()) {
    MESSAGE("skipped: no C compiler or binutils to build the fixture");
    return;
  }
  selfprof_test::library lib(fx.c_lib);
  REQUIRE(lib);
  selfprof::symbolizer sym(symbols_test::options_with_roots({}));
  CHECK(check_function_against_addr2line(sym, fx.c_lib, lib, "inline_fixture_plain") == 1);
  std::vector<selfprof::frame> frames;
  sym.resolve(address_of(lib.symbol("inline_fixture_plain")), frames);
  REQUIRE(frames.size() == 1);
  CHECK(frames[0].name == "inline_fixture_plain");
  CHECK(same_file(frames[0].file, selfprof_test::fixture_source_dir() + "/inline_fixture.c"));
  CHECK(frames[0].line == 29);  // its first statement, where its first instruction comes from
  CHECK(frames[0].kind == selfprof::frame_kind::native);
}

// The frames of every address of inline_fixture_outer in the loaded `lib`: with `lines`, the chains
// addr2line -i gives on the unstripped, uncompressed fixture `reference` (returns the deepest, 3);
// without, the one symbol-table frame and no file:line (returns 1).
static std::size_t check_outer(selfprof::symbolizer& sym, const selfprof_test::library& lib,
                               const std::string& reference, bool lines) {
  std::vector<std::uint64_t> offsets;
  std::vector<std::vector<selfprof::frame>> ours;
  std::uint64_t base = address_of(lib.symbol("inline_fixture_outer"));
  std::uint64_t size = symbol_size(reference, "inline_fixture_outer");
  REQUIRE(size > 0);
  std::size_t deepest = 0;
  for (std::uint64_t a = base; a < base + size; ++a) {
    std::vector<selfprof::frame> frames;
    sym.resolve(a, frames);
    REQUIRE(!frames.empty());
    offsets.push_back(frames[0].module_offset);
    deepest = std::max(deepest, frames.size());
    if (!lines) {
      CHECK(frames.size() == 1);
      CHECK(frames[0].name == "inline_fixture_outer");
      CHECK(frames[0].file.empty());
      CHECK(frames[0].line == 0);
    }
    ours.push_back(frames);
  }
  if (!lines) return deepest;
  auto theirs = addr2line_inline(reference, offsets);
  REQUIRE(theirs.size() == ours.size());
  for (std::size_t i = 0; i < ours.size(); ++i) {
    INFO("address ", symbols_test::hex(offsets[i]), " ours: ", describe(ours[i]),
         "   addr2line: ", describe(theirs[i]));
    REQUIRE(ours[i].size() == theirs[i].size());
    for (std::size_t k = 0; k < ours[i].size(); ++k) {
      const a2l_frame& r = theirs[i][theirs[i].size() - 1 - k];
      CHECK(ours[i][k].name == r.function);
      CHECK(ours[i][k].file == r.file);
      CHECK(ours[i][k].line == r.line);
    }
  }
  return deepest;
}

// Where a debugger looks under `root` for `lib`'s separate debug file by its build-id
// (.build-id/<first two hex digits>/<the rest>.debug); the directory is created.
static std::string build_id_debug_path(const std::string& lib, const std::string& root) {
  const std::string id = selfprof_test::readelf_build_id(lib);
  REQUIRE(id.size() > 2);
  const std::string dir = root + "/.build-id/" + id.substr(0, 2);
  REQUIRE(run_command("mkdir -p '" + dir + "'") == 0);
  return dir + "/" + id.substr(2) + ".debug";
}

TEST_CASE("symbols libdw: DWARF in a separate debug file found by build-id (stripped, and strip -g)") {
  const auto& fx = fixtures();
  if (fx.c_lib.empty() || !have_binutils()) {
    MESSAGE("skipped: no C compiler or binutils to build the fixture");
    return;
  }
  selfprof_test::temp_dir dir;
  const std::string root = dir / "root";
  const std::string debug = build_id_debug_path(fx.c_lib, root);
  const std::string stripped =
      dir / "libstripped.so";                          // no .symtab: the module registry finds the debug file
  const std::string no_dwarf = dir / "libnodwarf.so";  // .symtab kept: dwarf_lines finds the debug file
  REQUIRE(run_command("objcopy --only-keep-debug '" + fx.c_lib + "' '" + debug + "' && cp '" + fx.c_lib +
                      "' '" + stripped + "' && strip -s '" + stripped + "' && cp '" + fx.c_lib + "' '" +
                      no_dwarf + "' && strip -g '" + no_dwarf + "'") == 0);
  for (const std::string& path : {stripped, no_dwarf}) {
    INFO(path);
    selfprof_test::library lib(path);
    REQUIRE(lib);
    selfprof::symbolizer sym(symbols_test::options_with_roots({root}));
    // addr2line reads the unstripped original: the same offsets must give the same chains.
    CHECK(check_outer(sym, lib, fx.c_lib, true) == 3);
    CHECK(sym.source_lines().files_with_dwarf() == 1);
  }
}

TEST_CASE("symbols libdw: each module file is opened once and each address is looked up once") {
  const auto& fx = fixtures();
  if (fx.c_lib.empty() || fx.cpp_lib.empty()) {
    MESSAGE("skipped: no compiler to build the fixtures");
    return;
  }
  selfprof_test::library c(fx.c_lib);
  selfprof_test::library cpp(fx.cpp_lib);
  REQUIRE(c);
  REQUIRE(cpp);
  selfprof::symbolizer sym(symbols_test::options_with_roots({}));
  std::uint64_t outer = address_of(c.symbol("inline_fixture_outer"));
  std::uint64_t plain = address_of(c.symbol("inline_fixture_plain"));
  std::uint64_t cpp_outer = address_of(cpp.symbol("inline_fixture_cpp_outer"));
  std::vector<selfprof::frame> first, again;
  for (std::uint64_t a : {outer, outer + 4, plain, cpp_outer}) sym.resolve(a, first);
  CHECK(sym.source_lines().files_opened() == 2);
  CHECK(sym.source_lines().files_with_dwarf() == 2);
  CHECK(sym.source_lines().queries() == 4);
  for (std::uint64_t a : {outer, outer + 4, plain, cpp_outer}) sym.resolve(a, again);
  CHECK(sym.source_lines().files_opened() == 2);
  CHECK(sym.source_lines().queries() == 4);  // answered from the cache
  REQUIRE(first.size() == again.size());
  for (std::size_t i = 0; i < first.size(); ++i) {
    CHECK(first[i].name == again[i].name);
    CHECK(first[i].file == again[i].file);
    CHECK(first[i].line == again[i].line);
    CHECK(first[i].kind == again[i].kind);
  }
}

TEST_CASE("symbols libdw: compressed DWARF skipped by default with one note, read with lines all") {
  const auto& fx = fixtures();
  if (fx.c_lib.empty() || !have_binutils()) {
    MESSAGE("skipped: no C compiler or binutils to build the fixture");
    return;
  }
  selfprof_test::temp_dir dir;
  const std::string root = dir / "root";
  const std::string debug = build_id_debug_path(fx.c_lib, root);
  const std::string in_place = dir / "libzdwarf.so";     // its own DWARF, compressed (gcc -gz, objcopy)
  const std::string stripped = dir / "libzstripped.so";  // as distributions ship: stripped + a .debug
  REQUIRE(run_command("objcopy --only-keep-debug --compress-debug-sections=zlib '" + fx.c_lib + "' '" +
                      debug + "' && objcopy --compress-debug-sections=zlib '" + fx.c_lib + "' '" + in_place +
                      "' && cp '" + fx.c_lib + "' '" + stripped + "' && strip -s '" + stripped + "'") == 0);
  for (const std::string& path : {in_place, stripped}) {
    INFO(path);
    selfprof_test::library lib(path);
    REQUIRE(lib);
    const std::string base = path.substr(path.rfind('/') + 1);
    {  // auto: named from symbols, one note naming the module and the way to read it
      selfprof::symbolizer sym(symbols_test::options_with_roots({root}));
      CHECK(check_outer(sym, lib, fx.c_lib, false) == 1);
      CHECK(sym.source_lines().files_skipped() == 1);
      CHECK(sym.source_lines().files_with_dwarf() == 0);
      auto notes = sym.take_warnings();
      REQUIRE(notes.size() == 1);
      CHECK(notes[0].find(base) != std::string::npos);
      CHECK(notes[0].find("SELFPROF_LINES=all") != std::string::npos);
      CHECK(sym.take_warnings().empty());  // nothing looked up since
      // The next profile that reaches the module says it again (each profile carries its own notes).
      CHECK(check_outer(sym, lib, fx.c_lib, false) == 1);
      auto again = sym.take_warnings();
      REQUIRE(again.size() == 1);
      CHECK(again[0] == notes[0]);
      CHECK(sym.source_lines().files_skipped() == 1);  // not opened again
    }
    {  // all: the same chains as the uncompressed fixture's
      selfprof::symbolizer_options o = symbols_test::options_with_roots({root});
      o.lines = selfprof::lines_mode::all;
      selfprof::symbolizer sym(o);
      CHECK(check_outer(sym, lib, fx.c_lib, true) == 3);
      CHECK(sym.source_lines().files_skipped() == 0);
      CHECK(sym.source_lines().files_with_dwarf() == 1);
      CHECK(sym.take_warnings().empty());
    }
  }
  {  // none: not even uncompressed DWARF is read; set_lines changes a symbolizer before its first lookup
    selfprof_test::library lib(fx.c_lib);
    REQUIRE(lib);
    selfprof::symbolizer sym(symbols_test::options_with_roots({}));
    sym.set_lines(selfprof::lines_mode::none);
    CHECK(check_outer(sym, lib, fx.c_lib, false) == 1);
    CHECK(sym.source_lines().files_opened() == 0);
    CHECK(sym.take_warnings().empty());
  }
}

#else  // !SELFPROF_HAS_LIBDW

TEST_CASE("symbols libdw: without libdw, addresses inside inlined code give the one symbol-table frame") {
  const auto& fx = fixtures();
  if (fx.c_lib.empty() || !have_binutils()) {
    MESSAGE("skipped: no C compiler or binutils to build the fixture");
    return;
  }
  selfprof_test::library lib(fx.c_lib);
  REQUIRE(lib);
  selfprof::symbolizer sym(symbols_test::options_with_roots({}));
  std::uint64_t base = address_of(lib.symbol("inline_fixture_outer"));
  std::uint64_t size = symbol_size(fx.c_lib, "inline_fixture_outer");
  REQUIRE(size > 0);
  for (std::uint64_t a = base; a < base + size; ++a) {
    std::vector<selfprof::frame> frames;
    sym.resolve(a, frames);
    REQUIRE(frames.size() == 1);
    CHECK(frames[0].name == "inline_fixture_outer");
    CHECK(frames[0].file.empty());
    CHECK(frames[0].line == 0);
    CHECK(frames[0].kind == selfprof::frame_kind::native);
  }
  CHECK(sym.resolve_one(base + size / 2).name == "inline_fixture_outer");
  CHECK_FALSE(selfprof::detail::dwarf_lines::enabled);
  CHECK(sym.source_lines().queries() == 0);
}

#endif  // SELFPROF_HAS_LIBDW
