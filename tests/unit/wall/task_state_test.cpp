// The wall sampler's readers: /proc/self/task/<tid>/syscall lines, system call names, own-memory copies.
#include <doctest/doctest.h>

#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cstring>
#include <vector>

#include <selfprof/wall/task_state.hpp>

using selfprof::detail::parse_task_syscall;
using selfprof::detail::task_syscall;

TEST_CASE("wall: /proc/<tid>/syscall lines parse into call, sp and pc") {
  task_syscall t = parse_task_syscall(
      "230 0x0 0x0 0x7ffb5321ce60 0x7ffb5321ce60 0x0 0x7fff817bafb7 0x7ffb5321ce20 0x7ffb532ed545\n");
  CHECK(t.kind == task_syscall::in_syscall);
  CHECK(t.nr == 230);
  CHECK(t.sp == 0x7ffb5321ce20u);
  CHECK(t.pc == 0x7ffb532ed545u);
  t = parse_task_syscall("-1 0x7ffc0000aa00 0x401234\n");
  CHECK(t.kind == task_syscall::blocked_other);
  CHECK(t.sp == 0x7ffc0000aa00u);
  CHECK(t.pc == 0x401234u);
  CHECK(parse_task_syscall("running\n").kind == task_syscall::running);
  for (const char* bad : {"", "x", "7 0x1 0x2\n", "-1 0x1\n", "230 0x0 zz\n", "1 2 3 4 5 6 7 8 9 10 11\n"})
    CHECK(parse_task_syscall(bad).kind == task_syscall::gone);
}

TEST_CASE("wall: a thread's own /proc file says where it is blocked") {
  // A thread reading its own file is inside that very read (pread64), and the kernel says so.
  int dir = ::open("/proc/self/task", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  REQUIRE(dir >= 0);
  int fd = selfprof::detail::open_task_syscall(dir, static_cast<pid_t>(::syscall(SYS_gettid)));
  REQUIRE(fd >= 0);
  task_syscall t = selfprof::detail::read_task_syscall(fd);
  CHECK(t.kind == task_syscall::in_syscall);
  CHECK(t.nr == SYS_pread64);
  CHECK(t.sp != 0);
  ::close(fd);
  CHECK(selfprof::detail::open_task_syscall(dir, 0x7ffffff0) < 0);  // no such thread
  ::close(dir);
}

TEST_CASE("wall: system call names") {
  CHECK(selfprof::detail::syscall_name(SYS_futex) == "futex");
  CHECK(selfprof::detail::syscall_name(SYS_read) == "read");
  CHECK(selfprof::detail::syscall_name(SYS_epoll_wait) == "epoll_wait");
  CHECK(selfprof::detail::syscall_name(4000) == "syscall 4000");
}

TEST_CASE("wall: copying own memory stops at an unmapped page instead of faulting") {
  const std::size_t page = static_cast<std::size_t>(::sysconf(_SC_PAGESIZE));
  auto* m = static_cast<unsigned char*>(
      ::mmap(nullptr, 2 * page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0));
  REQUIRE(m != MAP_FAILED);
  std::memset(m, 0x5a, page);
  REQUIRE(::munmap(m + page, page) == 0);
  std::vector<unsigned char> out(2 * page, 0);
  std::size_t got =
      selfprof::detail::copy_own_memory(reinterpret_cast<std::uintptr_t>(m), out.data(), out.size());
  CHECK(got == page);
  CHECK(out[0] == 0x5a);
  CHECK(out[page - 1] == 0x5a);
  ::munmap(m, page);
}
