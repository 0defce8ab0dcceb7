// The bytes of a file for the ELF reader, read with pread into memory selfprof owns (the file opened
// through the syscall seam), released on destruction.
// Context: collector thread or setup (never the signal handler).
//
// Why pread and not mmap: a mapped file truncated in place (cp over it keeps the inode) raises SIGBUS on
// the next access to a page past its new end, in the collector thread, which kills the application;
// MAP_PRIVATE does not prevent it. A read of a shrunken file is only short. Only the ranges the readers
// ask for are read (ELF, section and program headers, symbol and string tables, notes, .gnu_debuglink,
// .rela.plt) and kept, so a 100 MB library costs about what its symbol tables weigh; a debug file's CRC
// streams through a small buffer. A file rewritten while being read could still mix two versions:
// check() reads every kept range again and compares, so the caller ends with bytes that match the file
// as it is, or an error naming the file ("changed while being read"). libdw reads DWARF itself:
// dwarf_lines.hpp opens it with ELF_C_READ for the same reason.
#pragma once

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <new>
#include <string>
#include <utility>
#include <vector>

#include "selfprof/detail/sys.hpp"
#include "selfprof/status.hpp"

namespace selfprof {
namespace detail {

// A span of bytes; every read of the ELF reader checks it.
struct byte_view {
  const unsigned char* data = nullptr;
  std::size_t size = 0;

  bool contains(std::uint64_t offset, std::uint64_t length) const {
    return offset <= size && length <= size - offset;
  }
  byte_view sub(std::uint64_t offset, std::uint64_t length) const {
    if (!contains(offset, length)) return {};
    return byte_view{data + offset, static_cast<std::size_t>(length)};
  }
};

// Largest file we read symbols from; bigger ones are refused (a hostile header could otherwise ask for
// a huge allocation).
constexpr std::uint64_t max_mapped_file_bytes = std::uint64_t{4} << 30;
// Buffer through which check() and read_all() stream.
constexpr std::size_t mapped_file_buffer_bytes = std::size_t{64} << 10;

// Opens `path` read-only through the syscall seam: a descriptor of a regular file whose inode is
// `expect_inode` (when non-zero, so a library replaced on disk since it was mapped is not mistaken for
// the one in memory), else -1 with the reason in `*why`.
inline int open_regular_file(const std::string& path, std::uint64_t expect_inode, status* why = nullptr) {
  auto fail = [&](int fd, const std::string& reason) {
    if (fd >= 0) sys().close(fd);
    if (why != nullptr) *why = status::error(path + ": " + reason);
    return -1;
  };
  int fd = sys().open(path.c_str(), O_RDONLY | O_CLOEXEC, 0);
  if (fd < 0) return fail(fd, std::string("open failed: ") + std::strerror(errno));
  struct stat st;
  if (::fstat(fd, &st) != 0) return fail(fd, std::string("fstat failed: ") + std::strerror(errno));
  if (!S_ISREG(st.st_mode)) return fail(fd, "not a regular file");
  if (expect_inode != 0 && static_cast<std::uint64_t>(st.st_ino) != expect_inode)
    return fail(fd, "file on disk differs from the mapped one (inode changed)");
  return fd;
}

// Reads exactly `length` bytes at `offset`; false on an error or end of file (the file shrank).
inline bool pread_exact(int fd, unsigned char* out, std::size_t length, std::uint64_t offset) {
  while (length > 0) {
    ssize_t n = ::pread(fd, out, length, static_cast<off_t>(offset));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    out += n;
    length -= static_cast<std::size_t>(n);
    offset += static_cast<std::uint64_t>(n);
  }
  return true;
}

class mapped_file {
 public:
  mapped_file() = default;
  // Not movable: an elf_image reading through this object keeps its address.
  mapped_file(const mapped_file&) = delete;
  mapped_file& operator=(const mapped_file&) = delete;
  ~mapped_file() { reset(); }

  // Opens `path` (a regular file with inode `expect_inode` when non-zero) and notes its size; reads
  // nothing yet. The descriptor stays open until reset().
  status open(const std::string& path, std::uint64_t expect_inode = 0) {
    reset();
    status why = status::ok();
    int fd = open_regular_file(path, expect_inode, &why);
    if (fd < 0) return why;
    struct stat st;
    if (::fstat(fd, &st) != 0 || st.st_size <= 0) {
      sys().close(fd);
      return status::error(path + ": empty file");
    }
    if (static_cast<std::uint64_t>(st.st_size) > max_mapped_file_bytes) {
      sys().close(fd);
      return status::error(path + ": file too large to read symbols from (over " +
                           std::to_string(max_mapped_file_bytes) + " bytes)");
    }
    fd_ = fd;
    size_ = static_cast<std::uint64_t>(st.st_size);
    path_ = path;
    return status::ok();
  }

  // The `length` bytes at `offset`, read on the first request for them and kept until reset(). Empty
  // when the range is outside the size the file had at open, when the file is now shorter (then
  // check() fails), or past the bound on bytes kept: twice the file's size, far above what sane headers
  // ask for, but a hostile file with thousands of overlapping sections could ask for much more.
  byte_view read(std::uint64_t offset, std::uint64_t length) {
    if (fd_ < 0 || offset > size_ || length > size_ - offset || length == 0) return {};
    for (const chunk& c : chunks_)
      if (offset >= c.offset && offset - c.offset <= c.size && length <= c.size - (offset - c.offset))
        return byte_view{c.data.get() + (offset - c.offset), static_cast<std::size_t>(length)};
    if (length > 2 * size_ - kept_) return {};
    chunk c{offset, static_cast<std::size_t>(length), std::unique_ptr<unsigned char[]>()};
    c.data.reset(new (std::nothrow) unsigned char[c.size]);
    if (c.data == nullptr) return {};
    if (!pread_exact(fd_, c.data.get(), c.size, offset)) {
      changed_ = true;
      return {};
    }
    kept_ += c.size;
    chunks_.push_back(std::move(c));
    return byte_view{chunks_.back().data.get(), chunks_.back().size};
  }

  // Passes the whole file, in order, to `consume(byte_view)` through a bounded buffer (nothing is
  // kept); false when the file shrank meanwhile.
  template <class Consume>
  bool read_all(Consume&& consume) {
    if (fd_ < 0) return false;
    std::unique_ptr<unsigned char[]> buffer(new unsigned char[mapped_file_buffer_bytes]);
    for (std::uint64_t at = 0; at < size_;) {
      std::size_t n = static_cast<std::size_t>(std::min<std::uint64_t>(mapped_file_buffer_bytes, size_ - at));
      if (!pread_exact(fd_, buffer.get(), n, at)) {
        changed_ = true;
        return false;
      }
      consume(byte_view{buffer.get(), n});
      at += n;
    }
    return true;
  }

  // Ok when the file still has the size it had at open and every range read so far still holds the
  // bytes read: what was parsed describes the file as it is. Call after the last read.
  status check() {
    status changed = status::error(path_ + ": changed while being read");
    struct stat st;
    if (fd_ < 0 || changed_ || ::fstat(fd_, &st) != 0 || static_cast<std::uint64_t>(st.st_size) != size_)
      return changed;
    std::unique_ptr<unsigned char[]> buffer(new unsigned char[mapped_file_buffer_bytes]);
    for (const chunk& c : chunks_) {
      for (std::size_t at = 0; at < c.size;) {
        std::size_t n = std::min(mapped_file_buffer_bytes, c.size - at);
        if (!pread_exact(fd_, buffer.get(), n, c.offset + at) ||
            std::memcmp(buffer.get(), c.data.get() + at, n) != 0)
          return changed;
        at += n;
      }
    }
    return status::ok();
  }

  // Closes the file and frees every range read.
  void reset() {
    if (fd_ >= 0) sys().close(fd_);
    fd_ = -1;
    size_ = 0;
    changed_ = false;
    kept_ = 0;
    chunks_.clear();
    path_.clear();
  }

  bool is_open() const { return fd_ >= 0; }
  std::uint64_t size() const { return size_; }  // as at open
  const std::string& path() const { return path_; }

 private:
  struct chunk {
    std::uint64_t offset;
    std::size_t size;
    std::unique_ptr<unsigned char[]> data;
  };

  int fd_ = -1;
  std::uint64_t size_ = 0;
  std::uint64_t kept_ = 0;  // bytes in chunks_
  bool changed_ = false;    // a read came up short: the file shrank after open
  std::vector<chunk> chunks_;
  std::string path_;
};

}  // namespace detail
}  // namespace selfprof
