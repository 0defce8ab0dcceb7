// Creating the files perf reads about JIT code (/tmp/perf-<pid>.map, jit-<pid>.dump) safely in a shared
// directory: never through a symlink, never into a file owned by someone else or hard-linked elsewhere,
// and never removing a file another writer may still be using.
// Context: any thread (setup of the JIT writers; never the signal handler).
//
// Who owns a file. Every writer holds a shared flock(2) on its file for as long as it has it open (flock
// locks belong to the open file description: a second writer in the same process conflicts like one in
// another process, and the lock goes away with the writer, however it dies). A file already at the path
// is replaced only when it is provably not in use:
// - nobody holds a lock on it (an exclusive flock can be taken), and
// - it was last written before this process started, so no writer of this process wrote it, selfprof or
//   not (CPython's -X perf, a JIT with its own map writer, another copy of selfprof), and whoever wrote
//   it then held no lock when we looked. That is the file of a dead process that had our pid before us.
// Anything else is live: the perf map is opened for appending and shared (perf maps are made to be
// appended to by every JIT of the process: perf reads the whole file at report time), the jitdump (one
// header, one writer) is refused with a message. A file created here is new, so its mtime is after the
// start of every process that could look at it: nobody takes it for stale between its creation and
// the moment we lock it.
#pragma once

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>
#include <utility>

#include "selfprof/detail/sys.hpp"
#include "selfprof/status.hpp"

namespace selfprof {
namespace detail {

struct safe_file {
  int fd = -1;
  bool replaced_stale = false;  // a file of a dead process with this pid (pids wrap) was replaced
  bool shared = false;          // a live writer's file, opened to append to it
};

// What to do with a file another writer may be using.
enum class live_file { refuse, share };

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

// When this process started, in CLOCK_REALTIME nanoseconds (the clock of file times); 0 when unknown.
// /proc/self/stat gives it in clock ticks since boot (CLOCK_BOOTTIME), rounded down to a tick.
inline std::int64_t process_start_realtime_ns() {
  int fd = ::open("/proc/self/stat", O_RDONLY | O_CLOEXEC);
  if (fd < 0) return 0;
  char buf[1024];
  ssize_t n;
  do n = ::read(fd, buf, sizeof buf - 1);
  while (n < 0 && errno == EINTR);
  ::close(fd);
  if (n <= 0) return 0;
  buf[n] = 0;
  const char* p = std::strrchr(buf, ')');  // the command name may hold spaces and parentheses
  if (p == nullptr) return 0;
  // Fields after the name: 3 (state) ... 22 (starttime).
  for (int field = 2; field < 22 && *p; ++p)
    if (*p == ' ') ++field;
  char* end = nullptr;
  unsigned long long ticks = std::strtoull(p, &end, 10);
  long hz = ::sysconf(_SC_CLK_TCK);
  struct timespec real, boot;
  if (end == p || hz <= 0 || ::clock_gettime(CLOCK_REALTIME, &real) != 0 ||
      ::clock_gettime(CLOCK_BOOTTIME, &boot) != 0)
    return 0;
  const std::int64_t boot_at =
      (std::int64_t(real.tv_sec) - boot.tv_sec) * 1000000000 + (real.tv_nsec - boot.tv_nsec);
  return boot_at + static_cast<std::int64_t>(ticks / static_cast<unsigned long long>(hz)) * 1000000000 +
         static_cast<std::int64_t>(ticks % static_cast<unsigned long long>(hz)) * (1000000000 / hz);
}

// True when `st` was last modified before this process started: with a second of slack for the clock
// being stepped, a file written in the second before our start counts as possibly ours (kept, not removed).
inline bool written_before_this_process(const struct stat& st) {
  const std::int64_t start = process_start_realtime_ns();
  if (start == 0) return false;  // cannot tell: keep it
  const std::int64_t mtime = std::int64_t(st.st_mtim.tv_sec) * 1000000000 + st.st_mtim.tv_nsec;
  return mtime < start - 1000000000;
}

// Takes a shared flock on fd. Another writer holds an exclusive one only for the moment it takes to
// decide a file is stale: waits up to about half a second, never longer. 0: locked; EWOULDBLOCK: still
// held exclusively; another errno: the filesystem has no flock (the file is used unlocked).
inline int lock_shared(int fd) {
  for (int i = 0; i < 500; ++i) {
    if (::flock(fd, LOCK_SH | LOCK_NB) == 0) return 0;
    if (errno == EINTR) continue;
    if (errno != EWOULDBLOCK) return errno;
    struct timespec ms {
      0, 1000000
    };
    ::nanosleep(&ms, nullptr);
  }
  return EWOULDBLOCK;
}

// True when `path` (not followed) is still the file open at fd.
inline bool still_at(const std::string& path, int fd) {
  struct stat a, b;
  return ::lstat(path.c_str(), &a) == 0 && ::fstat(fd, &b) == 0 && a.st_dev == b.st_dev &&
         a.st_ino == b.st_ino;
}

// Opens `path` for writing (`extra_flags`: O_WRONLY|O_APPEND or O_RDWR), holding a shared flock on it
// until the descriptor is closed. A new file is created with O_CREAT|O_EXCL|O_NOFOLLOW|O_CLOEXEC and mode
// 0644 (whatever the umask), owned by the effective user. What is already there:
// - a symlink, anything not a regular file, a file owned by another user or with other hard links:
//   refused; nothing is opened, followed, truncated or removed;
// - a regular file of ours that is provably not in use (see the top of this file): unlinked and created
//   again with O_EXCL (as QEMU does); `replaced_stale` is set;
// - any other regular file of ours: a live writer's. `live` says whether to share it (opened without
//   O_CREAT or O_TRUNC, `shared` set) or to refuse it. `what` names the file in messages.
inline status create_safe_file(const std::string& path, int extra_flags, const char* what, safe_file& out,
                               live_file live = live_file::refuse) {
  out = safe_file{};
  const int flags = O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC | extra_flags;
  const int existing_flags =
      (extra_flags & ~(O_CREAT | O_EXCL | O_TRUNC)) | O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK;
  for (int attempt = 0; attempt < 6; ++attempt) {
    int fd = sys().open(path.c_str(), flags, 0644);
    if (fd >= 0) {
      // The umask may have taken bits away; perf run by another user (root) reads the file.
      int rc = ::fchmod(fd, 0644);  // on failure the umask's mode stays: still readable by us and root
      (void)rc;
      // Removed by a writer that found it unlocked and old before we locked it: cannot happen (it is
      // newer than any process), but a foreign tool may have: start over.
      if (lock_shared(fd) == EWOULDBLOCK || !still_at(path, fd)) {
        sys().close(fd);
        continue;
      }
      out.fd = fd;
      return status::ok();
    }
    int e = errno;
    if (e != EEXIST) {
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
    // Open what lstat saw (O_NOFOLLOW; O_NONBLOCK in case it became a FIFO) and check it is that file.
    fd = sys().open(path.c_str(), existing_flags, 0);
    if (fd < 0) {
      e = errno;
      if (e == ENOENT || e == ELOOP || e == ENXIO) continue;  // replaced meanwhile: look again
      return file_error("selfprof: cannot open ", what, path, std::strerror(e));
    }
    struct stat fs;
    if (::fstat(fd, &fs) != 0 || fs.st_dev != st.st_dev || fs.st_ino != st.st_ino || !S_ISREG(fs.st_mode)) {
      sys().close(fd);
      continue;
    }
    int fl = ::fcntl(fd, F_GETFL);
    if (fl >= 0) (void)::fcntl(fd, F_SETFL, fl & ~O_NONBLOCK);
    const int lock_error = ::flock(fd, LOCK_EX | LOCK_NB) == 0 ? 0 : errno;
    const bool unlocked = lock_error == 0;
    if (unlocked && written_before_this_process(fs)) {
      // Provably stale. We hold the exclusive lock: whoever opens it now waits for us, then finds it gone.
      if (still_at(path, fd) && ::unlink(path.c_str()) != 0 && errno != ENOENT) {
        e = errno;
        sys().close(fd);
        return file_error("selfprof: cannot replace the stale ", what, path, std::strerror(e));
      }
      sys().close(fd);
      out.replaced_stale = true;
      continue;
    }
    if (live == live_file::refuse) {
      sys().close(fd);
      return file_error("selfprof: refusing to replace ", what, path,
                        unlocked ? "it was written since this process started (another writer here?)"
                        : lock_error == EWOULDBLOCK
                            ? "another writer has it open (it is locked)"
                            : "it may be in use (no file locks on this filesystem to tell)",
                        "; set another directory. Nothing was written to it");
    }
    // Share it: appending under a shared lock, like the writer that made it.
    if (lock_shared(fd) == EWOULDBLOCK || !still_at(path, fd)) {
      sys().close(fd);
      continue;
    }
    out.fd = fd;
    out.shared = true;
    return status::ok();
  }
  return file_error("selfprof: cannot create ", what, path, "something keeps replacing it");
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
