// Names of the system calls a thread can block in, for the `[blocked: name]` frames of wall-clock
// profiles (the number comes from /proc/self/task/<tid>/syscall).
// Context: any thread (never the signal handler).
#pragma once

#include <sys/syscall.h>

#include <string>

namespace selfprof {
namespace detail {

// The name of system call `nr` on this architecture, or "syscall <nr>" for one not in the list (the
// list holds the calls that wait: I/O, locks, sleeps, process and signal waits, and their neighbours).
inline std::string syscall_name(long nr) {
  struct entry {
    long nr;
    const char* name;
  };
  static const entry
      table
          [] =
              {
#define SELFPROF_DETAIL_SYSCALL(n) {SYS_##n, #n},
#ifdef SYS_read
                  SELFPROF_DETAIL_SYSCALL(read)
#endif
#ifdef SYS_write
                      SELFPROF_DETAIL_SYSCALL(write)
#endif
#ifdef SYS_readv
                          SELFPROF_DETAIL_SYSCALL(readv)
#endif
#ifdef SYS_writev
                              SELFPROF_DETAIL_SYSCALL(writev)
#endif
#ifdef SYS_pread64
                                  SELFPROF_DETAIL_SYSCALL(pread64)
#endif
#ifdef SYS_pwrite64
                                      SELFPROF_DETAIL_SYSCALL(pwrite64)
#endif
#ifdef SYS_preadv2
                                          SELFPROF_DETAIL_SYSCALL(preadv2)
#endif
#ifdef SYS_pwritev2
                                              SELFPROF_DETAIL_SYSCALL(pwritev2)
#endif
#ifdef SYS_open
                                                  SELFPROF_DETAIL_SYSCALL(open)
#endif
#ifdef SYS_openat
                                                      SELFPROF_DETAIL_SYSCALL(openat)
#endif
#ifdef SYS_close
                                                          SELFPROF_DETAIL_SYSCALL(close)
#endif
#ifdef SYS_fsync
                                                              SELFPROF_DETAIL_SYSCALL(fsync)
#endif
#ifdef SYS_fdatasync
                                                                  SELFPROF_DETAIL_SYSCALL(fdatasync)
#endif
#ifdef SYS_sync_file_range
                                                                      SELFPROF_DETAIL_SYSCALL(sync_file_range)
#endif
#ifdef SYS_flock
                                                                          SELFPROF_DETAIL_SYSCALL(flock)
#endif
#ifdef SYS_fcntl
                                                                              SELFPROF_DETAIL_SYSCALL(fcntl)
#endif
#ifdef SYS_ioctl
                                                                                  SELFPROF_DETAIL_SYSCALL(
                                                                                      ioctl)
#endif
#ifdef SYS_futex
                                                                                      SELFPROF_DETAIL_SYSCALL(
                                                                                          futex)
#endif
#ifdef SYS_futex_waitv
                                                                                          SELFPROF_DETAIL_SYSCALL(
                                                                                              futex_waitv)
#endif
#ifdef SYS_poll
                                                                                              SELFPROF_DETAIL_SYSCALL(
                                                                                                  poll)
#endif
#ifdef SYS_ppoll
                                                                                                  SELFPROF_DETAIL_SYSCALL(
                                                                                                      ppoll)
#endif
#ifdef SYS_select
                                                                                                      SELFPROF_DETAIL_SYSCALL(
                                                                                                          select)
#endif
#ifdef SYS_pselect6
                                                                                                          SELFPROF_DETAIL_SYSCALL(
                                                                                                              pselect6)
#endif
#ifdef SYS_epoll_wait
                                                                                                              SELFPROF_DETAIL_SYSCALL(
                                                                                                                  epoll_wait)
#endif
#ifdef SYS_epoll_pwait
                                                                                                                  SELFPROF_DETAIL_SYSCALL(
                                                                                                                      epoll_pwait)
#endif
#ifdef SYS_epoll_pwait2
                                                                                                                      SELFPROF_DETAIL_SYSCALL(
                                                                                                                          epoll_pwait2)
#endif
#ifdef SYS_nanosleep
                                                                                                                          SELFPROF_DETAIL_SYSCALL(
                                                                                                                              nanosleep)
#endif
#ifdef SYS_clock_nanosleep
                                                                                                                              SELFPROF_DETAIL_SYSCALL(
                                                                                                                                  clock_nanosleep)
#endif
#ifdef SYS_pause
                                                                                                                                  SELFPROF_DETAIL_SYSCALL(
                                                                                                                                      pause)
#endif
#ifdef SYS_sched_yield
                                                                                                                                      SELFPROF_DETAIL_SYSCALL(
                                                                                                                                          sched_yield)
#endif
#ifdef SYS_accept
                                                                                                                                          SELFPROF_DETAIL_SYSCALL(
                                                                                                                                              accept)
#endif
#ifdef SYS_accept4
                                                                                                                                              SELFPROF_DETAIL_SYSCALL(
                                                                                                                                                  accept4)
#endif
#ifdef SYS_connect
                                                                                                                                                  SELFPROF_DETAIL_SYSCALL(
                                                                                                                                                      connect)
#endif
#ifdef SYS_recvfrom
                                                                                                                                                      SELFPROF_DETAIL_SYSCALL(
                                                                                                                                                          recvfrom)
#endif
#ifdef SYS_recvmsg
                                                                                                                                                          SELFPROF_DETAIL_SYSCALL(
                                                                                                                                                              recvmsg)
#endif
#ifdef SYS_recvmmsg
                                                                                                                                                              SELFPROF_DETAIL_SYSCALL(
                                                                                                                                                                  recvmmsg)
#endif
#ifdef SYS_sendto
                                                                                                                                                                  SELFPROF_DETAIL_SYSCALL(
                                                                                                                                                                      sendto)
#endif
#ifdef SYS_sendmsg
                                                                                                                                                                      SELFPROF_DETAIL_SYSCALL(
                                                                                                                                                                          sendmsg)
#endif
#ifdef SYS_sendmmsg
                                                                                                                                                                          SELFPROF_DETAIL_SYSCALL(
                                                                                                                                                                              sendmmsg)
#endif
#ifdef SYS_wait4
                                                                                                                                                                              SELFPROF_DETAIL_SYSCALL(
                                                                                                                                                                                  wait4)
#endif
#ifdef SYS_waitid
                                                                                                                                                                                  SELFPROF_DETAIL_SYSCALL(
                                                                                                                                                                                      waitid)
#endif
#ifdef SYS_rt_sigsuspend
                                                                                                                                                                                      SELFPROF_DETAIL_SYSCALL(rt_sigsuspend)
#endif
#ifdef SYS_rt_sigtimedwait
                                                                                                                                                                                          SELFPROF_DETAIL_SYSCALL(
                                                                                                                                                                                              rt_sigtimedwait)
#endif
#ifdef SYS_msgrcv
                                                                                                                                                                                              SELFPROF_DETAIL_SYSCALL(
                                                                                                                                                                                                  msgrcv)
#endif
#ifdef SYS_msgsnd
                                                                                                                                                                                                  SELFPROF_DETAIL_SYSCALL(
                                                                                                                                                                                                      msgsnd)
#endif
#ifdef SYS_semop
                                                                                                                                                                                                      SELFPROF_DETAIL_SYSCALL(
                                                                                                                                                                                                          semop)
#endif
#ifdef SYS_semtimedop
                                                                                                                                                                                                          SELFPROF_DETAIL_SYSCALL(
                                                                                                                                                                                                              semtimedop)
#endif
#ifdef SYS_io_getevents
                                                                                                                                                                                                              SELFPROF_DETAIL_SYSCALL(
                                                                                                                                                                                                                  io_getevents)
#endif
#ifdef SYS_io_uring_enter
                                                                                                                                                                                                                  SELFPROF_DETAIL_SYSCALL(
                                                                                                                                                                                                                      io_uring_enter)
#endif
#ifdef SYS_splice
                                                                                                                                                                                                                      SELFPROF_DETAIL_SYSCALL(
                                                                                                                                                                                                                          splice)
#endif
#ifdef SYS_sendfile
                                                                                                                                                                                                                          SELFPROF_DETAIL_SYSCALL(
                                                                                                                                                                                                                              sendfile)
#endif
#ifdef SYS_copy_file_range
                                                                                                                                                                                                                              SELFPROF_DETAIL_SYSCALL(
                                                                                                                                                                                                                                  copy_file_range)
#endif
#ifdef SYS_mmap
                                                                                                                                                                                                                                  SELFPROF_DETAIL_SYSCALL(
                                                                                                                                                                                                                                      mmap)
#endif
#ifdef SYS_munmap
                                                                                                                                                                                                                                      SELFPROF_DETAIL_SYSCALL(
                                                                                                                                                                                                                                          munmap)
#endif
#ifdef SYS_madvise
                                                                                                                                                                                                                                          SELFPROF_DETAIL_SYSCALL(
                                                                                                                                                                                                                                              madvise)
#endif
#ifdef SYS_msync
                                                                                                                                                                                                                                              SELFPROF_DETAIL_SYSCALL(
                                                                                                                                                                                                                                                  msync)
#endif
#ifdef SYS_exit
                                                                                                                                                                                                                                                  SELFPROF_DETAIL_SYSCALL(
                                                                                                                                                                                                                                                      exit)
#endif
#ifdef SYS_exit_group
                                                                                                                                                                                                                                                      SELFPROF_DETAIL_SYSCALL(
                                                                                                                                                                                                                                                          exit_group)
#endif
#ifdef SYS_clone
                                                                                                                                                                                                                                                          SELFPROF_DETAIL_SYSCALL(clone)
#endif
#ifdef SYS_clone3
                                                                                                                                                                                                                                                              SELFPROF_DETAIL_SYSCALL(
                                                                                                                                                                                                                                                                  clone3)
#endif
#ifdef SYS_execve
                                                                                                                                                                                                                                                                  SELFPROF_DETAIL_SYSCALL(
                                                                                                                                                                                                                                                                      execve)
#endif
#ifdef SYS_getrandom
                                                                                                                                                                                                                                                                      SELFPROF_DETAIL_SYSCALL(
                                                                                                                                                                                                                                                                          getrandom)
#endif
#undef SELFPROF_DETAIL_SYSCALL
              };
  for (const entry& e : table)
    if (e.nr == nr) return e.name;
  return "syscall " + std::to_string(nr);
}

}  // namespace detail
}  // namespace selfprof
