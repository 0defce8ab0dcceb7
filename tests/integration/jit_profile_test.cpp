// JIT code sampled for real: machine code generated at run time is named in selfprof's profiles (`_[j]`
// in folded output), registration from 8 threads while sampling, the example's flame graph, and — as
// root with perf installed — `perf report` naming the code from /tmp/perf-<pid>.map and from a jitdump
// after `perf inject --jit`. x86-64 only (the test emits x86-64 machine code).
// ctest-labels: no_tsan
// Not under TSan: it defers asynchronous signals to its next safe point, so a deferred handler walks
// a stack that is no longer the interrupted one; and it kills children that start threads after fork.
#include <doctest/doctest.h>

#include <limits.h>
#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <selfprof/jit.hpp>

#include "workload.hpp"

namespace {

using jit_fn = std::uint64_t (*)(std::uint64_t);

struct jit_program {
  struct fn {
    std::string name;
    jit_fn call = nullptr;
    unsigned weight = 1;
  };
  std::vector<fn> fns;
  void* page = nullptr;

  // Emits jit_sum_by_3/7/11 (called 1:2:3 times per round) into one anonymous page and registers them.
  bool build() {
#if defined(__x86_64__)
    page = ::mmap(nullptr, 4096, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (page == MAP_FAILED) return false;
    const std::int32_t ks[] = {3, 7, 11};
    std::vector<std::size_t> sizes;
    for (int i = 0; i < 3; ++i) {
      std::vector<unsigned char> code = wl::emit_sum_by(ks[i]);
      std::memcpy(static_cast<unsigned char*>(page) + 64 * i, code.data(), code.size());
      sizes.push_back(code.size());
    }
    if (::mprotect(page, 4096, PROT_READ | PROT_EXEC) != 0) return false;
    for (int i = 0; i < 3; ++i) {
      unsigned char* at = static_cast<unsigned char*>(page) + 64 * i;
      fn f;
      f.name = "jit_sum_by_" + std::to_string(ks[i]);
      f.call = reinterpret_cast<jit_fn>(reinterpret_cast<std::uintptr_t>(at));
      f.weight = static_cast<unsigned>(i + 1);
      if (!selfprof::jit::add(at, sizes[static_cast<std::size_t>(i)], f.name)) return false;
      fns.push_back(f);
    }
    return true;
#else
    return false;
#endif
  }

  // Runs rounds until this thread has spent `cpu_ns` of CPU.
  std::uint64_t run(std::int64_t cpu_ns) {
    std::uint64_t sink = 0;
    std::int64_t start = wl::thread_cpu_ns();
    while (wl::thread_cpu_ns() - start < cpu_ns)
      for (auto& f : fns)
        for (unsigned w = 0; w < f.weight; ++w) sink += call(f.call, 1000000);
    return sink;
  }

  WL_NOINLINE static std::uint64_t call(jit_fn f, std::uint64_t n) {
    std::uint64_t r = f(n);
    WL_NO_TAIL();
    return r;
  }
};

std::string read_text(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::string run_command(const std::string& cmd) {
  std::string out;
  if (FILE* p = ::popen(cmd.c_str(), "r")) {
    char buf[4096];
    std::size_t n;
    while ((n = std::fread(buf, 1, sizeof buf, p)) > 0) out.append(buf, n);
    ::pclose(p);
  }
  return out;
}

std::string self_exe() {
  char buf[PATH_MAX];
  ssize_t n = ::readlink("/proc/self/exe", buf, sizeof buf - 1);
  return n > 0 ? std::string(buf, static_cast<std::size_t>(n)) : std::string();
}

std::string make_temp_dir() {
  char tmpl[] = "/tmp/selfprof-jit-it-XXXXXX";
  return ::mkdtemp(tmpl) ? std::string(tmpl) : std::string();
}

std::uint64_t jit_samples(const selfprof::profile& p, const std::string& name) {
  std::uint64_t n = 0;
  for (const auto& s : p.stacks)
    if (!s.frames.empty()) {
      const selfprof::frame& leaf = p.frames[s.frames.back()];
      if (leaf.kind == selfprof::frame_kind::jit && leaf.name == name) n += s.count;
    }
  return n;
}

// Child mode for the perf tests: `perf record` runs this binary with SELFPROF_JIT_PERF_CHILD=<dir>; it
// runs the JIT program for a while, writes its pid to <dir>/pid and exits before doctest starts.
const bool child_mode = [] {
  const char* dir = std::getenv("SELFPROF_JIT_PERF_CHILD");
  if (dir == nullptr) return false;
  jit_program prog;
  if (!prog.build()) std::exit(2);
  std::uint64_t sink = prog.run(600 * 1000000ll);
  std::ofstream(std::string(dir) + "/pid") << ::getpid() << "\n" << sink << "\n";
  std::exit(selfprof::jit::flush() ? 0 : 3);  // (the exit-time flush would do it too)
}();

bool perf_usable() {
  if (::geteuid() != 0) {
    MESSAGE("skipped: perf record/report of the example runs as root only");
    return false;
  }
  if (run_command("perf --version 2>/dev/null").find("perf version") == std::string::npos) {
    MESSAGE("skipped: perf is not installed");
    return false;
  }
  return true;
}

void remove_tree(const std::string& dir) {
  if (!dir.empty() && dir.rfind("/tmp/selfprof-jit-it-", 0) == 0) run_command("rm -rf '" + dir + "'");
}

}  // namespace

TEST_CASE("jit: generated code is named in selfprof's own profile and folded output (`_[j]`)") {
#if !defined(__x86_64__)
  MESSAGE("skipped: the test emits x86-64 machine code");
  return;
#endif
  wl::apply_test_environment();
  REQUIRE(!child_mode);
  jit_program prog;
  REQUIRE(prog.build());
  selfprof::options o;
  o.hz = 499;
  REQUIRE(selfprof::start(o));
  // Meanwhile 8 threads register (and remove) regions: registration is thread-safe while sampling.
  std::atomic<bool> stop{false};
  std::vector<std::thread> registrars;
  for (int t = 0; t < 8; ++t)
    registrars.emplace_back([t, &stop] {
      std::uint64_t i = 0;
      while (!stop.load() && i < 20000) {
        // Addresses nothing executes: high in the user half, distinct per thread.
        auto at = reinterpret_cast<const void*>(
            static_cast<std::uintptr_t>(0x600000000000ull + (std::uint64_t(t) << 32) + i * 64));
        selfprof::jit::add(at, 48, "jit_bulk_" + std::to_string(t) + "_" + std::to_string(i));
        if (i % 2 == 0) selfprof::jit::remove(at);
        ++i;
      }
    });
  std::uint64_t sink = prog.run(800 * 1000000ll);
  stop.store(true);
  for (auto& r : registrars) r.join();
  REQUIRE(selfprof::jit::flush());
  selfprof::profile p = selfprof::snapshot();
  std::string dir = make_temp_dir();
  std::string folded_path = dir + "/jit.folded";
  selfprof::status st = selfprof::dump(folded_path);
  selfprof::stop();
  REQUIRE_MESSAGE(st, st.message());
  std::string folded = read_text(folded_path);
  std::string map_path = selfprof::jit::perf_map_path();
  std::string map = read_text(map_path);
  ::unlink(map_path.c_str());
  remove_tree(dir);

  std::uint64_t s3 = jit_samples(p, "jit_sum_by_3"), s7 = jit_samples(p, "jit_sum_by_7"),
                s11 = jit_samples(p, "jit_sum_by_11");
  std::uint64_t all = 0;
  for (const auto& s : p.stacks) all += s.count;
  MESSAGE("samples " << all << ": by_3 " << s3 << ", by_7 " << s7 << ", by_11 " << s11 << " (checksum "
                     << sink << ")");
  CHECK(s3 > 0);
  CHECK(s7 > 0);
  CHECK(s11 > 0);
  CHECK(s11 > s3);                                   // called three times as often
  CHECK(double(s3 + s7 + s11) > 0.5 * double(all));  // the main thread spends its time there
  CHECK(folded.find(";jit_sum_by_3_[j] ") != std::string::npos);
  CHECK(folded.find(";jit_sum_by_7_[j] ") != std::string::npos);
  CHECK(folded.find(";jit_sum_by_11_[j] ") != std::string::npos);
  // The JIT frame sits below its caller: the unwinder walked through the generated frame.
  CHECK(folded.find("call(unsigned long (*)(unsigned long), unsigned long);jit_sum_by_11_[j]") !=
        std::string::npos);
  // Every registration reached the perf map: 3 functions + 8 threads x 20000 (or fewer if stopped early).
  std::size_t lines = 0;
  for (char c : map) lines += c == '\n';
  CHECK(lines >= 3);
  CHECK(map.find(" jit_sum_by_11\n") != std::string::npos);
  CHECK(map.find(" jit_bulk_7_0\n") != std::string::npos);
}

TEST_CASE("jit: the example writes a flame graph naming its JIT functions") {
#if !defined(__x86_64__)
  MESSAGE("skipped: the example emits x86-64 machine code");
  return;
#endif
  std::string exe = self_exe();
  std::string base = exe.substr(0, exe.rfind('/'));
  std::string example;
  const char* env = std::getenv("SELFPROF_EXAMPLE_JIT");
  for (std::string c : {env ? std::string(env) : std::string(), base + "/../example_jit",
                        base + "/example_jit", base + "/../examples/example_jit"})
    if (!c.empty() && ::access(c.c_str(), X_OK) == 0) {
      example = c;
      break;
    }
  if (example.empty()) {
    MESSAGE("skipped: example_jit not found next to " << base
                                                      << " (build with SELFPROF_BUILD_EXAMPLES or set "
                                                         "SELFPROF_EXAMPLE_JIT)");
    return;
  }
  std::string dir = make_temp_dir();
  std::string out = run_command("cd '" + dir + "' && '" + example + "' --seconds 1 " + dir + "/jit.svg," +
                                dir + "/jit.folded 2>&1");
  std::string folded = read_text(dir + "/jit.folded");
  std::string svg = read_text(dir + "/jit.svg");
  std::size_t at = out.find("perf map ");
  if (at != std::string::npos) ::unlink(out.substr(at + 9, out.find('\n', at) - at - 9).c_str());
  remove_tree(dir);
  INFO(out);
  CHECK(folded.find("jit_sum_by_3_[j] ") != std::string::npos);
  CHECK(folded.find("jit_sum_by_7_[j] ") != std::string::npos);
  CHECK(folded.find("jit_sum_by_11_[j] ") != std::string::npos);
  CHECK(svg.find("jit_sum_by_11") != std::string::npos);
}

TEST_CASE("jit: perf record + perf report name the JIT code from /tmp/perf-<pid>.map") {
  if (!perf_usable()) return;
#if !defined(__x86_64__)
  return;
#endif
  std::string dir = make_temp_dir();
  std::string cmd = "SELFPROF_JIT_PERF_CHILD='" + dir + "' perf record -q -g -o '" + dir +
                    "/perf.data' -- '" + self_exe() + "' >'" + dir + "/record.log' 2>&1; echo rc=$?";
  std::string rec = run_command(cmd);
  std::string pid = read_text(dir + "/pid");
  pid = pid.substr(0, pid.find('\n'));
  std::string report =
      run_command("perf report -i '" + dir + "/perf.data' --stdio --no-children --sort sym 2>&1");
  std::string map_path = "/tmp/perf-" + pid + ".map";
  std::string map = read_text(map_path);
  if (!pid.empty()) ::unlink(map_path.c_str());
  INFO(rec << read_text(dir + "/record.log"));
  remove_tree(dir);
  REQUIRE(!pid.empty());
  CHECK(map.find(" jit_sum_by_3\n") != std::string::npos);
  INFO(report.substr(0, 4000));
  CHECK(report.find("jit_sum_by_3") != std::string::npos);
  CHECK(report.find("jit_sum_by_7") != std::string::npos);
  CHECK(report.find("jit_sum_by_11") != std::string::npos);
}

TEST_CASE("jit: with SELFPROF_JITDUMP=1, perf record -k 1 + perf inject --jit name and place the code") {
  if (!perf_usable()) return;
#if !defined(__x86_64__)
  return;
#endif
  std::string dir = make_temp_dir();
  std::string cmd = "SELFPROF_JIT_PERF_CHILD='" + dir +
                    "' SELFPROF_PERF_MAP=0 SELFPROF_JITDUMP=1 SELFPROF_JITDUMP_DIR='" + dir +
                    "' perf record -q -k 1 -g -o '" + dir + "/perf.data' -- '" + self_exe() + "' >'" + dir +
                    "/record.log' 2>&1; perf inject --jit -i '" + dir + "/perf.data' -o '" + dir +
                    "/perf.jit.data' 2>&1; echo rc=$?";
  std::string rec = run_command(cmd);
  std::string pid = read_text(dir + "/pid");
  pid = pid.substr(0, pid.find('\n'));
  std::string report =
      run_command("perf report -i '" + dir + "/perf.jit.data' --stdio --no-children --sort dso,sym 2>&1");
  std::string dump = read_text(dir + "/jit-" + pid + ".dump");
  bool map_written = !pid.empty() && ::access(("/tmp/perf-" + pid + ".map").c_str(), F_OK) == 0;
  INFO(rec << read_text(dir + "/record.log"));
  remove_tree(dir);
  REQUIRE(!pid.empty());
  CHECK_FALSE(map_written);  // SELFPROF_PERF_MAP=0
  CHECK(dump.size() > 40);
  INFO(report.substr(0, 4000));
  CHECK(report.find("jitted-" + pid + "-") != std::string::npos);  // the ELF files perf inject made
  CHECK(report.find("jit_sum_by_3") != std::string::npos);
  CHECK(report.find("jit_sum_by_11") != std::string::npos);
}
