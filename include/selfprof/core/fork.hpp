// fork(2) and the profiler: a forked child has one thread and copies of every lock and kernel object of
// the parent. Before the fork every lock of the profiler is taken, so no copy is held by a thread that
// does not exist in the child. The child forgets the parent's threads (collector, dumper, wall sampler),
// tick sources (leaked, never disarmed: they are the parent's) and samples, gives the sampling signal
// back, and is not profiled until it calls start() itself. The parent goes on as before.
// Context: pthread_atfork handlers (the forking thread, and the child's only thread).
#pragma once

#include <pthread.h>

#include <new>

#include "selfprof/core/profiler.hpp"

namespace selfprof {
namespace detail {

inline void profiler_core::install_fork_handlers_once() {
  static bool done = false;
  if (done) return;
  done = true;
  pthread_atfork([] { instance().fork_prepare(); }, [] { instance().fork_parent(); },
                 [] { instance().fork_child(); });
}

inline void profiler_core::fork_child() {
  // Another thread of the parent may have been inside the handler at the fork: its in-flight count was
  // copied, but that thread does not exist here, and stop() would wait for it forever.
  g_handler.in_flight.store(0, std::memory_order_release);
  g_dump_requests.in_flight.store(0, std::memory_order_release);  // a handler on a thread the child lacks
  wall_sampler_.abandon_after_fork();
  if (running_) {
    g_handler.active.store(false, std::memory_order_seq_cst);  // pairs with the handler's in_flight
    collector_.abandon_after_fork();
    dumps_.abandon_after_fork();
    server_.abandon_after_fork();
    if (signal_.number != 0) sys().sigaction(signal_.number, &signal_.previous, nullptr);
    signal_.number = 0;
    g_handler.ring.store(nullptr, std::memory_order_release);
    running_ = false;
  }
  // The child's CPU clocks start at zero and the parent's session is not its own: no CPU times.
  process_cpu0_ = own_cpu0_ = process_cpu_end_ = own_cpu_end_ = 0;
  registry_.abandon_after_fork();
  store_.abandon_after_fork();
  session_.abandon_after_fork();
  // Without the symbolizer's lock, a dump or the unwind-row build (which runs under it) may have been
  // half done on another thread of the parent.
  if (!symbols_locked_for_fork_) abandon_unwind_tables_after_fork();
  symbols_.abandon_after_fork(symbols_locked_for_fork_);
  new (&control_mu_) std::mutex();
}

}  // namespace detail
}  // namespace selfprof
