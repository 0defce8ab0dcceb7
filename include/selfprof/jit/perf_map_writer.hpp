// Writer of perf's JIT symbol map /tmp/perf-<pid>.map: "START SIZE name" lines (lower-case hex without
// 0x, one space each, newline-terminated), appended in registration order so perf's last-line-wins
// reading matches the latest code at each address; the file is created safely (see safe_file.hpp).
// A map another live writer holds (another JIT runtime or copy of selfprof in this process, or a process
// with the same pid in another container sharing /tmp) is appended to, never truncated or removed: perf
// maps are meant to collect the lines of every JIT of the process, and each write() is whole lines with
// O_APPEND, so lines of different writers never mix. Only a provably dead writer's map is replaced.
// Context: any thread (the JIT runtime serialises calls).
#pragma once

#include <fcntl.h>
#include <unistd.h>

#include <cstdint>
#include <string>
#include <string_view>

#include "selfprof/detail/high_fd.hpp"
#include "selfprof/detail/sys.hpp"
#include "selfprof/jit/safe_file.hpp"
#include "selfprof/status.hpp"

namespace selfprof {
namespace detail {

// Appends one perf map line. `name` must be sanitised already (append_jit_name).
inline void append_perf_map_line(std::string& out, std::uint64_t start, std::uint64_t size,
                                 std::string_view name) {
  static const char digits[] = "0123456789abcdef";
  auto hex = [&out](std::uint64_t v) {
    char buf[16];
    int n = 0;
    do {
      buf[n++] = digits[v & 15];
      v >>= 4;
    } while (v != 0);
    while (n > 0) out += buf[--n];
  };
  hex(start);
  out += ' ';
  hex(size);
  out += ' ';
  out.append(name.data(), name.size());
  out += '\n';
}

class perf_map_writer {
 public:
  // `dir` is "/tmp" for perf; `pid` is the process id perf knows the process by.
  perf_map_writer(std::string dir, long pid) : path_(path_for(dir, pid)) {}
  perf_map_writer(const perf_map_writer&) = delete;
  perf_map_writer& operator=(const perf_map_writer&) = delete;
  ~perf_map_writer() { close(); }

  static std::string path_for(const std::string& dir, long pid) {
    std::string path = dir;
    if (path.empty() || path.back() != '/') path += '/';
    path += "perf-";
    path += std::to_string(pid);
    path += ".map";
    return path;
  }
  const std::string& path() const { return path_; }
  bool is_open() const { return fd_ >= 0; }
  bool replaced_stale() const { return replaced_stale_; }
  bool shared() const { return shared_; }  // appending to another live writer's map

  // Creates the file or joins a live writer's (replacing a provably stale one of ours, refusing anything
  // else), and keeps a shared flock on it while open. Idempotent once open.
  status open() {
    if (fd_ >= 0) return status::ok();
    safe_file f;
    status st = create_safe_file(path_, O_WRONLY | O_APPEND, "perf map", f, live_file::share);
    if (!st) return st;
    fd_ = keep_fd_high(f.fd);  // above the application's descriptors; the lock moves with it (same file)
    replaced_stale_ = f.replaced_stale;
    shared_ = f.shared;
    return status::ok();
  }

  // Appends whole lines (O_APPEND: another writer in this process cannot split them).
  status write(std::string_view lines) {
    if (fd_ < 0) return status::error("selfprof: perf map " + path_ + " is not open");
    return write_all(fd_, lines.data(), lines.size(), path_);
  }

  void close() {
    if (fd_ >= 0) sys().close(fd_);
    fd_ = -1;
  }

  // After fork(): the descriptor belongs to the parent's file; forget it without writing (closing the
  // child's copy leaves the parent's lock in place: a flock belongs to the shared open file description).
  void abandon_after_fork(const std::string& dir, long pid) {
    close();
    path_ = path_for(dir, pid);
  }

 private:
  std::string path_;
  int fd_ = -1;
  bool replaced_stale_ = false;
  bool shared_ = false;
};

}  // namespace detail
}  // namespace selfprof
