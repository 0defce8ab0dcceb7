// The raw dumps of `selfprof record --follow-exec` (include/selfprof/dump/raw_dump.hpp) and their reader
// and merger (tools/selfprof/raw_merge.hpp): a dump of this process names its frames as this process
// would, totals hold every process's samples, bad input is refused with the file and line, and a file
// changed since the process exited is named by offset, never by its new symbols.
#include <doctest/doctest.h>

#include <dlfcn.h>
#include <fcntl.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>

#include <selfprof/dump/raw_dump.hpp>

#include "raw_merge.hpp"

using namespace selfprof_cli;

namespace {

__attribute__((noinline)) int raw_merge_test_marker(int x) { return x * 3 + 1; }

selfprof::detail::raw_snapshot one_stack(std::uint64_t pc, std::uint64_t count) {
  selfprof::detail::raw_snapshot r;
  r.table.add(static_cast<std::uint32_t>(::getpid()), 0, &pc, 1, count);
  r.thread_names[static_cast<std::uint32_t>(::getpid())] = "main";
  r.info.hz = 99;
  r.info.source = "perf";
  r.info.start_unix_ns = 1000000000;
  r.info.duration_s = 1;
  return r;
}

std::string folded_names(const selfprof::profile& p, const selfprof::stack& s) {
  std::string out;
  for (std::uint32_t f : s.frames) out += (out.empty() ? "" : ";") + p.frames[f].name;
  return out;
}

}  // namespace

TEST_CASE(
    "raw merge: a raw dump of this process names its frames; roots are the process names; totals add up") {
  selfprof::detail::shared_symbolizer sym;
  const auto pc = reinterpret_cast<std::uint64_t>(&raw_merge_test_marker) + 1;
  const std::string text = selfprof::detail::raw_dump_bytes(one_stack(pc, 5), sym, "tester");
  raw_process p;
  selfprof::status st = parse_raw_dump(text, "a.selfprof-raw", p);
  REQUIRE_MESSAGE(st, st.message());
  CHECK(p.pid == static_cast<std::uint32_t>(::getpid()));
  CHECK(p.comm == "tester");
  raw_merger m(false);
  m.add(p);
  p.comm = "other";
  m.add(p);
  selfprof::profile out = m.take(1);
  REQUIRE(out.stacks.size() == 2);
  CHECK(out.info.samples == 10);
  CHECK(folded_names(out, out.stacks[0]).find("tester;") == 0);
  CHECK(folded_names(out, out.stacks[0]).find("raw_merge_test_marker") != std::string::npos);
  CHECK(folded_names(out, out.stacks[1]).find("other;") == 0);
  bool lost_noted = false;
  for (const std::string& n : out.info.notes)
    lost_noted = lost_noted || n.find("1 processes' raw dumps") == 0;
  CHECK(lost_noted);

  raw_merger pid_roots(true);
  p.comm = "tester";
  pid_roots.add(p);
  selfprof::profile q = pid_roots.take(0);
  CHECK(folded_names(q, q.stacks[0]).find("tester [" + std::to_string(::getpid()) + "];") == 0);
}

TEST_CASE("raw merge: a dump without samples reads no mappings and still counts its process") {
  selfprof::detail::shared_symbolizer sym;
  const auto pc = reinterpret_cast<std::uint64_t>(&raw_merge_test_marker) + 1;
  const std::string sampled = selfprof::detail::raw_dump_bytes(one_stack(pc, 2), sym, "busy");
  CHECK(sampled.find("\nmap ") != std::string::npos);
  CHECK(sampled.find("\nthread ") != std::string::npos);
  selfprof::detail::raw_snapshot none = one_stack(pc, 1);
  none.table = selfprof::detail::stack_table();
  none.thread_names.clear();
  const std::string text = selfprof::detail::raw_dump_bytes(none, sym, "short");
  CHECK(text.find("\nmap ") == std::string::npos);
  CHECK(text.find("\nend 0 0\n") != std::string::npos);
  raw_process p;
  selfprof::status st = parse_raw_dump(text, "b.selfprof-raw", p);
  REQUIRE_MESSAGE(st, st.message());
  CHECK(p.comm == "short");
  raw_merger m(false);
  m.add(p);
  selfprof::profile out = m.take(1);
  CHECK(out.info.samples == 0);
  CHECK(out.stacks.empty());
}

TEST_CASE("raw merge: a profile per process has no root and no merge note; its mergers share one naming") {
  selfprof::detail::shared_symbolizer sym;
  const auto pc = reinterpret_cast<std::uint64_t>(&raw_merge_test_marker) + 1;
  raw_process p;
  selfprof::status st =
      parse_raw_dump(selfprof::detail::raw_dump_bytes(one_stack(pc, 3), sym, "one"), "a", p);
  REQUIRE_MESSAGE(st, st.message());
  auto naming = std::make_shared<raw_naming>();
  naming->prepare_kernel({p});
  raw_merger first(raw_roots::none, naming), second(raw_roots::none, naming);
  first.add(p);
  const std::size_t files_after_first = naming->files->size();
  second.add(p);
  CHECK(naming->files->size() == files_after_first);  // the file's symbols were read once, for both
  CHECK(files_after_first >= 1);
  for (raw_merger* m : {&first, &second}) {
    selfprof::profile out = m->take(0, false);
    REQUIRE(out.stacks.size() == 1);
    CHECK(out.info.samples == 3);
    const std::string names = folded_names(out, out.stacks[0]);
    CHECK_MESSAGE(names.find(';') == std::string::npos, names);  // the leaf alone: no root frame
    CHECK_MESSAGE(names.find("raw_merge_test_marker") != std::string::npos, names);
    for (const std::string& n : out.info.notes) CHECK(n.find("processes merged") == std::string::npos);
  }
}

TEST_CASE("raw merge: bad input is refused with the file and the line") {
  const std::string good =
      "selfprof-raw 1\npid 12\ncomm x\ninfo cpu samples 99 1000 0 5 0.5 1 perf\n"
      "map 1000 2000 0 fe:1 7 5 10 /nonexistent/lib.so\nthread 12 x\nstack 12 0 3 1010 1020\nend 1 3\n";
  raw_process p;
  REQUIRE(parse_raw_dump(good, "g", p));
  struct bad_case {
    std::string text, want;
  } cases[] = {
      {"selfprof-raw 2\n", "f:1: not a selfprof raw dump"},
      {good.substr(0, good.size() - 1), "f:8: the last line has no newline"},
      {good.substr(0, good.find("end")), "no 'end' line"},
      {"selfprof-raw 1\npid x\n", "f:2: bad pid"},
      {"selfprof-raw 1\npid 12\ninfo cpu samples 99 1000 0 5 0.5 1 perf\nstack 12 0 3 10zz\n",
       "f:4: bad address '10zz'"},
      {"selfprof-raw 1\npid 12\ninfo cpu samples 99 1000 0 5 0.5 1 perf\nstack 12 0 3 10\nend 1 4\n",
       "f:5: 'end' says 1 stacks of 4 samples, the file holds 1 of 3"},
      {"selfprof-raw 1\npid 12\ninfo cpu samples 99 1000 0 5 0.5 1 perf\nmap 2000 1000 0 0:0 0 - - /x\n",
       "f:4: bad map range"},
      {"selfprof-raw 1\npid 12\nbogus 1\n", "f:3: unknown record 'bogus'"},
      {good + "stack 12 0 1 10\n", "f:9: a line after 'end'"},
      {"", "f:0: empty file"},
  };
  for (const bad_case& c : cases) {
    selfprof::status st = parse_raw_dump(c.text, "f", p);
    CHECK_FALSE(st);
    CHECK_MESSAGE(st.message().find(c.want) != std::string::npos, st.message()
                                                                      << " (want: " << c.want << ")");
  }
}

TEST_CASE("raw merge: a file changed after the process exited is named by offset, not by its symbols") {
  // A private copy of zlib, loaded: its dump names zlibVersion while the file is unchanged, and
  // [copy+0xoffset] once its modification time moved (the file is no longer known to be the one mapped).
  void* z = ::dlopen("libz.so.1", RTLD_NOW | RTLD_LOCAL);
  Dl_info info{};
  if (z == nullptr || ::dladdr(::dlsym(z, "zlibVersion"), &info) == 0 || info.dli_fname == nullptr) {
    MESSAGE("skipped: no libz.so.1 to copy");
    return;
  }
  char dir[] = "/tmp/raw_merge_test-XXXXXX";
  REQUIRE(::mkdtemp(dir) != nullptr);
  const std::string copy = std::string(dir) + "/libzcopy.so";
  {
    std::FILE* in = std::fopen(info.dli_fname, "rb");
    std::FILE* out = std::fopen(copy.c_str(), "wb");
    REQUIRE((in && out));
    char buf[65536];
    for (std::size_t n; (n = std::fread(buf, 1, sizeof buf, in)) > 0;) std::fwrite(buf, 1, n, out);
    std::fclose(in);
    std::fclose(out);
  }
  void* c = ::dlopen(copy.c_str(), RTLD_NOW | RTLD_LOCAL);
  REQUIRE(c != nullptr);
  const auto pc = reinterpret_cast<std::uint64_t>(::dlsym(c, "zlibVersion")) + 1;
  selfprof::detail::shared_symbolizer sym;
  const std::string text = selfprof::detail::raw_dump_bytes(one_stack(pc, 2), sym, "z");
  raw_process p;
  REQUIRE(parse_raw_dump(text, "z.selfprof-raw", p));
  auto named = [&]() {
    raw_merger m(false);
    m.add(p);
    selfprof::profile out = m.take(0);
    REQUIRE(out.stacks.size() == 1);
    return folded_names(out, out.stacks[0]);
  };
  CHECK(named() == "z;zlibVersion");
  struct timespec times[2] = {{0, UTIME_OMIT}, {12345, 0}};
  REQUIRE(::utimensat(AT_FDCWD, copy.c_str(), times, 0) == 0);
  const std::string stale = named();
  CHECK(stale.find("z;[libzcopy.so+0x") == 0);
  ::dlclose(c);
  ::dlclose(z);
  ::unlink(copy.c_str());
  ::rmdir(dir);
}
