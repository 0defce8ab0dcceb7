// Facts about this process that several parts read: the dynamic loader's generation, the threads in
// /proc/self/task (names, blocked signals, start times, scheduler statistics), the main thread's stack end
// and the CPUs the process may use. Names, masks and start times are read through sys().read_task_file.
// Also the two ways files are read here: a small file whole, a large one (/proc/kallsyms) line by line.
// Context: any thread except the signal handler (dl_iterate_phdr takes the loader's lock).
#pragma once

#include <dirent.h>
#include <fcntl.h>
#include <link.h>
#include <sched.h>
#include <time.h>
#include <unistd.h>

#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <string_view>
#include <vector>

#include "selfprof/detail/sys.hpp"
#include "selfprof/signal/clock.hpp"

namespace selfprof {
namespace detail {

// Libraries loaded plus unloaded so far (dl_iterate_phdr's counters): changes on dlopen/dlclose.
inline std::uint64_t loader_generation() {
  std::uint64_t gen = 0;
  dl_iterate_phdr(
      [](struct dl_phdr_info* info, std::size_t size, void* out) {
        if (size >= offsetof(struct dl_phdr_info, dlpi_subs) + sizeof(info->dlpi_subs))
          *static_cast<std::uint64_t*>(out) = info->dlpi_adds + info->dlpi_subs;
        return 1;
      },
      &gen);
  return gen;
}

// The whole of a small file (at most `limit` bytes), or "" when it cannot be read.
inline std::string read_small_file(const std::string& path, std::size_t limit = std::size_t(1) << 20) {
  std::string out;
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return out;
  char buf[4096];
  for (;;) {
    ssize_t n = ::read(fd, buf, sizeof buf);
    if (n <= 0) break;
    out.append(buf, static_cast<std::size_t>(n));
    if (out.size() >= limit) break;
  }
  ::close(fd);
  return out;
}

// Calls fn(line) for each line of the file at `path` (without its '\n'), reading at most `limit` bytes
// through a 64 KiB buffer. False when the file cannot be opened.
template <class F>
bool for_each_file_line(const char* path, std::size_t limit, F&& fn) {
  const int fd = ::open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return false;
  std::string buf(std::size_t{64} << 10, '\0');
  std::size_t have = 0, total = 0;  // bytes in buf; bytes read
  for (;;) {
    if (have == buf.size()) buf.resize(buf.size() * 2);  // a line longer than the buffer
    const ssize_t n = total >= limit ? 0 : ::read(fd, &buf[have], buf.size() - have);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    have += static_cast<std::size_t>(n);
    total += static_cast<std::size_t>(n);
    std::size_t pos = 0;
    for (std::size_t eol; (eol = buf.find('\n', pos)) < have; pos = eol + 1)
      fn(std::string_view(buf.data() + pos, eol - pos));
    std::memmove(&buf[0], buf.data() + pos, have - pos);  // the partial last line to the front
    have -= pos;
  }
  if (have > 0) fn(std::string_view(buf.data(), have));
  ::close(fd);
  return true;
}

// The threads of this process now (/proc/self/task).
inline std::vector<pid_t> list_threads() {
  std::vector<pid_t> tids;
  DIR* dir = ::opendir("/proc/self/task");
  if (dir == nullptr) return tids;
  while (struct dirent* e = ::readdir(dir)) {
    if (e->d_name[0] < '0' || e->d_name[0] > '9') continue;
    tids.push_back(static_cast<pid_t>(std::strtol(e->d_name, nullptr, 10)));
  }
  ::closedir(dir);
  return tids;
}

// /proc/self/task/<tid>/<file> (at most 16 KiB: comm, stat, status), or "" when it cannot be read.
inline std::string task_file(pid_t tid, const char* file) {
  std::string out(16384, '\0');
  const long n = sys().read_task_file(static_cast<int>(tid), file, &out[0], out.size());
  out.resize(n > 0 ? static_cast<std::size_t>(n) : 0);
  return out;
}

// The start time in /proc/.../stat text (field 22, clock ticks since boot), or 0. The name in field 2 may
// hold spaces and parentheses: the fields are counted from its last ')'.
inline std::uint64_t parse_start_time(const std::string& stat) {
  const std::size_t close = stat.rfind(')');
  if (close == std::string::npos) return 0;
  const char* p = stat.c_str() + close + 1;
  for (int field = 3; field < 22; ++field) {  // skip fields 3 (state) to 21
    while (*p == ' ') ++p;
    while (*p != ' ' && *p != '\0') ++p;
  }
  while (*p == ' ') ++p;
  if (*p < '0' || *p > '9') return 0;
  return std::strtoull(p, nullptr, 10);
}

// When thread `tid` of this process started (clock ticks since boot), or 0 when it is not one of this
// process's threads (any more). With the tid, it identifies a thread: a tid is reused, a start time with it
// is not (two threads given the same tid within one clock tick would need the tid space to wrap meanwhile).
inline std::uint64_t task_start_time(pid_t tid) { return parse_start_time(task_file(tid, "stat")); }

inline std::string thread_name(pid_t tid) {
  std::string s = task_file(tid, "comm");
  while (!s.empty() && (s.back() == '\n' || s.back() == '\0')) s.pop_back();
  return s;
}

// True when the thread currently blocks `sig` (SigBlk in /proc/self/task/<tid>/status).
inline bool thread_blocks_signal(pid_t tid, int sig) {
  std::string s = task_file(tid, "status");
  std::size_t at = s.find("SigBlk:");
  if (at == std::string::npos || sig <= 0 || sig > 64) return false;
  unsigned long long mask = std::strtoull(s.c_str() + at + 7, nullptr, 16);
  return (mask >> (sig - 1)) & 1ull;
}

// A thread's time on the CPU and time spent waiting for one (/proc/self/task/<tid>/schedstat), in ns.
inline bool read_schedstat(pid_t tid, std::uint64_t& run_ns, std::uint64_t& delay_ns) {
  std::string text = read_small_file("/proc/self/task/" + std::to_string(tid) + "/schedstat");
  unsigned long long r = 0, d = 0;
  if (std::sscanf(text.c_str(), "%llu %llu", &r, &d) != 2) return false;
  run_ns = r;
  delay_ns = d;
  return true;
}

// The CPU clock of one thread by tid: the kernel's CPUCLOCK_SCHED | CPUCLOCK_PERTHREAD encoding
// (what pthread_getcpuclockid returns, without needing the pthread_t; see clock_getcpuclockid(3)).
inline clockid_t thread_cpu_clock(pid_t tid) {
  return static_cast<clockid_t>((~static_cast<unsigned>(tid) << 3) | 6u);
}

// CPUs the process may run on (its affinity mask), at least 1.
inline int usable_cpus() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof set, &set) == 0 && CPU_COUNT(&set) > 0) return CPU_COUNT(&set);
  long n = sysconf(_SC_NPROCESSORS_ONLN);
  return n > 0 ? static_cast<int>(n) : 1;
}

// Upper end of the main thread's stack ([stack] in /proc/self/maps, read whole: the line can come after
// many thousands of mappings), or 0.
inline std::uintptr_t main_stack_end() {
  std::string maps = read_small_file("/proc/self/maps", ~std::size_t(0));
  std::size_t at = maps.find("[stack]");
  if (at == std::string::npos) return 0;
  std::size_t line = maps.rfind('\n', at);
  line = line == std::string::npos ? 0 : line + 1;
  const char* p = maps.c_str() + line;
  char* end = nullptr;
  std::strtoull(p, &end, 16);
  if (end == nullptr || *end != '-') return 0;
  return static_cast<std::uintptr_t>(std::strtoull(end + 1, nullptr, 16));
}

}  // namespace detail
}  // namespace selfprof
