// The JIT runtime: the registry plus the batched perf map and jitdump writers behind selfprof::jit::add,
// remove and flush — one lock for registration, pending bytes written by a background thread (or on
// size/age thresholds), at flush() and at exit; follows fork() to the child's own files.
// Context: any thread (never the signal handler).
#pragma once

#include <pthread.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <atomic>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <new>
#include <string>
#include <string_view>
#include <vector>

#include "selfprof/detail/worker.hpp"
#include "selfprof/jit/jitdump_writer.hpp"
#include "selfprof/jit/name.hpp"
#include "selfprof/jit/options.hpp"
#include "selfprof/jit/perf_map_writer.hpp"
#include "selfprof/jit/registry.hpp"
#include "selfprof/signal/clock.hpp"
#include "selfprof/status.hpp"

namespace selfprof {
namespace detail {

// Pending bytes above which add() writes itself instead of waiting for the background thread.
constexpr std::size_t jit_pending_hard_limit = std::size_t{8} << 20;

class jit_runtime {
 public:
  explicit jit_runtime(jit::options opts)
      : opts_(std::move(opts)),
        pid_(opts_.pid != 0 ? opts_.pid : static_cast<long>(::getpid())),
        map_(opts_.perf_map_dir, pid_),
        dump_(opts_.jitdump_dir, pid_),
        map_on_(opts_.perf_map),
        dump_on_(opts_.jitdump) {}
  jit_runtime(const jit_runtime&) = delete;
  jit_runtime& operator=(const jit_runtime&) = delete;
  ~jit_runtime() {
    flusher_.stop();
    flush();
  }

  bool add(const void* code, std::size_t size, std::string_view name) {
    if (code == nullptr || size == 0 || size > 0xffffffffu) return false;
    std::uint64_t now = monotonic_ns();
    std::uint32_t tid = opts_.jitdump ? static_cast<std::uint32_t>(::syscall(SYS_gettid)) : 0;
    auto start = static_cast<std::uint64_t>(reinterpret_cast<std::uintptr_t>(code));
    bool notify = false, write_now = false;
    {
      std::lock_guard<std::mutex> lock(mu_);
      scratch_.clear();
      append_jit_name(scratch_, name);
      std::uint32_t gen = registry_.add(start, static_cast<std::uint32_t>(size), scratch_, now);
      std::size_t before = pending_map_.size() + pending_dump_.size();
      if (map_on_) append_perf_map_line(pending_map_, start, size, scratch_);
      if (dump_on_)
        append_jitdump_code_load(pending_dump_, static_cast<std::uint32_t>(pid_), tid, start, size, gen,
                                 scratch_, size <= jitdump_max_code_bytes ? code : nullptr, now);
      std::size_t after = pending_map_.size() + pending_dump_.size();
      if (after == 0) return true;
      if (before == 0) oldest_pending_ns_ = now;
      if (opts_.background_flush && !flusher_.running() && !no_flusher_) start_flusher_locked();
      if (flusher_.running()) {
        notify = before == 0 || (before < opts_.flush_bytes && after >= opts_.flush_bytes);
        write_now = after >= jit_pending_hard_limit;  // the thread is behind: push back on the JIT
      } else {
        write_now =
            after >= opts_.flush_bytes || now - oldest_pending_ns_ >= opts_.flush_delay_ms * 1000000ull;
      }
    }
    if (notify) flusher_.wake();
    if (write_now) flush();
    return true;
  }

  bool remove(const void* code) {
    std::uint64_t now = monotonic_ns();
    std::lock_guard<std::mutex> lock(mu_);
    return registry_.remove(static_cast<std::uint64_t>(reinterpret_cast<std::uintptr_t>(code)), now);
  }

  // Writes everything registered so far. An error (a refused or unwritable file) is returned on every
  // call and printed once on stderr; the registry keeps working for selfprof's own symbolizer.
  status flush() {
    std::lock_guard<std::mutex> w(write_mu_);
    bool map_on, dump_on;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (reemit_after_fork_) {
        reemit_after_fork_ = false;
        std::string lines;
        if (map_on_)
          registry_.for_each_live(
              [&](const jit_region& r) { append_perf_map_line(lines, r.start, r.size(), r.name()); });
        pending_map_.insert(0, lines);
      }
      pending_map_.swap(write_map_);
      pending_dump_.swap(write_dump_);
      map_on = map_on_;
      dump_on = dump_on_;
    }
    if (!write_map_.empty() && map_on) write_file(false);
    if (!write_dump_.empty() && dump_on) write_file(true);
    write_map_.clear();
    write_dump_.clear();
    if (!map_error_) return map_error_;
    return dump_error_;
  }

  jit_registry& registry() { return registry_; }
  std::string perf_map_path() {
    std::lock_guard<std::mutex> w(write_mu_);
    return map_.path();
  }
  std::string jitdump_path() {
    std::lock_guard<std::mutex> w(write_mu_);
    return dump_.path();
  }

  // fork(2) support for the process-wide runtime: take the locks before, release them after; the
  // child forgets the parent's files, pending bytes and thread, and writes its live regions to its own map.
  void atfork_prepare() {
    write_mu_.lock();
    mu_.lock();
  }
  void atfork_parent() {
    mu_.unlock();
    write_mu_.unlock();
  }
  void atfork_child() {
    registry_.reset_lookup_after_fork();
    flusher_.abandon_after_fork();  // that thread does not exist here
    no_flusher_ = true;             // no thread behind the child's back: thresholds, flush() and exit write
    pending_map_.clear();
    pending_dump_.clear();
    write_map_.clear();
    write_dump_.clear();
    if (opts_.pid == 0) pid_ = static_cast<long>(::getpid());
    map_.abandon_after_fork(opts_.perf_map_dir, pid_);
    dump_.abandon_after_fork(opts_.jitdump_dir, pid_);
    map_error_ = status::ok();
    dump_error_ = status::ok();
    reemit_after_fork_ = registry_.count() != 0;
    atfork_parent();
  }

 private:
  // Opens (once) and writes one of the two files; on failure reports once and turns that file off.
  void write_file(bool is_dump) {
    status& error = is_dump ? dump_error_ : map_error_;
    if (!error) return;  // refused earlier: stays off
    const std::string& bytes = is_dump ? write_dump_ : write_map_;
    status st = is_dump ? dump_.open(monotonic_ns()) : map_.open();
    if (st) st = is_dump ? dump_.write(bytes) : map_.write(bytes);
    if (st) return;
    error = st;
    std::fprintf(stderr, "%s\n", st.message().c_str());
    std::lock_guard<std::mutex> lock(mu_);  // stop collecting bytes nobody will write
    (is_dump ? dump_on_ : map_on_) = false;
    (is_dump ? pending_dump_ : pending_map_).clear();
  }

  void start_flusher_locked() {
    // No thread (EAGAIN, a sandbox): thresholds, flush() and exit still write.
    if (!flusher_.start("selfprof-jit", &jit_runtime::flusher_main, this)) no_flusher_ = true;
  }

  static void flusher_main(void* self) { static_cast<jit_runtime*>(self)->flusher_loop(); }

  // Woken by add() when bytes are pending; lets a burst of registrations gather into one write (until
  // flush_bytes are pending or flush_delay_ms passed), then writes.
  void flusher_loop() {
    while (flusher_.wait(-1)) {
      const std::uint64_t deadline = monotonic_ns() + opts_.flush_delay_ms * 1000000ull;
      for (;;) {
        {
          std::lock_guard<std::mutex> lock(mu_);
          if (pending_map_.size() + pending_dump_.size() >= opts_.flush_bytes) break;
        }
        const std::uint64_t now = monotonic_ns();
        if (now >= deadline) break;
        if (!flusher_.wait(static_cast<int>((deadline - now) / 1000000ull) + 1)) return;
      }
      flush();
    }
  }

  jit::options opts_;
  long pid_;

  std::mutex write_mu_;  // taken before mu_; serialises writes so lines keep registration order
  perf_map_writer map_;
  jitdump_writer dump_;
  std::string write_map_, write_dump_;  // bytes being written
  status map_error_, dump_error_;

  std::mutex mu_;  // registry writers, pending bytes, flags
  jit_registry registry_;
  std::string scratch_;
  std::string pending_map_, pending_dump_;
  std::uint64_t oldest_pending_ns_ = 0;
  bool map_on_, dump_on_;
  bool reemit_after_fork_ = false;
  bool no_flusher_ = false;
  worker flusher_;  // "selfprof-jit"
};

// The process-wide runtime, or null before the first registration (lookups then return at once).
inline std::atomic<jit_runtime*>& jit_runtime_slot() {
  static std::atomic<jit_runtime*> slot{nullptr};
  return slot;
}

inline std::mutex& jit_runtime_init_mutex() {
  static std::mutex mu;
  return mu;
}

inline jit::options& jit_pending_options() {  // set by jit::configure() before the runtime exists
  static jit::options o;
  static bool init = false;
  if (!init) {
    init = true;
    std::vector<std::string> warnings;
    o = jit::options_from_env(&warnings);
    for (auto& w : warnings) std::fprintf(stderr, "%s\n", w.c_str());
  }
  return o;
}

// Creates the process-wide runtime on first use (never destroyed: usable from atexit and other threads
// to the end), flushing it at exit and following fork().
inline jit_runtime& jit_global() {
  jit_runtime* rt = jit_runtime_slot().load(std::memory_order_acquire);
  if (rt != nullptr) return *rt;
  std::lock_guard<std::mutex> lock(jit_runtime_init_mutex());
  rt = jit_runtime_slot().load(std::memory_order_relaxed);
  if (rt != nullptr) return *rt;
  rt = new jit_runtime(jit_pending_options());
  jit_runtime_slot().store(rt, std::memory_order_release);
  std::atexit([] { jit_runtime_slot().load()->flush(); });
  pthread_atfork([] { jit_runtime_slot().load()->atfork_prepare(); },
                 [] { jit_runtime_slot().load()->atfork_parent(); },
                 [] { jit_runtime_slot().load()->atfork_child(); });
  return *rt;
}

// The collector's hook: rewrites the pc of a sample taken at time_ns (CLOCK_MONOTONIC) to a tagged value
// naming the JIT region in place then (and returns true). False at once when no JIT code was registered.
inline bool jit_translate_pc(std::uint64_t& pc, std::uint64_t time_ns) {
  jit_runtime* rt = jit_runtime_slot().load(std::memory_order_acquire);
  return rt != nullptr && rt->registry().translate(pc, time_ns);
}

// The symbolizer's hook: names a value made by jit_translate_pc (or that value minus one, as looked up for
// return addresses): kind jit, module "[jit]", the name registered, address the original pc.
inline bool jit_name_tagged(std::uint64_t tagged, frame& out) {
  if (!is_jit_tagged(tagged)) return false;
  jit_runtime* rt = jit_runtime_slot().load(std::memory_order_acquire);
  return rt != nullptr && rt->registry().name(tagged, out);
}

}  // namespace detail
}  // namespace selfprof
