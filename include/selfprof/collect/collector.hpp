// The profiler core: one per process. Owns the sample ring, the tick source, the thread list and the
// stack table, and runs the collector thread that drains the ring, finds new threads and answers dumps.
// Context: setup only (start/stop), the collector thread, and any thread calling the public API.
#pragma once

#include <link.h>
#include <poll.h>
#include <pthread.h>
#include <sched.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdio>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "selfprof/collect/dumps.hpp"
#include "selfprof/collect/frame_tracker.hpp"
#include "selfprof/collect/stack_table.hpp"
#include "selfprof/collect/symbolize.hpp"
#include "selfprof/collect/threads.hpp"
#include "selfprof/collect/unwind_tables.hpp"
#include "selfprof/collect/windows.hpp"
#include "selfprof/detail/process.hpp"
#include "selfprof/jit.hpp"
#include "selfprof/options.hpp"
#include "selfprof/signal/handler.hpp"
#include "selfprof/sources/select.hpp"
#include "selfprof/sources/signal_setup.hpp"
#include "selfprof/wall/sampler.hpp"

namespace selfprof {

// Counters and choices of the running (or last) profiling session.
struct stats {
  bool running = false;
  std::string source;                // perf | timer | itimer
  std::string source_detail;         // what was opened
  std::string source_reason;         // why it was chosen
  std::vector<std::string> refused;  // why earlier sources were not
  std::vector<std::string> notes;    // other remarks (signals left alone, ...)
  double hz = 0, effective_hz = 0;
  int sample_signal = 0;
  bool kernel_time = true;    // samples include time spent in the kernel
  std::string unwind;         // "dwarf" (CFI rows, frame pointers where none) or "fp"
  std::uint64_t samples = 0;  // sample weight folded into the table
  std::uint64_t records = 0;  // records written by the handler
  std::uint64_t dropped_full = 0, dropped_inactive = 0, foreign_signals = 0, truncated = 0;
  std::size_t unique_stacks = 0, table_bytes = 0;
  std::size_t threads_seen = 0, threads_armed = 0, threads_fallback = 0, threads_arm_failed = 0;
  std::size_t threads_blocking_signal = 0;  // live threads blocking the sampling signal (never sampled)
  std::uint64_t collector_wakes = 0;        // times the collector thread woke (each costs ~60 us here)
  std::uint64_t thread_checks = 0;          // thread-count checks made by the handler
  std::uint64_t thread_wakes = 0;           // ... that saw the count change and woke the collector
  int dump_signal = 0;                      // signal that triggers a dump (0: none taken)
  unsigned long dumps_written = 0, dumps_failed = 0;  // signal and interval dumps
  std::unordered_map<std::uint32_t, std::uint64_t> samples_by_thread;
  std::string mode = "cpu";  // cpu | wall
  wall_stats wall;           // wall mode: what the wall sampler did
};

namespace detail {

// Drain + cheap thread-count check. A wake-up costs ~60 us of CPU in a VM, whatever wakes the thread
// (bench/README.md): at 20 ms that alone was 0.2-0.5% of a busy thread. So the collector's period depends
// on what else watches the thread count:
// - while ticks arrive, the handler checks the count every 20 ms (check_thread_count) and wakes us when
//   it changed, and when the ring is half full: we wake every kCollectorBusyWakeMs for the full scan
//   (a thread that exited while another started leaves the count unchanged), the symbol refresh and
//   the dump clock;
// - while no tick arrives (idle process, or only threads not armed yet are busy), nobody else looks:
//   every kCollectorWakeMs, so new threads are found within a few tens of ms.
// Wall mode and boosted frame threads keep the short period.
constexpr unsigned kCollectorWakeMs = 50;
constexpr unsigned kCollectorBusyWakeMs = 500;
constexpr unsigned kFullThreadScanMs = 500;  // full /proc/self/task scan even when the count is stable
// CPU timers are checked only at the scheduler tick. When threads share CPUs they are switched at ticks,
// every slice is a whole number of ticks, and each thread's samples fall on a tick lattice of its CPU
// time: a workload of strictly repeated work then aliases (bench/README.md: 6.2 points of error at 99 Hz
// on 8 threads / 2 CPUs, 1.8 with perf_event). So `auto`, having picked the CPU timer because it is the
// cheapest, watches the run delay of the sampled threads (/proc/self/task/<tid>/schedstat) and switches
// to a perf_event with kernel time (exact period, 45-70 us per tick here instead of a few) when they
// waited for a CPU at least kContentionShare of their run time in two checks in a row. The first check
// is at the first wake that sees ticks; while more threads receive samples than the process has CPUs,
// checks come every kContentionFastCheckMs, so an oversubscribed profile switches after ~0.3 s, not 1.5.
constexpr unsigned kContentionCheckMs = 500;
constexpr unsigned kContentionFastCheckMs = 100;
constexpr double kContentionShare = 0.25;
constexpr std::size_t kContentionThreads = 64;  // schedstat reads per check, the busiest threads
constexpr unsigned kSymbolRefreshMs = 200;      // module snapshot while samples arrive (dlclose'd libraries)

class profiler_core {
 public:
  static profiler_core& instance() {
    static profiler_core* core = new profiler_core();  // never destroyed: usable from atexit and signals
    return *core;
  }

  status start(const options& opts) {
    std::lock_guard<std::mutex> control(control_mu_);
    if (running_) return status::ok();
    install_atfork_once();
    if (opts.mode != "cpu" && opts.mode != "wall")
      return status::error("selfprof: unknown mode '" + opts.mode + "'");
    opts_ = opts;
    wall_mode_ = opts.mode == "wall";
    if (wall_mode_) opts_.thread_roots = true;  // per-thread roots: a pool's idle workers show as idle
    if (opts_.max_depth < 2) opts_.max_depth = 2;
    if (opts_.max_depth > 1024) opts_.max_depth = 1024;
    stats_ = stats{};
    stats_.hz = opts_.hz;
    stats_.mode = opts_.mode;
    {
      std::lock_guard<std::mutex> t(table_mu_);
      table_.clear();
      samples_by_thread_.clear();
      windows_.configure(static_cast<std::uint64_t>(opts_.window_s * 1e9));
      frames_.clear();  // [frames]
      frames_.configure(opts_.frame_budget_ms, monotonic_ns());
      boosted_.clear();
      boost_credit_.clear();
    }
    // Ring: about 0.2 s of samples for 16 busy threads, at least 512 slots.
    std::size_t want = opts_.ring_slots ? opts_.ring_slots : static_cast<std::size_t>(opts_.hz * 16 * 0.2);
    std::size_t cap = 512;
    while (cap < want && cap < (1u << 20)) cap <<= 1;
    // Kept across restarts when the size is the same: init() rewrites every slot's sequence number, and
    // a slot's other bytes are written before it is published (a new zeroed block would page-fault again).
    const std::size_t ring_words = cap * sample_ring::stride_for(opts_.max_depth) / 8;
    if (ring_memory_.size() != ring_words) std::vector<std::uint64_t>(ring_words, 0).swap(ring_memory_);
    ring_.init(ring_memory_.data(), cap, opts_.max_depth);
    g_handler.main_tid.store(static_cast<std::uint32_t>(::getpid()), std::memory_order_relaxed);
    g_handler.main_stack_end.store(main_stack_end(), std::memory_order_relaxed);
    g_handler.ring.store(&ring_, std::memory_order_release);
    base_taken_ = g_handler.taken.load();
    base_full_ = g_handler.dropped_full.load();
    base_inactive_ = g_handler.dropped_inactive.load();
    base_foreign_ = g_handler.foreign.load();
    base_truncated_ = g_handler.truncated.load();
    base_thread_checks_ = g_handler.thread_checks.load();
    base_thread_wakes_ = g_handler.thread_wakes.load();
    collector_wakes_.store(0, std::memory_order_relaxed);

    status st = install_sample_handler(opts_.sample_signal, signal_, stats_.notes);
    if (!st) return fail_start(st);
    source_config cfg;
    cfg.hz = opts_.hz;
    cfg.signal_number = signal_.number;
    source_choice choice =
        wall_mode_ ? choose_wall_source(opts_.source, cfg) : choose_source(opts_.source, cfg);
    stats_.refused = choice.refused;
    const bool forced = opts_.source != source_kind::automatic;
    if (!choice.source && (!wall_mode_ || forced)) {
      std::string why = wall_mode_ ? "selfprof: wall mode cannot use the requested source"
                                   : "selfprof: no tick source works here";
      for (auto& r : choice.refused) why += "; " + r;
      return fail_start(status::error(why));
    }
    source_config_ = cfg;
    stats_.sample_signal = signal_.number;
    if (choice.source) {
      source_ = std::move(choice.source);
      stats_.source = source_name(source_->kind());
      stats_.source_detail = source_->describe();
      stats_.source_reason = choice.reason;
      stats_.effective_hz = source_->effective_hz();
      stats_.kernel_time = source_->counts_kernel_time();
    } else {  // wall mode without signals: the sampler counts CPU time from the CPU clocks
      stats_.source = "wall";
      stats_.source_detail = "wall sampler only (no on-CPU stacks)";
      stats_.source_reason = "no user-only perf_event: CPU time is counted as [running], without stacks";
      stats_.effective_hz = opts_.hz;
      stats_.kernel_time = true;
    }
    may_upgrade_ = !wall_mode_ && !forced && source_ && source_->kind() == source_kind::timer;
    contention_hits_ = 0;
    contention_fast_ = false;
    cpus_ = usable_cpus();
    schedstat_prev_.clear();
    contention_samples_.clear();
    if (wall_mode_) {
      stats_.kernel_time = true;  // a wall profile counts every microsecond, on or off the CPU
      if (source_)
        stats_.notes.push_back(
            "wall mode: on-CPU stacks from user-only ticks; CPU time spent in the kernel is not in them");
    }

    stats_.unwind = "fp";
    if (opts_.unwind != "fp") {
      status u = build_unwind_tables();
      if (u) {
        stats_.unwind = "dwarf";
      } else {
        if (opts_.unwind == "dwarf") return fail_start(u);
        stats_.notes.push_back(u.message() + "; unwinding with frame pointers only");
      }
    }
    unwind_dwarf_ = stats_.unwind == "dwarf";
    start_unix_ns_ = static_cast<std::uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(
                                                    std::chrono::system_clock::now().time_since_epoch())
                                                    .count());
    start_steady_ = std::chrono::steady_clock::now();
    g_handler.active.store(true, std::memory_order_release);
    {
      std::lock_guard<std::mutex> t(threads_mu_);
      threads_.clear();
      scan_threads_locked();
    }
    wake_fd_ = ::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    g_handler.wake_fd.store(wake_fd_, std::memory_order_release);
    task_dir_fd_ = ::open("/proc/self/task", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    g_handler.task_links.store(0, std::memory_order_relaxed);  // the collector's first scan sets it
    g_handler.task_dir_fd.store(task_dir_fd_, std::memory_order_release);
    dump_scheduler::hooks hooks;
    hooks.take = [this](bool windowed, std::uint64_t& seq) { return snapshot_raw(windowed, &seq); };
    hooks.symbolize = [this](const raw_snapshot& raw) { return symbolize(raw); };
    hooks.take_slow = [this](bool& marked) { return slow_frames_raw(&marked); };
    hooks.window_written = [this](std::uint64_t seq) {
      std::lock_guard<std::mutex> t(table_mu_);
      windows_.mark_dumped(seq);
    };
    dumps_.start(opts_, hooks, stats_.notes);
    dumps_.set_wake_fd(wake_fd_);
    stats_.dump_signal = dumps_.signal_number();
    if (!opts_.out.empty()) install_atexit_once();
    stop_collector_.store(false);
    collector_ = new std::thread([this] { collector_loop(); });
    if (wall_mode_) {
      wall_config wc;
      wc.hz = opts_.hz;
      wc.oncpu_signals = source_ != nullptr;
      wc.ring = &ring_;
      wc.list_threads = [this](std::uint64_t& generation, std::vector<pid_t>& out) {
        std::lock_guard<std::mutex> t(threads_mu_);
        if (generation == threads_generation_) return false;
        generation = threads_generation_;
        for (auto& th : threads_) out.push_back(th.first);
        return true;
      };
      wc.wake_collector = [this] { wake(); };
      status ws = wall_sampler_.start(wc);
      if (!ws) {
        running_ = true;  // stop_locked() undoes everything started so far
        stop_locked();
        return ws;
      }
    }
    running_ = true;
    if (opts_.verbose) std::fprintf(stderr, "%s", describe_locked().c_str());
    return status::ok();
  }

  status stop() {
    std::lock_guard<std::mutex> control(control_mu_);
    return stop_locked();
  }

  bool running() const { return running_; }
  bool thread_roots() const { return opts_.thread_roots; }

 private:
  status stop_locked() {
    if (!running_) return status::ok();
    wall_sampler_.stop();  // first: it reads the thread list, the ring and the unwind tables
    stop_collector_.store(true);
    wake();
    collector_->join();
    delete collector_;
    collector_ = nullptr;
    dumps_.stop();  // writes what is queued, gives the dump signal back
    {
      std::lock_guard<std::mutex> t(threads_mu_);
      if (source_) source_->close();
      if (fallback_) fallback_->close();
      stats_.threads_armed = 0;
    }
    g_handler.active.store(false, std::memory_order_release);
    restore_sample_handler(signal_);  // waits until no handler runs: the tables can go
    release_unwind_tables();
    {
      std::lock_guard<std::mutex> t(table_mu_);
      drain_locked();
      g_handler.ring.store(nullptr, std::memory_order_release);
      stop_steady_ = std::chrono::steady_clock::now();
    }
    source_.reset();
    fallback_.reset();
    close_wake_fds();
    running_ = false;
    return status::ok();
  }

 public:
  // Arms the calling thread now (instead of at the next scan) and unblocks the sampling signal in it.
  status register_current_thread() {
    std::lock_guard<std::mutex> t(threads_mu_);
    if (!running_) return status::error("selfprof: register_thread() called while not profiling");
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, signal_.number);
    pthread_sigmask(SIG_UNBLOCK, &set, nullptr);
    pid_t tid = static_cast<pid_t>(raw_gettid());
    if (!threads_.count(tid)) {
      thread_rec rec;
      rec.name = thread_name(tid);
      if (source_) arm_locked(tid, rec);  // wall mode without signals: only the sampler looks at it
      threads_.emplace(tid, rec);
      names_[static_cast<std::uint32_t>(tid)] = rec.name;
      ++stats_.threads_seen;
      ++threads_generation_;
    }
    return status::ok();
  }

  // A copy of everything collected so far (drains the ring first); the profile stays in place.
  // `windowed`: only the samples of the last window not yet written by a windowed dump.
  raw_snapshot snapshot_raw(bool windowed = false, std::uint64_t* window_seq = nullptr) {
    raw_snapshot s;
    {
      std::lock_guard<std::mutex> t(table_mu_);
      drain_locked();
      if (windowed && windows_.enabled()) {
        std::uint64_t seq = windows_.take(monotonic_ns(), s.table);
        if (window_seq) *window_seq = seq;
      } else {
        s.table = table_;
      }
    }
    {
      std::lock_guard<std::mutex> t(threads_mu_);
      refresh_names_locked();
      for (auto& n : names_) s.thread_names.emplace(n.first, n.second);
    }
    stats st = get_stats();
    s.info.mode = opts_.mode;
    s.info.unit = wall_mode_ ? "us" : "samples";
    s.info.source = st.source;
    s.info.hz = opts_.hz;
    s.info.period_ns = static_cast<std::uint64_t>(period_ns_for(opts_.hz));
    s.info.dropped = st.dropped_full;
    s.info.start_unix_ns = start_unix_ns_;
    auto end = running_ ? std::chrono::steady_clock::now() : stop_steady_;
    s.info.duration_s = std::chrono::duration<double>(end - start_steady_).count();
    {
      std::lock_guard<std::mutex> t(table_mu_);  // [frames]
      s.info.frame_loops = frames_.stats();
      if (frames_.held_dropped())
        s.info.notes.push_back(std::to_string(frames_.held_dropped()) +
                               " samples of open frames dropped (held-sample memory bound)");
    }
    if (!st.kernel_time)
      s.info.notes.push_back("time spent in the kernel is not sampled (user-only perf_event)");
    for (auto& n : st.notes)
      if (n.rfind("wall mode", 0) == 0) s.info.notes.push_back(n);
    if (wall_mode_ && !source_)
      s.info.notes.push_back("wall mode without on-CPU stacks: " + st.source_reason);
    for (auto& r : st.refused) s.info.notes.push_back("refused " + r);
    return s;
  }

  profile snapshot() { return symbolize(snapshot_raw()); }

  // [frames] The samples of frames over budget, with the frame statistics; empty when no frame was marked.
  raw_snapshot slow_frames_raw(bool* marked = nullptr) {
    raw_snapshot s = snapshot_raw();  // drains, fills info and names
    std::lock_guard<std::mutex> t(table_mu_);
    s.table = frames_.slow_table();
    s.info.view = "slow frames";
    if (boost_hz() > 0) {
      s.info.hz = boost_hz();
      s.info.period_ns = static_cast<std::uint64_t>(period_ns_for(boost_hz()));
    }
    if (marked) *marked = frames_.any_marked();
    return s;
  }

  // [frames] Up to `n` of the longest frames seen, longest first, each with its samples in time order.
  std::vector<kept_frame> worst_frames(std::size_t n) {
    std::lock_guard<std::mutex> t(table_mu_);
    drain_locked();
    std::vector<kept_frame> out = frames_.worst();
    if (out.size() > n) out.resize(n);
    return out;
  }
  double frame_sample_hz() const { return boost_hz() > 0 ? boost_hz() : opts_.hz; }

  profile symbolize(const raw_snapshot& raw) {
    std::lock_guard<std::mutex> s(sym_mu_);
    symbolizer_.refresh();
    return build_profile(raw, symbolizer_);
  }

  // Waits until the signal and interval dumps queued so far are written.
  void flush_dumps() { dumps_.flush(); }

  stats get_stats() {
    stats s;
    {
      std::lock_guard<std::mutex> t(threads_mu_);
      s = stats_;
      s.running = running_;
      if (running_) {
        s.threads_blocking_signal = 0;
        for (auto& t : threads_)
          if (thread_blocks_signal(t.first, signal_.number)) ++s.threads_blocking_signal;
      }
    }
    s.records = g_handler.taken.load() - base_taken_;
    s.dropped_full = g_handler.dropped_full.load() - base_full_;
    s.dropped_inactive = g_handler.dropped_inactive.load() - base_inactive_;
    s.foreign_signals = g_handler.foreign.load() - base_foreign_;
    s.truncated = g_handler.truncated.load() - base_truncated_;
    s.thread_checks = g_handler.thread_checks.load() - base_thread_checks_;
    s.thread_wakes = g_handler.thread_wakes.load() - base_thread_wakes_;
    s.collector_wakes = collector_wakes_.load(std::memory_order_relaxed);
    std::lock_guard<std::mutex> t(table_mu_);
    s.samples = table_.total();
    s.unique_stacks = table_.unique();
    s.table_bytes = table_.memory_bytes();
    s.samples_by_thread = samples_by_thread_;
    if (wall_mode_) s.wall = wall_sampler_.counters();
    s.dumps_written = dumps_.written();
    s.dumps_failed = dumps_.failed();
    return s;
  }

  std::string describe() {
    std::lock_guard<std::mutex> control(control_mu_);
    return describe_locked();
  }

 private:
  struct thread_rec {
    std::string name;
    int armed_by = 0;     // 0 none, 1 primary source, 2 fallback timer
    int name_checks = 0;  // threads usually name themselves right after they start: look again twice
  };

  profiler_core() = default;

  status fail_start(status st) {
    g_handler.active.store(false, std::memory_order_release);
    restore_sample_handler(signal_);
    release_unwind_tables();
    g_handler.ring.store(nullptr, std::memory_order_release);
    source_.reset();
    return st;
  }

  std::string describe_locked() {
    char buf[256];
    std::string s;
    std::snprintf(buf, sizeof buf, "selfprof: sampling at %g Hz (effective %g Hz) with %s on signal %d\n",
                  opts_.hz, stats_.effective_hz, stats_.source_detail.c_str(), signal_.number);
    s += buf;
    s += "selfprof: source " + stats_.source + ": " + stats_.source_reason + "\n";
    for (auto& r : stats_.refused) s += "selfprof: refused " + r + "\n";
    for (auto& n : stats_.notes) s += "selfprof: " + n + "\n";
    std::string out = opts_.out.empty() ? std::string(kDefaultDumpTemplate) + " (default)" : opts_.out;
    if (dumps_.signal_number() != 0)
      s += "selfprof: kill -" + std::to_string(dumps_.signal_number()) + " " + std::to_string(::getpid()) +
           " writes " + out + "\n";
    if (opts_.interval_s > 0)
      s += "selfprof: every " + std::to_string(opts_.interval_s) + " s writes " + out + "\n";
    if (opts_.window_s > 0)
      s += "selfprof: each dump holds the last " + std::to_string(opts_.window_s) + " s\n";
    if (!opts_.out.empty()) s += "selfprof: at exit writes " + opts_.out + "\n";
    return s;
  }

  // The eventfd and the /proc/self/task fd the handler uses (after the last handler returned, or in a
  // forked child where no handler of ours runs).
  void close_wake_fds() {
    g_handler.next_thread_check.store(0, std::memory_order_relaxed);
    g_handler.wake_fd.store(-1, std::memory_order_release);
    g_handler.task_dir_fd.store(-1, std::memory_order_release);
    if (wake_fd_ >= 0) ::close(wake_fd_);
    if (task_dir_fd_ >= 0) ::close(task_dir_fd_);
    wake_fd_ = -1;
    task_dir_fd_ = -1;
  }

  // The thread count from the link count of /proc/self/task (2 + threads), -1 when unknown.
  long task_links() const {
    struct stat st {};
    if (task_dir_fd_ < 0 || ::fstat(task_dir_fd_, &st) != 0) return -1;
    return static_cast<long>(st.st_nlink);
  }

  // How long the collector sleeps (see kCollectorWakeMs): short while no tick arrives, long while the
  // handler watches the thread count, never past the next interval dump.
  int wait_ms(bool ticks_arrive) {
    unsigned ms = kCollectorWakeMs;
    if (ticks_arrive && !wall_mode_ && boost_hz() <= 0 && task_dir_fd_ >= 0) ms = kCollectorBusyWakeMs;
    if (may_upgrade_ && contention_fast_ && ms > kContentionFastCheckMs) ms = kContentionFastCheckMs;
    const auto until = dumps_.until_due(std::chrono::steady_clock::now());
    if (until < std::chrono::milliseconds(ms))
      ms = static_cast<unsigned>(std::chrono::duration_cast<std::chrono::milliseconds>(until).count()) + 1;
    return static_cast<int>(ms);
  }

  void wake() {
    if (wake_fd_ >= 0) {
      std::uint64_t one = 1;
      ssize_t r = ::write(wake_fd_, &one, sizeof one);
      (void)r;
    }
  }

  void collector_loop() {
    pthread_setname_np(pthread_self(), "selfprof");
    collector_tid_.store(static_cast<pid_t>(raw_gettid()));  // our own collector thread is not profiled
    auto last_full_scan = std::chrono::steady_clock::now();
    auto last_sym = last_full_scan;
    auto last_contention_check = last_full_scan - std::chrono::milliseconds(kContentionCheckMs);
    long last_count = -1;  // scan at once: threads may have started since start() looked
    std::uint64_t last_generation = loader_generation();
    std::uint64_t last_total = 0;
    std::uint64_t last_taken = g_handler.taken.load(std::memory_order_relaxed);
    bool ticks_arrive = false;
    while (!stop_collector_.load()) {
      struct pollfd p {};
      p.fd = wake_fd_;
      p.events = POLLIN;
      int r = ::poll(&p, 1, wait_ms(ticks_arrive));
      if (r > 0) {
        std::uint64_t v;
        ssize_t n = ::read(wake_fd_, &v, sizeof v);
        (void)n;
      }
      if (stop_collector_.load()) break;
      collector_wakes_.fetch_add(1, std::memory_order_relaxed);
      std::uint64_t total;
      {
        std::lock_guard<std::mutex> t(table_mu_);
        drain_locked();
        total = table_.total();
      }
      auto now = std::chrono::steady_clock::now();
      dumps_.poll(now);
      const std::uint64_t taken = g_handler.taken.load(std::memory_order_relaxed);
      ticks_arrive = taken != last_taken;
      last_taken = taken;
      long count = task_links();  // read before the scan: a thread born after it changes the count
      bool full = now - last_full_scan >= std::chrono::milliseconds(kFullThreadScanMs);
      boost_marked_threads();  // [frames]
      if (count != last_count || full || count < 0) {
        std::lock_guard<std::mutex> t(threads_mu_);
        scan_threads_locked();
        last_count = count;
        last_full_scan = now;
      }
      if (may_upgrade_ && ticks_arrive &&
          now - last_contention_check >=
              std::chrono::milliseconds(contention_fast_ ? kContentionFastCheckMs : kContentionCheckMs)) {
        check_contention(now - last_contention_check);
        last_contention_check = now;
      }
      if (count >= 0) {  // the handler compares with this; its next check is at most 20 ms away
        g_handler.task_links.store(static_cast<std::uint64_t>(count), std::memory_order_relaxed);
        std::uint64_t zero = 0;
        g_handler.next_thread_check.compare_exchange_strong(zero, monotonic_ns() + kThreadCheckNs,
                                                            std::memory_order_relaxed);
      }
      if (unwind_dwarf_) {
        std::lock_guard<std::mutex> s(sym_mu_);  // atfork_prepare takes it: no fork mid-build
        build_unwind_tables();                   // 28 ns when no module came or went
      }
      // A library loaded while profiling is parsed while it is still mapped, so its samples keep their
      // names after a dlclose. Nothing to do (and no parsing cost) while no library comes or goes.
      std::uint64_t generation = loader_generation();
      if (generation != last_generation && total != last_total &&
          now - last_sym >= std::chrono::milliseconds(kSymbolRefreshMs)) {
        std::lock_guard<std::mutex> s(sym_mu_);
        symbolizer_.refresh();
        last_sym = now;
        last_total = total;
        last_generation = generation;
      }
    }
  }

  void drain_locked() {
    const std::uint64_t now = windows_.enabled() ? monotonic_ns() : 0;
    frames_.collect_closed();  // [frames] before the ring: the samples of these frames are in it
    while (ring_slot* s = ring_.peek()) {
      const sample_header& h = s->header;
      std::uint16_t flags = static_cast<std::uint16_t>(h.flags & kSampleKeptFlags);
      std::size_t depth = h.depth <= ring_.max_depth() ? h.depth : ring_.max_depth();
      const bool wall_record = (flags & (sample_offcpu | sample_running)) != 0;
      if (depth > 0 || wall_record) {
        // JIT code is named by what was at each address when the sample was taken (the slot is ours
        // until release, so the pcs are rewritten in place).
        std::uint64_t* pcs = s->pcs();
        for (std::size_t i = 0; i < depth; ++i) jit::detail::translate_pc(pcs[i], h.time_ns);
        frames_.add_sample(h, s->pcs(), depth, flags);  // [frames]
        std::uint64_t w = all_frames_weight(h.tid, h.weight);
        // Wall mode counts microseconds: the sampler's records already are; a tick stands for one period.
        if (wall_mode_ && !wall_record)
          w = (w * static_cast<std::uint64_t>(period_ns_for(opts_.hz)) + 500) / 1000;
        if (w > 0) {
          table_.add(h.tid, flags, s->pcs(), depth, w);
          windows_.add(h.tid, flags, s->pcs(), depth, w, now);
          samples_by_thread_[h.tid] += w;
        }
      }
      ring_.release(s);
    }
    frames_.process_closed();  // [frames]
  }

  // [frames] SELFPROF_FRAME_HZ: the rate of marked threads, or 0 when they run at the common rate.
  double boost_hz() const { return opts_.frame_hz > opts_.hz ? opts_.frame_hz : 0; }

  // [frames] A boosted thread's samples enter the all-frames table at the common rate (hz / frame_hz of
  // their weight, carried over as a fraction), so that table stays proportional to CPU time.
  std::uint64_t all_frames_weight(std::uint32_t tid, std::uint32_t weight) {
    auto b = boosted_.find(tid);
    if (boost_hz() <= 0 || b == boosted_.end() || !b->second) return weight;
    double& credit = boost_credit_[tid];
    credit += static_cast<double>(weight) * opts_.hz / boost_hz();
    auto whole = static_cast<std::uint64_t>(credit);
    credit -= static_cast<double>(whole);
    return whole;
  }

  // [frames] Arms threads that started marking frames at SELFPROF_FRAME_HZ.
  void boost_marked_threads() {
    if (boost_hz() <= 0) return;
    std::vector<std::uint32_t> tids;
    {
      std::lock_guard<std::mutex> t(table_mu_);
      for (std::uint32_t tid : frames_.live_tids())
        if (!boosted_.count(tid)) tids.push_back(tid);
    }
    if (tids.empty()) return;
    std::vector<std::pair<std::uint32_t, bool>> done;
    {
      std::lock_guard<std::mutex> t(threads_mu_);
      for (std::uint32_t tid : tids) {
        auto rec = threads_.find(static_cast<pid_t>(tid));
        if (rec == threads_.end() || rec->second.armed_by == 0) continue;  // armed at the next scan
        tick_source* src = rec->second.armed_by == 1 ? source_.get() : fallback_.get();
        status st =
            src ? src->set_thread_rate(static_cast<pid_t>(tid), boost_hz()) : status::error("no source");
        if (!st)
          stats_.notes.push_back("SELFPROF_FRAME_HZ not applied to thread " + std::to_string(tid) + ": " +
                                 st.message());
        done.emplace_back(tid, static_cast<bool>(st));  // tried once either way
      }
    }
    std::lock_guard<std::mutex> t(table_mu_);
    for (auto& d : done) boosted_[d.first] = d.second;
  }

  // See kContentionCheckMs. Collector thread only.
  void check_contention(std::chrono::steady_clock::duration since_last) {
    std::vector<std::pair<std::uint64_t, std::uint32_t>> busy;  // samples since the last check, tid
    {
      std::lock_guard<std::mutex> t(table_mu_);
      for (auto& kv : samples_by_thread_) {
        std::uint64_t& before = contention_samples_[kv.first];
        if (kv.second > before) busy.emplace_back(kv.second - before, kv.first);
        before = kv.second;
      }
    }
    contention_fast_ = busy.size() > static_cast<std::size_t>(cpus_);
    if (busy.size() > kContentionThreads) {
      std::partial_sort(busy.begin(), busy.begin() + kContentionThreads, busy.end(),
                        [](const auto& a, const auto& b) { return a.first > b.first; });
      busy.resize(kContentionThreads);
    }
    std::uint64_t run = 0, delay = 0;
    for (auto& b : busy) {
      std::uint64_t r = 0, d = 0;
      if (!read_schedstat(static_cast<pid_t>(b.second), r, d)) continue;
      auto prev = schedstat_prev_.find(b.second);
      if (prev != schedstat_prev_.end() && r >= prev->second.first && d >= prev->second.second) {
        run += r - prev->second.first;
        delay += d - prev->second.second;
      }
      schedstat_prev_[b.second] = {r, d};
    }
    // Enough CPU time to judge (a tenth of the time since the last check), and a quarter of it again
    // spent waiting for a CPU.
    const auto since_ns = std::chrono::duration_cast<std::chrono::nanoseconds>(since_last).count();
    const bool contended = since_ns > 0 && run >= static_cast<std::uint64_t>(since_ns) / 10 &&
                           static_cast<double>(delay) >= kContentionShare * static_cast<double>(run);
    contention_hits_ = contended ? contention_hits_ + 1 : 0;
    if (contention_hits_ < 2) return;
    may_upgrade_ = false;
    std::lock_guard<std::mutex> t(threads_mu_);
    switch_to_perf_locked(static_cast<double>(delay) / static_cast<double>(run));
  }

  // CPUs the process may run on (its affinity mask), at least 1.
  static int usable_cpus() {
    cpu_set_t set;
    CPU_ZERO(&set);
    if (sched_getaffinity(0, sizeof set, &set) == 0 && CPU_COUNT(&set) > 0) return CPU_COUNT(&set);
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n > 0 ? static_cast<int>(n) : 1;
  }

  static bool read_schedstat(pid_t tid, std::uint64_t& run_ns, std::uint64_t& delay_ns) {
    std::string text = read_small_file("/proc/self/task/" + std::to_string(tid) + "/schedstat");
    unsigned long long r = 0, d = 0;
    if (std::sscanf(text.c_str(), "%llu %llu", &r, &d) != 2) return false;
    run_ns = r;
    delay_ns = d;
    return true;
  }

  // Moves every thread the CPU timer armed to a perf_event with kernel time; the timer stays as the
  // fallback of threads the event cannot arm. Nothing changes when no such event opens.
  void switch_to_perf_locked(double delay_share) {
    char why[160];
    std::snprintf(why, sizeof why, "sampled threads waited for a CPU %.0f%% of their run time",
                  100 * delay_share);
    std::unique_ptr<tick_source> perf(new perf_event_source());
    source_config cfg = source_config_;
    cfg.allow_user_only = false;  // only an event that counts kernel time, as the timer did
    status st = perf->open(cfg);
    if (!st) {
      stats_.notes.push_back(std::string(why) + ": CPU timers may alias with the tick; no perf_event with " +
                             "kernel time to switch to (" + st.message() + ")");
      return;
    }
    std::unique_ptr<tick_source> timer = std::move(source_);
    source_ = std::move(perf);
    std::size_t moved = 0, kept = 0;
    for (auto& th : threads_) {
      if (th.second.armed_by != 1) continue;
      timer->disarm(th.first);
      if (source_->arm(th.first)) {
        ++moved;
        continue;
      }
      if (timer->arm(th.first)) {  // out of descriptors, say: this thread keeps its timer
        th.second.armed_by = 2;
        ++kept;
      } else {
        th.second.armed_by = 0;
        if (stats_.threads_armed > 0) --stats_.threads_armed;
      }
    }
    fallback_ = std::move(timer);
    stats_.threads_fallback += kept;
    {
      std::lock_guard<std::mutex> t(table_mu_);  // [frames] boosted threads are boosted again on perf
      boosted_.clear();
    }
    stats_.source = source_name(source_->kind());
    stats_.source_detail = source_->describe();
    stats_.source_reason =
        std::string("switched from the CPU timer: ") + why +
        ", so CPU timers would sample on the tick lattice (aliasing); perf_event has an exact "
        "period";
    stats_.effective_hz = source_->effective_hz();
    stats_.kernel_time = source_->counts_kernel_time();
    stats_.notes.push_back("switched to " + stats_.source_detail + " (" + why + "); " +
                           std::to_string(moved) + " threads moved" +
                           (kept ? ", " + std::to_string(kept) + " kept their timer" : ""));
  }

  void arm_locked(pid_t tid, thread_rec& rec) {
    status st = source_->arm(tid);
    if (st) {
      rec.armed_by = 1;
      ++stats_.threads_armed;
      return;
    }
    // One fd per thread can run out (EMFILE/ENFILE/ENOMEM): fall back to a CPU timer for that thread.
    auto* perf = dynamic_cast<perf_event_source*>(source_.get());
    if (perf) {
      int e = perf->last_errno();
      if (e == EMFILE || e == ENFILE || e == ENOMEM) {
        if (!fallback_) {
          fallback_.reset(new cpu_timer_source());
          if (!fallback_->open(source_config_))
            fallback_.reset();
          else
            stats_.notes.push_back(
                "ran out of file descriptors for perf_event: CPU timers for the remaining threads");
        }
        if (fallback_ && fallback_->arm(tid)) {
          rec.armed_by = 2;
          ++stats_.threads_armed;
          ++stats_.threads_fallback;
          return;
        }
      }
    }
    ++stats_.threads_arm_failed;  // typically the thread exited between the scan and the arm (ESRCH)
  }

  void scan_threads_locked() {
    if (!source_ && !wall_mode_) return;
    std::vector<pid_t> live = list_threads();
    pid_t collector_tid = collector_tid_.load();
    std::unordered_map<pid_t, bool> seen;
    for (pid_t tid : live) {
      seen[tid] = true;
      auto known = threads_.find(tid);
      if (known != threads_.end()) {
        if (known->second.name_checks < 2) {
          ++known->second.name_checks;
          std::string n = thread_name(tid);
          if (!n.empty()) known->second.name = names_[static_cast<std::uint32_t>(tid)] = n;
        }
        continue;
      }
      if (tid == collector_tid || tid == dumps_.worker_tid() || tid == wall_sampler_.tid())
        continue;  // selfprof's own threads
      thread_rec rec;
      rec.name = thread_name(tid);
      if (source_ && source_->per_thread()) arm_locked(tid, rec);
      names_[static_cast<std::uint32_t>(tid)] = rec.name;
      threads_.emplace(tid, rec);
      ++stats_.threads_seen;
      ++threads_generation_;
    }
    for (auto it = threads_.begin(); it != threads_.end();) {
      if (seen.count(it->first)) {
        ++it;
        continue;
      }
      if (it->second.armed_by == 1) source_->disarm(it->first);
      if (it->second.armed_by == 2 && fallback_) fallback_->disarm(it->first);
      if (it->second.armed_by != 0 && stats_.threads_armed > 0) --stats_.threads_armed;
      it = threads_.erase(it);
      ++threads_generation_;
    }
  }

  void refresh_names_locked() {
    for (auto& t : threads_) {
      std::string n = thread_name(t.first);
      if (!n.empty()) {
        t.second.name = n;
        names_[static_cast<std::uint32_t>(t.first)] = n;
      }
    }
  }

  // fork(2): the child gets one thread and copies of our locks and kernel objects. Take every lock
  // before the fork so no copy is held by a thread that does not exist in the child; in the child,
  // forget the collector thread and the sources without touching the parent's, and stop cleanly.
  void install_atfork_once() {
    static bool done = false;
    if (done) return;
    done = true;
    pthread_atfork([] { instance().atfork_prepare(); }, [] { instance().atfork_parent(); },
                   [] { instance().atfork_child(); });
  }
  // SELFPROF_OUT set: a normal exit writes the profile (stop first, so every sample is in it).
  void install_atexit_once() {
    static bool done = false;
    if (done) return;
    done = true;
    std::atexit([] { instance().exit_dump(); });
  }
  void exit_dump() {
    if (!running_ || opts_.out.empty()) return;
    std::string out = opts_.out;
    bool roots = opts_.thread_roots;
    sink_options so;
    so.allow_shared_dir = opts_.allow_shared_dir;
    stop();
    profile p = snapshot();
    add_marker_frames(p, roots);
    status st = write_profile(p, out, dump_output_options(p), so);
    if (!st) std::fprintf(stderr, "%s\n", st.message().c_str());
    st = write_offcpu_companion(p, out, so);
    if (!st) std::fprintf(stderr, "%s\n", st.message().c_str());
    bool marked = false;  // [frames] the slow-frame profile next to it, "-slow" before the extension
    raw_snapshot slow = slow_frames_raw(&marked);
    if (!marked) return;
    profile sp = symbolize(slow);
    add_marker_frames(sp, roots);
    output_options oo = dump_output_options(sp);
    oo.svg.title = "Slow frames (over " + format_compact(opts_.frame_budget_ms) + " ms): " + oo.svg.title;
    st = write_profile(sp, insert_before_extension(out, "-slow"), oo, so);
    if (!st) std::fprintf(stderr, "%s\n", st.message().c_str());
  }

  void atfork_prepare() {
    control_mu_.lock();
    threads_mu_.lock();
    table_mu_.lock();
    sym_mu_.lock();
  }
  void atfork_parent() {
    sym_mu_.unlock();
    table_mu_.unlock();
    threads_mu_.unlock();
    control_mu_.unlock();
  }
  void atfork_child() {
    wall_sampler_.abandon_after_fork();
    // Another thread of the parent may have been inside the handler at the fork: its in-flight count
    // was copied, but that thread does not exist here, and stop() would wait for it forever.
    g_handler.in_flight.store(0, std::memory_order_release);
    if (running_) {
      g_handler.active.store(false, std::memory_order_release);
      if (source_) source_->abandon_after_fork();
      if (fallback_) fallback_->abandon_after_fork();
      dumps_.abandon_after_fork();
      source_.release();  // leaked on purpose: its destructor would touch the parent's kernel objects
      fallback_.release();
      if (signal_.number != 0) sys().sigaction(signal_.number, &signal_.previous, nullptr);
      signal_.number = 0;
      collector_ = nullptr;  // that thread does not exist here; its std::thread is leaked on purpose
      close_wake_fds();
      g_handler.ring.store(nullptr, std::memory_order_release);
      running_ = false;
    }
    threads_.clear();
    names_.clear();
    table_.clear();
    samples_by_thread_.clear();
    frames_.clear();
    boosted_.clear();
    boost_credit_.clear();
    stats_ = stats{};
    collector_tid_.store(0);
    atfork_parent();
  }

  std::mutex control_mu_;  // start/stop; taken first
  std::mutex threads_mu_;  // sources_, threads_, names_, stats_
  std::mutex table_mu_;    // ring consumer side, table_, samples_by_thread_
  std::mutex sym_mu_;      // symbolizer_
  bool running_ = false;
  bool unwind_dwarf_ = false;
  bool wall_mode_ = false;
  wall_sampler wall_sampler_;
  options opts_;
  stats stats_;
  installed_signal signal_;
  source_config source_config_;
  std::unique_ptr<tick_source> source_, fallback_;
  std::unordered_map<pid_t, thread_rec> threads_;
  std::uint64_t threads_generation_ = 0;  // changes whenever threads_ does (the wall sampler's list)
  std::unordered_map<std::uint32_t, std::string> names_;  // every thread seen, even exited ones
  std::vector<std::uint64_t> ring_memory_;
  sample_ring ring_;
  stack_table table_;
  window_tables windows_;
  frame_tracker frames_;                             // [frames] guarded by table_mu_
  std::unordered_map<std::uint32_t, bool> boosted_;  // [frames] tried at frame_hz -> applied (table_mu_)
  std::unordered_map<std::uint32_t, double> boost_credit_;  // [frames] (table_mu_)
  dump_scheduler dumps_;
  std::unordered_map<std::uint32_t, std::uint64_t> samples_by_thread_;
  symbolizer symbolizer_;
  std::thread* collector_ = nullptr;
  std::atomic<bool> stop_collector_{false};
  std::atomic<pid_t> collector_tid_{0};
  int wake_fd_ = -1;
  int task_dir_fd_ = -1;  // /proc/self/task (handler_globals::task_dir_fd)
  std::uint64_t base_taken_ = 0, base_full_ = 0, base_inactive_ = 0, base_foreign_ = 0, base_truncated_ = 0;
  std::uint64_t base_thread_checks_ = 0, base_thread_wakes_ = 0;
  // auto chose the CPU timer: may switch to perf_event when threads wait for CPUs (kContentionCheckMs).
  bool may_upgrade_ = false;
  int contention_hits_ = 0;
  bool contention_fast_ = false;  // more threads got samples at the last check than there are CPUs
  int cpus_ = 1;                  // CPUs this process may run on, at start()
  std::unordered_map<std::uint32_t, std::pair<std::uint64_t, std::uint64_t>> schedstat_prev_;  // run, delay
  std::unordered_map<std::uint32_t, std::uint64_t> contention_samples_;
  std::atomic<std::uint64_t> collector_wakes_{0};
  std::uint64_t start_unix_ns_ = 0;
  std::chrono::steady_clock::time_point start_steady_{}, stop_steady_{};
};

}  // namespace detail
}  // namespace selfprof
