// Tests of selfprof::symbolizer end to end: names in this binary, libc and a fixture library (checked
// against addr2line), PIE bias, [module+0xoffset] fallbacks, dlclose'd libraries, debug files, perf maps
// for JIT code, malformed modules, demangling, and 10,000 lookups over 50 modules.
#include <doctest/doctest.h>

#include <dlfcn.h>
#include <link.h>
#include <sys/mman.h>
#include <unistd.h>

#include <chrono>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "fixtures/symbols_fixture.hpp"
#include "selfprof/symbols/demangle.hpp"
#include "selfprof/symbols/symbolizer.hpp"
#include "test_support.hpp"

namespace selfprof_symbolizer_test_ns {
struct widget {
  __attribute__((noinline)) int spin(int x) const;
};
__attribute__((noinline)) int widget::spin(int x) const {
  __asm__ volatile("" ::: "memory");
  return x * 5 + 2;
}
}  // namespace selfprof_symbolizer_test_ns

namespace {

__attribute__((noinline)) int selfprof_static_helper(int x) {
  __asm__ volatile("" ::: "memory");
  return x ^ 0x55;
}

std::uint64_t addr(void* p) { return reinterpret_cast<std::uint64_t>(p); }
template <class F>
std::uint64_t fn_addr(F* f) {
  return reinterpret_cast<std::uint64_t>(reinterpret_cast<void*>(f));
}

// Calls the fixture's selfprof_fixture_static_addr() and returns the static function's address.
std::uint64_t static_fn_address(void* getter) {
  using fixture_fn = int (*)(int);
  auto get = reinterpret_cast<fixture_fn (*)()>(getter);
  return get == nullptr ? 0 : fn_addr(get());
}

std::uint64_t main_program_bias() {
  std::uint64_t bias = 0;
  ::dl_iterate_phdr(
      [](struct dl_phdr_info* info, std::size_t, void* data) -> int {
        *static_cast<std::uint64_t*>(data) = info->dlpi_addr;
        return 1;  // the first entry is the main program
      },
      &bias);
  return bias;
}

}  // namespace

TEST_CASE("symbolizer: functions of this binary, demangled, with PIE bias, agreeing with addr2line") {
  selfprof::symbolizer sym;
  sym.refresh();
  selfprof_symbolizer_test_ns::widget w;
  CHECK(w.spin(1) == 7);
  CHECK(selfprof_static_helper(0) == 0x55);
  // The member function's address, from its mangled symbol in the executable (nm reads it independently).
  std::string exe = symbols_test::real_path("/proc/self/exe");
  const std::string mangled = "_ZNK27selfprof_symbolizer_test_ns6widget4spinEi";
  auto nm = selfprof_test::nm_symbols(exe);
  REQUIRE(nm.count(mangled) == 1);
  std::uint64_t bias = main_program_bias();
  std::uint64_t spin_addr = bias + nm[mangled].address;
  std::uint64_t helper_addr = fn_addr(&selfprof_static_helper);

  selfprof::frame f = sym.resolve_one(spin_addr + 1);
  CHECK(f.name == "selfprof_symbolizer_test_ns::widget::spin(int) const");
  CHECK(f.module == exe);
  CHECK(f.kind == selfprof::frame_kind::native);
  CHECK(f.address == spin_addr + 1);
  CHECK(f.module_offset == spin_addr + 1 - bias);  // PIE: offset is the ELF virtual address
  CHECK(f.name == selfprof_test::addr2line_function(exe, f.module_offset));

  f = sym.resolve_one(helper_addr);
  CHECK(f.name == "(anonymous namespace)::selfprof_static_helper(int)");
  CHECK(f.name == selfprof_test::addr2line_function(exe, f.module_offset));
}

TEST_CASE("symbolizer: libc functions named through dlsym'd addresses") {
  selfprof::symbolizer sym;
  void* malloc_addr = ::dlsym(RTLD_DEFAULT, "malloc");
  void* memcpy_addr = ::dlsym(RTLD_DEFAULT, "memcpy");
  REQUIRE(malloc_addr != nullptr);
  REQUIRE(memcpy_addr != nullptr);
  selfprof::frame m = sym.resolve_one(addr(malloc_addr));
  // Under ASan malloc is the sanitizer's interceptor, in the runtime library instead of libc.
  CHECK(m.name.find("malloc") != std::string::npos);
  CHECK(m.name[0] != '[');
  selfprof::frame c = sym.resolve_one(addr(memcpy_addr) + 4);
  CHECK(!c.module.empty());
  // memcpy is an IFUNC: dlsym gives the selected implementation (__memmove_avx_unaligned_erms, ...),
  // a local symbol only the libc6-dbg debug file names; without it, the [libc.so.6+0x...] fallback.
  bool named = c.name.find("mem") != std::string::npos && c.name[0] != '[';
  bool fallback = c.name.rfind("[", 0) == 0 && c.name.find("+0x") != std::string::npos;
  CHECK((named || fallback));
  if (named && c.module.find("libc.so") != std::string::npos) {
    std::string a2l = selfprof_test::addr2line_function(c.module, c.module_offset);
    INFO(a2l);
    // addr2line names one of the aliases at that address; both share the implementation name's stem.
    CHECK(a2l.find("mem") != std::string::npos);
  }
}

TEST_CASE("symbolizer: [module+0xoffset] past a function's end, [unknown] outside every module") {
  std::string lib = selfprof_test::fixture_library();
  REQUIRE(!lib.empty());
  selfprof_test::library handle(lib);
  REQUIRE(handle);
  selfprof::symbolizer sym(symbols_test::options_with_roots({}));
  sym.refresh();
  std::uint64_t sized = addr(handle.symbol("selfprof_fixture_sized"));
  REQUIRE(sized != 0);
  selfprof::frame inside = sym.resolve_one(sized + 15);
  CHECK(inside.name == "selfprof_fixture_sized");
  selfprof::frame past = sym.resolve_one(sized + 16);
  std::string base = lib.substr(lib.rfind('/') + 1);
  CHECK(past.name == "[" + base + "+" + symbols_test::hex(past.module_offset) + "]");
  CHECK(past.module_offset == inside.module_offset + 1);
  CHECK(past.module == symbols_test::real_path(lib.c_str()));
  CHECK(selfprof_test::addr2line_function(past.module, inside.module_offset) == "selfprof_fixture_sized");

  selfprof::frame nowhere = sym.resolve_one(0x10);
  CHECK(nowhere.name == "[unknown]");
  CHECK(nowhere.module.empty());
  CHECK(nowhere.address == 0x10);
}

TEST_CASE("symbolizer: kernel-provided mappings: vdso functions named, [vsyscall+0x...] fallback") {
  selfprof::symbolizer sym(symbols_test::options_with_roots({}));
  sym.refresh();
  int checked = 0;
  for (const auto& m : sym.modules().modules()) {
    if (m.kind == selfprof::detail::module_kind::special) {
      CHECK(sym.resolve_one(m.start + 0x10).name == "[vsyscall+0x10]");
      ++checked;
    }
    if (m.kind == selfprof::detail::module_kind::vdso && m.symbols && m.symbols->table.size() > 0) {
      selfprof::detail::symbol_table::hit hit;
      std::uint64_t a = m.start;
      while (a < m.end && !m.symbols->table.lookup(a - m.bias, hit)) a += 4;
      REQUIRE(a < m.end);
      selfprof::frame f = sym.resolve_one(a);
      CHECK(f.module == "[vdso]");
      CHECK(f.name == std::string(m.symbols->table.raw_name(hit.index)));
#if defined(__x86_64__)
      CHECK(f.name.find("__vdso_") == 0);  // the global alias wins over the weak one (clock_gettime)
#endif
      ++checked;
    }
  }
  if (checked == 0) MESSAGE("neither vdso nor vsyscall mapped in this process");
}

TEST_CASE("symbolizer: a dlopen'ed library is named after dlclose and refresh") {
  std::string lib = selfprof_test::fixture_library();
  REQUIRE(!lib.empty());
  selfprof::symbolizer sym(symbols_test::options_with_roots({}));
  sym.refresh();
  auto handle = std::make_unique<selfprof_test::library>(lib);
  REQUIRE(*handle);
  std::uint64_t add = addr(handle->symbol("selfprof_fixture_add"));
  std::uint64_t stat = static_fn_address(handle->symbol("selfprof_fixture_static_addr"));
  sym.refresh();   // the collector's periodic snapshot sees the library
  handle.reset();  // dlclose: unmapped now
  sym.refresh();
  CHECK(sym.resolve_one(add + 2).name == "selfprof_fixture_add");
  CHECK(sym.resolve_one(stat).name == "fixture_static_fn");
}

TEST_CASE("symbolizer: stripped libraries named through build-id and debuglink debug files") {
  selfprof_test::temp_dir dir;
  selfprof_test::fixture_variants v;
  REQUIRE(selfprof_test::make_fixture_variants(dir, v));
  struct variant {
    std::string lib;
    std::vector<std::string> roots;
    bool expect_named;
  };
  std::vector<variant> variants = {{v.buildid_lib, {v.buildid_root}, true},
                                   {v.debuglink_lib, {dir / "none"}, true},
                                   {v.rootlink_lib, {v.rootlink_root}, true},
                                   {v.stripped, {dir / "none"}, false}};
  for (const auto& var : variants) {
    INFO(var.lib);
    selfprof_test::library handle(var.lib);
    REQUIRE(handle);
    std::uint64_t stat = static_fn_address(handle.symbol("selfprof_fixture_static_addr"));
    std::uint64_t add = addr(handle.symbol("selfprof_fixture_add"));
    selfprof::symbolizer sym(symbols_test::options_with_roots(var.roots));
    selfprof::frame f = sym.resolve_one(stat + 1);
    CHECK(sym.resolve_one(add).name == "selfprof_fixture_add");  // .dynsym names it either way
    if (var.expect_named) {
      CHECK(f.name == "fixture_static_fn");
    } else {
      CHECK(f.name.rfind("[libfx_stripped.so+0x", 0) == 0);  // not charged to a neighbour
    }
  }
}

TEST_CASE("symbolizer: JIT code in anonymous memory named by a perf map, re-read when it changes") {
  selfprof_test::temp_dir dir;
  REQUIRE(!dir.path().empty());
  void* code = ::mmap(nullptr, 8192, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  REQUIRE(code != MAP_FAILED);
  REQUIRE(::mprotect(code, 8192, PROT_READ | PROT_EXEC) == 0);
  std::uint64_t base = addr(code);
  std::string map_path = dir / "perf-424242.map";
  char line[128];
  std::snprintf(line, sizeof line, "%llx 40 jit::first_fn\n", static_cast<unsigned long long>(base));
  REQUIRE(selfprof_test::write_file(map_path, line));

  selfprof::symbolizer_options o;
  o.perf_map_path = map_path;
  selfprof::symbolizer sym(o);
  sym.refresh();
  selfprof::frame f = sym.resolve_one(base + 0x10);
  CHECK(f.name == "jit::first_fn");
  CHECK(f.kind == selfprof::frame_kind::jit);
  CHECK(f.module == map_path);
  CHECK(f.module_offset == 0x10);
  selfprof::frame unnamed = sym.resolve_one(base + 0x100);
  CHECK(unnamed.name == "[unknown]");
  CHECK(unnamed.module == "//anon");
  CHECK(unnamed.kind == selfprof::frame_kind::native);

  std::snprintf(line, sizeof line, "%llx 40 jit::first_fn\n%llx 80 jit::second_fn\n",
                static_cast<unsigned long long>(base), static_cast<unsigned long long>(base + 0x100));
  REQUIRE(selfprof_test::write_file(map_path, line));
  sym.refresh();
  CHECK(sym.resolve_one(base + 0x100).name == "jit::second_fn");
  ::munmap(code, 8192);
  // Unmapped JIT code still named by the map (the address is in no module any more).
  sym.refresh();
  CHECK(sym.resolve_one(base + 0x104).name == "jit::second_fn");
}

TEST_CASE("symbolizer: a malformed ELF module gives [module+0xoffset] frames and one warning") {
  selfprof_test::temp_dir dir;
  std::string path = dir / "garbage.bin";
  std::string junk(8192, '\0');
  for (std::size_t i = 0; i < junk.size(); ++i) junk[i] = static_cast<char>((i * 131) ^ 0x7f);
  junk.replace(0, 4,
               "\x7f"
               "ELF");  // looks like ELF, is not a valid one
  REQUIRE(selfprof_test::write_file(path, junk));
  selfprof::symbolizer sym(symbols_test::options_with_roots({}));
  sym.refresh();
  sym.take_warnings();
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  REQUIRE(fd >= 0);
  void* p = ::mmap(nullptr, junk.size(), PROT_READ | PROT_EXEC, MAP_PRIVATE, fd, 0);
  ::close(fd);
  REQUIRE(p != MAP_FAILED);
  selfprof::frame f = sym.resolve_one(addr(p) + 0x10);  // mapped without the loader: found on a miss
  CHECK(f.name == "[garbage.bin+0x10]");
  CHECK(f.module == path);
  auto warnings = sym.take_warnings();
  REQUIRE(warnings.size() == 1);
  CHECK(warnings[0].find(path) != std::string::npos);
  sym.resolve_one(addr(p) + 0x20);
  sym.refresh();
  CHECK(sym.take_warnings().empty());  // one warning per module, not per frame
  ::munmap(p, junk.size());
}

TEST_CASE("demangle: C++ names, PLT suffixes, and names left alone") {
  using selfprof::detail::demangle;
  CHECK(demangle("_ZN2ns5helloEi") == "ns::hello(int)");
  CHECK(demangle("_ZN2ns5helloEi@plt") == "ns::hello(int)@plt");
  CHECK(demangle("_Z3foov.cold") == "foo() [clone .cold]");
  CHECK(demangle("malloc") == "malloc");
  CHECK(demangle("_Z") == "_Z");
  CHECK(demangle("_Zgarbage!!") == "_Zgarbage!!");
  CHECK(demangle("") == "");
}

TEST_CASE("symbolizer: 10,000 unique addresses over 50 modules, each module parsed once") {
  std::string lib = selfprof_test::fixture_library();
  REQUIRE(!lib.empty());
  selfprof_test::temp_dir dir;
  std::string bytes = selfprof_test::read_file(lib);
  std::vector<std::unique_ptr<selfprof_test::library>> libs;
  for (int i = 0; i < 50; ++i) {
    std::string copy = dir / ("libfx_copy" + std::to_string(i) + ".so");
    REQUIRE(selfprof_test::write_file(copy, bytes));
    libs.push_back(std::make_unique<selfprof_test::library>(copy));
    REQUIRE(*libs.back());
  }
  auto t0 = std::chrono::steady_clock::now();
  selfprof::symbolizer sym(symbols_test::options_with_roots({}));
  sym.refresh();
  auto t1 = std::chrono::steady_clock::now();
  std::vector<std::uint64_t> addresses;
  for (const auto& l : libs) {
    std::uint64_t start = addr(l->symbol("selfprof_fixture_sized")) - 0x100;
    for (std::uint64_t k = 0; k < 200; ++k) addresses.push_back(start + k * 3);
  }
  REQUIRE(addresses.size() == 10000);
  std::vector<selfprof::frame> frames;
  frames.reserve(addresses.size());
  for (std::uint64_t a : addresses) sym.resolve(a, frames);
  auto t2 = std::chrono::steady_clock::now();
  REQUIRE(frames.size() == addresses.size());
  std::size_t named = 0;
  for (std::size_t i = 0; i < frames.size(); ++i) {
    CHECK(!frames[i].name.empty());
    CHECK(frames[i].module.find("libfx_copy") != std::string::npos);
    named += frames[i].name[0] != '[';
  }
  CHECK(named > 1000);
  std::size_t fixture_tables = 0;
  for (const auto& m : sym.modules().modules())
    fixture_tables += m.path.find("libfx_copy") != std::string::npos;
  CHECK(fixture_tables == 50);
  CHECK(sym.modules().loaded_files() >= 50);  // every copy read once, at its first lookup
  MESSAGE("scan of 50+ modules: " << std::chrono::duration<double, std::milli>(t1 - t0).count()
                                  << " ms; 10,000 lookups (reading each copy's symbols): "
                                  << std::chrono::duration<double, std::milli>(t2 - t1).count() << " ms");
}
