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
#include <string>
#include <string_view>

#include "selfprof/config.hpp"
#include "selfprof/jit/options.hpp"
#include "selfprof/status.hpp"

namespace selfprof {
namespace jit {

// Registers [code, code+size) under `name` (sanitised: control bytes become '_', cut at 512 bytes, at
// least 3 characters). Registering again at the same address replaces the earlier code from now on.
// Thread-safe; a few hundred nanoseconds; file writes happen in the background. False for null or empty.
SELFPROF_API bool add(const void* code, std::size_t size, std::string_view name);

// Marks the code registered at `code` as gone from now on (samples taken before still name it).
// False when no live region starts there.
SELFPROF_API bool remove(const void* code);

// Writes every pending registration to the perf map (and jitdump) now; also done in the background,
// at exit and at each dump. Returns why a file was refused or could not be written.
SELFPROF_API status flush();

// Settings for the process-wide JIT support; only before the first add() (an error afterwards).
SELFPROF_API status configure(const options& o);

// Where the perf map goes (or went) for this process.
SELFPROF_API std::string perf_map_path();

}  // namespace jit
}  // namespace selfprof

#if SELFPROF_DETAIL_WITH_IMPLEMENTATION
#include "selfprof/jit/api.hpp"
#endif
