// Reader of perf's JIT symbol map, /tmp/perf-<pid>.map ("START SIZE name" lines, hex without 0x; the
// last line wins where ranges overlap), re-read when its size or mtime changes; never created here.
// Context: collector thread or setup (never the signal handler).
#pragma once

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "selfprof/detail/sys.hpp"

namespace selfprof {
namespace detail {

// A perf map larger than this is not read (a runaway JIT or a hostile file).
constexpr std::uint64_t perf_map_max_bytes = std::uint64_t{256} << 20;

class perf_map {
 public:
  struct hit {
    std::string_view name;
    std::uint64_t start = 0;
    std::uint64_t end = 0;
  };

  explicit perf_map(std::string path = default_path(::getpid())) : path_(std::move(path)) {}

  static std::string default_path(long pid) {
    std::string path = "/tmp/perf-";
    path += std::to_string(pid);
    path += ".map";
    return path;
  }
  const std::string& path() const { return path_; }

  // Re-reads the file when its identity, size or modification time changed since the last read.
  // A missing file keeps the names read before. A symlink, a non-regular file or a file owned by
  // another user (neither us nor root) is ignored. Returns true when the entries were replaced.
  bool reload_if_changed() {
    struct stat st;
    if (::lstat(path_.c_str(), &st) != 0 || !S_ISREG(st.st_mode)) return false;
    if (same_stamp(st)) return false;
    int fd = sys().open(path_.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK, 0);
    if (fd < 0) return false;
    bool ok = ::fstat(fd, &st) == 0 && S_ISREG(st.st_mode) && (st.st_uid == ::geteuid() || st.st_uid == 0) &&
              static_cast<std::uint64_t>(st.st_size) <= perf_map_max_bytes;
    std::string text;
    if (ok) {
      char buffer[65536];
      for (;;) {
        ssize_t n = ::read(fd, buffer, sizeof buffer);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0 || text.size() + static_cast<std::size_t>(n) > perf_map_max_bytes) break;
        text.append(buffer, static_cast<std::size_t>(n));
      }
    }
    sys().close(fd);
    if (!ok) return false;
    stamp_ = {static_cast<std::uint64_t>(st.st_dev), static_cast<std::uint64_t>(st.st_ino),
              static_cast<std::uint64_t>(st.st_size), static_cast<std::uint64_t>(st.st_mtim.tv_sec),
              static_cast<std::uint64_t>(st.st_mtim.tv_nsec)};
    has_stamp_ = true;
    parse(text);
    return true;
  }

  // Replaces the entries with those of `text`. Malformed lines are skipped; size 0 means one byte (as perf).
  void parse(std::string_view text) {
    struct raw {
      std::uint64_t start, end;
      std::size_t name;
    };
    std::vector<raw> lines;
    names_.clear();
    std::size_t pos = 0;
    while (pos < text.size()) {
      std::size_t eol = text.find('\n', pos);
      if (eol == std::string_view::npos) eol = text.size();
      std::string_view line = text.substr(pos, eol - pos);
      pos = eol + 1;
      if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
      std::uint64_t start = 0, size = 0;
      if (!take_hex(line, start) || !take_hex(line, size) || line.empty()) continue;
      if (size == 0) size = 1;
      std::uint64_t end = start + size < start ? ~std::uint64_t{0} : start + size;
      lines.push_back(raw{start, end, names_.size()});
      names_.emplace_back(line);
    }
    // The last line wins: every address goes to the latest line covering it, and each run of addresses
    // with the same latest line becomes one entry. One sweep in address order, with a heap of the lines
    // covering the current address (latest on top; lines that ended leave it when they reach the top).
    std::vector<std::size_t> by_start(lines.size());
    for (std::size_t i = 0; i < by_start.size(); ++i) by_start[i] = i;
    std::sort(by_start.begin(), by_start.end(),
              [&lines](std::size_t a, std::size_t b) { return lines[a].start < lines[b].start; });
    entries_.clear();
    std::vector<std::size_t> covering;  // a max-heap of line numbers
    std::size_t next = 0;               // in by_start: the first line not yet in the heap
    std::uint64_t at = next < by_start.size() ? lines[by_start[next]].start : 0;
    for (;;) {
      for (; next < by_start.size() && lines[by_start[next]].start <= at; ++next) {
        covering.push_back(by_start[next]);
        std::push_heap(covering.begin(), covering.end());
      }
      while (!covering.empty() && lines[covering.front()].end <= at) {
        std::pop_heap(covering.begin(), covering.end());
        covering.pop_back();
      }
      const bool more = next < by_start.size();
      if (covering.empty()) {
        if (!more) break;
        at = lines[by_start[next]].start;
        continue;
      }
      const raw& top = lines[covering.front()];
      const std::uint64_t until = more ? std::min(top.end, lines[by_start[next]].start) : top.end;
      if (!entries_.empty() && entries_.back().name == top.name && entries_.back().end == at)
        entries_.back().end = until;
      else
        entries_.push_back(entry{at, until, top.name});
      at = until;
    }
    entries_.shrink_to_fit();
  }

  bool lookup(std::uint64_t address, hit& out) const {
    auto it = std::upper_bound(entries_.begin(), entries_.end(), address,
                               [](std::uint64_t a, const entry& e) { return a < e.start; });
    if (it == entries_.begin()) return false;
    --it;
    if (address >= it->end) return false;
    out.name = names_[it->name];
    out.start = it->start;
    out.end = it->end;
    return true;
  }

  std::size_t size() const { return entries_.size(); }

 private:
  struct entry {
    std::uint64_t start, end;
    std::size_t name;
  };
  struct file_stamp {
    std::uint64_t dev, ino, size, mtime_s, mtime_ns;
  };

  bool same_stamp(const struct stat& st) const {
    return has_stamp_ && stamp_.dev == static_cast<std::uint64_t>(st.st_dev) &&
           stamp_.ino == static_cast<std::uint64_t>(st.st_ino) &&
           stamp_.size == static_cast<std::uint64_t>(st.st_size) &&
           stamp_.mtime_s == static_cast<std::uint64_t>(st.st_mtim.tv_sec) &&
           stamp_.mtime_ns == static_cast<std::uint64_t>(st.st_mtim.tv_nsec);
  }

  // Takes a hex number (optional 0x) and the spaces after it off the front of `s`.
  static bool take_hex(std::string_view& s, std::uint64_t& out) {
    std::size_t i = 0;
    if (s.size() >= 2 && s[0] == '0' && (s[1] == 'x' || s[1] == 'X')) i = 2;
    std::size_t digits = 0;
    out = 0;
    for (; i < s.size(); ++i, ++digits) {
      char c = s[i];
      unsigned d;
      if (c >= '0' && c <= '9')
        d = static_cast<unsigned>(c - '0');
      else if (c >= 'a' && c <= 'f')
        d = static_cast<unsigned>(c - 'a' + 10);
      else if (c >= 'A' && c <= 'F')
        d = static_cast<unsigned>(c - 'A' + 10);
      else
        break;
      if (digits >= 16) return false;
      out = (out << 4) | d;
    }
    if (digits == 0 || i >= s.size() || s[i] != ' ') return false;
    while (i < s.size() && s[i] == ' ') ++i;
    s.remove_prefix(i);
    return true;
  }

  std::string path_;
  std::vector<std::string> names_;
  std::vector<entry> entries_;
  file_stamp stamp_{};
  bool has_stamp_ = false;
};

}  // namespace detail
}  // namespace selfprof
