// The seam for the system calls tests inject failures into (EACCES, ENOSYS, EMFILE, ...): tick sources
// (perf_event_open, timer_*, setitimer, fcntl, perf ring mmap/munmap), signals (sigaction), output files
// (open, openat, close), resource limits and reads of /proc/self/task/<tid> files (read_task_file: names,
// masks, start times; tests make them slow or fake a thread's identity). Other calls (ioctl on a perf fd,
// other reads of /proc, eventfd, poll) go to libc directly; their failures are handled where they happen.
// Also copies of this process's own memory (read_own_memory: tests refuse them as seccomp would).
// Functions follow libc: -1 and errno on failure.
// Context: any thread except the signal handler (the handler makes its few raw syscalls directly).
#pragma once

#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/time.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstdio>

namespace selfprof {
namespace detail {

struct syscall_table {
  long (*perf_event_open)(void* attr, int pid, int cpu, int group_fd, unsigned long flags);
  int (*timer_create)(clockid_t clock, struct sigevent* sev, timer_t* out);
  int (*timer_settime)(timer_t id, int flags, const struct itimerspec* value, struct itimerspec* old);
  int (*timer_delete)(timer_t id);
  int (*setitimer)(int which, const struct itimerval* value, struct itimerval* old);
  int (*sigaction)(int sig, const struct sigaction* act, struct sigaction* old);
  int (*open)(const char* path, int flags, mode_t mode);
  int (*openat)(int dirfd, const char* path, int flags, mode_t mode);
  int (*close)(int fd);
  int (*fcntl_int)(int fd, int cmd, long arg);
  int (*getrlimit)(int resource, struct rlimit* out);
  int (*setrlimit)(int resource, const struct rlimit* value);
  // Reads up to `size` bytes of /proc/self/task/<tid>/<file>: the byte count, or -1 and errno.
  long (*read_task_file)(int tid, const char* file, char* buf, std::size_t size);
  // Mappings of perf ring buffers (sources/perf_ring.hpp): tests refuse them (EPERM: locked memory).
  void* (*mmap)(void* addr, std::size_t len, int prot, int flags, int fd, off_t off);
  int (*munmap)(void* addr, std::size_t len);
  // Copies `size` bytes at `address` of this process into `out`: the bytes copied, which stop at the
  // first page the kernel cannot supply (a mapped file truncated since), or -1 and errno when copying
  // is refused (ENOSYS, EPERM: seccomp).
  long (*read_own_memory)(void* out, std::uintptr_t address, std::size_t size);
};

inline long default_perf_event_open(void* attr, int pid, int cpu, int group_fd, unsigned long flags) {
  return ::syscall(SYS_perf_event_open, attr, pid, cpu, group_fd, flags);
}
inline int default_timer_create(clockid_t clock, struct sigevent* sev, timer_t* out) {
  return ::timer_create(clock, sev, out);
}
inline int default_timer_settime(timer_t id, int flags, const struct itimerspec* v, struct itimerspec* o) {
  return ::timer_settime(id, flags, v, o);
}
inline int default_timer_delete(timer_t id) { return ::timer_delete(id); }
inline int default_setitimer(int which, const struct itimerval* v, struct itimerval* o) {
  return ::setitimer(static_cast<__itimer_which>(which), v, o);
}
inline int default_sigaction(int sig, const struct sigaction* act, struct sigaction* old) {
  return ::sigaction(sig, act, old);
}
inline int default_open(const char* path, int flags, mode_t mode) { return ::open(path, flags, mode); }
inline int default_openat(int dirfd, const char* path, int flags, mode_t mode) {
  return ::openat(dirfd, path, flags, mode);
}
inline int default_close(int fd) { return ::close(fd); }
inline int default_fcntl_int(int fd, int cmd, long arg) { return ::fcntl(fd, cmd, arg); }
inline int default_getrlimit(int r, struct rlimit* out) {
  return ::getrlimit(static_cast<__rlimit_resource>(r), out);
}
inline int default_setrlimit(int r, const struct rlimit* v) {
  return ::setrlimit(static_cast<__rlimit_resource>(r), v);
}
inline long default_read_task_file(int tid, const char* file, char* buf, std::size_t size) {
  char path[96];
  std::snprintf(path, sizeof path, "/proc/self/task/%d/%s", tid, file);
  const int fd = ::open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return -1;
  std::size_t got = 0;
  while (got < size) {
    const ssize_t n = ::read(fd, buf + got, size - got);
    if (n < 0 && got == 0) {
      const int e = errno;
      ::close(fd);
      errno = e;
      return -1;
    }
    if (n <= 0) break;
    got += static_cast<std::size_t>(n);
  }
  ::close(fd);
  return static_cast<long>(got);
}

inline void* default_mmap(void* addr, std::size_t len, int prot, int flags, int fd, off_t off) {
  return ::mmap(addr, len, prot, flags, fd, off);
}
inline int default_munmap(void* addr, std::size_t len) { return ::munmap(addr, len); }
// process_vm_readv of process `pid`, a page per remote element: a fault ends the copy at a page boundary
// (the kernel does not split an element), where a plain read would raise SIGBUS.
inline long read_process_memory(pid_t pid, void* out, std::uintptr_t address, std::size_t size) {
  constexpr std::size_t kPage = 4096, kElements = 256;
  std::size_t done = 0;
  while (done < size) {
    struct iovec local {
      static_cast<char*>(out) + done, 0
    };
    struct iovec remote[kElements];
    std::size_t n = 0, at = address + done;
    while (n < kElements && at < address + size) {
      const std::size_t end = std::min<std::size_t>((at / kPage + 1) * kPage, address + size);
      remote[n].iov_base = reinterpret_cast<void*>(at);
      remote[n].iov_len = end - at;
      local.iov_len += end - at;
      at = end;
      ++n;
    }
    const ssize_t got = ::process_vm_readv(pid, &local, 1, remote, n, 0);
    if (got < 0 && errno == EFAULT) break;  // the first page asked for is not there
    if (got < 0) return done > 0 ? static_cast<long>(done) : -1;
    done += static_cast<std::size_t>(got);
    if (static_cast<std::size_t>(got) < local.iov_len) break;
  }
  return static_cast<long>(done);
}
inline long default_read_own_memory(void* out, std::uintptr_t address, std::size_t size) {
  return read_process_memory(::getpid(), out, address, size);
}

inline syscall_table default_syscalls() {
  return syscall_table{
      default_perf_event_open, default_timer_create, default_timer_settime, default_timer_delete,
      default_setitimer,       default_sigaction,    default_open,          default_openat,
      default_close,           default_fcntl_int,    default_getrlimit,     default_setrlimit,
      default_read_task_file,  default_mmap,         default_munmap,        default_read_own_memory};
}

// The table in use. Tests replace entries (and restore them with default_syscalls()).
inline syscall_table& sys() {
  static syscall_table table = default_syscalls();
  return table;
}

}  // namespace detail
}  // namespace selfprof
