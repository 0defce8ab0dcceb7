// libselfprof-preload.so: profiles an unmodified program. Loaded with LD_PRELOAD (usually by
// `selfprof record`), it starts sampling when it loads (SELFPROF_* environment: SELFPROF_OUT gives the
// exit dump, SIGUSR2 and SELFPROF_INTERVAL give dumps while running) and interposes pthread_create so
// every new thread is armed before its start routine runs. It also interposes _exit/_Exit, which skip
// atexit handlers, so a program leaving that way (dash's `exit`) still writes its exit profile.
//
// exec'd children: unless SELFPROF_FOLLOW_EXEC=1, the library removes itself from LD_PRELOAD in this
// process's environment as soon as it is loaded, so programs this one executes are not profiled
// (forks that do not exec are the same program; they inherit the library and follow the profiler's
// fork policy). Build with -fvisibility=hidden: only pthread_create, _exit and _Exit are exported, so a
// program that embeds selfprof itself keeps its own copy of the inline functions.
#include <dlfcn.h>
#include <errno.h>
#include <pthread.h>
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
  if (selfprof::running()) (void)selfprof::register_thread();
  return a.fn(a.arg);
}

bool is_this_library(const std::string& entry, const char* self) {
  if (self && entry == self) return true;
  const std::size_t slash = entry.rfind('/');
  return entry.compare(slash == std::string::npos ? 0 : slash + 1, std::string::npos,
                       "libselfprof-preload.so") == 0;
}

// Drops this library from LD_PRELOAD (entries are separated by ':' or spaces, see ld.so(8)).
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
  if (kept.empty())
    ::unsetenv("LD_PRELOAD");
  else
    ::setenv("LD_PRELOAD", kept.c_str(), 1);
}

pid_t g_started_pid = 0;

// Programs that leave through _exit() (dash's `exit`, many daemons) skip atexit: write the exit
// profile here, in the process that started profiling only (not in forked or vfork'ed children).
void dump_before_exit() {
  const char* out = std::getenv("SELFPROF_OUT");
  if (!out || !*out || g_started_pid != ::getpid() || !selfprof::running()) return;
  (void)selfprof::stop();
  const selfprof::status st = selfprof::dump(out);
  if (!st) std::fprintf(stderr, "%s\n", st.message().c_str());
}

using exit_fn = void (*)(int);

[[noreturn]] void finish_exit(const char* name, int status) {
  dump_before_exit();
  if (auto real = reinterpret_cast<exit_fn>(::dlsym(RTLD_NEXT, name))) real(status);
  for (;;) ::syscall(SYS_exit_group, status);
}

__attribute__((constructor)) void selfprof_preload_start() {
  g_started_pid = ::getpid();
  const char* follow = std::getenv("SELFPROF_FOLLOW_EXEC");
  if (!(follow && std::strcmp(follow, "1") == 0)) remove_from_ld_preload();
  (void)real_pthread_create();  // resolve now, before any thread exists
  (void)selfprof::start_from_env();
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

extern "C" __attribute__((visibility("default"))) void _exit(int status) { finish_exit("_exit", status); }
extern "C" __attribute__((visibility("default"))) void _Exit(int status) { finish_exit("_Exit", status); }
