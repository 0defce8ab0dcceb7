// Creating the files perf reads about JIT code (/tmp/perf-<pid>.map, jit-<pid>.dump) safely in a shared
// directory: never through a symlink, never into a file owned by someone else or hard-linked elsewhere.
// Context: any thread (setup of the JIT writers; never the signal handler).
#pragma once

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <string>
#include <utility>

#include "selfprof/detail/sys.hpp"
#include "selfprof/status.hpp"

namespace selfprof {
namespace detail {

struct safe_file {
  int fd = -1;
  bool replaced_stale = false;  // a file of ours from an earlier process with this pid was replaced
};

// Creates `path` fresh with O_CREAT|O_EXCL|O_NOFOLLOW|O_CLOEXEC and mode 0644 (whatever the umask) for
// writing (`extra_flags`, e.g. O_APPEND or O_RDWR), owned by the effective user. What is already there:
// - a regular file owned by us with one link: a stale file from a dead process with the same pid (pids
//   wrap) or from before an exec; it is unlinked and the file created again with O_EXCL (as QEMU does);
// - a symlink, anything not a regular file, a file owned by another user or with other hard links: refused,
//   nothing is opened, followed, truncated or removed. `what` names the file in messages.
// "<head><what> <path>: <reason>", the shape of every message below.
inline status file_error(const char* head, const char* what, const std::string& path, const char* reason,
                         const char* more = "") {
  std::string m = head;
  m += what;
  m += ' ';
  m += path;
  m += ": ";
  m += reason;
  m += more;
  return status::error(std::move(m));
}

inline status create_safe_file(const std::string& path, int extra_flags, const char* what, safe_file& out) {
  out = safe_file{};
  const int flags = O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC | extra_flags;
  for (int attempt = 0; attempt < 2; ++attempt) {
    int fd = sys().open(path.c_str(), flags, 0644);
    if (fd >= 0) {
      // The umask may have taken bits away; perf run by another user (root) reads the file.
      int rc = ::fchmod(fd, 0644);  // on failure the umask's mode stays: still readable by us and root
      (void)rc;
      out.fd = fd;
      return status::ok();
    }
    int e = errno;
    if (e != EEXIST || attempt == 1) {
      return file_error("selfprof: cannot create ", what, path, std::strerror(e));
    }
    struct stat st;
    if (::lstat(path.c_str(), &st) != 0) continue;  // gone meanwhile: try again
    std::string refuse;
    if (S_ISLNK(st.st_mode)) {
      refuse = "it is a symbolic link";
    } else if (!S_ISREG(st.st_mode)) {
      refuse = "it is not a regular file";
    } else if (st.st_uid != ::geteuid()) {
      refuse = "it is owned by uid ";
      refuse += std::to_string(st.st_uid);
      refuse += ", not by this process's user (uid ";
      refuse += std::to_string(::geteuid());
      refuse += ')';
    } else if (st.st_nlink != 1) {
      refuse = "it has ";
      refuse += std::to_string(st.st_nlink);
      refuse += " hard links";
    }
    if (!refuse.empty()) {
      return file_error("selfprof: refusing to write ", what, path, refuse.c_str(),
                        " (a stale or hostile file); remove it or set another directory. Nothing was "
                        "written to it");
    }
    if (::unlink(path.c_str()) != 0 && errno != ENOENT) {
      return file_error("selfprof: cannot replace the stale ", what, path, std::strerror(errno));
    }
    out.replaced_stale = true;
  }
  return file_error("selfprof: cannot create ", what, path, "something keeps re-creating it");
}

// Writes all of [data, data+size) to fd, retrying on EINTR and short writes.
inline status write_all(int fd, const char* data, std::size_t size, const std::string& path) {
  while (size > 0) {
    ssize_t n = ::write(fd, data, size);
    if (n < 0) {
      if (errno == EINTR) continue;
      std::string m = "selfprof: writing ";
      m += path;
      m += " failed: ";
      m += std::strerror(errno);
      return status::error(std::move(m));
    }
    data += n;
    size -= static_cast<std::size_t>(n);
  }
  return status::ok();
}

}  // namespace detail
}  // namespace selfprof
