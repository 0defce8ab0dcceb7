// Tests of the kallsyms reader that names the ring source's kernel frames: text symbols only, module
// names, the nearest symbol below an address within reach, hidden addresses (kptr_restrict) and a
// missing file giving "[kernel]", and is_kernel_address against selfprof's tagged pcs.
#include <doctest/doctest.h>

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "selfprof/detail/stack_table.hpp"
#include "selfprof/jit/registry.hpp"
#include "selfprof/symbols/kernel_symbols.hpp"

namespace kernel_symbols_test {

std::string write_kallsyms(const std::string& text) {
  char path[] = "/tmp/selfprof-kallsyms-XXXXXX";
  const int fd = ::mkstemp(path);
  REQUIRE(fd >= 0);
  REQUIRE(::write(fd, text.data(), text.size()) == static_cast<ssize_t>(text.size()));
  ::close(fd);
  return path;
}

}  // namespace kernel_symbols_test

TEST_CASE("kernel symbols: text symbols by address, module names, reach") {
  const std::string path = kernel_symbols_test::write_kallsyms(
      "ffffffff81000000 T _stext\n"
      "ffffffff81001000 t do_syscall_64\n"
      "ffffffff81002000 D some_data\n"  // data: not a code symbol
      "ffffffff81003000 W weak_fn\n"
      "ffffffffc0a01000 t nf_hook_fn\t[nf_tables]\n"
      "ffffffffc0a02000 t nf_other\t[nf_tables]\n"
      "ffffffffc0b00000 T ext4_fn\t[ext4]\n"
      "not a line at all\n"
      "ffffffff8100zzzz T bad_hex\n");
  selfprof::detail::kernel_symbols k;
  k.load(path.c_str());
  ::unlink(path.c_str());
  CHECK(k.size() == 6);
  selfprof::frame f = k.resolve(0xffffffff81001234ull);
  CHECK(f.name == "do_syscall_64");
  CHECK(f.kind == selfprof::frame_kind::kernel);
  CHECK(f.module == "[kernel.kallsyms]");
  CHECK(f.module_offset == 0x234);
  CHECK(k.resolve(0xffffffff81002800ull).name == "do_syscall_64");  // data symbols do not end functions
  CHECK(k.resolve(0xffffffff81003010ull).name == "weak_fn");
  f = k.resolve(0xffffffffc0a02010ull);
  CHECK(f.name == "nf_other");
  CHECK(f.module == "[nf_tables]");
  CHECK(k.resolve(0xffffffffc0b00004ull).module == "[ext4]");
  CHECK(k.resolve(0xffffffff80000000ull).name == "[kernel]");  // below every symbol
  CHECK(k.resolve(0xffffffffc0b00000ull + (std::uint64_t{4} << 20)).name == "[kernel]");  // out of reach
}

TEST_CASE("kernel symbols: prepare() reads only what names the given addresses, as load() names them") {
  // Core symbols in address order, then modules out of order, an alias, data, and a long line.
  std::string text =
      "ffffffff81000000 T _stext\n"
      "ffffffff81001000 t do_syscall_64\n"
      "ffffffff81001000 t do_syscall_64_alias\n"
      "ffffffff81002000 D some_data\n"
      "ffffffff81003000 W weak_fn\n";
  for (int i = 0; i < 3000; ++i) {  // more than one 64 KiB read
    char line[64];
    std::snprintf(line, sizeof line, "%llx t filler_%d\n", 0xffffffff81100000ull + 0x40ull * i, i);
    text += line;
  }
  text += "ffffffffc0b00000 T ext4_fn\t[ext4]\n";
  text += "ffffffffc0a02000 t nf_other\t[nf_tables]\n";
  text += "ffffffffc0a01000 t nf_hook_fn\t[nf_tables]\n";
  text += "ffffffff81200000 t " + std::string(65530, 'x') + "\n";  // longer than the buffer
  text += "ffffffff81300000 t last_no_newline";
  const std::string path = kernel_symbols_test::write_kallsyms(text);
  const std::vector<std::uint64_t> wanted = {0xffffffff81001234ull,
                                             0xffffffff81002800ull,
                                             0xffffffff81003010ull,
                                             0xffffffff81100000ull + 0x40 * 1234 + 7,
                                             0xffffffffc0a01010ull,
                                             0xffffffffc0a02010ull,
                                             0xffffffffc0b00004ull,
                                             0xffffffff80000000ull,
                                             0xffffffffc0b00000ull + (std::uint64_t{4} << 20),
                                             0xffffffff81200010ull,
                                             0xffffffff81300001ull,
                                             0xffffffff81001234ull};
  selfprof::detail::kernel_symbols whole(path);
  whole.load(path.c_str());
  CHECK(whole.size() == 3000 + 9);
  selfprof::detail::kernel_symbols some(path);
  some.prepare(wanted);
  CHECK(some.size() <= 10);  // one symbol per distinct address at most
  for (std::uint64_t a : wanted) {
    INFO(std::hex << a);
    const selfprof::frame w = whole.resolve(a), s = some.resolve(a);
    CHECK(s.name == w.name);
    CHECK(s.module == w.module);
    CHECK(s.module_offset == w.module_offset);
  }
  CHECK(some.resolve(0xffffffff81001234ull).name == "do_syscall_64_alias");  // the last one listed
  CHECK(some.resolve(0xffffffff81200010ull).name.size() == 65530);
  CHECK(some.resolve(0xffffffff81300001ull).name == "last_no_newline");
  CHECK(some.size() <= 10);
  // An address it was not prepared for: the whole file is read, and kept.
  CHECK(some.resolve(0xffffffff81100000ull + 0x40 * 17 + 1).name == "filler_17");
  CHECK(some.size() == whole.size());
  ::unlink(path.c_str());
}

TEST_CASE("kernel symbols: a table's kernel lookups are its kernel pcs, return addresses less one") {
  selfprof::detail::stack_table table;
  const std::uint64_t a[] = {0xffffffff81001234ull, 0xffffffff81002000ull, 0x401000ull};  // leaf first
  const std::uint64_t b[] = {0x401234ull, 0x402000ull};
  const std::uint64_t vsyscall[] = {0xffffffffff600400ull};  // the vsyscall page is not the kernel's code
  REQUIRE(table.add(1, 0, a, 3, 1));
  REQUIRE(table.add(1, 0, b, 2, 5));
  REQUIRE(table.add(2, 0, vsyscall, 1, 1));
  std::vector<std::uint64_t> out;
  selfprof::detail::append_kernel_lookups(table, out);
  std::sort(out.begin(), out.end());
  CHECK(out == std::vector<std::uint64_t>{0xffffffff81001234ull, 0xffffffff81001fffull});
}

TEST_CASE("kernel symbols: hidden addresses and a missing file name frames [kernel]") {
  const std::string path =
      kernel_symbols_test::write_kallsyms("0000000000000000 T _stext\n0000000000000000 t do_syscall_64\n");
  selfprof::detail::kernel_symbols k;
  k.load(path.c_str());
  ::unlink(path.c_str());
  CHECK(k.size() == 0);
  CHECK(k.resolve(0xffffffff81001234ull).name == "[kernel]");
  selfprof::detail::kernel_symbols missing;
  missing.load("/nonexistent/kallsyms");
  const selfprof::frame f = missing.resolve(0xffffffff81001234ull);
  CHECK(f.name == "[kernel]");
  CHECK(f.kind == selfprof::frame_kind::kernel);
}

TEST_CASE("kernel addresses: told apart from user code and from selfprof's tagged pcs") {
  using selfprof::detail::is_kernel_address;
  CHECK(is_kernel_address(0xffffffff81000000ull));
  CHECK(is_kernel_address(0xffff800000000000ull));
  CHECK_FALSE(is_kernel_address(0x00007fffffffe000ull));
  CHECK_FALSE(is_kernel_address(0xffffffffff600010ull));  // x86-64's [vsyscall], a user mapping
  CHECK_FALSE(is_kernel_address(0x0000555555554000ull));
  CHECK_FALSE(is_kernel_address(selfprof::detail::kMemoryCeilingPc));
  CHECK_FALSE(is_kernel_address(std::uint64_t{0xfd} << 56));  // perf map tag
  CHECK_FALSE(is_kernel_address(selfprof::detail::jit_tag_marker | 1));
}
