// Torture: a library rebuilt and reloaded from the same path, at the same address, with the same
// .eh_frame_hdr bytes, must not be unwound with the rows parsed from its old build (issue 15, item 14).
// The fixture (tests/fixtures/stale_rows_fixture.cpp) is compiled here twice with $CXX (or c++): variant 1
// has no stack frame, variant 2 a 664-byte one, both -O2 -fomit-frame-pointer, so only the rows find
// the caller. Variant 1 is profiled (or only parsed), unloaded, its file is overwritten with variant 2,
// which is loaded again and profiled: every sample in the hot function must unwind to the driver that
// called it. The old rows (CFA = rsp+8) read a stack slot of variant 2 as the return address instead.
// Also: a module's rows are clipped to its executable segments (clip_unwind_rows).
// ctest-labels: no_tsan
// Not under TSan: it defers asynchronous signals to its next safe point, so a deferred handler walks
// a stack that is no longer the interrupted one.
#include <doctest/doctest.h>

#include <dlfcn.h>
#include <fcntl.h>
#include <link.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include <selfprof/unwind/tables.hpp>

#include "../integration/workload.hpp"

namespace stale_rows_torture {

using hot_fn = long (*)(long);

WL_NOINLINE unsigned long stale_rows_driver(hot_fn fn, std::int64_t cpu_ns) {
  unsigned long r = 0;
  const std::int64_t start = wl::thread_cpu_ns();
  while (wl::thread_cpu_ns() - start < cpu_ns) r += static_cast<unsigned long>(fn(200000));
  WL_NO_TAIL();
  return r;
}

std::string compiler() {
  const char* cxx = std::getenv("CXX");
  return cxx && cxx[0] ? cxx : "c++";
}

// Builds variant `v` of the fixture into `out`.
bool build_variant(int v, const std::string& out) {
  std::string cmd = compiler() + " -O2 -fomit-frame-pointer -fasynchronous-unwind-tables -fPIC -shared" +
                    " -DSTALE_ROWS_VARIANT=" + std::to_string(v) + " -o " + out +
                    " " SELFPROF_TEST_SOURCE_DIR "/fixtures/stale_rows_fixture.cpp";
  return std::system(cmd.c_str()) == 0;
}

// Writes `from`'s bytes over `to` in place (same inode, as `cp` does).
bool copy_over(const std::string& from, const std::string& to) {
  std::FILE* in = std::fopen(from.c_str(), "rb");
  if (!in) return false;
  std::FILE* out = std::fopen(to.c_str(), "wb");
  if (!out) return std::fclose(in), false;
  char buf[8192];
  std::size_t n;
  bool ok = true;
  while ((n = std::fread(buf, 1, sizeof buf, in)) > 0) ok = ok && std::fwrite(buf, 1, n, out) == n;
  std::fclose(in);
  return std::fclose(out) == 0 && ok;
}

// Where the library at `path` is loaded: its load bias and its .eh_frame_hdr bytes.
struct loaded {
  std::uintptr_t bias = 0;
  std::uintptr_t hdr_offset = 0;
  std::string hdr;
};
loaded where(const std::string& path) {
  struct ctx {
    const std::string* path;
    loaded out;
  } c{&path, {}};
  dl_iterate_phdr(
      [](dl_phdr_info* info, std::size_t, void* data) -> int {
        ctx& c = *static_cast<ctx*>(data);
        if (info->dlpi_name == nullptr || *c.path != info->dlpi_name) return 0;
        c.out.bias = info->dlpi_addr;
        for (int i = 0; i < info->dlpi_phnum; ++i)
          if (info->dlpi_phdr[i].p_type == PT_GNU_EH_FRAME) {
            c.out.hdr_offset = info->dlpi_phdr[i].p_vaddr;
            c.out.hdr.assign(reinterpret_cast<const char*>(info->dlpi_addr + info->dlpi_phdr[i].p_vaddr),
                             info->dlpi_phdr[i].p_memsz);
          }
        return 1;
      },
      &c);
  return c.out;
}

// Samples whose leaf is in the library, and how many of them have the driver among their callers.
struct counts {
  std::uint64_t in_lib = 0, with_driver = 0;
};
counts count_stacks(const selfprof::profile& p, const std::string& path) {
  counts c;
  for (const auto& s : p.stacks) {
    if (s.frames.empty() || p.frames[s.frames.back()].module != path) continue;
    c.in_lib += s.count;
    for (std::uint32_t f : s.frames)
      if (p.frames[f].name.find("stale_rows_driver") != std::string::npos) {
        c.with_driver += s.count;
        break;
      }
  }
  return c;
}

selfprof::options dwarf_options() {
  selfprof::options o;
  o.hz = 500;
  o.unwind = selfprof::unwind_mode::dwarf;
  return o;
}

struct fixture {
  std::string dir, v1, v2, path;
  fixture() {
    char tmpl[] = "/tmp/selfprof-stale-rows-XXXXXX";
    REQUIRE(mkdtemp(tmpl) != nullptr);
    dir = tmpl;
    v1 = dir + "/variant1.so";
    v2 = dir + "/variant2.so";
    path = dir + "/libstale_rows.so";
    REQUIRE_MESSAGE(build_variant(1, v1), "could not compile tests/fixtures/stale_rows_fixture.cpp with ",
                    compiler());
    REQUIRE(build_variant(2, v2));
    REQUIRE(copy_over(v1, path));
  }
  ~fixture() {
    std::remove(v1.c_str());
    std::remove(v2.c_str());
    std::remove(path.c_str());
    ::rmdir(dir.c_str());
  }
};

// Reports whether variant 2 came back where variant 1 was, with the same .eh_frame_hdr (the case the
// old hash of .eh_frame_hdr could not tell apart).
void describe_reload(const loaded& a, const loaded& b) {
  char line[160];
  std::snprintf(line, sizeof line,
                "variant 1 at %#zx, variant 2 at %#zx; .eh_frame_hdr at the same offset: %s, same bytes: %s",
                static_cast<std::size_t>(a.bias), static_cast<std::size_t>(b.bias),
                a.hdr_offset == b.hdr_offset ? "yes" : "no", a.hdr == b.hdr ? "yes" : "no");
  MESSAGE(std::string(line));
  if (a.bias != b.bias) MESSAGE("the loader moved the library: this run does not exercise the reuse check");
  CHECK(a.hdr_offset == b.hdr_offset);  // the fixture is built for this
}

void check_unwinds_through(const counts& c, const std::string& what) {
  MESSAGE(what << ": " << c.in_lib << " samples in the hot function, " << c.with_driver
               << " of them unwound to its caller");
  REQUIRE(c.in_lib >= 40);
  CHECK(c.with_driver * 100 >= c.in_lib * 97);
}

}  // namespace stale_rows_torture

using namespace stale_rows_torture;

TEST_CASE("a library rebuilt and reloaded between two sessions is unwound with its new rows") {
  wl::apply_test_environment();
  fixture fx;
  void* h = dlopen(fx.path.c_str(), RTLD_NOW | RTLD_LOCAL);
  REQUIRE_MESSAGE(h != nullptr, dlerror());
  auto fn = reinterpret_cast<hot_fn>(dlsym(h, "selfprof_stale_rows_hot"));
  REQUIRE(reinterpret_cast<void*>(fn) != nullptr);
  const loaded a = where(fx.path);
  REQUIRE(selfprof::start(dwarf_options()));
  stale_rows_driver(fn, 300000000);
  REQUIRE(selfprof::stop());  // the rows of the loaded variant 1 are kept for the next start
  check_unwinds_through(count_stacks(selfprof::snapshot(), fx.path), "variant 1");
  dlclose(h);

  REQUIRE(copy_over(fx.v2, fx.path));  // rebuilt in place: same path, same inode
  h = dlopen(fx.path.c_str(), RTLD_NOW | RTLD_LOCAL);
  REQUIRE_MESSAGE(h != nullptr, dlerror());
  fn = reinterpret_cast<hot_fn>(dlsym(h, "selfprof_stale_rows_hot"));
  REQUIRE(reinterpret_cast<void*>(fn) != nullptr);
  describe_reload(a, where(fx.path));
  REQUIRE(selfprof::start(dwarf_options()));
  stale_rows_driver(fn, 600000000);
  REQUIRE(selfprof::stop());
  check_unwinds_through(count_stacks(selfprof::snapshot(), fx.path), "variant 2 after a restart");
  dlclose(h);
}

TEST_CASE("a library rebuilt and reloaded while profiling is unwound with its new rows") {
  wl::apply_test_environment();
  fixture fx;
  REQUIRE(selfprof::start(dwarf_options()));
  void* h = dlopen(fx.path.c_str(), RTLD_NOW | RTLD_LOCAL);
  REQUIRE_MESSAGE(h != nullptr, dlerror());
  const loaded a = where(fx.path);
  REQUIRE(selfprof::build_unwind_tables());  // the collector's periodic check: variant 1 is parsed
  dlclose(h);
  std::remove(fx.path.c_str());  // rebuilt by renaming: a new inode at the same path
  REQUIRE(copy_over(fx.v2, fx.path + ".new"));
  REQUIRE(std::rename((fx.path + ".new").c_str(), fx.path.c_str()) == 0);
  h = dlopen(fx.path.c_str(), RTLD_NOW | RTLD_LOCAL);
  REQUIRE_MESSAGE(h != nullptr, dlerror());
  auto fn = reinterpret_cast<hot_fn>(dlsym(h, "selfprof_stale_rows_hot"));
  REQUIRE(reinterpret_cast<void*>(fn) != nullptr);
  describe_reload(a, where(fx.path));
  REQUIRE(selfprof::build_unwind_tables());  // as the collector would, before the hot code runs
  stale_rows_driver(fn, 600000000);
  REQUIRE(selfprof::stop());
  check_unwinds_through(count_stacks(selfprof::snapshot(), fx.path), "variant 2 in the same session");
  dlclose(h);
}

TEST_CASE("a module's rows are clipped to its executable segments") {
  using selfprof::detail::unwind_row;
  selfprof::detail::eh_frame_table t;
  t.start = 0x1000;
  t.end = 0x1400;
  const std::uint8_t rsp = selfprof::detail::row_cfa_rsp, none = selfprof::detail::row_no_info;
  t.rows = {{0x000, 8, 0, rsp, 0}, {0x100, 16, 0, rsp, 0}, {0x300, 24, 0, rsp, 0}, {0x400, 0, 0, none, 0}};
  // Code at [0x1080, 0x1200) and [0x1380, 0x2000): the FDEs' ranges stick out on both sides.
  selfprof::detail::clip_unwind_rows(t, {{0x1080, 0x1200}, {0x1380, 0x2000}});
  CHECK(t.start == 0x1080);
  CHECK(t.end == 0x1400);
  REQUIRE(t.rows.size() == 5);
  CHECK((t.rows[0].pc == 0x000 && t.rows[0].cfa_off == 8));
  CHECK((t.rows[1].pc == 0x080 && t.rows[1].cfa_off == 16));
  CHECK((t.rows[2].pc == 0x180 && t.rows[2].kind == none));  // the gap between the two segments
  CHECK((t.rows[3].pc == 0x300 && t.rows[3].cfa_off == 24));
  CHECK((t.rows[4].pc == 0x380 && t.rows[4].kind == none));
  // Rows entirely outside the module's code: nothing is left.
  selfprof::detail::clip_unwind_rows(t, {{0x9000, 0xa000}});
  CHECK(t.rows.empty());
  CHECK(t.start == t.end);
}
