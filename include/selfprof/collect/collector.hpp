// The collector: the one thread that does the work off the signal path while sampling. It drains the
// sample ring into the sample store, finds new threads and arms them, rebuilds unwind rows and refreshes
// the module snapshot when libraries come and go, applies SELFPROF_FRAME_HZ to threads that mark game
// frames, runs the contention upgrade, and merges the samples of ended threads when many threads came and
// went (sample_store::merge_ended_threads). It never symbolizes and never writes files.
// Context: its own thread ("selfprof"); start/stop from setup only.
//
// When it wakes. A wake-up costs tens of microseconds of CPU even when there is nothing to do, so:
//  - while ticks arrive (at least half a busy thread's rate over the last wait), the signal handler
//    checks the thread count every kThreadCheckNs (one fstat of /proc/self/task, whose link count is
//    2 + the number of threads) and wakes the collector when it changed, and every half ring of
//    samples; the collector itself then wakes only every
//    kCollectorBusyWakeMs for the full scan (a thread that exited while another started leaves the count
//    unchanged) and the module checks;
//  - while fewer ticks arrive (an idle process, a burst that ended, or only unarmed threads are busy) the
//    handler may not run again soon, so nobody else looks: it wakes every kCollectorWakeMs, and new
//    threads are found within a few tens of milliseconds;
//  - wall mode and boosted game-frame threads keep the short period; the contention monitor shortens it
//    while it watches oversubscribed threads.
#pragma once

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <mutex>
#include <new>
#include <string>
#include <vector>

#include "selfprof/collect/sample_store.hpp"
#include "selfprof/collect/session_info.hpp"
#include "selfprof/collect/thread_registry.hpp"
#include "selfprof/detail/high_fd.hpp"
#include "selfprof/detail/process.hpp"
#include "selfprof/detail/worker.hpp"
#include "selfprof/signal/handler.hpp"
#include "selfprof/sources/contention.hpp"
#include "selfprof/sources/perf_ring.hpp"
#include "selfprof/sources/signal_setup.hpp"
#include "selfprof/symbols/shared_symbolizer.hpp"
#include "selfprof/unwind/tables.hpp"
#include "selfprof/wall/sampler.hpp"

namespace selfprof {
namespace detail {

constexpr unsigned kCollectorWakeMs = 50;
constexpr unsigned kCollectorBusyWakeMs = 500;
constexpr unsigned kFullThreadScanMs = 500;  // full /proc/self/task scan even when the count is stable
constexpr unsigned kSymbolRefreshMs = 200;   // module snapshot while samples arrive and libraries change
constexpr unsigned kPullWaitMs = 2000;  // the longest a snapshot waits for the collector to read the rings
constexpr unsigned kCodeRescanMaxMs = 5000;  // the longest back-off between scans for samples in unknown code

// What a source without signals reported lost (published by the collector for get_stats()).
struct pulled_counts {
  std::atomic<std::uint64_t> records{0}, truncated{0}, full{0}, lost{0}, throttles{0};
  std::atomic<std::uint64_t> user_chain_since_ns{0}, chain_cut{0}, ring_pages{0}, overlap{0};
  std::atomic<bool> chain_given_back{false};
  pulled_counts() = default;
  pulled_counts& operator=(const pulled_counts&) {
    update(pulled_stats{});
    return *this;
  }
  void update(const tick_source& src) { update(src.pulled()); }
  void update(const pulled_stats& p) {
    records.store(p.records, std::memory_order_relaxed);
    truncated.store(p.truncated, std::memory_order_relaxed);
    full.store(p.full, std::memory_order_relaxed);
    lost.store(p.lost, std::memory_order_relaxed);
    throttles.store(p.throttles, std::memory_order_relaxed);
    user_chain_since_ns.store(p.user_chain_since_ns, std::memory_order_relaxed);
    chain_cut.store(p.chain_cut, std::memory_order_relaxed);
    chain_given_back.store(p.chain_given_back, std::memory_order_relaxed);
    ring_pages.store(p.ring_pages, std::memory_order_relaxed);
    overlap.store(p.overlap, std::memory_order_relaxed);
  }
};

struct collector_config {
  sample_ring* ring = nullptr;
  sample_store* store = nullptr;
  thread_registry* threads = nullptr;
  session_info* session = nullptr;
  shared_symbolizer* symbols = nullptr;
  source_config sources;            // what the contention upgrade opens its event with
  bool upgrade = false;             // auto chose the CPU timer: may switch to perf_event under contention
  bool wall = false;                // wall mode: the short period
  bool unwind_rows = false;         // rebuild the handler's CFI rows when libraries come and go
  bool lazy_rows = false;           // parse a module's rows only once samples reached its code
  int sample_signal = 0;            // watched: the program may install its own handler for it
  wall_sampler* sampler = nullptr;  // wall mode: the wall sampler, told the threads to look at
  tick_source* pull = nullptr;      // a source without signals (ring): read into the ring at each wake
  pulled_counts* pulled = nullptr;  // its lost-sample counts, published
  // A worker started on demand (the dumper, core/auto_dumps.hpp): `fd` is watched in every wait, and
  // launch(context) called once when it turns readable. -1: none.
  int standby_fd = -1;
  void (*standby_launch)(void*) = nullptr;
  void* standby_context = nullptr;
};

class collector {
 public:
  collector() = default;
  collector(const collector&) = delete;
  collector& operator=(const collector&) = delete;

  // Starts the thread; the signal handler wakes it through g_handler.wake_fd from now on.
  status start(const collector_config& c) {
    config_ = c;
    wakes_.store(0, std::memory_order_relaxed);
    contention_.reset(c.upgrade);
    listed_generation_ = ~std::uint64_t(0);
    merge_generation_ = ~std::uint64_t(0);
    task_dir_fd_ = keep_fd_high(::open("/proc/self/task", O_RDONLY | O_DIRECTORY | O_CLOEXEC));
    status st = worker_.start("selfprof", &collector::main, this);
    if (!st) {
      close_task_dir();
      return st;
    }
    g_handler.task_links.store(0, std::memory_order_relaxed);  // the first scan sets it
    g_handler.task_dir_fd.store(task_dir_fd_, std::memory_order_release);
    g_handler.wake_fd.store(worker_.wake_fd(), std::memory_order_release);
    {
      std::lock_guard<std::mutex> lock(pull_mu_);
      pull_asked_ = pull_done_ = 0;
      pulling_ = c.pull != nullptr;
    }
    return status::ok();
  }

  // Stops the thread. The handler no longer wakes it (it may still run: its write then goes nowhere).
  void stop() {
    g_handler.next_thread_check.store(0, std::memory_order_relaxed);
    g_handler.wake_fd.store(-1, std::memory_order_release);
    g_handler.task_dir_fd.store(-1, std::memory_order_release);
    {
      std::lock_guard<std::mutex> lock(pull_mu_);
      pulling_ = false;  // a snapshot waiting in pull_now() goes on with what was read
    }
    pull_cv_.notify_all();
    worker_.stop();
  }

  // Any thread but this one's (a snapshot): with a source whose samples wait in the kernel's rings, has
  // this thread read them now, so the snapshot holds everything sampled before it was asked for. Waits at
  // most kPullWaitMs (the first unwind-table build can hold the thread up); only this thread reads rings.
  void pull_now() {
    if (static_cast<pid_t>(raw_gettid()) == worker_.tid()) return;
    std::unique_lock<std::mutex> lock(pull_mu_);
    if (!pulling_) return;
    const std::uint64_t want = ++pull_asked_;
    worker_.wake();
    pull_cv_.wait_for(lock, std::chrono::milliseconds(kPullWaitMs),
                      [&] { return !pulling_ || pull_done_ >= want; });
  }

  // After the last handler returned: the fd the handler fstat()s can go.
  void close_task_dir() {
    if (task_dir_fd_ >= 0) ::close(task_dir_fd_);
    task_dir_fd_ = -1;
  }

  void wake() const { worker_.wake(); }
  pid_t tid() const { return worker_.tid(); }
  std::uint64_t wakes() const { return wakes_.load(std::memory_order_relaxed); }

  void abandon_after_fork() {
    g_handler.wake_fd.store(-1, std::memory_order_release);
    g_handler.task_dir_fd.store(-1, std::memory_order_release);
    worker_.abandon_after_fork();
    close_task_dir();
    new (&pull_mu_) std::mutex();  // a parent thread may have held it at the fork
    new (&pull_cv_) std::condition_variable();
    pulling_ = false;
  }

 private:
  static void main(void* self) { static_cast<collector*>(self)->loop(); }

  // The thread count from the link count of /proc/self/task (2 + threads), -1 when unknown.
  long task_links() const {
    struct stat st {};
    if (task_dir_fd_ < 0 || ::fstat(task_dir_fd_, &st) != 0) return -1;
    return static_cast<long>(st.st_nlink);
  }

  int wait_ms(bool ticks_arrive, bool boosting) const {
    unsigned ms = kCollectorWakeMs;
    if (ticks_arrive && !config_.wall && !boosting && task_dir_fd_ >= 0) ms = kCollectorBusyWakeMs;
    if (contention_.active() && contention_.period_ms() < ms) ms = contention_.period_ms();
    if (config_.pull) ms = config_.pull->collect_period_ms();  // before a ring fills
    return static_cast<int>(ms);
  }

  void loop() {
    const auto start = std::chrono::steady_clock::now();
    chain_noted_ = given_back_noted_ = false;  // this session's source has said nothing yet
    auto last_full_scan = start;
    long last_count = -1;  // scan at once: threads may have started since start() looked
    std::uint64_t last_generation = loader_generation();
    std::uint64_t last_total = 0;
    std::uint64_t last_taken = g_handler.taken.load(std::memory_order_relaxed);
    bool ticks_arrive = false;
    bool boosting = false;
    code_scan code;
    config_.store->set_code({}, config_.symbols->jit_map());  // JIT samples are named from the first drain
    auto last_code_scan = start;  // the first scan waits one interval: a short-lived process never pays it
    auto last_wake = start;
    // Maps the ring's first pages (sample_ring::map_ahead) before a signal handler writes there. A source
    // without signals writes only from this thread, after the first wait: a process that ends before
    // then never pays for the pages.
    bool mapped = config_.pull == nullptr;
    if (mapped) config_.store->drain(*config_.ring);
    int standby = config_.standby_launch ? config_.standby_fd : -1;
    bool standby_ready = false;
    while (worker_.wait(wait_ms(ticks_arrive, boosting), standby, &standby_ready)) {
      wakes_.fetch_add(1, std::memory_order_relaxed);
      if (standby_ready) {
        config_.standby_launch(config_.standby_context);  // it takes over what made the fd readable
        standby = -1;
      }
      config_.symbols->poll_jit_map();  // lines written before these samples were taken name them
      // Before the pull and the drain: the ring source walks its samples with the rows of now (and has
      // the rows of modules it reaches parsed, see ring_rows), the drain notes samples in unparsed ones.
      if (config_.unwind_rows) build_rows();
      if (config_.pull) {
        // Maps ahead what one read can write (rings grow, see perf_ring), before collect() writes it.
        config_.ring->set_map_ahead(config_.pull->records_per_read());
        if (!mapped) config_.store->drain(*config_.ring);
        mapped = true;
        std::uint64_t asked;
        {
          std::lock_guard<std::mutex> lock(pull_mu_);
          asked = pull_asked_;
        }
        config_.pull->collect(*config_.ring, running_worker_tids(), pull_rows());
        if (config_.pulled) {
          config_.pulled->update(*config_.pull);
          note_user_chain(*config_.pulled);
        }
        {
          std::lock_guard<std::mutex> lock(pull_mu_);
          pull_done_ = asked;
        }
        pull_cv_.notify_all();
      }
      config_.store->drain(*config_.ring);
      if (config_.lazy_rows) parse_reached_rows();
      watch_sample_signal();
      const std::uint64_t total = config_.store->total();
      const auto now = std::chrono::steady_clock::now();
      const std::uint64_t taken = g_handler.taken.load(std::memory_order_relaxed);
      // Steady ticks: half of one busy thread's rate over the last wait (timer periods round up to the
      // kernel's tick, so a busy thread may get less than hz). A few ticks of a burst that has ended
      // (start() itself, say) would otherwise buy a long wait in which no handler looks.
      const double waited_s = std::chrono::duration<double>(now - last_wake).count();
      ticks_arrive = taken != last_taken &&
                     static_cast<double>(taken - last_taken) >= 0.5 * config_.sources.hz * waited_s;
      last_taken = taken;
      last_wake = now;
      const long count = task_links();  // read before the scan: a thread born after it changes the count
      const bool full = now - last_full_scan >= std::chrono::milliseconds(kFullThreadScanMs);
      boosting = boost_game_frame_threads();
      if (count != last_count || full || count < 0) {
        config_.threads->scan(running_worker_tids());
        for (auto& n : config_.threads->take_notes()) config_.session->note(n);
        if (config_.sampler && config_.threads->list_if_changed(listed_generation_, listed_))
          config_.sampler->set_threads(listed_);
        last_count = count;
        last_full_scan = now;
      }
      merge_ended_threads();
      if (ticks_arrive && config_.threads->primary() && contention_.due(now)) check_contention(now);
      if (count >= 0) {  // the handler compares with this; its next check is at most kThreadCheckNs away
        g_handler.task_links.store(static_cast<std::uint64_t>(count), std::memory_order_relaxed);
        std::uint64_t zero = 0;
        g_handler.next_thread_check.compare_exchange_strong(zero, monotonic_ns() + kThreadCheckNs,
                                                            std::memory_order_relaxed);
      }
      if (config_.pull)
        config_.pull->collect(*config_.ring, running_worker_tids(),
                              pull_rows());  // the thread scan may be long
      // A library loaded while profiling, or code mapped without the loader that samples landed in, is
      // parsed while it is still mapped, so its samples keep their names after it is unmapped. Nothing to
      // do while no library comes or goes and every sample lands in known code.
      const std::uint64_t generation = loader_generation();
      const bool loader_moved = generation != last_generation && total != last_total;
      const bool unknown = config_.store->take_unknown_code();
      if ((loader_moved || unknown) && now - last_code_scan >= code.interval) {
        code.scanned(config_.symbols->rescan(), loader_moved);
        config_.store->set_code(code.ranges, config_.symbols->jit_map());
        last_code_scan = now;
        last_total = total;
        last_generation = generation;
      }
    }
  }

  // Scans for samples in unknown code back off while the maps do not change (a bad unwind can leave
  // addresses that belong to no mapping), and come back to the short interval when they do.
  struct code_scan {
    std::vector<code_range> ranges;
    std::chrono::milliseconds interval{kSymbolRefreshMs};
    void scanned(std::vector<code_range> now, bool loader_moved) {
      const bool same =
          now.size() == ranges.size() &&
          std::equal(now.begin(), now.end(), ranges.begin(), [](const code_range& a, const code_range& b) {
            return a.start == b.start && a.end == b.end && a.anonymous == b.anonymous;
          });
      if (same && !loader_moved)
        interval = std::min(interval * 2, std::chrono::milliseconds(kCodeRescanMaxMs));
      else
        interval = std::chrono::milliseconds(kSymbolRefreshMs);
      ranges = std::move(now);
    }
  };

  // The handler's CFI rows: built at the first wake (start() leaves them to the collector unless
  // SELFPROF_UNWIND=dwarf), rebuilt when modules come and go; nearly free when none did. Lazily (the
  // automatic choice), a module's rows are parsed only once a sample reached its code: until the next
  // wake after that, the signal sources' samples there are walked by frame pointers (the ring source's
  // are walked after the parse, see ring_rows). A failure is noted once; the handler
  // walks frame pointers where no row covers a pc. Under the lock fork() takes.
  void build_rows() {
    status st;
    const bool lazy = config_.lazy_rows;
    config_.symbols->locked(
        [&st, lazy] { st = lazy ? build_unwind_tables_lazily() : build_unwind_tables(); });
    if (!st && !rows_failed_) {
      rows_failed_ = true;
      config_.session->note(st.message() + "; unwinding with frame pointers only", true);
    }
    if (!lazy) return;
    const std::uint64_t generation = unwind_tables().pending_generation();
    if (generation == pending_generation_) return;  // the store has the list of this build
    pending_generation_ = generation;
    pending_rows_ = unwind_tables().pending();
    config_.store->set_pending_rows(pending_rows_);
  }

  // What the ring source may ask while it walks the samples it read (lazy rows): is a pc in code whose
  // rows were never parsed, and parse them now. So a module's first samples, which reached it before its
  // rows existed, are walked by its rows and not by frame pointers it may not keep.
  class ring_rows final : public row_requests {
   public:
    explicit ring_rows(collector& c) : c_(c) {}
    bool unparsed(std::uint64_t pc) const override { return find_pending(c_.pending_rows_, pc) != nullptr; }
    bool parse(std::uint64_t pc) override {
      if (!unwind_tables().want(static_cast<std::uintptr_t>(pc))) return false;
      c_.build_rows();
      return true;
    }

   private:
    collector& c_;
  };
  row_requests* pull_rows() { return config_.unwind_rows && config_.lazy_rows ? &ring_rows_ : nullptr; }

  // Parses the rows of the modules the drained samples reached.
  void parse_reached_rows() {
    bool asked = false;
    for (std::uint64_t pc : config_.store->take_row_requests())
      asked = unwind_tables().want(static_cast<std::uintptr_t>(pc)) || asked;
    if (asked) build_rows();
  }

  // The program installed its own handler for the sampling signal (without the preload library, which
  // moves selfprof to another signal first): its handler must not keep receiving ticks, so every source
  // is closed at once. Sampling is over for this session; a note says why.
  void watch_sample_signal() {
    if (config_.sample_signal <= 0 || sample_handler_installed(config_.sample_signal)) return;
    config_.threads->end();
    config_.session->note("the program installed its own handler for signal " +
                              std::to_string(config_.sample_signal) +
                              ", the sampling signal: selfprof stopped sending it, and sampling stopped",
                          true);
    config_.sample_signal = 0;
  }

  // A thread per request must not cost memory for every thread the program ever ran: once the store
  // asks for it, the threads that ended since the last merge are merged into one.
  void merge_ended_threads() {
    if (!config_.store->wants_thread_merge()) return;
    std::vector<pid_t> live;
    if (!config_.threads->list_if_changed(merge_generation_, live)) return;  // none ended since
    std::vector<std::uint32_t> tids(live.begin(), live.end());
    std::sort(tids.begin(), tids.end());
    config_.store->merge_ended_threads(tids);
    // Their names too: their samples are thread 0's now, and names() reads the live threads' again.
    config_.threads->clear_names();
  }

  // SELFPROF_FRAME_HZ on threads that started marking game frames; true while such a rate is set.
  bool boost_game_frame_threads() {
    const double hz = config_.store->game_frame_hz();
    for (std::uint32_t tid : config_.store->to_boost()) {
      status st = config_.threads->set_thread_rate(static_cast<pid_t>(tid), hz);
      if (st.code() == EAGAIN) continue;  // not armed yet: at the next wake
      if (!st)
        config_.session->note("SELFPROF_FRAME_HZ not applied to thread " + std::to_string(tid) + ": " +
                              st.message());
      config_.store->boost_tried(tid, static_cast<bool>(st));  // tried once either way
    }
    return hz != config_.sources.hz;
  }

  // The ring source's switch to the kernel's user chain, and its giving the chain up, said once each in
  // the profile: the samples before the switch that lost their outer frames are why some stacks carry
  // [truncated].
  void note_user_chain(const pulled_counts& p) {
    const std::uint64_t cut = p.chain_cut.load(std::memory_order_relaxed);
    const bool given_back = p.chain_given_back.load(std::memory_order_relaxed);
    // cut 0: asked for from the start, or never
    if (!chain_noted_ && cut > 0 &&
        (p.user_chain_since_ns.load(std::memory_order_relaxed) != 0 || given_back)) {
      chain_noted_ = true;
      config_.session->note("ring source: " + chain_asked_note(cut), true);
    }
    if (!given_back_noted_ && given_back) {
      given_back_noted_ = true;
      config_.session->note("ring source: " + chain_given_back_note(), true);
    }
  }

  void check_contention(std::chrono::steady_clock::time_point now) {
    double share = 0;
    if (!contention_.check(config_.store->samples_by_thread(), now, share)) return;
    char why[160];
    std::snprintf(why, sizeof why, "sampled threads waited for a CPU %.0f%% of their run time", 100 * share);
    std::string why_not;
    std::unique_ptr<tick_source> perf = open_upgrade_source(config_.sources, why_not);
    if (!perf) {
      config_.session->note(std::string(why) +
                            ": CPU timers may alias with the tick; no perf_event with kernel time to switch "
                            "to (" +
                            why_not + ")");
      return;
    }
    source_info s;
    s.kind = perf->kind();
    s.detail = perf->describe();
    s.effective_hz = perf->effective_hz();
    s.kernel_time = perf->counts_kernel_time();
    s.reason = std::string("switched from the CPU timer: ") + why +
               ", so CPU timers would sample on the tick lattice (aliasing); perf_event has an exact period";
    thread_registry::switch_result r = config_.threads->switch_primary(std::move(perf));
    config_.store->forget_boosted();  // boosted threads are boosted again on the new source
    config_.session->set_source(s);
    config_.session->note("switched to " + s.detail + " (" + why + "); " + std::to_string(r.moved) +
                          " threads moved" +
                          (r.kept ? ", " + std::to_string(r.kept) + " kept their timer" : ""));
  }

  collector_config config_;
  worker worker_;
  contention_monitor contention_;
  int task_dir_fd_ = -1;  // /proc/self/task (handler_globals::task_dir_fd)
  std::uint64_t listed_generation_ = ~std::uint64_t(0);
  std::vector<pid_t> listed_;
  std::uint64_t merge_generation_ = ~std::uint64_t(0);  // the thread list last merged against
  std::atomic<std::uint64_t> wakes_{0};
  std::mutex pull_mu_;  // pull_now()'s requests and this thread's answers
  std::condition_variable pull_cv_;
  std::uint64_t pull_asked_ = 0, pull_done_ = 0;
  bool pulling_ = false;
  bool chain_noted_ = false, given_back_noted_ = false;   // note_user_chain() said them (collector thread)
  bool rows_failed_ = false;                              // collector thread only
  std::uint64_t pending_generation_ = ~std::uint64_t{0};  // of the pending rows the store was given
  std::vector<pending_code> pending_rows_;  // those rows: this thread's copy, read without the store's lock
  ring_rows ring_rows_{*this};
};

}  // namespace detail
}  // namespace selfprof
