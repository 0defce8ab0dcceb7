// Signal-handler code: the profiling signal handler and the lock-free globals it reads.
// Context: signal handler (async-signal-safe only: no malloc, no locks, no lazy TLS, errno preserved).
#pragma once

#include <signal.h>
#include <sys/stat.h>
#include <ucontext.h>

#include <errno.h>
#include <time.h>
#include <atomic>
#include <cstddef>
#include <cstdint>

#include "selfprof/signal/altstack.hpp"
#include "selfprof/signal/arch_x86_64.hpp"
#include "selfprof/signal/clock.hpp"
#include "selfprof/signal/game_frames.hpp"
#include "selfprof/signal/raw_syscall.hpp"
#include "selfprof/signal/ring.hpp"
#include "selfprof/signal/unwind.hpp"

namespace selfprof {
namespace detail {

// The perf_event rate cap. A perf event is re-armed (PERF_EVENT_IOC_REFRESH) at the end of the handler,
// after the unwind: re-armed first, a handler slower than the period (deep stacks at 100 kHz) found the
// next overflow pending on return and ran again at once, starving the program. Re-armed last, the thread
// gets at least one period of its own between two ticks; on top of that, where the handler's average cost
// on a thread (plus the kernel's delivery, estimated) exceeds a ninth of the period, the handler stretches
// that thread's event period (PERF_EVENT_IOC_PERIOD) to kMinGapPerCost times the cost: the handler's share
// of the thread's CPU stays near 1 / (1 + kMinGapPerCost) whatever rate was asked for. The period goes back
// to the requested one when the cost falls. Ticks taken at a stretched period and the requested periods
// they skipped are counted (rate_capped, periods_skipped).
constexpr std::uint64_t kMinGapPerCost = 8;
constexpr std::uint64_t kSignalDeliveryNs = 2000;  // signal frame, xsave/xrstor and sigreturn (estimate)
constexpr int kPerfRateSlots = 4096;               // indexed by fd % kPerfRateSlots

// One perf fd's rate: what the source asked for and what the handler set. A second fd mapping to a taken
// slot (more than 4096 perf fds) is not capped.
struct perf_rate_slot {
  std::atomic<int> fd_plus1{0};           // the fd + 1 (0: free)
  std::atomic<std::uint32_t> base{0};     // requested: the period in ns, or the frequency in Hz (perf_freq)
  std::atomic<std::uint32_t> current{0};  // set by the handler (0: base)
  std::atomic<std::uint32_t> cost_ns{0};  // moving average of one tick's cost on this thread
};

// Everything the handler reads or counts. Constant-initialized: no constructor runs, so it is valid in
// any thread at any time, before main and after exit.
struct handler_globals {
  std::atomic<bool> active{false};  // samples are taken only while set
  std::atomic<int> in_flight{0};    // handlers running now (stop waits for zero)
  std::atomic<sample_ring*> ring{nullptr};
  std::atomic<int> signal_number{0};
  std::atomic<std::uint32_t> max_depth{0};
  std::atomic<std::uint32_t> main_tid{0};
  std::atomic<std::uintptr_t> main_stack_end{0};
  std::atomic<int> wake_fd{-1};             // the collector's eventfd: written when the ring is half full
  std::atomic<bool> weight_overruns{true};  // CPU timers: weight a sample by 1 + si_overrun
  // Thread births and deaths, seen from the samples: while ticks arrive, one handler in every
  // kThreadCheckNs fstat()s /proc/self/task (its link count is 2 + the number of threads) and wakes the
  // collector when the count differs from the one of its last scan. The collector then need not wake on
  // a short timer to find new threads (each wake-up costs CPU even when there is nothing to do).
  std::atomic<int> task_dir_fd{-1};                 // /proc/self/task, opened by the collector
  std::atomic<std::uint64_t> task_links{0};         // its link count when the collector last scanned
  std::atomic<std::uint64_t> next_thread_check{0};  // CLOCK_MONOTONIC ns of the next check (0: none)
  std::atomic<std::uint64_t> thread_checks{0};      // checks made (stats)
  std::atomic<std::uint64_t> thread_wakes{0};  // checks that found the count changed and woke the collector
  // Counters, read by the collector.
  std::atomic<std::uint64_t> taken{0};             // records written to the ring
  std::atomic<std::uint64_t> dropped_full{0};      // samples lost because the ring was full
  std::atomic<std::uint64_t> dropped_inactive{0};  // ticks that arrived while stopping
  std::atomic<std::uint64_t> foreign{0};           // signals sent by kill/tgkill/sigqueue, ignored
  std::atomic<std::uint64_t> truncated{0};         // samples cut at max_depth
  // perf_event fds opened by selfprof (one bit per fd below kPerfFdBits): their overflow disables the
  // event (PERF_EVENT_IOC_REFRESH 1) and the handler re-arms it after sampling.
  static constexpr int kPerfFdBits = 65536;
  std::atomic<std::uint64_t> perf_fds[kPerfFdBits / 64]{};
  // The rate cap (see kMinGapPerCost).
  std::atomic<bool> perf_freq{false};             // perf_rate_slot values are frequencies (cycles, freq=1)
  std::atomic<std::uint64_t> rate_capped{0};      // perf ticks taken while their period was stretched
  std::atomic<std::uint64_t> periods_skipped{0};  // requested periods left unsampled by the stretch
  std::atomic<std::uint64_t> period_changes{0};   // PERF_EVENT_IOC_PERIOD calls made by the handler
  perf_rate_slot perf_rates[kPerfRateSlots];
};

inline handler_globals g_handler;  // one per copy of selfprof (sources/signal_setup.hpp: two copies)

// The value CPU-timer signals carry in si_value, so they can be told from a foreign sigqueue().
inline void* timer_cookie() { return static_cast<void*>(&g_handler); }

// Is this delivery one of our ticks? The kernel's perf_event and itimer signals have si_code > 0;
// POSIX timers say SI_TIMER and carry our cookie; anything else was sent by someone (kill, tgkill).
inline bool is_our_tick(const siginfo_t* info) {
  if (info == nullptr) return false;
  if (info->si_code > 0) return true;
  return info->si_code == SI_TIMER && info->si_value.sival_ptr == timer_cookie();
}

// PERF_EVENT_IOC_REFRESH from <linux/perf_event.h>: _IO('$', 2).
constexpr unsigned long kPerfIocRefresh = 0x2402;
constexpr int kPollHup = 6;  // si_code of a perf_event signal whose event_limit ran out (POLL_HUP)

inline bool owns_perf_fd(handler_globals& g, int fd) {
  if (fd < 0 || fd >= handler_globals::kPerfFdBits) return false;
  return (g.perf_fds[fd / 64].load(std::memory_order_acquire) >> (fd % 64)) & 1u;
}

// PERF_EVENT_IOC_PERIOD: _IOW('$', 4, __u64).
constexpr unsigned long kPerfIocPeriod = 0x40082404;

// Source side (collector): `fd` was asked for rate `base` (ns period, or Hz in freq mode); 0 forgets it.
inline void perf_rate_track(handler_globals& g, int fd, std::uint64_t base) {
  if (fd < 0) return;
  perf_rate_slot& r = g.perf_rates[fd % kPerfRateSlots];
  const int mine = fd + 1;
  int now = r.fd_plus1.load(std::memory_order_acquire);
  if (base == 0) {
    if (now == mine) r.fd_plus1.store(0, std::memory_order_release);
    return;
  }
  if (now != mine && (now != 0 || !r.fd_plus1.compare_exchange_strong(now, mine))) return;  // taken
  r.base.store(static_cast<std::uint32_t>(base > 0xffffffffu ? 0xffffffffu : base),
               std::memory_order_relaxed);
  r.current.store(0, std::memory_order_relaxed);
  r.cost_ns.store(0, std::memory_order_relaxed);
}

// The gap in ns between ticks that a rate value stands for.
inline std::uint64_t rate_gap_ns(std::uint64_t value, bool freq) {
  if (!freq) return value;
  return value == 0 ? 1000000000u : 1000000000u / value;
}

// Ends a perf tick that started at `start_ns`: updates the thread's cost, stretches or restores its period
// (see kMinGapPerCost), then re-arms the event, last, so the next period starts counting now.
inline void rearm_perf_event(handler_globals& g, int fd, std::uint64_t start_ns) {
  perf_rate_slot& r = g.perf_rates[fd % kPerfRateSlots];
  const std::uint32_t base = r.base.load(std::memory_order_relaxed);
  if (r.fd_plus1.load(std::memory_order_acquire) == fd + 1 && base != 0) {
    std::uint64_t cost = monotonic_ns() - start_ns + kSignalDeliveryNs;
    const std::uint32_t avg_was = r.cost_ns.load(std::memory_order_relaxed);
    // One preempted handler says little about the cost: a tick moves the average by at most 4x its value.
    if (avg_was != 0 && cost > std::uint64_t(avg_was) * 4) cost = std::uint64_t(avg_was) * 4;
    if (cost > 100000000u) cost = 100000000u;
    const std::uint64_t avg = avg_was == 0 ? cost : (std::uint64_t(avg_was) * 7 + cost) / 8;
    r.cost_ns.store(static_cast<std::uint32_t>(avg), std::memory_order_relaxed);
    const bool freq = g.perf_freq.load(std::memory_order_relaxed);
    std::uint32_t cur = r.current.load(std::memory_order_relaxed);
    if (cur == 0) cur = base;
    const std::uint64_t base_gap = rate_gap_ns(base, freq), cur_gap = rate_gap_ns(cur, freq);
    const std::uint64_t min_gap = avg * kMinGapPerCost;
    std::uint64_t want = 0;  // a new rate value, 0: keep
    if (min_gap > base_gap) {
      // Stretch, or follow the cost when it moved by more than an eighth (an ioctl per change, not per tick).
      if (min_gap > cur_gap + cur_gap / 8 || min_gap + min_gap / 8 < cur_gap)
        want = freq ? (1000000000u / min_gap > 0 ? 1000000000u / min_gap : 1) : min_gap;
    } else if (cur != base && min_gap <= base_gap - base_gap / 8) {
      want = base;  // cheap again: the requested rate
    }
    if (want != 0 && want <= 0xffffffffu) {
      std::uint64_t value = want;
      if (raw_syscall3(SYS_ioctl, fd, static_cast<long>(kPerfIocPeriod), reinterpret_cast<long>(&value)) ==
          0) {
        cur = static_cast<std::uint32_t>(want);
        r.current.store(cur, std::memory_order_relaxed);
        g.period_changes.fetch_add(1, std::memory_order_relaxed);
      }
    }
    if (cur != base) {
      g.rate_capped.fetch_add(1, std::memory_order_relaxed);
      const std::uint64_t gap = rate_gap_ns(cur, freq);
      if (gap > base_gap) g.periods_skipped.fetch_add((gap - 1) / base_gap, std::memory_order_relaxed);
    }
  }
  raw_syscall3(SYS_ioctl, fd, static_cast<long>(kPerfIocRefresh), 1);
}

constexpr std::uint64_t kThreadCheckNs = 20000000;  // 20 ms: new threads are found within ~20 ms

// See handler_globals::task_dir_fd. One fstat of a kept fd (no path walk), at most once per 20 ms per
// process, whatever the number of threads and the rate.
inline void check_thread_count(handler_globals& g, std::uint64_t now_ns) {
  std::uint64_t due = g.next_thread_check.load(std::memory_order_relaxed);
  if (due == 0 || now_ns < due) return;
  if (!g.next_thread_check.compare_exchange_strong(due, now_ns + kThreadCheckNs, std::memory_order_relaxed))
    return;  // another thread's handler took this check
  const int dir = g.task_dir_fd.load(std::memory_order_acquire);
  const int wake = g.wake_fd.load(std::memory_order_acquire);
  if (dir < 0 || wake < 0) return;
  g.thread_checks.fetch_add(1, std::memory_order_relaxed);
  struct stat st;
  if (raw_syscall3(SYS_fstat, dir, reinterpret_cast<long>(&st), 0) != 0) return;
  if (static_cast<std::uint64_t>(st.st_nlink) == g.task_links.load(std::memory_order_relaxed)) return;
  const std::uint64_t one = 1;
  raw_syscall3(SYS_write, wake, reinterpret_cast<long>(&one), sizeof one);
  g.thread_wakes.fetch_add(1, std::memory_order_relaxed);
}

inline void sample_signal_handler(int, siginfo_t* info, void* context) {
  const int saved_errno = errno;
  handler_globals& g = g_handler;
  // seq_cst here and in stop(): the increment and the `active` load below pair with stop()'s store of
  // `active` and load of `in_flight` (each side stores, then loads the other's variable); only a total
  // order guarantees that either stop() sees this handler or this handler sees `active` false, on any CPU.
  g.in_flight.fetch_add(1, std::memory_order_seq_cst);
  int perf_fd = -1;  // a perf event to re-arm at the end (see kMinGapPerCost)
  std::uint64_t start_ns = 0;
  do {
    if (!is_our_tick(info)) {
      g.foreign.fetch_add(1, std::memory_order_relaxed);
      break;
    }
    if (!g.active.load(std::memory_order_seq_cst)) {
      g.dropped_inactive.fetch_add(1, std::memory_order_relaxed);
      break;
    }
    if (info->si_code == kPollHup && owns_perf_fd(g, info->si_fd)) {
      perf_fd = info->si_fd;
      start_ns = monotonic_ns();
    }
    if (context == nullptr) break;
    const frame_regs regs = context_regs(static_cast<const ucontext_t*>(context));
    altstack_on_tick(static_cast<ucontext_t*>(context),
                     regs.sp);  // a thread's first tick (signal/altstack.hpp)
    sample_ring* ring = g.ring.load(std::memory_order_acquire);
    if (ring == nullptr) break;
    std::uint64_t pos = 0;
    ring_slot* slot = ring->claim(pos);
    if (slot == nullptr) {
      g.dropped_full.fetch_add(1, std::memory_order_relaxed);
      break;
    }
    const std::uint32_t tid = raw_gettid();
    const bool is_main = tid == g.main_tid.load(std::memory_order_relaxed);
    const std::uintptr_t end =
        current_thread_stack_end(regs.sp, g.main_stack_end.load(std::memory_order_relaxed), is_main);
    const std::size_t max_depth = ring->max_depth();
    unwind_result u = unwind_interrupted(regs.pc, regs.sp, regs.fp, end, slot->pcs(),
                                         max_depth);  // CFI rows when published, else frame pointers

    sample_header& h = slot->header;
    h.tid = tid;
    h.depth = static_cast<std::uint16_t>(u.depth);
    h.flags = static_cast<std::uint16_t>((u.truncated ? sample_truncated : 0) |
                                         (u.leaf_fixed ? sample_leaf_fixed : 0));
    std::uint32_t weight = 1;
    if (info->si_code == SI_TIMER && info->si_overrun > 0 &&
        g.weight_overruns.load(std::memory_order_relaxed))
      weight += static_cast<std::uint32_t>(info->si_overrun);
    h.weight = weight;
    const std::uint64_t now_ns = monotonic_ns();
    h.time_ns = now_ns;
    h.tag = game_frame_tag_for(tid);  // the game frame this thread is in (0: it marks none)
    if (u.truncated) g.truncated.fetch_add(1, std::memory_order_relaxed);
    sample_ring::publish(slot, pos);
    check_thread_count(g, now_ns);
    // Every half ring of samples, wake the collector (while samples arrive it sleeps long).
    const std::uint64_t half = ring->capacity() / 2;
    if (half != 0 && pos % half == half - 1) {
      const int fd = g.wake_fd.load(std::memory_order_acquire);
      if (fd >= 0) {
        const std::uint64_t one = 1;
        raw_syscall3(SYS_write, fd, reinterpret_cast<long>(&one), sizeof one);
      }
    }
    g.taken.fetch_add(1, std::memory_order_relaxed);
  } while (false);
  if (perf_fd >= 0) rearm_perf_event(g, perf_fd, start_ns);  // last: see kMinGapPerCost
  g.in_flight.fetch_sub(1, std::memory_order_release);
  errno = saved_errno;
}

}  // namespace detail
}  // namespace selfprof
