// Signal-handler code: the frame-pointer unwinder, with every read bounds-checked and probed.
// Context: signal handler (async-signal-safe: no locks, no allocation, no libc state).
#pragma once

#include <cstddef>
#include <cstdint>

#include "selfprof/signal/raw_syscall.hpp"

namespace selfprof {
namespace detail {

// Every bound of the walk, with its reason.
// A single frame larger than this is taken for a corrupted chain (async-profiler uses 256 KiB too).
constexpr std::uintptr_t kMaxFrameSize = 256 * 1024;
// How far above sp the walk may go when the thread's stack end is unknown (main-thread default
// RLIMIT_STACK is 8 MiB; deeper stacks are still walked when the thread's end is known).
constexpr std::uintptr_t kMaxStackSpan = 16 * 1024 * 1024;
// A known thread stack larger than this is not trusted as a bound (guards against a bogus descriptor).
constexpr std::uintptr_t kMaxKnownStack = 1024ull * 1024 * 1024;
// Frame records are 16-byte aligned in ABI-conforming x86-64 code; 8 tolerates hand-written assembly.
constexpr std::uintptr_t kFrameAlign = 8;
// Return addresses below this are not code: the chain ended in zeroed memory.
constexpr std::uintptr_t kMinCodeAddress = 4096;
constexpr std::uintptr_t kPageSize = 4096;

// Remembers the highest page range already shown readable, so each page is probed once per walk.
struct read_guard {
  std::uintptr_t ok_lo = 1, ok_hi = 0;  // empty

  bool readable(std::uintptr_t addr, std::size_t len) {
    std::uintptr_t end = addr + len;
    if (end < addr) return false;
    if (addr >= ok_lo && end <= ok_hi) return true;
    std::uintptr_t first = addr & ~(kPageSize - 1);
    std::uintptr_t last = (end - 1) & ~(kPageSize - 1);
    for (std::uintptr_t page = first;; page += kPageSize) {
      if (!(page >= ok_lo && page + kPageSize <= ok_hi) && !raw_readable(page)) return false;
      if (page == last) break;
    }
    if (ok_lo <= ok_hi && first >= ok_lo && first <= ok_hi) {
      if (last + kPageSize > ok_hi) ok_hi = last + kPageSize;  // contiguous: extend
    } else {
      ok_lo = first;
      ok_hi = last + kPageSize;
    }
    return true;
  }
};

// Reads of the interrupted thread's stack and code: bounds-checked and probed by the walkers, and not
// instrumented, since a sanitizer would take a read of another frame's saved registers for a bug.
#if defined(__clang__) || defined(__GNUC__)
#define SELFPROF_DETAIL_NO_SANITIZE __attribute__((no_sanitize("address", "thread", "undefined")))
#else
#define SELFPROF_DETAIL_NO_SANITIZE
#endif

SELFPROF_DETAIL_NO_SANITIZE inline std::uint64_t load_word(std::uintptr_t addr) {
  return *reinterpret_cast<const volatile std::uint64_t*>(addr);
}
SELFPROF_DETAIL_NO_SANITIZE inline unsigned char load_byte(std::uintptr_t addr) {
  return *reinterpret_cast<const volatile unsigned char*>(addr);
}

// The highest address the current thread's frames may occupy, or 0 when unknown.
// glibc places a thread's descriptor (what %fs:0x10 points to) at the top of its stack block.
inline std::uintptr_t current_thread_stack_end(std::uintptr_t sp, std::uintptr_t main_end, bool is_main) {
  if (is_main && main_end > sp && main_end - sp <= kMaxKnownStack) return main_end;
#if defined(__x86_64__) && defined(__GLIBC__)
  std::uintptr_t self;
  __asm__("mov %%fs:0x10, %0" : "=r"(self));
  if (self > sp && self - sp <= kMaxKnownStack) return self;
#endif
  return 0;
}

struct unwind_result {
  std::size_t depth = 0;
  bool truncated = false;
  bool leaf_fixed = false;
};

// x86-64 prologue/epilogue bytes at the interrupted pc (async-profiler's heuristics): at a function's first
// byte (push %rbp, endbr64) or on `ret` the return address is at [sp], right after `push %rbp` at [sp+8];
// %rbp still holds the caller's frame. Used by both walkers for a leaf without a frame record. The slot of
// the return address, or 0 when the bytes say nothing.
inline std::uintptr_t leaf_return_slot(std::uintptr_t pc, std::uintptr_t sp) {
#if defined(__x86_64__)
  read_guard code_guard;
  if (pc < kMinCodeAddress || !code_guard.readable(pc, 4)) return 0;
  const unsigned char code[4] = {load_byte(pc), load_byte(pc + 1), load_byte(pc + 2), load_byte(pc + 3)};
  const unsigned char b0 = code[0];
  if (b0 == 0x55 || b0 == 0xC3 || (b0 == 0xF3 && code[1] == 0x0F && code[2] == 0x1E && code[3] == 0xFA))
    return sp;
  if (b0 == 0x48 && code[1] == 0x89 && code[2] == 0xE5) return sp + 8;
#else
  (void)pc;
  (void)sp;
#endif
  return 0;
}

// Walks from an interrupted context. out[0] = pc, then return addresses, leaf first.
inline unwind_result unwind_fp(std::uintptr_t pc, std::uintptr_t sp, std::uintptr_t fp,
                               std::uintptr_t stack_end, std::uint64_t* out, std::size_t max_depth) {
  unwind_result r;
  if (max_depth == 0) return r;
  out[r.depth++] = pc;
  std::uintptr_t hi = sp + kMaxStackSpan;
  if (hi < sp) hi = ~std::uintptr_t(0);
  if (stack_end != 0 && stack_end < hi) hi = stack_end;
  read_guard guard;

  // Prologue/epilogue: the caller's return address may not be in a frame record yet (or any more).
  if (max_depth > 1) {
    const std::uintptr_t ra_slot = leaf_return_slot(pc, sp);
    if (ra_slot != 0 && ra_slot % 8 == 0 && ra_slot + 8 <= hi && guard.readable(ra_slot, 8)) {
      std::uintptr_t ra = load_word(ra_slot);
      if (ra >= kMinCodeAddress) {
        out[r.depth++] = ra;
        r.leaf_fixed = true;
      }
    }
  }

  std::uintptr_t prev = sp;
  while (true) {
    if (fp < prev || fp % kFrameAlign != 0 || fp - prev > kMaxFrameSize) break;
    if (fp + 16 > hi || fp + 16 < fp) break;
    if (!guard.readable(fp, 16)) break;
    std::uintptr_t next = load_word(fp);
    std::uintptr_t ra = load_word(fp + 8);
    if (ra < kMinCodeAddress) break;
    if (r.depth == max_depth) {
      r.truncated = true;  // a valid frame exists beyond the limit
      break;
    }
    out[r.depth++] = ra;
    if (next <= fp) break;  // the chain must grow towards the stack end
    prev = fp;
    fp = next;
  }
  return r;
}

}  // namespace detail
}  // namespace selfprof
