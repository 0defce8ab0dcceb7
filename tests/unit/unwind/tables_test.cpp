// The published unwind tables (unwind/tables.hpp): a lazy build lists a module it has not parsed as
// pending and parses it once want() asked for an address in its code; copies of this process's memory
// stop at a page the kernel cannot supply; where copies are refused the rows are read in place.
#include <doctest/doctest.h>

#include <dlfcn.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "fixtures/symbols_fixture.hpp"
#include "selfprof/detail/sys.hpp"
#include "selfprof/unwind/tables.hpp"

namespace tables_test {

using selfprof::detail::g_unwind_tables;
using selfprof::detail::pending_code;
using selfprof::detail::unwind_tables;

// True when a published module's rows cover `pc`.
bool published(std::uintptr_t pc) {
  const selfprof::detail::unwind_table_set* set = g_unwind_tables.load();
  if (set == nullptr) return false;
  for (std::size_t i = 0; i < set->count; ++i)
    if (pc >= set->modules[i].start && pc < set->modules[i].end) return true;
  return false;
}

bool pending(std::uintptr_t pc) {
  for (const pending_code& c : unwind_tables().pending())
    if (pc >= c.start && pc < c.end) return true;
  return false;
}

// A copy of the fixture library under a name no earlier build has seen, loaded.
struct fresh_library {
  selfprof_test::temp_dir dir;
  void* handle = nullptr;
  std::uintptr_t fn = 0;
  explicit fresh_library(const char* name) {
    const std::string lib = selfprof_test::fixture_library();
    if (lib.empty()) return;
    const std::string copy = dir / name;
    if (!selfprof_test::write_file(copy, selfprof_test::read_file(lib))) return;
    handle = dlopen(copy.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (handle) fn = reinterpret_cast<std::uintptr_t>(dlsym(handle, "selfprof_fixture_add"));
  }
  ~fresh_library() {
    if (handle) dlclose(handle);
  }
};

long refuse_copies(void*, std::uintptr_t, std::size_t) {
  errno = ENOSYS;
  return -1;
}

}  // namespace tables_test

namespace tt = tables_test;

TEST_CASE("unwind tables: a lazy build parses a module once want() asked for its code") {
  tt::fresh_library lib("libtables_lazy.so");
  REQUIRE(lib.fn != 0);
  REQUIRE(selfprof::detail::build_unwind_tables_lazily());
  CHECK(tt::pending(lib.fn));
  CHECK(!tt::published(lib.fn));
  CHECK(selfprof::get_unwind_tables_info().pending >= 1);

  CHECK(unwind_tables().want(lib.fn));
  CHECK(!unwind_tables().want(lib.fn));  // asked once
  REQUIRE(selfprof::detail::build_unwind_tables_lazily());
  CHECK(tt::published(lib.fn));
  CHECK(!tt::pending(lib.fn));
  CHECK(!unwind_tables().want(lib.fn));  // parsed: nothing to ask for
  CHECK(selfprof::get_unwind_tables_info().parse_ms > 0);

  // An address in no module asks for nothing.
  CHECK(!unwind_tables().want(8));
}

TEST_CASE("unwind tables: the eager build parses every module") {
  tt::fresh_library lib("libtables_eager.so");
  REQUIRE(lib.fn != 0);
  REQUIRE(selfprof::build_unwind_tables());
  CHECK(tt::published(lib.fn));
  CHECK(!tt::pending(lib.fn));
}

TEST_CASE("unwind tables: where copies of memory are refused, rows are read in place") {
  tt::fresh_library lib("libtables_refused.so");
  REQUIRE(lib.fn != 0);
  auto& copy = selfprof::detail::sys().read_own_memory;
  copy = tt::refuse_copies;
  const selfprof::status st = selfprof::build_unwind_tables();
  copy = selfprof::detail::default_read_own_memory;
  REQUIRE(st);
  CHECK(tt::published(lib.fn));
}

TEST_CASE("read_own_memory: a copy stops at the first page the kernel cannot supply") {
  const long page = ::sysconf(_SC_PAGESIZE);
  auto* p = static_cast<unsigned char*>(::mmap(nullptr, static_cast<std::size_t>(3 * page),
                                               PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0));
  REQUIRE(p != MAP_FAILED);
  for (long i = 0; i < 3 * page; ++i) p[i] = static_cast<unsigned char>(i * 7);
  REQUIRE(::munmap(p + 2 * page, static_cast<std::size_t>(page)) == 0);  // a hole after two pages
  std::vector<unsigned char> out(static_cast<std::size_t>(3 * page));
  const auto base = reinterpret_cast<std::uintptr_t>(p);
  const auto& read = selfprof::detail::sys().read_own_memory;

  CHECK(read(out.data(), base + 100, 1000) == 1000);
  CHECK(std::memcmp(out.data(), p + 100, 1000) == 0);
  // Across the hole: the bytes before it.
  CHECK(read(out.data(), base + 10, static_cast<std::size_t>(3 * page - 10)) == 2 * page - 10);
  CHECK(std::memcmp(out.data(), p + 10, static_cast<std::size_t>(2 * page - 10)) == 0);
  // Starting in the hole: nothing, and no error.
  CHECK(read(out.data(), base + 2 * page, 16) == 0);
  ::munmap(p, static_cast<std::size_t>(2 * page));
}
