// Input for the selfprof command: a file or stdin read in large blocks, plain or gzip (zlib when
// SELFPROF_HAS_ZLIB is 1, else a clear error), split into lines, with optional progress on a terminal.
// Context: setup only (the command-line tool and its tests; blocking reads, not for the profiler).
#pragma once

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <string_view>
#include <vector>

#include "selfprof/config.hpp"
#include "selfprof/status.hpp"

#if SELFPROF_HAS_ZLIB
#include <zlib.h>
#endif

namespace selfprof_cli {

// Reads one input ("-" is stdin) block by block. Gzip input is recognised by its magic bytes.
class input_reader {
 public:
  input_reader() = default;
  input_reader(const input_reader&) = delete;
  input_reader& operator=(const input_reader&) = delete;
  ~input_reader() { close(); }

  selfprof::status open(const std::string& path) {
    close();
    name_ = path == "-" ? std::string("<stdin>") : path;
    if (path == "-") {
      fd_ = 0;
      own_fd_ = false;
    } else {
      fd_ = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
      if (fd_ < 0) return selfprof::status::error(path + ": cannot open: " + std::strerror(errno));
      own_fd_ = true;
      struct stat st {};
      if (::fstat(fd_, &st) == 0) {
        if (S_ISDIR(st.st_mode)) return selfprof::status::error(path + ": is a directory");
        if (S_ISREG(st.st_mode)) size_ = static_cast<std::uint64_t>(st.st_size);
      }
    }
    // Peek at the first bytes for the gzip magic (1f 8b).
    pending_.resize(2);
    std::size_t got = 0;
    while (got < 2) {
      ssize_t n = ::read(fd_, &pending_[got], 2 - got);
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) return selfprof::status::error(name_ + ": read error: " + std::strerror(errno));
      if (n == 0) break;
      got += static_cast<std::size_t>(n);
    }
    pending_.resize(got);
    if (got == 2 && static_cast<unsigned char>(pending_[0]) == 0x1f &&
        static_cast<unsigned char>(pending_[1]) == 0x8b) {
#if SELFPROF_HAS_ZLIB
      gz_ = true;
      std::memset(&zs_, 0, sizeof zs_);
      if (inflateInit2(&zs_, 15 + 32) != Z_OK)
        return selfprof::status::error(name_ + ": cannot start the gzip decoder");
      zs_open_ = true;
#else
      return selfprof::status::error(name_ +
                                     ": gzip-compressed input, but this selfprof was built without zlib "
                                     "(SELFPROF_HAS_ZLIB=0); decompress it first, e.g. `zcat " +
                                     name_ + " | selfprof ...`");
#endif
    }
    return selfprof::status::ok();
  }

  // Appends up to about `max` bytes of (decompressed) input to `out`; false at the end or on error.
  bool read_block(std::string& out, std::size_t max = 1 << 20) {
    if (!error_.empty() || eof_) return false;
    if (!gz_) {
      if (!pending_.empty()) {
        out += pending_;
        consumed_ += pending_.size();
        pending_.clear();
        return true;
      }
      const std::size_t old = out.size();
      out.resize(old + max);
      ssize_t n;
      do n = ::read(fd_, &out[old], max);
      while (n < 0 && errno == EINTR);
      if (n < 0) {
        out.resize(old);
        error_ = name_ + ": read error: " + std::strerror(errno);
        return false;
      }
      out.resize(old + static_cast<std::size_t>(n));
      consumed_ += static_cast<std::uint64_t>(n);
      if (n == 0) eof_ = true;
      return n > 0;
    }
#if SELFPROF_HAS_ZLIB
    return read_gz_block(out, max);
#else
    return false;
#endif
  }

  const std::string& name() const { return name_; }
  const std::string& error() const { return error_; }
  std::uint64_t size() const { return size_; }          // 0 when unknown (a pipe)
  std::uint64_t consumed() const { return consumed_; }  // compressed bytes read so far

  void close() {
#if SELFPROF_HAS_ZLIB
    if (zs_open_) inflateEnd(&zs_);
    zs_open_ = false;
#endif
    if (own_fd_ && fd_ >= 0) ::close(fd_);
    fd_ = -1;
    own_fd_ = false;
    gz_ = false;
    eof_ = false;
    pending_.clear();
    error_.clear();
    size_ = consumed_ = 0;
  }

 private:
#if SELFPROF_HAS_ZLIB
  bool read_gz_block(std::string& out, std::size_t max) {
    const std::size_t old = out.size();
    out.resize(old + max);
    zs_.next_out = reinterpret_cast<Bytef*>(&out[old]);
    zs_.avail_out = static_cast<uInt>(max);
    while (zs_.avail_out == max) {
      if (zs_.avail_in == 0) {
        if (!pending_.empty()) {
          inbuf_ = pending_;
          pending_.clear();
        } else {
          inbuf_.resize(1 << 18);
          ssize_t n;
          do n = ::read(fd_, &inbuf_[0], inbuf_.size());
          while (n < 0 && errno == EINTR);
          if (n < 0) {
            error_ = name_ + ": read error: " + std::strerror(errno);
            break;
          }
          inbuf_.resize(static_cast<std::size_t>(n));
          if (n == 0) {
            if (!stream_end_) error_ = name_ + ": truncated gzip stream";
            eof_ = true;
            break;
          }
        }
        consumed_ += inbuf_.size();
        zs_.next_in = reinterpret_cast<Bytef*>(&inbuf_[0]);
        zs_.avail_in = static_cast<uInt>(inbuf_.size());
      }
      int rc = inflate(&zs_, Z_NO_FLUSH);
      if (rc == Z_STREAM_END) {
        stream_end_ = true;
        // Concatenated gzip members (as `cat a.gz b.gz` makes) continue; trailing zeros end it.
        if (zs_.avail_in > 0 && zs_.next_in[0] == 0x1f) {
          inflateReset(&zs_);
          stream_end_ = false;
          continue;
        }
        if (zs_.avail_out == max) {
          eof_ = true;
          break;
        }
        break;
      }
      if (rc != Z_OK && rc != Z_BUF_ERROR) {
        error_ = name_ + ": corrupt gzip data (" + (zs_.msg ? zs_.msg : "inflate error") + ")";
        break;
      }
    }
    out.resize(old + (max - zs_.avail_out));
    return out.size() > old;
  }

  z_stream zs_{};
  bool zs_open_ = false, stream_end_ = false;
  std::string inbuf_;
#endif
  std::string name_;
  std::string pending_;
  std::string error_;
  int fd_ = -1;
  bool own_fd_ = false, gz_ = false, eof_ = false;
  std::uint64_t size_ = 0, consumed_ = 0;
};

// Progress on stderr for large inputs when stderr is a terminal: "name: 120 MiB / 480 MiB (25%)".
class progress_meter {
 public:
  progress_meter(const std::string& what, std::uint64_t total, bool enabled)
      : what_(what), total_(total), enabled_(enabled && ::isatty(2) == 1) {}
  ~progress_meter() { finish(); }

  void update(std::uint64_t done) {
    if (!enabled_ || done < next_) return;
    next_ = done + step;
    shown_ = true;
    const unsigned long long mib = done >> 20;
    if (total_ > 0)
      std::fprintf(stderr, "\r%s: %llu MiB / %llu MiB (%llu%%)", what_.c_str(), mib,
                   static_cast<unsigned long long>(total_ >> 20),
                   static_cast<unsigned long long>(done * 100 / total_));
    else
      std::fprintf(stderr, "\r%s: %llu MiB", what_.c_str(), mib);
  }

  void finish() {
    if (shown_) std::fprintf(stderr, "\r\033[K");
    shown_ = false;
  }

  static constexpr std::uint64_t step = 16u << 20;  // refresh every 16 MiB: no clock needed

 private:
  std::string what_;
  std::uint64_t total_;
  std::uint64_t next_ = step * 2;  // nothing for inputs under 32 MiB
  bool enabled_;
  bool shown_ = false;
};

// Calls `on_line(std::string_view)` for every line of the input (LF removed; a last line without LF
// is passed too). Memory: one block plus the longest line.
template <typename OnLine>
inline selfprof::status for_each_line(input_reader& in, OnLine&& on_line,
                                      progress_meter* progress = nullptr) {
  std::string buf;
  std::size_t start = 0;
  while (true) {
    if (start > 0) {
      buf.erase(0, start);
      start = 0;
    }
    const std::size_t scanned = buf.size();
    if (!in.read_block(buf)) break;
    std::size_t pos = scanned;
    while (true) {
      const void* hit = std::memchr(buf.data() + pos, '\n', buf.size() - pos);
      if (!hit) break;
      const std::size_t nl = static_cast<std::size_t>(static_cast<const char*>(hit) - buf.data());
      on_line(std::string_view(buf.data() + start, nl - start));
      start = pos = nl + 1;
    }
    if (progress) progress->update(in.consumed());
  }
  if (start < buf.size()) on_line(std::string_view(buf.data() + start, buf.size() - start));
  if (progress) progress->finish();
  if (!in.error().empty()) return selfprof::status::error(in.error());
  return selfprof::status::ok();
}

// The whole (decompressed) content of an input.
inline selfprof::status read_all(const std::string& path, std::string& out) {
  input_reader in;
  selfprof::status st = in.open(path);
  if (!st) return st;
  while (in.read_block(out)) {
  }
  if (!in.error().empty()) return selfprof::status::error(in.error());
  return selfprof::status::ok();
}

}  // namespace selfprof_cli
