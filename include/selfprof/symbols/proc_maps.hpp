// Reading and parsing /proc/<pid>/maps lines (address range, permissions, offset, device, inode, path).
// Context: collector thread or setup (never the signal handler).
#pragma once

#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <string>
#include <string_view>

#include "selfprof/detail/sys.hpp"

namespace selfprof {
namespace detail {

struct maps_entry {
  std::uint64_t start = 0;
  std::uint64_t end = 0;
  std::uint64_t offset = 0;
  std::uint64_t inode = 0;
  std::uint32_t dev_major = 0;
  std::uint32_t dev_minor = 0;
  bool readable = false;
  bool executable = false;
  bool deleted = false;  // the path ended in " (deleted)" (removed file, or a memfd)
  std::string path;      // without the " (deleted)" suffix; empty for anonymous memory

  // A file with no path to open again: deleted, or a memfd ("/memfd:NAME").
  bool hidden_file() const { return deleted || path.compare(0, 7, "/memfd:") == 0; }
};

// Parses one hexadecimal field ending at `stop` (or the end); advances `pos`. False when empty or bad.
inline bool parse_hex_field(std::string_view line, std::size_t& pos, char stop, std::uint64_t& out) {
  out = 0;
  std::size_t begin = pos;
  while (pos < line.size() && line[pos] != stop) {
    char c = line[pos];
    unsigned digit;
    if (c >= '0' && c <= '9')
      digit = static_cast<unsigned>(c - '0');
    else if (c >= 'a' && c <= 'f')
      digit = static_cast<unsigned>(c - 'a' + 10);
    else if (c >= 'A' && c <= 'F')
      digit = static_cast<unsigned>(c - 'A' + 10);
    else
      return false;
    if (pos - begin >= 16) return false;
    out = (out << 4) | digit;
    ++pos;
  }
  if (pos == begin) return false;
  if (pos < line.size()) ++pos;  // the stop character
  return true;
}

// Parses "start-end perms offset major:minor inode   path" (path optional, may hold spaces).
inline bool parse_maps_line(std::string_view line, maps_entry& out) {
  out = maps_entry();
  std::size_t pos = 0;
  if (!parse_hex_field(line, pos, '-', out.start) || !parse_hex_field(line, pos, ' ', out.end)) return false;
  if (pos + 5 > line.size() || line[pos + 4] != ' ') return false;
  out.readable = line[pos] == 'r';
  out.executable = line[pos + 2] == 'x';
  pos += 5;
  std::uint64_t major = 0, minor = 0;
  if (!parse_hex_field(line, pos, ' ', out.offset) || !parse_hex_field(line, pos, ':', major) ||
      !parse_hex_field(line, pos, ' ', minor))
    return false;
  out.dev_major = static_cast<std::uint32_t>(major);
  out.dev_minor = static_cast<std::uint32_t>(minor);
  std::size_t begin = pos;
  while (pos < line.size() && line[pos] >= '0' && line[pos] <= '9')
    out.inode = out.inode * 10 + (line[pos++] - '0');
  if (pos == begin || out.end < out.start) return false;
  while (pos < line.size() && line[pos] == ' ') ++pos;
  std::string_view path = line.substr(pos);
  constexpr std::string_view deleted = " (deleted)";
  if (path.size() > deleted.size() && path.substr(path.size() - deleted.size()) == deleted) {
    out.deleted = true;
    path.remove_suffix(deleted.size());
  }
  out.path = std::string(path);
  return true;
}

// Calls fn(line) for each line of `text` (without its '\n'), the last one also when unterminated.
template <class F>
void for_each_line(std::string_view text, F&& fn) {
  std::size_t pos = 0;
  while (pos < text.size()) {
    std::size_t eol = text.find('\n', pos);
    if (eol == std::string_view::npos) eol = text.size();
    fn(text.substr(pos, eol - pos));
    pos = eol + 1;
  }
}

// Calls fn(entry) for each executable mapping in maps text; lines that do not parse are skipped.
template <class F>
void for_each_executable_mapping(std::string_view text, F&& fn) {
  for_each_line(text, [&](std::string_view line) {
    maps_entry e;
    if (parse_maps_line(line, e) && e.executable) fn(e);
  });
}

// Reads a whole (proc) file into `out`; false on failure.
inline bool read_text_file(const char* path, std::string& out) {
  out.clear();
  int fd = sys().open(path, O_RDONLY | O_CLOEXEC, 0);
  if (fd < 0) return false;
  char buffer[16384];
  for (;;) {
    ssize_t n = ::read(fd, buffer, sizeof buffer);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      sys().close(fd);
      return n == 0;
    }
    out.append(buffer, static_cast<std::size_t>(n));
  }
}

}  // namespace detail
}  // namespace selfprof
