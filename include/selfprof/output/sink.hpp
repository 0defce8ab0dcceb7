// The file sink: writes a profile's bytes to a path atomically (temp file + rename), mode 0600, never
// through a symbolic link and, unless told otherwise, never into a directory other users can write.
// Context: any thread except the signal handler (the collector thread on a dump, or the CLI).
//
// Policy, in the order it is checked (every refusal names the path and the reason):
//  1. The directory is opened once, without following a symbolic link in any of its components, and
//     every later step works relative to that descriptor, so nothing is resolved by path again and a
//     directory swapped underneath us cannot redirect the write (safe_dir.hpp).
//  2. Every directory on the way, and the destination, is judged by mode and owner (safe_dir.hpp): a
//     *shared* one (writable by users other than us) is refused unless `sink_options::allow_shared_dir`
//     when it has no sticky bit (anyone may rename or delete our file after we wrote it, or replace
//     the next component) or belongs to neither us nor root (the sticky bit does not restrain its
//     owner). /tmp and /var/tmp (root's, sticky) pass.
//  3. The target itself must not be a symbolic link, even a dangling one, nor anything but a regular
//     file (a FIFO, a device or a directory is refused): we replace files, we do not write into them.
//     In a shared directory an existing target owned by someone else is refused (someone planted it;
//     Linux's fs.protected_regular would refuse it as well).
//  4. The bytes go to a fresh temp file ".<name>.tmp-<16 random hex digits>" in the same directory (the
//     name is not guessable in advance; a taken one is retried), created with
//     O_CREAT|O_EXCL|O_NOFOLLOW|O_CLOEXEC and mode 0600 (and fchmod 0600, whatever the umask), written
//     with a full write loop that retries EINTR, fsync'ed, closed (close errors count: NFS reports
//     write-back failures there), then renamed over the target. The directory is fsync'ed afterwards.
//  5. On any failure the temp file is removed and the old target (if any) is left untouched.
#pragma once

#include <fcntl.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>
#include <utility>

#include "selfprof/detail/sys.hpp"
#include "selfprof/output/safe_dir.hpp"
#include "selfprof/status.hpp"

namespace selfprof {

struct sink_options {
  // Write into a directory that other users can write without the sticky bit (see the policy above).
  bool allow_shared_dir = false;
  // fsync the file before the rename and the directory after it. Off only for tests and benchmarks.
  bool sync = true;
};

namespace detail {

// "selfprof: cannot write PATH: REASON"
inline status sink_error(const std::string& path, const std::string& reason) {
  std::string message = "selfprof: cannot write ";
  message += path;
  message += ": ";
  message += reason;
  return status::error(std::move(message));
}

// Splits "a/b/c" into "a/b" and "c"; "c" into "." and "c"; "/c" into "/" and "c".
inline void split_path(const std::string& path, std::string& dir, std::string& base) {
  const auto slash = path.find_last_of('/');
  if (slash == std::string::npos) {
    dir = ".";
    base = path;
  } else {
    dir = slash == 0 ? std::string("/") : path.substr(0, slash);
    base = path.substr(slash + 1);
  }
}

// Owns a descriptor opened through the seam and closes it through the seam.
class sink_fd {
 public:
  explicit sink_fd(int fd) : fd_(fd) {}
  sink_fd(const sink_fd&) = delete;
  sink_fd& operator=(const sink_fd&) = delete;
  ~sink_fd() { reset(); }
  int get() const { return fd_; }
  // Closes now and returns close()'s result (0 when there was nothing to close).
  int reset() {
    int rc = 0;
    if (fd_ >= 0) rc = sys().close(fd_);
    fd_ = -1;
    return rc;
  }

 private:
  int fd_;
};

// Writes all of `bytes`, retrying EINTR and short writes. Returns 0 or an errno value.
inline int write_all(int fd, std::string_view bytes) {
  const char* p = bytes.data();
  std::size_t left = bytes.size();
  while (left > 0) {
    const ssize_t n = ::write(fd, p, left);
    if (n < 0) {
      if (errno == EINTR) continue;
      return errno;
    }
    if (n == 0) return EIO;  // a regular file never returns 0 for a non-empty write
    p += n;
    left -= static_cast<std::size_t>(n);
  }
  return 0;
}

// 64 bits nobody can guess in advance: getrandom(2), else /dev/urandom, else (neither available, as in
// some sandboxes) the clock, the pid and a counter, mixed: not secret, but not known ahead of time.
inline std::uint64_t random_u64() {
  std::uint64_t v = 0;
#ifdef SYS_getrandom
  constexpr unsigned grnd_nonblock = 0x0001;  // GRND_NONBLOCK (getrandom(2)): never wait for the pool
  if (::syscall(SYS_getrandom, &v, sizeof v, grnd_nonblock) == static_cast<long>(sizeof v)) return v;
#endif
  const int fd = ::open("/dev/urandom", O_RDONLY | O_CLOEXEC);
  if (fd >= 0) {
    const ssize_t n = ::read(fd, &v, sizeof v);
    ::close(fd);
    if (n == static_cast<ssize_t>(sizeof v)) return v;
  }
  static std::atomic<std::uint64_t> counter{0};
  struct timespec ts {};
  ::clock_gettime(CLOCK_REALTIME, &ts);
  v = static_cast<std::uint64_t>(ts.tv_sec) * 1000000007u + static_cast<std::uint64_t>(ts.tv_nsec);
  v ^= static_cast<std::uint64_t>(::getpid()) << 40;
  v += counter.fetch_add(1, std::memory_order_relaxed) * 0x9e3779b97f4a7c15u;
  // splitmix64's finalizer: every input bit moves about half of the output bits.
  v = (v ^ (v >> 30)) * 0xbf58476d1ce4e5b9u;
  v = (v ^ (v >> 27)) * 0x94d049bb133111ebu;
  return v ^ (v >> 31);
}

// ".<base>.tmp-<16 random hex digits>". A long base keeps its first 200 bytes, so the temp name stays
// under NAME_MAX (255).
inline std::string temp_name_for(const std::string& base) {
  static const char digits[] = "0123456789abcdef";
  std::string name = ".";
  name.append(base, 0, 200);
  name += ".tmp-";
  const std::uint64_t r = random_u64();
  for (int shift = 60; shift >= 0; shift -= 4) name += digits[(r >> shift) & 0xf];
  return name;
}

// Writes `bytes` to `path` atomically, following the policy at the top of this file. `how` chooses how
// the directory is opened (tests force the walk that stands in for openat2 on older kernels).
inline status write_file_atomic(const std::string& path, std::string_view bytes, const sink_options& opts,
                                dir_resolver how) {
  if (path.empty()) return status::error("selfprof: cannot write an empty path");
  std::string dir, base;
  split_path(path, dir, base);
  if (base.empty() || base == "." || base == "..")
    return sink_error(path, "not a file name (the path ends in '/', '.' or '..')");

  const opened_dir d = open_dir_nofollow(dir, opts.allow_shared_dir, how);
  if (!d.error.empty()) return sink_error(path, d.error);
  const int dirfd = d.fd.get();
  const bool shared = dir_is_shared(d.st);

  struct stat tst {};
  if (::fstatat(dirfd, base.c_str(), &tst, AT_SYMLINK_NOFOLLOW) == 0) {
    if (S_ISLNK(tst.st_mode))
      return sink_error(path, "the target is a symbolic link (refusing to follow it)");
    if (!S_ISREG(tst.st_mode)) return sink_error(path, "the target exists and is not a regular file");
    if (shared && tst.st_uid != ::geteuid() && !opts.allow_shared_dir)
      return sink_error(path, "the target exists in a shared directory and belongs to another user (uid " +
                                  std::to_string(tst.st_uid) + ")");
  } else if (errno != ENOENT) {
    return sink_error(path, errno_text(errno));
  }

  std::string temp;
  int tfd = -1;
  for (unsigned attempt = 0; attempt < 100; ++attempt) {
    temp = temp_name_for(base);
    tfd = sys().openat(dirfd, temp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
    if (tfd >= 0 || errno != EEXIST) break;
  }
  if (tfd < 0) return sink_error(path, errno_text(errno));
  sink_fd file(tfd);

  auto fail = [&](int err, const char* step) {
    file.reset();
    ::unlinkat(dirfd, temp.c_str(), 0);
    std::string reason = errno_text(err);
    if (step) {
      reason += " (";
      reason += step;
      reason += ')';
    }
    return sink_error(path, reason);
  };

  if (::fchmod(file.get(), 0600) != 0) return fail(errno, "fchmod");
  if (const int err = write_all(file.get(), bytes)) return fail(err, "write");
  if (opts.sync && ::fsync(file.get()) != 0) return fail(errno, "fsync");
  if (file.reset() != 0) return fail(errno, "close");
  if (::renameat(dirfd, temp.c_str(), dirfd, base.c_str()) != 0) return fail(errno, "rename");
  if (opts.sync) ::fsync(dirfd);  // best effort: the file is complete either way
  return status::ok();
}

inline status write_file_atomic(const std::string& path, std::string_view bytes,
                                const sink_options& opts = {}) {
  return write_file_atomic(path, bytes, opts, dir_resolver::openat2_first);
}

}  // namespace detail
}  // namespace selfprof
