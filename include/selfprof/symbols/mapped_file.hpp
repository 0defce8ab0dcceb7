// A read-only memory mapping of a whole file (opened through the syscall seam), released on destruction.
// Context: collector thread or setup (never the signal handler).
#pragma once

#include <sys/mman.h>
#include <sys/stat.h>

#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <utility>

#include "selfprof/detail/sys.hpp"
#include "selfprof/status.hpp"

namespace selfprof {
namespace detail {

// Largest file we map for symbols; bigger ones are refused rather than eating the address space.
constexpr std::uint64_t max_mapped_file_bytes = std::uint64_t{4} << 30;

class mapped_file {
 public:
  mapped_file() = default;
  mapped_file(const mapped_file&) = delete;
  mapped_file& operator=(const mapped_file&) = delete;
  mapped_file(mapped_file&& other) noexcept { swap(other); }
  mapped_file& operator=(mapped_file&& other) noexcept {
    if (this != &other) {
      reset();
      swap(other);
    }
    return *this;
  }
  ~mapped_file() { reset(); }

  // Maps `path` read-only. `expect_inode` (when non-zero) must match the opened file's inode, so a
  // library replaced on disk after it was mapped is not mistaken for the one in memory.
  status open(const std::string& path, std::uint64_t expect_inode = 0) {
    reset();
    int fd = sys().open(path.c_str(), O_RDONLY | O_CLOEXEC, 0);
    if (fd < 0) return status::error(path + ": open failed: " + std::strerror(errno));
    struct stat st;
    if (::fstat(fd, &st) != 0) {
      int e = errno;
      sys().close(fd);
      return status::error(path + ": fstat failed: " + std::strerror(e));
    }
    if (!S_ISREG(st.st_mode)) {
      sys().close(fd);
      return status::error(path + ": not a regular file");
    }
    if (expect_inode != 0 && static_cast<std::uint64_t>(st.st_ino) != expect_inode) {
      sys().close(fd);
      return status::error(path + ": file on disk differs from the mapped one (inode changed)");
    }
    if (st.st_size <= 0) {
      sys().close(fd);
      return status::error(path + ": empty file");
    }
    if (static_cast<std::uint64_t>(st.st_size) > max_mapped_file_bytes) {
      sys().close(fd);
      return status::error(path + ": file too large to map");
    }
    std::size_t size = static_cast<std::size_t>(st.st_size);
    void* p = ::mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd, 0);
    int e = errno;
    sys().close(fd);
    if (p == MAP_FAILED) return status::error(path + ": mmap failed: " + std::strerror(e));
    data_ = static_cast<const unsigned char*>(p);
    size_ = size;
    return status::ok();
  }

  void reset() {
    if (data_ != nullptr) ::munmap(const_cast<unsigned char*>(data_), size_);
    data_ = nullptr;
    size_ = 0;
  }

  const unsigned char* data() const { return data_; }
  std::size_t size() const { return size_; }

 private:
  void swap(mapped_file& o) noexcept {
    std::swap(data_, o.data_);
    std::swap(size_, o.size_);
  }
  const unsigned char* data_ = nullptr;
  std::size_t size_ = 0;
};

}  // namespace detail
}  // namespace selfprof
