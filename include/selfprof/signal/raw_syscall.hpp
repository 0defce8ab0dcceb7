// Signal-handler code: raw system calls that touch neither errno nor libc state.
// Context: signal handler (async-signal-safe), also usable anywhere else.
#pragma once

#include <sys/syscall.h>
#include <unistd.h>

#include <cstdint>

namespace selfprof {
namespace detail {

// Returns the kernel's raw result: >= 0 on success, -errno on failure. errno is never written.
inline long raw_syscall3(long nr, long a, long b, long c) {
#if defined(__x86_64__)
  long ret;
  __asm__ volatile("syscall" : "=a"(ret) : "a"(nr), "D"(a), "S"(b), "d"(c) : "rcx", "r11", "memory");
  return ret;
#else
  // Other architectures: libc's syscall() writes errno, which the handler saves and restores anyway.
  long ret = ::syscall(nr, a, b, c);
  return ret;
#endif
}

inline long raw_syscall4(long nr, long a, long b, long c, long d) {
#if defined(__x86_64__)
  long ret;
  register long r10 __asm__("r10") = d;
  __asm__ volatile("syscall"
                   : "=a"(ret)
                   : "a"(nr), "D"(a), "S"(b), "d"(c), "r"(r10)
                   : "rcx", "r11", "memory");
  return ret;
#else
  return ::syscall(nr, a, b, c, d);
#endif
}

inline long raw_syscall6(long nr, long a, long b, long c, long d, long e, long f) {
#if defined(__x86_64__)
  long ret;
  register long r10 __asm__("r10") = d;
  register long r8 __asm__("r8") = e;
  register long r9 __asm__("r9") = f;
  __asm__ volatile("syscall"
                   : "=a"(ret)
                   : "a"(nr), "D"(a), "S"(b), "d"(c), "r"(r10), "r"(r8), "r"(r9)
                   : "rcx", "r11", "memory");
  return ret;
#else
  return ::syscall(nr, a, b, c, d, e, f);
#endif
}

inline std::uint32_t raw_gettid() { return static_cast<std::uint32_t>(raw_syscall3(SYS_gettid, 0, 0, 0)); }

// True when the 8 bytes at `address` can be read. rt_sigprocmask copies the new set from user memory
// before it validates `how`, so an invalid `how` yields EFAULT for unreadable memory and EINVAL for
// readable memory, with no side effect (the technique gperftools uses; see rt_sigprocmask(2)).
inline bool raw_readable(std::uintptr_t address) {
  long r = raw_syscall4(SYS_rt_sigprocmask, ~0L, static_cast<long>(address), 0, 8);
  return r != -14 /* EFAULT */;
}

}  // namespace detail
}  // namespace selfprof
