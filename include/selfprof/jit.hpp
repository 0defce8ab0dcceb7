// selfprof::jit: name code generated at run time, for selfprof's own profiles (with the code that was at
// an address when each sample was taken) and for perf (/tmp/perf-<pid>.map, optionally jit-<pid>.dump).
// Context: any thread (never the signal handler). Usable whether or not profiling has started.
//
//   void* code = emit(...);                        // anonymous PROT_EXEC memory, as perf requires
//   selfprof::jit::add(code, size, "lua:fib");     // before the code first runs
//   ...
//   selfprof::jit::remove(code);                   // before the memory is reused
//
// Environment: SELFPROF_PERF_MAP=0|1 (default 1), SELFPROF_JITDUMP=0|1 (default 0), SELFPROF_JITDUMP_DIR.
// perf reads a jitdump only with `perf record -k 1 ...` followed by `perf inject --jit`.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "selfprof/jit/options.hpp"
#include "selfprof/jit/runtime.hpp"
#include "selfprof/profile.hpp"
#include "selfprof/status.hpp"

namespace selfprof {
namespace jit {

// Registers [code, code+size) under `name` (sanitised: control bytes become '_', cut at 512 bytes, at
// least 3 characters). Registering again at the same address replaces the earlier code from now on.
// Thread-safe; a few hundred nanoseconds; file writes happen in the background. False for null or empty.
inline bool add(const void* code, std::size_t size, std::string_view name) {
  return selfprof::detail::jit_global().add(code, size, name);
}

// Marks the code registered at `code` as gone from now on (samples taken before still name it).
// False when no live region starts there.
inline bool remove(const void* code) {
  if (selfprof::detail::jit_runtime_slot().load(std::memory_order_acquire) == nullptr) return false;
  return selfprof::detail::jit_global().remove(code);
}

// Writes every pending registration to the perf map (and jitdump) now; also done in the background,
// at exit and (once wired) at each dump. Returns why a file was refused or could not be written.
inline status flush() {
  if (selfprof::detail::jit_runtime_slot().load(std::memory_order_acquire) == nullptr) return status::ok();
  return selfprof::detail::jit_global().flush();
}

// Settings for the process-wide JIT support; only before the first add() (an error afterwards).
inline status configure(const options& o) {
  std::lock_guard<std::mutex> lock(selfprof::detail::jit_runtime_init_mutex());
  if (selfprof::detail::jit_runtime_slot().load(std::memory_order_acquire) != nullptr)
    return status::error("selfprof: jit::configure() must come before the first jit::add()");
  selfprof::detail::jit_pending_options() = o;
  return status::ok();
}

// Where the perf map goes (or went) for this process.
inline std::string perf_map_path() { return selfprof::detail::jit_global().perf_map_path(); }

namespace detail {

// Collector hook: for a pc of a sample taken at time_ns (CLOCK_MONOTONIC), rewrites it to a tagged value
// naming the JIT region in place then (and returns true). False at once when no JIT code was registered.
inline bool translate_pc(std::uint64_t& pc, std::uint64_t time_ns) {
  selfprof::detail::jit_runtime* rt = selfprof::detail::jit_runtime_slot().load(std::memory_order_acquire);
  return rt != nullptr && rt->registry().translate(pc, time_ns);
}

// Symbolizer hook: names a value made by translate_pc (or that value minus one, as looked up for return
// addresses): kind jit, module "[jit]", the name registered, address the original pc.
inline bool name_tagged(std::uint64_t tagged, selfprof::frame& out) {
  if (!selfprof::detail::is_jit_tagged(tagged)) return false;
  selfprof::detail::jit_runtime* rt = selfprof::detail::jit_runtime_slot().load(std::memory_order_acquire);
  return rt != nullptr && rt->registry().name(tagged, out);
}

}  // namespace detail
}  // namespace jit
}  // namespace selfprof
