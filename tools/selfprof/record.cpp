// selfprof record: runs a command under the selfprof preload library (no root, no perf needed).
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include <selfprof/dump/dump.hpp>
#include <selfprof/dump/paths.hpp>
#include <selfprof/dump/raw_dump.hpp>

#include "args.hpp"
#include "commands.hpp"
#include "perf_record.hpp"
#include "raw_merge.hpp"

namespace selfprof_cli {
namespace {

const char* const record_help =
    "usage: selfprof record [options] [--] CMD [ARGS...]\n"
    "\n"
    "Runs CMD with the selfprof preload library (LD_PRELOAD) so that an unmodified program profiles\n"
    "itself: sampling starts when the library loads, every thread is armed before its start routine\n"
    "runs (pthread_create is interposed), and the profile is written when the program exits normally\n"
    "(exit() or return from main). SIGUSR2 writes a profile at any time; SELFPROF_* variables already in\n"
    "the environment (SELFPROF_INTERVAL, SELFPROF_SIGNAL, SELFPROF_SOURCE, ...) are passed on.\n"
    "No root and no perf are needed. The exit status, stdout and stdin of CMD are left alone; selfprof\n"
    "record exits with CMD's status (128+N when CMD was killed by signal N).\n"
    "\n"
    "options:\n"
    "  -F, --freq=HZ         samples per CPU-second per thread (default 99; SELFPROF_HZ)\n"
    "  -o, --output=PATH     where the profile goes (default selfprof-%p.svg). %p is the profiled\n"
    "                        process id, %t the unix time, %n the dump number; the extension picks the\n"
    "                        format (.svg .folded .txt .pb.gz); several paths may be comma-separated\n"
    "  --follow-exec         also profile the programs CMD executes. One profile for the whole\n"
    "                        recording, written at the end, each process's name as the root of its\n"
    "                        stacks: sampled like perf record, by perf_event events that every process\n"
    "                        inherits and that this process reads, with nothing loaded into the\n"
    "                        programs (the preload library where perf_event is refused, or with\n"
    "                        --preload). With %p in the path, one profile per process instead, written\n"
    "                        at the end (with --interval or the preload library, by each process at its\n"
    "                        exit; children that exec keep LD_PRELOAD). Default: the library removes\n"
    "                        itself from LD_PRELOAD once loaded, so only CMD (and its forks that do not\n"
    "                        exec) are profiled\n"
    "  --preload             with --follow-exec: always through the preload library\n"
    "  --pid-roots           with --follow-exec: \"name [pid]\" roots, one per process, not per name\n"
    "  --interval=SECONDS    also write the profile every SECONDS (a SIGKILL loses at most one interval)\n"
    "  --mode=cpu|wall       CPU time (default) or wall-clock time, blocked threads included\n"
    "  -v, --verbose         the library prints its configuration when it starts\n"
    "  -q, --quiet           do not name the profile written at the end\n"
    "  -h, --help            this text\n"
    "\n"
    "The library is found next to the selfprof executable, or in ../lib/selfprof/ relative to it;\n"
    "SELFPROF_PRELOAD=/path/to/libselfprof-preload.so overrides. Statically linked programs and\n"
    "set-user-ID programs ignore LD_PRELOAD and cannot be recorded this way. A program that ends with\n"
    "_exit() still writes its profile (the library interposes _exit); one killed by a signal writes\n"
    "none (use --interval or kill -USR2 before).\n"
    "\n"
    "example:\n"
    "  selfprof record -F 199 -o app-%p.svg -- ./app --serve\n";

bool readable(const std::string& p) { return !p.empty() && ::access(p.c_str(), R_OK) == 0; }

// This process's CPU time so far (user + system), in ms.
double own_cpu_ms() {
  struct rusage self {};
  ::getrusage(RUSAGE_SELF, &self);
  return static_cast<double>(self.ru_utime.tv_sec + self.ru_stime.tv_sec) * 1e3 +
         static_cast<double>(self.ru_utime.tv_usec + self.ru_stime.tv_usec) / 1e3;
}

// The preload library: $SELFPROF_PRELOAD, else next to this executable, else ../lib/selfprof/.
bool find_preload(std::string& out, std::string& tried) {
  if (const char* env = std::getenv("SELFPROF_PRELOAD")) {
    out = env;
    tried = out + " (SELFPROF_PRELOAD)";
    return readable(out);
  }
  char buf[PATH_MAX];
  ssize_t n = ::readlink("/proc/self/exe", buf, sizeof buf - 1);
  if (n <= 0) {
    tried = "/proc/self/exe (unreadable)";
    return false;
  }
  std::string exe(buf, static_cast<std::size_t>(n));
  std::string dir = exe.substr(0, exe.find_last_of('/'));
  const char* const name = "libselfprof-preload.so";
  for (const std::string& c : {dir + "/" + name, dir + "/../lib/selfprof/" + name}) {
    tried += (tried.empty() ? "" : ", ") + c;
    if (readable(c)) {
      char real[PATH_MAX];
      out = ::realpath(c.c_str(), real) ? std::string(real) : c;
      return true;
    }
  }
  return false;
}

// The path the child wrote its profile to, when `tmpl` holds no field but %p (and %%): the child chose
// its own %t and %n, which this process cannot know, so such a path is not named.
bool child_profile_path(const std::string& tmpl, pid_t pid, std::string& path) {
  for (std::size_t i = 0; i + 1 < tmpl.size(); ++i) {
    if (tmpl[i] != '%') continue;
    if (tmpl[i + 1] != 'p' && tmpl[i + 1] != '%') return false;
    ++i;
  }
  selfprof::detail::path_fields f;
  f.pid = pid;
  path = selfprof::detail::expand_path_template(tmpl, f);
  return true;
}

// Reads a file of our private directory: a regular file, not through a link.
bool read_private_file(int dir, const char* name, std::string& out) {
  const int fd = ::openat(dir, name, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
  if (fd < 0) return false;
  struct stat sb {};
  bool ok = ::fstat(fd, &sb) == 0 && S_ISREG(sb.st_mode);
  out.clear();
  char buf[65536];
  for (ssize_t n; ok && (n = ::read(fd, buf, sizeof buf)) != 0;) {
    if (n < 0) {
      if (errno == EINTR) continue;
      ok = false;
      break;
    }
    out.append(buf, static_cast<std::size_t>(n));
  }
  ::close(fd);
  return ok;
}

int write_merged(raw_merger& merger, std::size_t lost, const std::vector<std::string>& notes,
                 std::uint64_t dropped, const std::string& out, bool quiet);

// The subtitle and count name of a recording's profile.
void describe_recording(const selfprof::profile& p, selfprof::output_options& oo) {
  if (!p.info.kernel_time) oo.svg.subtitle = "time spent in the kernel is not sampled (user-only ticks)";
  if (p.info.unit != "samples") oo.svg.count_name = p.info.unit;
}

// A profile per process of a recording this process sampled (--follow-exec with %p in the path), written
// when the recording ends, %p its pid. The images of one process (it exec'd) go into its one profile, each
// under its name when more than one was sampled; a process with no sample gets an empty profile, as the
// preload library would write. `notes` are the recording's. Each file's symbols are read once for all.
// Sets `named_ms` (this process's CPU when naming ended); returns 1 when a profile could not be written.
int write_per_process(std::vector<raw_process> processes, const std::vector<std::string>& notes,
                      const std::string& out, bool quiet, double& named_ms) {
  std::vector<std::pair<std::uint32_t, std::vector<std::size_t>>> by_pid;  // in the order they began
  std::unordered_map<std::uint32_t, std::size_t> slot;
  for (std::size_t i = 0; i < processes.size(); ++i) {
    const auto at = slot.emplace(processes[i].pid, by_pid.size());
    if (at.second) by_pid.push_back({processes[i].pid, {}});
    by_pid[at.first->second].second.push_back(i);
  }
  auto naming = std::make_shared<raw_naming>();
  naming->prepare_kernel(processes);
  std::vector<std::pair<std::uint32_t, selfprof::profile>> profiles;
  for (const auto& [pid, images] : by_pid) {
    std::vector<std::size_t> sampled;
    for (std::size_t i : images)
      if (processes[i].raw.table.total() > 0) sampled.push_back(i);
    if (sampled.empty()) sampled.push_back(images.back());
    raw_merger merger(sampled.size() > 1 ? raw_roots::name : raw_roots::none, naming);
    for (std::size_t i : sampled) merger.add(processes[i]);
    profiles.emplace_back(pid, merger.take(0, false));
  }
  named_ms = own_cpu_ms();
  int rc = 0;
  std::uint64_t samples = 0;
  for (auto& [pid, p] : profiles) {
    for (const std::string& n : notes) p.info.notes.push_back(n);
    selfprof::output_options oo;
    oo.svg.title = "CPU profile of process " + std::to_string(pid) + " (selfprof record --follow-exec)";
    describe_recording(p, oo);
    selfprof::detail::add_marker_frames(p, false);
    selfprof::detail::path_fields f = selfprof::detail::fields_now(1);
    f.pid = pid;
    const selfprof::status st =
        selfprof::detail::write_profile_paths(p, out, f, oo, selfprof::sink_options{});
    if (!st) rc = fail("record", st.message());
    samples += p.info.samples;
  }
  if (!quiet)
    std::fprintf(stderr, "selfprof record: %zu profiles, one per process (%llu samples), written to %s\n",
                 profiles.size(), static_cast<unsigned long long>(samples), out.c_str());
  return rc;
}

// The raw dumps of a recording (see raw_merge.hpp) named into one profile written to `out`; the
// directory is emptied and removed. Returns 0, or 1 when the profile could not be written.
int merge_recording(const std::string& dir_path, const std::string& out, bool pid_roots, bool quiet) {
  raw_merger merger(pid_roots);
  std::size_t lost = 0;
  std::vector<std::string> names;
  if (DIR* d = ::opendir(dir_path.c_str())) {
    while (struct dirent* e = ::readdir(d))
      if (std::strcmp(e->d_name, ".") != 0 && std::strcmp(e->d_name, "..") != 0) names.push_back(e->d_name);
    const int fd = ::dirfd(d);
    std::string text;
    raw_process p;
    for (const std::string& n : names) {
      const bool raw = selfprof::detail::is_raw_dump_path(n) && n[0] != '.';  // not a temp file
      if (raw && read_private_file(fd, n.c_str(), text)) {
        selfprof::status st = parse_raw_dump(text, n, p);
        if (st)
          merger.add(p);
        else
          std::fprintf(stderr, "%s\n", st.message().c_str());
        if (!st) ++lost;
      } else if (raw) {
        ++lost;
      }
      ::unlinkat(fd, n.c_str(), 0);
    }
    ::closedir(d);
  }
  ::rmdir(dir_path.c_str());
  if (merger.processes() == 0) {
    std::fprintf(stderr,
                 "selfprof record: no process of the recording wrote its samples (were they killed?)\n");
    return 1;
  }
  return write_merged(merger, lost, {}, 0, out, quiet);
}

// Writes the merged profile of a recording to `out` (`notes` and `dropped` samples added to its info).
int write_merged(raw_merger& merger, std::size_t lost, const std::vector<std::string>& notes,
                 std::uint64_t dropped, const std::string& out, bool quiet) {
  const std::size_t processes = merger.processes();
  selfprof::profile p = merger.take(lost);
  p.info.dropped += dropped;
  for (const std::string& n : notes) p.info.notes.push_back(n);
  selfprof::output_options oo;
  oo.svg.title = std::string(p.info.mode == selfprof::profile_mode::wall ? "Wall-clock" : "CPU") +
                 " profile of " + std::to_string(processes) + " processes (selfprof record --follow-exec)";
  describe_recording(p, oo);
  selfprof::detail::add_marker_frames(p, false);
  selfprof::status st = selfprof::detail::write_profile_paths(p, out, selfprof::detail::fields_now(1), oo,
                                                              selfprof::sink_options{});
  if (!st) return fail("record", st.message());
  if (!quiet)
    std::fprintf(stderr, "selfprof record: profile of %zu processes (%llu samples) written to %s\n",
                 processes, static_cast<unsigned long long>(p.info.samples), out.c_str());
  return 0;
}

}  // namespace

int run_record(int argc, char** argv) {
  static const std::vector<option_spec> specs = {
      {"freq", 'F', true},     {"output", 'o', true},   {"follow-exec", 0, false}, {"interval", 0, true},
      {"mode", 0, true},       {"verbose", 'v', false}, {"quiet", 'q', false},     {"help", 'h', false},
      {"pid-roots", 0, false}, {"preload", 0, false},
  };
  parsed_args a;
  selfprof::status st = parse_args(argc, argv, 2, specs, a, true);
  if (!st) return fail("record", st.message(), 2);
  if (a.has("help")) {
    std::fputs(record_help, stdout);
    return 0;
  }
  std::vector<std::string> cmd = a.positional;
  for (auto& r : a.rest) cmd.push_back(r);
  if (cmd.empty())
    return fail("record", "no command given (usage: selfprof record [options] -- CMD [ARGS...])", 2);
  double d = 0;
  if (a.has("freq") && !parse_double_arg(a.get("freq"), 1, 100000, d))
    return fail("record", "-F/--freq: expected a rate in Hz from 1 to 100000, not '" + a.get("freq") + "'",
                2);
  if (a.has("interval") && !parse_double_arg(a.get("interval"), 0.001, 1e9, d))
    return fail("record", "--interval: expected a positive number of seconds", 2);
  const std::string mode = a.get("mode", "cpu");
  if (mode != "cpu" && mode != "wall") return fail("record", "--mode: expected cpu or wall", 2);
  const std::string out = a.get("output", "selfprof-%p.svg");
  if (out.empty()) return fail("record", "-o/--output: empty path", 2);

  // --follow-exec without %p: one profile for the recording. The processes write raw dumps to a
  // private directory (0700, ours) and this process names them at the end.
  const bool merged = a.has("follow-exec") && out.find("%p") == std::string::npos;
  if (merged && a.has("interval"))
    return fail("record", "--interval with --follow-exec writes a profile per process: put %p in -o", 2);
  if (a.has("pid-roots") && !merged)
    return fail("record", "--pid-roots needs --follow-exec and a path without %p", 2);

  // A command and what it executes, in one profile or a profile per process: perf_event events inherited
  // by every process, read here (perf_record.hpp), where the kernel allows them; the preload library
  // otherwise, and for what only a library in the process can do (wall time, periodic dumps).
  const bool by_perf = a.has("follow-exec") && mode == "cpu" && !a.has("preload") && !a.has("interval");
  std::string preload, tried;
  const bool have_preload = find_preload(preload, tried);
  if (!have_preload && !by_perf)
    return fail("record", "cannot find libselfprof-preload.so (tried: " + tried +
                              "); build the selfprof-preload target or set SELFPROF_PRELOAD");

  // The loader splits LD_PRELOAD at ':' and ' ', with no way to escape them.
  if (have_preload && preload.find_first_of(": ") != std::string::npos && !by_perf)
    return fail("record",
                "the preload library's path '" + preload +
                    "' contains ':' or ' ', which LD_PRELOAD cannot carry; install it elsewhere or "
                    "point SELFPROF_PRELOAD at a path without them",
                2);
  std::string ld = preload;
  if (const char* old = std::getenv("LD_PRELOAD"); old && *old) ld += std::string(":") + old;

  // The preload library's raw dumps of a merged recording go to a private directory, made once the
  // preload way is taken (the perf way needs none) and passed to the child through the go pipe.
  std::string raw_dir;

  // Where the preload library writes what the program exec'd (see preload.cpp), in a directory of our own.
  std::string note_dir, note;
  if (!merged) {
    const char* t = std::getenv("TMPDIR");
    std::string templ = std::string(t && *t ? t : "/tmp") + "/selfprof-record-XXXXXX";
    if (::mkdtemp(&templ[0]) != nullptr) {
      note_dir = templ;
      note = note_dir + "/exec";
    }
  }
  auto read_note = [&]() {
    std::string what;
    if (note.empty()) return what;
    if (std::FILE* f = std::fopen(note.c_str(), "re")) {
      char buf[4096];
      const std::size_t n = std::fread(buf, 1, sizeof buf, f);
      what.assign(buf, n);
      std::fclose(f);
    }
    ::unlink(note.c_str());
    ::rmdir(note_dir.c_str());
    return what;
  };

  // The child waits for one byte before it execs: 'p' to run as it is (the events are open on it), 'l'
  // with the preload library (for a merged recording followed by the raw-dump directory: its length as
  // 4 bytes, then the path), 'x' to give up.
  int go[2] = {-1, -1};
  if (::pipe2(go, O_CLOEXEC) != 0) {
    const int err = errno;
    return fail("record", std::string("pipe: ") + std::strerror(err));
  }

  // Like system(): the terminal's SIGINT/SIGQUIT go to the child; we wait for it and report. Ignored
  // before the fork, so a ^C in between cannot kill us and orphan the child; the child gets them back.
  struct sigaction ign {
  }, old_int{}, old_quit{};
  ign.sa_handler = SIG_IGN;
  sigemptyset(&ign.sa_mask);
  ::sigaction(SIGINT, &ign, &old_int);
  ::sigaction(SIGQUIT, &ign, &old_quit);
  pid_t child = ::fork();
  if (child < 0) {
    const int err = errno;
    ::sigaction(SIGINT, &old_int, nullptr);
    ::sigaction(SIGQUIT, &old_quit, nullptr);
    ::close(go[0]);
    ::close(go[1]);
    return fail("record", std::string("fork: ") + std::strerror(err));
  }
  if (child == 0) {
    ::sigaction(SIGINT, &old_int, nullptr);
    ::sigaction(SIGQUIT, &old_quit, nullptr);
    ::close(go[1]);
    auto read_all = [&go](void* to, std::size_t n) {
      std::size_t done = 0;
      while (done < n) {
        const ssize_t got = ::read(go[0], static_cast<char*>(to) + done, n - done);
        if (got < 0 && errno == EINTR) continue;
        if (got <= 0) return false;
        done += static_cast<std::size_t>(got);
      }
      return true;
    };
    char how = 0;
    bool ok = read_all(&how, 1);
    if (ok && how == 'l' && merged) {
      std::uint32_t len = 0;
      ok = read_all(&len, sizeof len) && len < 4096;
      if (ok) {
        raw_dir.assign(len, '\0');
        ok = read_all(&raw_dir[0], len);
      }
    }
    ::close(go[0]);
    if (!ok || how == 'x') ::_exit(127);
    if (how == 'l') {
      ::setenv("LD_PRELOAD", ld.c_str(), 1);
      ::setenv("SELFPROF_OUT",
               merged ? (raw_dir + "/%p" + selfprof::detail::kRawDumpExtension).c_str() : out.c_str(), 1);
      if (a.has("freq")) ::setenv("SELFPROF_HZ", a.get("freq").c_str(), 1);
      if (a.has("interval")) ::setenv("SELFPROF_INTERVAL", a.get("interval").c_str(), 1);
      if (a.has("mode")) ::setenv("SELFPROF_MODE", mode.c_str(), 1);
      if (a.has("verbose")) ::setenv("SELFPROF_VERBOSE", "1", 1);
      ::setenv("SELFPROF_FOLLOW_EXEC", a.has("follow-exec") ? "1" : "0", 1);
      if (!note.empty()) ::setenv("SELFPROF_EXEC_NOTE", note.c_str(), 1);
    }
    std::vector<char*> args;
    for (auto& s : cmd) args.push_back(&s[0]);
    args.push_back(nullptr);
    ::execvp(args[0], args.data());
    const int err = errno;
    std::fprintf(stderr, "selfprof record: cannot run %s: %s\n", cmd[0].c_str(), std::strerror(err));
    ::_exit(err == ENOENT ? 127 : 126);
  }
  ::close(go[0]);
  perf_recorder recorder;
  bool perf_on = false;
  std::string why_not;
  if (by_perf) {
    perf_record_options po;
    po.hz = a.has("freq") ? std::strtod(a.get("freq").c_str(), nullptr) : 99;
    // SELFPROF_TEST_NO_PERF=1: perf_event refused, as the test suite's no-perf runs need it.
    const char* no_perf = std::getenv("SELFPROF_TEST_NO_PERF");
    selfprof::status st =
        no_perf && std::string(no_perf) == "1"
            ? selfprof::status::error("perf_event_open refused (SELFPROF_TEST_NO_PERF=1)", EACCES)
            : recorder.open(child, po);
    perf_on = static_cast<bool>(st);
    if (!perf_on) why_not = st.message();
    if (perf_on && a.has("verbose"))
      std::fprintf(stderr,
                   "selfprof record: perf_event rings on %zu CPUs (%s), nothing loaded into the programs\n",
                   recorder.rings(), recorder.user_only() ? "user only" : "user and kernel");
    if (!perf_on && have_preload && !a.has("quiet"))
      std::fprintf(stderr, "selfprof record: %s; recording through the preload library\n", why_not.c_str());
  }
  char how = perf_on ? 'p' : have_preload ? 'l' : 'x';
  std::string message = why_not + ", and cannot find libselfprof-preload.so (tried: " + tried + ")";
  std::string go_bytes(1, how);
  if (how == 'l' && merged) {
    const char* t = std::getenv("TMPDIR");
    std::string templ = std::string(t && *t ? t : "/tmp") + "/selfprof-merge-XXXXXX";
    if (::mkdtemp(&templ[0]) == nullptr) {
      message = "cannot create a directory for the recording (" + templ + "): " + std::strerror(errno);
      how = 'x';
      go_bytes.assign(1, how);
    } else {
      raw_dir = templ;
      const std::uint32_t len = static_cast<std::uint32_t>(raw_dir.size());
      go_bytes.append(reinterpret_cast<const char*>(&len), sizeof len);
      go_bytes += raw_dir;
    }
  }
  for (std::size_t put = 0; put < go_bytes.size();) {
    const ssize_t n = ::write(go[1], go_bytes.data() + put, go_bytes.size() - put);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;  // the child is gone: waitpid tells
    put += static_cast<std::size_t>(n);
  }
  ::close(go[1]);
  if (how == 'x') {
    ::waitpid(child, nullptr, 0);
    ::sigaction(SIGINT, &old_int, nullptr);
    ::sigaction(SIGQUIT, &old_quit, nullptr);
    return fail("record", message);
  }
  int wstatus = 0;
  pid_t w;
  const double started_ms = own_cpu_ms();
  if (perf_on) {  // read the rings until the command has ended, then what is left in them
    do {
      recorder.wait_and_read(recorder.read_period_ms());
      w = ::waitpid(child, &wstatus, WNOHANG);
    } while (w == 0 || (w < 0 && errno == EINTR));
    recorder.read(true);
    recorder.close();
  } else {
    do w = ::waitpid(child, &wstatus, 0);
    while (w < 0 && errno == EINTR);
  }
  ::sigaction(SIGINT, &old_int, nullptr);
  ::sigaction(SIGQUIT, &old_quit, nullptr);
  const std::string exec_note = read_note();
  if (w < 0) return fail("record", std::string("waitpid: ") + std::strerror(errno));
  int rc = WIFEXITED(wstatus) ? WEXITSTATUS(wstatus) : WIFSIGNALED(wstatus) ? 128 + WTERMSIG(wstatus) : 1;
  if (perf_on) {
    const double recorded_ms = own_cpu_ms();
    const perf_record_counts c = recorder.counts();
    std::vector<std::string> notes;
    if (c.lost) notes.push_back(std::to_string(c.lost) + " samples lost: the kernel found a ring full");
    if (c.corrupt) notes.push_back(std::to_string(c.corrupt) + " malformed ring records skipped");
    if (c.no_room) notes.push_back(std::to_string(c.no_room) + " samples dropped: no room for new stacks");
    if (c.chain_cut > 0 && (c.user_chain || c.chain_given_back))
      notes.push_back(selfprof::detail::chain_asked_note(c.chain_cut));
    if (c.chain_given_back) notes.push_back(selfprof::detail::chain_given_back_note());
    for (const std::string& n : recorder.unwind_notes()) notes.push_back(n);
    double named_ms = 0;
    if (merged) {
      raw_merger merger(a.has("pid-roots"));
      const std::vector<raw_process> processes = recorder.take();
      merger.prepare_kernel(processes);
      for (const raw_process& p : processes) merger.add(p);
      named_ms = own_cpu_ms();
      if (merger.processes() == 0)  // an empty profile still says what was recorded
        notes.push_back("no samples: the programs used less CPU than one sampling period");
      (void)write_merged(merger, 0, notes, c.lost, out, a.has("quiet"));
    } else {
      (void)write_per_process(recorder.take(true), notes, out, a.has("quiet"), named_ms);
    }
    if (a.has("verbose")) {
      const double written_ms = own_cpu_ms();
      std::fprintf(
          stderr,
          "selfprof record: %llu samples (%llu stored, %llu lost, %llu spliced with the kernel's "
          "user chain%s, %llu continued on the live stack), %llu processes started, %llu execs, %llu "
          "executable mappings; unwind rows of "
          "%zu files. The recorder's own CPU: %.1f ms to start, %.1f ms reading and unwinding, "
          "%.1f ms naming, %.1f ms writing\n",
          static_cast<unsigned long long>(c.samples), static_cast<unsigned long long>(c.stored),
          static_cast<unsigned long long>(c.lost), static_cast<unsigned long long>(c.spliced),
          c.user_chain ? (", asked for after " + std::to_string(c.chain_cut) + " cut stacks").c_str()
          : c.chain_given_back
              ? (", asked for after " + std::to_string(c.chain_cut) + " cut stacks, given up").c_str()
              : " (not asked for)",
          static_cast<unsigned long long>(c.continued), static_cast<unsigned long long>(c.forks),
          static_cast<unsigned long long>(c.execs), static_cast<unsigned long long>(c.mappings),
          recorder.unwind_files(), started_ms, recorded_ms - started_ms, named_ms - recorded_ms,
          written_ms - named_ms);
    }
    return rc;
  }
  if (merged) {
    (void)merge_recording(raw_dir, out, a.has("pid-roots"), a.has("quiet"));
    return rc;
  }
  if (!a.has("quiet")) {
    std::string path;
    if (child_profile_path(out, child, path) && path.find(',') == std::string::npos) {
      if (::access(path.c_str(), F_OK) == 0)
        std::fprintf(stderr, "selfprof record: profile written to %s\n", path.c_str());
      else if (!exec_note.empty())
        std::fprintf(stderr,
                     "selfprof record: no profile at %s: the program exec'd %s, and the profile does not "
                     "follow an exec without --follow-exec (a wrapper such as a version manager's shim "
                     "execs the real program); run again with --follow-exec\n",
                     path.c_str(), exec_note.c_str());
      else if (rc != 126 && rc != 127)
        std::fprintf(stderr, "selfprof record: no profile at %s (was the program killed by a signal?)\n",
                     path.c_str());
    }
  }
  return rc;
}

}  // namespace selfprof_cli
