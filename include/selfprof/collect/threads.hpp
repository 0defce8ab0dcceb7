// Thread discovery from /proc/self/task: the list of live threads, a cheap "did the count change" check,
// thread names, the main thread's stack end, and whether a thread blocks a signal.
// Context: setup only and the collector thread.
#pragma once

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

namespace selfprof {
namespace detail {

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

inline std::string read_small_file(const std::string& path) {
  std::string out;
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return out;
  char buf[4096];
  for (;;) {
    ssize_t n = ::read(fd, buf, sizeof buf);
    if (n <= 0) break;
    out.append(buf, static_cast<std::size_t>(n));
    if (out.size() > (1u << 20)) break;
  }
  ::close(fd);
  return out;
}

inline std::string thread_name(pid_t tid) {
  std::string s = read_small_file("/proc/self/task/" + std::to_string(tid) + "/comm");
  while (!s.empty() && (s.back() == '\n' || s.back() == '\0')) s.pop_back();
  return s;
}

// True when the thread currently blocks `sig` (SigBlk in /proc/self/task/<tid>/status).
inline bool thread_blocks_signal(pid_t tid, int sig) {
  std::string s = read_small_file("/proc/self/task/" + std::to_string(tid) + "/status");
  std::size_t at = s.find("SigBlk:");
  if (at == std::string::npos || sig <= 0 || sig > 64) return false;
  unsigned long long mask = std::strtoull(s.c_str() + at + 7, nullptr, 16);
  return (mask >> (sig - 1)) & 1ull;
}

// Upper end of the main thread's stack ([stack] in /proc/self/maps), or 0.
inline std::uintptr_t main_stack_end() {
  std::string maps = read_small_file("/proc/self/maps");
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
