// Tests of MiniDebugInfo (.gnu_debugdata): xz streams decompressed through liblzma, a stripped fixture
// library whose embedded .symtab names its static function (as Fedora ships binaries), and a corrupt
// section that gives a warning naming the file rather than a crash or a wrong name.
#include <doctest/doctest.h>

#include <string>

#include "fixtures/symbols_fixture.hpp"
#include "selfprof/symbols/minidebuginfo.hpp"
#include "selfprof/symbols/symbolizer.hpp"
#include "test_support.hpp"

// Named, not anonymous: the unit tests build as one unity translation unit.
namespace mdi_test {

std::uint64_t addr_of(void* p) { return reinterpret_cast<std::uint64_t>(p); }

std::uint64_t static_fn_address(void* getter) {
  using fixture_fn = int (*)(int);
  auto get = reinterpret_cast<fixture_fn (*)()>(getter);
  return get == nullptr ? 0 : reinterpret_cast<std::uint64_t>(reinterpret_cast<void*>(get()));
}

selfprof::detail::byte_view view_of(const std::string& s) {
  return {reinterpret_cast<const unsigned char*>(s.data()), s.size()};
}

bool have_xz() { return selfprof_test::have_tool("xz") && selfprof::detail::lzma_decoder() != nullptr; }

}  // namespace mdi_test

TEST_CASE("minidebuginfo: xz streams decompress; a corrupt or truncated one is an error") {
  if (selfprof::detail::lzma_decoder() == nullptr) {
    std::string out;
    CHECK(selfprof::detail::xz_decompress({}, out).message().find("liblzma") != std::string::npos);
    MESSAGE("liblzma.so.5 missing: only the error is checked");
    return;
  }
  if (!mdi_test::have_xz()) {
    MESSAGE("the xz tool is missing: skipped");
    return;
  }
  selfprof_test::temp_dir dir;
  REQUIRE(!dir.path().empty());
  std::string text;
  for (int i = 0; i < 20000; ++i) text += "symbol_" + std::to_string(i * 7919 % 10007) + "\n";
  REQUIRE(selfprof_test::write_file(dir / "plain", text));
  REQUIRE(selfprof_test::run_command("xz -k -6 '" + (dir / "plain") + "'") == 0);
  std::string packed = selfprof_test::read_file(dir / "plain.xz");
  REQUIRE(packed.size() > 32);
  REQUIRE(packed.size() * 6 < text.size());  // the first buffer is too small: the retry is exercised

  std::string out;
  CHECK(selfprof::detail::xz_decompress(mdi_test::view_of(packed), out));
  CHECK(out == text);

  std::string corrupt = packed;
  corrupt[packed.size() / 2] ^= 0x5a;
  selfprof::status st = selfprof::detail::xz_decompress(mdi_test::view_of(corrupt), out);
  CHECK(!st);
  CHECK(st.message().find("xz") != std::string::npos);
  CHECK(out.empty());
  CHECK(!selfprof::detail::xz_decompress(mdi_test::view_of(packed.substr(0, packed.size() - 9)), out));
  CHECK(!selfprof::detail::xz_decompress(mdi_test::view_of("not xz at all"), out));
}

TEST_CASE("minidebuginfo: a stripped library's .gnu_debugdata names its static function") {
  if (!mdi_test::have_xz() || !selfprof_test::have_tool("objcopy") || !selfprof_test::have_tool("strip")) {
    MESSAGE("xz, liblzma.so.5, objcopy or strip missing: skipped");
    return;
  }
  std::string lib = selfprof_test::fixture_library();
  REQUIRE(!lib.empty());
  selfprof_test::temp_dir dir;
  REQUIRE(!dir.path().empty());
  // What Fedora's build does: the .symtab of the debug file without DWARF, xz-compressed, added to the
  // stripped library. A second copy carries bytes that are not xz.
  const std::string d = dir.path();
  std::string script = "set -e; cd '" + d + "'; L='" + lib +
                       "'\n"
                       "objcopy --only-keep-debug \"$L\" full.debug\n"
                       "objcopy --strip-debug --remove-section=.comment full.debug mini\n"
                       "xz -k mini\n"
                       "cp \"$L\" libfx_mdi.so; strip -s libfx_mdi.so\n"
                       "objcopy --add-section .gnu_debugdata=mini.xz libfx_mdi.so\n"
                       "printf 'not an xz stream' > bad.xz\n"
                       "cp \"$L\" libfx_bad.so; strip -s libfx_bad.so\n"
                       "objcopy --add-section .gnu_debugdata=bad.xz libfx_bad.so\n";
  REQUIRE(selfprof_test::write_file(d + "/make.sh", script));
  REQUIRE(selfprof_test::run_command("sh '" + d + "/make.sh' 2>&1") == 0);
  REQUIRE(selfprof_test::nm_symbols(d + "/libfx_mdi.so").empty());  // no .symtab of its own

  {
    selfprof_test::library handle(d + "/libfx_mdi.so");
    REQUIRE(handle);
    std::uint64_t stat = mdi_test::static_fn_address(handle.symbol("selfprof_fixture_static_addr"));
    REQUIRE(stat != 0);
    selfprof::symbolizer sym(symbols_test::options_with_roots({d + "/no-debug-files"}));
    CHECK(sym.resolve_one(stat + 1).name == "fixture_static_fn");
    CHECK(sym.resolve_one(mdi_test::addr_of(handle.symbol("selfprof_fixture_add"))).name ==
          "selfprof_fixture_add");
    CHECK(sym.take_warnings().empty());
  }
  {
    selfprof_test::library handle(d + "/libfx_bad.so");
    REQUIRE(handle);
    std::uint64_t stat = mdi_test::static_fn_address(handle.symbol("selfprof_fixture_static_addr"));
    REQUIRE(stat != 0);
    selfprof::symbolizer sym(symbols_test::options_with_roots({d + "/no-debug-files"}));
    selfprof::frame f = sym.resolve_one(stat + 1);
    CHECK(f.name.rfind("[libfx_bad.so+0x", 0) == 0);  // unnamed, not charged to a neighbour
    CHECK(sym.resolve_one(mdi_test::addr_of(handle.symbol("selfprof_fixture_add"))).name ==
          "selfprof_fixture_add");
    bool warned = false;
    for (const std::string& w : sym.take_warnings())
      warned = warned ||
               (w.find("libfx_bad.so") != std::string::npos && w.find(".gnu_debugdata") != std::string::npos);
    CHECK(warned);
  }
}
