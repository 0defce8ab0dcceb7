// Unwind rows of another process's code, read from the files it mapped (tools/selfprof/file_unwind.hpp):
// for this process's own libc and executable, the rows read from the file, moved to where the mapping
// put them, are the rows the in-process tables parsed from memory, at every pc; a mapping of part of the
// code gets that part's rows only; a file that is not the one mapped gets none, and says why.
#include <doctest/doctest.h>

#include <unistd.h>

#include <cstdint>
#include <string>
#include <vector>

#include <selfprof/symbols/proc_maps.hpp>
#include <selfprof/unwind/tables.hpp>

#include "file_unwind.hpp"

using namespace selfprof_cli;
using selfprof::detail::unwind_row;

namespace {

// This process's executable mappings of regular files.
std::vector<selfprof::detail::maps_entry> own_code() {
  std::vector<selfprof::detail::maps_entry> out;
  std::string text;
  REQUIRE(selfprof::detail::read_text_file("/proc/self/maps", text));
  std::size_t at = 0;
  while (at < text.size()) {
    std::size_t nl = text.find('\n', at);
    if (nl == std::string::npos) nl = text.size();
    selfprof::detail::maps_entry e;
    if (selfprof::detail::parse_maps_line(std::string_view(text).substr(at, nl - at), e) && e.executable &&
        !e.path.empty() && e.path[0] == '/' && !e.deleted)
      out.push_back(e);
    at = nl + 1;
  }
  return out;
}

bool same_row(const unwind_row* a, const unwind_row* b) {
  if (a == nullptr || b == nullptr) return a == b;
  return a->kind == b->kind && a->cfa_off == b->cfa_off && a->fp_off == b->fp_off &&
         a->plt_threshold == b->plt_threshold;
}

}  // namespace

TEST_CASE("file rows match the in-process rows of every mapped module, at every sampled pc") {
  REQUIRE(selfprof::build_unwind_tables());
  const selfprof::detail::unwind_table_set* live = selfprof::detail::g_unwind_tables.load();
  REQUIRE(live != nullptr);
  file_unwind_cache cache;
  std::size_t modules = 0, compared = 0, differ = 0;
  bool saw_libc = false;
  for (const auto& m : own_code()) {
    selfprof::detail::unwind_module u{};
    if (!cache.module_for(m.path, m.inode, m.start, m.end, m.offset, u)) continue;
    ++modules;
    saw_libc = saw_libc || m.path.find("libc.so") != std::string::npos;
    CHECK(u.start >= m.start);
    CHECK(u.end <= m.end);
    selfprof::detail::unwind_table_set one{&u, 1};
    const std::uintptr_t step = (u.end - u.start) / 4000 + 1;
    for (std::uintptr_t pc = u.start; pc < u.end; pc += step) {
      ++compared;
      if (!same_row(selfprof::detail::find_unwind_row(&one, pc), selfprof::detail::find_unwind_row(live, pc)))
        ++differ;
    }
  }
  MESSAGE(modules << " modules, " << compared << " pcs compared, " << cache.rows() << " rows");
  CHECK(saw_libc);
  CHECK(modules >= 2);
  CHECK(compared > 4000);
  CHECK(differ == 0);
}

TEST_CASE("a mapping of part of a file's code gets that part's rows, at that part's address") {
  REQUIRE(selfprof::build_unwind_tables());
  const selfprof::detail::unwind_table_set* live = selfprof::detail::g_unwind_tables.load();
  file_unwind_cache cache;
  for (const auto& m : own_code()) {
    if (m.path.find("libc.so") == std::string::npos || m.end - m.start < 0x40000) continue;
    // The second half of libc's code, as if mapped again elsewhere (V8 maps its builtins this way): the
    // rows of that half, moved by the distance between the two addresses.
    const std::uint64_t half = ((m.end - m.start) / 2) & ~std::uint64_t(0xfff);
    const std::uint64_t elsewhere = 0x200000000000ull;
    selfprof::detail::unwind_module u{};
    REQUIRE(cache.module_for(m.path, m.inode, elsewhere, elsewhere + (m.end - m.start - half),
                             m.offset + half, u));
    CHECK(u.start >= elsewhere);
    CHECK(u.end <= elsewhere + (m.end - m.start - half));
    selfprof::detail::unwind_table_set one{&u, 1};
    std::size_t compared = 0, differ = 0;
    for (std::uint64_t off = 0; off < m.end - m.start - half; off += 97) {
      ++compared;
      if (!same_row(selfprof::detail::find_unwind_row(&one, elsewhere + off),
                    selfprof::detail::find_unwind_row(live, m.start + half + off)))
        ++differ;
    }
    CHECK(compared > 1000);
    CHECK(differ == 0);
    // Nothing below the part mapped.
    CHECK(selfprof::detail::find_unwind_row(&one, elsewhere - 1) == nullptr);
    return;
  }
  FAIL("no libc mapping found");
}

TEST_CASE("a file that is not the one mapped gets no rows, and a note says why") {
  file_unwind_cache cache;
  const auto code = own_code();
  REQUIRE(!code.empty());
  const auto& m = code.front();
  selfprof::detail::unwind_module u{};
  CHECK_FALSE(cache.module_for(m.path, m.inode + 1, m.start, m.end, m.offset, u));
  CHECK_FALSE(cache.module_for("/nonexistent/lib.so", 0, m.start, m.end, m.offset, u));
  REQUIRE(cache.notes().size() == 2);
  CHECK(cache.notes()[0].find(m.path) != std::string::npos);
  CHECK(cache.notes()[1].find("/nonexistent/lib.so") != std::string::npos);
  // Asked again: the answer is kept, no second note.
  CHECK_FALSE(cache.module_for("/nonexistent/lib.so", 0, m.start, m.end, m.offset, u));
  CHECK(cache.notes().size() == 2);
}
