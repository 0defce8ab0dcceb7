// Writer of perf's jitdump file jit-<pid>.dump (file header, then one JIT_CODE_LOAD record per
// registration with the code bytes), mapped PROT_READ|PROT_EXEC so that `perf record -k 1` sees it
// and `perf inject --jit` can turn the records into jitted-<pid>-<index>.so files perf can annotate.
// Context: any thread (the JIT runtime serialises calls).
#pragma once

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>
#include <utility>

#include "selfprof/detail/high_fd.hpp"
#include "selfprof/detail/sys.hpp"
#include "selfprof/jit/safe_file.hpp"
#include "selfprof/status.hpp"

namespace selfprof {
namespace detail {

constexpr std::uint32_t jitdump_magic = 0x4A695444;  // "JiTD" read as a native-endian u32
constexpr std::uint32_t jitdump_version = 1;         // perf rejects anything newer
constexpr std::uint32_t jitdump_header_size = 40;
constexpr std::uint32_t jitdump_code_load = 0;
constexpr std::uint32_t jitdump_code_close = 3;

// e_machine of the code this process runs (ELF gABI numbers, as <elf.h> EM_*).
constexpr std::uint32_t jitdump_elf_machine() {
#if defined(__x86_64__)
  return 62;
#elif defined(__aarch64__)
  return 183;
#elif defined(__i386__)
  return 3;
#elif defined(__riscv)
  return 243;
#elif defined(__powerpc64__)
  return 21;
#elif defined(__s390x__)
  return 22;
#else
  return 0;
#endif
}

template <typename T>
inline void jitdump_put(std::string& out, T v) {
  char b[sizeof(T)];
  std::memcpy(b, &v, sizeof(T));
  out.append(b, sizeof(T));
}

// The 40-byte file header.
inline void append_jitdump_header(std::string& out, std::uint32_t pid, std::uint64_t timestamp_ns) {
  jitdump_put<std::uint32_t>(out, jitdump_magic);
  jitdump_put<std::uint32_t>(out, jitdump_version);
  jitdump_put<std::uint32_t>(out, jitdump_header_size);
  jitdump_put<std::uint32_t>(out, jitdump_elf_machine());
  jitdump_put<std::uint32_t>(out, 0);  // pad1
  jitdump_put<std::uint32_t>(out, pid);
  jitdump_put<std::uint64_t>(out, timestamp_ns);
  jitdump_put<std::uint64_t>(out, 0);  // flags: timestamps are CLOCK_MONOTONIC, not the TSC
}

// One JIT_CODE_LOAD record: prefix, pid, tid, vma, code_addr, code_size, code_index, name NUL, code.
// `name` must be sanitised (no NUL); `code` points at `size` readable bytes (or is null: no bytes).
inline void append_jitdump_code_load(std::string& out, std::uint32_t pid, std::uint32_t tid,
                                     std::uint64_t addr, std::uint64_t size, std::uint64_t index,
                                     std::string_view name, const void* code, std::uint64_t timestamp_ns) {
  std::uint64_t bytes = code != nullptr ? size : 0;
  std::uint64_t total = 16 + 4 + 4 + 8 * 4 + name.size() + 1 + bytes;
  jitdump_put<std::uint32_t>(out, jitdump_code_load);
  jitdump_put<std::uint32_t>(out, static_cast<std::uint32_t>(total));
  jitdump_put<std::uint64_t>(out, timestamp_ns);
  jitdump_put<std::uint32_t>(out, pid);
  jitdump_put<std::uint32_t>(out, tid);
  jitdump_put<std::uint64_t>(out, addr);  // vma
  jitdump_put<std::uint64_t>(out, addr);  // code_addr
  jitdump_put<std::uint64_t>(out, bytes);
  jitdump_put<std::uint64_t>(out, index);
  out.append(name.data(), name.size());
  out += '\0';
  if (bytes != 0) out.append(static_cast<const char*>(code), static_cast<std::size_t>(bytes));
}

// Regions larger than this are recorded without their bytes (a 32-bit record size must hold them).
constexpr std::uint64_t jitdump_max_code_bytes = std::uint64_t{64} << 20;

class jitdump_writer {
 public:
  jitdump_writer(std::string dir, long pid) : path_(path_for(dir, pid)), pid_(pid) {}
  jitdump_writer(const jitdump_writer&) = delete;
  jitdump_writer& operator=(const jitdump_writer&) = delete;
  ~jitdump_writer() { close(); }

  static std::string path_for(const std::string& dir, long pid) {
    std::string path = dir.empty() ? "." : dir;
    if (path.back() != '/') path += '/';
    path += "jit-";
    path += std::to_string(pid);
    path += ".dump";
    return path;
  }
  const std::string& path() const { return path_; }
  bool is_open() const { return fd_ >= 0; }

  // Creates the file, writes the header and maps its first page PROT_READ|PROT_EXEC: that mapping is the
  // MMAP2 event through which `perf record` finds the file. Fails on a noexec mount (EPERM).
  status open(std::uint64_t now_ns) {
    if (fd_ >= 0) return status::ok();
    safe_file f;
    status st = create_safe_file(path_, O_RDWR, "jitdump", f);
    if (!st) return st;
    std::string header;
    append_jitdump_header(header, static_cast<std::uint32_t>(pid_), now_ns);
    st = write_all(f.fd, header.data(), header.size(), path_);
    if (!st) {
      sys().close(f.fd);
      return st;
    }
    long page = ::sysconf(_SC_PAGESIZE);
    page_ = page > 0 ? static_cast<std::size_t>(page) : 4096;
    void* m = ::mmap(nullptr, page_, PROT_READ | PROT_EXEC, MAP_PRIVATE, f.fd, 0);
    if (m == MAP_FAILED) {
      int e = errno;
      sys().close(f.fd);
      std::string m = "selfprof: cannot map the jitdump ";
      m += path_;
      m += " PROT_EXEC (perf would not see it): ";
      m += std::strerror(e);
      if (e == EPERM) m += " (noexec mount? set SELFPROF_JITDUMP_DIR)";
      return status::error(std::move(m));
    }
    mapping_ = m;
    fd_ = keep_fd_high(f.fd);  // above the application's descriptors (detail/high_fd.hpp)
    return status::ok();
  }

  status write(std::string_view records) {
    if (fd_ < 0) return status::error("selfprof: jitdump " + path_ + " is not open");
    return write_all(fd_, records.data(), records.size(), path_);
  }

  void close() {
    if (mapping_ != nullptr) ::munmap(mapping_, page_);
    mapping_ = nullptr;
    if (fd_ >= 0) sys().close(fd_);
    fd_ = -1;
  }

  // After fork(): the descriptor and the file are the parent's; drop them without writing.
  void abandon_after_fork(const std::string& dir, long pid) {
    close();
    path_ = path_for(dir, pid);
    pid_ = pid;
  }

 private:
  std::string path_;
  long pid_;
  int fd_ = -1;
  void* mapping_ = nullptr;
  std::size_t page_ = 4096;
};

}  // namespace detail
}  // namespace selfprof
