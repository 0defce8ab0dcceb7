// Tests of the module registry: /proc/self/maps parsing, load bias against dl_iterate_phdr, the vdso,
// cheap refreshes, modules kept after dlclose, a library mapped twice, memfd and deleted files.
#include <doctest/doctest.h>

#include <dlfcn.h>
#include <link.h>
#include <sys/auxv.h>
#include <sys/mman.h>
#include <unistd.h>

#include <fcntl.h>
#include <cerrno>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <map>
#include <string>

#include "fixtures/symbols_fixture.hpp"
#include "selfprof/symbols/modules.hpp"
#include "test_support.hpp"

using selfprof::detail::maps_entry;
using selfprof::detail::module;
using selfprof::detail::module_kind;
using selfprof::detail::module_registry;
using selfprof::detail::parse_maps_line;

namespace {

std::string symbol_name(const module& m, std::uint64_t address) {
  selfprof::detail::symbol_table::hit hit;
  if (!m.symbols || !m.symbols->table.lookup(address - m.bias, hit)) return "<none>";
  return std::string(m.symbols->table.raw_name(hit.index));
}

}  // namespace

TEST_CASE("modules: maps lines with paths, spaces, deleted files, memfd and anonymous memory") {
  maps_entry e;
  REQUIRE(parse_maps_line("7f12a4000000-7f12a4021000 r-xp 00026000 fe:00 332835     /usr/lib/libc.so.6", e));
  CHECK(e.start == 0x7f12a4000000ull);
  CHECK(e.end == 0x7f12a4021000ull);
  CHECK(e.offset == 0x26000);
  CHECK(e.dev_major == 0xfe);
  CHECK(e.inode == 332835);
  CHECK(e.executable);
  CHECK(e.readable);
  CHECK(e.path == "/usr/lib/libc.so.6");
  CHECK_FALSE(e.deleted);
  REQUIRE(parse_maps_line("1000-2000 r-xp 00000000 00:01 77 /tmp/my lib.so (deleted)", e));
  CHECK(e.path == "/tmp/my lib.so");
  CHECK(e.deleted);
  REQUIRE(parse_maps_line("1000-2000 r-xp 00000000 00:01 1025 /memfd:jit code (deleted)", e));
  CHECK(e.path == "/memfd:jit code");
  REQUIRE(parse_maps_line("1000-2000 rwxp 00000000 00:00 0 ", e));
  CHECK(e.path.empty());
  REQUIRE(parse_maps_line("1000-2000 r--p 00000000 00:00 0", e));
  CHECK_FALSE(e.executable);
  CHECK_FALSE(parse_maps_line("", e));
  CHECK_FALSE(parse_maps_line("zzzz-2000 r-xp 0 00:00 0", e));
  CHECK_FALSE(parse_maps_line("2000-1000 r-xp 00000000 00:00 0", e));  // end before start
  CHECK_FALSE(parse_maps_line("1000-2000 r-x", e));
  CHECK_FALSE(parse_maps_line("11111111111111111-2000 r-xp 00000000 00:00 0", e));  // 17 hex digits
}

TEST_CASE("modules: load bias of every loaded object equals dl_iterate_phdr's dlpi_addr") {
  module_registry reg;
  reg.refresh();
  reg.load_all();                               // a bias is known once its file was read
  std::map<std::string, std::uint64_t> loader;  // real path -> bias
  ::dl_iterate_phdr(
      [](struct dl_phdr_info* info, std::size_t, void* data) -> int {
        auto* out = static_cast<std::map<std::string, std::uint64_t>*>(data);
        std::string name =
            info->dlpi_name != nullptr && info->dlpi_name[0] != 0 ? info->dlpi_name : "/proc/self/exe";
        std::string rp = symbols_test::real_path(name.c_str());
        if (!rp.empty()) (*out)[rp] = info->dlpi_addr;
        return 0;
      },
      &loader);
  std::string exe = symbols_test::real_path("/proc/self/exe");
  int compared = 0;
  bool saw_exe = false;
  for (const module& m : reg.modules()) {
    if (m.kind != module_kind::file || !m.mapped) continue;
    auto it = loader.find(m.path);
    if (it == loader.end()) continue;
    INFO(m.path);
    CHECK(m.bias == it->second);
    ++compared;
    saw_exe |= m.path == exe;
  }
  CHECK(compared >= 2);  // the executable and libc at least
  CHECK(saw_exe);
}

TEST_CASE("modules: the vdso is found and its symbols are read from memory") {
  unsigned long base = ::getauxval(AT_SYSINFO_EHDR);
  if (base == 0) {
    MESSAGE("no vdso in this process");
    return;
  }
  module_registry reg;
  reg.refresh();
  const module* m = reg.find(base);
  REQUIRE(m != nullptr);
  CHECK(m->kind == module_kind::vdso);
  CHECK(m->path == "[vdso]");
  REQUIRE(m->symbols);
  CHECK(m->symbols->elf_ok);
  CHECK(m->symbols->table.size() > 0);
  bool clock = false;
  for (std::uint32_t i = 0; i < m->symbols->table.size(); ++i)
    clock |= m->symbols->table.raw_name(i).find("clock_gettime") != std::string_view::npos;
  CHECK(clock);
}

TEST_CASE("modules: refresh is cheap when nothing was loaded, and notices dlopen") {
  module_registry reg;
  CHECK(reg.refresh());
  std::uint64_t reads = reg.reads(), scans = reg.scans();
  for (int i = 0; i < 1000; ++i) CHECK_FALSE(reg.refresh());
  CHECK(reg.reads() == reads);  // the maps file was not even read
  CHECK_FALSE(reg.rescan());    // read, but the text is unchanged
  CHECK(reg.scans() == scans);
  std::string lib = selfprof_test::fixture_library();
  REQUIRE(!lib.empty());
  selfprof_test::library handle(lib);
  REQUIRE(handle);
  CHECK(reg.refresh());
  CHECK(reg.scans() == scans + 1);
}

TEST_CASE("modules: a dlclose'd library stays known with its symbols") {
  std::string lib = selfprof_test::fixture_library();
  REQUIRE(!lib.empty());
  module_registry reg;
  reg.refresh();
  std::size_t parsed_before = reg.parsed_files();
  selfprof_test::library handle(lib);
  REQUIRE(handle);
  auto add = reinterpret_cast<std::uint64_t>(handle.symbol("selfprof_fixture_add"));
  REQUIRE(add != 0);
  reg.refresh();
  CHECK(reg.parsed_files() == parsed_before + 1);
  const module* m = reg.find(add);
  REQUIRE(m != nullptr);
  CHECK(m->mapped);
  CHECK(m->path == symbols_test::real_path(lib.c_str()));
  handle.close();
  reg.refresh();
  m = reg.find(add);
  REQUIRE(m != nullptr);
  CHECK_FALSE(m->mapped);
  CHECK(symbol_name(*m, add) == "selfprof_fixture_add");
  // Loading it again (same file, maybe the same address) parses nothing new.
  selfprof_test::library again(lib);
  REQUIRE(again);
  reg.refresh();
  CHECK(reg.parsed_files() == parsed_before + 1);
  auto add2 = reinterpret_cast<std::uint64_t>(again.symbol("selfprof_fixture_add"));
  m = reg.find(add2);
  REQUIRE(m != nullptr);
  CHECK(m->mapped);
  CHECK(symbol_name(*m, add2) == "selfprof_fixture_add");
}

TEST_CASE("modules: a file's symbols are read at the first lookup in it, or when it is unmapped") {
  std::string lib = selfprof_test::fixture_library();
  REQUIRE(!lib.empty());
  module_registry reg;
  reg.refresh();
  const std::size_t loaded_before = reg.loaded_files();
  CHECK(loaded_before < reg.parsed_files());  // libc and the rest wait for a lookup
  selfprof_test::library handle(lib);
  REQUIRE(handle);
  auto add = reinterpret_cast<std::uint64_t>(handle.symbol("selfprof_fixture_add"));
  REQUIRE(add != 0);
  reg.refresh();
  CHECK(reg.loaded_files() == loaded_before);  // seen, not read
  // Unmapped before any lookup: read when the unmap is seen, so its samples keep their names.
  handle.close();
  reg.refresh();
  CHECK(reg.loaded_files() == loaded_before + 1);
  const module* m = reg.find(add);
  REQUIRE(m != nullptr);
  CHECK_FALSE(m->mapped);
  CHECK(symbol_name(*m, add) == "selfprof_fixture_add");
  // A lookup reads that file only.
  const std::size_t before_lookup = reg.loaded_files();
  m = reg.find(reinterpret_cast<std::uint64_t>(&symbol_name));
  REQUIRE(m != nullptr);
  CHECK(reg.loaded_files() <= before_lookup + 1);
  CHECK(symbol_name(*m, reinterpret_cast<std::uint64_t>(&symbol_name)) != "<none>");
}

TEST_CASE("modules: a file changed on disk between first seen and first lookup gives no symbols") {
  std::string lib = selfprof_test::fixture_library();
  REQUIRE(!lib.empty());
  const std::string original = selfprof_test::read_file(lib);
  const std::uint64_t add = selfprof_test::nm_symbols(lib)["selfprof_fixture_add"].address;
  REQUIRE(add != 0);
  selfprof_test::temp_dir dir;
  selfprof::detail::module_registry_options options;
  options.debug_roots = {};
  options.maps_path = dir / "maps";
  const std::string path = dir / "lib.so";
  const std::uint64_t start = 0x7f0000000000;
  struct case_ {
    const char* what;
    bool change;
    bool replace;  // a new file (new inode) at the path, else rewritten in place
  };
  for (const case_ c : {case_{"unchanged", false, false}, case_{"rewritten in place", true, false},
                        case_{"replaced", true, true}}) {
    INFO(c.what);
    ::unlink(path.c_str());
    REQUIRE(selfprof_test::write_file(path, original));
    REQUIRE(symbols_test::write_maps_for(options.maps_path, path, start));
    module_registry reg(options);
    reg.rescan();
    REQUIRE(reg.modules().size() == 1);
    CHECK(reg.loaded_files() == 0);
    if (c.change) {
      // Another build of the library: same length, different bytes at the end, a later mtime.
      std::string other = original;
      other.back() = static_cast<char>(other.back() ^ 0x5a);
      struct timespec pause {
        0, 20 * 1000 * 1000
      };
      ::nanosleep(&pause, nullptr);  // a different mtime on file systems with coarse timestamps
      if (c.replace) {
        REQUIRE(::unlink(path.c_str()) == 0);
        REQUIRE(selfprof_test::write_file(path, other));
      } else {
        REQUIRE(symbols_test::rewrite_in_place(path, other));
      }
    }
    const module* m = reg.find(start + add);
    REQUIRE(m != nullptr);
    CHECK(reg.loaded_files() == 1);
    auto warnings = reg.take_warnings();
    if (!c.change) {
      CHECK(symbol_name(*m, start + add) == "selfprof_fixture_add");
      CHECK(warnings.empty());
    } else {
      CHECK(symbol_name(*m, start + add) == "<none>");
      REQUIRE(warnings.size() == 1);
      CHECK(warnings[0].find(path + ": changed on disk since it was mapped") != std::string::npos);
    }
  }
}

TEST_CASE("modules: a mapped library replaced on disk before its first lookup is read through map_files") {
  std::string lib = selfprof_test::fixture_library();
  REQUIRE(!lib.empty());
  selfprof_test::temp_dir dir;
  const std::string path = dir / "libfx_replaced.so";
  const std::string original = selfprof_test::read_file(lib);
  REQUIRE(selfprof_test::write_file(path, original));
  selfprof_test::library handle(path);
  REQUIRE(handle);
  auto add = reinterpret_cast<std::uint64_t>(handle.symbol("selfprof_fixture_add"));
  REQUIRE(add != 0);
  module_registry reg;
  reg.refresh();
  // An upgrade: a new file renamed over the path (a new inode); the process still maps the old one.
  const std::string next = dir / "libfx_replaced.so.new";
  std::string other = original;
  other.back() = static_cast<char>(other.back() ^ 0x5a);
  REQUIRE(selfprof_test::write_file(next, other));
  REQUIRE(::rename(next.c_str(), path.c_str()) == 0);
  const module* m = reg.find(add);
  REQUIRE(m != nullptr);
  auto warnings = reg.take_warnings();
  char range[80];
  std::snprintf(range, sizeof range, "/proc/self/map_files/%llx-%llx",
                static_cast<unsigned long long>(m->start), static_cast<unsigned long long>(m->end));
  const int probe = ::open(range, O_RDONLY | O_CLOEXEC);
  if (probe >= 0) {  // root (CAP_SYS_ADMIN): the mapped file's own symbols
    ::close(probe);
    CHECK(symbol_name(*m, add) == "selfprof_fixture_add");
    CHECK(warnings.empty());
  } else {  // no way to the old bytes: no symbols, and a warning that says why
    MESSAGE("map_files not readable here: the replaced library is checked for its warning only");
    CHECK(symbol_name(*m, add) == "<none>");
    REQUIRE(warnings.size() == 1);
    CHECK(warnings[0].find(path + ": changed on disk since it was mapped") != std::string::npos);
  }
}

TEST_CASE("modules: a library mapped twice (dlmopen) gets two biases and one parsed table") {
  std::string lib = selfprof_test::fixture_library();
  REQUIRE(!lib.empty());
  selfprof_test::library first(lib);
  REQUIRE(first);
  void* second = ::dlmopen(LM_ID_NEWLM, lib.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (second == nullptr) {
    MESSAGE("dlmopen unavailable here: " << ::dlerror());
    return;
  }
  auto a1 = reinterpret_cast<std::uint64_t>(first.symbol("selfprof_fixture_add"));
  auto a2 = reinterpret_cast<std::uint64_t>(::dlsym(second, "selfprof_fixture_add"));
  REQUIRE(a1 != 0);
  REQUIRE(a2 != 0);
  CHECK(a1 != a2);
  module_registry reg;
  reg.refresh();
  const module* m1 = reg.find(a1);
  const module* m2 = reg.find(a2);
  REQUIRE(m1 != nullptr);
  REQUIRE(m2 != nullptr);
  CHECK(m1 != m2);
  CHECK(m1->bias != m2->bias);
  CHECK(m1->symbols == m2->symbols);  // parsed once
  CHECK(symbol_name(*m1, a1) == "selfprof_fixture_add");
  CHECK(symbol_name(*m2, a2) == "selfprof_fixture_add");
  CHECK(a1 - m1->bias == a2 - m2->bias);
  ::dlclose(second);
}

TEST_CASE("modules: memfd and deleted libraries are read through map_files") {
  std::string lib = selfprof_test::fixture_library();
  REQUIRE(!lib.empty());
  selfprof_test::temp_dir dir;
  // A deleted file.
  std::string copy = dir / "libfx_deleted.so";
  REQUIRE(selfprof_test::write_file(copy, selfprof_test::read_file(lib)));
  selfprof_test::library deleted(copy);
  REQUIRE(deleted);
  REQUIRE(::unlink(copy.c_str()) == 0);
  // A memfd.
  std::string bytes = selfprof_test::read_file(lib);
  int fd = ::memfd_create("selfprof-fixture", MFD_CLOEXEC);
  REQUIRE(fd >= 0);
  REQUIRE(::write(fd, bytes.data(), bytes.size()) == static_cast<ssize_t>(bytes.size()));
  selfprof_test::library memfd("/proc/self/fd/" + std::to_string(fd));
  REQUIRE(memfd);

  module_registry reg;
  reg.refresh();
  auto a1 = reinterpret_cast<std::uint64_t>(deleted.symbol("selfprof_fixture_add"));
  auto a2 = reinterpret_cast<std::uint64_t>(memfd.symbol("selfprof_fixture_add"));
  const module* m1 = reg.find(a1);
  const module* m2 = reg.find(a2);
  REQUIRE(m1 != nullptr);
  REQUIRE(m2 != nullptr);
  CHECK(m1->deleted);
  CHECK(m1->path.find("libfx_deleted.so") != std::string::npos);
  CHECK(m2->path == "/memfd:selfprof-fixture");
  CHECK(symbol_name(*m2, a2) == "selfprof_fixture_add");  // via map_files, or the open memfd descriptor
  // map_files needs CAP_SYS_ADMIN or CAP_CHECKPOINT_RESTORE (proc(5)): an unprivileged process cannot read a
  // deleted file nobody holds open, and gets one warning instead (the frames become [module+0xoffset]).
  char range[80];
  std::snprintf(range, sizeof range, "/proc/self/map_files/%llx-%llx",
                static_cast<unsigned long long>(m1->start), static_cast<unsigned long long>(m1->end));
  int probe = ::open(range, O_RDONLY | O_CLOEXEC);
  std::string why = probe >= 0 ? std::string() : std::string(std::strerror(errno));
  auto warnings = reg.take_warnings();
  if (probe >= 0) {
    ::close(probe);
    CHECK(symbol_name(*m1, a1) == "selfprof_fixture_add");
    CHECK(warnings.empty());
  } else {
    MESSAGE("map_files not readable here (" << why << "): deleted file checked for its warning only");
    CHECK(symbol_name(*m1, a1) == "<none>");
    REQUIRE(warnings.size() == 1);
    CHECK(warnings[0].find("libfx_deleted.so") != std::string::npos);
  }
  ::close(fd);
}

TEST_CASE("modules: anonymous executable memory is a module without symbols") {
  void* p = ::mmap(nullptr, 4096, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  REQUIRE(p != MAP_FAILED);
  REQUIRE(::mprotect(p, 4096, PROT_READ | PROT_EXEC) == 0);
  module_registry reg;
  reg.refresh();
  reg.rescan();
  const module* m = reg.find(reinterpret_cast<std::uint64_t>(p) + 8);
  REQUIRE(m != nullptr);
  CHECK(m->kind == module_kind::anonymous);
  CHECK(m->path == "//anon");
  CHECK_FALSE(m->symbols);
  ::munmap(p, 4096);
  reg.rescan();
  const module* gone = reg.find(reinterpret_cast<std::uint64_t>(p) + 8);
  CHECK((gone == nullptr || gone->kind != module_kind::anonymous));  // anonymous memory is not kept
}
