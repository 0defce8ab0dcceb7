// The thread registry: every live thread of the process (found in /proc/self/task or registered by the
// thread itself), armed with the primary tick source or, where that runs out of descriptors or memory,
// with a fallback CPU timer; the names of every thread seen; and the move of every thread to a new
// primary source (the contention upgrade, sources/contention.hpp).
// Context: setup only and the collector thread; register_current() on the registering thread. Every
// method takes the registry's own lock.
#pragma once

#include <pthread.h>
#include <signal.h>
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
  // threads), forgets the gone ones, reads names a thread may have set just after it started.
  void scan(const std::vector<pid_t>& own) {
    const std::vector<pid_t> live = list_threads();
    std::lock_guard<std::mutex> lock(mu_);
    std::unordered_set<pid_t> seen(live.begin(), live.end());
    for (pid_t tid : live) {
      auto known = threads_.find(tid);
      if (known != threads_.end()) {
        if (known->second.blocked && !blocks_sample_signal(tid)) {  // it unblocked the signal since
          known->second.blocked = false;
          if (primary_ && primary_->per_thread()) arm_locked(tid, known->second);
        }
        if (known->second.name_checks < 2) {  // threads usually name themselves right after they start
          ++known->second.name_checks;
          std::string n = thread_name(tid);
          if (!n.empty()) known->second.name = names_[static_cast<std::uint32_t>(tid)] = n;
        }
        continue;
      }
      bool ours = false;
      for (pid_t o : own) ours = ours || o == tid;
      if (ours) continue;
      add_locked(tid);
    }
    for (auto it = threads_.begin(); it != threads_.end();) {
      if (seen.count(it->first)) {
        ++it;
        continue;
      }
      disarm_locked(it->first, it->second);
      it = threads_.erase(it);
      ++generation_;
    }
  }

  // The calling thread arms itself now (instead of at the next scan); with `unblock`, it first unblocks
  // the sampling signal (selfprof::register_thread(), an explicit request). Without, a thread that blocks
  // it stays unarmed (see add_locked).
  status register_current(int sample_signal, bool unblock = true) {
    if (sample_signal > 0 && unblock) {
      sigset_t set;
      sigemptyset(&set);
      sigaddset(&set, sample_signal);
      pthread_sigmask(SIG_UNBLOCK, &set, nullptr);
    }
    const pid_t tid = static_cast<pid_t>(raw_gettid());
    std::lock_guard<std::mutex> lock(mu_);
    auto known = threads_.find(tid);
    if (known == threads_.end()) {
      add_locked(tid);
    } else if (known->second.blocked && !blocks_sample_signal(tid)) {  // register_thread() unblocked it
      known->second.blocked = false;
      if (primary_ && primary_->per_thread()) arm_locked(tid, known->second);
    }
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

  // Names of every thread seen in this session, live or not, re-read for live threads.
  std::unordered_map<std::uint32_t, std::string> names() {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto& t : threads_) {
      std::string n = thread_name(t.first);
      if (!n.empty()) t.second.name = names_[static_cast<std::uint32_t>(t.first)] = n;
    }
    return names_;
  }

  // Live threads that block `sig`, so never receive a tick.
  std::size_t blocking(int sig) {
    std::lock_guard<std::mutex> lock(mu_);
    std::size_t n = 0;
    for (auto& t : threads_)
      if (thread_blocks_signal(t.first, sig)) ++n;
    return n;
  }

  // SELFPROF_FRAME_HZ: samples one thread at `hz`, through whichever source armed it.
  status set_thread_rate(pid_t tid, double hz) {
    std::lock_guard<std::mutex> lock(mu_);
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
      if (primary_->arm(t.first)) {
        ++r.moved;
      } else if (old->arm(t.first)) {  // out of descriptors, say: this thread keeps its old source
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
  }

  std::mutex& lock_for_fork() { return mu_; }

 private:
  struct thread_rec {
    std::string name;
    armed_by by = armed_by::none;
    int name_checks = 0;
    bool blocked = false;  // not armed: it blocked the sampling signal when last looked at
  };

  // True when `tid` blocks the sampling signal. A thread being created runs with every signal blocked
  // for a moment (glibc's pthread_create), so a blocked answer is confirmed over about a millisecond.
  bool blocks_sample_signal(pid_t tid) const {
    const int sig = config_.signal_number;
    if (sig <= 0) return false;
    for (int look = 0; look < 4; ++look) {
      // An unreadable mask (a thread still being set up) counts as blocked: looked at again at the next scan.
      const std::string status = read_small_file("/proc/self/task/" + std::to_string(tid) + "/status");
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
  // or signalfd of the program's own would receive them as its own signal.
  void add_locked(pid_t tid) {
    thread_rec rec;
    rec.name = thread_name(tid);
    if (primary_ && primary_->per_thread()) {
      rec.blocked = blocks_sample_signal(tid);
      if (!rec.blocked) arm_locked(tid, rec);
    }
    names_[static_cast<std::uint32_t>(tid)] = rec.name;
    threads_.emplace(tid, std::move(rec));
    ++counts_.seen;
    ++generation_;
  }

  void arm_locked(pid_t tid, thread_rec& rec) {
    status st = primary_->arm(tid);
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
      if (fallback_ && fallback_->arm(tid)) {
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
  thread_counts counts_;
  std::vector<std::string> notes_;
  std::uint64_t fds_low_before_ = 0;  // fds_in_app_range() when the session began
  bool fds_low_noted_ = false;
};

}  // namespace detail
}  // namespace selfprof
