// libselfprof-preload.so: profiles an unmodified program. Loaded with LD_PRELOAD (usually by
// `selfprof record`), it starts sampling when it loads (SELFPROF_* environment: SELFPROF_OUT gives the
// exit dump, SIGUSR2 and SELFPROF_INTERVAL give dumps while running) and interposes pthread_create so
// every new thread is armed before its start routine runs. It also interposes _exit/_Exit, which skip
// atexit handlers, so a program leaving that way (dash's `exit`) still writes its exit profile, and the
// exec family (execve, execv, execvp, execvpe, execl, execlp, execle, fexecve, execveat), to stop
// sampling before the image is replaced, posix_spawn/posix_spawnp, so a child does not inherit the dump
// signal's block, and sigaction/signal/bsd_signal, to move off the sampling or dump signal when the program
// claims it.
//
// exec'd children: unless SELFPROF_FOLLOW_EXEC=1, the library removes itself from LD_PRELOAD in this
// process's environment as soon as it is loaded, so programs this one executes are not profiled
// (forks that do not exec are the same program; they inherit the library and follow the profiler's
// fork policy). Build with -fvisibility=hidden: only those interposed functions are exported, so a
// program that embeds selfprof itself keeps its own copy of the inline functions.
#include <alloca.h>
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <spawn.h>
#include <stdarg.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <new>
#include <string>

// The preload holds its own copy of the implementation, hidden (-fvisibility=hidden), even where the build
// is in compiled mode: a program that embeds selfprof keeps its own.
#define SELFPROF_IMPLEMENTATION
#include <selfprof.hpp>

namespace {

using create_fn = int (*)(pthread_t*, const pthread_attr_t*, void* (*)(void*), void*);

create_fn real_pthread_create() {
  static create_fn real = reinterpret_cast<create_fn>(::dlsym(RTLD_NEXT, "pthread_create"));
  return real;
}

struct start_args {
  void* (*fn)(void*);
  void* arg;
};

void* armed_start(void* p) {
  start_args a = *static_cast<start_args*>(p);
  delete static_cast<start_args*>(p);
  // Armed at once, its signal mask untouched: a thread that blocks the sampling signal (to sigwait for
  // it) keeps it blocked and is not sampled.
  if (selfprof::running()) {
    selfprof::detail::arm_thread_altstack();  // from the thread itself, before its first tick
    (void)selfprof::detail::profiler_core::instance().register_current_thread(false);
  }
  return a.fn(a.arg);
}

bool is_this_library(const std::string& entry, const char* self) {
  if (self && entry == self) return true;
  const std::size_t slash = entry.rfind('/');
  return entry.compare(slash == std::string::npos ? 0 : slash + 1, std::string::npos,
                       "libselfprof-preload.so") == 0;
}

// Without --follow-exec, programs this one executes must not load the library. Removing it from this
// process's LD_PRELOAD covers the exec calls that pass `environ`; a shell keeps its own copy of the
// exported variables and passes that to execve, so the exec hooks also replace an "LD_PRELOAD=" entry
// equal to the one this process started with by g_kept_env (empty: the entry is dropped). Both strings
// are made here, at load: the hooks may run in a vfork child, where allocating is not safe. Plain
// pointers (constant-initialized): this file's constructor may run before its dynamic initializers.
const char* g_started_env = nullptr;
const char* g_kept_env = nullptr;

void remove_from_ld_preload() {
  const char* old = std::getenv("LD_PRELOAD");
  if (!old) return;
  Dl_info info{};
  const char* self =
      ::dladdr(reinterpret_cast<void*>(&remove_from_ld_preload), &info) ? info.dli_fname : nullptr;
  std::string kept, entry;
  const std::string list = old;
  for (std::size_t i = 0; i <= list.size(); ++i) {
    if (i == list.size() || list[i] == ':' || list[i] == ' ') {
      if (!entry.empty() && !is_this_library(entry, self)) kept += (kept.empty() ? "" : ":") + entry;
      entry.clear();
    } else {
      entry += list[i];
    }
  }
  g_started_env = ::strdup(("LD_PRELOAD=" + list).c_str());
  if (!kept.empty()) g_kept_env = ::strdup(("LD_PRELOAD=" + kept).c_str());
  if (kept.empty())
    ::unsetenv("LD_PRELOAD");
  else
    ::setenv("LD_PRELOAD", kept.c_str(), 1);
}

// How many entries `envp` has (the null pointer not counted).
std::size_t env_count(char* const envp[]) {
  std::size_t n = 0;
  while (envp && envp[n]) ++n;
  return n;
}

// Copies `envp` into `out` (env_count + 1 entries) with the library taken out of LD_PRELOAD (see
// g_started_env); `envp` itself when there is nothing to take out.
char* const* without_library(char* const envp[], char** out) {
  if (envp == nullptr || g_started_env == nullptr) return envp;
  std::size_t k = 0;
  bool changed = false;
  for (std::size_t i = 0; envp[i]; ++i) {
    if (std::strcmp(envp[i], g_started_env) == 0) {
      changed = true;
      if (g_kept_env == nullptr) continue;
      out[k++] = const_cast<char*>(g_kept_env);
    } else {
      out[k++] = envp[i];
    }
  }
  out[k] = nullptr;
  return changed ? out : envp;
}

// Declares `env`, the environment an exec hook passes on, on the hook's stack (alloca, no malloc; in a
// declaration, never in a call's arguments).
#define SELFPROF_EXEC_ENV(envp) \
  char* const* const env =      \
      without_library((envp), static_cast<char**>(alloca((env_count(envp) + 1) * sizeof(char*))))

pid_t g_started_pid = 0;

// exec: the new image must start without anything of selfprof's. An armed perf_event or timer can
// raise a tick while execve runs, and a tick pending at execve is delivered to the new image, whose
// handler is back to the default action: terminate (exit status 155 for SIGPROF). So sampling stops
// before the exec (events disabled and closed, pending ticks discarded, the signals given back), and
// starts again when the exec fails. A forked or vfork'ed child has nothing armed (timers and perf events
// are not inherited; in a vfork child the memory is the parent's, not to be touched): left alone.
// `selfprof record` names a file (SELFPROF_EXEC_NOTE, taken out of the environment at load) where the
// program that replaces the profiled one by exec is written down, so record can say why no profile came
// (a version manager's `python3` shim that execs the real interpreter, say). Without --follow-exec only.
char g_exec_note[4096] = {};
bool g_follow_exec = false;

bool note_exec(const char* what) {
  if (g_exec_note[0] == '\0' || g_follow_exec || what == nullptr) return false;
  const int fd = ::open(g_exec_note, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0600);
  if (fd < 0) return false;
  const std::size_t n = std::strlen(what);
  ssize_t w = ::write(fd, what, n);
  (void)w;
  ::close(fd);
  return true;
}

// The dump signal is blocked in the program's threads while selfprof routes it to its dumper
// (core/auto_dumps.hpp); the block would outlive the exec, so it is taken off here, in any process (a
// vfork child's mask is its own), and put back when the exec fails.
// The block is in the mask the program starts with, so a program may have saved it before it claimed
// the signal (bash saves its initial mask, `trap` claims SIGUSR2 among others, and each child restores
// the saved mask before exec): the signal selfprof ever routed in this process or the one it was forked
// from is taken off too, even after it was given back. (start() never takes a signal the program
// blocked itself at start, so this block is always selfprof's.)
int g_ever_routed = 0;

int routed_signal_now() {
  const int routed = selfprof::detail::g_dump_requests.routed_signal.load(std::memory_order_acquire);
  if (routed > 0) g_ever_routed = routed;
  return routed;
}

struct exec_guard {
  bool restart = false;
  int unblocked = 0;
  selfprof::options opts;
  bool noted = false;
  explicit exec_guard(const char* what) {
    if (g_started_pid == ::getpid()) noted = note_exec(what);
    int routed = routed_signal_now();
    if (routed <= 0) routed = g_ever_routed;
    if (g_started_pid == ::getpid() && selfprof::running()) {
      opts = selfprof::detail::profiler_core::instance().current_options();
      restart = static_cast<bool>(selfprof::stop());
    }
    if (routed > 0) {
      sigset_t mask, one;
      pthread_sigmask(SIG_BLOCK, nullptr, &mask);
      sigemptyset(&one);
      sigaddset(&one, routed);
      if (sigismember(&mask, routed) == 1 && pthread_sigmask(SIG_UNBLOCK, &one, nullptr) == 0)
        unblocked = routed;
    }
  }
  int failed(int rc) {
    const int saved = errno;
    if (noted) note_exec("");  // the exec failed: this program goes on
    if (unblocked > 0) {
      sigset_t one;
      sigemptyset(&one);
      sigaddset(&one, unblocked);
      pthread_sigmask(SIG_BLOCK, &one, nullptr);
    }
    if (restart) (void)selfprof::start(opts);
    errno = saved;
    return rc;
  }
};

template <class Fn>
Fn real(const char* name) {
  return reinterpret_cast<Fn>(::dlsym(RTLD_NEXT, name));
}

using sigaction_fn = int (*)(int, const struct sigaction*, struct sigaction*);
sigaction_fn real_sigaction() {
  static sigaction_fn fn = real<sigaction_fn>("sigaction");
  return fn;
}

// The program installs a handler for the signal selfprof samples on (a shell's `trap ... URG`, a
// program that handles SIGPROF): the program's handler must never see a tick, and some re-raise it
// and die. So sampling stops first (the signal's previous action comes back), the program's action is
// installed, and sampling starts again on another free signal; the profile so far starts anew.
// The same when the program claims the dump signal (a daemon's SIGUSR2 handler): selfprof gives it back
// with its block in this thread, and dumps on a signal are off from then on.
int claim_signal(int sig, const struct sigaction* act, struct sigaction* old) {
  selfprof::detail::profiler_core& core = selfprof::detail::profiler_core::instance();
  if (act == nullptr || sig <= 0 || g_started_pid != ::getpid() ||
      (core.sample_signal() != sig && core.dump_signal() != sig))
    return real_sigaction()(sig, act, old);
  selfprof::options o = core.current_options();
  (void)routed_signal_now();  // remembered for exec_guard: the program's saved masks may still hold it
  (void)selfprof::stop();
  const int rc = real_sigaction()(sig, act, old);
  const int saved = errno;
  if (o.sample_signal == sig) o.sample_signal = 0;  // asked for, but the program owns it now
  if (o.dump_signal == sig) o.dump_signal = 0;
  const selfprof::status st = selfprof::start(o);
  if (!st) std::fprintf(stderr, "%s\n", st.message().c_str());
  errno = saved;
  return rc;
}

using execve_fn = int (*)(const char*, char* const[], char* const[]);
using execv_fn = int (*)(const char*, char* const[]);
using fexecve_fn = int (*)(int, char* const[], char* const[]);
using execveat_fn = int (*)(int, const char*, char* const[], char* const[], int);

// execl, execlp, execle: the arguments after `first`, up to the null pointer (how many: count_args).
std::size_t count_args(va_list ap) {
  va_list c;
  va_copy(c, ap);
  std::size_t n = 0;
  while (va_arg(c, const char*) != nullptr) ++n;
  va_end(c);
  return n;
}
// Fills argv (count_args + 2 entries: `first`, the rest, the null pointer); then, for execle, the
// environment that follows the null pointer.
char** fill_args(const char* first, va_list ap, std::size_t n, char** argv, char*** envp) {
  argv[0] = const_cast<char*>(first);
  for (std::size_t i = 1; i <= n + 1; ++i) argv[i] = va_arg(ap, char*);
  if (envp) *envp = va_arg(ap, char**);
  return argv;
}

using exit_fn = void (*)(int);

exit_fn g_real_exit = nullptr, g_real_Exit = nullptr;  // resolved at load: dlsym is not safe in _exit

// Programs that leave through _exit() (dash's `exit`, many daemons) skip atexit: the exit profile is
// written here, as atexit would. _exit() and _Exit() may be called from a signal handler (a SIGTERM handler's
// _exit(0) is common), or while the thread they interrupted holds a libc lock: no dump work happens here. The
// exit dump is handed to the dumper thread, waited for while it makes progress, and given up when it cannot
// (it needs the lock this thread holds); then the process exits at once. Only in the process that started
// profiling: a forked child has no dumper, and a vfork child shares the parent's memory (getpid() tells it
// apart).
[[noreturn]] void finish_exit(exit_fn real, int status) {
  if (g_started_pid == ::getpid()) selfprof::detail::exit_dump_by_dumper();
  if (real) real(status);
  for (;;) ::syscall(SYS_exit_group, status);
}

__attribute__((constructor)) void selfprof_preload_start() {
  g_started_pid = ::getpid();
  g_real_exit = reinterpret_cast<exit_fn>(::dlsym(RTLD_NEXT, "_exit"));
  g_real_Exit = reinterpret_cast<exit_fn>(::dlsym(RTLD_NEXT, "_Exit"));
  // selfprof's own sigaction calls go straight to libc, not through the interposer below.
  if (real_sigaction()) selfprof::detail::sys().sigaction = real_sigaction();
  const char* follow = std::getenv("SELFPROF_FOLLOW_EXEC");
  g_follow_exec = follow && std::strcmp(follow, "1") == 0;
  if (!g_follow_exec) remove_from_ld_preload();
  if (const char* note = std::getenv("SELFPROF_EXEC_NOTE")) {
    if (std::strlen(note) < sizeof g_exec_note) std::strcpy(g_exec_note, note);
    ::unsetenv("SELFPROF_EXEC_NOTE");
  }
  (void)real_pthread_create();  // resolve now, before any thread exists
  (void)selfprof::start_from_env();
  (void)routed_signal_now();
}

}  // namespace

extern "C" __attribute__((visibility("default"))) int pthread_create(pthread_t* thread,
                                                                     const pthread_attr_t* attr,
                                                                     void* (*start)(void*), void* arg) {
  create_fn real = real_pthread_create();
  if (!real) return EAGAIN;
  if (selfprof::detail::worker::is_entry(start)) return real(thread, attr, start, arg);  // selfprof's own
  auto* a = new (std::nothrow) start_args{start, arg};
  if (!a) return real(thread, attr, start, arg);
  const int rc = real(thread, attr, &armed_start, a);
  if (rc != 0) delete a;
  return rc;
}

extern "C" __attribute__((visibility("default"))) void _exit(int status) { finish_exit(g_real_exit, status); }

extern "C" __attribute__((visibility("default"))) int sigaction(int sig, const struct sigaction* act,
                                                                struct sigaction* old) {
  return claim_signal(sig, act, old);
}
// signal() and bsd_signal() reach libc's sigaction internally, past the interposer: the same here, with
// glibc's BSD semantics (SA_RESTART, the handler stays installed).
extern "C" __attribute__((visibility("default"))) sighandler_t signal(int sig, sighandler_t handler) {
  struct sigaction act {
  }, old{};
  act.sa_handler = handler;
  sigemptyset(&act.sa_mask);
  sigaddset(&act.sa_mask, sig);
  act.sa_flags = SA_RESTART;
  if (claim_signal(sig, &act, &old) != 0) return SIG_ERR;
  return old.sa_handler;
}
extern "C" __attribute__((visibility("default"))) sighandler_t bsd_signal(int sig, sighandler_t handler) {
  return signal(sig, handler);
}

extern "C" __attribute__((visibility("default"))) int execve(const char* path, char* const argv[],
                                                             char* const envp[]) {
  SELFPROF_EXEC_ENV(envp);
  exec_guard g(path);
  return g.failed(real<execve_fn>("execve")(path, argv, env));
}
extern "C" __attribute__((visibility("default"))) int execv(const char* path, char* const argv[]) {
  exec_guard g(path);
  return g.failed(real<execv_fn>("execv")(path, argv));
}
extern "C" __attribute__((visibility("default"))) int execvp(const char* file, char* const argv[]) {
  exec_guard g(file);
  return g.failed(real<execv_fn>("execvp")(file, argv));
}
extern "C" __attribute__((visibility("default"))) int execvpe(const char* file, char* const argv[],
                                                              char* const envp[]) {
  SELFPROF_EXEC_ENV(envp);
  exec_guard g(file);
  return g.failed(real<execve_fn>("execvpe")(file, argv, env));
}
extern "C" __attribute__((visibility("default"))) int fexecve(int fd, char* const argv[],
                                                              char* const envp[]) {
  SELFPROF_EXEC_ENV(envp);
  exec_guard g(argv[0] ? argv[0] : "a program (fexecve)");
  return g.failed(real<fexecve_fn>("fexecve")(fd, argv, env));
}
extern "C" __attribute__((visibility("default"))) int execveat(int dirfd, const char* path,
                                                               char* const argv[], char* const envp[],
                                                               int flags) {
  SELFPROF_EXEC_ENV(envp);
  exec_guard g(path[0] ? path : argv[0] ? argv[0] : "a program (execveat)");
  return g.failed(real<execveat_fn>("execveat")(dirfd, path, argv, env, flags));
}
// execl*: the argv array on this frame's stack (alloca, no malloc: the caller may be a vfork child).
extern "C" __attribute__((visibility("default"))) int execl(const char* path, const char* arg, ...) {
  va_list ap;
  va_start(ap, arg);
  const std::size_t n = count_args(ap);
  char** argv = fill_args(arg, ap, n, static_cast<char**>(alloca((n + 2) * sizeof(char*))), nullptr);
  va_end(ap);
  exec_guard g(path);
  return g.failed(real<execv_fn>("execv")(path, argv));
}
extern "C" __attribute__((visibility("default"))) int execlp(const char* file, const char* arg, ...) {
  va_list ap;
  va_start(ap, arg);
  const std::size_t n = count_args(ap);
  char** argv = fill_args(arg, ap, n, static_cast<char**>(alloca((n + 2) * sizeof(char*))), nullptr);
  va_end(ap);
  exec_guard g(file);
  return g.failed(real<execv_fn>("execvp")(file, argv));
}
extern "C" __attribute__((visibility("default"))) int execle(const char* path, const char* arg, ...) {
  va_list ap;
  va_start(ap, arg);
  const std::size_t n = count_args(ap);
  char** envp = nullptr;
  char** argv = fill_args(arg, ap, n, static_cast<char**>(alloca((n + 2) * sizeof(char*))), &envp);
  va_end(ap);
  SELFPROF_EXEC_ENV(envp);
  exec_guard g(path);
  return g.failed(real<execve_fn>("execve")(path, argv, env));
}
extern "C" __attribute__((visibility("default"))) void _Exit(int status) { finish_exit(g_real_Exit, status); }

namespace {
using spawn_fn = int (*)(pid_t*, const char*, const posix_spawn_file_actions_t*, const posix_spawnattr_t*,
                         char* const[], char* const[]);

// posix_spawn: the child starts with the caller's signal mask unless the attributes give one, so it would
// inherit the dump signal's block (see exec_guard). Without POSIX_SPAWN_SETSIGMASK, the caller's mask
// without that signal is given; a mask the program sets itself is left as it is. (glibc's system() and
// popen() spawn through an internal entry that cannot be interposed: README.md says so.)
int spawn_unblocked(spawn_fn real, pid_t* pid, const char* path, const posix_spawn_file_actions_t* actions,
                    const posix_spawnattr_t* attr, char* const argv[], char* const envp[]) {
  if (!real) return ENOSYS;
  SELFPROF_EXEC_ENV(envp);
  int routed = routed_signal_now();
  if (routed <= 0) routed = g_ever_routed;
  short flags = 0;
  if (attr) posix_spawnattr_getflags(attr, &flags);
  sigset_t mask;
  pthread_sigmask(SIG_BLOCK, nullptr, &mask);
  if (routed <= 0 || (flags & POSIX_SPAWN_SETSIGMASK) || sigismember(&mask, routed) != 1)
    return real(pid, path, actions, attr, argv, env);
  posix_spawnattr_t copy;
  if (attr)
    copy = *attr;  // glibc's attributes are a plain struct that owns nothing
  else
    posix_spawnattr_init(&copy);
  sigdelset(&mask, routed);
  posix_spawnattr_setsigmask(&copy, &mask);
  posix_spawnattr_setflags(&copy, static_cast<short>(flags | POSIX_SPAWN_SETSIGMASK));
  const int rc = real(pid, path, actions, &copy, argv, env);
  if (!attr) posix_spawnattr_destroy(&copy);
  return rc;
}
}  // namespace

extern "C" __attribute__((visibility("default"))) int posix_spawn(pid_t* pid, const char* path,
                                                                  const posix_spawn_file_actions_t* actions,
                                                                  const posix_spawnattr_t* attr,
                                                                  char* const argv[], char* const envp[]) {
  return spawn_unblocked(real<spawn_fn>("posix_spawn"), pid, path, actions, attr, argv, envp);
}
extern "C" __attribute__((visibility("default"))) int posix_spawnp(pid_t* pid, const char* file,
                                                                   const posix_spawn_file_actions_t* actions,
                                                                   const posix_spawnattr_t* attr,
                                                                   char* const argv[], char* const envp[]) {
  return spawn_unblocked(real<spawn_fn>("posix_spawnp"), pid, file, actions, attr, argv, envp);
}
