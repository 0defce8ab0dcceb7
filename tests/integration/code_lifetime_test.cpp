// Code whose address means different things over time, sampled for real: a JIT that reuses an address
// and says so in /tmp/perf-<pid>.map (each sample named by the line current when it was taken, not by
// the last line), and code mapped straight from a file and unmapped before the profile is written (named
// by the file's symbols all the same). x86-64 only (the test emits x86-64 machine code).
// ctest-labels: no_tsan
// Not under TSan: the remapped copy of the test binary calls TSan's function-entry hooks through a PLT
// that is not mapped beside it.
#include <doctest/doctest.h>

#include <fcntl.h>
#include <link.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include <selfprof.hpp>

#include "workload.hpp"

namespace code_lifetime {

using code_fn = std::uint64_t (*)(std::uint64_t);

WL_NOINLINE std::uint64_t call_code(code_fn f, std::uint64_t n) {
  std::uint64_t r = f(n);
  WL_NO_TAIL();
  return r;
}

std::uint64_t run_for(code_fn f, std::int64_t cpu_ns) {
  std::uint64_t sink = 0;
  const std::int64_t start = wl::thread_cpu_ns();
  while (wl::thread_cpu_ns() - start < cpu_ns) sink += call_code(f, 200000);
  return sink;
}

bool append_line(const std::string& path, std::uintptr_t at, std::size_t size, const char* name) {
  std::FILE* f = std::fopen(path.c_str(), "a");
  if (f == nullptr) return false;
  std::fprintf(f, "%lx %zx %s\n", static_cast<unsigned long>(at), size, name);
  return std::fclose(f) == 0;
}

// Samples whose leaf is named `name` and lies in [lo, hi).
std::uint64_t leaf_samples(const selfprof::profile& p, const std::string& name, std::uint64_t lo,
                           std::uint64_t hi) {
  std::uint64_t n = 0;
  for (const auto& s : p.stacks) {
    if (s.frames.empty()) continue;
    const selfprof::frame& leaf = p.frames[s.frames.back()];
    if (leaf.name.find(name) != std::string::npos && leaf.address >= lo && leaf.address < hi) n += s.count;
  }
  return n;
}

// A pure loop (no calls, no data): it runs the same from a second mapping of this binary's code.
extern "C" __attribute__((noinline, no_sanitize("address", "undefined"))) std::uint64_t selfprof_remap_hot(
    std::uint64_t n) {
  std::uint64_t s = 0;
  for (std::uint64_t i = 0; i < n; ++i) {
    s += i * 2654435761u;
    __asm__ volatile("" : "+r"(s));
  }
  return s;
}

struct exec_segment {
  std::uintptr_t base = 0;  // load bias
  const ElfW(Phdr) * phdr = nullptr;
};

int find_main_exec_segment(struct dl_phdr_info* info, std::size_t, void* data) {
  auto* out = static_cast<exec_segment*>(data);
  const auto fn = reinterpret_cast<std::uintptr_t>(&selfprof_remap_hot);
  for (int i = 0; i < info->dlpi_phnum; ++i) {
    const ElfW(Phdr)& ph = info->dlpi_phdr[i];
    if (ph.p_type != PT_LOAD || (ph.p_flags & PF_X) == 0) continue;
    const std::uintptr_t lo = info->dlpi_addr + ph.p_vaddr;
    if (fn >= lo && fn < lo + ph.p_memsz) {
      out->base = info->dlpi_addr;
      out->phdr = &ph;
      return 1;
    }
  }
  return 0;
}

}  // namespace code_lifetime

using namespace code_lifetime;

TEST_CASE("perf map: a JIT address reused for other code is named by the line current at each sample") {
#if !defined(__x86_64__)
  MESSAGE("skipped: the test emits x86-64 machine code");
  return;
#endif
  wl::apply_test_environment();
  void* page = ::mmap(nullptr, 4096, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  REQUIRE(page != MAP_FAILED);
  const auto at = reinterpret_cast<std::uintptr_t>(page);
  const std::string map_path = "/tmp/perf-" + std::to_string(::getpid()) + ".map";
  ::unlink(map_path.c_str());
  std::vector<unsigned char> first = wl::emit_sum_by(3), second = wl::emit_sum_by(7);
  std::memcpy(page, first.data(), first.size());
  REQUIRE(::mprotect(page, 4096, PROT_READ | PROT_EXEC) == 0);
  REQUIRE(append_line(map_path, at, first.size(), "jit_first_tenant"));

  selfprof::options o;
  o.hz = 499;
  REQUIRE(selfprof::start(o));
  auto fn = reinterpret_cast<code_fn>(at);
  std::uint64_t sink = run_for(fn, 700 * 1000000ll);
  // The JIT places other code at the same address, then writes its line (as node does).
  REQUIRE(::mprotect(page, 4096, PROT_READ | PROT_WRITE) == 0);
  std::memcpy(page, second.data(), second.size());
  REQUIRE(::mprotect(page, 4096, PROT_READ | PROT_EXEC) == 0);
  REQUIRE(append_line(map_path, at, second.size(), "jit_second_tenant"));
  sink += run_for(fn, 700 * 1000000ll);
  selfprof::profile p = selfprof::snapshot();
  selfprof::stop();
  ::unlink(map_path.c_str());
  ::munmap(page, 4096);

  const std::uint64_t a = leaf_samples(p, "jit_first_tenant", at, at + 4096);
  const std::uint64_t b = leaf_samples(p, "jit_second_tenant", at, at + 4096);
  MESSAGE("first tenant " << a << ", second tenant " << b << " of " << wl::total_samples(p)
                          << " samples (sink " << (sink & 1) << ")");
  if (a + b < 100) {
    MESSAGE("skipped: too few samples on this machine to compare the tenants");
    return;
  }
  // Equal CPU time each; before, every sample went to the last line (a == 0).
  CHECK(a * 4 >= a + b);
  CHECK(b * 4 >= a + b);
}

TEST_CASE("modules: code mapped from a file without the loader, then unmapped, keeps its symbols") {
#if !defined(__x86_64__)
  MESSAGE("skipped: x86-64 only");
  return;
#endif
  wl::apply_test_environment();
  exec_segment seg;
  REQUIRE(::dl_iterate_phdr(find_main_exec_segment, &seg) == 1);
  const ElfW(Phdr)& ph = *seg.phdr;
  const std::uint64_t page = static_cast<std::uint64_t>(::sysconf(_SC_PAGESIZE));
  const std::uint64_t file_off = ph.p_offset & ~(page - 1);
  const std::uint64_t lead = ph.p_offset - file_off;
  const std::uint64_t len = ph.p_memsz + lead;
  const std::uintptr_t seg_lo = seg.base + ph.p_vaddr - lead;  // where file_off is mapped by the loader

  selfprof::options o;
  o.hz = 499;
  REQUIRE(selfprof::start(o));
  // Sample known code first, so the collector has scanned the modules before the new mapping exists.
  std::uint64_t sink = run_for(&selfprof_remap_hot, 400 * 1000000ll);
  int fd = ::open("/proc/self/exe", O_RDONLY | O_CLOEXEC);
  REQUIRE(fd >= 0);
  void* copy = ::mmap(nullptr, len, PROT_READ | PROT_EXEC, MAP_PRIVATE, fd, static_cast<off_t>(file_off));
  ::close(fd);
  REQUIRE(copy != MAP_FAILED);
  const auto lo = reinterpret_cast<std::uintptr_t>(copy);
  auto remapped =
      reinterpret_cast<code_fn>(lo + (reinterpret_cast<std::uintptr_t>(&selfprof_remap_hot) - seg_lo));
  sink += run_for(remapped, 800 * 1000000ll);
  REQUIRE(::munmap(copy, len) == 0);
  selfprof::profile p = selfprof::snapshot();  // written after the mapping is gone
  selfprof::stop();

  const std::uint64_t named = leaf_samples(p, "selfprof_remap_hot", lo, lo + len);
  const std::uint64_t unknown = leaf_samples(p, "[unknown]", lo, lo + len);
  MESSAGE("in the unmapped copy: " << named << " named, " << unknown << " [unknown] (sink " << (sink & 1)
                                   << ")");
  if (named + unknown < 50) {
    MESSAGE("skipped: too few samples in the copy on this machine");
    return;
  }
  CHECK(named * 10 >= (named + unknown) * 9);
}
