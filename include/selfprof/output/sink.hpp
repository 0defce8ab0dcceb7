// The file sink: writes a profile's bytes to a path atomically (temp file + rename), mode 0600, never
// through a symbolic link and, unless told otherwise, never into a directory other users can write.
// Context: any thread except the signal handler (the collector thread on a dump, or the CLI).
//
// Policy, in the order it is checked (every refusal names the path and the reason):
//  1. The directory is opened once (O_DIRECTORY) and every later step works relative to that
//     descriptor, so a directory path swapped underneath us cannot redirect the write.
//  2. The target itself must not be a symbolic link, even a dangling one, nor anything but a regular
//     file (a FIFO, a device or a directory is refused): we replace files, we do not write into them.
//  3. A *shared* directory is one writable by "other" users, or writable by its group when that group
//     is not our effective group (with user-private groups and umask 002 a user's own 0775 directory
//     is not shared). In a shared directory:
//       - without the sticky bit anyone may rename or delete our file after we wrote it, or replace it
//         between our checks: refused unless `sink_options::allow_shared_dir`;
//       - with the sticky bit (/tmp, /var/tmp) other users cannot touch our files, so the write is
//         allowed, but an existing target owned by someone else is refused (someone planted it;
//         Linux's fs.protected_regular would refuse it as well).
//  4. The bytes go to a fresh temp file ".<name>.tmp-<pid>-<n>" in the same directory, created with
//     O_CREAT|O_EXCL|O_NOFOLLOW|O_CLOEXEC and mode 0600 (and fchmod 0600, whatever the umask), written
//     with a full write loop that retries EINTR, fsync'ed, closed (close errors count: NFS reports
//     write-back failures there), then renamed over the target. The directory is fsync'ed afterwards.
//  5. On any failure the temp file is removed and the old target (if any) is left untouched.
#pragma once

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <string>
#include <string_view>
#include <utility>

#include "selfprof/detail/sys.hpp"
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

inline std::string errno_text(int err) {
  char buf[256];
  // GNU strerror_r returns the message pointer (which may or may not be buf).
#if defined(__GLIBC__) && defined(_GNU_SOURCE)
  const char* text = ::strerror_r(err, buf, sizeof buf);
  return text ? std::string(text) : std::string("error ") + std::to_string(err);
#else
  if (::strerror_r(err, buf, sizeof buf) != 0) return "error " + std::to_string(err);
  return std::string(buf);
#endif
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

// True when users other than us may create, rename or delete entries of a directory with this stat.
inline bool dir_is_shared(const struct stat& st) {
  if (st.st_mode & S_IWOTH) return true;
  if ((st.st_mode & S_IWGRP) && st.st_gid != ::getegid()) return true;
  return false;
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

inline std::string temp_name_for(const std::string& base, unsigned attempt) {
  static std::atomic<unsigned> counter{0};
  const unsigned n = counter.fetch_add(1, std::memory_order_relaxed);
  // A long name keeps its first 200 bytes so the temp name stays under NAME_MAX (255).
  std::string name = ".";
  name.append(base, 0, 200);
  name += ".tmp-";
  name += std::to_string(::getpid());
  name += '-';
  name += std::to_string(n);
  name += '-';
  name += std::to_string(attempt);
  return name;
}

// Writes `bytes` to `path` atomically, following the policy at the top of this file.
inline status write_file_atomic(const std::string& path, std::string_view bytes,
                                const sink_options& opts = {}) {
  if (path.empty()) return status::error("selfprof: cannot write an empty path");
  std::string dir, base;
  split_path(path, dir, base);
  if (base.empty() || base == "." || base == "..")
    return sink_error(path, "not a file name (the path ends in '/', '.' or '..')");

  sink_fd dirfd(sys().open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC, 0));
  auto dir_error = [&path, &dir](int err) {
    return sink_error(path, "directory " + dir + ": " + errno_text(err));
  };
  if (dirfd.get() < 0) return dir_error(errno);

  struct stat dst {};
  if (::fstat(dirfd.get(), &dst) != 0) return dir_error(errno);
  const bool shared = dir_is_shared(dst);
  const bool sticky = (dst.st_mode & S_ISVTX) != 0;
  if (shared && !sticky && !opts.allow_shared_dir)
    return sink_error(path, "directory " + dir +
                                " is writable by other users and has no sticky bit (refusing; "
                                "allow_shared_dir overrides)");

  struct stat tst {};
  if (::fstatat(dirfd.get(), base.c_str(), &tst, AT_SYMLINK_NOFOLLOW) == 0) {
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
    temp = temp_name_for(base, attempt);
    tfd = sys().openat(dirfd.get(), temp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
    if (tfd >= 0 || errno != EEXIST) break;
  }
  if (tfd < 0) return sink_error(path, errno_text(errno));
  sink_fd file(tfd);

  auto fail = [&](int err, const char* step) {
    file.reset();
    ::unlinkat(dirfd.get(), temp.c_str(), 0);
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
  if (::renameat(dirfd.get(), temp.c_str(), dirfd.get(), base.c_str()) != 0) return fail(errno, "rename");
  if (opts.sync) ::fsync(dirfd.get());  // best effort: the file is complete either way
  return status::ok();
}

}  // namespace detail
}  // namespace selfprof
