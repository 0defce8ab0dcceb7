// The wall-clock sampler (SELFPROF_MODE=wall): every thread's time, running or not, without ever
// interrupting a blocking call.
// Context: its own thread ("selfprof-wall"); start/stop from setup only (the profiler core).
//
// Why no EINTR. A signal that arrives while a thread sleeps in poll, epoll_wait, select, nanosleep, a
// timed futex or a socket read with a timeout makes the call fail with EINTR even under SA_RESTART
// (signal(7)); a write may return short. So this mode never sends a signal to a thread that could be in
// the kernel:
//  - On-CPU stacks come from a per-thread perf_event task clock that counts *user* time only
//    (exclude_kernel). Its overflow is raised from the timer interrupt only when that interrupt landed in
//    user mode, and the signal is delivered on the way back to that same user code: the thread is never
//    inside a system call when it arrives. (A kernel-inclusive event, a CPU-time timer or an itimer can
//    all fire while the thread is in the kernel on its way to sleep; the sleep then sees the pending
//    signal and returns EINTR. Wall mode refuses them.)
//  - Off-CPU stacks are read from outside. This thread looks at up to kWallThreadsPerTick threads per
//    tick (round robin), each with one clock_gettime of its CPU clock. A thread whose CPU time has not
//    moved since the last look is still blocked where it was: the stack found then is counted again
//    (no other work). Otherwise /proc/self/task/<tid>/syscall says "running" or gives the system call,
//    sp and pc of a blocked thread (the kernel fills it only once the thread is off the CPU); the stack
//    above sp is copied with process_vm_readv (a short read, never a fault, if it goes away) and unwound
//    from the copy with the CFI rows the handler uses (unwind_stack_copy). The CPU clock is read again
//    after the copy: if it moved, the thread ran meanwhile and the copy is not used.
//  Without a user-only perf_event (perf_event_paranoid 3, seccomp, no fds) no signal is sent at all:
//  CPU time is still counted, from the CPU clocks, as `[running]` without a stack.
//
// Weights are microseconds of wall time. At each look the time since the previous look splits into the
// thread's CPU time (on-CPU samples, from the signals, stand for it) and the rest, which is off-CPU: it
// goes to where the thread is blocked now, to where it was blocked before when it has woken since, half
// to each when it was blocked at both looks and ran in between, and to `[off-cpu]` when it was running at
// both looks (it blocked and woke unseen, or waited for a CPU). Counted this way, a thread's samples add up
// to its wall time whatever the number of threads, only more coarsely placed when there are many.
#pragma once

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <mutex>
#include <new>
#include <unordered_map>
#include <vector>

#include "selfprof/detail/high_fd.hpp"
#include "selfprof/detail/process.hpp"
#include "selfprof/detail/worker.hpp"
#include "selfprof/signal/clock.hpp"
#include "selfprof/signal/raw_syscall.hpp"
#include "selfprof/signal/ring.hpp"
#include "selfprof/signal/unwind.hpp"
#include "selfprof/stats.hpp"
#include "selfprof/status.hpp"
#include "selfprof/unwind/copied_stack.hpp"
#include "selfprof/wall/task_state.hpp"

namespace selfprof {

namespace detail {

// Threads looked at per tick: bounds the sampler's cost whatever the number of threads (async-profiler
// signals 8 per tick; a look at an unchanged thread is one clock read, at a changed one a /proc read and
// a stack copy).
constexpr std::size_t kWallThreadsPerTick = 16;
// Bytes of a blocked thread's stack copied per look: deep enough for 128 typical frames.
constexpr std::size_t kWallStackCopy = 64 * 1024;
// /proc/self/task/<tid>/syscall fds kept open between looks (beyond this, opened per look).
constexpr std::size_t kWallCachedFds = 1024;
// A thread that was running at the last look and was off the CPU for less than 1/this of the time
// since is taken to be running still, without reading /proc (a busy thread costs one clock read).
constexpr std::uint64_t kWallBusyRatio = 20;

struct wall_config {
  double hz = 99;
  bool oncpu_signals = true;  // on-CPU time comes as signal samples (else counted here as [running])
  sample_ring* ring = nullptr;
  std::size_t threads_per_tick = kWallThreadsPerTick;
  const std::atomic<int>* wake_fd = nullptr;  // written when the ring is half full (the collector's eventfd)
};

class wall_sampler {
 public:
  wall_sampler() = default;
  wall_sampler(const wall_sampler&) = delete;
  wall_sampler& operator=(const wall_sampler&) = delete;
  ~wall_sampler() { stop(); }

  status start(const wall_config& cfg) {
    stop();
    cfg_ = cfg;
    if (cfg_.threads_per_tick == 0) cfg_.threads_per_tick = 1;
    task_dir_ = keep_fd_high(::open("/proc/self/task", O_RDONLY | O_DIRECTORY | O_CLOEXEC));
    if (task_dir_ < 0) return status::error("selfprof: wall mode needs /proc/self/task: " + errno_text());
    code_.refresh();
    states_.clear();
    cached_fds_ = 0;
    cache_high_ = true;
    order_.clear();
    {
      std::lock_guard<std::mutex> lock(list_mu_);
      listed_.clear();
      list_changed_ = true;
    }
    cursor_ = 0;
    pcs_.assign(cfg_.ring ? cfg_.ring->max_depth() : 128, 0);
    copy_.assign(kWallStackCopy, 0);
    reset_counters();
    status st = worker_.start("selfprof-wall", &wall_sampler::main, this);  // its tid is known from here on
    if (!st) {
      ::close(task_dir_);
      task_dir_ = -1;
    }
    return st;
  }

  void stop() {
    if (!worker_.running()) return;
    worker_.stop();
    ::close(task_dir_);
    task_dir_ = -1;
    for (auto& st : states_) close_fd(st.second);
    states_.clear();
  }

  // The threads to sample (not selfprof's own), given whenever the set changes.
  void set_threads(const std::vector<pid_t>& tids) {
    std::lock_guard<std::mutex> lock(list_mu_);
    listed_ = tids;
    list_changed_ = true;
  }

  // In a forked child: the thread does not exist there; forget it without joining.
  void abandon_after_fork() {
    if (worker_.running()) {
      if (task_dir_ >= 0) ::close(task_dir_);
      task_dir_ = -1;
      for (auto& st : states_) close_fd(st.second);  // this process's copies of the fds
      states_.clear();
    }
    worker_.abandon_after_fork();
    new (&list_mu_) std::mutex();
  }

  pid_t tid() const { return worker_.tid(); }

  wall_stats counters() const {
    wall_stats c;
    c.ticks = n_ticks_.load(std::memory_order_relaxed);
    c.looks = n_looks_.load(std::memory_order_relaxed);
    c.unchanged = n_unchanged_.load(std::memory_order_relaxed);
    c.proc_reads = n_proc_reads_.load(std::memory_order_relaxed);
    c.copies = n_copies_.load(std::memory_order_relaxed);
    c.raced = n_raced_.load(std::memory_order_relaxed);
    c.scanned = n_scanned_.load(std::memory_order_relaxed);
    c.deferred = n_deferred_.load(std::memory_order_relaxed);
    c.dropped = n_dropped_.load(std::memory_order_relaxed);
    c.offcpu_us = n_offcpu_us_.load(std::memory_order_relaxed);
    c.cpu_ns = n_cpu_ns_.load(std::memory_order_relaxed);
    return c;
  }

 private:
  struct thread_state {
    std::uint64_t last_ns = 0;   // CLOCK_MONOTONIC of the last look (0: never looked at)
    std::uint64_t last_cpu = 0;  // its CPU clock then
    std::uint64_t carry_ns = 0;  // off-CPU time below one microsecond, kept for the next record
    bool blocked = false;        // blocked at the last look; stack/flags say where
    std::uint16_t flags = 0;
    std::vector<std::uint64_t> stack;
    bool listed = true;
    int fd = -1;  // its /proc/self/task/<tid>/syscall, kept open
  };

  static std::string errno_text() { return std::strerror(errno); }

  void reset_counters() {
    for (auto* c : {&n_ticks_, &n_looks_, &n_unchanged_, &n_proc_reads_, &n_copies_, &n_raced_, &n_scanned_,
                    &n_deferred_, &n_dropped_, &n_offcpu_us_, &n_cpu_ns_})
      c->store(0, std::memory_order_relaxed);
  }
  static void bump(std::atomic<std::uint64_t>& c, std::uint64_t by = 1) {
    c.store(c.load(std::memory_order_relaxed) + by, std::memory_order_relaxed);  // one writer
  }

  static void main(void* self) { static_cast<wall_sampler*>(self)->loop(); }

  void loop() {
    const std::uint64_t period = static_cast<std::uint64_t>(1e9 / (cfg_.hz > 0 ? cfg_.hz : 99));
    std::uint64_t next = monotonic_ns() + period;
    std::uint64_t generation = loader_generation();
    for (;;) {
      std::uint64_t now = monotonic_ns();
      if (now < next) {
        if (!worker_.wait_ns(static_cast<std::int64_t>(next - now))) break;  // stop
        continue;
      }
      next += period;
      if (next < now) next = now + period;  // fell behind (suspended, overloaded): do not catch up
      bump(n_ticks_);
      std::uint64_t g = loader_generation();
      if (g != generation) {
        generation = g;
        code_.refresh();
      }
      tick(now);
      if (const std::uint64_t cpu = this_thread_cpu_ns()) n_cpu_ns_.store(cpu, std::memory_order_relaxed);
    }
  }

  void refresh_order() {
    {
      std::lock_guard<std::mutex> lock(list_mu_);
      if (!list_changed_) return;
      list_changed_ = false;
      order_ = listed_;
    }
    pid_t self = worker_.tid();
    order_.erase(std::remove(order_.begin(), order_.end(), self), order_.end());
    std::sort(order_.begin(), order_.end());
    for (auto& s : states_) s.second.listed = false;
    for (pid_t t : order_) states_[t].listed = true;
    for (auto it = states_.begin(); it != states_.end();) {
      if (it->second.listed) {
        ++it;
        continue;
      }
      close_fd(it->second);
      it = states_.erase(it);
    }
  }

  void tick(std::uint64_t now) {
    refresh_order();
    if (order_.empty()) return;
    std::size_t n = std::min(cfg_.threads_per_tick, order_.size());
    if (order_.size() > n) bump(n_deferred_, order_.size() - n);
    if (cursor_ >= order_.size()) cursor_ = 0;
    for (std::size_t i = 0; i < n; ++i) {
      pid_t tid = order_[(cursor_ + i) % order_.size()];
      look(tid, states_[tid], now);
    }
    cursor_ = (cursor_ + n) % order_.size();
  }

  void look(pid_t tid, thread_state& st, std::uint64_t now) {
    bump(n_looks_);
    std::uint64_t cpu = 0;
    if (!thread_cpu_ns(tid, cpu)) return;  // gone; dropped at the next list refresh
    const bool first = st.last_ns == 0;
    const std::uint64_t wall = first || now < st.last_ns ? 0 : now - st.last_ns;
    const std::uint64_t ran = cpu >= st.last_cpu ? cpu - st.last_cpu : 0;
    const std::uint64_t off = first ? 0 : wall > ran ? wall - ran : 0;
    st.last_ns = now;
    st.last_cpu = cpu;
    if (!first && ran == 0 && st.blocked) {  // still where it was: count it again, nothing else to do
      bump(n_unchanged_);
      emit_offcpu(tid, st, st, off, now);
      return;
    }
    if (!first && ran > 0 && !cfg_.oncpu_signals) emit_running(tid, ran, now);
    if (!first && !st.blocked && off * kWallBusyRatio < wall) {  // busy: still running
      emit_offcpu(tid, st, unseen(), off, now);
      return;
    }
    bump(n_proc_reads_);
    task_syscall ts = read_syscall_file(tid, st);
    thread_state before;  // where it was blocked at the last look, if it was
    const bool was_blocked = st.blocked;
    if (was_blocked) {
      before.flags = st.flags;
      before.stack.swap(st.stack);
    }
    st.blocked = false;
    if (ts.kind == task_syscall::in_syscall || ts.kind == task_syscall::blocked_other)
      st.blocked = capture_blocked(tid, ts, cpu, st);
    if (first) return;
    if (st.blocked && was_blocked) {  // woke from one wait, ran, and waits again: half to each
      emit_offcpu(tid, st, before, off / 2, now);
      emit_offcpu(tid, st, st, off - off / 2, now);
    } else if (st.blocked) {
      emit_offcpu(tid, st, st, off, now);
    } else if (was_blocked) {
      emit_offcpu(tid, st, before, off, now);
    } else {
      emit_offcpu(tid, st, unseen(), off, now);
    }
  }

  void close_fd(thread_state& st) {
    if (st.fd >= 0) {
      ::close(st.fd);
      --cached_fds_;
    }
    st.fd = -1;
  }

  task_syscall read_syscall_file(pid_t tid, thread_state& st) {
    if (st.fd >= 0) return read_task_syscall(st.fd);
    int fd = open_task_syscall(task_dir_, tid);
    if (fd < 0) return task_syscall{};
    task_syscall ts = read_task_syscall(fd);
    // Kept only above the application's fds (detail/high_fd.hpp). Where there is no room, the files are
    // opened per look for the rest of the session instead: up to kWallCachedFds kept in the application's
    // range would shift its fds and could exhaust its limit.
    bool keep = cached_fds_ < kWallCachedFds && cache_high_;
    if (keep) {
      const fd_move m = move_fd_high(fd);
      fd = m.fd;
      keep = cache_high_ = m.place == fd_place::moved;
    }
    if (keep) {
      st.fd = fd;
      ++cached_fds_;
    } else {
      ::close(fd);
    }
    return ts;
  }

  // Where off-CPU time goes when the sampler did not see where: no stack, no call ([off-cpu]).
  static const thread_state& unseen() {
    static const thread_state where = [] {
      thread_state w;
      w.flags = sample_offcpu;
      return w;
    }();
    return where;
  }

  // Copies and unwinds the stack of a thread blocked at `ts`; false when it ran meanwhile.
  bool capture_blocked(pid_t tid, const task_syscall& ts, std::uint64_t cpu, thread_state& st) {
    std::size_t got = ts.sp ? copy_own_memory(ts.sp, copy_.data(), copy_.size()) : 0;
    std::uint64_t cpu_after = 0;
    if (!thread_cpu_ns(tid, cpu_after) || cpu_after != cpu) {
      bump(n_raced_);
      return false;
    }
    bump(n_copies_);
    stack_copy mem;
    mem.base = ts.sp;
    mem.data = copy_.data();
    mem.size = got;
    unwind_result u = unwind_stack_copy(g_unwind_tables.load(std::memory_order_acquire), ts.pc, mem, code_,
                                        pcs_.data(), pcs_.size());
    if (u.scanned) bump(n_scanned_);
    st.stack.assign(pcs_.begin(), pcs_.begin() + static_cast<std::ptrdiff_t>(u.depth));
    std::uint32_t call = ts.kind == task_syscall::in_syscall && ts.nr >= 0 && ts.nr < 0xFFE
                             ? static_cast<std::uint32_t>(ts.nr + 1)
                             : 0;
    st.flags = static_cast<std::uint16_t>(sample_offcpu | (u.truncated ? sample_truncated : 0) |
                                          (call << kSampleCallShift));
    return true;
  }

  void emit_offcpu(pid_t tid, thread_state& st, const thread_state& where, std::uint64_t off_ns,
                   std::uint64_t now) {
    st.carry_ns += off_ns;
    std::uint64_t us = st.carry_ns / 1000;
    if (us == 0) return;
    st.carry_ns -= us * 1000;
    if (us > 0xFFFFFFFFu) us = 0xFFFFFFFFu;
    bump(n_offcpu_us_, us);
    push(tid, where.stack.data(), where.stack.size(), where.flags, static_cast<std::uint32_t>(us), now);
  }

  void emit_running(pid_t tid, std::uint64_t ran_ns, std::uint64_t now) {
    std::uint64_t us = ran_ns / 1000;
    if (us == 0) return;
    if (us > 0xFFFFFFFFu) us = 0xFFFFFFFFu;
    push(tid, nullptr, 0, sample_running, static_cast<std::uint32_t>(us), now);
  }

  void push(pid_t tid, const std::uint64_t* pcs, std::size_t depth, std::uint16_t flags, std::uint32_t weight,
            std::uint64_t now) {
    sample_ring* ring = cfg_.ring;
    if (ring == nullptr) return;
    std::uint64_t pos = 0;
    ring_slot* slot = ring->claim(pos);
    if (slot == nullptr) {
      bump(n_dropped_);
      return;
    }
    if (depth > ring->max_depth()) depth = ring->max_depth();
    if (depth) std::memcpy(slot->pcs(), pcs, depth * sizeof(std::uint64_t));
    sample_header& h = slot->header;
    h.tid = static_cast<std::uint32_t>(tid);
    h.depth = static_cast<std::uint16_t>(depth);
    h.flags = flags;
    h.weight = weight;
    h.time_ns = now;
    h.tag = 0;
    sample_ring::publish(slot, pos);
    const std::uint64_t half = ring->capacity() / 2;
    const int fd = cfg_.wake_fd ? cfg_.wake_fd->load(std::memory_order_acquire) : -1;
    if (half != 0 && pos % half == half - 1 && fd >= 0) {
      const std::uint64_t one = 1;
      raw_syscall3(SYS_write, fd, reinterpret_cast<long>(&one), sizeof one);
    }
  }

  wall_config cfg_;
  worker worker_;  // "selfprof-wall"
  int task_dir_ = -1;
  std::size_t cached_fds_ = 0;
  bool cache_high_ = true;  // false once a syscall fd could not leave the application's range
  code_ranges code_;
  std::unordered_map<pid_t, thread_state> states_;
  std::vector<pid_t> order_;
  std::mutex list_mu_;  // listed_, list_changed_
  std::vector<pid_t> listed_;
  bool list_changed_ = false;
  std::size_t cursor_ = 0;
  std::vector<std::uint64_t> pcs_;
  std::vector<unsigned char> copy_;
  std::atomic<std::uint64_t> n_ticks_{0}, n_looks_{0}, n_unchanged_{0}, n_proc_reads_{0}, n_copies_{0},
      n_raced_{0}, n_scanned_{0}, n_deferred_{0}, n_dropped_{0}, n_offcpu_us_{0}, n_cpu_ns_{0};
};

}  // namespace detail
}  // namespace selfprof
