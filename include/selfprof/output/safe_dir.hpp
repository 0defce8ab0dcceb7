// Opens the directory an output file goes into without following a symbolic link in any component, and
// judges, by mode and owner, whether other users could swap what the path leads to.
// Context: any thread except the signal handler (the dumper thread, an API caller, or the CLI).
//
// The path. `..` is resolved lexically: it cancels the name before it, which is then never opened (no
// component may be a link, so the text and the kernel's walk agree). `..` left at the start of a
// relative path go up from the working directory, by the kernel's `..` of an open directory, which is
// never a link; "/.." is "/". A relative path starts at the working directory, however it was reached.
//
// Opening, two ways that judge the same directories and give the same verdicts:
//  - openat2(2) with RESOLVE_NO_SYMLINKS (Linux 5.6) opens the whole path in one call; then the
//    directories it looked names up in are judged by climbing `..` from the opened descriptor (a
//    directory moves to another parent only with write permission on it).
//  - the walk, used when openat2 fails for any reason (ENOSYS on older kernels, EPERM from a seccomp
//    filter; or ENOENT, ELOOP, EACCES, ... so that the error names the component): one component at a
//    time, openat(O_PATH|O_NOFOLLOW) relative to the descriptor of the previous one, judged before a name
//    is looked up in it; a component that is a symbolic link or not a directory is refused.
// Nothing is resolved by path after it was judged: the caller works relative to the returned descriptor.
//
// The judgement, the same for every directory a name is looked up in and for the destination itself. A
// directory is *shared* when users other than us can write it: writable by "other", or by its group
// when that group is not our effective group (with user-private groups and umask 002 a user's own 0775
// directory is not shared). A shared directory is refused, unless `allow_shared`, when
//   - it has no sticky bit: anyone who can write it may rename, delete or replace its entries (the next
//     component, or our file after we wrote it), whoever owns the directory;
//   - it belongs to neither us nor root: the sticky bit does not restrain the directory's owner.
// /tmp (root's, sticky) passes; a directory that is not shared passes whoever owns it.
#pragma once

#include <fcntl.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#if __has_include(<linux/openat2.h>)
#include <linux/openat2.h>
#endif

#include <cerrno>
#include <cstdint>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

namespace selfprof {
namespace detail {

#ifdef RESOLVE_NO_SYMLINKS
using open_how_v0 = ::open_how;
constexpr std::uint64_t k_resolve_no_symlinks = RESOLVE_NO_SYMLINKS;
constexpr std::uint64_t k_resolve_no_magiclinks = RESOLVE_NO_MAGICLINKS;
#else
// The kernel's struct open_how and flags (include/uapi/linux/openat2.h), for headers older than 5.6.
struct open_how_v0 {
  std::uint64_t flags;
  std::uint64_t mode;
  std::uint64_t resolve;
};
constexpr std::uint64_t k_resolve_no_symlinks = 0x04;
constexpr std::uint64_t k_resolve_no_magiclinks = 0x02;
#endif

// Which way open_dir_nofollow resolves: openat2 with the walk as fallback, or the walk only (tests).
enum class dir_resolver { openat2_first, walk_only };

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

// A descriptor closed on destruction (directory descriptors: opened and closed outside the seam).
class owned_fd {
 public:
  owned_fd() = default;
  explicit owned_fd(int fd) : fd_(fd) {}
  owned_fd(owned_fd&& o) noexcept : fd_(std::exchange(o.fd_, -1)) {}
  owned_fd& operator=(owned_fd&& o) noexcept {
    if (this != &o) {
      if (fd_ >= 0) ::close(fd_);
      fd_ = std::exchange(o.fd_, -1);
    }
    return *this;
  }
  owned_fd(const owned_fd&) = delete;
  owned_fd& operator=(const owned_fd&) = delete;
  ~owned_fd() {
    if (fd_ >= 0) ::close(fd_);
  }
  int get() const { return fd_; }

 private:
  int fd_ = -1;
};

// A directory path after the lexical pass described at the top of this file.
struct dir_path {
  bool absolute = false;
  unsigned up = 0;                 // leading ".." of a relative path
  std::vector<std::string> names;  // the other components, without "", "." and the names ".." cancelled

  // The directory that holds names[n], as text ("/", ".", "../a", "/a/b"); n == names.size(): the whole.
  std::string prefix(std::size_t n) const {
    std::string s = absolute ? "/" : "";
    for (unsigned i = 0; i < up; ++i) s += "../";
    for (std::size_t i = 0; i < n && i < names.size(); ++i) s += names[i] + "/";
    if (s.size() > 1) s.pop_back();
    return s.empty() ? std::string(".") : s;
  }
};

inline dir_path parse_dir_path(const std::string& dir) {
  dir_path p;
  p.absolute = !dir.empty() && dir[0] == '/';
  std::size_t i = 0;
  while (i <= dir.size()) {
    std::size_t end = dir.find('/', i);
    if (end == std::string::npos) end = dir.size();
    const std::string name = dir.substr(i, end - i);
    if (name == "..") {
      if (!p.names.empty()) {
        p.names.pop_back();
      } else if (!p.absolute) {
        ++p.up;
      }
    } else if (!name.empty() && name != ".") {
      p.names.push_back(name);
    }
    i = end + 1;
  }
  return p;
}

// True when users other than us may create, rename or delete entries of a directory with this stat.
inline bool dir_is_shared(const struct stat& st) {
  if (st.st_mode & S_IWOTH) return true;
  if ((st.st_mode & S_IWGRP) && st.st_gid != ::getegid()) return true;
  return false;
}

// Why a directory with this stat is refused (the judgement above), or "" when it is not.
inline std::string dir_refusal(const struct stat& st, bool allow_shared) {
  if (allow_shared || !dir_is_shared(st)) return "";
  const char* const tail = " (refusing; allow_shared_dir overrides)";
  if (!(st.st_mode & S_ISVTX)) return std::string("is writable by other users and has no sticky bit") + tail;
  if (st.st_uid != ::geteuid() && st.st_uid != 0)
    return "is writable by other users and belongs to another user (uid " + std::to_string(st.st_uid) +
           "), who may rename or delete entries despite the sticky bit" + tail;
  return "";
}

// The destination directory, or why it was refused.
struct opened_dir {
  owned_fd fd;        // O_RDONLY|O_DIRECTORY (fsync needs more than O_PATH); -1 when refused
  struct stat st {};  // the destination's stat
  std::string error;  // names the directory or component; empty when fd is open
};

inline opened_dir dir_refused(std::string why) {
  opened_dir out;
  out.error = std::move(why);
  return out;
}

// The walk (see the top of this file). Public for tests: on a kernel with openat2 it runs only on errors.
inline opened_dir open_dir_walk(const std::string& dir, bool allow_shared) {
  const dir_path p = parse_dir_path(dir);
  const std::string start = p.prefix(0), whole = p.prefix(p.names.size()), dotdot = "..";
  // Takes errno as an argument, read before any message is built (allocation may change errno).
  auto failed = [](int err, const char* kind, const std::string& name) {
    return dir_refused(std::string(kind) + " '" + name + "': " + errno_text(err));
  };
  owned_fd cur(::open(p.absolute ? "/" : ".", O_PATH | O_DIRECTORY | O_CLOEXEC));
  if (cur.get() < 0) return failed(errno, "directory", start);
  for (unsigned i = 0; i < p.up; ++i) {
    owned_fd parent(::openat(cur.get(), "..", O_PATH | O_DIRECTORY | O_CLOEXEC));
    if (parent.get() < 0) return failed(errno, "component", dotdot);
    cur = std::move(parent);
  }
  struct stat st {};
  if (::fstat(cur.get(), &st) != 0) return failed(errno, "directory", start);
  for (std::size_t i = 0; i < p.names.size(); ++i) {
    const std::string why = dir_refusal(st, allow_shared);
    if (!why.empty()) return dir_refused("directory '" + p.prefix(i) + "' " + why);
    const std::string& name = p.names[i];
    // Without O_DIRECTORY a link opens as itself (O_PATH|O_NOFOLLOW), so fstat tells a link from a file.
    owned_fd next(::openat(cur.get(), name.c_str(), O_PATH | O_NOFOLLOW | O_CLOEXEC));
    if (next.get() < 0 || ::fstat(next.get(), &st) != 0) return failed(errno, "component", name);
    if (S_ISLNK(st.st_mode))
      return dir_refused("component '" + name + "' is a symbolic link (refusing to follow it)");
    if (!S_ISDIR(st.st_mode)) return dir_refused("component '" + name + "' is not a directory");
    cur = std::move(next);
  }
  opened_dir out;
  out.fd = owned_fd(::openat(cur.get(), ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (out.fd.get() < 0 || ::fstat(out.fd.get(), &out.st) != 0) return failed(errno, "directory", whole);
  const std::string why = dir_refusal(out.st, allow_shared);
  if (!why.empty()) return dir_refused("directory '" + whole + "' " + why);
  return out;
}

// openat2 and the climb (see the top of this file). False when a system call failed: the walk then
// decides and names the component. True with `out` set otherwise (opened, or refused by the judgement).
inline bool open_dir_openat2(const std::string& dir, bool allow_shared, opened_dir& out) {
#ifdef SYS_openat2
  const dir_path p = parse_dir_path(dir);
  const std::string whole = p.prefix(p.names.size());
  open_how_v0 how{};
  how.flags = O_RDONLY | O_DIRECTORY | O_CLOEXEC;
  how.resolve = k_resolve_no_symlinks | k_resolve_no_magiclinks;
  const long fd = ::syscall(SYS_openat2, AT_FDCWD, whole.c_str(), &how, sizeof how);
  if (fd < 0) return false;
  owned_fd dest(static_cast<int>(fd));
  struct stat st {};
  if (::fstat(dest.get(), &st) != 0) return false;
  // Each `..` is the directory that holds the next name up (the last one: the start). The refusal kept
  // is the topmost, the one the walk reports.
  std::string refusal;
  owned_fd cur;
  int at = dest.get();
  for (std::size_t i = p.names.size(); i-- > 0;) {
    owned_fd parent(::openat(at, "..", O_PATH | O_DIRECTORY | O_CLOEXEC));
    struct stat pst {};
    if (parent.get() < 0 || ::fstat(parent.get(), &pst) != 0) return false;
    const std::string why = dir_refusal(pst, allow_shared);
    if (!why.empty()) refusal = "directory '" + p.prefix(i) + "' " + why;
    cur = std::move(parent);
    at = cur.get();
  }
  if (refusal.empty()) {
    const std::string why = dir_refusal(st, allow_shared);
    if (!why.empty()) refusal = "directory '" + whole + "' " + why;
  }
  out = opened_dir();
  if (!refusal.empty()) {
    out.error = std::move(refusal);
  } else {
    out.fd = std::move(dest);
    out.st = st;
  }
  return true;
#else
  (void)dir, (void)allow_shared, (void)out;
  return false;
#endif
}

// Opens `dir` for an output file: no symbolic link in any component, every directory judged.
inline opened_dir open_dir_nofollow(const std::string& dir, bool allow_shared,
                                    dir_resolver how = dir_resolver::openat2_first) {
  opened_dir out;
  if (how == dir_resolver::openat2_first && open_dir_openat2(dir, allow_shared, out)) return out;
  return open_dir_walk(dir, allow_shared);
}

}  // namespace detail
}  // namespace selfprof
