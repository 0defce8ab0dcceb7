// Tick source without signals: perf_event sampling events whose samples the kernel writes into mmap'ed
// ring buffers, read by the collector thread. No signal is ever sent to an application thread.
// Context: setup only and the collector thread (collect() also from stop(), under the source's lock).
//
// Coverage. The kernel refuses mmap of an inherited per-task event opened on every CPU (cpu = -1), so
// each thread alive at open() gets one event per CPU (pid = tid, cpu = c), `inherit` + `inherit_thread`
// (threads it creates later carry a copy; fork children do not) + `remove_on_exec`. The first event of
// each CPU owns that CPU's ring; the others write into it (PERF_EVENT_IOC_SET_OUTPUT); inherited copies
// write into their parent's. Started from a single-threaded main: one event per CPU, and every later thread
// is the kernel's job, without /proc scans. selfprof's own threads inherit too: their samples are dropped by
// tid when read. The rings start small and grow once the program takes samples (kRingStartShare).
//
// A sample: TID, TIME (CLOCK_MONOTONIC), IP, CALLCHAIN (the kernel's chain), REGS_USER (bp, sp, ip) and
// STACK_USER (a copy of kStackCopyBytes above the user sp). The copy is unwound with the CFI rows the
// signal handler uses (signal/unwind.hpp); where the walk runs off the copy, it goes on over the thread's
// live stack while that still holds the sampled frames (live_stack_reader), else the kernel's user
// frame-pointer chain continues it from the frame where both agree, so deep frame-pointer stacks keep
// their full depth; a stack neither continues is marked truncated. The user chain is asked for only
// once stacks show they need it (kChainWantedSamples, the user chain switch). Where kernel sampling is
// permitted, the chain's kernel part comes first in the stored stack (kernel addresses, named from
// /proc/kallsyms when a profile is written: symbols/kernel_symbols.hpp).
#pragma once

#include <linux/perf_event.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <functional>
#include <mutex>
#include <string>
#include <vector>

#include "selfprof/detail/high_fd.hpp"
#include "selfprof/detail/process.hpp"
#include "selfprof/detail/stack_table.hpp"
#include "selfprof/detail/sys.hpp"
#include "selfprof/signal/clock.hpp"
#include "selfprof/signal/game_frames.hpp"
#include "selfprof/signal/ring.hpp"
#include "selfprof/signal/unwind.hpp"
#include "selfprof/sources/source.hpp"

namespace selfprof {
namespace detail {

// Bytes of user stack copied per sample (perf record --call-graph dwarf copies 8 KiB by default). Deeper
// frames come from the kernel's frame-pointer chain.
constexpr std::uint32_t kStackCopyBytes = 8192;
// Data pages per CPU ring tried in turn (powers of two, halved while the locked-memory budget refuses):
// at first room for kPerfRingSeconds of samples at the ring's rate (one CPU runs one thread at a time, so a
// CPU's ring fills at most at the rate), at most 512 pages (2 MiB, about 220 samples with their stack
// copies). The collector reads every quarter of that (collect_period_ms). 99 Hz asks for 64 pages (256
// KiB). An unprivileged user's budget (perf_event_mlock_kb, 516 KiB per CPU, then RLIMIT_MEMLOCK) is
// shared by all of that user's processes.
//
// Rings start at an eighth of that (at least kRingPagesMin) and grow at the first read that finds samples
// of the program (not selfprof's threads') kRingGrowAfterMs or more after open (never at stop): the kernel
// allocates, zeroes and maps every page at mmap, most short-lived processes take no sample at all, and one
// that lives a few tens of milliseconds is read often enough meanwhile. A ring cannot be resized, and
// pointing an event at another ring waits for an RCU grace period (10-12 ms each, on the collector), so
// growing opens a second set of events, on every thread of the process, writing into full-size rings. Both
// sets sample until the first is disabled; samples are kept by time, those of the first set before the switch
// and of the second after it, so no tick counts twice or goes missing. Threads that appear while the second
// set opens would carry only the first set's inherited events: then the second set is closed and growing
// tried again at a later read (at most kRingGrowTries times; the rings then stay small and are read more
// often).
constexpr unsigned kRingPagesMax = 512, kRingPagesMin = 8, kRingStartShare = 8, kRingGrowTries = 3;
constexpr unsigned kRingGrowAfterMs = 100;
// The user chain switch. The kernel's frame-pointer chain (PERF_SAMPLE_CALLCHAIN's user part) costs a
// sample about as much as the stack copy (bench/sample_parts.cpp), and the copy alone finishes most
// stacks: where it ends, the thread's live stack goes on while it still holds the sampled frames. So
// each event starts without the user chain, beside a disabled twin that asks for it (inherited alike,
// writing into the same ring). Once kChainWantedSamples samples ended at the copy's end with nothing to
// continue them but a frame-pointer chain on the live stack there (a frame-pointer recursion deeper
// than the copy that keeps leaving and re-entering its frames), every event hands over to its twin. The
// samples before that keep the [truncated] mark. If then fewer than a quarter of the next
// kChainTrialSamples such samples are continued by the chain (code without frame pointers whose rbp
// happened to look like one), the events hand back, for the rest of the run. Where the descriptor
// budget has no room for twins, the events ask for the chain from the start.
constexpr std::uint64_t kChainWantedSamples = 3, kChainTrialSamples = 16;
constexpr unsigned kChainFirstReadMs = 10;
// Modules whose rows one sample may have parsed before it is walked again (collect() with row_requests).
constexpr int kRowParsesPerSample = 4;
constexpr double kPerfRingSeconds = 0.2;
inline unsigned ring_pages_for(double hz, std::size_t page) {
  const double want = hz * kPerfRingSeconds * double(kStackCopyBytes + 1024) / double(page);
  unsigned pages = kRingPagesMin;
  while (pages < kRingPagesMax && double(pages) < want) pages *= 2;
  return pages;
}
// Events (threads alive at open() x CPUs) allowed: at most this many, and at most a quarter of the hard
// RLIMIT_NOFILE (selfprof's descriptors live above the soft limit, detail/high_fd.hpp): past that the
// source refuses, and a signal source samples instead.
constexpr std::size_t kMaxRingEvents = 4096;

// x86-64 perf register numbers (asm/perf_regs.h): bp, sp, ip, reported in this order.
constexpr std::uint64_t kRegBp = 6, kRegSp = 7, kRegIp = 8;

// The copied stack of a sample: the walker's copy policy, but the pc is an interrupted one (it may sit in
// a prologue) and rbp came with the registers.
struct sampled_stack : stack_copy {
  static constexpr bool kInterruptedPc = true;
  static constexpr bool kMayLackFp = false;
};

// What reading the rings found, for stats.
struct ring_counts {
  // lost: the kernel's PERF_RECORD_LOST counts, and records that could not be parsed (one each)
  std::uint64_t lost = 0, throttled = 0, full = 0;
  std::uint64_t stored = 0, truncated = 0;  // written into the sample ring; of them, cut short
  std::uint64_t overlap = 0;                // taken by both sets of events while the rings grew: kept once
};

// Copies `len` bytes at ring position `at` out of a ring's data area of `size` bytes (a power of two),
// across its end.
inline void ring_copy_out(const unsigned char* data, std::uint64_t size, std::uint64_t at, void* to,
                          std::size_t len) {
  const std::uint64_t off = at & (size - 1);
  const std::size_t first = static_cast<std::size_t>(std::min<std::uint64_t>(len, size - off));
  std::memcpy(to, data + off, first);
  if (first < len) std::memcpy(static_cast<unsigned char*>(to) + first, data, len - first);
}

// A bounded reader over one ring record's body.
struct ring_cursor {
  const unsigned char* p;
  std::size_t left;
  bool u64(std::uint64_t& v) {
    if (left < 8) return false;
    std::memcpy(&v, p, 8);
    p += 8;
    left -= 8;
    return true;
  }
  bool u32(std::uint32_t& v) {
    if (left < 4) return false;
    std::memcpy(&v, p, 4);
    p += 4;
    left -= 4;
    return true;
  }
  bool skip(std::uint64_t bytes) {
    if (bytes > left) return false;
    p += bytes;
    left -= static_cast<std::size_t>(bytes);
    return true;
  }
  // A NUL-terminated string padded to 8 bytes, within the record.
  bool text(std::string& out) {
    const void* nul = std::memchr(p, 0, left);
    if (nul == nullptr) return false;
    out.assign(reinterpret_cast<const char*>(p),
               static_cast<std::size_t>(static_cast<const unsigned char*>(nul) - p));
    return skip(std::min<std::size_t>(left, (out.size() + 8) & ~std::size_t(7)));
  }
};

// One PERF_RECORD_SAMPLE of the layout the ring events ask for: IP, TID, TIME, CALLCHAIN, REGS_USER (bp,
// sp, ip) and STACK_USER.
struct ring_sample {
  std::uint64_t ip = 0, pidtid = 0, time = 0;
  std::uint64_t abi = 0, bp = 0, sp = 0, uip = 0;  // abi PERF_SAMPLE_REGS_ABI_NONE: no user context
  const unsigned char* stack = nullptr;            // the user stack copy, `dyn` bytes of it valid
  std::uint64_t dyn = 0;
  std::uint32_t pid() const { return static_cast<std::uint32_t>(pidtid & 0xffffffffu); }
  std::uint32_t tid() const { return static_cast<std::uint32_t>(pidtid >> 32); }
};

// Reads a sample's body; the chain goes to `user` (after PERF_CONTEXT_USER) and, when `keep_kernel`, its
// kernel addresses to `kernel` (after PERF_CONTEXT_KERNEL, the interrupted kernel pc first). False when
// the record is malformed.
inline bool parse_ring_sample(ring_cursor c, bool keep_kernel, ring_sample& s,
                              std::vector<std::uint64_t>& user, std::vector<std::uint64_t>& kernel) {
  std::uint64_t nr = 0;
  if (!c.u64(s.ip) || !c.u64(s.pidtid) || !c.u64(s.time) || !c.u64(nr) || nr > c.left / 8) return false;
  const unsigned char* chain_at = c.p;
  c.skip(nr * 8);
  user.clear();
  kernel.clear();
  std::uint64_t context = 0;
  for (std::uint64_t i = 0; i < nr; ++i) {
    std::uint64_t v;
    std::memcpy(&v, chain_at + i * 8, 8);
    if (v >= PERF_CONTEXT_MAX) {
      context = v;
      continue;
    }
    if (context == PERF_CONTEXT_USER) user.push_back(v);
    if (context == PERF_CONTEXT_KERNEL && keep_kernel && is_kernel_address(v)) kernel.push_back(v);
  }
  std::uint64_t stack_size = 0;
  if (!c.u64(s.abi)) return false;
  if (s.abi != PERF_SAMPLE_REGS_ABI_NONE && !(c.u64(s.bp) && c.u64(s.sp) && c.u64(s.uip))) return false;
  if (!c.u64(stack_size) || stack_size > c.left) return false;
  s.stack = c.p;
  c.skip(stack_size);
  s.dyn = 0;
  if (stack_size > 0 && (!c.u64(s.dyn) || s.dyn > stack_size)) return false;
  return true;
}

// The sampled thread's stack as it is now, where a walk ran off its copy: a frame larger than the copy
// (a `main` with 6 KiB of locals and a few library frames under it) would otherwise end every stack
// there in code without frame pointers. `read` copies up to `len` bytes of the sampled process at `addr`
// into `out` and returns how many it copied (fewer where the memory ends; 0 when it cannot read: the
// thread or process is gone, or reading is not permitted). The stack has moved on since the sample, so
// the walk goes on only while the thread shows it is still inside the frame where the copy ended: the
// bytes the copy and the live stack share (at least kLiveVerifyBytes) agree, and the first return
// address read past the copy follows a direct call to that frame's function. A thread that returned
// from it and called something else, or a `main` that returned into `exit`, fails the second test even
// where its dead frame's bytes were left as they were. The frames above a live frame are older and
// live too. (A direct call into another function placed below that one within kMaxCallSpan passes as
// well: rare, and then mostly a newer call from the same caller.) Reads reach at most kLiveMaxBytes past
// the copy.
struct live_stack_reader {
  std::size_t (*read)(void* ctx, std::uintptr_t addr, void* out, std::size_t len) = nullptr;
  void* ctx = nullptr;
  std::vector<unsigned char> buffer;  // reused between samples (the collector's or recorder's thread)
  std::uint64_t continued = 0;        // walks that went on past their copy
};
constexpr std::size_t kLiveVerifyBytes = 64, kLiveFirstBytes = 4096, kLiveMaxBytes = 131072;
// A direct call's target lies at most this far below the pc of the function it called.
constexpr std::uintptr_t kMaxCallSpan = 1024 * 1024;

// Does return address `ra` follow a direct call (x86-64 `call rel32`) into the function holding `callee`?
inline bool called_directly(live_stack_reader& live, std::uintptr_t ra, std::uintptr_t callee) {
  unsigned char call[5];
  if (ra < kMinCodeAddress || live.read(live.ctx, ra - 5, call, 5) != 5 || call[0] != 0xe8) return false;
  std::int32_t rel;
  std::memcpy(&rel, call + 1, 4);
  const std::uintptr_t target = ra + static_cast<std::uintptr_t>(static_cast<std::intptr_t>(rel));
  return target <= callee && callee - target < kMaxCallSpan;
}

// Does return address `ra` follow a call instruction: `call rel32`, or `call` through a register or
// memory (opcode ff /2, 2 to 7 bytes with its ModRM and displacement)?
inline bool follows_call(live_stack_reader& live, std::uintptr_t ra) {
  unsigned char b[8];
  if (ra < kMinCodeAddress + 8 || live.read(live.ctx, ra - 8, b, 8) != 8) return false;
  if (b[3] == 0xe8) return true;
  for (int len = 2; len <= 7; ++len)
    if (b[8 - len] == 0xff && ((b[9 - len] >> 3) & 7) == 2) return true;
  return false;
}

// Does a frame-pointer chain go on at `fp` (a frame whose sp is `sp`) on the live stack: two frame
// records, each above the last within kLiveMaxBytes, each return address just after a call? Code
// without frame pointers that keeps a stack address in rbp seldom passes.
inline bool frame_chain_at(live_stack_reader& live, std::uintptr_t sp, std::uintptr_t fp) {
  std::uintptr_t low = sp;
  for (int k = 0; k < 2; ++k) {
    if (fp < low || fp - low >= kLiveMaxBytes || fp % 8 != 0) return false;
    std::uint64_t record[2];
    if (live.read(live.ctx, fp, record, sizeof record) != sizeof record || !follows_call(live, record[1]))
      return false;
    low = fp + sizeof record;
    fp = static_cast<std::uintptr_t>(record[0]);
  }
  return true;
}

// Where a sample's walk ran off its copy with nothing to go on (for the user chain switch).
struct copy_end {
  bool reached = false;      // the walk left the copy and the live stack did not continue it
  bool chain_would = false;  // ... without a user chain, and a frame-pointer chain goes on there
};

// The user chain switch's bookkeeping, for the ring source and the recorder (their readers' thread).
class chain_switch {
 public:
  enum class action { none, ask, give_back };
  // Events that ask for the chain from the start (no twins): nothing to switch.
  void start_on() { on_ = fixed_ = true; }
  bool on() const { return on_; }
  bool given_back() const { return given_back_; }
  std::uint64_t cut() const { return cut_; }  // samples cut where the chain would have gone on
  // The events handed over at `now_ns` (CLOCK_MONOTONIC): the trial counts samples taken since then only
  // (a ring may still hold older ones, taken without the chain).
  void handed_over(std::uint64_t now_ns) { since_ns_ = now_ns; }
  std::uint64_t handed_over_ns() const { return since_ns_; }  // 0: the events never handed over
  // One sample, taken at `time_ns`.
  void note(const copy_end& e, bool spliced, std::uint64_t time_ns) {
    if (!on_ && !given_back_ && e.chain_would) ++cut_;
    if (on_ && trial_ && e.reached && time_ns >= since_ns_) {
      ++trial_reached_;
      if (spliced) ++trial_spliced_;
    }
  }
  // After a read: what the events should do now; the caller does it.
  action due() {
    if (fixed_) return action::none;
    if (!on_ && !given_back_ && cut_ >= kChainWantedSamples) {
      on_ = trial_ = true;
      return action::ask;
    }
    if (on_ && trial_ && trial_reached_ >= kChainTrialSamples) {
      trial_ = false;
      if (trial_spliced_ * 4 < trial_reached_) {
        on_ = false;
        given_back_ = true;
        return action::give_back;
      }
    }
    return action::none;
  }

 private:
  bool on_ = false, fixed_ = false, trial_ = false, given_back_ = false;
  std::uint64_t cut_ = 0, trial_reached_ = 0, trial_spliced_ = 0, since_ns_ = 0;
};

// What a profile says of the switch: after `cut` stacks cut at the copy, the chain was asked for; and that
// it was given back. (The ring source's and the recorder's notes.)
inline std::string chain_asked_note(std::uint64_t cut) {
  return std::to_string(cut) +
         " stacks outgrew the stack copy and ended there, marked [truncated]; the kernel's user call chain "
         "was asked for from then on";
}
inline std::string chain_given_back_note() {
  return "the kernel's user call chain continued few of the stacks that outgrew the copy (code without "
         "frame pointers), and was given up";
}

// Goes on with a walk that ran off `copy` (at `s`), on the live stack `live` reads: the first read reaches
// kLiveFirstBytes past the copy, each next one twice as far, from the frame where the walk stopped. Returns
// the walk's result, `r` itself when it could not go on.
template <class Memory, class Rows>
inline unwind_result continue_live(const Memory& copy, const Rows& rows, walk_regs& s, unwind_result r,
                                   std::uint64_t* out, std::size_t max_depth, live_stack_reader& live) {
  const std::uintptr_t copy_end = copy.base + copy.size;
  if (copy.size < kLiveVerifyBytes || s.sp < copy.base || s.sp > copy_end) return r;
  // The first read starts at the stopped frame's sp, or at the copy's last kLiveVerifyBytes when sp is
  // closer to its end: what it shares with the copy must not have changed.
  std::uintptr_t lo = std::min<std::uintptr_t>(s.sp, copy_end - kLiveVerifyBytes);
  const walk_regs stopped_at = s;  // where the copy ended: the walk ends there if the thread left it
  const unwind_result stopped = r;
  bool checked = false;
  for (std::size_t reach = kLiveFirstBytes;; reach *= 2) {
    const std::uintptr_t end = copy_end + reach;
    const std::size_t len = end - lo;
    live.buffer.resize(len);
    const std::size_t got = live.read(live.ctx, lo, live.buffer.data(), len);
    const bool first = reach == kLiveFirstBytes;
    if (first && (got < (copy_end - lo) + 8 ||
                  std::memcmp(live.buffer.data(), copy.data + (lo - copy.base), copy_end - lo) != 0))
      return r;
    Memory mem;
    mem.base = lo;
    mem.data = live.buffer.data();
    mem.size = got;
    r = walk_frames(mem, rows, s, r, out, max_depth);
    if (!checked && r.depth > stopped.depth) {  // the first frame read past the copy
      if (!called_directly(live, static_cast<std::uintptr_t>(out[stopped.depth]), stopped_at.pc)) {
        s = stopped_at;
        return stopped;
      }
      checked = true;
      ++live.continued;
    }
    // Done where the stack ended, the walk did, or the budget is spent.
    if (r.end != walk_end::ran_off_copy || got < len || reach >= kLiveMaxBytes) return r;
    lo = s.sp;
  }
}

// Unwinds one sample into out[0..): the copy walked with `set`'s rows (frame pointers where none, or
// with no set), on the live stack where the walk left the copy and `live` (may be null) may read it,
// else continued with the kernel's user chain `chain[0..n)`. Returns the depth; `truncated` when frames
// were left out: for lack of room, or because the stack went on past the copy and neither the live stack
// nor the chain could continue it (the root-side frames are missing). `Memory` is the copy's policy:
// sampled_stack for this process's own threads (the leaf's code bytes may be read). `end` (may be null)
// says whether the walk left the copy with nothing to go on, and whether a frame-pointer chain goes on
// there on the live stack (the user chain switch).
template <class Memory = sampled_stack>
inline std::size_t unwind_sample(const unwind_table_set* set, std::uint64_t ip, std::uint64_t sp,
                                 std::uint64_t bp, const unsigned char* stack, std::size_t stack_size,
                                 const std::uint64_t* chain, std::size_t n, std::uint64_t* out,
                                 std::size_t max_depth, bool& truncated, bool& spliced,
                                 live_stack_reader* live = nullptr, copy_end* end = nullptr) {
  truncated = spliced = false;
  if (end) *end = copy_end{};
  if (max_depth == 0) return 0;
  unwind_result r;
  out[r.depth++] = ip;
  Memory mem;
  mem.base = static_cast<std::uintptr_t>(sp);
  mem.data = stack;
  mem.size = stack_size;
  walk_regs s{static_cast<std::uintptr_t>(ip), static_cast<std::uintptr_t>(sp),
              static_cast<std::uintptr_t>(bp), true, true};
  auto walk = [&](const auto& rows) {
    r = walk_frames(mem, rows, s, r, out, max_depth);
    if (r.end == walk_end::ran_off_copy && live != nullptr && live->read != nullptr)
      r = continue_live(mem, rows, s, r, out, max_depth, *live);
  };
  if (stack_size > 0) {
    if (set)
      walk(cfi_rows{set});
    else
      walk(frame_pointer_rows{});
  }
  truncated = r.truncated;
  if (r.end == walk_end::outermost || r.end == walk_end::zero_return || r.end == walk_end::depth_limit)
    return r.depth;
  // The copy ended (or a frame failed) before the stack did: find the deepest walked frame in the
  // kernel's chain, at the same position when both agree there, else where the last two frames match.
  const std::size_t d = r.depth;
  std::size_t at = n;
  if (d <= n && chain[d - 1] == out[d - 1]) {
    at = d - 1;
  } else {
    for (std::size_t j = 1; j < n && d >= 2; ++j)
      if (chain[j] == out[d - 1] && chain[j - 1] == out[d - 2]) {
        at = j;
        break;
      }
    if (at == n && d == 1 && n > 0 && chain[0] == out[0]) at = 0;
  }
  std::size_t depth = d;
  for (std::size_t j = at + 1; j < n; ++j) {
    if (chain[j] < kMinCodeAddress) break;
    if (depth == max_depth) {
      truncated = true;
      break;
    }
    out[depth++] = chain[j];
  }
  spliced = depth > d;
  // Nothing went on from where the copy ended before the stack did (no agreeing chain), or from the leaf
  // where there was no copy (the user sp could not be read, as in a tick inside execve after the old
  // image's memory went).
  if (!spliced && (stack_size == 0 || (at == n && r.end == walk_end::ran_off_copy))) truncated = true;
  if (end && r.end == walk_end::ran_off_copy) {
    end->reached = true;
    end->chain_would = n == 0 && s.fp_known && live && live->read && frame_chain_at(*live, s.sp, s.fp);
  }
  return depth;
}

class perf_ring_source final : public tick_source {
 public:
  ~perf_ring_source() override { close(); }
  source_kind kind() const override { return source_kind::ring; }
  bool per_thread() const override { return false; }  // the kernel follows new threads
  bool counts_kernel_time() const override { return !user_only_; }
  double effective_hz() const override { return config_.hz; }
  std::size_t armed_count() const override { return events_; }
  bool pulls_samples() const override { return true; }
  std::string describe() const override {
    std::string s = "perf_event ring buffers, task-clock";
    s += user_only_ ? " (user only: time in the kernel is not sampled)" : " (user+kernel)";
    s += ", no signals";
    return s;
  }

  status open(const source_config& config) override {
    close();
    config_ = config;
    page_ = static_cast<std::size_t>(::sysconf(_SC_PAGESIZE));
    long conf = ::sysconf(_SC_NPROCESSORS_CONF);
    const int cpus = conf > 0 ? static_cast<int>(conf) : 1;
    std::vector<pid_t> tids = list_threads();
    const pid_t self = static_cast<pid_t>(raw_gettid());
    if (std::find(tids.begin(), tids.end(), self) == tids.end()) tids.push_back(self);
    std::size_t budget = kMaxRingEvents;
    struct rlimit files {};
    if (sys().getrlimit(RLIMIT_NOFILE, &files) == 0 && files.rlim_max != RLIM_INFINITY &&
        files.rlim_max / 4 < budget)
      budget = static_cast<std::size_t>(files.rlim_max / 4);
    const std::size_t need = tids.size() * static_cast<std::size_t>(cpus);
    // Two events per thread and CPU while the budget has room for them (see user chain switch), else
    // one that asks for the chain from the start.
    chain_pairs_ = 2 * need <= budget;
    budget_ = budget;
    cpus_ = cpus;
    // Small rings first, where the budget has room for a second set of events to grow them with.
    full_pages_ = ring_pages_for(config.hz, page_);
    const std::size_t set = need * (chain_pairs_ ? 2 : 1);
    const unsigned start_pages =
        2 * set <= budget ? std::max(kRingPagesMin, full_pages_ / kRingStartShare) : full_pages_;
    grow_tries_ = start_pages < full_pages_ ? kRingGrowTries : 0;
    chain_ = chain_switch{};
    if (!chain_pairs_) chain_.start_on();
    if (need > budget)
      return status::error(
          "descriptor budget: " + std::to_string(tids.size()) + " threads x " + std::to_string(cpus) +
              " CPUs = " + std::to_string(need) + " events, more than " + std::to_string(budget) +
              " (a quarter of the hard RLIMIT_NOFILE, at most " + std::to_string(kMaxRingEvents) + ")",
          EMFILE);
    // Kernel time when allowed, else user-only (decided on the calling thread's first CPU event).
    status st = status::ok();
    for (int user = config.user_clock_only ? 1 : 0; user <= 1; ++user) {
      user_only_ = user == 1;
      st = open_cpus(self, cpus, start_pages, rings_);
      if (st || (st.code() != EACCES && st.code() != EPERM)) break;
      close();
    }
    if (!st) {
      close();
      return st;
    }
    for (pid_t tid : tids) {
      if (tid == self) continue;
      st = attach_thread(tid, rings_);
      if (!st && st.code() != ESRCH) {
        close();
        return st;
      }
    }
    opened_ns_ = monotonic_ns();
    return status::ok();
  }

  // Threads are covered by the kernel: nothing to arm one by one.
  status arm(pid_t) override { return status::ok(); }
  void disarm(pid_t) override {}

  void close() override {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto& c : rings_) release_ring(c);
    rings_.clear();
    events_ = 0;
  }

  // The child's fds point at the parent's events; its copy of the mappings does not exist (perf rings
  // are not copied at fork). Close the fds only.
  void abandon_after_fork() override {
    for (auto& c : rings_) {
      for (int fd : c.fds) sys().close(fd);
      for (int fd : c.chain_fds) sys().close(fd);
    }
    rings_.clear();
    events_ = 0;
  }

  // Reads every ring into `out` (selfprof's threads `skip` dropped). Returns the records read. A thread's
  // own ring goes once its thread has ended and the ring is read empty.
  std::size_t collect(sample_ring& out, const std::vector<pid_t>& skip,
                      row_requests* rows = nullptr) override {
    std::lock_guard<std::mutex> lock(mu_);
    skip_ = skip;
    rows_ = rows;
    std::size_t n = 0;
    const std::uint64_t taken = counts_.stored + counts_.full;  // the program's samples, not selfprof's
    for (auto& c : rings_)
      if (c.base) n += read_ring(c, out);
    for (std::size_t i = 0; i < rings_.size();) {
      char stat[8];
      if (rings_[i].tid == 0 || sys().read_task_file(rings_[i].tid, "stat", stat, sizeof stat) > 0) {
        ++i;
        continue;
      }
      n += read_ring(rings_[i], out);  // what the thread's last moments left
      release_ring(rings_[i]);
      rings_.erase(rings_.begin() + static_cast<std::ptrdiff_t>(i));
    }
    const chain_switch::action a = chain_.due();
    if (a != chain_switch::action::none) hand_over(a == chain_switch::action::ask);
    if (counts_.stored + counts_.full > taken && grow_tries_ > 0 &&
        monotonic_ns() - opened_ns_ >= kRingGrowAfterMs * 1000000ull)
      n += grow(out);
    rows_ = nullptr;
    return n;
  }

  // SELFPROF_FRAME_HZ: the thread gets events of its own at `hz` (one event on every CPU, not inherited,
  // with a ring of its own: the kernel lets a per-thread event map a ring when it is not inherited), and
  // the CPU rings' samples of it are dropped from then on. Its samples enter the all-frames profile at
  // the common rate (game/rates.hpp).
  status set_thread_rate(pid_t tid, double hz) override {
    std::lock_guard<std::mutex> lock(mu_);
    if (rings_.empty()) return status::error("perf ring: closed");
    for (auto& r : rings_)
      if (r.tid == tid) return status::ok();
    cpu_ring r;
    r.tid = tid;
    r.hz = hz;
    const int fd = open_event(tid, -1, hz, false);
    if (fd < 0) {
      const int e = errno;
      return status::error("perf ring: thread " + std::to_string(tid) + "'s own event: " + std::strerror(e),
                           e);
    }
    r.fds.push_back(fd);
    ++events_;
    status st = map_ring(r, ring_pages_for(hz, page_));
    if (st) st = add_chain_event(r, tid, -1, hz, false);
    if (!st) {
      release_ring(r);
      return st;
    }
    r.since_ns = monotonic_ns();
    rings_.push_back(r);
    return status::ok();
  }
  // At stop: the last read, so the rings no longer grow (a short process would pay for it at exit).
  std::size_t collect_again(sample_ring& out) override {
    std::vector<pid_t> skip;
    {
      std::lock_guard<std::mutex> lock(mu_);
      skip = skip_;
      grow_tries_ = 0;
    }
    return collect(out, skip);
  }

  // Each sample carries a kStackCopyBytes stack copy: the rings hold at most this many between two reads.
  std::size_t records_per_read() const override {
    std::lock_guard<std::mutex> lock(mu_);
    std::size_t n = 0;
    for (auto& r : rings_) n += r.data_bytes / kStackCopyBytes + 1;
    return n;
  }

  // How often the collector must read so that no ring fills: a quarter of the time a ring holds at the
  // rate, between 5 and 200 ms. Until the source asks for the user chain, the first reads come sooner
  // (kChainFirstReadMs, then half the time since open): a program whose stacks outgrow the copy from the
  // start gets the chain after a few of them.
  unsigned collect_period_ms() const override {
    double ms = 200;
    for (auto& c : rings_) {
      if (c.hz <= 0) continue;
      const double records = double(c.data_bytes) / double(kStackCopyBytes + 1024);
      ms = std::min(ms, records / c.hz * 1000 / 4);
    }
    if (!chain_.on() && !chain_.given_back() && opened_ns_ != 0)
      ms = std::min(ms, std::max<double>(kChainFirstReadMs, double(monotonic_ns() - opened_ns_) / 2e6));
    return static_cast<unsigned>(std::max(5.0, ms));
  }

  pulled_stats pulled() const override {
    std::lock_guard<std::mutex> lock(mu_);
    pulled_stats p;
    p.records = counts_.stored;
    p.truncated = counts_.truncated;
    p.full = counts_.full;
    p.lost = counts_.lost;
    p.throttles = counts_.throttled;
    p.user_chain_since_ns =
        chain_.on() ? (chain_.handed_over_ns() ? chain_.handed_over_ns() : opened_ns_) : 0;
    p.chain_cut = chain_.cut();
    p.chain_given_back = chain_.given_back();
    p.overlap = counts_.overlap;
    for (auto& r : rings_)
      if (r.tid == 0) p.ring_pages = std::max<std::uint64_t>(p.ring_pages, r.data_bytes / page_);
    return p;
  }

 private:
  struct cpu_ring {
    int cpu = -1;
    void* base = nullptr;  // the header page, then the data pages
    std::size_t map_bytes = 0, data_bytes = 0;
    std::vector<int> fds;        // fds[0] owns the ring
    std::vector<int> chain_fds;  // their user-chain twins (chain_switch says which of each pair samples)
    double hz = 0;               // the rate its events sample at
    pid_t tid = 0;               // a thread's own ring (SELFPROF_FRAME_HZ), 0 for a CPU's
    std::uint64_t since_ns = 0;  // when that thread's own events started
    // Samples kept: taken from `keep_from_ns`, before `keep_until_ns` (CLOCK_MONOTONIC; see grow()).
    std::uint64_t keep_from_ns = 0, keep_until_ns = ~std::uint64_t{0};
  };

  // A task-clock event of `tid` on `cpu` at `hz`: inherited by the threads it creates (the CPU rings), or
  // for the thread alone on every CPU (a boosted thread's own ring). `chain`: the twin that asks for the
  // kernel's user chain. Of a pair, the one that does not sample now opens disabled.
  int open_event(pid_t tid, int cpu, double hz, bool inherit = true, bool chain = false) {
    struct perf_event_attr attr;
    std::memset(&attr, 0, sizeof attr);
    attr.size = sizeof attr;
    attr.type = PERF_TYPE_SOFTWARE;
    attr.config = PERF_COUNT_SW_TASK_CLOCK;
    attr.sample_period = static_cast<std::uint64_t>(period_ns_for(hz));
    attr.sample_type = PERF_SAMPLE_IP | PERF_SAMPLE_TID | PERF_SAMPLE_TIME | PERF_SAMPLE_CALLCHAIN |
                       PERF_SAMPLE_REGS_USER | PERF_SAMPLE_STACK_USER;
    attr.sample_regs_user = (1ull << kRegBp) | (1ull << kRegSp) | (1ull << kRegIp);
    attr.sample_stack_user = kStackCopyBytes;
    attr.sample_max_stack = static_cast<std::uint16_t>(max_stack());
    attr.exclude_kernel = user_only_ ? 1 : 0;
    attr.exclude_callchain_kernel = user_only_ ? 1 : 0;
    attr.exclude_callchain_user = chain || (!chain_pairs_ && chain_.on()) ? 0 : 1;
    attr.disabled = !chain_pairs_ || chain == chain_.on() ? 0 : 1;
    attr.exclude_hv = 1;
    attr.inherit = inherit ? 1 : 0;
    attr.inherit_thread = inherit ? 1 : 0;
    attr.remove_on_exec = 1;
    attr.use_clockid = 1;
    attr.clockid = CLOCK_MONOTONIC;
    attr.wakeup_events = 0;
    attr.watermark = 1;
    attr.wakeup_watermark = 1u << 30;  // no poller: never wake anyone
    long fd = sys().perf_event_open(&attr, tid, cpu, -1, PERF_FLAG_FD_CLOEXEC);
    if (fd < 0) return -1;
    return keep_fd_high(static_cast<int>(fd));
  }

  // The kernel's chain depth: the depth asked for, within kernel.perf_event_max_stack.
  std::size_t max_stack() {
    if (max_stack_ != 0) return max_stack_;  // read once: every event of the source opens with it
    std::size_t want = config_.max_depth ? config_.max_depth : 128;
    std::string s = read_small_file("/proc/sys/kernel/perf_event_max_stack");
    long sys_max = s.empty() ? 127 : std::strtol(s.c_str(), nullptr, 10);
    if (sys_max > 0 && want > static_cast<std::size_t>(sys_max)) want = static_cast<std::size_t>(sys_max);
    max_stack_ = std::min<std::size_t>(want, 0xffff);
    return max_stack_;
  }

  // Closes `c`'s events (disabled first, unless the caller did) and unmaps its ring.
  void release_ring(cpu_ring& c, bool disabled = false) {
    for (auto* fds : {&c.chain_fds, &c.fds})
      for (int fd : *fds) {
        if (!disabled) ::ioctl(fd, PERF_EVENT_IOC_DISABLE, 0);
        sys().close(fd);
        if (events_ > 0) --events_;
      }
    c.chain_fds.clear();
    if (c.base) sys().munmap(c.base, c.map_bytes);
    c.fds.clear();
    c.base = nullptr;
  }

  // Opens `owner`'s events on every CPU, each CPU's first event owning a ring of `pages` data pages
  // (fewer where the locked-memory budget refuses), appended to `into`; `between` runs before each CPU's.
  status open_cpus(pid_t owner, int cpus, unsigned pages, std::vector<cpu_ring>& into,
                   const std::function<void()>& between = {}) {
    for (int c = 0; c < cpus; ++c) {
      if (between) between();
      int fd = open_event(owner, c, config_.hz);
      if (fd < 0) {
        const int e = errno;
        if (e == ENODEV || (e == EINVAL && c > 0)) continue;  // an offline CPU
        return status::error(std::string("perf_event_open(task-clock, ring") +
                                 (user_only_ ? ", user only" : ", with kernel time") +
                                 "): " + std::strerror(e) +
                                 (e == EACCES || e == EPERM
                                      ? (user_only_ ? " (kernel.perf_event_paranoid or seccomp forbids it)"
                                                    : " (kernel time needs root or perf_event_paranoid <= 1)")
                                      : ""),
                             e);
      }
      cpu_ring r;
      r.cpu = c;
      r.hz = config_.hz;
      r.fds.push_back(fd);
      ++events_;
      into.push_back(r);
      status st = map_ring(into.back(), pages);
      if (!st) return st;
      st = add_chain_event(into.back(), owner, c, config_.hz, true);
      if (!st) return st;
    }
    if (into.empty()) return status::error("perf ring: no online CPU accepted an event", ENODEV);
    return status::ok();
  }

  // Maps the CPU's ring: the largest size the locked-memory budget allows.
  status map_ring(cpu_ring& r, unsigned max_pages) {
    int e = 0;
    for (unsigned pages = max_pages; pages >= kRingPagesMin; pages /= 2) {
      const std::size_t bytes = (pages + 1) * page_;
      void* p = sys().mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, r.fds[0], 0);
      if (p != MAP_FAILED) {
        r.base = p;
        r.map_bytes = bytes;
        r.data_bytes = pages * page_;
        return status::ok();
      }
      e = errno;
      if (e != EPERM && e != ENOMEM) break;
    }
    return status::error(
        std::string("perf ring: mmap of ") +
            (r.tid ? "thread " + std::to_string(r.tid) : "CPU " + std::to_string(r.cpu)) +
            "'s ring failed: " + std::strerror(e) +
            (e == EPERM ? " (locked memory: perf_event_mlock_kb and RLIMIT_MEMLOCK used up)" : ""),
        e);
  }

  // A thread alive at open(): its own events, one per CPU, writing into that CPU's ring of `rings`.
  status attach_thread(pid_t tid, std::vector<cpu_ring>& rings) {
    for (auto& r : rings) {
      if (r.tid != 0) continue;
      int fd = open_event(tid, r.cpu, config_.hz);
      if (fd < 0) {
        const int e = errno;
        return status::error("perf ring: thread " + std::to_string(tid) + ": " + std::strerror(e), e);
      }
      r.fds.push_back(fd);
      ++events_;
      status st = write_into(r, fd);
      if (st) st = add_chain_event(r, tid, r.cpu, config_.hz, true);
      if (!st) return st;
    }
    return status::ok();
  }

  // The event with the kernel's user chain beside `r`'s event of (tid, cpu), writing into r's ring, while
  // the source has such pairs (open_event enables the one of the pair that samples now).
  status add_chain_event(cpu_ring& r, pid_t tid, int cpu, double hz, bool inherit) {
    if (!chain_pairs_) return status::ok();
    const int fd = open_event(tid, cpu, hz, inherit, true);
    if (fd < 0) {
      const int e = errno;
      return status::error(
          "perf ring: thread " + std::to_string(tid) + "'s user-chain event: " + std::strerror(e), e);
    }
    r.chain_fds.push_back(fd);
    ++events_;
    return write_into(r, fd);
  }

  // Points event `fd` at `r`'s ring, which fds[0] maps.
  static status write_into(const cpu_ring& r, int fd) {
    if (::ioctl(fd, PERF_EVENT_IOC_SET_OUTPUT, r.fds[0]) == 0) return status::ok();
    const int e = errno;
    return status::error(std::string("perf ring: PERF_EVENT_IOC_SET_OUTPUT: ") + std::strerror(e), e);
  }

  // The rings' growth (see kRingStartShare): a second set of events on every thread but selfprof's, with
  // full-size rings; when the threads did not change meanwhile, the first set is disabled, read for the
  // last time and closed. Returns the records read from it.
  std::size_t grow(sample_ring& out) {
    --grow_tries_;
    std::vector<pid_t> tids = app_threads();
    const std::size_t set = tids.size() * static_cast<std::size_t>(cpus_) * (chain_pairs_ ? 2 : 1);
    if (tids.empty() || events_ + set > budget_) return 0;
    std::size_t small = ~std::size_t{0};
    for (auto& r : rings_)
      if (r.tid == 0) small = std::min(small, r.data_bytes);
    std::vector<cpu_ring> grown;
    std::size_t n = 0;
    // The old rings fill meanwhile: read between one CPU's (or thread's) new events and the next.
    const std::function<void()> read_old = [&] {
      for (auto& r : rings_)
        if (r.tid == 0) n += read_ring(r, out);
    };
    status st = open_cpus(tids[0], cpus_, full_pages_, grown, read_old);
    for (std::size_t i = 1; st && i < tids.size(); ++i) {
      read_old();
      st = attach_thread(tids[i], grown);
    }
    bool larger = static_cast<bool>(st);
    for (auto& r : grown) larger = larger && r.data_bytes > small;
    if (!larger) grow_tries_ = 0;  // an event refused, or no locked memory for larger rings beside these
    if (!larger || app_threads() != tids) {  // or a thread started (or ended) meanwhile: try again later
      for (auto& r : grown) release_ring(r);
      return n;
    }
    const std::uint64_t now = monotonic_ns();
    for (auto& r : rings_) {
      if (r.tid != 0) continue;
      for (auto* fds : {&r.fds, &r.chain_fds})
        for (int fd : *fds) ::ioctl(fd, PERF_EVENT_IOC_DISABLE, 0);
      r.keep_until_ns = now;
      n += read_ring(r, out);
      release_ring(r, true);
    }
    rings_.erase(std::remove_if(rings_.begin(), rings_.end(), [](const cpu_ring& r) { return r.tid == 0; }),
                 rings_.end());
    for (auto& r : grown) r.keep_from_ns = now;
    rings_.insert(rings_.end(), grown.begin(), grown.end());
    grow_tries_ = 0;
    return n;
  }

  // This process's threads but selfprof's own (skip_), sorted.
  std::vector<pid_t> app_threads() const {
    std::vector<pid_t> tids = list_threads();
    tids.erase(
        std::remove_if(tids.begin(), tids.end(),
                       [&](pid_t t) { return std::find(skip_.begin(), skip_.end(), t) != skip_.end(); }),
        tids.end());
    std::sort(tids.begin(), tids.end());
    return tids;
  }

  // Every event's user-chain twin takes over from it (`to_chain`), or hands back: each ring's events that
  // sample now are disabled (with the copies their threads inherited) before the others are enabled, so
  // no tick is sampled twice. (A thread that ended while the source opened may have one of the two.)
  void hand_over(bool to_chain) {
    for (auto& r : rings_) {
      for (int fd : to_chain ? r.fds : r.chain_fds) ::ioctl(fd, PERF_EVENT_IOC_DISABLE, 0);
      for (int fd : to_chain ? r.chain_fds : r.fds) ::ioctl(fd, PERF_EVENT_IOC_ENABLE, 0);
    }
    chain_.handed_over(monotonic_ns());
  }

  // Reads the records between data_tail and data_head. Every record is bounded by the published head
  // and by its own size; a record that does not fit ends the read (the ring is skipped to the head).
  std::size_t read_ring(cpu_ring& r, sample_ring& out) {
    auto* meta = static_cast<perf_event_mmap_page*>(r.base);
    const unsigned char* data = static_cast<const unsigned char*>(r.base) + page_;
    const std::uint64_t size = r.data_bytes;
    const std::uint64_t head = __atomic_load_n(&meta->data_head, __ATOMIC_ACQUIRE);
    std::uint64_t tail = meta->data_tail;
    std::size_t n = 0;
    if (head - tail > size) {  // cannot be: the kernel never overwrites unread data
      ++counts_.lost;
      tail = head;
    }
    while (tail < head) {
      perf_event_header h;
      if (head - tail < sizeof h) {
        ++counts_.lost;
        break;
      }
      ring_copy_out(data, size, tail, &h, sizeof h);
      if (h.size < sizeof h || h.size > head - tail || h.size % 8 != 0) {
        ++counts_.lost;
        break;
      }
      record_.resize(h.size);
      ring_copy_out(data, size, tail, record_.data(), h.size);
      handle_record(r, h, record_.data(), h.size, out);
      tail += h.size;
      ++n;
    }
    __atomic_store_n(&meta->data_tail, head, __ATOMIC_RELEASE);
    return n;
  }

  void handle_record(const cpu_ring& from, const perf_event_header& h, const unsigned char* rec,
                     std::size_t len, sample_ring& out) {
    ring_cursor c{rec + sizeof h, len - sizeof h};
    if (h.type == PERF_RECORD_LOST) {
      std::uint64_t id = 0, lost = 0;
      if (c.u64(id) && c.u64(lost)) counts_.lost += lost;
      return;
    }
    if (h.type == PERF_RECORD_THROTTLE) {
      ++counts_.throttled;
      return;
    }
    if (h.type != PERF_RECORD_SAMPLE) return;
    ring_sample smp;
    if (!parse_ring_sample(c, !user_only_, smp, user_chain_, kernel_chain_)) {
      ++counts_.lost;
      return;
    }
    const auto tid = static_cast<pid_t>(smp.tid());
    if (std::find(skip_.begin(), skip_.end(), tid) != skip_.end()) return;  // selfprof's own thread
    if (smp.time < from.keep_from_ns || smp.time >= from.keep_until_ns) {   // the other set's (grow())
      ++counts_.overlap;
      return;
    }
    // A CPU ring's sample of a thread that has its own ring since then: that ring has it.
    if (from.tid == 0 && has_own_ring(tid, smp.time)) return;
    if (smp.abi == PERF_SAMPLE_REGS_ABI_NONE) return;  // no user context (a kernel thread): nothing of ours
    std::uint64_t pos = 0;
    ring_slot* slot = out.claim(pos);
    if (!slot) {
      ++counts_.full;
      return;
    }
    bool truncated = false, spliced = false;
    copy_end end;
    // Kernel frames first (the leaf end), as perf shows them: above the user frame that entered the
    // kernel, whose pc is then a return address (after the syscall instruction), looked up less one.
    const std::size_t kernel = std::min(kernel_chain_.size(), out.max_depth() / 2);
    std::copy(kernel_chain_.begin(), kernel_chain_.begin() + static_cast<std::ptrdiff_t>(kernel),
              slot->pcs());
    auto walk = [&] {
      truncated = spliced = false;
      return unwind_sample(g_unwind_tables.load(std::memory_order_acquire), smp.uip, smp.sp, smp.bp,
                           smp.stack, static_cast<std::size_t>(smp.dyn), user_chain_.data(),
                           user_chain_.size(), slot->pcs() + kernel, out.max_depth() - kernel, truncated,
                           spliced, &live_, &end);
    };
    std::size_t user = walk();
    // The walk goes on by frame pointers where a pc has no rows: when a walked pc lies in a module whose
    // rows were not parsed yet, they are parsed now and the sample walked again, so a module's first
    // samples get the stacks its later ones get. Each round parses one module; a few cover the modules
    // one stack crosses before its rows exist.
    for (int round = 0; rows_ != nullptr && round < kRowParsesPerSample; ++round) {
      const std::uint64_t pc = first_unparsed_pc(*rows_, slot->pcs() + kernel, user, kernel > 0);
      if (pc == 0 || !rows_->parse(pc)) break;
      user = walk();
    }
    const std::size_t depth = kernel + user;
    truncated = truncated || kernel < kernel_chain_.size();
    slot->header.tid = static_cast<std::uint32_t>(tid);
    slot->header.depth = static_cast<std::uint16_t>(depth);
    slot->header.flags = truncated ? sample_truncated : 0;
    slot->header.weight = 1;
    slot->header.time_ns = smp.time;
    slot->header.tag = kGameFrameTagByTime;  // the collector finds the game frame by the time
    ++counts_.stored;
    if (truncated) ++counts_.truncated;
    chain_.note(end, spliced, smp.time);
    sample_ring::publish(slot, pos);
  }

  // The first pc of a walked user stack in code whose rows were not parsed (return addresses looked up
  // less one; the first too when the sample is in the kernel), or 0. The list of such code is short and
  // searched without the row tables: this runs for every sample.
  static std::uint64_t first_unparsed_pc(const row_requests& rows, const std::uint64_t* pcs, std::size_t n,
                                         bool first_returns) {
    for (std::size_t k = 0; k < n; ++k) {
      const std::uint64_t pc = k > 0 || first_returns ? pcs[k] - 1 : pcs[k];
      if (rows.unparsed(pc)) return pc;
    }
    return 0;
  }

  bool has_own_ring(pid_t tid, std::uint64_t time) const {
    for (auto& r : rings_)
      if (r.tid == tid && time >= r.since_ns) return true;
    return false;
  }

  source_config config_;
  bool user_only_ = false;
  std::size_t page_ = 4096;
  std::size_t events_ = 0, budget_ = kMaxRingEvents;
  int cpus_ = 1;
  unsigned full_pages_ = kRingPagesMin;  // a CPU ring's data pages once grown
  unsigned grow_tries_ = 0;              // growth attempts left (0: grown, or full-size from the start)
  std::vector<cpu_ring> rings_;
  mutable std::mutex mu_;  // collect() and the counters: the collector, and stop()
  std::vector<pid_t> skip_;
  row_requests* rows_ = nullptr;  // during collect() only
  std::vector<unsigned char> record_;
  std::vector<std::uint64_t> user_chain_, kernel_chain_;
  std::size_t max_stack_ = 0;
  bool chain_pairs_ = false;  // every event has a user-chain twin (the fd budget allowed it)
  chain_switch chain_;        // which of each pair samples
  std::uint64_t opened_ns_ = 0;
  // This process's stacks as they are now, where a walk runs off its copy (read through the seam, which
  // never faults: the thread may have exited and unmapped its stack).
  live_stack_reader live_{[](void*, std::uintptr_t addr, void* out, std::size_t len) -> std::size_t {
                            const long got = sys().read_own_memory(out, addr, len);
                            return got > 0 ? static_cast<std::size_t>(got) : 0;
                          },
                          nullptr,
                          {},
                          0};
  ring_counts counts_;
};

}  // namespace detail
}  // namespace selfprof
