// The profiler: one per process. Owns the parts of the pipeline (the sample ring, the thread registry and
// its tick sources, the sample store, the collector, the automatic dumps, the wall sampler), starts them
// in order and stops them in reverse, and answers the public API (profiler.hpp).
// Context: setup only (start/stop, under the control lock), any thread for snapshots, dumps and stats.
#pragma once

#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <new>
#include <string>
#include <vector>

#include "selfprof/collect/collector.hpp"
#include "selfprof/collect/handler_counters.hpp"
#include "selfprof/collect/sample_store.hpp"
#include "selfprof/collect/session_info.hpp"
#include "selfprof/collect/thread_registry.hpp"
#include "selfprof/core/auto_dumps.hpp"
#include "selfprof/core/endpoint.hpp"
#include "selfprof/core/snapshots.hpp"
#include "selfprof/detail/process.hpp"
#include "selfprof/dump/dump.hpp"
#include "selfprof/dump/raw_dump.hpp"
#include "selfprof/options.hpp"
#include "selfprof/signal/clock.hpp"
#include "selfprof/signal/handler.hpp"
#include "selfprof/sources/select.hpp"
#include "selfprof/sources/signal_setup.hpp"
#include "selfprof/stats.hpp"
#include "selfprof/unwind/tables.hpp"
#include "selfprof/wall/sampler.hpp"

namespace selfprof {
namespace detail {

// The sample ring holds about this long of samples from 16 busy threads (at least 512 slots): the
// collector wakes early when it is half full, and otherwise every kCollectorBusyWakeMs. It never takes
// more than a quarter of options::max_memory (down to kRingMinSlots slots).
constexpr double kRingSeconds = 0.2;
constexpr std::size_t kRingThreads = 16;
constexpr std::size_t kRingMinSlots = 64;

// How options::max_memory is shared (see its comment): the ring's part, then of what the ring leaves,
// the stack tables' (the cumulative table, and the window buckets with SELFPROF_WINDOW).
struct memory_shares {
  std::size_t ring = 0, table = 0, windows = 0;
};
inline memory_shares share_memory(std::size_t max_memory, std::size_t ring_bytes, bool windows) {
  memory_shares m;
  m.ring = max_memory / 4;
  const std::size_t rest = max_memory > ring_bytes ? max_memory - ring_bytes : 0;
  const std::size_t tables = rest / 5 * 2;
  m.table = windows ? tables / 2 : tables;
  m.windows = windows ? tables - m.table : 0;
  return m;
}

class profiler_core {
 public:
  static profiler_core& instance() {
    static profiler_core* core = new profiler_core();  // never destroyed: usable from atexit and signals
    return *core;
  }

  // Never throws: a failed allocation (the ring, a table) makes it return an error.
  status start(const options& opts) {
    std::lock_guard<std::mutex> control(control_mu_);
    if (running_) return status::ok();
    starting_threads_ = false;
    try {
      const std::uint64_t cpu0 = this_thread_cpu_ns(), wall0 = monotonic_ns();
      process_cpu0_ = process_cpu_ns();
      own_cpu0_ = workers_cpu_ns();
      status st = start_locked(opts);
      start_cpu_ms_ = static_cast<double>(this_thread_cpu_ns() - cpu0) / 1e6;
      start_wall_ms_ = static_cast<double>(monotonic_ns() - wall0) / 1e6;
      if (st && opts_.verbose)
        std::fprintf(stderr, "selfprof: start took %.2f ms of CPU (%.2f ms wall)\n", start_cpu_ms_,
                     start_wall_ms_);
      return st;
    } catch (const std::exception& e) {
      return start_threw(std::string("selfprof: start failed: ") + e.what());
    } catch (...) {
      return start_threw("selfprof: start failed: unknown exception");
    }
  }

 private:
  status start_threw(const std::string& why) {
    if (starting_threads_) {
      running_ = true;  // stop_locked() undoes everything started so far
      stop_locked();
    } else {
      fail_start(status::ok());
    }
    return status::error(why);
  }

  status start_locked(const options& opts) {
    install_fork_handlers_once();
    if (opts.mode == profile_mode::offcpu)
      return status::error("selfprof: mode offcpu names profiles; start in cpu or wall mode");
    opts_ = opts;
    wall_ = opts_.mode == profile_mode::wall;
    if (wall_) opts_.thread_roots = true;  // per-thread roots: a pool's idle workers show as idle
    if (opts_.max_depth < 2) opts_.max_depth = 2;
    if (opts_.max_depth > 1024) opts_.max_depth = 1024;
    session_.clear();
    registry_.clear_names();
    symbols_.set_lines(opts_.lines);
    if (opts_.max_memory < kMinMaxMemory) {
      notes_.push_back("max_memory raised to the smallest ceiling, " + std::to_string(kMinMaxMemory >> 20) +
                       " MiB");
      opts_.max_memory = kMinMaxMemory;
    }
    status st = prepare_ring();
    if (!st) return fail_start(st);
    st = check_no_other_copy();  // the ring installs no handler, but defers to a copy that did
    if (!st) return fail_start(st);
    st = choose_tick_source();
    if (!st) return fail_start(st);
    prepare_unwind();
    if (!unwind_ok_) return fail_start(unwind_error_);
    store_config sc;
    sc.wall = wall_;
    sc.hz = opts_.hz;
    sc.window_s = opts_.window_s;
    sc.frame_budget_ms = opts_.frame_budget_ms;
    sc.frame_hz = opts_.frame_hz;
    sc.max_depth = opts_.max_depth;
    const memory_shares shares = share_memory(opts_.max_memory, ring_memory_.size() * 8, opts_.window_s > 0);
    sc.table_limit = shares.table;
    sc.window_limit = shares.windows;
    store_.begin(sc);
    snapshots_.begin(opts_, handler_counts::now());
    g_handler.active.store(true, std::memory_order_release);
    // Threads alive now: a signal source arms them (selfprof's own, the JIT flusher, left out). The ring
    // covers them without arming: the collector's first wake scans for their names.
    if (!pull_) registry_.scan(running_worker_tids());
    starting_threads_ = true;
    st = start_threads();
    if (!st) {
      running_ = true;  // stop_locked() undoes everything started so far
      stop_locked();
      return st;
    }
    for (auto& n : notes_) session_.note(n);
    notes_.clear();
    if (!opts_.out.empty()) install_exit_dump_once();
    session_ran_ = true;
    session_pid_ = ::getpid();
    starting_threads_ = false;
    running_ = true;
    if (opts_.verbose) std::fprintf(stderr, "%s", describe_locked().c_str());
    return status::ok();
  }

 public:
  status stop() {
    std::lock_guard<std::mutex> control(control_mu_);
    return stop_locked();
  }

  bool running() const { return running_; }
  bool thread_roots() const { return opts_.thread_roots; }
  // The signal ticks arrive on while sampling runs, else 0.
  int sample_signal() const { return running_ ? sample_signal_ : 0; }
  int dump_signal() const { return running_ ? dump_signal_ : 0; }

  // The options of the running (or last) session, as start() applied them.
  options current_options() {
    std::lock_guard<std::mutex> control(control_mu_);
    return opts_;
  }

  // Arms the calling thread now (instead of at the next scan) and unblocks the sampling signal in it.
  // `unblock`: also unblock the sampling signal in the thread (the API); the preload library arms new
  // threads without touching their signal mask.
  status register_current_thread(bool unblock = true) {
    if (!running_) return status::error("selfprof: register_thread() called while not profiling");
    arm_thread_altstack();  // from the thread itself, before its first tick (signal/altstack.hpp)
    return registry_.register_current(signal_.number, unblock);
  }

  // A copy of everything collected so far (drains the ring first); the profile stays in place.
  raw_snapshot snapshot_raw(bool windowed = false, std::uint64_t* window_seq = nullptr) {
    return snapshots_.raw(windowed, window_seq);
  }
  profile symbolize(const raw_snapshot& raw) { return snapshots_.symbolize(raw); }
  profile snapshot() { return symbolize(snapshot_raw()); }
  snapshot_maker& snapshots() { return snapshots_; }
  shared_symbolizer& symbols() { return symbols_; }  // the process's one symbolizer (tests)

  // The one dump path with the session's settings and `paths` (the API's dump()).
  status dump(const std::string& paths) {
    dump_settings s = dump_settings_for(paths);
    dump_contents c = snapshots_.contents();
    return write_dump(c, s);
  }
  dump_settings dump_settings_for(const std::string& paths) const {
    dump_settings s;
    s.paths = paths;
    s.sink.allow_shared_dir = opts_.allow_shared_dir;
    s.thread_roots = opts_.thread_roots;
    s.frame_budget_ms = opts_.frame_budget_ms;
    return s;
  }

  // Waits until the signal and interval dumps requested so far are written.
  void flush_dumps() { dumps_.flush(); }

  stats get_stats() {
    stats s;
    s.running = running_;
    s.mode = opts_.mode;
    s.hz = opts_.hz;
    s.sample_signal = sample_signal_;
    s.unwind = unwind_;
    const source_info src = session_.source();
    s.source = src.kind;
    s.source_detail = src.detail;
    s.source_reason = src.reason;
    s.effective_hz = src.effective_hz;
    s.kernel_time = wall_ || src.kernel_time;
    s.refused = session_.refused();
    session_.notes(s.notes);
    const thread_counts tc = registry_.counts();
    s.threads_seen = tc.seen;
    s.threads_armed = tc.armed;
    s.threads_fallback = tc.fallback;
    s.threads_arm_failed = tc.arm_failed;
    if (running_) s.threads_blocking_signal = registry_.blocking(signal_.number);
    const handler_counts h = snapshots_.counts();
    // Records and their losses: the handler's, and the ring source's (one of the two counts).
    s.records = h.taken + pulled_.records.load(std::memory_order_relaxed);
    s.dropped_full = h.full + pulled_.full.load(std::memory_order_relaxed);
    s.dropped_inactive = h.inactive;
    s.foreign_signals = h.foreign;
    s.truncated = h.truncated + pulled_.truncated.load(std::memory_order_relaxed);
    s.thread_checks = h.thread_checks;
    s.thread_wakes = h.thread_wakes;
    s.rate_capped = h.rate_capped;
    s.periods_skipped = h.periods_skipped;
    s.collector_wakes = collector_.wakes();
    s.start_cpu_ms = start_cpu_ms_;
    s.start_wall_ms = start_wall_ms_;
    const std::uint64_t process_now = running_ ? process_cpu_ns() : process_cpu_end_;
    const std::uint64_t own_now = running_ ? workers_cpu_ns() : own_cpu_end_;
    s.process_cpu_ns = process_now > process_cpu0_ ? process_now - process_cpu0_ : 0;
    s.own_cpu_ns = own_now > own_cpu0_ ? own_now - own_cpu0_ : 0;
    if (unwind_ == unwind_mode::dwarf) {
      const unwind_tables_info u = get_unwind_tables_info();
      s.unwind_modules_parsed = u.parsed;
      s.unwind_modules_pending = u.pending;
      s.unwind_rows = u.rows;
      s.unwind_parse_ms = u.parse_ms;
    }
    s.kernel_lost = pulled_.lost.load(std::memory_order_relaxed);
    s.kernel_throttles = pulled_.throttles.load(std::memory_order_relaxed);
    s.ring_user_chain = pulled_.user_chain_since_ns.load(std::memory_order_relaxed) != 0;
    s.ring_chain_cut = pulled_.chain_cut.load(std::memory_order_relaxed);
    s.ring_chain_given_back = pulled_.chain_given_back.load(std::memory_order_relaxed);
    s.ring_pages = pulled_.ring_pages.load(std::memory_order_relaxed);
    s.ring_grow_overlap = pulled_.overlap.load(std::memory_order_relaxed);
    const sample_store::sizes z = store_.size();
    s.samples = z.samples;
    s.unique_stacks = z.unique;
    s.table_bytes = z.bytes;
    s.max_memory = opts_.max_memory;
    s.ring_slots = ring_.capacity();
    s.ring_bytes = ring_memory_.size() * 8;
    s.ring_clipped = ring_clipped_;
    const merge_counts m = store_.merged();
    s.stacks_merged = m.stack_records;
    s.samples_merged = m.samples;
    s.threads_merged = m.threads;
    s.samples_by_thread = store_.samples_by_thread();
    if (wall_) s.wall = wall_sampler_.counters();
    s.dump_signal = dump_signal_;
    s.dumps_written = dumps_.written();
    s.dumps_failed = dumps_.failed();
    if (running_) {
      s.http.address = server_.address();
      s.http.control = server_.control_name();
    }
    const server_counters sc = server_.counters();
    s.http.connections = sc.connections;
    s.http.requests = sc.requests;
    s.http.bad_requests = sc.bad_requests;
    s.http.unauthorized = sc.unauthorized;
    s.http.refused = sc.refused;
    s.http.timeouts = sc.timeouts;
    s.http.failures = sc.failures;
    return s;
  }

  std::string describe() {
    std::lock_guard<std::mutex> control(control_mu_);
    return describe_locked();
  }

  // What a normal exit runs when SELFPROF_OUT is set: the last session's profile is written there, whether
  // the session still runs (it is stopped first, so every sample is in it) or was stopped before. Only in
  // the process that ran the session: a forked child's exit writes nothing.
  // `on_dumper`: run by the dumper thread for a process ending through _exit(), which keeps that thread.
  void exit_dump(bool on_dumper = false) {
    if (!session_ran_ || session_pid_ != ::getpid() || opts_.out.empty()) return;
    {
      std::lock_guard<std::mutex> control(control_mu_);
      stop_locked(true, on_dumper);  // the dump signal stays taken: the process ends after this
    }
    if (is_raw_dump_path(opts_.out)) {
      // `selfprof record --follow-exec`: named by the recorder. Silent when it fails: a process that
      // outlives the recording (a daemon) finds the directory gone, and its stderr is the program's.
      (void)write_raw_dump(snapshots_.raw(false, nullptr, true), symbols_,
                           expand_path_template(opts_.out, fields_now(next_dump_number())),
                           dump_settings_for(opts_.out).sink);
      return;
    }
    dump_contents c = snapshots_.contents();
    status st = write_dump(c, dump_settings_for(opts_.out));
    if (!st) std::fprintf(stderr, "%s\n", st.message().c_str());
  }

  // fork(2), see core/fork.hpp: every lock is taken before the fork, so no copy is held by a thread that
  // does not exist in the child; the child forgets the parent's threads and kernel objects.
  // The symbolizer's lock is the exception: a dump may hold it for seconds while it names frames, so
  // fork() waits for it only briefly (see shared_symbolizer::lock_for_fork_briefly), and a child that did
  // not get it starts with a fresh symbolizer.
  void fork_prepare() {
    control_mu_.lock();
    registry_.lock_for_fork().lock();
    store_.lock_for_fork().lock();
    symbols_locked_for_fork_ = symbols_.lock_for_fork_briefly();
  }
  void fork_parent() {
    if (symbols_locked_for_fork_) symbols_.lock_for_fork().unlock();
    store_.lock_for_fork().unlock();
    registry_.lock_for_fork().unlock();
    control_mu_.unlock();
  }
  void fork_child();

 private:
  profiler_core() = default;

  // Sizes the ring from the rate (or options::ring_slots), clipped to its part of max_memory; an
  // allocation that fails is an error, never an exception out of start().
  status prepare_ring() {
    std::size_t want = opts_.ring_slots ? opts_.ring_slots
                                        : static_cast<std::size_t>(opts_.hz * kRingThreads * kRingSeconds);
    std::size_t cap = 512;
    while (cap < want && cap < (1u << 20)) cap <<= 1;
    const std::size_t stride = sample_ring::stride_for(opts_.max_depth);
    const std::size_t share = share_memory(opts_.max_memory, 0, false).ring;
    ring_clipped_ = false;
    while (cap > kRingMinSlots && cap * stride > share) {
      cap >>= 1;
      ring_clipped_ = true;
    }
    if (ring_clipped_)
      notes_.push_back("sample ring clipped to " + std::to_string(cap) + " slots (" +
                       std::to_string(cap * stride >> 10) + " KiB, a quarter of SELFPROF_MAX_MEMORY " +
                       std::to_string(opts_.max_memory >> 20) +
                       " MiB): samples the collector cannot take in time are dropped and counted");
    // Kept across restarts when the size is the same: init() resets every slot's sequence word, and
    // a slot's other bytes are written before it is published (a new zeroed block would page-fault again).
    const std::size_t ring_words = cap * stride / 8;
    bool zeroed = false;
    if (ring_memory_.size() != ring_words) {
      g_handler.ring.store(nullptr, std::memory_order_release);
      ring_memory_.release();  // the old block goes first: never both at once
      zeroed = ring_memory_.allocate(ring_words);
      if (!zeroed) {
        return status::error("selfprof: cannot allocate the sample ring (" + std::to_string(ring_words * 8) +
                             " bytes for " + std::to_string(cap) + " slots of " +
                             std::to_string(opts_.max_depth) +
                             " frames); lower SELFPROF_MAX_MEMORY, "
                             "SELFPROF_HZ or SELFPROF_MAX_DEPTH");
      }
    }
    ring_.init(ring_memory_.data(), cap, opts_.max_depth, zeroed);
    g_handler.main_tid.store(static_cast<std::uint32_t>(::getpid()), std::memory_order_relaxed);
    g_handler.ring.store(&ring_, std::memory_order_release);
    return status::ok();
  }

  // The sampling handler, for a source that signals: installed before such a source opens (its first tick
  // may come at once), after the main thread's stack end that its walks stop at is known.
  status install_handler(source_config& cfg) {
    // A forced itimer can only deliver SIGPROF.
    const int wanted =
        opts_.sample_signal == 0 && opts_.source == source_kind::itimer ? SIGPROF : opts_.sample_signal;
    g_handler.main_stack_end.store(main_stack_end(), std::memory_order_relaxed);
    status st = install_sample_handler(wanted, signal_, notes_);
    if (!st) return st;
    sample_signal_ = signal_.number;
    cfg.signal_number = signal_.number;
    return status::ok();
  }

  status choose_tick_source() {
    source_config cfg;
    cfg.hz = opts_.hz;
    cfg.max_depth = opts_.max_depth;
    // The ring signals nothing: `auto` and a forced ring install the handler only when the ring is refused.
    const bool ring_first =
        !wall_ && (opts_.source == source_kind::automatic || opts_.source == source_kind::ring);
    if (!ring_first) {
      status st = install_handler(cfg);
      if (!st) return st;
    }
    std::function<status(source_config&)> signal_ready;
    if (ring_first) signal_ready = [this](source_config& c) { return install_handler(c); };
    source_choice choice =
        wall_ ? choose_wall_source(opts_.source, cfg) : choose_source(opts_.source, cfg, signal_ready);
    cfg.signal_number = signal_.number;  // installed on the way, or 0 (the ring)
    if (!choice.source && !wall_ && opts_.source == source_kind::automatic && opts_.sample_signal == 0 &&
        signal_.number != SIGPROF) {
      // Only the itimer is left, and it delivers SIGPROF alone: sample on SIGPROF when it is free.
      installed_signal on_prof;
      if (install_sample_handler(SIGPROF, on_prof, notes_)) {
        restore_sample_handler(signal_);
        signal_ = on_prof;
        sample_signal_ = SIGPROF;
        cfg.signal_number = SIGPROF;
        source_choice again = choose_source(source_kind::itimer, cfg);
        for (auto& r : again.refused) choice.refused.push_back(r);
        if (again.source) {
          choice.source = std::move(again.source);
          choice.reason = "last resort: per-thread sources unavailable (samples are uneven across threads)";
        }
      }
    }
    session_.set_refused(choice.refused);
    const bool forced = opts_.source != source_kind::automatic;
    if (!choice.source && (!wall_ || forced)) {
      std::string why = wall_ ? "selfprof: wall mode cannot use the requested source"
                              : "selfprof: no tick source works here";
      for (auto& r : choice.refused) why += "; " + r;
      return status::error(why);
    }
    source_config_ = cfg;
    source_info s;
    if (choice.source) {
      s.kind = choice.source->kind();
      s.detail = choice.source->describe();
      s.reason = choice.reason;
      s.effective_hz = choice.source->effective_hz();
      s.kernel_time = choice.source->counts_kernel_time();
    } else {  // wall mode without signals: the sampler counts CPU time from the CPU clocks
      s.kind = source_kind::none;
      s.detail = "wall sampler only (no on-CPU stacks)";
      s.reason = "no user-only perf_event: CPU time is counted as [running], without stacks";
      s.effective_hz = opts_.hz;
    }
    session_.set_source(s);
    if (wall_ && choice.source)
      notes_.push_back(
          "wall mode: on-CPU stacks from user-only ticks; CPU time spent in the kernel is not in them");
    upgrade_ = !wall_ && !forced && choice.source && choice.source->kind() == source_kind::timer;
    pull_ = choice.source && choice.source->pulls_samples() ? choice.source.get() : nullptr;
    pulled_ = pulled_counts{};
    if (pull_) {  // no signal is ever sent: the sampling handler goes
      restore_sample_handler(signal_);
      sample_signal_ = 0;
    }
    oncpu_ticks_ = choice.source != nullptr;
    registry_.begin(std::move(choice.source), cfg);
    return status::ok();
  }

  void prepare_unwind() {
    unwind_ = unwind_mode::fp;
    unwind_ok_ = true;
    if (opts_.unwind == unwind_mode::fp) return;
    if (opts_.unwind == unwind_mode::automatic) {
      // The collector parses a module's rows once samples reached its code: a process never pays for the
      // .eh_frame of code it does not run, and until then the handler walks frame pointers there.
      unwind_ = unwind_mode::dwarf;
      return;
    }
    status u = build_unwind_tables();  // SELFPROF_UNWIND=dwarf: rows from the first sample, or an error
    if (u) {
      unwind_ = unwind_mode::dwarf;
      return;
    }
    if (opts_.unwind == unwind_mode::dwarf) {
      unwind_ok_ = false;
      unwind_error_ = u;
      return;
    }
    notes_.push_back(u.message() + "; unwinding with frame pointers only");
  }

  // Starts selfprof's threads: the automatic dumps and the wall sampler first, so the collector knows
  // their tids and never arms them.
  status start_threads() {
    // The dumper starts at the first dump request (or at once, for an interval); the collector watches.
    status st = dumps_.start(opts_, session_, true);
    if (!st) return st;
    dump_signal_ = dumps_.signal_number();
    st = start_server();
    if (!st) return st;
    if (wall_) {
      wall_config wc;
      wc.hz = opts_.hz;
      wc.oncpu_signals = oncpu_ticks_;
      wc.ring = &ring_;
      wc.wake_fd = &g_handler.wake_fd;
      st = wall_sampler_.start(wc);
      if (!st) return st;
      std::uint64_t generation = ~std::uint64_t(0);
      std::vector<pid_t> tids;
      registry_.list_if_changed(generation, tids);
      wall_sampler_.set_threads(tids);
    }
    collector_config cc;
    cc.ring = &ring_;
    cc.store = &store_;
    cc.threads = &registry_;
    cc.session = &session_;
    cc.symbols = &symbols_;
    cc.sources = source_config_;
    cc.upgrade = upgrade_;
    cc.wall = wall_;
    cc.unwind_rows = unwind_ == unwind_mode::dwarf;
    cc.lazy_rows = cc.unwind_rows && opts_.unwind == unwind_mode::automatic;
    cc.sample_signal = signal_.number;
    cc.pull = pull_;
    cc.pulled = &pulled_;
    cc.sampler = wall_ ? &wall_sampler_ : nullptr;
    cc.standby_fd = dumps_.watch_fd();
    cc.standby_launch = &auto_dumps::launch_from;
    cc.standby_context = &dumps_;
    st = collector_.start(cc);
    if (!st) return st;
    return status::ok();
  }

  // The profile endpoint and the control socket (core/endpoint.hpp), when asked for.
  status start_server() {
    server_config sc;
    sc.http = opts_.http;
    sc.control = opts_.control;
    sc.head_timeout_s = opts_.http_head_timeout_s;
    if (!opts_.http_token_file.empty()) {
      if (opts_.http.empty())
        return status::error(
            "selfprof: SELFPROF_HTTP_TOKEN_FILE is set but SELFPROF_HTTP is not: no endpoint");
      status st = read_token_file(opts_.http_token_file, sc.token);
      if (!st) return st;
    }
    if (sc.http.empty() && !sc.control) return status::ok();
    const options o = opts_;
    // The control socket alone: its thread starts at the first client, the dumper watching the socket.
    status st = server_.start(
        sc, [this, o](const http_request& r) { return answer_request(snapshots_, o, r); }, notes_, true);
    if (st) dumps_.serve_on_demand(server_.lazy_listener() >= 0 ? &server_ : nullptr);
    return st;
  }

  status stop_locked(bool keep_dump_signal = false, bool on_dumper = false) {
    if (!running_) return status::ok();
    server_.stop();        // first: a waiting request reads snapshots
    wall_sampler_.stop();  // first: it reads the ring and the unwind tables
    collector_.stop();
    if (pull_) {  // what the kernel wrote since the collector's last read
      pull_->collect_again(ring_);
      pulled_.update(*pull_);
      pull_ = nullptr;
    }
    if (!on_dumper) dumps_.stop(keep_dump_signal);  // answers what was requested, gives the signal back
    registry_.end();
    g_handler.active.store(false, std::memory_order_seq_cst);  // pairs with the handler's in_flight
    // Waits (bounded) until no handler runs: the tables can go. A handler still running after the wait
    // is stuck in a fault of its own; its tables are kept (a leak) rather than freed under it.
    const bool quiet = restore_sample_handler(signal_);
    collector_.close_task_dir();
    if (quiet) release_unwind_tables();
    store_.drain(ring_, true);
    g_handler.ring.store(nullptr, std::memory_order_release);
    snapshots_.end();
    process_cpu_end_ = process_cpu_ns();
    own_cpu_end_ = workers_cpu_ns();
    running_ = false;
    return status::ok();
  }

  status fail_start(status st) {
    pull_ = nullptr;
    g_handler.active.store(false, std::memory_order_seq_cst);  // pairs with the handler's in_flight
    registry_.end();
    if (restore_sample_handler(signal_)) release_unwind_tables();
    g_handler.ring.store(nullptr, std::memory_order_release);
    notes_.clear();
    return st;
  }

  std::string describe_locked() {
    char buf[256];
    std::string s;
    const source_info src = session_.source();
    std::snprintf(buf, sizeof buf, "selfprof: sampling at %g Hz (effective %g Hz) with %s", opts_.hz,
                  src.effective_hz, src.detail.c_str());
    s += buf;
    s += signal_.number > 0 ? " on signal " + std::to_string(signal_.number) + "\n" : std::string("\n");
    s += std::string("selfprof: source ") + source_name(src.kind) + ": " + src.reason + "\n";
    for (auto& r : session_.refused()) s += "selfprof: refused " + r + "\n";
    std::vector<std::string> notes;
    session_.notes(notes);
    for (auto& n : notes) s += "selfprof: " + n + "\n";
    const std::string out = opts_.out.empty() ? std::string(kDefaultDumpTemplate) + " (default)" : opts_.out;
    if (dumps_.signal_number() != 0)
      s += "selfprof: kill -" + std::to_string(dumps_.signal_number()) + " " + std::to_string(::getpid()) +
           " writes " + out + "\n";
    if (opts_.interval_s > 0)
      s += "selfprof: every " + std::to_string(opts_.interval_s) + " s writes " + out + "\n";
    if (opts_.window_s > 0)
      s += "selfprof: each dump holds the last " + std::to_string(opts_.window_s) + " s\n";
    if (!opts_.out.empty()) s += "selfprof: at exit writes " + opts_.out + "\n";
    if (!server_.address().empty())
      s += "selfprof: serving profiles at http://" + server_.address() + "/debug/pprof/\n";
    if (!server_.control_name().empty())
      s += "selfprof: selfprof dump " + std::to_string(::getpid()) + " asks " + server_.control_name() + "\n";
    return s;
  }

  // SELFPROF_OUT set: a normal exit writes the profile of the last session (see exit_dump()).
  void install_exit_dump_once() {
    static bool done = false;
    if (done) return;
    done = true;
    std::atexit([] { instance().exit_dump(); });
  }

  void install_fork_handlers_once();

  std::mutex control_mu_;  // start/stop; taken first
  bool running_ = false;
  bool session_ran_ = false;
  pid_t session_pid_ = 0;
  bool wall_ = false;
  bool upgrade_ = false;
  tick_source* pull_ = nullptr;  // the registry's primary source when it sends no signal (ring)
  pulled_counts pulled_;
  bool oncpu_ticks_ = false;
  bool unwind_ok_ = true;
  status unwind_error_;
  unwind_mode unwind_ = unwind_mode::fp;
  double start_cpu_ms_ = 0, start_wall_ms_ = 0;  // what the last start() cost its caller
  // The process's and selfprof's threads' CPU clocks at the last start() and stop() (stats).
  std::uint64_t process_cpu0_ = 0, own_cpu0_ = 0, process_cpu_end_ = 0, own_cpu_end_ = 0;
  options opts_;
  std::vector<std::string> notes_;  // remarks made while starting, given to the session once it runs
  installed_signal signal_;
  int sample_signal_ = 0, dump_signal_ = 0;  // the session's signals, still reported after stop()
  source_config source_config_;
  // The sample ring's memory: anonymous pages, zero until touched, so a process pays only for the slots
  // its samples reach (the ring holds 0.2 s of samples of 16 threads: megabytes at high rates).
  struct ring_block {
    std::uint64_t* block = nullptr;
    std::size_t words = 0;
    std::size_t size() const { return words; }
    std::uint64_t* data() const { return block; }
    bool allocate(std::size_t n) {
      void* p = ::mmap(nullptr, n * 8, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
      if (p == MAP_FAILED) return false;
      block = static_cast<std::uint64_t*>(p);
      words = n;
      return true;
    }
    void release() {
      if (block != nullptr) ::munmap(block, words * 8);
      block = nullptr;
      words = 0;
    }
  };
  ring_block ring_memory_;
  sample_ring ring_;
  bool ring_clipped_ = false;
  bool starting_threads_ = false;  // start() got as far as starting threads: stop_locked() undoes it
  session_info session_;
  thread_registry registry_;
  sample_store store_;
  shared_symbolizer symbols_;
  bool symbols_locked_for_fork_ = false;  // between fork_prepare and fork_parent/fork_child
  snapshot_maker snapshots_{session_parts{&ring_, &store_, &registry_, &session_, &symbols_, &collector_}};
  auto_dumps dumps_{snapshots_, [] { instance().exit_dump(true); }};
  http_server server_;
  wall_sampler wall_sampler_;
  collector collector_;
};

}  // namespace detail
}  // namespace selfprof

#include "selfprof/core/fork.hpp"
