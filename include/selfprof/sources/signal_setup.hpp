// Choosing and installing the profiling signal: never replaces an application's handler silently, and
// recognises another copy of selfprof in the same process by a marker in its handler's sa_mask. The handler
// runs on an alternate signal stack (SA_ONSTACK; signal/altstack.hpp says which and why).
// Context: setup only.
#pragma once

#include <pthread.h>
#include <signal.h>
#include <sys/auxv.h>
#include <time.h>

#include <cerrno>
#include <cstring>
#include <string>
#include <vector>

#include "selfprof/detail/sys.hpp"
#include "selfprof/signal/altstack.hpp"
#include "selfprof/signal/handler.hpp"
#include "selfprof/status.hpp"

namespace selfprof {
namespace detail {

// Every selfprof handler runs with every signal blocked but SIGSYS (raised only synchronously, by
// seccomp): no application handler can run inside it, so none can siglongjmp() out of it and leave
// `in_flight` raised or a perf event un-refreshed. The mask doubles as a marker: with SA_SIGINFO|SA_RESTART,
// SIGRTMAX blocked and SIGSYS not is how one copy of selfprof sees another (a different version, or a
// hidden-visibility build in another shared library; older copies blocked SIGRTMAX alone).
inline int selfprof_marker_signal() { return SIGRTMAX; }

inline void selfprof_handler_mask(sigset_t& mask) {
  sigfillset(&mask);
  sigdelset(&mask, SIGSYS);
}

inline bool is_selfprof_action(const struct sigaction& a) {
  return (a.sa_flags & SA_SIGINFO) && (a.sa_flags & SA_RESTART) &&
         sigismember(&a.sa_mask, selfprof_marker_signal()) == 1 && sigismember(&a.sa_mask, SIGSYS) == 0;
}

// Waits until no sampling handler runs, for at most `limit_ms`; false when one still does (a handler
// stuck in a fault: the caller then keeps what handlers read instead of freeing it).
inline bool wait_handlers_quiet(unsigned limit_ms = 1000) {
  for (unsigned waited_us = 0; g_handler.in_flight.load(std::memory_order_seq_cst) != 0; waited_us += 100) {
    if (waited_us >= limit_ms * 1000u) return false;
    struct timespec step {
      0, 100 * 1000
    };
    ::nanosleep(&step, nullptr);
  }
  return true;
}

// The signal frame the kernel writes on this CPU (AT_MINSIGSTKSZ, which grows with the xsave state: 3.4 KiB
// with AVX-512), or the old ABI's MINSIGSTKSZ where the kernel does not say.
inline std::size_t kernel_min_sigstksz() {
  std::size_t min = 2048;
#ifdef AT_MINSIGSTKSZ
  const unsigned long v = ::getauxval(AT_MINSIGSTKSZ);
  if (v > min && v < 1024 * 1024) min = v;
#endif
  return min;
}

// Gives the calling thread selfprof's alternate signal stack unless it has one (signal/altstack.hpp):
// the thread that starts profiling, and threads the preload library starts, before their first tick.
inline void arm_thread_altstack() {
  set_altstack_size(kernel_min_sigstksz() + kHandlerBudget);
  install_altstack(g_altstack.size.load(std::memory_order_acquire));
}

inline bool is_free_action(const struct sigaction& a) {
  if (a.sa_flags & SA_SIGINFO) return false;
  return a.sa_handler == SIG_DFL || a.sa_handler == SIG_IGN;
}

struct installed_signal {
  int number = 0;
  struct sigaction previous {};
};

// Signals tried when none is requested: SIGURG, SIGPROF, then real-time signals from the top (glibc
// keeps the first ones for itself; SIGRTMAX is our marker). SIGURG first, as Go's runtime does for its
// preemption signal: its default action is to ignore it, so a tick that arrives where selfprof's
// handler is gone (after an exec, or after a program replaced the handler and reset it) does nothing,
// and programs rarely claim it (socket out-of-band data needs an F_SETOWN socket), while SIGPROF is
// claimed by GNU sort, gperftools and -pg builds, whose handlers re-raise and kill. Standard signals do
// not queue, which is what we want for ticks; RT ones do, which is harmless at these rates. The itimer
// can only deliver SIGPROF (profiler_core takes it then).
inline std::vector<int> sample_signal_candidates() {
  std::vector<int> c{SIGURG, SIGPROF};
  for (int s = SIGRTMAX - 1; s >= SIGRTMAX - 8 && s > SIGRTMIN + 2; --s) c.push_back(s);
  return c;
}

// Called once by start(), before any source opens (the ring installs no handler, but defers as well).
inline status check_no_other_copy() {
  for (int s : sample_signal_candidates()) {
    struct sigaction cur {};
    if (sys().sigaction(s, nullptr, &cur) != 0) continue;
    if (is_selfprof_action(cur) && cur.sa_sigaction != &sample_signal_handler)
      return status::error(
          "another copy of selfprof (another build in this process) already profiles it on signal " +
          std::to_string(s) + "; this copy defers to it");
  }
  return status::ok();
}

// The caller has checked for another copy of selfprof (check_no_other_copy).
inline status install_sample_handler(int requested, installed_signal& out, std::vector<std::string>& notes) {
  std::vector<int> candidates = requested > 0 ? std::vector<int>{requested} : sample_signal_candidates();
  // A signal the starting thread blocks is one the program may wait for (sigwait, signalfd): not free.
  sigset_t blocked;
  sigemptyset(&blocked);
  pthread_sigmask(SIG_BLOCK, nullptr, &blocked);
  for (int s : candidates) {
    if (requested <= 0 && sigismember(&blocked, s) == 1) {
      notes.push_back("signal " + std::to_string(s) +
                      " is blocked by the program (it may wait for it): left alone");
      continue;
    }
    struct sigaction cur {};
    if (sys().sigaction(s, nullptr, &cur) != 0) continue;
    if (!is_free_action(cur)) {
      notes.push_back("signal " + std::to_string(s) + (s == SIGPROF ? " (SIGPROF)" : "") +
                      " already has a handler installed by the application: left alone");
      continue;
    }
    struct sigaction act {};
    act.sa_sigaction = &sample_signal_handler;
    // SA_ONSTACK: the kernel writes the signal frame on the thread's alternate stack (when it has one), not
    // on a fiber's small stack.
    act.sa_flags = SA_SIGINFO | SA_RESTART | SA_ONSTACK;
    selfprof_handler_mask(act.sa_mask);
    if (sys().sigaction(s, &act, &out.previous) != 0) {
      notes.push_back("sigaction(" + std::to_string(s) + "): " + std::strerror(errno));
      continue;
    }
    out.number = s;
    g_handler.signal_number.store(s, std::memory_order_release);
    arm_thread_altstack();  // the starting thread, from itself; others at their first tick
    return status::ok();
  }
  std::string why = requested > 0
                        ? "the requested sampling signal " + std::to_string(requested) +
                              (requested == SIGPROF ? " (SIGPROF, the only one the itimer delivers)" : "") +
                              " is in use"
                        : "every candidate sampling signal is in use";
  return status::error("selfprof: " + why + " (set SELFPROF_SAMPLE_SIGNAL to a free signal)");
}

// Discards pending ticks (setting SIG_IGN drops them, POSIX sigaction), waits for running handlers, then
// restores the application's previous action.
// True while `sig` still runs selfprof's sampling handler (the program may have installed its own since).
inline bool sample_handler_installed(int sig) {
  struct sigaction cur {};
  if (sig <= 0 || sys().sigaction(sig, nullptr, &cur) != 0) return false;
  return (cur.sa_flags & SA_SIGINFO) && cur.sa_sigaction == &sample_signal_handler;
}

// A program that installed its own handler since keeps it: nothing is restored over it. Returns false
// when a handler was still running after the bounded wait (see wait_handlers_quiet).
inline bool restore_sample_handler(installed_signal& s) {
  if (s.number == 0) return wait_handlers_quiet();
  if (!sample_handler_installed(s.number)) {
    s.number = 0;
    return wait_handlers_quiet();
  }
  struct sigaction ign {};
  ign.sa_handler = SIG_IGN;
  sigemptyset(&ign.sa_mask);
  sys().sigaction(s.number, &ign, nullptr);
  const bool quiet = wait_handlers_quiet();
  sys().sigaction(s.number, &s.previous, nullptr);
  s.number = 0;
  return quiet;
}

}  // namespace detail
}  // namespace selfprof
