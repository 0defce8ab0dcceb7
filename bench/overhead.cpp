// Overhead benchmark: the CPU cost of selfprof against the same workload unprofiled, against the bare
// tick source (the same kernel mechanism with an empty handler) and against `perf record -g`, measured
// in one process as CPU-time ratios, with samples delivered and the error of the known 60/30/10 split.
// Context: benchmark program (not a test; see bench/README.md for the figures and how to run it).
//
// Method. A pool of worker threads (1 or 8) runs a fixed amount of work per block: rounds of three
// leaves with a:b:c = 6:3:1 units of CPU, leaf_b below 45 recursive frames. A block's cost is the
// process CPU time (CLOCK_PROCESS_CPUTIME_ID, which includes selfprof's collector thread and the time
// the kernel spends delivering ticks) from before the source is armed to after it is disarmed. Each
// configuration's block sits between two baseline blocks (no profiling) in the same process; its
// overhead is its CPU over the mean of those two. Repeats run the configurations in alternating order;
// the table shows medians and the spread.
#include <dirent.h>
#include <dlfcn.h>
#include <fcntl.h>
#include <linux/perf_event.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cmath>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <selfprof.hpp>
#include <selfprof/detail/process.hpp>
#include <selfprof/symbols/symbolizer.hpp>  // the gperftools profile is named with it

namespace ob {

// ---- the workload ---------------------------------------------------------------------------------

#define OB_NO_TAIL() __asm__ volatile("" ::: "memory")
#if defined(__clang__)
#define OB_NOINLINE __attribute__((noinline))
#else
#define OB_NOINLINE __attribute__((noipa))
#endif

inline std::int64_t clock_ns(clockid_t c) {
  struct timespec ts;
  clock_gettime(c, &ts);
  return std::int64_t(ts.tv_sec) * 1000000000 + ts.tv_nsec;
}
inline std::int64_t thread_cpu_ns() { return clock_ns(CLOCK_THREAD_CPUTIME_ID); }
inline std::int64_t process_cpu_ns() { return clock_ns(CLOCK_PROCESS_CPUTIME_ID); }

OB_NOINLINE double spin_units(long units) {
  volatile double x = 1;
  for (long i = 0; i < units * 20000; ++i) x = x * 1.0000001 + 0.5;
  return x;
}
OB_NOINLINE double leaf_a(long u) {
  double r = spin_units(u);
  OB_NO_TAIL();
  return r;
}
OB_NOINLINE double leaf_b(long u) {
  double r = spin_units(u);
  OB_NO_TAIL();
  return r;
}
OB_NOINLINE double leaf_c(long u) {
  double r = spin_units(u);
  OB_NO_TAIL();
  return r;
}

constexpr int kDeepFrames = 45;
OB_NOINLINE double deep(int n, long u) {
  double r = n == 0 ? leaf_b(u) : deep(n - 1, u);
  OB_NO_TAIL();
  return r;
}

// Thread CPU time spent in each leaf, measured around each call: the truth the samples are checked against.
struct truth {
  std::int64_t a = 0, b = 0, c = 0;
  std::int64_t total() const { return a + b + c; }
  void add(const truth& o) { a += o.a, b += o.b, c += o.c; }
};

OB_NOINLINE truth run_rounds(long rounds) {
  truth t;
  for (long i = 0; i < rounds; ++i) {
    std::int64_t t0 = thread_cpu_ns();
    leaf_a(6);
    std::int64_t t1 = thread_cpu_ns();
    deep(kDeepFrames, 3);
    std::int64_t t2 = thread_cpu_ns();
    leaf_c(1);
    std::int64_t t3 = thread_cpu_ns();
    t.a += t1 - t0;
    t.b += t2 - t1;
    t.c += t3 - t2;
  }
  OB_NO_TAIL();
  return t;
}

// Worker threads that live for the whole run, so every source (and perf -p) sees them from the start.
class pool {
 public:
  explicit pool(int n) : slots_(static_cast<std::size_t>(n)) {
    for (int i = 0; i < n; ++i) threads_.emplace_back([this, i] { loop(i); });
    std::unique_lock<std::mutex> l(mu_);
    cv_done_.wait(l, [&] { return ready_ == static_cast<int>(slots_.size()); });
  }
  ~pool() {
    {
      std::lock_guard<std::mutex> l(mu_);
      quit_ = true;
      ++generation_;
    }
    cv_go_.notify_all();
    for (auto& t : threads_) t.join();
  }
  pool(const pool&) = delete;
  pool& operator=(const pool&) = delete;

  int size() const { return static_cast<int>(slots_.size()); }
  std::vector<pid_t> tids() const {
    std::vector<pid_t> v;
    for (auto& s : slots_) v.push_back(s.tid);
    return v;
  }
  std::vector<pthread_t> handles() {
    std::vector<pthread_t> v;
    for (auto& t : threads_) v.push_back(t.native_handle());
    return v;
  }

  struct result {
    truth t;
    std::int64_t worker_cpu_ns = 0;  // CPU of the workers only (what sampling should cover)
  };

  result run(long rounds_per_thread) {
    {
      std::lock_guard<std::mutex> l(mu_);
      rounds_ = rounds_per_thread;
      pending_ = static_cast<int>(slots_.size());
      ++generation_;
    }
    cv_go_.notify_all();
    std::unique_lock<std::mutex> l(mu_);
    cv_done_.wait(l, [&] { return pending_ == 0; });
    result r;
    for (auto& s : slots_) {
      r.t.add(s.t);
      r.worker_cpu_ns += s.cpu_ns;
    }
    return r;
  }

 private:
  struct slot {
    pid_t tid = 0;
    truth t;
    std::int64_t cpu_ns = 0;
  };
  void loop(int i) {
    std::unique_lock<std::mutex> l(mu_);
    slots_[static_cast<std::size_t>(i)].tid = static_cast<pid_t>(::syscall(SYS_gettid));
    ++ready_;
    cv_done_.notify_all();
    unsigned long seen = generation_;
    for (;;) {
      cv_go_.wait(l, [&] { return generation_ != seen; });
      seen = generation_;
      if (quit_) return;
      long rounds = rounds_;
      l.unlock();
      std::int64_t c0 = thread_cpu_ns();
      truth t = run_rounds(rounds);
      std::int64_t c1 = thread_cpu_ns();
      l.lock();
      slots_[static_cast<std::size_t>(i)].t = t;
      slots_[static_cast<std::size_t>(i)].cpu_ns = c1 - c0;
      if (--pending_ == 0) cv_done_.notify_all();
    }
  }

  std::mutex mu_;
  std::condition_variable cv_go_, cv_done_;
  std::vector<slot> slots_;
  std::vector<std::thread> threads_;
  unsigned long generation_ = 0;
  long rounds_ = 0;
  int pending_ = 0, ready_ = 0;
  bool quit_ = false;
};

std::atomic<std::uint64_t> g_malloc_sink{0};  // keeps malloc_caller's results alive

// ---- the bare tick sources: the same kernel mechanisms, an empty handler ------------------------------

std::atomic<std::uint64_t> g_bare_ticks{0};
std::atomic<std::uint64_t> g_bare_weight{0};   // ticks + timer overruns (what selfprof's weighting counts)
constexpr int kPollHup = 6;                    // si_code of a perf_event signal whose event_limit ran out
constexpr unsigned long kIocRefresh = 0x2402;  // PERF_EVENT_IOC_REFRESH

// Counts and, for perf_event, re-arms exactly as selfprof's handler does (event_limit 1 + REFRESH).
void bare_handler(int, siginfo_t* info, void*) {
  int saved = errno;
  g_bare_ticks.fetch_add(1, std::memory_order_relaxed);
  g_bare_weight.fetch_add(
      1 + (info->si_code == SI_TIMER && info->si_overrun > 0 ? std::uint64_t(info->si_overrun) : 0),
      std::memory_order_relaxed);
  if (info->si_code == kPollHup)
    selfprof::detail::raw_syscall3(SYS_ioctl, info->si_fd, static_cast<long>(kIocRefresh), 1);
  errno = saved;
}

// Installs `handler` on SIGPROF; the destructor discards pending ticks (SIG_IGN) and restores the old action.
struct signal_scope {
  struct sigaction old {};
  explicit signal_scope(void (*handler)(int, siginfo_t*, void*)) {
    struct sigaction a {};
    a.sa_sigaction = handler;
    a.sa_flags = SA_SIGINFO | SA_RESTART;
    sigemptyset(&a.sa_mask);
    sigaction(SIGPROF, &a, &old);
  }
  ~signal_scope() {
    struct sigaction ign {};
    ign.sa_handler = SIG_IGN;
    sigemptyset(&ign.sa_mask);
    sigaction(SIGPROF, &ign, nullptr);
    sigaction(SIGPROF, &old, nullptr);
  }
  signal_scope(const signal_scope&) = delete;
  signal_scope& operator=(const signal_scope&) = delete;
};

// POSIX CPU-time timer per thread (its pthread CPU clock), SIGEV_THREAD_ID.
struct bare_timers {
  std::vector<timer_t> ids;
  std::string error;
  bool arm(const std::vector<pthread_t>& threads, const std::vector<pid_t>& tids, double hz) {
    std::int64_t ns = static_cast<std::int64_t>(1e9 / hz);
    for (std::size_t i = 0; i < threads.size(); ++i) {
      clockid_t clk;
      if (pthread_getcpuclockid(threads[i], &clk) != 0) return error = "pthread_getcpuclockid", false;
      struct sigevent sev;
      std::memset(&sev, 0, sizeof sev);
      sev.sigev_notify = SIGEV_THREAD_ID;
      sev.sigev_signo = SIGPROF;
      sev._sigev_un._tid = tids[i];
      timer_t id;
      if (timer_create(clk, &sev, &id) != 0)
        return error = std::string("timer_create: ") + std::strerror(errno), false;
      ids.push_back(id);
      struct itimerspec spec {};
      spec.it_interval.tv_sec = static_cast<time_t>(ns / 1000000000);
      spec.it_interval.tv_nsec = static_cast<long>(ns % 1000000000);
      spec.it_value = spec.it_interval;
      if (timer_settime(id, 0, &spec, nullptr) != 0)
        return error = std::string("timer_settime: ") + std::strerror(errno), false;
    }
    return true;
  }
  ~bare_timers() {
    for (timer_t id : ids) timer_delete(id);
  }
};

// perf_event per thread: the attributes selfprof opens (cycles if a PMU exists, else task-clock; kernel
// time included when allowed), signal to the owning thread, event_limit 1 re-armed from the handler.
struct bare_perf {
  std::vector<int> fds;
  std::string error, what;
  static int open_one(pid_t tid, double hz, bool hw, bool user_only) {
    struct perf_event_attr attr;
    std::memset(&attr, 0, sizeof attr);
    attr.size = sizeof attr;
    if (hw) {
      attr.type = PERF_TYPE_HARDWARE;
      attr.config = PERF_COUNT_HW_CPU_CYCLES;
      attr.freq = 1;
      attr.sample_freq = static_cast<std::uint64_t>(hz);
    } else {
      attr.type = PERF_TYPE_SOFTWARE;
      attr.config = PERF_COUNT_SW_TASK_CLOCK;
      attr.sample_period = static_cast<std::uint64_t>(1e9 / hz);
    }
    attr.disabled = 1;
    attr.exclude_kernel = user_only ? 1 : 0;
    attr.exclude_hv = 1;
    attr.wakeup_events = 1;
    return static_cast<int>(::syscall(SYS_perf_event_open, &attr, tid, -1, -1, PERF_FLAG_FD_CLOEXEC));
  }
  bool arm(const std::vector<pid_t>& tids, double hz) {
    bool hw = false, user_only = false;
    int probe = -1;
    for (int u = 0; u <= 1 && probe < 0; ++u)
      for (int h = 1; h >= 0 && probe < 0; --h) {
        hw = h == 1, user_only = u == 1;
        probe = open_one(tids[0], hz, hw, user_only);
      }
    if (probe < 0) return error = std::string("perf_event_open: ") + std::strerror(errno), false;
    ::close(probe);
    what = std::string(hw ? "cpu-cycles" : "task-clock") + (user_only ? " user-only" : " user+kernel");
    for (pid_t tid : tids) {
      int fd = open_one(tid, hz, hw, user_only);
      if (fd < 0) return error = std::string("perf_event_open: ") + std::strerror(errno), false;
      fds.push_back(fd);
      struct f_owner_ex owner {};
      owner.type = F_OWNER_TID;
      owner.pid = tid;
      if (fcntl(fd, F_SETFL, O_ASYNC) != 0 || fcntl(fd, F_SETSIG, SIGPROF) != 0 ||
          fcntl(fd, F_SETOWN_EX, &owner) != 0 || ioctl(fd, PERF_EVENT_IOC_REFRESH, 1) != 0)
        return error = std::string("perf fd setup: ") + std::strerror(errno), false;
    }
    return true;
  }
  ~bare_perf() {
    for (int fd : fds) {
      ioctl(fd, PERF_EVENT_IOC_DISABLE, 0);
      ::close(fd);
    }
  }
};

// ---- perf record, attached to this process for one block ----------------------------------------------

struct perf_record_run {
  bool ok = false;
  std::string error;
  std::int64_t perf_cpu_ns = 0;  // perf's own CPU while the events were enabled
  std::uint64_t samples = 0, in_a = 0, in_b = 0, in_c = 0;
};

bool wait_ack(int ack_fd, int ms) {
  struct pollfd p {};
  p.fd = ack_fd;
  p.events = POLLIN;
  std::string got;
  std::int64_t deadline = clock_ns(CLOCK_MONOTONIC) + std::int64_t(ms) * 1000000;
  while (got.find("ack") == std::string::npos) {
    int left = static_cast<int>((deadline - clock_ns(CLOCK_MONOTONIC)) / 1000000);
    if (left <= 0 || poll(&p, 1, left) <= 0) return false;
    char buf[64];
    ssize_t n = read(ack_fd, buf, sizeof buf);
    if (n > 0)
      got.append(buf, static_cast<std::size_t>(n));
    else if (n == 0)
      usleep(1000);
  }
  return true;
}

std::int64_t other_process_cpu_ns(pid_t pid) {
  clockid_t c;
  if (clock_getcpuclockid(pid, &c) != 0) return -1;
  return clock_ns(c);
}

// Classifies each sample of `perf script -F ip,sym` by the first leaf_* frame from the leaf.
void parse_perf_script(const std::string& data_file, perf_record_run& r) {
  std::string cmd = "perf script -i '" + data_file + "' -F ip,sym 2>/dev/null";
  FILE* f = popen(cmd.c_str(), "r");
  if (!f) return;
  char line[4096];
  bool in_sample = false, classified = false;
  while (fgets(line, sizeof line, f)) {
    bool blank = line[0] == '\n' || line[0] == '\0';
    if (blank) {
      in_sample = false;
      continue;
    }
    if (!in_sample) {
      in_sample = true;
      classified = false;
      ++r.samples;
    }
    if (classified) continue;
    if (std::strstr(line, "leaf_a"))
      ++r.in_a, classified = true;
    else if (std::strstr(line, "leaf_b"))
      ++r.in_b, classified = true;
    else if (std::strstr(line, "leaf_c"))
      ++r.in_c, classified = true;
  }
  pclose(f);
}

// ---- one measured block ------------------------------------------------------------------------------

enum class kind { baseline, bare_timer, bare_perf, selfprof_run, perf_record, gperftools };

struct config {
  kind k = kind::baseline;
  double hz = 0;
  selfprof::source_kind source = selfprof::source_kind::automatic;
  std::string label;
  bool dwarf = false;  // perf record --call-graph dwarf (copies user stacks, as the ring source does)
};

struct block {
  bool ok = true;
  std::string error, detail;
  std::int64_t cpu_ns = 0;              // process CPU of the block
  std::int64_t own_base_ns = 0;         // gperftools: the baseline its child measured, else 0 (neighbours)
  std::int64_t own_base_worker_ns = 0;  // gperftools: the same, its workers' CPU only
  std::int64_t extra_cpu_ns = 0;        // perf record's own CPU while recording
  std::int64_t extra_total_ns = 0;      // perf record's whole run: start, record, write (wait4 rusage)
  std::int64_t worker_cpu_ns = 0;       // the workers' CPU
  double records = 0, weighted = 0;     // samples taken (records) and their weight
  double split_err = -1;                // max abs difference of shares, in points (-1: not measured)
  double split_err_work = -1;           // the same against the 6:3:1 units of work (see kWorkTruth)
  double split_sigma = -1;              // one binomial standard deviation of leaf_a's share, in points
  std::int64_t collector_cpu_ns = 0;    // selfprof's collector thread (read just before stop)
  std::int64_t control_cpu_ns = 0;      // start() + stop() on the calling thread
  std::int64_t wall_ns = 0;             // the block's wall time (the collector's cost follows it)
  double collector_wakes = 0;           // times the collector woke (stats::collector_wakes)
};

// The CPU time so far of this process's thread named `name`, or -1.
std::int64_t named_thread_cpu_ns(const char* name) {
  DIR* dir = opendir("/proc/self/task");
  if (!dir) return -1;
  std::int64_t out = -1;
  while (dirent* e = readdir(dir)) {
    if (e->d_name[0] < '0' || e->d_name[0] > '9') continue;
    std::string comm =
        selfprof::detail::read_small_file(std::string("/proc/self/task/") + e->d_name + "/comm");
    while (!comm.empty() && comm.back() == '\n') comm.pop_back();
    if (comm != name) continue;
    pid_t tid = static_cast<pid_t>(std::atol(e->d_name));
    clockid_t clk =
        static_cast<clockid_t>((~static_cast<unsigned>(tid) << 3) | 6u);  // CPUCLOCK_SCHED|PERTHREAD
    out = clock_ns(clk);
  }
  closedir(dir);
  return out;
}

// Sampling noise alone: the standard deviation of leaf_a's share (the largest) over n samples, in points.
double binomial_sigma(double n, const truth& t) {
  if (n <= 0 || t.total() <= 0) return -1;
  double p = double(t.a) / double(t.total());
  return 100 * std::sqrt(p * (1 - p) / n);
}

// The split of the work itself: every leaf runs the same loop, 6:3:1 units of it per round. The truth
// read from the thread CPU clock around each call also charges each leaf the clock_gettime syscalls at
// its ends (0.8 us each on one thread here, 2.1-2.4 us on 8 threads sharing 2 CPUs) and, when threads
// share CPUs, moves leaf_a's share by -0.8 points against this one; samples agree with the work split
// within binomial noise there (bench/README.md). Both are reported.
const truth kWorkTruth{6, 3, 1};

double split_error(double a, double b, double c, const truth& t) {
  double n = a + b + c;
  if (n <= 0 || t.total() <= 0) return -1;
  double ta = double(t.a) / double(t.total()), tb = double(t.b) / double(t.total()),
         tc = double(t.c) / double(t.total());
  return 100 * std::max({std::abs(a / n - ta), std::abs(b / n - tb), std::abs(c / n - tc)});
}

struct selfprof_leaves {
  double a = 0, b = 0, c = 0;
};
selfprof_leaves leaves_of(const selfprof::profile& p) {
  selfprof_leaves l;
  for (const auto& s : p.stacks) {
    for (std::size_t i = s.frames.size(); i-- > 0;) {
      const std::string& n = p.frames[s.frames[i]].name;
      if (n.find("leaf_a") != std::string::npos) {
        l.a += double(s.count);
        break;
      }
      if (n.find("leaf_b") != std::string::npos) {
        l.b += double(s.count);
        break;
      }
      if (n.find("leaf_c") != std::string::npos) {
        l.c += double(s.count);
        break;
      }
    }
  }
  return l;
}

std::string g_tmpdir;
int g_perf_seq = 0;

// ---- gperftools --------------------------------------------------------------------------------------
//
// gperftools' CPU profiler (libprofiler.so.0, Debian's libgoogle-perftools4): ProfilerStart/Stop around
// the same work. Its rate (CPUPROFILE_FREQUENCY) is read once, when the library is loaded, so each block
// runs in a fork()ed child that sets it, loads the library, builds a pool of the same size and measures
// a baseline block, the profiled block and a second baseline; the overhead is against the child's own
// baselines. Its profile (the legacy binary CPU profile: words of the pointer size, a header
// [0, 3, 0, period_us, 0], records [count, depth, pc...], a trailer [0, 1, 0]) is read back and the leaves
// named with selfprof's symbolizer for the split.
using profiler_start_fn = int (*)(const char*);
using profiler_stop_fn = void (*)();

struct gperf_result {
  std::int64_t base_ns = 0, cpu_ns = 0, worker_cpu_ns = 0, base_worker_ns = 0;
  double samples = 0, a = 0, b = 0, c = 0;
  truth t;
  char error[160] = {0};
};

// Reads a legacy CPU profile: samples, and the leaf each stack passes through.
void read_gperf_profile(const std::string& path, gperf_result& out) {
  FILE* f = std::fopen(path.c_str(), "rb");
  if (!f) return;
  std::vector<std::uintptr_t> w;
  std::uintptr_t v;
  while (std::fread(&v, sizeof v, 1, f) == 1) w.push_back(v);
  std::fclose(f);
  if (w.size() < 5 || w[0] != 0 || w[1] != 3) return;
  selfprof::symbolizer sym;
  sym.refresh();
  std::map<std::uintptr_t, int> leaf_of;  // pc -> 0 a, 1 b, 2 c, -1 another function
  auto leaf = [&](std::uintptr_t pc, bool ret) {
    auto it = leaf_of.find(pc);
    if (it != leaf_of.end()) return it->second;
    const std::string n = sym.resolve_one(ret ? pc - 1 : pc).name;
    const int k = n.find("leaf_a") != std::string::npos   ? 0
                  : n.find("leaf_b") != std::string::npos ? 1
                  : n.find("leaf_c") != std::string::npos ? 2
                                                          : -1;
    leaf_of.emplace(pc, k);
    return k;
  };
  for (std::size_t i = 5; i + 2 <= w.size();) {
    const std::uintptr_t count = w[i], depth = w[i + 1];
    if (count == 0 || depth > w.size() - i - 2) break;  // the trailer, or a cut file
    out.samples += double(count);
    for (std::size_t d = 0; d < depth; ++d) {
      const int k = leaf(w[i + 2 + d], d > 0);
      if (k < 0) continue;
      (k == 0 ? out.a : k == 1 ? out.b : out.c) += double(count);
      break;
    }
    i += 2 + depth;
  }
}

block gperftools_block(int threads, long rounds, double hz) {
  block b;
  void* mem = mmap(nullptr, sizeof(gperf_result), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (mem == MAP_FAILED) {
    b.ok = false;
    b.error = std::string("mmap: ") + std::strerror(errno);
    return b;
  }
  gperf_result* shared = new (mem) gperf_result();
  const std::string out = g_tmpdir + "/gperf" + std::to_string(++g_perf_seq) + ".prof";
  std::fflush(nullptr);
  const pid_t child = fork();
  if (child == 0) {
    char rate[32];
    std::snprintf(rate, sizeof rate, "%d", static_cast<int>(hz));
    setenv("CPUPROFILE_FREQUENCY", rate, 1);
    void* lib = dlopen("libprofiler.so.0", RTLD_NOW);
    auto start = lib ? reinterpret_cast<profiler_start_fn>(dlsym(lib, "ProfilerStart")) : nullptr;
    auto stop = lib ? reinterpret_cast<profiler_stop_fn>(dlsym(lib, "ProfilerStop")) : nullptr;
    if (!start || !stop) {
      std::snprintf(shared->error, sizeof shared->error, "libprofiler.so.0 or its ProfilerStart not found");
      _exit(1);
    }
    pool workers(threads);
    workers.run(std::max(1L, rounds / 20));  // warm-up, as the parent's pool had
    std::int64_t c0 = process_cpu_ns();
    const std::int64_t base1_worker = workers.run(rounds).worker_cpu_ns;
    const std::int64_t base1 = process_cpu_ns() - c0;
    c0 = process_cpu_ns();
    if (!start(out.c_str())) {
      std::snprintf(shared->error, sizeof shared->error, "ProfilerStart(%s) failed", out.c_str());
      _exit(1);
    }
    pool::result r = workers.run(rounds);
    stop();
    shared->cpu_ns = process_cpu_ns() - c0;
    c0 = process_cpu_ns();
    const std::int64_t base2_worker = workers.run(rounds).worker_cpu_ns;
    shared->base_ns = (base1 + process_cpu_ns() - c0) / 2;
    shared->base_worker_ns = (base1_worker + base2_worker) / 2;
    shared->worker_cpu_ns = r.worker_cpu_ns;
    shared->t = r.t;
    read_gperf_profile(out, *shared);
    _exit(0);
  }
  int status = 0;
  if (child > 0) waitpid(child, &status, 0);
  const gperf_result res = *shared;
  munmap(mem, sizeof(gperf_result));
  unlink(out.c_str());
  if (child < 0 || !WIFEXITED(status) || WEXITSTATUS(status) != 0 || res.base_ns <= 0) {
    b.ok = false;
    b.error = res.error[0] ? res.error : "the gperftools child failed";
    return b;
  }
  b.cpu_ns = res.cpu_ns;
  b.own_base_ns = res.base_ns;
  b.own_base_worker_ns = res.base_worker_ns;
  b.worker_cpu_ns = res.worker_cpu_ns;
  b.records = b.weighted = res.samples;
  b.split_err = split_error(res.a, res.b, res.c, res.t);
  b.split_err_work = split_error(res.a, res.b, res.c, kWorkTruth);
  b.split_sigma = binomial_sigma(res.a + res.b + res.c, res.t);
  b.detail = "gperftools CPUPROFILE_FREQUENCY=" + std::to_string(static_cast<int>(hz)) +
             " (setitimer ITIMER_PROF, SIGPROF), in a child against its own baselines";
  return b;
}

block run_block_inner(pool& workers, long rounds, const config& cfg);

block run_block(pool& workers, long rounds, const config& cfg) {
  std::int64_t w0 = clock_ns(CLOCK_MONOTONIC);
  block b = run_block_inner(workers, rounds, cfg);
  b.wall_ns = clock_ns(CLOCK_MONOTONIC) - w0;
  return b;
}

block run_block_inner(pool& workers, long rounds, const config& cfg) {
  block b;
  pool::result r;
  if (cfg.k == kind::baseline) {
    std::int64_t c0 = process_cpu_ns();
    r = workers.run(rounds);
    b.cpu_ns = process_cpu_ns() - c0;
  } else if (cfg.k == kind::bare_timer || cfg.k == kind::bare_perf) {
    std::vector<pid_t> tids = workers.tids();
    std::vector<pthread_t> handles = workers.handles();
    tids.push_back(static_cast<pid_t>(::syscall(SYS_gettid)));  // selfprof arms the (idle) main thread too
    handles.push_back(pthread_self());
    signal_scope sig(&bare_handler);
    std::uint64_t ticks0 = g_bare_ticks.load(), weight0 = g_bare_weight.load();
    std::int64_t c0 = process_cpu_ns();
    {
      bare_timers timers;
      bare_perf perf;
      bool armed = cfg.k == kind::bare_timer ? timers.arm(handles, tids, cfg.hz) : perf.arm(tids, cfg.hz);
      b.detail = cfg.k == kind::bare_timer ? "CPU timer" : perf.what;
      if (!armed) {
        b.ok = false;
        b.error = cfg.k == kind::bare_timer ? timers.error : perf.error;
        return b;
      }
      r = workers.run(rounds);
    }
    b.cpu_ns = process_cpu_ns() - c0;
    b.records = double(g_bare_ticks.load() - ticks0);
    b.weighted = double(g_bare_weight.load() - weight0);
  } else if (cfg.k == kind::selfprof_run) {
    selfprof::options o;
    o.hz = cfg.hz;
    o.source = cfg.source;
    o.dump_signal = 0;
    std::int64_t c0 = process_cpu_ns(), m0 = thread_cpu_ns();
    selfprof::status st = selfprof::start(o);
    std::int64_t m1 = thread_cpu_ns();
    if (!st) {
      b.ok = false;
      b.error = st.message();
      return b;
    }
    r = workers.run(rounds);
    b.collector_cpu_ns = std::max<std::int64_t>(0, named_thread_cpu_ns("selfprof"));
    std::int64_t m2 = thread_cpu_ns();
    selfprof::stop();
    b.cpu_ns = process_cpu_ns() - c0;
    b.control_cpu_ns = (m1 - m0) + (thread_cpu_ns() - m2);
    selfprof::stats s = selfprof::get_stats();
    b.detail = std::string(selfprof::source_name(s.source)) + ": " + s.source_detail;
    b.records = double(s.records);
    b.weighted = double(s.samples);
    b.collector_wakes = double(s.collector_wakes);
    selfprof_leaves l = leaves_of(selfprof::snapshot());
    b.split_err = split_error(l.a, l.b, l.c, r.t);
    b.split_err_work = split_error(l.a, l.b, l.c, kWorkTruth);
    b.split_sigma = binomial_sigma(l.a + l.b + l.c, r.t);
  } else if (cfg.k == kind::gperftools) {
    return gperftools_block(workers.size(), rounds, cfg.hz);
  } else {
    perf_record_run pr;
    std::string base = g_tmpdir + "/perf" + std::to_string(++g_perf_seq);
    std::string ctl = base + ".ctl", ack = base + ".ack", data = base + ".data", log = base + ".log";
    if (mkfifo(ctl.c_str(), 0600) != 0 || mkfifo(ack.c_str(), 0600) != 0) {
      b.ok = false;
      b.error = std::string("mkfifo: ") + std::strerror(errno);
      return b;
    }
    // O_RDWR on a FIFO never blocks (Linux fifo(7)); perf opens the ack FIFO write-only, which waits for us.
    int ctl_fd = open(ctl.c_str(), O_RDWR | O_CLOEXEC);
    int ack_fd = open(ack.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
    std::string hz = std::to_string(static_cast<int>(cfg.hz)), pid = std::to_string(getpid());
    std::string control = "fifo:" + ctl + "," + ack;
    pid_t child = fork();
    if (child == 0) {
      int fd = open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
      if (fd >= 0) dup2(fd, 1), dup2(fd, 2);
      if (cfg.dwarf)
        execlp("perf", "perf", "record", "-F", hz.c_str(), "--call-graph", "dwarf", "-p", pid.c_str(), "-o",
               data.c_str(), "--control", control.c_str(), "-D", "-1", "-q", static_cast<char*>(nullptr));
      else
        execlp("perf", "perf", "record", "-F", hz.c_str(), "-g", "-p", pid.c_str(), "-o", data.c_str(),
               "--control", control.c_str(), "-D", "-1", "-q", static_cast<char*>(nullptr));
      _exit(127);
    }
    bool ready = child > 0 && write(ctl_fd, "enable\n", 7) == 7 && wait_ack(ack_fd, 20000);
    if (ready) {
      std::int64_t p0 = other_process_cpu_ns(child);
      std::int64_t c0 = process_cpu_ns();
      r = workers.run(rounds);
      b.cpu_ns = process_cpu_ns() - c0;
      std::int64_t p1 = other_process_cpu_ns(child);
      b.extra_cpu_ns = p0 >= 0 && p1 >= 0 ? p1 - p0 : 0;
      ready = write(ctl_fd, "disable\n", 8) == 8 && wait_ack(ack_fd, 20000);
    }
    if (child > 0) {
      kill(child, SIGINT);
      int status = 0;
      struct rusage ru {};
      wait4(child, &status, 0, &ru);
      b.extra_total_ns = (std::int64_t(ru.ru_utime.tv_sec) + ru.ru_stime.tv_sec) * 1000000000 +
                         (std::int64_t(ru.ru_utime.tv_usec) + ru.ru_stime.tv_usec) * 1000;
    }
    close(ctl_fd);
    close(ack_fd);
    if (!ready) {
      b.ok = false;
      b.error = "perf record did not start or answer (see " + log + ")";
      return b;
    }
    parse_perf_script(data, pr);
    b.detail = "perf record -F " + hz + (cfg.dwarf ? " --call-graph dwarf" : " -g") + " -p (cpu-clock)";
    b.records = b.weighted = double(pr.samples);
    b.split_err = split_error(double(pr.in_a), double(pr.in_b), double(pr.in_c), r.t);
    b.split_err_work = split_error(double(pr.in_a), double(pr.in_b), double(pr.in_c), kWorkTruth);
    b.split_sigma = binomial_sigma(double(pr.in_a + pr.in_b + pr.in_c), r.t);
    unlink(data.c_str());
    unlink(ctl.c_str());
    unlink(ack.c_str());
    unlink(log.c_str());
  }
  b.worker_cpu_ns = r.worker_cpu_ns;
  return b;
}

// ---- statistics and the table --------------------------------------------------------------------------

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  std::size_t n = v.size();
  return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

struct row {
  std::vector<double> overhead, overhead_work, overhead_total, overhead_perf_run, vs_bare, us_per_tick,
      delivered, weighted, split, split_work, sigma;
  std::vector<double> collector, collector_ms_per_s, wakes_per_s, control_ms, handler_pct,
      attributed;  // selfprof's own parts, in % of the baseline
  std::string detail, error, bare_key;
};

std::string key_of(int threads, const config& c) { return std::to_string(threads) + "|" + c.label; }

std::string key_of(int threads, const config& c);

std::string spread(const std::vector<double>& v, const char* fmt_one) {
  if (v.empty()) return "";
  char buf[96], a[32], b[32], m[32];
  auto mm = std::minmax_element(v.begin(), v.end());
  std::snprintf(m, sizeof m, fmt_one, median(v));
  std::snprintf(a, sizeof a, fmt_one, *mm.first);
  std::snprintf(b, sizeof b, fmt_one, *mm.second);
  std::snprintf(buf, sizeof buf, v.size() > 1 ? "%s (%s..%s)" : "%s", m, a, b);
  return buf;
}
std::string one(const std::vector<double>& v, const char* fmt) {
  if (v.empty()) return "";
  char buf[32];
  std::snprintf(buf, sizeof buf, fmt, median(v));
  return buf;
}

// Markdown tables: every configuration, then selfprof's own parts (exact, not subject to the noise).
void print_tables(const std::vector<std::pair<int, config>>& order, std::map<std::string, row>& rows) {
  std::printf(
      "\n| thr | configuration | process %% median (min..max) | workload threads %% median (min..max) | vs "
      "bare, points | with perf's CPU while recording %% | with perf's whole run %% | us per tick | "
      "delivered "
      "(records) | weighted | split error, points | split error vs 6:3:1 work | binomial sigma |\n");
  std::printf("|---|---|---|---|---|---|---|---|---|---|---|---|---|\n");
  for (auto& tc : order) {
    const row& rw = rows[key_of(tc.first, tc.second)];
    if (rw.overhead.empty()) {
      std::printf("| %d | %s | failed: %s |||||||||||\n", tc.first, tc.second.label.c_str(),
                  rw.error.c_str());
      continue;
    }
    const bool pr = tc.second.k == kind::perf_record;
    std::printf("| %d | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s |\n", tc.first,
                tc.second.label.c_str(), spread(rw.overhead, "%+.2f").c_str(),
                spread(rw.overhead_work, "%+.2f").c_str(), spread(rw.vs_bare, "%+.2f").c_str(),
                pr ? one(rw.overhead_total, "%+.2f").c_str() : "",
                pr ? one(rw.overhead_perf_run, "%+.2f").c_str() : "", one(rw.us_per_tick, "%.1f").c_str(),
                one(std::vector<double>{100 * median(rw.delivered)}, "%.1f%%").c_str(),
                one(std::vector<double>{100 * median(rw.weighted)}, "%.1f%%").c_str(),
                one(rw.split, "%.2f").c_str(), one(rw.split_work, "%.2f").c_str(),
                one(rw.sigma, "%.2f").c_str());
  }
  std::printf(
      "\nselfprof's own CPU, measured exactly (collector thread clock, start+stop on the caller) plus the\n"
      "handler estimated as records x --handler-ns; 'attributed' is their sum: what selfprof adds to the "
      "bare tick.\n\n");
  std::printf(
      "| thr | configuration | collector %% | collector ms per wall-s | collector wakes per s | start+stop "
      "ms "
      "| handler (est.) %% | attributed vs bare, points |\n");
  std::printf("|---|---|---|---|---|---|---|---|\n");
  for (auto& tc : order) {
    if (tc.second.k != kind::selfprof_run) continue;
    const row& rw = rows[key_of(tc.first, tc.second)];
    if (rw.collector.empty()) continue;
    std::printf("| %d | %s | %s | %s | %s | %s | %s | %s |\n", tc.first, tc.second.label.c_str(),
                spread(rw.collector, "%.3f").c_str(), one(rw.collector_ms_per_s, "%.2f").c_str(),
                one(rw.wakes_per_s, "%.1f").c_str(), one(rw.control_ms, "%.1f").c_str(),
                one(rw.handler_pct, "%.3f").c_str(), spread(rw.attributed, "%.3f").c_str());
  }
}

bool has_arg(int argc, char** argv, const char* name) {
  for (int i = 1; i < argc; ++i)
    if (std::strcmp(argv[i], name) == 0) return true;
  return false;
}
double arg_value(int argc, char** argv, const char* name, double dflt) {
  for (int i = 1; i + 1 < argc; ++i)
    if (std::strcmp(argv[i], name) == 0) return std::atof(argv[i + 1]);
  return dflt;
}
const char* arg_text(int argc, char** argv, const char* name, const char* dflt) {
  for (int i = 1; i + 1 < argc; ++i)
    if (std::strcmp(argv[i], name) == 0) return argv[i + 1];
  return dflt;
}
// Whether `label` contains one of the comma-separated words of `only` (empty: every label).
bool wanted(const std::string& only, const std::string& label) {
  if (only.empty()) return true;
  std::size_t at = 0;
  while (at <= only.size()) {
    std::size_t comma = only.find(',', at);
    if (comma == std::string::npos) comma = only.size();
    if (comma > at && label.find(only.substr(at, comma - at)) != std::string::npos) return true;
    at = comma + 1;
  }
  return false;
}

// ---- a caller whose time is inside glibc's malloc and free ------------------------------------------------
// glibc is built without frame pointers: a sample in malloc keeps its caller only through the CFI rows
// (or, for the ring source, the rows applied to the kernel's stack copy). The caller's share of the
// samples (stacks that hold it) is compared with its share of the thread's CPU clock.

OB_NOINLINE std::uint64_t malloc_caller(long n) {
  static void* keep[64];
  std::uint64_t sum = 0;
  for (long i = 0; i < n; ++i) {
    void*& slot = keep[i & 63];
    std::free(slot);
    slot = std::malloc(16 + ((static_cast<std::size_t>(i) * 2654435761u) & 1023));
    sum += reinterpret_cast<std::uintptr_t>(slot) & 0xff;
  }
  OB_NO_TAIL();
  return sum;
}

struct malloc_truth {
  std::int64_t caller_ns = 0, total_ns = 0;
};

// `rounds` of malloc_caller(m) then leaf_c(u), timed by the thread's CPU clock.
OB_NOINLINE malloc_truth run_malloc_rounds(long rounds, long m, long u) {
  malloc_truth t;
  const std::int64_t start = thread_cpu_ns();
  for (long i = 0; i < rounds; ++i) {
    const std::int64_t t0 = thread_cpu_ns();
    g_malloc_sink += malloc_caller(m);
    t.caller_ns += thread_cpu_ns() - t0;
    leaf_c(u);
  }
  t.total_ns = thread_cpu_ns() - start;
  OB_NO_TAIL();
  return t;
}

// Runs the workload for about `cpu_s` seconds under each source at 1 kHz and prints the caller's share.
int malloc_caller_table(double cpu_s) {
  // Calibrate: malloc_caller(m) about 300 us, leaf_c(u) about 700 us, one round about 1 ms.
  std::int64_t c0 = thread_cpu_ns();
  g_malloc_sink += malloc_caller(20000);
  const double ns_per_m = double(thread_cpu_ns() - c0) / 20000;
  c0 = thread_cpu_ns();
  leaf_c(20);
  const double ns_per_u = double(thread_cpu_ns() - c0) / 20;
  const long m = std::max(1L, static_cast<long>(300000 / ns_per_m));
  const long u = std::max(1L, static_cast<long>(700000 / ns_per_u));
  const long rounds = static_cast<long>(cpu_s * 1000);
  std::printf(
      "\n| source (1 kHz) | samples | caller's share of samples %% | of the thread's CPU %% | error, points "
      "| "
      "binomial sigma, points |\n|---|---|---|---|---|---|\n");
  for (selfprof::source_kind k : {selfprof::source_kind::ring, selfprof::source_kind::perf}) {
    selfprof::options o;
    o.hz = 1000;
    o.source = k;
    o.dump_signal = 0;
    const selfprof::status st = selfprof::start(o);
    if (!st) {
      std::printf("| %s | failed: %s |||||\n", selfprof::source_name(k), st.message().c_str());
      continue;
    }
    const malloc_truth t = run_malloc_rounds(rounds, m, u);
    const selfprof::profile p = selfprof::snapshot();
    const std::string used = selfprof::source_name(selfprof::get_stats().source);
    selfprof::stop();
    double in_caller = 0, in_loop = 0;
    for (const auto& st2 : p.stacks) {
      bool caller = false, loop = false;
      for (const std::uint32_t f : st2.frames) {
        const std::string& n = p.frames[f].name;
        caller = caller || n.find("malloc_caller(") != std::string::npos ||
                 (n.size() >= 13 && n.compare(n.size() - 13, 13, "malloc_caller") == 0);
        loop = loop || n.find("run_malloc_rounds") != std::string::npos;
      }
      in_caller += caller ? double(st2.count) : 0;
      in_loop += loop || caller ? double(st2.count) : 0;
    }
    const double truth = double(t.caller_ns) / double(t.total_ns);
    const double share = in_loop > 0 ? in_caller / in_loop : 0;
    std::printf("| %s | %.0f | %.2f | %.2f | %+.2f | %.2f |\n", used.c_str(), in_loop, 100 * share,
                100 * truth, 100 * (share - truth),
                in_loop > 0 ? 100 * std::sqrt(truth * (1 - truth) / in_loop) : 0.0);
    std::fflush(stdout);
  }
  return 0;
}

}  // namespace ob

int main(int argc, char** argv) {
  using namespace ob;
  if (has_arg(argc, argv, "--help")) {
    std::printf(
        "usage: %s [--cpu-s 4] [--repeats 3] [--threads-max 8] [--no-perf-record] [--no-gperftools] "
        "[--rate 99|1000] [--only WORD,WORD] [--verbose] | --malloc-caller [--cpu-s 20]\n"
        "  --rate runs one of the two rates; --only keeps the configurations whose label contains a word\n"
        "  --malloc-caller: a caller's share when its time is inside glibc's malloc/free, ring and perf\n",
        argv[0]);
    return 0;
  }
  const double cpu_s = arg_value(argc, argv, "--cpu-s", 4.0);
  const int repeats = static_cast<int>(arg_value(argc, argv, "--repeats", 3));
  const int threads_max = static_cast<int>(arg_value(argc, argv, "--threads-max", 8));
  const bool verbose = has_arg(argc, argv, "--verbose");
  const double only_rate = arg_value(argc, argv, "--rate", 0);
  const std::string only = arg_text(argc, argv, "--only", "");
  // The handler's own cost per sample (bench/sample_cost's "handler in sig" at depth 64): its share is
  // estimated as records x this, since it cannot be told from the tick's cost inside one run.
  const double handler_ns = arg_value(argc, argv, "--handler-ns", 1000);
  bool with_perf = !has_arg(argc, argv, "--no-perf-record");
  std::string perf_note;
  if (with_perf && geteuid() != 0) with_perf = false, perf_note = "perf record skipped: not root";
  if (with_perf && std::system("perf --version >/dev/null 2>&1") != 0)
    with_perf = false, perf_note = "perf record skipped: perf not found";
  bool with_gperf = !has_arg(argc, argv, "--no-gperftools");
  if (with_gperf) {  // probed in a child: loading it here would fix its rate for every later block
    const pid_t probe = fork();
    if (probe == 0) _exit(dlopen("libprofiler.so.0", RTLD_NOW) ? 0 : 1);
    int status = 1;
    if (probe > 0) waitpid(probe, &status, 0);
    if (probe < 0 || !WIFEXITED(status) || WEXITSTATUS(status) != 0) {
      with_gperf = false;
      if (!perf_note.empty()) perf_note += "; ";
      perf_note += "gperftools skipped: libprofiler.so.0 not found (Debian: libgoogle-perftools4)";
    }
  }
  char tmpl[] = "/tmp/selfprof-overhead-XXXXXX";
  if (!mkdtemp(tmpl)) {
    std::perror("mkdtemp");
    return 1;
  }
  g_tmpdir = tmpl;

  // Calibrate: rounds per CPU-second of one thread, after a warm-up.
  long rounds_per_s = 0;
  {
    pool one(1);
    one.run(20);
    pool::result r = one.run(200);
    rounds_per_s = static_cast<long>(200 / (double(r.worker_cpu_ns) / 1e9));
  }
  const long total_rounds = static_cast<long>(cpu_s * double(rounds_per_s));
  if (has_arg(argc, argv,
              "--wake-cost")) {  // what one timed wake-up of an idle thread costs (the collector's floor)
    int ms = static_cast<int>(arg_value(argc, argv, "--wake-cost", 20));
    std::atomic<bool> stop{false};
    long wakes = 0;
    std::int64_t cpu = 0;
    std::thread waker([&] {
      std::int64_t c0 = thread_cpu_ns();
      while (!stop.load()) poll(nullptr, 0, ms), ++wakes;
      cpu = thread_cpu_ns() - c0;
    });
    pool one(1);
    one.run(total_rounds);  // one busy thread meanwhile, as in the 1-thread blocks
    stop.store(true);
    waker.join();
    std::printf("poll every %d ms: %ld wake-ups, %.1f us of CPU each\n", ms, wakes,
                double(cpu) / 1e3 / double(wakes));
    return 0;
  }
  if (has_arg(argc, argv, "--malloc-caller")) return malloc_caller_table(cpu_s);
  if (has_arg(argc, argv, "--noise")) {  // baseline blocks only: how much the same work varies here
    pool one(static_cast<int>(arg_value(argc, argv, "--noise", 1)));
    for (int i = 0; i < repeats; ++i) {
      std::int64_t c0 = process_cpu_ns(), w0 = clock_ns(CLOCK_MONOTONIC);
      one.run(total_rounds);
      std::printf("%.4f %.4f\n", double(process_cpu_ns() - c0) / 1e9,
                  double(clock_ns(CLOCK_MONOTONIC) - w0) / 1e9);
    }
    return 0;
  }
  std::printf("# workload: %ld rounds per CPU-second; %ld rounds (~%.1f s CPU) per block; %d repeats\n",
              rounds_per_s, total_rounds, cpu_s, repeats);

  std::vector<int> thread_counts{1};
  if (threads_max > 1) thread_counts.push_back(threads_max);

  std::map<std::string, row> rows;
  std::vector<std::pair<int, config>> order;  // table order
  for (int threads : thread_counts) {
    pool workers(threads);
    const long rounds = std::max(1L, total_rounds / threads);
    workers.run(std::max(1L, rounds / 20));  // warm-up

    // Which source does `auto` take? A forced run of the same source would repeat it: run it once.
    std::map<double, std::string> auto_source;
    for (double hz : {99.0, 1000.0}) {
      selfprof::options o;
      o.hz = hz;
      o.dump_signal = 0;
      if (selfprof::start(o)) {
        auto_source[hz] = selfprof::source_name(selfprof::get_stats().source);
        selfprof::stop();
      }
    }
    std::vector<config> configs;
    for (double hz : {99.0, 1000.0}) {
      char buf[64];
      std::snprintf(buf, sizeof buf, "bare timer %gHz", hz);
      configs.push_back({kind::bare_timer, hz, selfprof::source_kind::automatic, buf});
      std::snprintf(buf, sizeof buf, "bare perf %gHz", hz);
      configs.push_back({kind::bare_perf, hz, selfprof::source_kind::automatic, buf});
      std::string a = auto_source[hz];
      std::snprintf(buf, sizeof buf, "selfprof auto(=%s) %gHz", a.c_str(), hz);
      configs.push_back({kind::selfprof_run, hz, selfprof::source_kind::automatic, buf});
      if (a != "timer") {
        std::snprintf(buf, sizeof buf, "selfprof timer %gHz", hz);
        configs.push_back({kind::selfprof_run, hz, selfprof::source_kind::timer, buf});
      }
      if (a != "perf") {
        std::snprintf(buf, sizeof buf, "selfprof perf %gHz", hz);
        configs.push_back({kind::selfprof_run, hz, selfprof::source_kind::perf, buf});
      }
      if (a != "ring") {  // no signal: the kernel writes samples with stack copies, the collector unwinds
        std::snprintf(buf, sizeof buf, "selfprof ring %gHz", hz);
        configs.push_back({kind::selfprof_run, hz, selfprof::source_kind::ring, buf});
      }
      if (with_perf) {
        double phz = hz == 1000.0 ? 999.0 : hz;
        std::snprintf(buf, sizeof buf, "perf record -g %gHz", phz);
        configs.push_back({kind::perf_record, phz, selfprof::source_kind::automatic, buf});
        std::snprintf(buf, sizeof buf, "perf record dwarf %gHz", phz);
        configs.push_back({kind::perf_record, phz, selfprof::source_kind::automatic, buf, true});
      }
      if (with_gperf) {
        std::snprintf(buf, sizeof buf, "gperftools %gHz", hz);
        configs.push_back({kind::gperftools, hz, selfprof::source_kind::automatic, buf});
      }
    }
    configs.erase(std::remove_if(configs.begin(), configs.end(),
                                 [&](const config& c) {
                                   const bool rate_ok = only_rate <= 0 || (only_rate >= 500) == (c.hz >= 500);
                                   return !rate_ok || !wanted(only, c.label);
                                 }),
                  configs.end());
    for (auto& c : configs) order.emplace_back(threads, c);
    std::vector<double> base_noise;

    for (int rep = 0; rep < repeats; ++rep) {
      std::vector<config> seq = configs;
      if (rep % 2 == 1) std::reverse(seq.begin(), seq.end());
      config base_cfg;
      base_cfg.label = "baseline";
      // B c c B c c B ...: each configuration is compared with the baselines right before and after it.
      std::vector<block> blocks;
      std::vector<int> kinds;  // -1 baseline, else index into seq
      blocks.push_back(run_block(workers, rounds, base_cfg));
      kinds.push_back(-1);
      for (std::size_t i = 0; i < seq.size(); ++i) {
        blocks.push_back(run_block(workers, rounds, seq[i]));
        kinds.push_back(static_cast<int>(i));
        if (i % 2 == 1 || i + 1 == seq.size()) {
          blocks.push_back(run_block(workers, rounds, base_cfg));
          kinds.push_back(-1);
        }
      }
      std::int64_t prev_base = -1;
      for (std::size_t i = 0; i < blocks.size(); ++i) {
        if (kinds[i] != -1) continue;
        if (prev_base >= 0)
          base_noise.push_back(100.0 * std::abs(double(blocks[i].cpu_ns) / double(prev_base) - 1));
        prev_base = blocks[i].cpu_ns;
      }
      for (std::size_t i = 0; i < blocks.size(); ++i) {
        if (kinds[i] < 0) continue;
        const config& c = seq[static_cast<std::size_t>(kinds[i])];
        const block& b = blocks[i];
        row& rw = rows[key_of(threads, c)];
        if (!b.ok) {
          rw.error = b.error;
          if (verbose)
            std::printf("# %d threads %-28s failed: %s\n", threads, c.label.c_str(), b.error.c_str());
          continue;
        }
        std::size_t before = i, after = i;
        while (kinds[before] != -1) --before;
        while (kinds[after] != -1) ++after;
        double base = (double(blocks[before].cpu_ns) + double(blocks[after].cpu_ns)) / 2;
        if (b.own_base_ns > 0) base = double(b.own_base_ns);
        double ov = 100.0 * (double(b.cpu_ns) / base - 1);
        rw.overhead.push_back(ov);
        // The workload threads alone: what the sampled program pays in its own threads (the kernel's
        // sample writes and any handler land there); selfprof's collector is left out as perf's
        // process is, and both are counted in the whole-process columns.
        double base_work = (double(blocks[before].worker_cpu_ns) + double(blocks[after].worker_cpu_ns)) / 2;
        if (b.own_base_worker_ns > 0) base_work = double(b.own_base_worker_ns);
        if (base_work > 0) rw.overhead_work.push_back(100.0 * (double(b.worker_cpu_ns) / base_work - 1));
        rw.overhead_total.push_back(100.0 * ((double(b.cpu_ns) + double(b.extra_cpu_ns)) / base - 1));
        rw.overhead_perf_run.push_back(100.0 * ((double(b.cpu_ns) + double(b.extra_total_ns)) / base - 1));
        double expected = c.hz * double(b.worker_cpu_ns) / 1e9;
        rw.delivered.push_back(expected > 0 ? b.records / expected : 0);
        rw.weighted.push_back(expected > 0 ? b.weighted / expected : 0);
        if (b.records > 0) rw.us_per_tick.push_back((double(b.cpu_ns) - base) / b.records / 1000.0);
        if (b.split_err >= 0) rw.split.push_back(b.split_err);
        if (b.split_err_work >= 0) rw.split_work.push_back(b.split_err_work);
        if (b.split_sigma >= 0) rw.sigma.push_back(b.split_sigma);
        if (c.k == kind::selfprof_run) {
          rw.collector.push_back(100.0 * double(b.collector_cpu_ns) / base);
          rw.collector_ms_per_s.push_back(double(b.collector_cpu_ns) / 1e6 / (double(b.wall_ns) / 1e9));
          rw.wakes_per_s.push_back(b.collector_wakes / (double(b.wall_ns) / 1e9));
          rw.control_ms.push_back(double(b.control_cpu_ns) / 1e6);
          rw.handler_pct.push_back(100.0 * b.records * handler_ns / base);
          rw.attributed.push_back(
              100.0 * (double(b.collector_cpu_ns + b.control_cpu_ns) + b.records * handler_ns) / base);
        }
        rw.detail = b.detail;
        if (verbose)
          std::printf(
              "# rep %d, %d threads, %-28s cpu %.3f s (base %.3f s) wall %.2f s overhead %+.3f%% records "
              "%.0f split %.2f (vs work %.2f)\n",
              rep, threads, c.label.c_str(), double(b.cpu_ns) / 1e9, base / 1e9, double(b.wall_ns) / 1e9, ov,
              b.records, b.split_err, b.split_err_work);
        std::fflush(stdout);
      }
      // Paired with the bare source of the same mechanism, rate and thread count, in this repeat.
      for (std::size_t i = 0; i < blocks.size(); ++i) {
        if (kinds[i] < 0) continue;
        const config& c = seq[static_cast<std::size_t>(kinds[i])];
        if (c.k != kind::selfprof_run || !blocks[i].ok) continue;
        std::string src = blocks[i].detail.substr(0, blocks[i].detail.find(':'));
        char bare[64];
        std::snprintf(bare, sizeof bare, "bare %s %gHz", src.c_str(), c.hz);
        row& rw = rows[key_of(threads, c)];
        rw.bare_key = bare;
        const row& br = rows[std::to_string(threads) + "|" + bare];
        if (!br.overhead.empty() && br.overhead.size() == rw.overhead.size())
          rw.vs_bare.push_back(rw.overhead.back() - br.overhead.back());
      }
    }
    std::printf("# %d threads: baseline-to-baseline difference median %.2f%%, max %.2f%% (the noise floor)\n",
                threads, median(base_noise),
                base_noise.empty() ? 0 : *std::max_element(base_noise.begin(), base_noise.end()));
  }

  print_tables(order, rows);
  std::printf("\n# source per configuration:\n");
  std::map<std::string, bool> shown;
  for (auto& tc : order) {
    const row& rw = rows[key_of(tc.first, tc.second)];
    // Per label and source: auto may take another source on 8 threads (the contention switch).
    if (!rw.detail.empty() && !shown[tc.second.label + rw.detail]) {
      shown[tc.second.label + rw.detail] = true;
      std::printf("#   %d thr %-27s %s\n", tc.first, tc.second.label.c_str(), rw.detail.c_str());
    }
  }
  if (!perf_note.empty()) std::printf("# %s\n", perf_note.c_str());
  rmdir(g_tmpdir.c_str());
  return 0;
}
