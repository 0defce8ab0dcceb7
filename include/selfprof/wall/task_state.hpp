// What the wall-clock sampler learns about another thread of this process without touching it: its
// CPU time, whether and where it is blocked (/proc/self/task/<tid>/syscall), and a copy of its stack.
// Context: the wall sampler thread (never the signal handler).
#pragma once

#include <fcntl.h>
#include <time.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "selfprof/detail/process.hpp"
#include "selfprof/detail/sys.hpp"

namespace selfprof {
namespace detail {

// CPU time used so far by thread `tid`, in ns; false when the thread is gone.
inline bool thread_cpu_ns(pid_t tid, std::uint64_t& out) {
  struct timespec ts;
  if (clock_gettime(thread_cpu_clock(tid), &ts) != 0) return false;
  out = static_cast<std::uint64_t>(ts.tv_sec) * 1000000000ull + static_cast<std::uint64_t>(ts.tv_nsec);
  return true;
}

// A thread's state as /proc/self/task/<tid>/syscall gives it. The kernel fills the file only once the
// thread is off the CPU (it waits for that, briefly), so "blocked" is exact at the time of the read.
struct task_syscall {
  enum kind_t { gone, running, in_syscall, blocked_other } kind = gone;
  long nr = -1;           // system call number (in_syscall)
  std::uintptr_t sp = 0;  // user stack pointer at the call
  std::uintptr_t pc = 0;  // user pc: the instruction after the system call
};

// Parses the file's text: "running", "-1 <sp> <pc>", or "<nr> <6 args> <sp> <pc>" (numbers in hex
// after the first). Anything else is `gone` (the thread exited, or the kernel said something new).
inline task_syscall parse_task_syscall(const char* text) {
  task_syscall t;
  if (std::strncmp(text, "running", 7) == 0) {
    t.kind = task_syscall::running;
    return t;
  }
  char* end = nullptr;
  errno = 0;
  long nr = std::strtol(text, &end, 10);
  if (end == text || errno != 0) return t;
  unsigned long long v[8];
  int n = 0;
  const char* p = end;
  while (n < 8) {
    while (*p == ' ') ++p;
    if (*p == '\0' || *p == '\n') break;
    char* e = nullptr;
    v[n] = std::strtoull(p, &e, 16);
    if (e == p) return t;
    ++n;
    p = e;
  }
  while (*p == ' ') ++p;
  if (*p != '\0' && *p != '\n') return t;  // more than the kernel writes
  if (nr == -1 && n == 2) {
    t.kind = task_syscall::blocked_other;
  } else if (nr >= 0 && n == 8) {
    t.kind = task_syscall::in_syscall;
  } else {
    return t;
  }
  t.nr = nr;
  t.sp = static_cast<std::uintptr_t>(v[n - 2]);
  t.pc = static_cast<std::uintptr_t>(v[n - 1]);
  return t;
}

// Opens /proc/self/task/<tid>/syscall through `task_dir` (an open fd of /proc/self/task); -1 if gone.
inline int open_task_syscall(int task_dir, pid_t tid) {
  char path[32];
  std::snprintf(path, sizeof path, "%d/syscall", static_cast<int>(tid));
  return ::openat(task_dir, path, O_RDONLY | O_CLOEXEC);
}

// Reads the file afresh from an fd open_task_syscall gave (procfs regenerates it at offset 0, so one
// fd serves every look: half the cost of open + read + close).
inline task_syscall read_task_syscall(int fd) {
  char buf[256];
  ssize_t n = ::pread(fd, buf, sizeof buf - 1, 0);
  if (n <= 0) return task_syscall{};
  buf[n] = '\0';
  return parse_task_syscall(buf);
}

// Copies up to `len` bytes of this process's memory from `addr` into `out`; returns the bytes copied
// (fewer where an unmapped page begins). Never faults: the kernel does the reading (process_vm_readv,
// else /proc/self/mem), so a thread that exits and unmaps its stack meanwhile costs a short read only.
inline std::size_t copy_own_memory(std::uintptr_t addr, void* out, std::size_t len) {
  const long n = read_process_memory(::getpid(), out, addr, len);
  if (n >= 0) return static_cast<std::size_t>(n);
  if (errno != ENOSYS && errno != EPERM) return 0;
  int fd = ::open("/proc/self/mem", O_RDONLY | O_CLOEXEC);  // seccomp may forbid process_vm_readv alone
  if (fd < 0) return 0;
  std::size_t done = 0;
  while (done < len) {
    ssize_t r = ::pread(fd, static_cast<char*>(out) + done, len - done, static_cast<off_t>(addr + done));
    if (r <= 0) break;
    done += static_cast<std::size_t>(r);
  }
  ::close(fd);
  return done;
}

}  // namespace detail
}  // namespace selfprof
