// Unit tests of include/selfprof/jit/jitdump_writer.hpp: the jit-<pid>.dump layout perf inject reads.
#include <doctest/doctest.h>

#include <cstdint>
#include <cstring>
#include <string>

#include <selfprof/jit/jitdump_writer.hpp>

#include "test_support.hpp"

using selfprof::detail::append_jitdump_code_load;
using selfprof::detail::jitdump_writer;

namespace {

template <typename T>
T get(const std::string& s, std::size_t& pos) {
  T v{};
  REQUIRE(pos + sizeof(T) <= s.size());
  std::memcpy(&v, s.data() + pos, sizeof(T));
  pos += sizeof(T);
  return v;
}

bool mapped_executable(const std::string& path) {
  std::string maps = jit_test::read_file("/proc/self/maps");
  std::size_t at = maps.find(path);
  if (at == std::string::npos) return false;
  std::size_t line = maps.rfind('\n', at);
  line = line == std::string::npos ? 0 : line + 1;
  std::string perms = maps.substr(maps.find(' ', line) + 1, 4);
  return perms[0] == 'r' && perms[2] == 'x' && perms[3] == 'p';
}

}  // namespace

TEST_CASE("jitdump: header and CODE_LOAD records follow the spec, with the code bytes") {
  jit_test::temp_dir dir;
  long pid = jit_test::fake_pid();
  jitdump_writer w(dir.path, pid);
  CHECK(w.path() == dir.path + "/jit-" + std::to_string(pid) + ".dump");
  selfprof::status st = w.open(123456789);
  REQUIRE_MESSAGE(st, st.message());
  CHECK(mapped_executable(w.path()));  // what perf record turns into the MMAP2 event it looks for
  const unsigned char code[] = {0x55, 0x48, 0x89, 0xe5, 0x5d, 0xc3};
  std::string records;
  append_jitdump_code_load(records, static_cast<std::uint32_t>(pid), 77, 0x7f0000001000, sizeof code, 0,
                           "jit_one", code, 200000000);
  append_jitdump_code_load(records, static_cast<std::uint32_t>(pid), 78, 0x7f0000002000, 64, 1, "jit_two",
                           nullptr, 300000000);
  REQUIRE(w.write(records));
  std::string path = w.path();
  w.close();
  CHECK_FALSE(mapped_executable(path));

  std::string f = jit_test::read_file(path);
  std::size_t pos = 0;
  CHECK(get<std::uint32_t>(f, pos) == 0x4A695444u);
  CHECK(get<std::uint32_t>(f, pos) == 1u);
  CHECK(get<std::uint32_t>(f, pos) == 40u);
#if defined(__x86_64__)
  CHECK(get<std::uint32_t>(f, pos) == 62u);
#else
  get<std::uint32_t>(f, pos);
#endif
  CHECK(get<std::uint32_t>(f, pos) == 0u);
  CHECK(get<std::uint32_t>(f, pos) == static_cast<std::uint32_t>(pid));
  CHECK(get<std::uint64_t>(f, pos) == 123456789u);
  CHECK(get<std::uint64_t>(f, pos) == 0u);
  REQUIRE(pos == 40);

  std::size_t rec = pos;
  CHECK(get<std::uint32_t>(f, pos) == 0u);  // JIT_CODE_LOAD
  std::uint32_t total = get<std::uint32_t>(f, pos);
  CHECK(total == 16 + 40 + 8 + sizeof code);  // prefix, fixed fields, "jit_one\0", code
  CHECK(get<std::uint64_t>(f, pos) == 200000000u);
  CHECK(get<std::uint32_t>(f, pos) == static_cast<std::uint32_t>(pid));
  CHECK(get<std::uint32_t>(f, pos) == 77u);
  CHECK(get<std::uint64_t>(f, pos) == 0x7f0000001000u);  // vma
  CHECK(get<std::uint64_t>(f, pos) == 0x7f0000001000u);  // code_addr
  CHECK(get<std::uint64_t>(f, pos) == sizeof code);
  CHECK(get<std::uint64_t>(f, pos) == 0u);  // code_index
  CHECK(std::string(f.c_str() + pos) == "jit_one");
  pos += 8;
  CHECK(std::memcmp(f.data() + pos, code, sizeof code) == 0);
  pos += sizeof code;
  CHECK(pos == rec + total);

  rec = pos;
  CHECK(get<std::uint32_t>(f, pos) == 0u);
  total = get<std::uint32_t>(f, pos);
  CHECK(total == 16 + 40 + 8);  // no bytes given: code_size 0
  pos = rec + 16 + 8 + 8 + 8;
  CHECK(get<std::uint64_t>(f, pos) == 0u);  // code_size
  CHECK(get<std::uint64_t>(f, pos) == 1u);  // code_index
  CHECK(rec + total == f.size());
}

TEST_CASE("jitdump: a symlink where the dump goes is refused") {
  jit_test::temp_dir dir;
  long pid = jit_test::fake_pid();
  jitdump_writer w(dir.path, pid);
  std::string target = dir.file("target");
  jit_test::write_file(target, "x");
  REQUIRE(::symlink(target.c_str(), w.path().c_str()) == 0);
  selfprof::status st = w.open(1);
  REQUIRE_FALSE(st);
  CHECK(st.message().find("symbolic link") != std::string::npos);
  CHECK(jit_test::read_file(target) == "x");
}

TEST_CASE("jitdump: an empty directory setting means the current directory") {
  CHECK(jitdump_writer::path_for("", 12) == "./jit-12.dump");
  CHECK(jitdump_writer::path_for("/d/", 12) == "/d/jit-12.dump");
}
