// Reader of perf's JIT symbol map, /tmp/perf-<pid>.map ("START SIZE name" lines, hex without 0x),
// read as it grows, never created here. A JIT writes a line after placing code and may later place other
// code at the same address (node does), so every line read is kept with the time it became known: a
// sample is named by the latest line covering its address that was known before the sample was taken
// (tag(), done while sampling), and an address looked up without a time gets the last line (as perf).
// Context: collector thread, dumper thread or setup (never the signal handler); internally locked.
#pragma once

#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <deque>
#include <iterator>
#include <map>
#include <mutex>
#include <new>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "selfprof/detail/sys.hpp"
#include "selfprof/signal/clock.hpp"

namespace selfprof {
namespace detail {

// A perf map larger than this is not read (a runaway JIT or a hostile file).
constexpr std::uint64_t perf_map_max_bytes = std::uint64_t{256} << 20;

// A pc named by a perf map line while sampling: 0xfd in the top byte (never a canonical user or kernel
// address, and not the JIT registry's 0xfe), the line's number in the next 32 bits, offset+1 in the low
// 24 (so `tagged - 1`, looked up for return addresses, decodes to pc - 1 in the same line).
constexpr std::uint64_t perf_map_tag_marker = std::uint64_t{0xfd} << 56;
constexpr unsigned perf_map_tag_offset_bits = 24;
constexpr std::uint64_t perf_map_tag_offset_mask = (std::uint64_t{1} << perf_map_tag_offset_bits) - 1;
inline bool is_perf_map_tagged(std::uint64_t v) { return (v >> 56) == 0xfd; }

class perf_map {
 public:
  struct hit {
    std::string_view name;             // valid for the map's lifetime (names are never moved or freed)
    std::uint64_t start = 0, end = 0;  // the line's range
    std::uint64_t address = 0;         // the address looked up (decoded, for a tagged value)
  };

  // An empty path means /tmp/perf-<getpid()>.map, followed into a fork child's own file.
  explicit perf_map(std::string path = std::string()) : fixed_path_(std::move(path)) {}

  static std::string default_path(long pid) {
    std::string path = "/tmp/perf-";
    path += std::to_string(pid);
    path += ".map";
    return path;
  }
  std::string path() const { return fixed_path_.empty() ? default_path(::getpid()) : fixed_path_; }

  // Reads what was appended since the last call; the whole file again when it was replaced, shrank or
  // rewritten in place (its lines are then the current ones). A missing file keeps the lines read
  // before. A symlink, a non-regular file or a file owned by another user (neither us nor root) is
  // ignored. Returns true when lines were added.
  bool reload_if_changed() {
    std::lock_guard<std::mutex> lock(mu_);
    const std::uint64_t previous_poll = last_poll_ns_;
    last_poll_ns_ = monotonic_ns();
    const std::string p = path();
    struct stat st;
    if (::lstat(p.c_str(), &st) != 0 || !S_ISREG(st.st_mode)) return false;
    if (same_stamp(p, st)) return false;
    int fd = sys().open(p.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK, 0);
    if (fd < 0) return false;
    bool ok = ::fstat(fd, &st) == 0 && S_ISREG(st.st_mode) && (st.st_uid == ::geteuid() || st.st_uid == 0) &&
              static_cast<std::uint64_t>(st.st_size) <= perf_map_max_bytes;
    const auto size = static_cast<std::uint64_t>(st.st_size);
    // Appended to the file read before: read on from where we stopped, if the bytes before are the same.
    bool append =
        ok && has_stamp_ && p == stamp_.path && stamp_.dev == static_cast<std::uint64_t>(st.st_dev) &&
        stamp_.ino == static_cast<std::uint64_t>(st.st_ino) && size >= stamp_.size && tail_matches(fd);
    std::string text;
    if (ok) ok = read_from(fd, append ? stamp_.size : 0, text);
    sys().close(fd);
    if (!ok) return false;
    const std::uint64_t known_since = has_stamp_ ? written_at(st, previous_poll) : 0;
    if (!append) {
      current_.clear();
      pending_.clear();
    }
    std::string old_tail = std::move(stamp_.tail);
    stamp_ = file_stamp{p,
                        static_cast<std::uint64_t>(st.st_dev),
                        static_cast<std::uint64_t>(st.st_ino),
                        (append ? stamp_.size : 0) + text.size(),
                        static_cast<std::uint64_t>(st.st_mtim.tv_sec),
                        static_cast<std::uint64_t>(st.st_mtim.tv_nsec),
                        {}};
    has_stamp_ = true;
    std::string tail = append ? std::move(old_tail) : std::string();
    tail.append(text);
    if (tail.size() > kTailBytes) tail.erase(0, tail.size() - kTailBytes);
    stamp_.tail = std::move(tail);
    const std::size_t before = lines_.size();
    ingest(text, known_since);
    return lines_.size() != before;
  }

  // Forgets every line, then reads `text` as the whole map (known since always). Malformed lines are
  // skipped; size 0 means one byte (as perf reads it).
  void parse(std::string_view text) {
    std::lock_guard<std::mutex> lock(mu_);
    current_.clear();
    pending_.clear();
    has_stamp_ = false;
    ingest(text, 0);
  }

  // The last line read that covers `address`.
  bool lookup(std::uint64_t address, hit& out) const {
    std::lock_guard<std::mutex> lock(mu_);
    const segment* s = find(address);
    if (s == nullptr) return false;
    fill(s->history.back().second, address, out);
    return true;
  }

  // Rewrites `pc` into a tagged value naming the latest line covering it that was known before
  // by `time_ns` (else the first line read for it: the code ran before its line was seen).
  bool tag(std::uint64_t& pc, std::uint64_t time_ns) const {
    std::lock_guard<std::mutex> lock(mu_);
    const segment* s = find(pc);
    if (s == nullptr) return false;
    auto it = std::lower_bound(
        s->history.begin(), s->history.end(), time_ns,
        [](const std::pair<std::uint64_t, std::uint32_t>& e, std::uint64_t t) { return e.first < t; });
    const std::uint32_t line = it == s->history.begin() ? it->second : std::prev(it)->second;
    const std::uint64_t offset = pc - lines_[line].start;
    if (offset + 1 > perf_map_tag_offset_mask) return false;
    pc = perf_map_tag_marker | (std::uint64_t{line} << perf_map_tag_offset_bits) | (offset + 1);
    return true;
  }

  // Names a value made by tag() (or that value minus one).
  bool name_tagged(std::uint64_t tagged, hit& out) const {
    if (!is_perf_map_tagged(tagged)) return false;
    std::lock_guard<std::mutex> lock(mu_);
    const std::uint64_t line = (tagged >> perf_map_tag_offset_bits) & 0xffffffffu;
    const std::uint64_t field = tagged & perf_map_tag_offset_mask;  // offset + 1, or offset for tagged - 1
    if (line >= lines_.size()) return false;
    fill(static_cast<std::uint32_t>(line), lines_[line].start + field - 1, out);
    return true;
  }

  std::size_t size() const {  // address ranges with a distinct line history
    std::lock_guard<std::mutex> lock(mu_);
    return current_.size();
  }

  // fork(2) child: another thread may have held the lock.
  void abandon_after_fork() { new (&mu_) std::mutex(); }

 private:
  struct line_entry {
    std::uint64_t start, end;
    std::uint32_t name;
  };
  // A run of addresses covered by the same lines: (time known since, line) in reading order.
  struct segment {
    std::uint64_t end;
    std::vector<std::pair<std::uint64_t, std::uint32_t>> history;
  };
  static constexpr std::size_t kTailBytes = 64;
  struct file_stamp {
    std::string path;
    std::uint64_t dev, ino, size, mtime_s, mtime_ns;
    std::string tail;  // the last bytes read, compared before reading on
  };

  // When the lines read now were written, as a CLOCK_MONOTONIC time: the file's modification time
  // (when its last line was written), kept between the previous look at the file and now. A sample taken
  // before it keeps the line it had then: a reused address is named by its old code until the new line was
  // written. Lines of the first read are known since always (nothing says when they came).
  std::uint64_t written_at(const struct stat& st, std::uint64_t previous_poll) const {
    const std::uint64_t now = last_poll_ns_;
    struct timespec real;
    ::clock_gettime(CLOCK_REALTIME, &real);
    const std::int64_t real_ns = static_cast<std::int64_t>(real.tv_sec) * 1000000000 + real.tv_nsec;
    const std::int64_t mtime_ns =
        static_cast<std::int64_t>(st.st_mtim.tv_sec) * 1000000000 + st.st_mtim.tv_nsec;
    const std::int64_t ago = real_ns - mtime_ns;
    std::uint64_t at = ago <= 0                                ? now
                       : ago >= static_cast<std::int64_t>(now) ? 0
                                                               : now - static_cast<std::uint64_t>(ago);
    return std::max(at, previous_poll);
  }

  const segment* find(std::uint64_t address) const {
    auto it = current_.upper_bound(address);
    if (it == current_.begin()) return nullptr;
    --it;
    return address < it->second.end ? &it->second : nullptr;
  }

  void fill(std::uint32_t line, std::uint64_t address, hit& out) const {
    out.name = names_[lines_[line].name];
    out.start = lines_[line].start;
    out.end = lines_[line].end;
    out.address = address;
  }

  bool same_stamp(const std::string& p, const struct stat& st) const {
    return has_stamp_ && stamp_.path == p && stamp_.dev == static_cast<std::uint64_t>(st.st_dev) &&
           stamp_.ino == static_cast<std::uint64_t>(st.st_ino) &&
           stamp_.size == static_cast<std::uint64_t>(st.st_size) &&
           stamp_.mtime_s == static_cast<std::uint64_t>(st.st_mtim.tv_sec) &&
           stamp_.mtime_ns == static_cast<std::uint64_t>(st.st_mtim.tv_nsec);
  }

  bool tail_matches(int fd) const {
    if (stamp_.tail.empty()) return stamp_.size == 0;
    std::string now(stamp_.tail.size(), '\0');
    ssize_t n = ::pread(fd, &now[0], now.size(), static_cast<off_t>(stamp_.size - now.size()));
    return n == static_cast<ssize_t>(now.size()) && now == stamp_.tail;
  }

  static bool read_from(int fd, std::uint64_t offset, std::string& text) {
    char buffer[65536];
    for (;;) {
      ssize_t n = ::pread(fd, buffer, sizeof buffer, static_cast<off_t>(offset + text.size()));
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) return false;
      if (n == 0 || offset + text.size() + static_cast<std::size_t>(n) > perf_map_max_bytes) return true;
      text.append(buffer, static_cast<std::size_t>(n));
    }
  }

  // Adds the complete lines of `text` (a partial last line waits for the rest), known since `known_ns`.
  void ingest(std::string_view text, std::uint64_t known_ns) {
    pending_.append(text.data(), text.size());
    std::string_view all(pending_);
    std::size_t pos = 0;
    for (;;) {
      std::size_t eol = all.find('\n', pos);
      if (eol == std::string_view::npos) break;
      std::string_view line = all.substr(pos, eol - pos);
      pos = eol + 1;
      if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
      std::uint64_t start = 0, size = 0;
      if (!take_hex(line, start) || !take_hex(line, size) || line.empty()) continue;
      if (lines_.size() >= 0xffffffffu) break;
      if (size == 0) size = 1;
      const std::uint64_t end = start + size < start ? ~std::uint64_t{0} : start + size;
      names_.emplace_back(line);
      lines_.push_back(line_entry{start, end, static_cast<std::uint32_t>(names_.size() - 1)});
      cover(start, end, known_ns, static_cast<std::uint32_t>(lines_.size() - 1));
    }
    pending_.erase(0, pos);
  }

  // [start, end) is now also named by `line`: split the segments at both ends, add the line to every
  // segment inside, and fill the gaps with new segments.
  void cover(std::uint64_t start, std::uint64_t end, std::uint64_t known_ns, std::uint32_t line) {
    split_at(start);
    split_at(end);
    std::uint64_t at = start;
    auto it = current_.lower_bound(start);
    while (at < end) {
      if (it != current_.end() && it->first == at) {
        it->second.history.emplace_back(known_ns, line);
        at = it->second.end;
        ++it;
        continue;
      }
      const std::uint64_t gap_end = it != current_.end() && it->first < end ? it->first : end;
      current_.emplace_hint(it, at, segment{gap_end, {{known_ns, line}}});
      at = gap_end;
    }
  }

  void split_at(std::uint64_t address) {
    auto it = current_.upper_bound(address);
    if (it == current_.begin()) return;
    --it;
    if (it->first == address || address >= it->second.end) return;
    segment tail{it->second.end, it->second.history};
    it->second.end = address;
    current_.emplace_hint(std::next(it), address, std::move(tail));
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

  mutable std::mutex mu_;
  std::string fixed_path_;
  std::deque<std::string> names_;             // every line's name, never moved
  std::vector<line_entry> lines_;             // every line read, in reading order
  std::map<std::uint64_t, segment> current_;  // by start address, over the file read now
  std::string pending_;                       // a partial last line
  file_stamp stamp_{};
  bool has_stamp_ = false;
  std::uint64_t last_poll_ns_ = 0;
};

}  // namespace detail
}  // namespace selfprof
