// Signal-handler code: alternate signal stacks (sigaltstack) for the sampled threads.
// Context: signal handler (altstack_on_tick, install_altstack: raw syscalls only, no allocation, no locks);
// setup (install_altstack from the thread itself; sources/signal_setup.hpp); the collector (reap_altstacks).
//
// Why: the sampling handler is installed with SA_ONSTACK. Without an alternate stack the kernel writes the
// signal frame (the xsave state: 2.5 KiB with AVX, 3.4 KiB with AVX-512, up to 11 KiB with AMX; see
// getauxval(AT_MINSIGSTKSZ)) and the handler's own frames just below the interrupted sp: on a coroutine or
// fiber with a small heap stack (makecontext, boost.context) that can be past its end, into the heap.
//
// What is settled here:
// - A thread that has an alternate stack already (the program's own, for its SIGSEGV handler; Go's or
//   Rust's runtime) keeps it: selfprof shares it and never replaces it. Only a thread with none gets one.
// - Size: AT_MINSIGSTKSZ (the frame the kernel writes on this CPU) + kHandlerBudget for the handler's
//   frames, in whole pages, plus a PROT_NONE guard page below it (36 KiB with AVX-512, mostly never
//   touched). The deepest use fiber_test.cpp measured, kernel frame included, is 6.4 KiB (the tick that
//   installs the stack; 3.5 KiB otherwise). The budget is Go's signal stack size (32 KiB): a program
//   handler or runtime that finds this stack takes it for its thread's own and may run on it.
// - Where: a thread's alternate stack can be set only by the thread itself. It is set from the thread
//   before its first tick where selfprof runs code in it: the thread calling start() (install_sample_handler)
//   and threads started under the preload library (its pthread_create wrapper). Every other thread (armed
//   by the collector from outside) gets one from the handler at its first tick, with raw mmap and
//   sigaltstack; that first tick's frame still lands on whatever stack the thread is on, as every tick
//   did before. Accepted: it is one frame per thread's life, and a thread that is born on its own
//   stack (every pthread is) usually takes its first tick there long before it switches to fibers.
// - Freed when: only once the thread is gone. The stack stays installed after stop() (the program's own
//   SA_ONSTACK handlers may be running on it or may run on it later), so selfprof cannot free it while
//   the thread lives. reap_altstacks() (called by the sources when the collector disarms a thread that
//   ended, and when they close) unmaps the stacks of threads that tgkill(pid, tid, 0) says are gone.
//   The stacks of another process (a fork child's copies of its parent's table) are never freed: the
//   child's only thread still runs with its copy of its parent's stack.
// - The unwinder is unaffected: it walks the interrupted stack from the context's sp (the fiber's), not
//   the handler's; current_thread_stack_end() returns 0 (unknown: bounded by kMaxStackSpan) for a heap
//   stack or the thread's descriptor when that lies above it (an over-estimate), and every read is probed.
//   Samples on a makecontext fiber walk its frames and end at glibc's __start_context (fiber_test.cpp).
// - The handler sets a stack on a thread both with sigaltstack and in the interrupted context's uc_stack:
//   sigreturn restores the alternate stack saved there, which would undo the first alone.
#pragma once

#include <errno.h>
#include <signal.h>
#include <sys/syscall.h>
#include <ucontext.h>
#include <unistd.h>

#include <atomic>
#include <cstddef>
#include <cstdint>

#include "selfprof/signal/raw_syscall.hpp"

namespace selfprof {
namespace detail {

// Stack the handler may use below the signal frame (its frames, the unwinder's, clock_gettime's).
constexpr std::size_t kHandlerBudget = 32 * 1024;
constexpr std::size_t kAltstackPage = 4096;
constexpr int kAltstackSlots = 4096;  // threads that can hold a selfprof stack at once
// <sys/mman.h> values (Linux x86-64 and aarch64); that header is not on the handler's list.
constexpr long kProtNone = 0, kProtReadWrite = 3;
constexpr long kMapPrivateAnonNoreserve = 0x02 | 0x20 | 0x4000;

// One stack: owner = (pid << 32) | tid of the thread it was made for (0: free), base = its usable low end.
struct altstack_slot {
  std::atomic<std::uint64_t> owner{0};
  std::atomic<std::uintptr_t> base{0};
};

struct altstack_globals {
  std::atomic<std::size_t> size{0};         // usable bytes of each stack; 0 until prepare_altstacks()
  std::atomic<std::uint64_t> installed{0};  // stacks given to threads
  std::atomic<std::uint64_t> kept_own{0};   // threads found with an alternate stack of their own
  std::atomic<std::uint64_t> failed{0};     // mmap, sigaltstack or the table failed: the thread has none
  std::atomic<std::uint64_t> reaped{0};     // stacks unmapped after their thread ended
  // Bit g: a slot of group g (slots [64g, 64g + 64)) was ever claimed. reap_altstacks() looks at those
  // groups only: scanning all 64 KiB of slots faulted in 16 untouched pages, in every process, at exit.
  std::atomic<std::uint64_t> used_groups{0};
  altstack_slot slots[kAltstackSlots];
};
constexpr int kAltstackGroup = kAltstackSlots / 64;  // slots per bit of used_groups
static_assert(kAltstackSlots % 64 == 0, "used_groups has 64 bits");

inline altstack_globals g_altstack;  // constant-initialized, like g_handler

inline bool raw_failed(long r) { return r < 0 && r > -4096; }

// Gives the calling thread a selfprof alternate stack of `size` bytes unless it has one. Async-signal-safe.
// In a handler, `uc` is its context: sigreturn restores the alternate stack saved in uc->uc_stack when the
// signal came, so the new stack is written there too, or it would be gone at the handler's return.
inline bool install_altstack(std::size_t size, ucontext_t* uc = nullptr) {
  altstack_globals& a = g_altstack;
  stack_t cur{};
  if (raw_syscall3(SYS_sigaltstack, 0, reinterpret_cast<long>(&cur), 0) != 0) return false;
  if (!(cur.ss_flags & SS_DISABLE)) {  // the program's own (or selfprof's, or running on one): shared
    a.kept_own.fetch_add(1, std::memory_order_relaxed);
    return false;
  }
  const std::size_t total = size + kAltstackPage;
  const long m =
      raw_syscall6(SYS_mmap, 0, static_cast<long>(total), kProtReadWrite, kMapPrivateAnonNoreserve, -1, 0);
  if (raw_failed(m)) {
    a.failed.fetch_add(1, std::memory_order_relaxed);
    return false;
  }
  const auto low = static_cast<std::uintptr_t>(m);
  raw_syscall3(SYS_mprotect, static_cast<long>(low), kAltstackPage, kProtNone);  // overflow faults
  const auto pid = static_cast<std::uint64_t>(raw_syscall3(SYS_getpid, 0, 0, 0));
  const std::uint32_t tid = raw_gettid();
  const std::uint64_t key = (pid << 32) | tid;
  altstack_slot* slot = nullptr;
  for (int i = 0; i < kAltstackSlots && slot == nullptr; ++i) {
    altstack_slot& s = a.slots[(tid + static_cast<std::uint32_t>(i)) % kAltstackSlots];
    std::uint64_t free_key = 0;
    if (s.owner.load(std::memory_order_relaxed) == 0 &&
        s.owner.compare_exchange_strong(free_key, key, std::memory_order_acq_rel)) {
      slot = &s;
      a.used_groups.fetch_or(std::uint64_t{1} << ((&s - a.slots) / kAltstackGroup),
                             std::memory_order_acq_rel);
    }
  }
  stack_t ss{};
  ss.ss_sp = reinterpret_cast<void*>(low + kAltstackPage);
  ss.ss_size = size;
  ss.ss_flags = 0;
  if (slot != nullptr) slot->base.store(low + kAltstackPage, std::memory_order_release);
  if (slot == nullptr || raw_syscall3(SYS_sigaltstack, reinterpret_cast<long>(&ss), 0, 0) != 0) {
    if (slot != nullptr) {
      slot->base.store(0, std::memory_order_relaxed);
      slot->owner.store(0, std::memory_order_release);
    }
    raw_syscall3(SYS_munmap, static_cast<long>(low), static_cast<long>(total), 0);
    a.failed.fetch_add(1, std::memory_order_relaxed);
    return false;
  }
  if (uc != nullptr) uc->uc_stack = ss;
  a.installed.fetch_add(1, std::memory_order_relaxed);
  return true;
}

// Called by the sampling handler with the interrupted sp. On an alternate stack the handler's frame lies
// elsewhere; right below the interrupted sp (within a signal frame and the budget) it runs on the
// interrupted stack: the thread has no alternate stack yet (or runs on one, e.g. in the program's own
// SIGSEGV handler, which install_altstack sees). Costs one comparison once the thread has one.
inline void altstack_on_tick(ucontext_t* uc, std::uintptr_t interrupted_sp) {
  const std::size_t size = g_altstack.size.load(std::memory_order_relaxed);
  if (size == 0) return;
  const auto here = reinterpret_cast<std::uintptr_t>(__builtin_frame_address(0));
  if (here > interrupted_sp || interrupted_sp - here > size) return;
  install_altstack(size, uc);
}

// Setup: fixes the stacks' size (sources/signal_setup.hpp computes it; the same for every thread).
inline void set_altstack_size(std::size_t size) {
  size = (size + kAltstackPage - 1) & ~(kAltstackPage - 1);
  std::size_t none = 0;
  g_altstack.size.compare_exchange_strong(none, size, std::memory_order_acq_rel);
}

// Collector or setup: unmaps the stacks of this process's threads that have ended. Returns how many.
inline std::size_t reap_altstacks() {
  altstack_globals& a = g_altstack;
  const std::size_t size = a.size.load(std::memory_order_acquire);
  if (size == 0) return 0;
  const auto pid = static_cast<std::uint64_t>(raw_syscall3(SYS_getpid, 0, 0, 0));
  std::size_t n = 0;
  const std::uint64_t groups = a.used_groups.load(std::memory_order_acquire);
  for (int i = 0; i < kAltstackSlots; ++i) {
    if (!(groups >> (i / kAltstackGroup) & 1)) {
      i += kAltstackGroup - 1 - i % kAltstackGroup;  // to the group's last slot; the loop steps past it
      continue;
    }
    altstack_slot& s = a.slots[i];
    const std::uint64_t key = s.owner.load(std::memory_order_acquire);
    if (key == 0 || (key >> 32) != pid) continue;
    const long tid = static_cast<long>(key & 0xffffffffu);
    if (raw_syscall3(SYS_tgkill, static_cast<long>(pid), tid, 0) != -ESRCH) continue;
    const std::uintptr_t base = s.base.load(std::memory_order_acquire);
    if (base == 0) continue;
    raw_syscall3(SYS_munmap, static_cast<long>(base - kAltstackPage), static_cast<long>(size + kAltstackPage),
                 0);
    s.base.store(0, std::memory_order_relaxed);
    s.owner.store(0, std::memory_order_release);
    a.reaped.fetch_add(1, std::memory_order_relaxed);
    ++n;
  }
  return n;
}

// The selfprof stack of thread `tid` of this process ([base, base + size)), or base 0 (tests).
inline std::uintptr_t altstack_base_of(std::uint32_t tid) {
  const auto pid = static_cast<std::uint64_t>(raw_syscall3(SYS_getpid, 0, 0, 0));
  for (altstack_slot& s : g_altstack.slots)
    if (s.owner.load(std::memory_order_acquire) == ((pid << 32) | tid))
      return s.base.load(std::memory_order_acquire);
  return 0;
}

}  // namespace detail
}  // namespace selfprof
