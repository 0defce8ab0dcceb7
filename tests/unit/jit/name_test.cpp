// Unit tests of include/selfprof/jit/name.hpp: JIT names as perf and selfprof accept them.
#include <doctest/doctest.h>

#include <selfprof/jit/name.hpp>

#include <string>

using selfprof::detail::jit_name_max;
using selfprof::detail::sanitize_jit_name;

TEST_CASE("jit name: ordinary names pass unchanged") {
  CHECK(sanitize_jit_name("lua:fib") == "lua:fib");
  CHECK(sanitize_jit_name("LazyCompile:*fn file.js:12") == "LazyCompile:*fn file.js:12");
  CHECK(sanitize_jit_name("Lpkg/Class;::method") == "Lpkg/Class;::method");  // ';' is the writers' business
  CHECK(sanitize_jit_name("h\xc3\xa9llo") == "h\xc3\xa9llo");                // UTF-8 kept
}

TEST_CASE("jit name: newline, NUL and control bytes become underscores") {
  CHECK(sanitize_jit_name(std::string("a\nb\rc\0d\te\x7f", 10)) == "a_b_c_d_e_");
  CHECK(sanitize_jit_name("evil\n7f0000000000 10 injected") == "evil_7f0000000000 10 injected");
}

TEST_CASE("jit name: names shorter than three characters are made visible to perf") {
  CHECK(sanitize_jit_name("") == "jit:anonymous");
  CHECK(sanitize_jit_name("f") == "jit:f");
  CHECK(sanitize_jit_name("fn") == "jit:fn");
  CHECK(sanitize_jit_name("fib") == "fib");
  CHECK(sanitize_jit_name(std::string("\n", 1)) == "jit:_");
}

TEST_CASE("jit name: long names are cut on a UTF-8 boundary and marked") {
  std::string ascii(jit_name_max + 100, 'x');
  std::string a = sanitize_jit_name(ascii);
  CHECK(a.size() == jit_name_max);
  CHECK(a.substr(a.size() - 3) == "...");
  CHECK(sanitize_jit_name(std::string(jit_name_max, 'y')) ==
        std::string(jit_name_max, 'y'));  // exactly max: kept
  // Two-byte characters placed so that the cut falls inside one.
  std::string wide = "x";
  while (wide.size() < jit_name_max + 10) wide += "\xc3\xa9";
  std::string w = sanitize_jit_name(wide);
  CHECK(w.size() <= jit_name_max);
  std::string body = w.substr(0, w.size() - 3);
  CHECK((static_cast<unsigned char>(body.back()) & 0xc0) != 0xc0);  // does not end on a lead byte
  CHECK(body.size() % 2 == 1);                                      // "x" + whole two-byte characters
}
