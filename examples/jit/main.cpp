// A tiny x86-64 JIT profiled by selfprof: it writes three loops as machine code into anonymous memory,
// names them with selfprof::jit::add (which also writes /tmp/perf-<pid>.map for perf), runs them while
// sampling, and writes a flame graph in which they appear as jit_sum_by_3/7/11 (`_[j]` in folded output).
//
//   example_jit [--seconds S] [--reuse] [out paths, default jit.svg,jit.folded]
//
// --reuse: halfway through, jit_sum_by_11 is removed and its memory reused for jit_sum_by_13, to show
// that each sample is named by the code that was there when it was taken.
// `perf record -g ./example_jit` + `perf report` names the same functions from the perf map; with
// SELFPROF_JITDUMP=1, `perf record -k 1 -g` + `perf inject --jit` can annotate their instructions.
#include <sys/mman.h>
#include <time.h>

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include <selfprof.hpp>
#include <selfprof/jit.hpp>

namespace {

using jit_fn = std::uint64_t (*)(std::uint64_t n);

// uint64_t f(uint64_t n) { uint64_t s = 0; for (uint64_t i = 0; i < n; ++i) s += i * K; return s; }
// with a frame pointer, so that selfprof's and perf's unwinders walk through it.
std::vector<unsigned char> emit_sum_by(std::int32_t k) {
  std::vector<unsigned char> c = {
      0x55,              // push rbp
      0x48, 0x89, 0xe5,  // mov rbp, rsp
      0x31, 0xc0,        // xor eax, eax
      0x31, 0xc9,        // xor ecx, ecx
      0x48, 0x69, 0xd1,  // loop: imul rdx, rcx, imm32
  };
  for (int i = 0; i < 4; ++i)
    c.push_back(static_cast<unsigned char>((static_cast<std::uint32_t>(k) >> (8 * i)) & 0xff));
  const unsigned char tail[] = {
      0x48, 0x01, 0xd0,  // add rax, rdx
      0x48, 0xff, 0xc1,  // inc rcx
      0x48, 0x39, 0xf9,  // cmp rcx, rdi
      0x72, 0xee,        // jb loop (-18)
      0x5d,              // pop rbp
      0xc3,              // ret
  };
  c.insert(c.end(), tail, tail + sizeof tail);
  return c;
}

struct code_page {
  unsigned char* base = nullptr;
  std::size_t size = 0;
};

#if defined(__clang__)
__attribute__((noinline))
#else
__attribute__((noipa))
#endif
std::uint64_t
call_jit(jit_fn f, std::uint64_t n) {
  std::uint64_t r = f(n);
  __asm__ volatile("" ::: "memory");  // no tail call: keep this frame between main and the JIT code
  return r;
}

double now_s() {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) * 1e-9;
}

}  // namespace

int main(int argc, char** argv) {
#if !defined(__x86_64__)
  std::printf("example_jit emits x86-64 machine code; nothing to do on this machine\n");
  (void)argc;
  (void)argv;
  return 0;
#else
  double seconds = 1.5;
  bool reuse = false;
  std::string out = "jit.svg,jit.folded";
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--seconds" && i + 1 < argc)
      seconds = std::atof(argv[++i]);
    else if (a == "--reuse")
      reuse = true;
    else
      out = a;
  }

  selfprof::status st = SELFPROF_START();
  if (!st) return 1;

  // One anonymous page, written while RW and then made RX (never writable and executable at once).
  code_page page;
  page.size = 4096;
  void* mem = ::mmap(nullptr, page.size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (mem == MAP_FAILED) {
    std::perror("mmap");
    return 1;
  }
  page.base = static_cast<unsigned char*>(mem);
  struct jitted {
    const char* name;
    std::int32_t k;
    unsigned weight;  // calls per round: the flame graph widths go 1 : 2 : 3
    jit_fn fn = nullptr;
    unsigned char* at = nullptr;
    std::size_t size = 0;
  };
  std::vector<jitted> fns = {{"jit_sum_by_3", 3, 1}, {"jit_sum_by_7", 7, 2}, {"jit_sum_by_11", 11, 3}};
  std::size_t offset = 0;
  for (auto& f : fns) {
    std::vector<unsigned char> code = emit_sum_by(f.k);
    f.at = page.base + offset;
    f.size = code.size();
    std::memcpy(f.at, code.data(), code.size());
    offset += (code.size() + 63) & ~std::size_t{63};
  }
  if (::mprotect(page.base, page.size, PROT_READ | PROT_EXEC) != 0) {
    std::perror("mprotect");
    return 1;
  }
  for (auto& f : fns) {
    f.fn = reinterpret_cast<jit_fn>(reinterpret_cast<std::uintptr_t>(f.at));
    selfprof::jit::add(f.at, f.size, f.name);
  }

  std::uint64_t sink = 0;
  const std::uint64_t n = 2000000;  // about a millisecond per call
  double start = now_s();
  bool swapped = false;
  while (now_s() - start < seconds) {
    if (reuse && !swapped && now_s() - start >= seconds / 2) {
      // Free jit_sum_by_11 and put a different function at the same address.
      jitted& f = fns[2];
      selfprof::jit::remove(f.at);
      ::mprotect(page.base, page.size, PROT_READ | PROT_WRITE);
      std::vector<unsigned char> code = emit_sum_by(13);
      std::memcpy(f.at, code.data(), code.size());
      ::mprotect(page.base, page.size, PROT_READ | PROT_EXEC);
      f.name = "jit_sum_by_13";
      selfprof::jit::add(f.at, code.size(), f.name);
      swapped = true;
    }
    for (auto& f : fns)
      for (unsigned w = 0; w < f.weight; ++w) sink += call_jit(f.fn, n);
  }

  selfprof::jit::flush();  // the perf map is complete before the profile is symbolized
  st = selfprof::dump(out);
  SELFPROF_STOP();
  if (!st) {
    std::fprintf(stderr, "%s\n", st.message().c_str());
    return 1;
  }
  std::printf("wrote %s (checksum %llu); perf map %s\n", out.c_str(), static_cast<unsigned long long>(sink),
              selfprof::jit::perf_map_path().c_str());
  return 0;
#endif
}
