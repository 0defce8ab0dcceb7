// The thread registry: every live thread of the process (found in /proc/self/task or registered by the
// thread itself), armed with the primary tick source or, where that runs out of descriptors or memory,
// with a fallback CPU timer; the names of every thread seen; and the move of every thread to a new
// primary source (the contention upgrade, sources/contention.hpp).
// Context: setup only and the collector thread; register_current() on the registering thread, names() and
// blocking() on a thread taking a snapshot or stats, and scan() there too when a snapshot comes before the
// collector's first scan (scanned()). Every method takes the registry's own lock.
//
// A thread is (tid, start time) (detail/task_start_time): a tid is reused once its thread has exited. A
// record whose tid now shows another start time belongs to a dead thread: it is dropped (its source
// disarmed) and the new thread armed. Known threads are re-checked kVerifyPerScan per scan, round robin
// (one /proc read each: all of them at every scan would cost ~70 ms at 10,000 threads).
// Arming a thread that is not the caller is checked: a perf_event is opened and its signal owner set
// (F_SETOWN_EX F_OWNER_TID) by tid, which may by then name a thread of another process; so the start time
// is re-read just before and just after the arm, and the event is closed at once when the thread is no
// longer the one recorded. perf_event_source::arm also checks, while the event is still disabled, that the
// tid is a thread of this process (the event and its signal owner are bound to the task, not the number),
// so no window remains where another process's thread gets a tick. A CPU timer (SIGEV_THREAD_ID on a thread
// CPU clock) cannot target another process's thread (the kernel refuses with EINVAL), so timers are not
// checked: at worst one lands on a new thread of this process that reused the tid (sampled correctly; the
// record is fixed at a re-check). /proc is read outside the lock (names, masks, start times); the lock covers
// the records and the sources, so register_current() never waits for a snapshot reading 10,000 threads'
// names.
#pragma once

#include <pthread.h>
#include <signal.h>
#include <sys/types.h>
#include <time.h>

#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include "selfprof/detail/high_fd.hpp"
#include "selfprof/detail/process.hpp"
#include "selfprof/signal/raw_syscall.hpp"
#include "selfprof/sources/cpu_timer.hpp"
#include "selfprof/sources/source.hpp"

namespace selfprof {
namespace detail {

// Known threads whose identity (start time) each scan re-reads.
constexpr std::size_t kVerifyPerScan = 512;

// What armed a thread.
enum class armed_by : std::uint8_t { none, primary, fallback };

// Arming counts, for stats.
struct thread_counts {
  std::size_t seen = 0, armed = 0, fallback = 0, arm_failed = 0;
};

// The threads of a session and the sources that arm them: the primary one and the fallback CPU timer,
// opened when the primary first runs out of resources.
class thread_registry {
 public:
  // Starts a session: forgets every thread, takes `primary` (nullptr: nothing to arm, as in wall mode
  // without on-CPU ticks). `sample_signal` is what register_current() unblocks.
  void begin(std::unique_ptr<tick_source> primary, const source_config& config) {
    std::lock_guard<std::mutex> lock(mu_);
    threads_.clear();
    primary_ = std::move(primary);
    fallback_.reset();
    config_ = config;
    counts_ = thread_counts{};
    scanned_ = false;
    notes_.clear();
    fds_low_before_ = fds_in_app_range();
    fds_low_noted_ = false;
    ++generation_;
  }

  // Ends the session: disarms every thread and closes the sources. The names stay for the profile.
  void end() {
    std::lock_guard<std::mutex> lock(mu_);
    if (primary_) primary_->close();
    if (fallback_) fallback_->close();
    primary_.reset();
    fallback_.reset();
    for (auto& t : threads_) t.second.by = armed_by::none;
    counts_.armed = 0;
  }

  // Compares /proc/self/task with the known threads: arms the new ones (except `own`, selfprof's
  // threads), forgets the gone ones and those whose tid another thread now has, reads names a thread may
  // have set just after it started. /proc is read outside the lock (see the top of the file).
  void scan(const std::vector<pid_t>& own) {
    std::vector<pid_t> live = list_threads();
    std::vector<probe> plan;
    std::vector<std::pair<pid_t, std::uint64_t>> gone;
    bool arming = false;
    int sig = 0;
    {
      std::lock_guard<std::mutex> lock(mu_);
      arming = primary_ && primary_->per_thread();
      sig = config_.signal_number;
      std::unordered_set<pid_t> seen(live.begin(), live.end());
      for (auto& t : threads_)
        if (!seen.count(t.first)) gone.emplace_back(t.first, t.second.start);
      const std::size_t n = live.size();
      std::size_t budget = kVerifyPerScan, next_from = 0;
      for (std::size_t i = 0; i < n; ++i) {
        const pid_t tid = live[(i + verify_from_) % n];
        bool ours = false;
        for (pid_t o : own) ours = ours || o == tid;
        if (ours) continue;
        probe p;
        p.tid = tid;
        auto known = threads_.find(tid);
        if (known == threads_.end()) {
          p.read_start = p.read_name = true;
          p.read_blocked = arming;
        } else {
          p.known_start = known->second.start;
          p.read_start = budget > 0;  // its identity, re-read round robin
          if (budget > 0 && --budget == 0) next_from = (verify_from_ + i + 1) % n;
          p.read_name = known->second.name_checks < 2;  // threads usually name themselves right after start
          p.read_blocked = arming && known->second.blocked;
          if (!p.read_start && !p.read_name && !p.read_blocked) continue;
        }
        plan.push_back(std::move(p));
      }
      verify_from_ = next_from;
    }
    for (probe& p : plan) read_probe(p, arming, sig);
    for (auto& g : gone)  // still there: it registered itself after the listing
      if (g.second != 0 && task_start_time(g.first) == g.second) g.second = 0;
    std::lock_guard<std::mutex> lock(mu_);
    for (auto& g : gone) {
      auto it = threads_.find(g.first);
      if (it != threads_.end() && g.second != 0 && it->second.start == g.second) drop_locked(it);
    }
    for (probe& p : plan) merge_locked(p);
    scanned_ = true;
  }

  // Whether scan() ran since begin(). A source that arms nothing leaves the first scan to the collector's
  // first wake (a process that ends before then never pays for it), so a snapshot taken earlier scans first.
  bool scanned() {
    std::lock_guard<std::mutex> lock(mu_);
    return scanned_;
  }

  // The calling thread arms itself now (instead of at the next scan); with `unblock`, it first unblocks
  // the sampling signal (selfprof::register_thread(), an explicit request). Without, a thread that blocks
  // it stays unarmed (see add_locked). A record of its tid with another start time is a dead thread's.
  status register_current(int sample_signal, bool unblock = true) {
    if (sample_signal > 0 && unblock) {
      sigset_t set;
      sigemptyset(&set);
      sigaddset(&set, sample_signal);
      pthread_sigmask(SIG_UNBLOCK, &set, nullptr);
    }
    const pid_t tid = static_cast<pid_t>(raw_gettid());
    probe p;
    p.tid = tid;
    p.start = task_start_time(tid);
    p.read_start = p.read_name = true;
    p.name = thread_name(tid);
    sigset_t mask;
    sigemptyset(&mask);
    pthread_sigmask(SIG_BLOCK, nullptr, &mask);
    std::lock_guard<std::mutex> lock(mu_);
    const int sig = config_.signal_number;
    p.read_blocked = true;
    p.blocked = sig > 0 && sigismember(&mask, sig) == 1;  // its own mask, which only it changes
    auto known = threads_.find(tid);
    if (known != threads_.end() && (p.start == 0 || known->second.start == p.start)) {
      if (known->second.blocked && !p.blocked) {  // register_thread() unblocked it
        known->second.blocked = false;
        if (primary_ && primary_->per_thread()) arm_locked(tid, known->second, true);
      }
      return status::ok();
    }
    if (known != threads_.end()) drop_locked(known);  // the tid's previous thread exited
    add_locked(p, true);
    return status::ok();
  }

  // The threads known now, when they changed since `generation` (updated); false when unchanged.
  bool list_if_changed(std::uint64_t& generation, std::vector<pid_t>& out) {
    std::lock_guard<std::mutex> lock(mu_);
    if (generation == generation_) return false;
    generation = generation_;
    out.clear();
    for (auto& t : threads_) out.push_back(t.first);
    return true;
  }

  // Names of every thread seen in this session, live or not, re-read for live threads (once per call,
  // outside the lock: a thread registering meanwhile does not wait); `reread` false right after a scan().
  std::unordered_map<std::uint32_t, std::string> names(bool reread = true) {
    if (!reread) {  // a scan() just read them
      std::lock_guard<std::mutex> lock(mu_);
      return names_;
    }
    std::vector<std::pair<pid_t, std::uint64_t>> live;
    {
      std::lock_guard<std::mutex> lock(mu_);
      live.reserve(threads_.size());
      for (auto& t : threads_) live.emplace_back(t.first, t.second.start);
    }
    std::vector<std::string> read(live.size());
    for (std::size_t i = 0; i < live.size(); ++i) read[i] = thread_name(live[i].first);
    std::lock_guard<std::mutex> lock(mu_);
    for (std::size_t i = 0; i < live.size(); ++i) {
      auto it = threads_.find(live[i].first);
      if (it == threads_.end() || it->second.start != live[i].second || read[i].empty()) continue;
      it->second.name = names_[static_cast<std::uint32_t>(it->first)] = read[i];
    }
    return names_;
  }

  // Live threads that block `sig`, so never receive a tick (their masks are read outside the lock).
  std::size_t blocking(int sig) {
    std::vector<pid_t> live;
    {
      std::lock_guard<std::mutex> lock(mu_);
      live.reserve(threads_.size());
      for (auto& t : threads_) live.push_back(t.first);
    }
    std::size_t n = 0;
    for (pid_t tid : live)
      if (thread_blocks_signal(tid, sig)) ++n;
    return n;
  }

  // SELFPROF_FRAME_HZ: samples one thread at `hz`, through whichever source armed it.
  status set_thread_rate(pid_t tid, double hz) {
    std::lock_guard<std::mutex> lock(mu_);
    // A source that covers every thread itself (the ring) arms none one by one.
    if (primary_ && !primary_->per_thread()) return primary_->set_thread_rate(tid, hz);
    auto it = threads_.find(tid);
    if (it == threads_.end() || it->second.by == armed_by::none)
      return status::error("thread " + std::to_string(tid) + " is not armed yet", EAGAIN);
    tick_source* src = it->second.by == armed_by::primary ? primary_.get() : fallback_.get();
    return src ? src->set_thread_rate(tid, hz) : status::error("no source");
  }

  struct switch_result {
    std::size_t moved = 0, kept = 0;
  };
  // Moves every thread armed by the primary source to `next`, which becomes the primary; a thread `next`
  // cannot arm keeps the old primary as its fallback. The old primary is the fallback afterwards.
  switch_result switch_primary(std::unique_ptr<tick_source> next) {
    std::lock_guard<std::mutex> lock(mu_);
    switch_result r;
    if (!primary_) return r;  // the session's sources were closed (end()): nothing to move
    std::unique_ptr<tick_source> old = std::move(primary_);
    primary_ = std::move(next);
    for (auto& t : threads_) {
      if (t.second.by != armed_by::primary) continue;
      old->disarm(t.first);
      if (arm_checked(*primary_, t.first, t.second.start, false)) {
        ++r.moved;
      } else if (arm_checked(*old, t.first, t.second.start,
                             false)) {  // out of descriptors, say: keeps its old source
        t.second.by = armed_by::fallback;
        ++r.kept;
      } else {
        t.second.by = armed_by::none;
        if (counts_.armed > 0) --counts_.armed;
      }
    }
    if (fallback_) fallback_->close();
    fallback_ = std::move(old);
    counts_.fallback += r.kept;
    return r;
  }

  tick_source* primary() const { return primary_.get(); }
  thread_counts counts() {
    std::lock_guard<std::mutex> lock(mu_);
    return counts_;
  }
  // Remarks made while arming (a fallback opened; selfprof's fds left in the application's range, see
  // detail/high_fd.hpp), taken once.
  std::vector<std::string> take_notes() {
    std::lock_guard<std::mutex> lock(mu_);
    const std::uint64_t low = fds_in_app_range() - fds_low_before_;
    if (low > 0 && !fds_low_noted_) {
      fds_low_noted_ = true;
      notes_.push_back(fds_in_app_range_note(low));
    }
    std::vector<std::string> out;
    out.swap(notes_);
    return out;
  }

  // Forgets the names of the last session.
  void clear_names() {
    std::lock_guard<std::mutex> lock(mu_);
    names_.clear();
  }

  // fork(2) child: the threads and the sources' kernel objects are the parent's; forget them without
  // touching them (the sources' objects are leaked on purpose: their destructors would disarm the parent).
  void abandon_after_fork() {
    new (&mu_) std::mutex();
    if (primary_) primary_->abandon_after_fork();
    if (fallback_) fallback_->abandon_after_fork();
    primary_.release();
    fallback_.release();
    threads_.clear();
    names_.clear();
    counts_ = thread_counts{};
    verify_from_ = 0;
  }

  std::mutex& lock_for_fork() { return mu_; }

 private:
  struct thread_rec {
    std::uint64_t start = 0;  // start time (task_start_time): with the tid, which thread this is
    std::string name;
    armed_by by = armed_by::none;
    int name_checks = 0;
    bool blocked = false;  // not armed: it blocked the sampling signal when last looked at
  };

  // What scan() reads of one thread outside the lock, and merges under it.
  struct probe {
    pid_t tid = 0;
    std::uint64_t known_start = 0;  // the record's start time when planned; 0: a new tid
    std::uint64_t start = 0;        // read (or, when not read, known_start); 0: gone
    bool read_start = false, read_name = false, read_blocked = false;
    std::string name;
    bool blocked = true;  // until read: an unread mask counts as blocked (not armed, looked at again)
  };

  static void read_probe(probe& p, bool arming, int sig) {
    if (p.read_start) {
      p.start = task_start_time(p.tid);
      if (p.start == 0) return;                              // exited since the listing
      if (p.known_start != 0 && p.start != p.known_start) {  // another thread has the tid now
        p.read_name = true;
        p.read_blocked = arming;
      }
    } else {
      p.start = p.known_start;
    }
    if (p.read_name) p.name = thread_name(p.tid);
    if (p.read_blocked) p.blocked = blocks_sample_signal(p.tid, sig);
  }

  void merge_locked(probe& p) {
    if (p.start == 0) return;
    auto known = threads_.find(p.tid);
    const std::uint64_t recorded = known == threads_.end() ? 0 : known->second.start;
    if (recorded != p.known_start) return;  // changed since planned (register_current): newer than this
    if (known != threads_.end() && p.start != recorded) {  // the recorded thread is dead, its tid reused
      drop_locked(known);
      known = threads_.end();
    }
    if (known == threads_.end()) {
      add_locked(p, false);
      return;
    }
    thread_rec& rec = known->second;
    if (p.read_name) {
      ++rec.name_checks;
      if (!p.name.empty()) rec.name = names_[static_cast<std::uint32_t>(p.tid)] = p.name;
    }
    if (p.read_blocked && rec.blocked && !p.blocked) {  // it unblocked the signal since
      rec.blocked = false;
      if (primary_ && primary_->per_thread()) arm_locked(p.tid, rec, false);
    }
  }

  // True when `tid` blocks signal `sig`. A thread being created runs with every signal blocked for a
  // moment (glibc's pthread_create), so a blocked answer is confirmed over about a millisecond.
  static bool blocks_sample_signal(pid_t tid, int sig) {
    if (sig <= 0) return false;
    for (int look = 0; look < 4; ++look) {
      // An unreadable mask (a thread still being set up) counts as blocked: looked at again at the next scan.
      const std::string status = task_file(tid, "status");
      const std::size_t at = status.find("SigBlk:");
      if (at != std::string::npos &&
          ((std::strtoull(status.c_str() + at + 7, nullptr, 16) >> (sig - 1)) & 1) == 0)
        return false;
      struct timespec pause {
        0, 300 * 1000
      };
      ::nanosleep(&pause, nullptr);
    }
    return true;
  }

  // A thread that blocks the sampling signal is not armed: its ticks would stay pending, and a sigwait()
  // or signalfd of the program's own would receive them as its own signal. `self`: the calling thread.
  void add_locked(const probe& p, bool self) {
    thread_rec rec;
    rec.start = p.start;
    rec.name = p.name;
    if (primary_ && primary_->per_thread()) {
      rec.blocked = !p.read_blocked || p.blocked;
      if (!rec.blocked) arm_locked(p.tid, rec, self);
    }
    names_[static_cast<std::uint32_t>(p.tid)] = rec.name;
    threads_.emplace(p.tid, std::move(rec));
    ++counts_.seen;
    ++generation_;
  }

  // Disarms and forgets a record (its thread exited).
  void drop_locked(std::unordered_map<pid_t, thread_rec>::iterator it) {
    disarm_locked(it->first, it->second);
    threads_.erase(it);
    ++generation_;
  }

  // Arms `tid` with `src`. Unless it is the calling thread (`self`: alive throughout), a source that can
  // reach another process's thread is checked before and after: `tid` must still be this process's thread
  // that started at `start`, else the arm is undone at once (see the top of the file).
  static status arm_checked(tick_source& src, pid_t tid, std::uint64_t start, bool self) {
    const bool check = !self && src.kind() != source_kind::timer;
    if (check && task_start_time(tid) != start)
      return status::error("thread " + std::to_string(tid) + " exited before it was armed", ESRCH);
    status st = src.arm(tid);
    if (st && check && task_start_time(tid) != start) {
      src.disarm(tid);
      return status::error("thread " + std::to_string(tid) + " exited while it was armed", ESRCH);
    }
    return st;
  }

  void arm_locked(pid_t tid, thread_rec& rec, bool self) {
    status st = arm_checked(*primary_, tid, rec.start, self);
    if (st) {
      rec.by = armed_by::primary;
      ++counts_.armed;
      return;
    }
    // One descriptor (or timer) per thread can run out: a CPU timer for this thread instead.
    const int e = st.code();
    if (primary_->kind() != source_kind::timer && (e == EMFILE || e == ENFILE || e == ENOMEM)) {
      if (!fallback_) {
        std::unique_ptr<tick_source> timer(new cpu_timer_source());
        if (timer->open(config_)) {
          fallback_ = std::move(timer);
          notes_.push_back(std::string("ran out of resources for ") + source_name(primary_->kind()) + " (" +
                           st.message() + "): CPU timers for the remaining threads");
        }
      }
      if (fallback_ && arm_checked(*fallback_, tid, rec.start, self)) {
        rec.by = armed_by::fallback;
        ++counts_.armed;
        ++counts_.fallback;
        return;
      }
    }
    ++counts_.arm_failed;  // typically the thread exited between the scan and the arm (ESRCH)
  }

  void disarm_locked(pid_t tid, thread_rec& rec) {
    if (rec.by == armed_by::primary && primary_) primary_->disarm(tid);
    if (rec.by == armed_by::fallback && fallback_) fallback_->disarm(tid);
    if (rec.by != armed_by::none && counts_.armed > 0) --counts_.armed;
    rec.by = armed_by::none;
  }

  std::mutex mu_;
  std::unique_ptr<tick_source> primary_, fallback_;
  source_config config_;
  std::unordered_map<pid_t, thread_rec> threads_;
  std::unordered_map<std::uint32_t, std::string> names_;  // every thread seen, even exited ones
  std::uint64_t generation_ = 0;                          // changes whenever threads_ does
  std::size_t verify_from_ = 0;                           // where in the listing scan() re-checks from
  thread_counts counts_;
  std::vector<std::string> notes_;
  std::uint64_t fds_low_before_ = 0;  // fds_in_app_range() when the session began
  bool fds_low_noted_ = false;
  bool scanned_ = false;  // scan() ran since begin()
};

}  // namespace detail
}  // namespace selfprof
