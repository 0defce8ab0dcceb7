// Test helpers shared by the symbols_*_test.cpp files: canonical paths, hex text, symbolizer options,
// files changed in place and maps files naming them.
// Context: tests only.
#pragma once

#include <fcntl.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <climits>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>
#include <utility>
#include <vector>

#include "selfprof/symbols/symbolizer.hpp"

namespace symbols_test {

// realpath(3) of `path`, or empty when it does not resolve.
inline std::string real_path(const char* path) {
  char buffer[PATH_MAX];
  return ::realpath(path, buffer) != nullptr ? std::string(buffer) : std::string();
}

// `v` as 0x-prefixed lower-case hex, as addr2line takes and prints addresses.
inline std::string hex(std::uint64_t v) {
  char b[32];
  std::snprintf(b, sizeof b, "0x%llx", static_cast<unsigned long long>(v));
  return b;
}

// Symbolizer options with the given debug-file roots and the perf map off.
inline selfprof::symbolizer_options options_with_roots(std::vector<std::string> roots) {
  selfprof::symbolizer_options o;
  o.debug_roots = std::move(roots);
  o.use_perf_map = false;
  return o;
}

// Sets the size of `path` in place, keeping its inode (what `cp` over a file does first).
inline bool truncate_in_place(const std::string& path, std::uint64_t size) {
  return ::truncate(path.c_str(), static_cast<off_t>(size)) == 0;
}

// Writes `bytes` over `path` in place, keeping its inode, and cuts it to their length.
inline bool rewrite_in_place(const std::string& path, const std::string& bytes) {
  int fd = ::open(path.c_str(), O_WRONLY | O_CLOEXEC);
  if (fd < 0) return false;
  bool ok = ::pwrite(fd, bytes.data(), bytes.size(), 0) == static_cast<ssize_t>(bytes.size()) &&
            ::ftruncate(fd, static_cast<off_t>(bytes.size())) == 0;
  return ::close(fd) == 0 && ok;
}

// Writes a maps file (for module_registry_options::maps_path) listing `path` as one executable mapping
// at `start` with its real device and inode; nothing is mapped.
inline bool write_maps_for(const std::string& maps_path, const std::string& path,
                           std::uint64_t start = 0x7f0000000000) {
  struct stat st;
  if (::stat(path.c_str(), &st) != 0) return false;
  char line[128];
  std::snprintf(line, sizeof line, "%llx-%llx r-xp 00000000 %02x:%02x %llu ",
                static_cast<unsigned long long>(start), static_cast<unsigned long long>(start + 0x100000),
                major(st.st_dev), minor(st.st_dev), static_cast<unsigned long long>(st.st_ino));
  std::ofstream out(maps_path, std::ios::trunc);
  out << line << path << '\n';
  return static_cast<bool>(out);
}

}  // namespace symbols_test
