// What stack walking needs to know about the machine: registers of an interrupted context, the x86-64
// frame conventions (return address at CFA-8, DWARF register numbers, prologue bytes), the thread pointer.
// Context: signal handler (async-signal-safe: reads registers and bytes given to it, nothing else).
#pragma once

#include <ucontext.h>

#include <cstddef>
#include <cstdint>

namespace selfprof {
namespace detail {

// The registers a walk starts from.
struct frame_regs {
  std::uintptr_t pc = 0;
  std::uintptr_t sp = 0;
  std::uintptr_t fp = 0;  // the frame-pointer register: rbp (x86-64), x29 (aarch64)
};

// pc, sp and the frame pointer of the context a signal interrupted; zeros on other architectures.
inline frame_regs context_regs(const ucontext_t* uc) {
  frame_regs r;
#if defined(__x86_64__)
  r.pc = static_cast<std::uintptr_t>(uc->uc_mcontext.gregs[REG_RIP]);
  r.sp = static_cast<std::uintptr_t>(uc->uc_mcontext.gregs[REG_RSP]);
  r.fp = static_cast<std::uintptr_t>(uc->uc_mcontext.gregs[REG_RBP]);
#elif defined(__aarch64__)
  r.pc = static_cast<std::uintptr_t>(uc->uc_mcontext.pc);
  r.sp = static_cast<std::uintptr_t>(uc->uc_mcontext.sp);
  r.fp = static_cast<std::uintptr_t>(uc->uc_mcontext.regs[29]);
#else
  (void)uc;
#endif
  return r;
}

// The unwind rows (signal/unwind_rows.hpp) describe x86-64 frames and the prologue bytes below are
// x86-64 code; elsewhere only frame pointers are walked.
#if defined(__x86_64__)
constexpr bool kCfiRowsSupported = true;
constexpr bool kHasPrologueHeuristics = true;
#else
constexpr bool kCfiRowsSupported = false;
constexpr bool kHasPrologueHeuristics = false;
#endif

// DWARF register numbers of x86-64 (System V psABI, figure 3.36).
constexpr unsigned kDwarfRbp = 6, kDwarfRsp = 7, kDwarfRa = 16;

// `call` pushes the return address just below the caller's sp, which CFI calls the CFA.
constexpr std::intptr_t kReturnAddressAtCfa = -8;

// Bytes at the interrupted pc that prologue_return_slot looks at.
constexpr std::size_t kPrologueBytes = 4;

// x86-64 prologue/epilogue bytes at the interrupted pc (async-profiler's heuristics): at a function's
// first byte (push %rbp, endbr64) or on `ret` the return address is at [sp], right after `push %rbp` at
// [sp+8]; %rbp still holds the caller's frame. The slot of the return address, or 0 when the bytes say
// nothing (always 0 on other architectures).
inline std::uintptr_t prologue_return_slot(const unsigned char (&code)[kPrologueBytes], std::uintptr_t sp) {
#if defined(__x86_64__)
  const unsigned char b0 = code[0];
  if (b0 == 0x55 || b0 == 0xC3 || (b0 == 0xF3 && code[1] == 0x0F && code[2] == 0x1E && code[3] == 0xFA))
    return sp;
  if (b0 == 0x48 && code[1] == 0x89 && code[2] == 0xE5) return sp + 8;
#else
  (void)code;
  (void)sp;
#endif
  return 0;
}

// glibc's thread descriptor (what %fs:0x10 points to), which it places at the top of the thread's stack
// block; 0 where it is not known this way.
inline std::uintptr_t thread_descriptor() {
#if defined(__x86_64__) && defined(__GLIBC__)
  std::uintptr_t self;
  __asm__("mov %%fs:0x10, %0" : "=r"(self));
  return self;
#else
  return 0;
#endif
}

}  // namespace detail
}  // namespace selfprof
