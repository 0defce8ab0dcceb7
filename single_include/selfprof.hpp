// selfprof 0.1.0: the whole library in one header, generated from include/ by
// scripts/amalgamate.py. Do not edit; change include/ and run `python3 scripts/amalgamate.py`.
// Context: see the Context: line of each section below.
#pragma once
// selfprof: a CPU profiler a Linux program embeds in itself. Include this one header.
// Context: any thread (see each part's header for where its functions may run).
//
// Header-only by default. With SELFPROF_COMPILED_LIB=1 (the compiled library) this header declares the
// API only; the inline utilities (the folded-text reader, the symbolizer, the writers) are then
// included from their own headers where needed.

// ---- begin selfprof/config.hpp ----
// Every compile-time switch of selfprof in one place, each with its default and meaning.
// Context: any thread (macros only; includes nothing, so signal/ headers may include it).
//
// Switches are 0/1 and are always defined after this header, so code tests them with
// `#if SELFPROF_HAS_LIBDW`, never `#ifdef`, and the tree compiles cleanly with -Wundef. Define one on
// the command line (-DSELFPROF_HAS_ZLIB=1) to override the default; the CMake and Meson builds define
// the SELFPROF_HAS_* switches from what they detect. The most frames kept per sample is a run-time
// option (options::max_depth, SELFPROF_MAX_DEPTH in the environment), not a switch.
//
// There is no libunwind switch: the built-in .eh_frame row tables unwind code built without frame
// pointers both in the signal handler and on the stacks the wall sampler copies, lock-free. libunwind's
// unw_step takes the loader lock (not safe in a signal handler), and linked in, libunwind replaces
// libgcc's _Unwind_* functions for the whole program (C++ exceptions would then unwind through it).
//
// | switch                 | default | meaning                                                        |
// | ---------------------- | ------- | -------------------------------------------------------------- |
// | SELFPROF_HAS_LIBDW     | 0       | 1: the symbolizer uses elfutils libdw for file:line and inline |
// |                        |         | frames (link -ldw). 0: ELF symbol tables only.                 |
// | SELFPROF_LIBDW_DLOPEN  | 0       | with SELFPROF_HAS_LIBDW=1: 1 loads libdw.so.1 with dlopen at   |
// |                        |         | the first DWARF lookup (no -ldw; the preload library uses it). |
// | SELFPROF_HAS_ZLIB      | 0       | 1: .pb.gz (pprof) output is deflate-compressed with zlib (link |
// |                        |         | -lz). 0: a valid gzip stream made of stored (uncompressed)     |
// |                        |         | blocks.                                                        |
// | SELFPROF_ZLIB_DLOPEN   | 0       | with SELFPROF_HAS_ZLIB=1: 1 loads libz.so.1 with dlopen at the |
// |                        |         | first compression (no -lz; the preload library uses it).       |
// | SELFPROF_COMPILED_LIB  | 0       | 0: header-only, every function inline. 1: the implementation  |
// |                        |         | is compiled once, in a library (CMake SELFPROF_COMPILED=ON,    |
// |                        |         | Meson -Dcompiled=true) or in the one translation unit that     |
// |                        |         | defines SELFPROF_IMPLEMENTATION before including selfprof.hpp; |
// |                        |         | <selfprof.hpp> then declares the API and includes nothing else.|

#ifndef SELFPROF_COMPILED_LIB
#define SELFPROF_COMPILED_LIB 0
#endif
#if SELFPROF_COMPILED_LIB != 0 && SELFPROF_COMPILED_LIB != 1
#error "SELFPROF_COMPILED_LIB must be 0 or 1"
#endif

// SELFPROF_API: how the public functions are declared and defined (inline in header-only mode).
// SELFPROF_DETAIL_WITH_IMPLEMENTATION: 1 in the translation units that hold the implementation.
#if SELFPROF_COMPILED_LIB
#define SELFPROF_API
#if defined(SELFPROF_IMPLEMENTATION)
#define SELFPROF_DETAIL_WITH_IMPLEMENTATION 1
#else
#define SELFPROF_DETAIL_WITH_IMPLEMENTATION 0
#endif
#else
#define SELFPROF_API inline
#define SELFPROF_DETAIL_WITH_IMPLEMENTATION 1
#endif

#ifndef SELFPROF_HAS_LIBDW
#define SELFPROF_HAS_LIBDW 0
#endif

#ifndef SELFPROF_LIBDW_DLOPEN
#define SELFPROF_LIBDW_DLOPEN 0
#endif
#ifndef SELFPROF_HAS_ZLIB
#define SELFPROF_HAS_ZLIB 0
#endif
#ifndef SELFPROF_ZLIB_DLOPEN
#define SELFPROF_ZLIB_DLOPEN 0
#endif

#if SELFPROF_HAS_LIBDW != 0 && SELFPROF_HAS_LIBDW != 1
#error "SELFPROF_HAS_LIBDW must be 0 or 1"
#endif
#if SELFPROF_LIBDW_DLOPEN != 0 && SELFPROF_LIBDW_DLOPEN != 1
#error "SELFPROF_LIBDW_DLOPEN must be 0 or 1"
#endif
#if SELFPROF_HAS_ZLIB != 0 && SELFPROF_HAS_ZLIB != 1
#error "SELFPROF_HAS_ZLIB must be 0 or 1"
#endif
#if SELFPROF_ZLIB_DLOPEN != 0 && SELFPROF_ZLIB_DLOPEN != 1
#error "SELFPROF_ZLIB_DLOPEN must be 0 or 1"
#endif

// A switch turned on without its library installed fails here with its name rather than deep inside a
// system header.
#if defined(__has_include)
#if SELFPROF_HAS_LIBDW && !__has_include(<elfutils/libdw.h>)
#error "SELFPROF_HAS_LIBDW=1 but <elfutils/libdw.h> is missing (Debian: libdw-dev)"
#endif
#if SELFPROF_HAS_ZLIB && !__has_include(<zlib.h>)
#error "SELFPROF_HAS_ZLIB=1 but <zlib.h> is missing (Debian: zlib1g-dev)"
#endif
#endif
// ---- end selfprof/config.hpp ----
// ---- begin selfprof/frames.hpp ----
// Game and engine frames: SELFPROF_FRAME() and selfprof::frame_mark(name) mark the end of one frame of a
// loop on the calling thread, so samples can be told apart by frame and slow frames profiled on their own.
// Context: any thread (the thread that runs the loop); costs no system call.

#include <cstdint>

// ---- begin selfprof/signal/clock.hpp ----
// Signal-handler code: the one clock every sample, game frame and collector decision is stamped with.
// Context: signal handler (clock_gettime is async-signal-safe, and a vDSO call without a system call),
// also any other thread.

#include <time.h>

#include <cstdint>

namespace selfprof {
namespace detail {

// Clock `id` in nanoseconds (0 when it cannot be read: a thread's clock after the thread ended).
inline std::uint64_t clock_ns(clockid_t id) {
  struct timespec ts;
  if (clock_gettime(id, &ts) != 0) return 0;
  return static_cast<std::uint64_t>(ts.tv_sec) * 1000000000ull + static_cast<std::uint64_t>(ts.tv_nsec);
}

// CLOCK_MONOTONIC in nanoseconds.
inline std::uint64_t monotonic_ns() { return clock_ns(CLOCK_MONOTONIC); }

// CPU time of the calling thread in nanoseconds (0 when the clock cannot be read).
inline std::uint64_t this_thread_cpu_ns() { return clock_ns(CLOCK_THREAD_CPUTIME_ID); }

// CPU time of the whole process, every thread, in nanoseconds (0 when the clock cannot be read).
inline std::uint64_t process_cpu_ns() { return clock_ns(CLOCK_PROCESS_CPUTIME_ID); }

}  // namespace detail
}  // namespace selfprof
// ---- end selfprof/signal/clock.hpp ----
// ---- begin selfprof/signal/game_frames.hpp ----
// Game/engine frame slots: a preallocated table of per-thread frame counters that frame_mark() writes,
// the signal handler reads to tag each sample with its frame, and the collector drains closed frames from.
// Context: signal handler (game_frame_tag_for: lock-free, no TLS, no allocation); frame_mark runs in the
// marking application thread; the collector thread reads closed frames.

#include <atomic>
#include <cstddef>
#include <cstdint>

namespace selfprof {
namespace detail {

// Threads that can mark frames at the same time. A thread that exits gives its slot back once the
// collector has read its last frames; a marker beyond this many live threads is ignored (and counted).
constexpr std::size_t kGameFrameSlots = 64;
// Closed frames a slot holds until the collector reads them (every 20 ms): 256 covers 12.8 kHz loops.
constexpr std::size_t kClosedGameFrameRing = 256;
// A tag is (slot index + 1) << 48 | frame sequence number; 0 means "not on a marked thread".
constexpr unsigned kGameFrameTagShift = 48;
constexpr std::uint64_t kGameFrameSeqMask = (std::uint64_t(1) << kGameFrameTagShift) - 1;
// The tag of a sample that carries its time instead (taken without code of selfprof's running on the
// thread: the ring source); the collector looks its frame up by time. Its slot part is out of range.
constexpr std::uint64_t kGameFrameTagByTime = ~std::uint64_t(0);

enum game_frame_slot_state : std::uint32_t {
  game_frame_free = 0,
  game_frame_claiming = 1,  // a thread is filling it in
  game_frame_live = 2,      // its thread marks frames
  game_frame_retired = 3,   // its thread exited; the collector frees it after reading the last frames
};

struct closed_game_frame {
  std::uint64_t seq;       // frame number on this thread (1 = the first frame that ended)
  std::uint64_t start_ns;  // CLOCK_MONOTONIC
  std::uint64_t end_ns;
};

// One marking thread. Single producer (the marking thread) for the closed-frame ring and the counters;
// the handler reads `tid` and `seq`; the collector consumes the ring.
struct alignas(64) game_frame_slot {
  std::atomic<std::uint32_t> state{game_frame_free};
  std::atomic<std::uint32_t> tid{0};
  std::atomic<std::uint32_t> generation{0};  // bumped on each claim: the collector notices reuse
  std::atomic<const char*> name{nullptr};    // loop name (a string literal or otherwise static text)
  std::atomic<std::uint64_t> seq{0};         // number of the frame running now (1 from the claim on)
  std::atomic<std::uint64_t> start_ns{0};    // when it started (0: before the first mark)
  std::atomic<std::uint64_t> head{0};        // closed frames written (producer)
  std::atomic<std::uint64_t> tail{0};        // closed frames read (collector)
  std::atomic<std::uint64_t> lost{0};        // closed frames the ring had no room for
  closed_game_frame ring[kClosedGameFrameRing]{};
};

// Constant-initialized, like the handler's globals: valid in any thread at any time. All zero, so it
// lives in .bss and costs a process nothing until a thread marks frames (it is 400 KB: a dynamic
// initializer touched every slot's page at load).
struct game_frame_table {
  std::atomic<std::uint32_t> high_water{0};  // slots [0, high_water) have been used at least once
  std::atomic<std::uint64_t> no_slot{0};     // marks ignored because every slot was taken
  game_frame_slot slots[kGameFrameSlots];
};

inline game_frame_table g_game_frames;

// The tag of the frame `tid` is running now, or 0. Async-signal-safe: a bounded scan of atomics.
inline std::uint64_t game_frame_tag_for(std::uint32_t tid) {
  game_frame_table& t = g_game_frames;
  std::uint32_t n = t.high_water.load(std::memory_order_acquire);
  if (n > kGameFrameSlots) n = kGameFrameSlots;
  for (std::uint32_t i = 0; i < n; ++i) {
    game_frame_slot& s = t.slots[i];
    if (s.tid.load(std::memory_order_relaxed) != tid) continue;
    if (s.state.load(std::memory_order_acquire) != game_frame_live) continue;
    // The handler runs on the marking thread itself (per-thread ticks), so program order suffices.
    return (std::uint64_t(i + 1) << kGameFrameTagShift) |
           (s.seq.load(std::memory_order_relaxed) & kGameFrameSeqMask);
  }
  return 0;
}

inline std::size_t game_frame_tag_slot(std::uint64_t tag) {
  return static_cast<std::size_t>(tag >> kGameFrameTagShift) - 1;
}
inline std::uint64_t game_frame_tag_seq(std::uint64_t tag) { return tag & kGameFrameSeqMask; }

// Claims a free slot for `tid`, or returns nullptr when all are taken. Called once per marking thread.
inline game_frame_slot* claim_game_frame_slot(std::uint32_t tid, const char* name) {
  game_frame_table& t = g_game_frames;
  for (std::size_t i = 0; i < kGameFrameSlots; ++i) {
    game_frame_slot& s = t.slots[i];
    std::uint32_t expected = game_frame_free;
    if (!s.state.compare_exchange_strong(expected, game_frame_claiming, std::memory_order_acq_rel)) continue;
    s.tid.store(tid, std::memory_order_relaxed);
    s.name.store(name, std::memory_order_relaxed);
    s.seq.store(1, std::memory_order_relaxed);
    s.start_ns.store(0, std::memory_order_relaxed);
    s.lost.store(0, std::memory_order_relaxed);
    s.head.store(0, std::memory_order_relaxed);
    s.tail.store(0, std::memory_order_relaxed);
    s.generation.fetch_add(1, std::memory_order_relaxed);
    s.state.store(game_frame_live, std::memory_order_release);
    std::uint32_t hw = t.high_water.load(std::memory_order_relaxed);
    while (hw < i + 1 && !t.high_water.compare_exchange_weak(hw, static_cast<std::uint32_t>(i + 1),
                                                             std::memory_order_acq_rel)) {
    }
    return &s;
  }
  t.no_slot.fetch_add(1, std::memory_order_relaxed);
  return nullptr;
}

// Ends the running frame at `now_ns` and starts the next. Marking thread only; no system call.
inline void close_game_frame(game_frame_slot& s, std::uint64_t now_ns) {
  const std::uint64_t start = s.start_ns.load(std::memory_order_relaxed);
  const std::uint64_t seq = s.seq.load(std::memory_order_relaxed);
  if (start != 0) {
    const std::uint64_t h = s.head.load(std::memory_order_relaxed);
    if (h - s.tail.load(std::memory_order_acquire) < kClosedGameFrameRing) {
      s.ring[h % kClosedGameFrameRing] = closed_game_frame{seq, start, now_ns};
      s.head.store(h + 1, std::memory_order_release);
    } else {
      s.lost.fetch_add(1, std::memory_order_relaxed);
    }
    s.seq.store(seq + 1, std::memory_order_relaxed);
  }
  // The first mark only starts frame 1: the time before it is not a frame.
  s.start_ns.store(now_ns, std::memory_order_relaxed);
}

// The marking thread exits: samples stop being tagged; the collector frees the slot after draining it.
inline void retire_game_frame_slot(game_frame_slot& s) {
  s.state.store(game_frame_retired, std::memory_order_release);
}

}  // namespace detail
}  // namespace selfprof
// ---- end selfprof/signal/game_frames.hpp ----
// ---- begin selfprof/signal/raw_syscall.hpp ----
// Signal-handler code: raw system calls that touch neither errno nor libc state.
// Context: signal handler (async-signal-safe), also usable anywhere else.

#include <sys/syscall.h>
#include <unistd.h>

#include <cstdint>

namespace selfprof {
namespace detail {

// Returns the kernel's raw result: >= 0 on success, -errno on failure. errno is never written.
inline long raw_syscall3(long nr, long a, long b, long c) {
#if defined(__x86_64__)
  long ret;
  __asm__ volatile("syscall" : "=a"(ret) : "a"(nr), "D"(a), "S"(b), "d"(c) : "rcx", "r11", "memory");
  return ret;
#else
  // Other architectures: libc's syscall() writes errno, which the handler saves and restores anyway.
  long ret = ::syscall(nr, a, b, c);
  return ret;
#endif
}

inline long raw_syscall4(long nr, long a, long b, long c, long d) {
#if defined(__x86_64__)
  long ret;
  register long r10 __asm__("r10") = d;
  __asm__ volatile("syscall"
                   : "=a"(ret)
                   : "a"(nr), "D"(a), "S"(b), "d"(c), "r"(r10)
                   : "rcx", "r11", "memory");
  return ret;
#else
  return ::syscall(nr, a, b, c, d);
#endif
}

inline long raw_syscall6(long nr, long a, long b, long c, long d, long e, long f) {
#if defined(__x86_64__)
  long ret;
  register long r10 __asm__("r10") = d;
  register long r8 __asm__("r8") = e;
  register long r9 __asm__("r9") = f;
  __asm__ volatile("syscall"
                   : "=a"(ret)
                   : "a"(nr), "D"(a), "S"(b), "d"(c), "r"(r10), "r"(r8), "r"(r9)
                   : "rcx", "r11", "memory");
  return ret;
#else
  return ::syscall(nr, a, b, c, d, e, f);
#endif
}

inline std::uint32_t raw_gettid() { return static_cast<std::uint32_t>(raw_syscall3(SYS_gettid, 0, 0, 0)); }

// True when the 8 bytes at `address` can be read. rt_sigprocmask copies the new set from user memory
// before it validates `how`, so an invalid `how` yields EFAULT for unreadable memory and EINVAL for
// readable memory, with no side effect (the technique gperftools uses; see rt_sigprocmask(2)).
inline bool raw_readable(std::uintptr_t address) {
  long r = raw_syscall4(SYS_rt_sigprocmask, ~0L, static_cast<long>(address), 0, 8);
  return r != -14 /* EFAULT */;
}

}  // namespace detail
}  // namespace selfprof
// ---- end selfprof/signal/raw_syscall.hpp ----

namespace selfprof {
namespace detail {

// The calling thread's slot, cached in a thread_local of the *application* thread (the signal handler
// never touches it). The destructor gives the slot back when the thread exits.
struct game_frame_marker {
  game_frame_slot* slot = nullptr;
  bool refused = false;  // every slot was taken when this thread first marked: stay silent, stay cheap
  ~game_frame_marker() {
    if (slot) retire_game_frame_slot(*slot);
  }
};

inline game_frame_marker& this_thread_game_frames() {
  static thread_local game_frame_marker tls;
  return tls;
}

}  // namespace detail

// Marks the end of a frame of the loop `name` on this thread (and the start of the next one). The first
// call on a thread only starts frame 1. `name` must stay valid for the life of the program (a string
// literal); one loop per thread: a thread keeps the name of its first mark. Safe to call every frame,
// forever, whether the profiler runs or not: a few clock reads and stores, no system call, no allocation
// after the first call.
inline void frame_mark(const char* name = "frame") {
  detail::game_frame_marker& m = detail::this_thread_game_frames();
  if (m.slot == nullptr) {
    if (m.refused) return;
    m.slot = detail::claim_game_frame_slot(detail::raw_gettid(), name ? name : "frame");
    if (m.slot == nullptr) {
      m.refused = true;
      return;
    }
  }
  detail::close_game_frame(*m.slot, detail::monotonic_ns());
}

}  // namespace selfprof

// End of one game/engine frame on this thread (loop name "frame").
#define SELFPROF_FRAME() ::selfprof::frame_mark("frame")
// ---- end selfprof/frames.hpp ----
// ---- begin selfprof/jit.hpp ----
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

#include <cstddef>
#include <string>
#include <string_view>

// ---- begin selfprof/jit/options.hpp ----
// Settings of selfprof's JIT support (perf map, jitdump, flushing) and their SELFPROF_* environment
// variables.
// Context: setup only.

#include <cstddef>
#include <cstdlib>
#include <string>
#include <vector>

namespace selfprof {
namespace jit {

struct options {
  bool perf_map = true;               // SELFPROF_PERF_MAP=0|1: write /tmp/perf-<pid>.map for perf
  std::string perf_map_dir = "/tmp";  // where perf looks; tests point it elsewhere
  long pid = 0;                       // pid in the file names; 0: getpid(), and the child's own after fork
  bool jitdump = false;               // SELFPROF_JITDUMP=0|1: also write jit-<pid>.dump for perf inject --jit
  std::string jitdump_dir;            // SELFPROF_JITDUMP_DIR; empty: the current directory
  bool background_flush = true;       // a thread writes pending lines; false: only size/age thresholds on
                                      // add(), flush() and exit
  unsigned flush_delay_ms = 50;       // a registration reaches the files at most about this much later
  std::size_t flush_bytes = 64 * 1024;  // pending bytes that trigger a write at once
};

namespace detail {

inline bool parse_flag(const char* text, bool& out) {
  std::string s = text ? text : "";
  if (s == "1" || s == "true" || s == "yes" || s == "on") return out = true, true;
  if (s == "0" || s == "false" || s == "no" || s == "off") return out = false, true;
  return false;
}

}  // namespace detail

// Defaults overridden by SELFPROF_PERF_MAP, SELFPROF_JITDUMP and SELFPROF_JITDUMP_DIR. A value that does
// not parse is described in `warnings` with the variable's name, and the default is kept.
inline options options_from_env(std::vector<std::string>* warnings = nullptr) {
  options o;
  auto flag = [&](const char* name, bool& field) {
    const char* v = std::getenv(name);
    if (v == nullptr) return;
    if (!detail::parse_flag(v, field) && warnings)
      warnings->push_back(std::string("selfprof: ignoring ") + name + "=\"" + v +
                          "\": expected 0 or 1; using the default");
  };
  flag("SELFPROF_PERF_MAP", o.perf_map);
  flag("SELFPROF_JITDUMP", o.jitdump);
  if (const char* d = std::getenv("SELFPROF_JITDUMP_DIR")) o.jitdump_dir = d;
  return o;
}

}  // namespace jit
}  // namespace selfprof
// ---- end selfprof/jit/options.hpp ----
// ---- begin selfprof/status.hpp ----
// Errors as values: a small status type with a message, used across the public API instead of exceptions.
// Context: any thread (not the signal handler: it allocates).

#include <string>
#include <utility>

namespace selfprof {

class status {
 public:
  status() = default;
  static status ok() { return status(); }
  // `code`: the errno behind the failure when one is (callers decide on it, never on the text), else 0.
  static status error(std::string message, int code = 0) {
    status s;
    s.failed_ = true;
    s.message_ = std::move(message);
    s.code_ = code;
    return s;
  }
  explicit operator bool() const { return !failed_; }
  bool is_ok() const { return !failed_; }
  const std::string& message() const { return message_; }
  int code() const { return code_; }

 private:
  bool failed_ = false;
  int code_ = 0;
  std::string message_;
};

}  // namespace selfprof
// ---- end selfprof/status.hpp ----

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
// ---- begin selfprof/jit/api.hpp ----
// The definitions of selfprof::jit's public functions (declared and documented in jit.hpp): inline in
// header-only mode, compiled once with SELFPROF_COMPILED_LIB.
// Context: any thread (never the signal handler).

#include <cstddef>
#include <mutex>
#include <string>
#include <string_view>

// ---- begin selfprof/jit/runtime.hpp ----
// The JIT runtime: the registry plus the batched perf map and jitdump writers behind selfprof::jit::add,
// remove and flush — one lock for registration, pending bytes written by a background thread (or on
// size/age thresholds), at flush() and at exit; follows fork() to the child's own files.
// Context: any thread (never the signal handler).

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

// ---- begin selfprof/detail/worker.hpp ----
// The one kind of background thread selfprof runs (collector, dumper, JIT flusher, wall sampler): created
// with every asynchronous signal blocked, named, its tid known before start() returns, woken through an
// eventfd, joined by stop(), forgotten without a join in a forked child.
// Context: start, launch and stop from setup or from another worker (the server's loop starts at its
// first client, its render thread at the first profile asked for, the dumper at its first request), never
// from the worker itself;
// abandon_after_fork in the child; wait() on the worker's own thread; wake() from any thread (wake_fd()
// may be written from a signal handler).

#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <sys/eventfd.h>
#include <time.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <condition_variable>
#include <cstdint>
#include <cstring>
#include <mutex>
#include <new>
#include <string>
#include <vector>

// ---- begin selfprof/detail/high_fd.hpp ----
// Keeps selfprof's long-lived descriptors (one perf_event per thread, the workers' eventfds, the kept
// /proc directories) out of the application's descriptor range: each is moved to the lowest free number
// at or above the soft RLIMIT_NOFILE, so the application's own descriptors get the numbers they would
// have had without selfprof (below 1024, where select() and FD_SET work), and its limit stays as it is.
// Context: any thread except the signal handler (setup, the collector, the wall sampler); one
// process-wide lock serializes the moves.
//
// How. fcntl(F_DUPFD_CLOEXEC, soft) takes the lowest free number >= soft, but the kernel refuses a start
// at or above the soft limit (EINVAL) and never allocates at or above it (EMFILE): RLIMIT_NOFILE bounds
// new allocations only, and descriptors above it stay valid. So the soft limit is raised (to the hard
// limit at most) for that one fcntl and put back right after it; then the original is closed.
//
// The instant the soft limit is raised is process-wide. Another thread that allocates a descriptor in
// that instant still gets the lowest free number, so it lands above the application's limit only where
// every number below it is taken (it would otherwise have failed with EMFILE). Another thread's
// getrlimit() in that instant sees the raised value, and its setrlimit(RLIMIT_NOFILE) is undone when ours
// is restored. A child made by fork() gets the application's limit back in a pthread_atfork child
// handler; one made by vfork(), posix_spawn() or a raw clone() in that instant keeps the raised limit.
//
// No room above the soft limit (it equals the hard limit or the caller's bound, or every number up to
// there is taken): the descriptor stays where it is. keep_fd_high() counts it (fds_in_app_range(); the
// thread registry notes it in the session). The soft limit is never left raised.

#include <fcntl.h>
#include <pthread.h>
#include <sys/resource.h>

#include <atomic>
#include <cerrno>
#include <climits>
#include <cstdint>
#include <mutex>
#include <new>
#include <string>

// ---- begin selfprof/detail/sys.hpp ----
// The seam for the system calls tests inject failures into (EACCES, ENOSYS, EMFILE, ...): tick sources
// (perf_event_open, timer_*, setitimer, fcntl, perf ring mmap/munmap), signals (sigaction), output files
// (open, openat, close), resource limits and reads of /proc/self/task/<tid> files (read_task_file: names,
// masks, start times; tests make them slow or fake a thread's identity). Other calls (ioctl on a perf fd,
// other reads of /proc, eventfd, poll) go to libc directly; their failures are handled where they happen.
// Also copies of this process's own memory (read_own_memory: tests refuse them as seccomp would).
// Functions follow libc: -1 and errno on failure.
// Context: any thread except the signal handler (the handler makes its few raw syscalls directly).

#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/time.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstdio>

namespace selfprof {
namespace detail {

struct syscall_table {
  long (*perf_event_open)(void* attr, int pid, int cpu, int group_fd, unsigned long flags);
  int (*timer_create)(clockid_t clock, struct sigevent* sev, timer_t* out);
  int (*timer_settime)(timer_t id, int flags, const struct itimerspec* value, struct itimerspec* old);
  int (*timer_delete)(timer_t id);
  int (*setitimer)(int which, const struct itimerval* value, struct itimerval* old);
  int (*sigaction)(int sig, const struct sigaction* act, struct sigaction* old);
  int (*open)(const char* path, int flags, mode_t mode);
  int (*openat)(int dirfd, const char* path, int flags, mode_t mode);
  int (*close)(int fd);
  int (*fcntl_int)(int fd, int cmd, long arg);
  int (*getrlimit)(int resource, struct rlimit* out);
  int (*setrlimit)(int resource, const struct rlimit* value);
  // Reads up to `size` bytes of /proc/self/task/<tid>/<file>: the byte count, or -1 and errno.
  long (*read_task_file)(int tid, const char* file, char* buf, std::size_t size);
  // Mappings of perf ring buffers (sources/perf_ring.hpp): tests refuse them (EPERM: locked memory).
  void* (*mmap)(void* addr, std::size_t len, int prot, int flags, int fd, off_t off);
  int (*munmap)(void* addr, std::size_t len);
  // Copies `size` bytes at `address` of this process into `out`: the bytes copied, which stop at the
  // first page the kernel cannot supply (a mapped file truncated since), or -1 and errno when copying
  // is refused (ENOSYS, EPERM: seccomp).
  long (*read_own_memory)(void* out, std::uintptr_t address, std::size_t size);
};

inline long default_perf_event_open(void* attr, int pid, int cpu, int group_fd, unsigned long flags) {
  return ::syscall(SYS_perf_event_open, attr, pid, cpu, group_fd, flags);
}
inline int default_timer_create(clockid_t clock, struct sigevent* sev, timer_t* out) {
  return ::timer_create(clock, sev, out);
}
inline int default_timer_settime(timer_t id, int flags, const struct itimerspec* v, struct itimerspec* o) {
  return ::timer_settime(id, flags, v, o);
}
inline int default_timer_delete(timer_t id) { return ::timer_delete(id); }
inline int default_setitimer(int which, const struct itimerval* v, struct itimerval* o) {
  return ::setitimer(static_cast<__itimer_which>(which), v, o);
}
inline int default_sigaction(int sig, const struct sigaction* act, struct sigaction* old) {
  return ::sigaction(sig, act, old);
}
inline int default_open(const char* path, int flags, mode_t mode) { return ::open(path, flags, mode); }
inline int default_openat(int dirfd, const char* path, int flags, mode_t mode) {
  return ::openat(dirfd, path, flags, mode);
}
inline int default_close(int fd) { return ::close(fd); }
inline int default_fcntl_int(int fd, int cmd, long arg) { return ::fcntl(fd, cmd, arg); }
inline int default_getrlimit(int r, struct rlimit* out) {
  return ::getrlimit(static_cast<__rlimit_resource>(r), out);
}
inline int default_setrlimit(int r, const struct rlimit* v) {
  return ::setrlimit(static_cast<__rlimit_resource>(r), v);
}
inline long default_read_task_file(int tid, const char* file, char* buf, std::size_t size) {
  char path[96];
  std::snprintf(path, sizeof path, "/proc/self/task/%d/%s", tid, file);
  const int fd = ::open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return -1;
  std::size_t got = 0;
  while (got < size) {
    const ssize_t n = ::read(fd, buf + got, size - got);
    if (n < 0 && got == 0) {
      const int e = errno;
      ::close(fd);
      errno = e;
      return -1;
    }
    if (n <= 0) break;
    got += static_cast<std::size_t>(n);
  }
  ::close(fd);
  return static_cast<long>(got);
}

inline void* default_mmap(void* addr, std::size_t len, int prot, int flags, int fd, off_t off) {
  return ::mmap(addr, len, prot, flags, fd, off);
}
inline int default_munmap(void* addr, std::size_t len) { return ::munmap(addr, len); }
// process_vm_readv of process `pid`, a page per remote element: a fault ends the copy at a page boundary
// (the kernel does not split an element), where a plain read would raise SIGBUS.
inline long read_process_memory(pid_t pid, void* out, std::uintptr_t address, std::size_t size) {
  constexpr std::size_t kPage = 4096, kElements = 256;
  std::size_t done = 0;
  while (done < size) {
    struct iovec local {
      static_cast<char*>(out) + done, 0
    };
    struct iovec remote[kElements];
    std::size_t n = 0, at = address + done;
    while (n < kElements && at < address + size) {
      const std::size_t end = std::min<std::size_t>((at / kPage + 1) * kPage, address + size);
      remote[n].iov_base = reinterpret_cast<void*>(at);
      remote[n].iov_len = end - at;
      local.iov_len += end - at;
      at = end;
      ++n;
    }
    const ssize_t got = ::process_vm_readv(pid, &local, 1, remote, n, 0);
    if (got < 0 && errno == EFAULT) break;  // the first page asked for is not there
    if (got < 0) return done > 0 ? static_cast<long>(done) : -1;
    done += static_cast<std::size_t>(got);
    if (static_cast<std::size_t>(got) < local.iov_len) break;
  }
  return static_cast<long>(done);
}
inline long default_read_own_memory(void* out, std::uintptr_t address, std::size_t size) {
  return read_process_memory(::getpid(), out, address, size);
}

inline syscall_table default_syscalls() {
  return syscall_table{
      default_perf_event_open, default_timer_create, default_timer_settime, default_timer_delete,
      default_setitimer,       default_sigaction,    default_open,          default_openat,
      default_close,           default_fcntl_int,    default_getrlimit,     default_setrlimit,
      default_read_task_file,  default_mmap,         default_munmap,        default_read_own_memory};
}

// The table in use. Tests replace entries (and restore them with default_syscalls()).
inline syscall_table& sys() {
  static syscall_table table = default_syscalls();
  return table;
}

}  // namespace detail
}  // namespace selfprof
// ---- end selfprof/detail/sys.hpp ----

namespace selfprof {
namespace detail {

// Where move_fd_high() left a descriptor.
enum class fd_place : std::uint8_t {
  moved,    // at or above the application's soft limit (and below the bound), close-on-exec
  no_room,  // left in place: no free number between the soft limit and min(hard limit, bound)
  failed,   // left in place: getrlimit, setrlimit or fcntl failed (fd_move::error)
};

struct fd_move {
  int fd = -1;  // the descriptor to use: the new one when moved (the original is then closed)
  fd_place place = fd_place::failed;
  int error = 0;                     // errno of the failure (EMFILE for no_room when every number was taken)
  std::uint64_t soft = 0, hard = 0;  // the application's RLIMIT_NOFILE as read (0: not read)
};

struct high_fd_state {
  std::mutex mu;
  std::atomic<bool> raised{false};  // the soft limit is raised now: a fork() child puts it back
  std::atomic<std::uint64_t> app_soft{0}, app_hard{0};
  std::atomic<std::uint64_t> kept{0};  // long-lived descriptors left in the application's range
  std::atomic<std::uint64_t> kept_soft{0}, kept_hard{0};  // the limits when the last one was
};

inline high_fd_state g_high_fd;

// fork() child: the limit the application had, in case the fork came while another thread had it raised.
inline void high_fd_fork_child() {
  new (&g_high_fd.mu) std::mutex();
  if (!g_high_fd.raised.load(std::memory_order_acquire)) return;
  struct rlimit rl {};
  rl.rlim_cur = static_cast<rlim_t>(g_high_fd.app_soft.load(std::memory_order_relaxed));
  rl.rlim_max = static_cast<rlim_t>(g_high_fd.app_hard.load(std::memory_order_relaxed));
  ::setrlimit(RLIMIT_NOFILE, &rl);
  g_high_fd.raised.store(false, std::memory_order_relaxed);
}

// Moves `fd` to the lowest free number at or above the application's soft RLIMIT_NOFILE and below
// `below`; the new descriptor is close-on-exec and the original is closed. Left in place otherwise.
inline fd_move move_fd_high(int fd, long below = INT_MAX) {
  fd_move r;
  r.fd = fd;
  if (fd < 0) {
    r.error = EBADF;
    return r;
  }
  static const bool fork_handler = pthread_atfork(nullptr, nullptr, high_fd_fork_child) == 0;
  (void)fork_handler;
  std::lock_guard<std::mutex> lock(g_high_fd.mu);
  struct rlimit app {};
  if (sys().getrlimit(RLIMIT_NOFILE, &app) != 0) {
    r.error = errno;
    return r;
  }
  r.soft = app.rlim_cur;
  r.hard = app.rlim_max;
  const rlim_t bound = static_cast<rlim_t>(below > 0 ? below : 0);
  const rlim_t top = app.rlim_max < bound ? app.rlim_max : bound;
  const rlim_t number = static_cast<rlim_t>(fd);
  if (number >= app.rlim_cur && number < top) {  // out of the application's range already
    r.place = fd_place::moved;
    return r;
  }
  if (app.rlim_cur >= top || app.rlim_cur > static_cast<rlim_t>(INT_MAX)) {
    r.place = fd_place::no_room;
    return r;
  }
  struct rlimit raised = app;
  raised.rlim_cur = top;
  g_high_fd.app_soft.store(app.rlim_cur, std::memory_order_relaxed);
  g_high_fd.app_hard.store(app.rlim_max, std::memory_order_relaxed);
  g_high_fd.raised.store(true, std::memory_order_release);
  if (sys().setrlimit(RLIMIT_NOFILE, &raised) != 0) {
    r.error = errno;
    g_high_fd.raised.store(false, std::memory_order_release);
    return r;
  }
  const int moved = sys().fcntl_int(fd, F_DUPFD_CLOEXEC, static_cast<long>(app.rlim_cur));
  const int e = errno;
  sys().setrlimit(RLIMIT_NOFILE, &app);  // lowering the soft limit needs no privilege
  g_high_fd.raised.store(false, std::memory_order_release);
  if (moved < 0) {
    r.place = e == EMFILE ? fd_place::no_room : fd_place::failed;
    r.error = e;
    return r;
  }
  sys().close(fd);
  r.fd = moved;
  r.place = fd_place::moved;
  return r;
}

// Counts a long-lived descriptor that stays in the application's range, with the limits `m` read (read
// here when it did not).
inline void count_fd_in_app_range(const fd_move& m = fd_move{}) {
  struct rlimit rl {};
  rl.rlim_cur = static_cast<rlim_t>(m.soft);
  rl.rlim_max = static_cast<rlim_t>(m.hard);
  if (m.hard != 0 || sys().getrlimit(RLIMIT_NOFILE, &rl) == 0) {
    g_high_fd.kept_soft.store(rl.rlim_cur, std::memory_order_relaxed);
    g_high_fd.kept_hard.store(rl.rlim_max, std::memory_order_relaxed);
  }
  g_high_fd.kept.fetch_add(1, std::memory_order_relaxed);
}

// For a descriptor kept for the whole session: moved out of the application's range, or counted where
// it stays. Returns the descriptor to use (`fd` itself when negative).
inline int keep_fd_high(int fd, long below = INT_MAX) {
  if (fd < 0) return fd;
  const fd_move m = move_fd_high(fd, below);
  if (m.place != fd_place::moved) count_fd_in_app_range(m);
  return m.fd;
}

// Long-lived descriptors left in the application's range so far in this process.
inline std::uint64_t fds_in_app_range() { return g_high_fd.kept.load(std::memory_order_relaxed); }

// The session note for `n` such descriptors.
inline std::string fds_in_app_range_note(std::uint64_t n) {
  return std::to_string(n) + " of selfprof's descriptors stay below the soft RLIMIT_NOFILE (" +
         std::to_string(g_high_fd.kept_soft.load(std::memory_order_relaxed)) + ", hard limit " +
         std::to_string(g_high_fd.kept_hard.load(std::memory_order_relaxed)) +
         "): no room above it up to the hard limit (for perf_event fds, up to 65536), so the program's "
         "new descriptors get higher numbers than without selfprof";
}

}  // namespace detail
}  // namespace selfprof
// ---- end selfprof/detail/high_fd.hpp ----
// ---- begin selfprof/detail/process.hpp ----
// Facts about this process that several parts read: the dynamic loader's generation, the threads in
// /proc/self/task (names, blocked signals, start times, scheduler statistics), the main thread's stack end
// and the CPUs the process may use. Names, masks and start times are read through sys().read_task_file.
// Also the two ways files are read here: a small file whole, a large one (/proc/kallsyms) line by line.
// Context: any thread except the signal handler (dl_iterate_phdr takes the loader's lock).

#include <dirent.h>
#include <fcntl.h>
#include <link.h>
#include <sched.h>
#include <time.h>
#include <unistd.h>

#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <string_view>
#include <vector>


namespace selfprof {
namespace detail {

// Libraries loaded plus unloaded so far (dl_iterate_phdr's counters): changes on dlopen/dlclose.
inline std::uint64_t loader_generation() {
  std::uint64_t gen = 0;
  dl_iterate_phdr(
      [](struct dl_phdr_info* info, std::size_t size, void* out) {
        if (size >= offsetof(struct dl_phdr_info, dlpi_subs) + sizeof(info->dlpi_subs))
          *static_cast<std::uint64_t*>(out) = info->dlpi_adds + info->dlpi_subs;
        return 1;
      },
      &gen);
  return gen;
}

// The whole of a small file (at most `limit` bytes), or "" when it cannot be read.
inline std::string read_small_file(const std::string& path, std::size_t limit = std::size_t(1) << 20) {
  std::string out;
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return out;
  char buf[4096];
  for (;;) {
    ssize_t n = ::read(fd, buf, sizeof buf);
    if (n <= 0) break;
    out.append(buf, static_cast<std::size_t>(n));
    if (out.size() >= limit) break;
  }
  ::close(fd);
  return out;
}

// Calls fn(line) for each line of the file at `path` (without its '\n'), reading at most `limit` bytes
// through a 64 KiB buffer. False when the file cannot be opened.
template <class F>
bool for_each_file_line(const char* path, std::size_t limit, F&& fn) {
  const int fd = ::open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return false;
  std::string buf(std::size_t{64} << 10, '\0');
  std::size_t have = 0, total = 0;  // bytes in buf; bytes read
  for (;;) {
    if (have == buf.size()) buf.resize(buf.size() * 2);  // a line longer than the buffer
    const ssize_t n = total >= limit ? 0 : ::read(fd, &buf[have], buf.size() - have);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    have += static_cast<std::size_t>(n);
    total += static_cast<std::size_t>(n);
    std::size_t pos = 0;
    for (std::size_t eol; (eol = buf.find('\n', pos)) < have; pos = eol + 1)
      fn(std::string_view(buf.data() + pos, eol - pos));
    std::memmove(&buf[0], buf.data() + pos, have - pos);  // the partial last line to the front
    have -= pos;
  }
  if (have > 0) fn(std::string_view(buf.data(), have));
  ::close(fd);
  return true;
}

// The threads of this process now (/proc/self/task).
inline std::vector<pid_t> list_threads() {
  std::vector<pid_t> tids;
  DIR* dir = ::opendir("/proc/self/task");
  if (dir == nullptr) return tids;
  while (struct dirent* e = ::readdir(dir)) {
    if (e->d_name[0] < '0' || e->d_name[0] > '9') continue;
    tids.push_back(static_cast<pid_t>(std::strtol(e->d_name, nullptr, 10)));
  }
  ::closedir(dir);
  return tids;
}

// /proc/self/task/<tid>/<file> (at most 16 KiB: comm, stat, status), or "" when it cannot be read.
inline std::string task_file(pid_t tid, const char* file) {
  std::string out(16384, '\0');
  const long n = sys().read_task_file(static_cast<int>(tid), file, &out[0], out.size());
  out.resize(n > 0 ? static_cast<std::size_t>(n) : 0);
  return out;
}

// The start time in /proc/.../stat text (field 22, clock ticks since boot), or 0. The name in field 2 may
// hold spaces and parentheses: the fields are counted from its last ')'.
inline std::uint64_t parse_start_time(const std::string& stat) {
  const std::size_t close = stat.rfind(')');
  if (close == std::string::npos) return 0;
  const char* p = stat.c_str() + close + 1;
  for (int field = 3; field < 22; ++field) {  // skip fields 3 (state) to 21
    while (*p == ' ') ++p;
    while (*p != ' ' && *p != '\0') ++p;
  }
  while (*p == ' ') ++p;
  if (*p < '0' || *p > '9') return 0;
  return std::strtoull(p, nullptr, 10);
}

// When thread `tid` of this process started (clock ticks since boot), or 0 when it is not one of this
// process's threads (any more). With the tid, it identifies a thread: a tid is reused, a start time with it
// is not (two threads given the same tid within one clock tick would need the tid space to wrap meanwhile).
inline std::uint64_t task_start_time(pid_t tid) { return parse_start_time(task_file(tid, "stat")); }

inline std::string thread_name(pid_t tid) {
  std::string s = task_file(tid, "comm");
  while (!s.empty() && (s.back() == '\n' || s.back() == '\0')) s.pop_back();
  return s;
}

// True when the thread currently blocks `sig` (SigBlk in /proc/self/task/<tid>/status).
inline bool thread_blocks_signal(pid_t tid, int sig) {
  std::string s = task_file(tid, "status");
  std::size_t at = s.find("SigBlk:");
  if (at == std::string::npos || sig <= 0 || sig > 64) return false;
  unsigned long long mask = std::strtoull(s.c_str() + at + 7, nullptr, 16);
  return (mask >> (sig - 1)) & 1ull;
}

// A thread's time on the CPU and time spent waiting for one (/proc/self/task/<tid>/schedstat), in ns.
inline bool read_schedstat(pid_t tid, std::uint64_t& run_ns, std::uint64_t& delay_ns) {
  std::string text = read_small_file("/proc/self/task/" + std::to_string(tid) + "/schedstat");
  unsigned long long r = 0, d = 0;
  if (std::sscanf(text.c_str(), "%llu %llu", &r, &d) != 2) return false;
  run_ns = r;
  delay_ns = d;
  return true;
}

// The CPU clock of one thread by tid: the kernel's CPUCLOCK_SCHED | CPUCLOCK_PERTHREAD encoding
// (what pthread_getcpuclockid returns, without needing the pthread_t; see clock_getcpuclockid(3)).
inline clockid_t thread_cpu_clock(pid_t tid) {
  return static_cast<clockid_t>((~static_cast<unsigned>(tid) << 3) | 6u);
}

// CPUs the process may run on (its affinity mask), at least 1.
inline int usable_cpus() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof set, &set) == 0 && CPU_COUNT(&set) > 0) return CPU_COUNT(&set);
  long n = sysconf(_SC_NPROCESSORS_ONLN);
  return n > 0 ? static_cast<int>(n) : 1;
}

// Upper end of the main thread's stack ([stack] in /proc/self/maps, read whole: the line can come after
// many thousands of mappings), or 0.
inline std::uintptr_t main_stack_end() {
  std::string maps = read_small_file("/proc/self/maps", ~std::size_t(0));
  std::size_t at = maps.find("[stack]");
  if (at == std::string::npos) return 0;
  std::size_t line = maps.rfind('\n', at);
  line = line == std::string::npos ? 0 : line + 1;
  const char* p = maps.c_str() + line;
  char* end = nullptr;
  std::strtoull(p, &end, 16);
  if (end == nullptr || *end != '-') return 0;
  return static_cast<std::uintptr_t>(std::strtoull(end + 1, nullptr, 16));
}

}  // namespace detail
}  // namespace selfprof
// ---- end selfprof/detail/process.hpp ----

namespace selfprof {
namespace detail {

// The mask a worker starts with: every signal but the synchronous fault signals, which the kernel
// raises for a fault in this very thread and cannot hold back (a blocked one kills the process without
// running the application's crash handler). So an application's SIGALRM, SIGCHLD, SIGTERM or SIGPIPE
// handler never runs on a selfprof thread, and a timer signal never interrupts one.
inline sigset_t worker_signal_mask() {
  sigset_t set;
  sigfillset(&set);
  for (int s : {SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGTRAP, SIGSYS}) sigdelset(&set, s);
  return set;
}

// The tids of the running workers, whenever they started (the server's render thread starts at its first
// request), so the collector never arms or samples a selfprof thread. A fixed table: no allocation, read
// without a lock.
constexpr std::size_t kMaxWorkers = 16;
inline std::atomic<pid_t> g_worker_tids[kMaxWorkers];

inline void note_worker_tid(pid_t tid) {
  for (auto& slot : g_worker_tids) {
    pid_t none = 0;
    if (slot.compare_exchange_strong(none, tid, std::memory_order_release)) return;
  }
}
inline void forget_worker_tid(pid_t tid) {
  if (tid == 0) return;
  for (auto& slot : g_worker_tids) {
    pid_t was = tid;
    if (slot.compare_exchange_strong(was, 0, std::memory_order_release)) return;
  }
}
// CPU time of the workers that have returned from their body, added as each one ends (see workers_cpu_ns).
inline std::atomic<std::uint64_t> g_ended_workers_cpu_ns{0};

// Every running worker's tid: selfprof's own threads (collector, dumper, JIT flusher, wall sampler, the
// server's), whenever each started. They are never armed, and their samples are dropped.
inline std::vector<pid_t> running_worker_tids() {
  std::vector<pid_t> out;
  for (auto& slot : g_worker_tids)
    if (const pid_t t = slot.load(std::memory_order_acquire)) out.push_back(t);
  return out;
}

// CPU time selfprof's own threads have used since the process started: the ended workers', and each
// running worker's thread clock. A worker that returns between the two reads may be counted twice for the
// moment until stop() forgets its tid: a statistic, never a decision.
inline std::uint64_t workers_cpu_ns() {
  std::uint64_t total = g_ended_workers_cpu_ns.load(std::memory_order_relaxed);
  for (auto& slot : g_worker_tids) {
    const pid_t tid = slot.load(std::memory_order_acquire);
    if (tid != 0) total += clock_ns(thread_cpu_clock(tid));
  }
  return total;
}

class worker {
 public:
  worker() = default;
  worker(const worker&) = delete;
  worker& operator=(const worker&) = delete;
  ~worker() { stop(); }

  // Runs body(context) on a new thread called `name` (at most 15 characters). The thread is created with
  // worker_signal_mask() already in force. Fails when the thread or its eventfd cannot be created.
  status start(const char* name, void (*body)(void*), void* context) {
    status st = prepare(name);
    if (!st) return st;
    st = launch(body, context);
    if (!st) {
      ::close(wake_fd_);
      wake_fd_ = -1;
    }
    return st;
  }

  // The first half of start(), for a worker started on demand: the eventfd alone, so wake_fd() can be
  // written (and watched by another thread) before the thread exists; launch() starts the thread.
  status prepare(const char* name) {
    if (running_ || wake_fd_ >= 0)
      return status::error(std::string("selfprof: thread ") + name + " runs already");
    wake_fd_ = keep_fd_high(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));  // out of the application's range
    if (wake_fd_ < 0) {
      const int e = errno;
      return status::error(std::string("selfprof: eventfd for ") + name + ": " + std::strerror(e), e);
    }
    name_ = name;
    return status::ok();
  }

  // The second half: the thread, after prepare(). A wake written before it is seen by its first wait().
  status launch(void (*body)(void*), void* context) {
    if (running_) return status::ok();
    if (wake_fd_ < 0) return status::error(std::string("selfprof: thread ") + name_ + " was not prepared");
    body_ = body;
    context_ = context;
    stopping_.store(false, std::memory_order_relaxed);
    tid_.store(0, std::memory_order_relaxed);
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    const sigset_t mask = worker_signal_mask();
    sigset_t old;
#if defined(__GLIBC__) && (__GLIBC__ > 2 || (__GLIBC__ == 2 && __GLIBC_MINOR__ >= 32))
    const bool in_attr = pthread_attr_setsigmask_np(&attr, &mask) == 0;
#else
    const bool in_attr = false;
#endif
    if (!in_attr) pthread_sigmask(SIG_SETMASK, &mask, &old);  // inherited by the new thread
    const int rc = pthread_create(&thread_, &attr, &worker::entry, this);
    if (!in_attr) pthread_sigmask(SIG_SETMASK, &old, nullptr);
    pthread_attr_destroy(&attr);
    if (rc != 0)
      return status::error(std::string("selfprof: cannot start thread ") + name_ + ": " + std::strerror(rc),
                           rc);
    running_ = true;
    std::unique_lock<std::mutex> lock(mu_);
    started_.wait(lock, [&] { return tid_.load(std::memory_order_relaxed) != 0; });
    return status::ok();
  }

  // Asks the body to return (stopping() turns true and wait() returns false), then joins. Idempotent.
  void stop() {
    if (!running_) {
      if (wake_fd_ >= 0) ::close(wake_fd_);  // prepared, never launched
      wake_fd_ = -1;
      return;
    }
    stopping_.store(true, std::memory_order_release);
    wake();
    pthread_join(thread_, nullptr);
    running_ = false;
    ::close(wake_fd_);
    wake_fd_ = -1;
    forget_worker_tid(tid_.exchange(0, std::memory_order_relaxed));
  }

  bool running() const { return running_; }
  bool stopping() const { return stopping_.load(std::memory_order_acquire); }
  pid_t tid() const { return tid_.load(std::memory_order_relaxed); }
  int wake_fd() const { return wake_fd_; }

  // The worker's own thread: sleeps until woken, stopped or `timeout_ms` passed (-1: no timeout). Returns
  // false once stop() was asked. `extra_fd` and `extra_fd2` (optional, -1 for none) also end the wait when
  // readable; `*extra_ready` and `*extra_ready2` then say so.
  bool wait(int timeout_ms, int extra_fd = -1, bool* extra_ready = nullptr, int extra_fd2 = -1,
            bool* extra_ready2 = nullptr) {
    return wait_ns(timeout_ms < 0 ? -1 : static_cast<std::int64_t>(timeout_ms) * 1000000, extra_fd,
                   extra_ready, extra_fd2, extra_ready2);
  }
  bool wait_ns(std::int64_t timeout_ns, int extra_fd = -1, bool* extra_ready = nullptr, int extra_fd2 = -1,
               bool* extra_ready2 = nullptr) {
    struct pollfd p[3] = {};
    nfds_t used = 0;
    p[used++] = {wake_fd_, POLLIN, 0};
    const nfds_t at1 = used;
    if (extra_fd >= 0) p[used++] = {extra_fd, POLLIN, 0};
    const nfds_t at2 = used;
    if (extra_fd2 >= 0) p[used++] = {extra_fd2, POLLIN, 0};
    struct timespec ts {
      static_cast<time_t>(timeout_ns / 1000000000), static_cast<long>(timeout_ns % 1000000000)
    };
    const int n = ::ppoll(p, used, timeout_ns < 0 ? nullptr : &ts, nullptr);
    if (n > 0 && (p[0].revents & POLLIN)) {
      std::uint64_t v;
      ssize_t r = ::read(wake_fd_, &v, sizeof v);
      (void)r;
    }
    if (extra_ready) *extra_ready = n > 0 && extra_fd >= 0 && (p[at1].revents & POLLIN);
    if (extra_ready2) *extra_ready2 = n > 0 && extra_fd2 >= 0 && (p[at2].revents & POLLIN);
    return !stopping();
  }

  // Any thread: ends the current or next wait().
  void wake() const {
    if (wake_fd_ < 0) return;
    const std::uint64_t one = 1;
    raw_syscall3(SYS_write, wake_fd_, reinterpret_cast<long>(&one), sizeof one);
  }

  // In a forked child the thread does not exist: forget it without joining; this process's copy of the
  // eventfd is closed. The locks are made anew (a parent thread may have held them at the fork).
  void abandon_after_fork() {
    if (running_) {
      new (&thread_) pthread_t();
      running_ = false;
    }
    if (wake_fd_ >= 0) ::close(wake_fd_);
    wake_fd_ = -1;
    forget_worker_tid(tid_.exchange(0, std::memory_order_relaxed));
    new (&mu_) std::mutex();
    new (&started_) std::condition_variable();
  }

  // True when `start` is the routine every worker thread begins in: the preload library's pthread_create
  // hook leaves selfprof's own threads alone by this.
  static bool is_entry(void* (*start)(void*)) { return start == &worker::entry; }

 private:
  static void* entry(void* self) {
    worker& w = *static_cast<worker*>(self);
    pthread_setname_np(pthread_self(), w.name_);
    const pid_t tid = static_cast<pid_t>(raw_gettid());
    note_worker_tid(tid);
    {
      std::lock_guard<std::mutex> lock(w.mu_);
      w.tid_.store(tid, std::memory_order_relaxed);
    }
    w.started_.notify_all();
    w.body_(w.context_);
    g_ended_workers_cpu_ns.fetch_add(this_thread_cpu_ns(), std::memory_order_relaxed);
    return nullptr;
  }

  pthread_t thread_{};
  bool running_ = false;
  const char* name_ = "";
  void (*body_)(void*) = nullptr;
  void* context_ = nullptr;
  int wake_fd_ = -1;
  std::atomic<bool> stopping_{false};
  std::atomic<pid_t> tid_{0};
  std::mutex mu_;
  std::condition_variable started_;
};

}  // namespace detail
}  // namespace selfprof
// ---- end selfprof/detail/worker.hpp ----
// ---- begin selfprof/jit/jitdump_writer.hpp ----
// Writer of perf's jitdump file jit-<pid>.dump (file header, then one JIT_CODE_LOAD record per
// registration with the code bytes), mapped PROT_READ|PROT_EXEC so that `perf record -k 1` sees it
// and `perf inject --jit` can turn the records into jitted-<pid>-<index>.so files perf can annotate.
// Context: any thread (the JIT runtime serialises calls).

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>
#include <utility>

// ---- begin selfprof/jit/safe_file.hpp ----
// Creating the files perf reads about JIT code (/tmp/perf-<pid>.map, jit-<pid>.dump) safely in a shared
// directory: never through a symlink, never into a file owned by someone else or hard-linked elsewhere,
// and never removing a file another writer may still be using.
// Context: any thread (setup of the JIT writers; never the signal handler).
//
// Who owns a file. Every writer holds a shared flock(2) on its file for as long as it has it open (flock
// locks belong to the open file description: a second writer in the same process conflicts like one in
// another process, and the lock goes away with the writer, however it dies). A file already at the path
// is replaced only when it is provably not in use:
// - nobody holds a lock on it (an exclusive flock can be taken), and
// - it was last written before this process started, so no writer of this process wrote it, selfprof or
//   not (CPython's -X perf, a JIT with its own map writer, another copy of selfprof), and whoever wrote
//   it then held no lock when we looked. That is the file of a dead process that had our pid before us.
// Anything else is live: the perf map is opened for appending and shared (perf maps are made to be
// appended to by every JIT of the process: perf reads the whole file at report time), the jitdump (one
// header, one writer) is refused with a message. A file created here is new, so its mtime is after the
// start of every process that could look at it: nobody takes it for stale between its creation and
// the moment we lock it.

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>
#include <utility>


namespace selfprof {
namespace detail {

struct safe_file {
  int fd = -1;
  bool replaced_stale = false;  // a file of a dead process with this pid (pids wrap) was replaced
  bool shared = false;          // a live writer's file, opened to append to it
};

// What to do with a file another writer may be using.
enum class live_file { refuse, share };

// "<head><what> <path>: <reason>", the shape of every message below.
inline status file_error(const char* head, const char* what, const std::string& path, const char* reason,
                         const char* more = "") {
  std::string m = head;
  m += what;
  m += ' ';
  m += path;
  m += ": ";
  m += reason;
  m += more;
  return status::error(std::move(m));
}

// When this process started, in CLOCK_REALTIME nanoseconds (the clock of file times); 0 when unknown.
// /proc/self/stat gives it in clock ticks since boot (CLOCK_BOOTTIME), rounded down to a tick.
inline std::int64_t process_start_realtime_ns() {
  int fd = ::open("/proc/self/stat", O_RDONLY | O_CLOEXEC);
  if (fd < 0) return 0;
  char buf[1024];
  ssize_t n;
  do n = ::read(fd, buf, sizeof buf - 1);
  while (n < 0 && errno == EINTR);
  ::close(fd);
  if (n <= 0) return 0;
  buf[n] = 0;
  const char* p = std::strrchr(buf, ')');  // the command name may hold spaces and parentheses
  if (p == nullptr) return 0;
  // Fields after the name: 3 (state) ... 22 (starttime).
  for (int field = 2; field < 22 && *p; ++p)
    if (*p == ' ') ++field;
  char* end = nullptr;
  unsigned long long ticks = std::strtoull(p, &end, 10);
  long hz = ::sysconf(_SC_CLK_TCK);
  struct timespec real, boot;
  if (end == p || hz <= 0 || ::clock_gettime(CLOCK_REALTIME, &real) != 0 ||
      ::clock_gettime(CLOCK_BOOTTIME, &boot) != 0)
    return 0;
  const std::int64_t boot_at =
      (std::int64_t(real.tv_sec) - boot.tv_sec) * 1000000000 + (real.tv_nsec - boot.tv_nsec);
  return boot_at + static_cast<std::int64_t>(ticks / static_cast<unsigned long long>(hz)) * 1000000000 +
         static_cast<std::int64_t>(ticks % static_cast<unsigned long long>(hz)) * (1000000000 / hz);
}

// True when `st` was last modified before this process started: with a second of slack for the clock
// being stepped, a file written in the second before our start counts as possibly ours (kept, not removed).
inline bool written_before_this_process(const struct stat& st) {
  const std::int64_t start = process_start_realtime_ns();
  if (start == 0) return false;  // cannot tell: keep it
  const std::int64_t mtime = std::int64_t(st.st_mtim.tv_sec) * 1000000000 + st.st_mtim.tv_nsec;
  return mtime < start - 1000000000;
}

// Takes a shared flock on fd. Another writer holds an exclusive one only for the moment it takes to
// decide a file is stale: waits up to about half a second, never longer. 0: locked; EWOULDBLOCK: still
// held exclusively; another errno: the filesystem has no flock (the file is used unlocked).
inline int lock_shared(int fd) {
  for (int i = 0; i < 500; ++i) {
    if (::flock(fd, LOCK_SH | LOCK_NB) == 0) return 0;
    if (errno == EINTR) continue;
    if (errno != EWOULDBLOCK) return errno;
    struct timespec ms {
      0, 1000000
    };
    ::nanosleep(&ms, nullptr);
  }
  return EWOULDBLOCK;
}

// True when `path` (not followed) is still the file open at fd.
inline bool still_at(const std::string& path, int fd) {
  struct stat a, b;
  return ::lstat(path.c_str(), &a) == 0 && ::fstat(fd, &b) == 0 && a.st_dev == b.st_dev &&
         a.st_ino == b.st_ino;
}

// Opens `path` for writing (`extra_flags`: O_WRONLY|O_APPEND or O_RDWR), holding a shared flock on it
// until the descriptor is closed. A new file is created with O_CREAT|O_EXCL|O_NOFOLLOW|O_CLOEXEC and mode
// 0644 (whatever the umask), owned by the effective user. What is already there:
// - a symlink, anything not a regular file, a file owned by another user or with other hard links:
//   refused; nothing is opened, followed, truncated or removed;
// - a regular file of ours that is provably not in use (see the top of this file): unlinked and created
//   again with O_EXCL (as QEMU does); `replaced_stale` is set;
// - any other regular file of ours: a live writer's. `live` says whether to share it (opened without
//   O_CREAT or O_TRUNC, `shared` set) or to refuse it. `what` names the file in messages.
inline status create_safe_file(const std::string& path, int extra_flags, const char* what, safe_file& out,
                               live_file live = live_file::refuse) {
  out = safe_file{};
  const int flags = O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC | extra_flags;
  const int existing_flags =
      (extra_flags & ~(O_CREAT | O_EXCL | O_TRUNC)) | O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK;
  for (int attempt = 0; attempt < 6; ++attempt) {
    int fd = sys().open(path.c_str(), flags, 0644);
    if (fd >= 0) {
      // The umask may have taken bits away; perf run by another user (root) reads the file.
      int rc = ::fchmod(fd, 0644);  // on failure the umask's mode stays: still readable by us and root
      (void)rc;
      // Removed by a writer that found it unlocked and old before we locked it: cannot happen (it is
      // newer than any process), but a foreign tool may have: start over.
      if (lock_shared(fd) == EWOULDBLOCK || !still_at(path, fd)) {
        sys().close(fd);
        continue;
      }
      out.fd = fd;
      return status::ok();
    }
    int e = errno;
    if (e != EEXIST) {
      return file_error("selfprof: cannot create ", what, path, std::strerror(e));
    }
    struct stat st;
    if (::lstat(path.c_str(), &st) != 0) continue;  // gone meanwhile: try again
    std::string refuse;
    if (S_ISLNK(st.st_mode)) {
      refuse = "it is a symbolic link";
    } else if (!S_ISREG(st.st_mode)) {
      refuse = "it is not a regular file";
    } else if (st.st_uid != ::geteuid()) {
      refuse = "it is owned by uid ";
      refuse += std::to_string(st.st_uid);
      refuse += ", not by this process's user (uid ";
      refuse += std::to_string(::geteuid());
      refuse += ')';
    } else if (st.st_nlink != 1) {
      refuse = "it has ";
      refuse += std::to_string(st.st_nlink);
      refuse += " hard links";
    }
    if (!refuse.empty()) {
      return file_error("selfprof: refusing to write ", what, path, refuse.c_str(),
                        " (a stale or hostile file); remove it or set another directory. Nothing was "
                        "written to it");
    }
    // Open what lstat saw (O_NOFOLLOW; O_NONBLOCK in case it became a FIFO) and check it is that file.
    fd = sys().open(path.c_str(), existing_flags, 0);
    if (fd < 0) {
      e = errno;
      if (e == ENOENT || e == ELOOP || e == ENXIO) continue;  // replaced meanwhile: look again
      return file_error("selfprof: cannot open ", what, path, std::strerror(e));
    }
    struct stat fs;
    if (::fstat(fd, &fs) != 0 || fs.st_dev != st.st_dev || fs.st_ino != st.st_ino || !S_ISREG(fs.st_mode)) {
      sys().close(fd);
      continue;
    }
    int fl = ::fcntl(fd, F_GETFL);
    if (fl >= 0) (void)::fcntl(fd, F_SETFL, fl & ~O_NONBLOCK);
    const int lock_error = ::flock(fd, LOCK_EX | LOCK_NB) == 0 ? 0 : errno;
    const bool unlocked = lock_error == 0;
    if (unlocked && written_before_this_process(fs)) {
      // Provably stale. We hold the exclusive lock: whoever opens it now waits for us, then finds it gone.
      if (still_at(path, fd) && ::unlink(path.c_str()) != 0 && errno != ENOENT) {
        e = errno;
        sys().close(fd);
        return file_error("selfprof: cannot replace the stale ", what, path, std::strerror(e));
      }
      sys().close(fd);
      out.replaced_stale = true;
      continue;
    }
    if (live == live_file::refuse) {
      sys().close(fd);
      return file_error("selfprof: refusing to replace ", what, path,
                        unlocked ? "it was written since this process started (another writer here?)"
                        : lock_error == EWOULDBLOCK
                            ? "another writer has it open (it is locked)"
                            : "it may be in use (no file locks on this filesystem to tell)",
                        "; set another directory. Nothing was written to it");
    }
    // Share it: appending under a shared lock, like the writer that made it.
    if (lock_shared(fd) == EWOULDBLOCK || !still_at(path, fd)) {
      sys().close(fd);
      continue;
    }
    out.fd = fd;
    out.shared = true;
    return status::ok();
  }
  return file_error("selfprof: cannot create ", what, path, "something keeps replacing it");
}

// Writes all of [data, data+size) to fd, retrying on EINTR and short writes.
inline status write_all(int fd, const char* data, std::size_t size, const std::string& path) {
  while (size > 0) {
    ssize_t n = ::write(fd, data, size);
    if (n < 0) {
      if (errno == EINTR) continue;
      std::string m = "selfprof: writing ";
      m += path;
      m += " failed: ";
      m += std::strerror(errno);
      return status::error(std::move(m));
    }
    data += n;
    size -= static_cast<std::size_t>(n);
  }
  return status::ok();
}

}  // namespace detail
}  // namespace selfprof
// ---- end selfprof/jit/safe_file.hpp ----

namespace selfprof {
namespace detail {

constexpr std::uint32_t jitdump_magic = 0x4A695444;  // "JiTD" read as a native-endian u32
constexpr std::uint32_t jitdump_version = 1;         // perf rejects anything newer
constexpr std::uint32_t jitdump_header_size = 40;
constexpr std::uint32_t jitdump_code_load = 0;
constexpr std::uint32_t jitdump_code_close = 3;

// e_machine of the code this process runs (ELF gABI numbers, as <elf.h> EM_*).
constexpr std::uint32_t jitdump_elf_machine() {
#if defined(__x86_64__)
  return 62;
#elif defined(__aarch64__)
  return 183;
#elif defined(__i386__)
  return 3;
#elif defined(__riscv)
  return 243;
#elif defined(__powerpc64__)
  return 21;
#elif defined(__s390x__)
  return 22;
#else
  return 0;
#endif
}

template <typename T>
inline void jitdump_put(std::string& out, T v) {
  char b[sizeof(T)];
  std::memcpy(b, &v, sizeof(T));
  out.append(b, sizeof(T));
}

// The 40-byte file header.
inline void append_jitdump_header(std::string& out, std::uint32_t pid, std::uint64_t timestamp_ns) {
  jitdump_put<std::uint32_t>(out, jitdump_magic);
  jitdump_put<std::uint32_t>(out, jitdump_version);
  jitdump_put<std::uint32_t>(out, jitdump_header_size);
  jitdump_put<std::uint32_t>(out, jitdump_elf_machine());
  jitdump_put<std::uint32_t>(out, 0);  // pad1
  jitdump_put<std::uint32_t>(out, pid);
  jitdump_put<std::uint64_t>(out, timestamp_ns);
  jitdump_put<std::uint64_t>(out, 0);  // flags: timestamps are CLOCK_MONOTONIC, not the TSC
}

// One JIT_CODE_LOAD record: prefix, pid, tid, vma, code_addr, code_size, code_index, name NUL, code.
// `name` must be sanitised (no NUL); `code` points at `size` readable bytes (or is null: no bytes).
inline void append_jitdump_code_load(std::string& out, std::uint32_t pid, std::uint32_t tid,
                                     std::uint64_t addr, std::uint64_t size, std::uint64_t index,
                                     std::string_view name, const void* code, std::uint64_t timestamp_ns) {
  std::uint64_t bytes = code != nullptr ? size : 0;
  std::uint64_t total = 16 + 4 + 4 + 8 * 4 + name.size() + 1 + bytes;
  jitdump_put<std::uint32_t>(out, jitdump_code_load);
  jitdump_put<std::uint32_t>(out, static_cast<std::uint32_t>(total));
  jitdump_put<std::uint64_t>(out, timestamp_ns);
  jitdump_put<std::uint32_t>(out, pid);
  jitdump_put<std::uint32_t>(out, tid);
  jitdump_put<std::uint64_t>(out, addr);  // vma
  jitdump_put<std::uint64_t>(out, addr);  // code_addr
  jitdump_put<std::uint64_t>(out, bytes);
  jitdump_put<std::uint64_t>(out, index);
  out.append(name.data(), name.size());
  out += '\0';
  if (bytes != 0) out.append(static_cast<const char*>(code), static_cast<std::size_t>(bytes));
}

// Regions larger than this are recorded without their bytes (a 32-bit record size must hold them).
constexpr std::uint64_t jitdump_max_code_bytes = std::uint64_t{64} << 20;

class jitdump_writer {
 public:
  jitdump_writer(std::string dir, long pid) : path_(path_for(dir, pid)), pid_(pid) {}
  jitdump_writer(const jitdump_writer&) = delete;
  jitdump_writer& operator=(const jitdump_writer&) = delete;
  ~jitdump_writer() { close(); }

  static std::string path_for(const std::string& dir, long pid) {
    std::string path = dir.empty() ? "." : dir;
    if (path.back() != '/') path += '/';
    path += "jit-";
    path += std::to_string(pid);
    path += ".dump";
    return path;
  }
  const std::string& path() const { return path_; }
  bool is_open() const { return fd_ >= 0; }

  // Creates the file, writes the header and maps its first page PROT_READ|PROT_EXEC: that mapping is the
  // MMAP2 event through which `perf record` finds the file. Fails on a noexec mount (EPERM).
  status open(std::uint64_t now_ns) {
    if (fd_ >= 0) return status::ok();
    safe_file f;
    status st = create_safe_file(path_, O_RDWR, "jitdump", f);
    if (!st) return st;
    std::string header;
    append_jitdump_header(header, static_cast<std::uint32_t>(pid_), now_ns);
    st = write_all(f.fd, header.data(), header.size(), path_);
    if (!st) {
      sys().close(f.fd);
      return st;
    }
    long page = ::sysconf(_SC_PAGESIZE);
    page_ = page > 0 ? static_cast<std::size_t>(page) : 4096;
    void* m = ::mmap(nullptr, page_, PROT_READ | PROT_EXEC, MAP_PRIVATE, f.fd, 0);
    if (m == MAP_FAILED) {
      int e = errno;
      sys().close(f.fd);
      std::string m = "selfprof: cannot map the jitdump ";
      m += path_;
      m += " PROT_EXEC (perf would not see it): ";
      m += std::strerror(e);
      if (e == EPERM) m += " (noexec mount? set SELFPROF_JITDUMP_DIR)";
      return status::error(std::move(m));
    }
    mapping_ = m;
    fd_ = keep_fd_high(f.fd);  // above the application's descriptors (detail/high_fd.hpp)
    return status::ok();
  }

  status write(std::string_view records) {
    if (fd_ < 0) return status::error("selfprof: jitdump " + path_ + " is not open");
    return write_all(fd_, records.data(), records.size(), path_);
  }

  void close() {
    if (mapping_ != nullptr) ::munmap(mapping_, page_);
    mapping_ = nullptr;
    if (fd_ >= 0) sys().close(fd_);
    fd_ = -1;
  }

  // After fork(): the descriptor and the file are the parent's; drop them without writing.
  void abandon_after_fork(const std::string& dir, long pid) {
    close();
    path_ = path_for(dir, pid);
    pid_ = pid;
  }

 private:
  std::string path_;
  long pid_;
  int fd_ = -1;
  void* mapping_ = nullptr;
  std::size_t page_ = 4096;
};

}  // namespace detail
}  // namespace selfprof
// ---- end selfprof/jit/jitdump_writer.hpp ----
// ---- begin selfprof/jit/name.hpp ----
// Names of JIT code as perf and selfprof accept them: no newline, NUL or other control byte, bounded
// length (cut on a UTF-8 character boundary), and at least three characters (perf drops shorter ones).
// Context: any thread (pure functions).

#include <cstddef>
#include <string>
#include <string_view>

namespace selfprof {
namespace detail {

// Longest name kept, in bytes; a longer one is cut and ends in "...".
constexpr std::size_t jit_name_max = 512;
// perf's map parser skips a line unless more than two characters follow the size (dso__load_perf_map).
constexpr std::size_t jit_name_min = 3;

// Appends the sanitised form of `name` to `out`: control bytes (below 0x20 and 0x7f) become '_', an
// over-long name is cut to jit_name_max bytes on a character boundary, a short one gets a "jit:" prefix
// and an empty one becomes "jit:anonymous".
inline void append_jit_name(std::string& out, std::string_view name) {
  if (name.empty()) {
    out += "jit:anonymous";
    return;
  }
  if (name.size() < jit_name_min) out += "jit:";
  std::size_t n = name.size();
  bool cut = n > jit_name_max;
  if (cut) {
    n = jit_name_max - 3;
    // Do not split a UTF-8 sequence: back up over continuation bytes (10xxxxxx) to a lead byte.
    while (n > 0 && (static_cast<unsigned char>(name[n]) & 0xc0) == 0x80) --n;
  }
  std::size_t first = out.size();
  out.append(name.data(), n);
  for (std::size_t i = first; i < out.size(); ++i) {
    unsigned char c = static_cast<unsigned char>(out[i]);
    if (c < 0x20 || c == 0x7f) out[i] = '_';
  }
  if (cut) out += "...";
}

inline std::string sanitize_jit_name(std::string_view name) {
  std::string out;
  append_jit_name(out, name);
  return out;
}

}  // namespace detail
}  // namespace selfprof
// ---- end selfprof/jit/name.hpp ----
// ---- begin selfprof/jit/perf_map_writer.hpp ----
// Writer of perf's JIT symbol map /tmp/perf-<pid>.map: "START SIZE name" lines (lower-case hex without
// 0x, one space each, newline-terminated), appended in registration order so perf's last-line-wins
// reading matches the latest code at each address; the file is created safely (see safe_file.hpp).
// A map another live writer holds (another JIT runtime or copy of selfprof in this process, or a process
// with the same pid in another container sharing /tmp) is appended to, never truncated or removed: perf
// maps are meant to collect the lines of every JIT of the process, and each write() is whole lines with
// O_APPEND, so lines of different writers never mix. Only a provably dead writer's map is replaced.
// Context: any thread (the JIT runtime serialises calls).

#include <fcntl.h>
#include <unistd.h>

#include <cstdint>
#include <string>
#include <string_view>


namespace selfprof {
namespace detail {

// Appends one perf map line. `name` must be sanitised already (append_jit_name).
inline void append_perf_map_line(std::string& out, std::uint64_t start, std::uint64_t size,
                                 std::string_view name) {
  static const char digits[] = "0123456789abcdef";
  auto hex = [&out](std::uint64_t v) {
    char buf[16];
    int n = 0;
    do {
      buf[n++] = digits[v & 15];
      v >>= 4;
    } while (v != 0);
    while (n > 0) out += buf[--n];
  };
  hex(start);
  out += ' ';
  hex(size);
  out += ' ';
  out.append(name.data(), name.size());
  out += '\n';
}

class perf_map_writer {
 public:
  // `dir` is "/tmp" for perf; `pid` is the process id perf knows the process by.
  perf_map_writer(std::string dir, long pid) : path_(path_for(dir, pid)) {}
  perf_map_writer(const perf_map_writer&) = delete;
  perf_map_writer& operator=(const perf_map_writer&) = delete;
  ~perf_map_writer() { close(); }

  static std::string path_for(const std::string& dir, long pid) {
    std::string path = dir;
    if (path.empty() || path.back() != '/') path += '/';
    path += "perf-";
    path += std::to_string(pid);
    path += ".map";
    return path;
  }
  const std::string& path() const { return path_; }
  bool is_open() const { return fd_ >= 0; }
  bool replaced_stale() const { return replaced_stale_; }
  bool shared() const { return shared_; }  // appending to another live writer's map

  // Creates the file or joins a live writer's (replacing a provably stale one of ours, refusing anything
  // else), and keeps a shared flock on it while open. Idempotent once open.
  status open() {
    if (fd_ >= 0) return status::ok();
    safe_file f;
    status st = create_safe_file(path_, O_WRONLY | O_APPEND, "perf map", f, live_file::share);
    if (!st) return st;
    fd_ = keep_fd_high(f.fd);  // above the application's descriptors; the lock moves with it (same file)
    replaced_stale_ = f.replaced_stale;
    shared_ = f.shared;
    return status::ok();
  }

  // Appends whole lines (O_APPEND: another writer in this process cannot split them).
  status write(std::string_view lines) {
    if (fd_ < 0) return status::error("selfprof: perf map " + path_ + " is not open");
    return write_all(fd_, lines.data(), lines.size(), path_);
  }

  void close() {
    if (fd_ >= 0) sys().close(fd_);
    fd_ = -1;
  }

  // After fork(): the descriptor belongs to the parent's file; forget it without writing (closing the
  // child's copy leaves the parent's lock in place: a flock belongs to the shared open file description).
  void abandon_after_fork(const std::string& dir, long pid) {
    close();
    path_ = path_for(dir, pid);
  }

 private:
  std::string path_;
  int fd_ = -1;
  bool replaced_stale_ = false;
  bool shared_ = false;
};

}  // namespace detail
}  // namespace selfprof
// ---- end selfprof/jit/perf_map_writer.hpp ----
// ---- begin selfprof/jit/registry.hpp ----
// The JIT code registry: every region ever registered (start, size, name, add and remove times in
// CLOCK_MONOTONIC ns), kept for the life of the process so that a sample is named by the code that was
// at its address when the sample was taken, plus the tagged-pc encoding that carries (region, offset).
// Context: any thread. Writers (add, remove, for_each_live) must be serialised by the caller; lookups
// (translate) serialise among themselves on an internal lock and never wait for writers; name() is lock-free.
// Regions are at most 4 GiB - 1 long.

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstring>
#include <memory>
#include <mutex>
#include <new>
#include <string>
#include <string_view>
#include <vector>

// ---- begin selfprof/profile.hpp ----
// The profile value: symbolized stacks with counts, thread names and sampling metadata.
// Context: any thread (built by the collector or the CLI; read by the writers).

#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

// ---- begin selfprof/modes.hpp ----
// The enums that name what a profile counts, how stacks are walked and which tick source samples, with
// their names as the environment variables and the writers spell them.
// Context: any thread (values only).

namespace selfprof {

// What a profile counts. Profiles made from a wall profile's off-CPU stacks say `offcpu`; options take
// only `cpu` or `wall`.
enum class profile_mode { cpu, wall, offcpu };

// How the signal handler walks stacks: `dwarf` follows .eh_frame rows (frame pointers where a module
// has none), `fp` frame pointers only, `automatic` dwarf when the rows build.
enum class unwind_mode { automatic, fp, dwarf };

// The mechanism that delivers ticks (sources/). `none`: wall mode without on-CPU ticks.
enum class source_kind { automatic, perf, timer, itimer, none, ring };

// Which DWARF a dump reads for file:line and inline frames (with libdw). `automatic`: DWARF stored as
// is; DWARF whose sections are compressed (as Debian's -dbg and -dbgsym packages ship libraries' debug
// files) is skipped, because libdw inflates every section whole before the first lookup, about 100 ms
// for libc's whatever was sampled; those modules are named from their symbols. `all` reads it too;
// `none` reads no DWARF.
enum class lines_mode { automatic, all, none };

inline const char* mode_name(profile_mode m) {
  switch (m) {
    case profile_mode::cpu:
      return "cpu";
    case profile_mode::wall:
      return "wall";
    case profile_mode::offcpu:
      return "offcpu";
  }
  return "?";
}

inline const char* unwind_name(unwind_mode u) {
  switch (u) {
    case unwind_mode::automatic:
      return "auto";
    case unwind_mode::fp:
      return "fp";
    case unwind_mode::dwarf:
      return "dwarf";
  }
  return "?";
}

inline const char* lines_name(lines_mode l) {
  switch (l) {
    case lines_mode::automatic:
      return "auto";
    case lines_mode::all:
      return "all";
    case lines_mode::none:
      return "none";
  }
  return "?";
}

inline const char* source_name(source_kind k) {
  switch (k) {
    case source_kind::automatic:
      return "auto";
    case source_kind::perf:
      return "perf";
    case source_kind::timer:
      return "timer";
    case source_kind::itimer:
      return "itimer";
    case source_kind::none:
      return "none";
    case source_kind::ring:
      return "ring";
  }
  return "?";
}

}  // namespace selfprof
// ---- end selfprof/modes.hpp ----

namespace selfprof {

// What kind of code a frame is in; writers map it to the folded annotations of
// flamegraph.pl (`_[k]`, `_[j]`, `_[i]`) and to palettes.
enum class frame_kind : std::uint8_t {
  native,   // ordinary machine code of a mapped module
  kernel,   // kernel code (`_[k]`)
  jit,      // code named by a perf map or selfprof::jit (`_[j]`)
  inlined,  // an inlined call expanded by the symbolizer (`_[i]`)
  marker,   // synthetic frame made by selfprof itself: thread roots, [truncated], [blocked: ...]
};

struct frame {
  std::string name;                 // demangled function name, or "[module+0xoffset]" when nothing names it
  std::string module;               // path of the module (empty for markers)
  std::uint64_t address = 0;        // absolute address looked up (pc, or pc-1 for return addresses)
  std::uint64_t module_offset = 0;  // address relative to the module's load bias
  std::string file;                 // source file when known (libdw), else empty
  std::uint32_t line = 0;           // source line when known, else 0
  frame_kind kind = frame_kind::native;
};

struct stack {
  std::vector<std::uint32_t> frames;  // indices into profile::frames; root first, leaf last
  std::uint64_t count = 0;            // samples (or the profile's unit, see profile_info::unit)
  std::uint32_t tid = 0;              // thread the samples came from (0 when merged/unknown)
  bool truncated = false;             // root-side frames are missing (depth limit, or a stack copy ended)
  bool offcpu = false;                // wall mode: time the thread spent off the CPU (leaf: [blocked: call])
};

struct thread_info {
  std::uint32_t tid = 0;
  std::string name;
};

// Frame statistics of one game/engine loop on one thread (selfprof::frame_mark), from the marks' own
// CLOCK_MONOTONIC times: exact counts; percentiles from a log histogram (within 1%); max exact.
struct frame_loop_stats {
  std::string name;               // loop name given to frame_mark
  std::uint32_t tid = 0;          // marking thread
  std::uint64_t count = 0;        // frames that ended while profiling
  std::uint64_t over_budget = 0;  // of those, longer than budget_ms
  std::uint64_t lost = 0;         // frames the collector could not read in time (not in count)
  double budget_ms = 0;
  double p50_ms = 0, p95_ms = 0, p99_ms = 0, max_ms = 0;
};

// One line for headers and footers: "render (tid 12): 600 frames, p50 16.2 ms, ... 9 over 16.7 ms".
inline std::string frame_stats_line(const frame_loop_stats& s) {
  char buf[256];
  std::snprintf(
      buf, sizeof buf,
      "%s (tid %u): %llu frames, p50 %.2f ms, p95 %.2f ms, p99 %.2f ms, max %.2f ms, %llu over %.1f ms",
      s.name.c_str(), static_cast<unsigned>(s.tid), static_cast<unsigned long long>(s.count), s.p50_ms,
      s.p95_ms, s.p99_ms, s.max_ms, static_cast<unsigned long long>(s.over_budget), s.budget_ms);
  std::string line = buf;
  if (s.lost) line += " (" + std::to_string(s.lost) + " lost)";
  return line;
}

struct profile_info {
  profile_mode mode = profile_mode::cpu;  // cpu, wall, or offcpu (the off-CPU part of a wall profile)
  std::string unit = "samples";           // what stack::count counts
  std::string source;                     // tick source that produced the samples (perf, timer, itimer, file)
  double hz = 0;                          // requested sampling rate
  double duration_s = 0;                  // wall time covered by the profile
  std::uint64_t period_ns = 0;            // CPU time one sample stands for
  std::uint64_t samples = 0;              // samples counted in the stacks (sum of weights)
  std::uint64_t dropped = 0;              // samples lost (ring full, unwinder refused, ...)
  std::uint64_t truncated = 0;            // samples whose stack hit the depth limit
  std::uint64_t start_unix_ns = 0;        // when the profile started
  bool kernel_time = true;                // samples include time spent in the kernel (false: user-only ticks)
  std::vector<std::string> notes;         // human-readable remarks (why a source was refused, ...)
  std::string view;  // what the stacks hold: "" all samples, "slow frames", "frame ..." one frame
  std::vector<frame_loop_stats> frame_loops;  // game/engine loops marked with frame_mark (empty: none)
};

struct profile {
  std::vector<frame> frames;
  std::vector<stack> stacks;
  std::vector<thread_info> threads;
  profile_info info;

  // Name of a thread, or an empty string when unknown.
  const std::string& thread_name(std::uint32_t tid) const {
    static const std::string empty;
    for (const auto& t : threads)
      if (t.tid == tid) return t.name;
    return empty;
  }
};

}  // namespace selfprof
// ---- end selfprof/profile.hpp ----

namespace selfprof {
namespace detail {

// A tagged pc: 0xfe in the top byte (never a canonical x86-64 or AArch64 user or kernel address), the
// region's generation in the next 32 bits and offset+1 in the low 24 bits. offset+1 so that `tagged - 1`,
// which build_profile() looks up for return addresses, still decodes to the same region (at pc - 1).
constexpr std::uint64_t jit_tag_marker = std::uint64_t{0xfe} << 56;
constexpr unsigned jit_tag_offset_bits =
    24;  // regions longer than 16 MiB - 1 keep raw pcs (perf map names them)
constexpr std::uint64_t jit_tag_offset_mask = (std::uint64_t{1} << jit_tag_offset_bits) - 1;
constexpr std::uint64_t jit_live = ~std::uint64_t{0};  // remove time of a region still in place

inline bool is_jit_tagged(std::uint64_t v) { return (v >> 56) == 0xfe; }

struct jit_region {
  std::uint64_t start = 0;
  std::uint64_t add_ns = 0;
  std::atomic<std::uint64_t> remove_ns{jit_live};
  const char* meta = nullptr;  // in the registry's arena: u32 size, u32 name length, the name bytes

  std::uint64_t size() const {
    std::uint32_t v;
    std::memcpy(&v, meta, 4);
    return v;
  }
  std::string_view name() const {
    std::uint32_t n;
    std::memcpy(&n, meta + 4, 4);
    return std::string_view(meta + 8, n);
  }
};

// Start address -> generation of the live region there: open addressing with linear probing, no node
// allocation per entry (registration is meant to be cheap enough for every compiled function).
class live_index {
 public:
  static constexpr std::uint32_t none = ~std::uint32_t{0};

  // The generation stored for `key` (none if absent), inserting the key when absent.
  std::uint32_t& slot(std::uint64_t key) {
    if ((used_ + 1) * 4 > keys_.size() * 3) grow();
    std::size_t mask = keys_.size() - 1, grave = keys_.size();
    for (std::size_t i = hash(key) & mask;; i = (i + 1) & mask) {
      if (keys_[i] == key && vals_[i] != none) return vals_[i];
      if (keys_[i] == key) {  // a tombstone of this very key: reuse it
        ++size_;
        return vals_[i];
      }
      if (vals_[i] == none && keys_[i] == empty) {
        if (grave != keys_.size())
          i = grave;
        else
          ++used_;
        keys_[i] = key;
        vals_[i] = none;
        ++size_;
        return vals_[i];
      }
      if (vals_[i] == none && grave == keys_.size()) grave = i;  // a tombstone: reusable
    }
  }

  // Removes `key` and returns its generation, or none.
  std::uint32_t take(std::uint64_t key) {
    if (keys_.empty()) return none;
    std::size_t mask = keys_.size() - 1;
    for (std::size_t i = hash(key) & mask;; i = (i + 1) & mask) {
      if (keys_[i] == key && vals_[i] != none) {
        std::uint32_t v = vals_[i];
        vals_[i] = none;  // tombstone: the key stays so that probing goes on past it
        --size_;
        return v;
      }
      if (keys_[i] == empty && vals_[i] == none) return none;
    }
  }

  std::vector<std::uint32_t> values() const {
    std::vector<std::uint32_t> out;
    out.reserve(size_);
    for (std::size_t i = 0; i < keys_.size(); ++i)
      if (vals_[i] != none) out.push_back(vals_[i]);
    return out;
  }
  std::size_t size() const { return size_; }

 private:
  static constexpr std::uint64_t empty = ~std::uint64_t{0};  // never the start of user-space code
  static std::size_t hash(std::uint64_t k) {
    k ^= k >> 33;
    k *= 0xff51afd7ed558ccdull;
    k ^= k >> 33;
    return static_cast<std::size_t>(k);
  }
  void grow() {
    std::size_t cap = 64;
    while (cap < size_ * 2) cap *= 2;
    std::vector<std::uint64_t> keys(cap, empty);
    std::vector<std::uint32_t> vals(keys.size(), none);
    std::size_t mask = keys.size() - 1;
    for (std::size_t j = 0; j < keys_.size(); ++j) {
      if (vals_[j] == none) continue;
      std::size_t i = hash(keys_[j]) & mask;
      while (keys[i] != empty) i = (i + 1) & mask;
      keys[i] = keys_[j];
      vals[i] = vals_[j];
    }
    keys_.swap(keys);
    vals_.swap(vals);
    used_ = size_;
  }

  std::vector<std::uint64_t> keys_;
  std::vector<std::uint32_t> vals_;  // none: free (key empty) or tombstone (key kept)
  std::size_t size_ = 0;             // live keys
  std::size_t used_ = 0;             // slots with a key (live or tombstone)
};

class jit_registry {
 public:
  jit_registry() = default;
  jit_registry(const jit_registry&) = delete;
  jit_registry& operator=(const jit_registry&) = delete;
  ~jit_registry() {
    for (auto& b : buckets_) delete[] b.load(std::memory_order_relaxed);
  }

  // Writer. Registers [start, start+size) under an already sanitised name at time now_ns and returns its
  // generation. A live region with the same start is replaced (removed at now_ns), as perf's last line wins.
  std::uint32_t add(std::uint64_t start, std::uint32_t size, std::string_view name, std::uint64_t now_ns) {
    std::uint32_t gen = static_cast<std::uint32_t>(count_.load(std::memory_order_relaxed));
    std::uint32_t& live = live_.slot(start);
    if (live != live_index::none) slot_for(live).remove_ns.store(now_ns, std::memory_order_release);
    live = gen;
    jit_region& r = slot_for(gen);
    r.start = start;
    r.add_ns = now_ns;
    r.remove_ns.store(jit_live, std::memory_order_relaxed);
    r.meta = store_meta(static_cast<std::uint32_t>(size), name);
    std::uint64_t end = start + size < start ? ~std::uint64_t{0} : start + size;
    if (gen == 0 || start < lo_.load(std::memory_order_relaxed)) lo_.store(start, std::memory_order_relaxed);
    if (end > hi_.load(std::memory_order_relaxed)) hi_.store(end, std::memory_order_relaxed);
    count_.store(std::uint64_t{gen} + 1, std::memory_order_release);  // publishes the slot to readers
    return gen;
  }

  // Writer. Marks the live region starting at `start` removed at now_ns; false when there is none.
  bool remove(std::uint64_t start, std::uint64_t now_ns) {
    std::uint32_t gen = live_.take(start);
    if (gen == live_index::none) return false;
    slot_for(gen).remove_ns.store(now_ns, std::memory_order_release);
    return true;
  }

  // Writer side: calls f(const jit_region&) for each live region, oldest first.
  template <typename F>
  void for_each_live(F f) const {
    std::vector<std::uint32_t> gens = live_.values();
    std::sort(gens.begin(), gens.end());
    for (std::uint32_t g : gens) f(region(g));
  }

  std::uint64_t count() const { return count_.load(std::memory_order_acquire); }
  std::size_t live_count() const { return live_.size(); }  // writer side

  // Region of a generation below count().
  const jit_region& region(std::uint32_t gen) const {
    std::uint64_t v = std::uint64_t{gen} + (std::uint64_t{1} << first_bucket_bits);
    unsigned p = 63u - static_cast<unsigned>(__builtin_clzll(v));
    return buckets_[p - first_bucket_bits].load(std::memory_order_acquire)[v - (std::uint64_t{1} << p)];
  }

  // Lookup. When `pc` lies in a region that was in place at time_ns (add time <= time_ns < remove time;
  // the latest such region if several overlap), rewrites pc to its tagged value and returns true.
  // Returns false at once, without a lock, when nothing was ever registered or pc is outside every region.
  bool translate(std::uint64_t& pc, std::uint64_t time_ns) {
    std::uint64_t n = count_.load(std::memory_order_acquire);
    if (n == 0 || pc < lo_.load(std::memory_order_relaxed) || pc >= hi_.load(std::memory_order_relaxed))
      return false;
    std::lock_guard<std::mutex> lock(index_mu_);
    if (n > indexed_) catch_up(n);
    std::uint64_t best = jit_live;
    for (const auto& run : runs_) find_in(run, pc, time_ns, best);
    if (best == jit_live) return false;
    std::uint64_t offset = pc - region(static_cast<std::uint32_t>(best)).start;
    if (offset + 1 > jit_tag_offset_mask) return false;
    pc = jit_tag_marker | (best << jit_tag_offset_bits) | (offset + 1);
    return true;
  }

  // After fork(): a lookup in the parent may have held the index lock mid-update; the child starts a
  // fresh index (the old one is leaked on purpose rather than freed in an unknown state).
  void reset_lookup_after_fork() {
    new (&index_mu_) std::mutex();
    new (&runs_) std::vector<run>();
    indexed_ = 0;
  }

  // Names a tagged value (or a tagged value minus one): kind jit, module "[jit]", address the original.
  bool name(std::uint64_t tagged, frame& out) const {
    if (!is_jit_tagged(tagged)) return false;
    std::uint64_t gen = (tagged >> jit_tag_offset_bits) & 0xffffffffu;
    std::uint64_t field = tagged & jit_tag_offset_mask;  // offset + 1, or offset for `tagged - 1`
    if (gen >= count()) return false;
    const jit_region& r = region(static_cast<std::uint32_t>(gen));
    if (field > r.size()) return false;
    out.name.assign(r.name());
    out.module = "[jit]";
    out.address = r.start + field - 1;
    out.module_offset = field == 0 ? 0 : field - 1;
    out.file.clear();
    out.line = 0;
    out.kind = frame_kind::jit;
    return true;
  }

 private:
  struct index_entry {
    std::uint64_t start, end, max_end;  // max_end: the largest end among this entry and those before it
    std::uint32_t gen;
  };
  using run = std::vector<index_entry>;

  static constexpr unsigned first_bucket_bits = 8;  // bucket b holds 256 << b regions
  static constexpr unsigned bucket_count = 26;      // enough for 2^32 generations

  // Writer: the slot of a generation, allocating its bucket on first use.
  jit_region& slot_for(std::uint32_t gen) {
    std::uint64_t v = std::uint64_t{gen} + (std::uint64_t{1} << first_bucket_bits);
    unsigned p = 63u - static_cast<unsigned>(__builtin_clzll(v));
    unsigned b = p - first_bucket_bits;
    jit_region* bucket = buckets_[b].load(std::memory_order_acquire);
    if (bucket == nullptr) {  // only a writer reaches a bucket not yet published
      bucket = new jit_region[std::size_t{1} << p];
      buckets_[b].store(bucket, std::memory_order_release);
    }
    return bucket[v - (std::uint64_t{1} << p)];
  }

  const char* store_meta(std::uint32_t size, std::string_view name) {
    std::size_t need = 8 + name.size();
    if (need > arena_left_) {
      std::size_t block = std::max<std::size_t>(arena_block, need);
      arena_.emplace_back(new char[block]);
      arena_next_ = arena_.back().get();
      arena_left_ = block;
    }
    char* p = arena_next_;
    std::uint32_t len = static_cast<std::uint32_t>(name.size());
    std::memcpy(p, &size, 4);
    std::memcpy(p + 4, &len, 4);
    if (len != 0) std::memcpy(p + 8, name.data(), len);
    arena_next_ += need;
    arena_left_ -= need;
    return p;
  }

  // Indexes generations [indexed_, n) as a new sorted run, then merges runs so that each is more than
  // twice the size of the next (a binary counter): O(log n) runs, O(log n) amortised work per region.
  void catch_up(std::uint64_t n) {
    run fresh;
    fresh.reserve(static_cast<std::size_t>(n - indexed_));
    for (std::uint64_t g = indexed_; g < n; ++g) {
      const jit_region& r = region(static_cast<std::uint32_t>(g));
      std::uint64_t end = r.start + r.size() < r.start ? ~std::uint64_t{0} : r.start + r.size();
      fresh.push_back(index_entry{r.start, end, end, static_cast<std::uint32_t>(g)});
    }
    indexed_ = n;
    std::sort(fresh.begin(), fresh.end(), by_start);
    runs_.push_back(std::move(fresh));
    while (runs_.size() >= 2 && runs_[runs_.size() - 2].size() <= 2 * runs_.back().size()) {
      run& a = runs_[runs_.size() - 2];
      const run& b = runs_.back();
      run merged(a.size() + b.size());
      std::merge(a.begin(), a.end(), b.begin(), b.end(), merged.begin(), by_start);
      a.swap(merged);
      runs_.pop_back();
    }
    run& last = runs_.back();
    std::uint64_t m = 0;
    for (auto& e : last) e.max_end = m = std::max(m, e.end);
  }

  static bool by_start(const index_entry& a, const index_entry& b) {
    return a.start != b.start ? a.start < b.start : a.gen < b.gen;
  }

  void find_in(const run& r, std::uint64_t pc, std::uint64_t time_ns, std::uint64_t& best) const {
    auto it = std::upper_bound(r.begin(), r.end(), pc,
                               [](std::uint64_t v, const index_entry& e) { return v < e.start; });
    while (it != r.begin()) {
      --it;
      if (it->max_end <= pc) break;  // nothing at or before this entry reaches pc
      if (it->end <= pc || (best != jit_live && it->gen <= best)) continue;
      const jit_region& g = region(it->gen);
      if (g.add_ns <= time_ns && time_ns < g.remove_ns.load(std::memory_order_acquire)) best = it->gen;
    }
  }

  static constexpr std::size_t arena_block = 256 * 1024;

  // Writers' state (serialised by the caller).
  live_index live_;  // start -> generation of the live region there
  std::vector<std::unique_ptr<char[]>> arena_;
  char* arena_next_ = nullptr;
  std::size_t arena_left_ = 0;

  // Published to readers.
  std::atomic<jit_region*> buckets_[bucket_count] = {};
  std::atomic<std::uint64_t> count_{0};
  std::atomic<std::uint64_t> lo_{0}, hi_{0};

  // Lookup index (index_mu_).
  std::mutex index_mu_;
  std::vector<run> runs_;
  std::uint64_t indexed_ = 0;
};

}  // namespace detail
}  // namespace selfprof
// ---- end selfprof/jit/registry.hpp ----

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
// ---- end selfprof/jit/runtime.hpp ----

namespace selfprof {
namespace jit {

SELFPROF_API bool add(const void* code, std::size_t size, std::string_view name) {
  return selfprof::detail::jit_global().add(code, size, name);
}

SELFPROF_API bool remove(const void* code) {
  if (selfprof::detail::jit_runtime_slot().load(std::memory_order_acquire) == nullptr) return false;
  return selfprof::detail::jit_global().remove(code);
}

SELFPROF_API status flush() {
  if (selfprof::detail::jit_runtime_slot().load(std::memory_order_acquire) == nullptr) return status::ok();
  return selfprof::detail::jit_global().flush();
}

SELFPROF_API status configure(const options& o) {
  std::lock_guard<std::mutex> lock(selfprof::detail::jit_runtime_init_mutex());
  if (selfprof::detail::jit_runtime_slot().load(std::memory_order_acquire) != nullptr)
    return status::error("selfprof: jit::configure() must come before the first jit::add()");
  selfprof::detail::jit_pending_options() = o;
  return status::ok();
}

SELFPROF_API std::string perf_map_path() { return selfprof::detail::jit_global().perf_map_path(); }

}  // namespace jit
}  // namespace selfprof
// ---- end selfprof/jit/api.hpp ----
#endif
// ---- end selfprof/jit.hpp ----
// ---- begin selfprof/options.hpp ----
// Profiler options and their SELFPROF_* environment variables (parsed, validated, reported by name).
// Context: setup only.

#include <signal.h>

#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>


namespace selfprof {

struct options {
  double hz = 99;                               // SELFPROF_HZ: samples per CPU-second per thread
  source_kind source = source_kind::automatic;  // SELFPROF_SOURCE: auto|ring|perf|timer|itimer
  std::string out;                              // SELFPROF_OUT: dump path template(s), comma-separated
  int dump_signal = SIGUSR2;              // SELFPROF_SIGNAL: USR2 (default), USR1, a number, or none (0)
  profile_mode mode = profile_mode::cpu;  // SELFPROF_MODE: cpu|wall
  double interval_s = 0;                  // SELFPROF_INTERVAL: seconds between periodic dumps (0: off)
  double window_s = 0;                    // SELFPROF_WINDOW: dumps hold only the last N seconds (0: all)
  bool allow_shared_dir = false;          // SELFPROF_ALLOW_SHARED_DIR: write into others-writable dirs
  unsigned max_depth = 128;               // SELFPROF_MAX_DEPTH: frames kept per sample (2..1024)
  int sample_signal = 0;                  // SELFPROF_SAMPLE_SIGNAL: 0 picks SIGPROF or a free RT signal
  unwind_mode unwind = unwind_mode::automatic;  // SELFPROF_UNWIND: fp|dwarf|auto
  lines_mode lines = lines_mode::automatic;     // SELFPROF_LINES: auto|all|none (modes.hpp)
  bool thread_roots = false;                    // SELFPROF_THREAD_ROOTS: per-thread root frames in output
  bool verbose = false;                         // SELFPROF_VERBOSE: echo the configuration once on start
  std::size_t ring_slots = 0;                   // sample ring capacity (0: sized from hz)
  double frame_budget_ms = 16.7;  // SELFPROF_FRAME_BUDGET_MS: a game frame longer than this is slow
  double frame_hz = 0;            // SELFPROF_FRAME_HZ: rate on threads that mark game frames (0: hz)
  // SELFPROF_MAX_MEMORY (bytes, K/M/G suffixes): the ceiling on what sampling collects. The sample ring
  // gets at most a quarter (it is clipped to fewer slots: samples the collector cannot take in time are
  // dropped and counted); of the rest, the stack table gets 40% (a dump briefly holds a copy of the same
  // size) and the rest is for per-thread totals and names. With SELFPROF_WINDOW the table's part is
  // shared with the window buckets. Past its part, a new distinct stack is counted under one
  // "[selfprof: memory ceiling]" stack, and when many threads were seen the stacks of ended threads are
  // merged into one thread; both are counted in the stats and said in the profile notes. The default,
  // 64 MiB, keeps the default ring (0.5 MB at 99 Hz) whole and lets the table hold about 100,000
  // distinct stacks, more than long runs of large programs show, while a runaway (a thread per request,
  // an absurd rate or depth) stays small next to the program. Values under 1 MiB are raised to 1 MiB.
  std::size_t max_memory = std::size_t{64} << 20;
  // The profile endpoint (core/endpoint.hpp, serve/server.hpp): off unless an address is given.
  std::string http;                 // SELFPROF_HTTP: 127.0.0.1:PORT, [::1]:PORT, unix:/path ("" off)
  std::string http_token_file;      // SELFPROF_HTTP_TOKEN_FILE: bearer token (0600 file); needed off loopback
  double http_max_seconds = 300;    // SELFPROF_HTTP_MAX_SECONDS: the longest ?seconds= served
  double http_head_timeout_s = 10;  // a client must send its request head within this (slowloris)
  // SELFPROF_CONTROL: the control socket "@selfprof-<pid>" that `selfprof dump PID` asks (same uid or root).
  bool control = true;
};

// The smallest ceiling: room for the smallest ring at the deepest stacks and a useful table.
constexpr std::size_t kMinMaxMemory = std::size_t{1} << 20;

namespace detail {

inline bool parse_double(const char* text, double lo, double hi, double& out) {
  if (text == nullptr || *text == '\0') return false;
  errno = 0;
  char* end = nullptr;
  double v = std::strtod(text, &end);
  if (errno != 0 || end == text || *end != '\0' || !(v >= lo && v <= hi)) return false;
  out = v;
  return true;
}

// A byte count: digits with an optional K, M or G (powers of 1024; "KiB", "MB" and lowercase work too).
inline bool parse_bytes(const char* text, std::uint64_t lo, std::uint64_t hi, std::uint64_t& out) {
  if (text == nullptr || *text < '0' || *text > '9') return false;
  errno = 0;
  char* end = nullptr;
  const unsigned long long v = std::strtoull(text, &end, 10);
  if (errno != 0 || end == text) return false;
  std::string unit = end;
  for (char& c : unit) c = static_cast<char>(c >= 'a' && c <= 'z' ? c - 'a' + 'A' : c);
  unsigned shift = 0;
  if (unit.empty() || unit == "B")
    shift = 0;
  else if (unit == "K" || unit == "KB" || unit == "KIB")
    shift = 10;
  else if (unit == "M" || unit == "MB" || unit == "MIB")
    shift = 20;
  else if (unit == "G" || unit == "GB" || unit == "GIB")
    shift = 30;
  else
    return false;
  if (v > (hi >> shift)) return false;
  const std::uint64_t bytes = static_cast<std::uint64_t>(v) << shift;
  if (bytes < lo || bytes > hi) return false;
  out = bytes;
  return true;
}

inline bool parse_bool(const char* text, bool& out) {
  std::string s = text ? text : "";
  if (s == "1" || s == "true" || s == "yes" || s == "on") return out = true, true;
  if (s == "0" || s == "false" || s == "no" || s == "off") return out = false, true;
  return false;
}

// Signals selfprof never takes for sampling or dumps: the kernel raises the fault signals for the
// program's own faults (a handler of ours would turn a crash into an endless loop), SIGKILL and SIGSTOP
// cannot be caught, and the others mean something to every process (children, job control, abort).
inline bool reserved_signal(int s) {
  switch (s) {
    case SIGSEGV:
    case SIGBUS:
    case SIGFPE:
    case SIGILL:
    case SIGTRAP:
    case SIGSYS:
    case SIGABRT:
    case SIGCHLD:
    case SIGKILL:
    case SIGSTOP:
    case SIGCONT:
    case SIGTSTP:
    case SIGTTIN:
    case SIGTTOU:
    case SIGINT:
    case SIGQUIT:
    case SIGTERM:
    case SIGHUP:
    case SIGPIPE:
      return true;
    default:
      return false;
  }
}

inline bool parse_signal(const char* text, bool allow_none, int& out) {
  std::string s = text ? text : "";
  if (allow_none && (s == "none" || s == "0")) return out = 0, true;
  if (s.rfind("SIG", 0) == 0) s = s.substr(3);
  if (s == "USR1") return out = SIGUSR1, true;
  if (s == "USR2") return out = SIGUSR2, true;
  if (s == "PROF") return out = SIGPROF, true;
  if (s == "VTALRM") return out = SIGVTALRM, true;
  double v = 0;
  if (parse_double(s.c_str(), 1, SIGRTMAX, v) && v == static_cast<int>(v) &&
      !reserved_signal(static_cast<int>(v)))
    return out = static_cast<int>(v), true;
  return false;
}

}  // namespace detail

// Options from the SELFPROF_* environment variables. A value that does not parse is described in
// `warnings` (with the variable's name) and the default is kept.
inline options options_from_env(std::vector<std::string>* warnings = nullptr) {
  options o;
  auto bad = [&](const char* name, const char* value, const char* expected) {
    if (warnings)
      warnings->push_back(std::string("selfprof: ignoring ") + name + "=\"" + value + "\": expected " +
                          expected + "; using the default");
  };
  double d = 0;
  bool b = false;
  int sig = 0;
  if (const char* v = std::getenv("SELFPROF_HZ")) {
    if (detail::parse_double(v, 1, 100000, d))
      o.hz = d;
    else
      bad("SELFPROF_HZ", v, "a rate in Hz from 1 to 100000");
  }
  if (const char* v = std::getenv("SELFPROF_SOURCE")) {
    std::string s = v;
    if (s == "auto")
      o.source = source_kind::automatic;
    else if (s == "perf")
      o.source = source_kind::perf;
    else if (s == "timer")
      o.source = source_kind::timer;
    else if (s == "itimer")
      o.source = source_kind::itimer;
    else if (s == "ring")
      o.source = source_kind::ring;
    else
      bad("SELFPROF_SOURCE", v, "auto, ring, perf, timer or itimer");
  }
  if (const char* v = std::getenv("SELFPROF_OUT")) o.out = v;
  if (const char* v = std::getenv("SELFPROF_SIGNAL")) {
    if (detail::parse_signal(v, true, sig))
      o.dump_signal = sig;
    else
      bad("SELFPROF_SIGNAL", v,
          "USR1, USR2, a signal number (not a fault, job-control or termination signal) or none");
  }
  if (const char* v = std::getenv("SELFPROF_MODE")) {
    std::string s = v;
    if (s == "cpu")
      o.mode = profile_mode::cpu;
    else if (s == "wall")
      o.mode = profile_mode::wall;
    else
      bad("SELFPROF_MODE", v, "cpu or wall");
  }
  if (const char* v = std::getenv("SELFPROF_INTERVAL")) {
    if (detail::parse_double(v, 0, 86400 * 365.0, d))
      o.interval_s = d;
    else
      bad("SELFPROF_INTERVAL", v, "seconds between dumps (0 disables)");
  }
  if (const char* v = std::getenv("SELFPROF_WINDOW")) {
    if (detail::parse_double(v, 0, 86400 * 365.0, d))
      o.window_s = d;
    else
      bad("SELFPROF_WINDOW", v, "seconds of recent samples per dump (0: everything since start)");
  }
  if (const char* v = std::getenv("SELFPROF_ALLOW_SHARED_DIR")) {
    if (detail::parse_bool(v, b))
      o.allow_shared_dir = b;
    else
      bad("SELFPROF_ALLOW_SHARED_DIR", v, "0 or 1");
  }
  if (const char* v = std::getenv("SELFPROF_MAX_DEPTH")) {
    if (detail::parse_double(v, 2, 1024, d) && d == static_cast<unsigned>(d))
      o.max_depth = static_cast<unsigned>(d);
    else
      bad("SELFPROF_MAX_DEPTH", v, "a whole number of frames from 2 to 1024");
  }
  if (const char* v = std::getenv("SELFPROF_SAMPLE_SIGNAL")) {
    if (detail::parse_signal(v, false, sig))
      o.sample_signal = sig;
    else
      bad("SELFPROF_SAMPLE_SIGNAL", v,
          "PROF, a signal number (not a fault, job-control or termination signal)");
  }
  if (const char* v = std::getenv("SELFPROF_UNWIND")) {
    std::string s = v;
    if (s == "fp")
      o.unwind = unwind_mode::fp;
    else if (s == "dwarf")
      o.unwind = unwind_mode::dwarf;
    else if (s == "auto")
      o.unwind = unwind_mode::automatic;
    else
      bad("SELFPROF_UNWIND", v, "fp, dwarf or auto");
  }
  if (const char* v = std::getenv("SELFPROF_LINES")) {
    std::string s = v;
    if (s == "auto")
      o.lines = lines_mode::automatic;
    else if (s == "all")
      o.lines = lines_mode::all;
    else if (s == "none")
      o.lines = lines_mode::none;
    else
      bad("SELFPROF_LINES", v, "auto, all or none");
  }
  if (const char* v = std::getenv("SELFPROF_THREAD_ROOTS")) {
    if (detail::parse_bool(v, b))
      o.thread_roots = b;
    else
      bad("SELFPROF_THREAD_ROOTS", v, "0 or 1");
  }
  if (const char* v = std::getenv("SELFPROF_VERBOSE")) {
    if (detail::parse_bool(v, b))
      o.verbose = b;
    else
      bad("SELFPROF_VERBOSE", v, "0 or 1");
  }
  if (const char* v = std::getenv("SELFPROF_FRAME_BUDGET_MS")) {
    if (detail::parse_double(v, 0.01, 3600000, d))
      o.frame_budget_ms = d;
    else
      bad("SELFPROF_FRAME_BUDGET_MS", v, "a frame budget in milliseconds from 0.01 to 3600000");
  }
  if (const char* v = std::getenv("SELFPROF_FRAME_HZ")) {
    if (detail::parse_double(v, 0, 100000, d))
      o.frame_hz = d;
    else
      bad("SELFPROF_FRAME_HZ", v, "a rate in Hz from 0 (same as SELFPROF_HZ) to 100000");
  }
  if (const char* v = std::getenv("SELFPROF_HTTP")) o.http = v;
  if (const char* v = std::getenv("SELFPROF_HTTP_TOKEN_FILE")) o.http_token_file = v;
  if (const char* v = std::getenv("SELFPROF_HTTP_MAX_SECONDS")) {
    if (detail::parse_double(v, 1, 86400, d))
      o.http_max_seconds = d;
    else
      bad("SELFPROF_HTTP_MAX_SECONDS", v, "seconds from 1 to 86400");
  }
  if (const char* v = std::getenv("SELFPROF_CONTROL")) {
    if (detail::parse_bool(v, b))
      o.control = b;
    else
      bad("SELFPROF_CONTROL", v, "0 or 1");
  }
  if (const char* v = std::getenv("SELFPROF_MAX_MEMORY")) {
    std::uint64_t bytes = 0;
    if (detail::parse_bytes(v, kMinMaxMemory, std::uint64_t{1} << 40, bytes))
      o.max_memory = static_cast<std::size_t>(bytes);
    else
      bad("SELFPROF_MAX_MEMORY", v, "a size in bytes with an optional K, M or G suffix, from 1M to 1024G");
  }
  return o;
}

}  // namespace selfprof
// ---- end selfprof/options.hpp ----
// ---- begin selfprof/profiler.hpp ----
// The public API: start and stop sampling, take a profile, write it to files, read the counters.
// Context: any thread (not the signal handler).

#include <cstddef>
#include <string>
#include <vector>

// ---- begin selfprof/output/diff_options.hpp ----
// The options of the differential writers (output/diff.hpp), alone: what the public API needs to declare
// selfprof::diff() without parsing the SVG writer behind it.
// Context: any thread (plain values).

#include <cstdint>

namespace selfprof {

// Which count sets a frame's width in the differential SVG.
enum class diff_width : std::uint8_t {
  larger,  // max(before, after) per stack (default): stacks that vanished stay visible
  after,   // the new profile, as flamegraph.pl draws difffolded output
  before,  // the baseline
};

struct diff_options {
  bool normalize = false;  // difffolded -n: scale "before" counts by total_after/total_before (truncated)
  bool strip_hex = false;  // difffolded -s: every 0x[0-9a-fA-F]+ becomes 0x... before matching stacks
  bool negate = false;     // flamegraph.pl --negate: swap the hues and the sign shown
  bool inclusive = false;  // colour by each frame's inclusive change instead of its self change
  diff_width widths = diff_width::larger;
};

}  // namespace selfprof
// ---- end selfprof/output/diff_options.hpp ----
// ---- begin selfprof/stats.hpp ----
// Counters and choices of the running (or last) profiling session, as selfprof::get_stats() returns them.
// Context: any thread (a value type).

#include <cstddef>
#include <cstdint>
#include <string>
#include <unordered_map>
#include <vector>


namespace selfprof {

// What the wall-clock sampler did (wall mode).
struct wall_stats {
  std::uint64_t ticks = 0;       // sampler wake-ups
  std::uint64_t looks = 0;       // thread looks (a bounded number per tick)
  std::uint64_t unchanged = 0;   // looks that found the CPU clock unmoved and reused the stack
  std::uint64_t proc_reads = 0;  // /proc/self/task/<tid>/syscall reads
  std::uint64_t copies = 0;      // blocked stacks copied and unwound
  std::uint64_t raced = 0;       // copies dropped because the thread ran while they were taken
  std::uint64_t scanned = 0;     // unwinds that had to find a frame record by scanning
  std::uint64_t deferred = 0;    // thread looks left to a later tick by the per-tick bound
  std::uint64_t dropped = 0;     // records lost: the ring was full
  std::uint64_t offcpu_us = 0;   // off-CPU time recorded
  std::uint64_t cpu_ns = 0;      // CPU time of the sampler thread itself
};

// What the profile endpoint and the control socket did (serve/server.hpp).
struct http_stats {
  std::string address;  // the endpoint as bound ("" none), e.g. "127.0.0.1:6060"
  std::string control;  // the control socket ("" none), e.g. "@selfprof-1234"
  std::uint64_t connections = 0, requests = 0;
  std::uint64_t bad_requests = 0;  // refused by the parser (400, 405, 414, 431, 505) or unknown pages
  std::uint64_t unauthorized = 0;  // 401 (token) and 403 (peer uid)
  std::uint64_t refused = 0;       // over the connection limit (503)
  std::uint64_t timeouts = 0;      // clients dropped for being too slow
  std::uint64_t failures = 0;      // accept, write or render failures, clients gone early
};

struct stats {
  bool running = false;
  profile_mode mode = profile_mode::cpu;
  source_kind source = source_kind::none;  // the tick source in use (none: not started, or wall mode without)
  std::string source_detail;               // what was opened
  std::string source_reason;               // why it was chosen
  std::vector<std::string> refused;        // why earlier sources were not
  std::vector<std::string> notes;          // other remarks (signals left alone, ...)
  double hz = 0, effective_hz = 0;
  int sample_signal = 0;
  bool kernel_time = true;               // samples include time spent in the kernel
  unwind_mode unwind = unwind_mode::fp;  // dwarf (CFI rows, frame pointers where none) or fp
  // What start() cost the thread that called it (CPU and wall time; threads it started not counted).
  double start_cpu_ms = 0, start_wall_ms = 0;
  // The CFI rows (unwind dwarf): modules parsed, modules whose code no sample reached yet (not parsed),
  // rows published, and the wall time spent parsing them.
  std::size_t unwind_modules_parsed = 0, unwind_modules_pending = 0, unwind_rows = 0;
  double unwind_parse_ms = 0;
  // CPU time since start() (until stop()): the whole process's, and selfprof's own threads' (collector,
  // dumper, server, wall sampler, JIT flusher; never sampled). In cpu mode, samples / ((process_cpu_ns -
  // own_cpu_ns) * hz / 1e9) is the share of the requested samples that were taken.
  std::uint64_t process_cpu_ns = 0, own_cpu_ns = 0;
  std::uint64_t samples = 0;  // sample weight folded into the table
  std::uint64_t records = 0;  // records written by the handler, or read from the kernel's rings
  std::uint64_t dropped_full = 0, dropped_inactive = 0, foreign_signals = 0, truncated = 0;
  std::size_t unique_stacks = 0, table_bytes = 0;  // table_bytes: the stack table and window buckets
  // The memory ceiling (options::max_memory, SELFPROF_MAX_MEMORY) and what staying under it took.
  std::size_t max_memory = 0;
  std::size_t ring_slots = 0, ring_bytes = 0;  // the sample ring as allocated (clipped to its part)
  bool ring_clipped = false;                   // fewer slots than the rate and depth asked for
  std::uint64_t stacks_merged = 0;   // records of new stacks counted under [selfprof: memory ceiling]
  std::uint64_t samples_merged = 0;  // their weight (samples; microseconds in wall mode)
  std::uint64_t threads_merged = 0;  // ended threads whose stacks and totals were merged into one (tid 0)
  std::size_t threads_seen = 0, threads_armed = 0, threads_fallback = 0, threads_arm_failed = 0;
  std::size_t threads_blocking_signal = 0;  // live threads blocking the sampling signal (never sampled)
  std::uint64_t collector_wakes = 0;        // times the collector thread woke
  std::uint64_t kernel_lost = 0;  // ring source: samples lost (PERF_RECORD_LOST; a record that did not parse)
  std::uint64_t kernel_throttles = 0;  // ring source: PERF_RECORD_THROTTLE records
  // ring source: the kernel's user call chain is asked for (from the start, or since stacks outgrew the
  // stack copy: ring_chain_cut samples ended there before it was); given back: it was asked for, then
  // continued few of those stacks and was given up
  bool ring_user_chain = false, ring_chain_given_back = false;
  std::uint64_t ring_chain_cut = 0;
  // ring source: data pages of a CPU ring now (they start at an eighth and grow once the program takes
  // samples, at least 100 ms after start), and samples taken twice while they grew (by the old and the
  // new events; each kept once)
  std::uint64_t ring_pages = 0, ring_grow_overlap = 0;
  std::uint64_t thread_checks = 0;    // thread-count checks made by the handler
  std::uint64_t thread_wakes = 0;     // ... that saw the count change and woke the collector
  std::uint64_t rate_capped = 0;      // perf ticks taken at a period stretched to the handler's cost
  std::uint64_t periods_skipped = 0;  // requested periods left unsampled by that stretch
  int dump_signal = 0;                // signal that triggers a dump (0: none taken)
  unsigned long dumps_written = 0, dumps_failed = 0;  // signal and interval dumps
  std::unordered_map<std::uint32_t, std::uint64_t> samples_by_thread;
  wall_stats wall;  // wall mode: what the wall sampler did
  http_stats http;  // the profile endpoint and the control socket
};

}  // namespace selfprof
// ---- end selfprof/stats.hpp ----

namespace selfprof {

// Starts sampling every thread of the process (existing and future ones). Idempotent: a second call
// while running does nothing. Restartable after stop(); each start begins a new profile.
SELFPROF_API status start(const options& opts);

// Starts with defaults overridden by the SELFPROF_* environment variables; a bad value is reported
// once on stderr with the variable's name, and so is a failure to start.
SELFPROF_API status start_from_env();

// Stops sampling; what was collected stays available to snapshot() and dump(), and is written to
// SELFPROF_OUT at exit when that is set. Idempotent.
SELFPROF_API status stop();

SELFPROF_API bool running();

// Arms the calling thread now, without waiting for the next thread scan (a few tens of ms), and
// unblocks the sampling signal in it.
SELFPROF_API status register_thread();

// The profile collected so far, symbolized. Sampling goes on.
SELFPROF_API profile snapshot();

SELFPROF_API stats get_stats();

// Writes the profile collected so far; the format follows the extension (.folded .collapsed .svg
// .txt .pb.gz), several paths may be given separated by commas, and %p %t %n are expanded. A wall
// profile also writes its off-CPU part ("-offcpu" before the extension), and when game frames were
// marked the slow ones ("-slow"), all under one dump number: the same files a dump on the signal, on the
// interval or at exit writes. Atomic (temporary file + rename), mode 0600, never through a symlink.
// Nothing collected is lost when it fails.
SELFPROF_API status dump(const std::string& paths);

// Wall mode (options::mode = profile_mode::wall, SELFPROF_MODE=wall): profiles count microseconds of wall
// time, on and off the CPU; stacks of time off the CPU end in a [blocked: <system call>] frame.

// The off-CPU part of the wall profile collected so far: where threads waited (empty in cpu mode).
SELFPROF_API profile snapshot_offcpu();

// Writes the off-CPU profile like dump() writes the whole one (the SVG in the io palette, counts in us).
SELFPROF_API status dump_offcpu(const std::string& paths);

// Game and engine frames (see frames.hpp for SELFPROF_FRAME / frame_mark).

// Duration statistics of every loop marked with frame_mark, per loop name and thread.
SELFPROF_API std::vector<frame_loop_stats> frame_stats();

// The "slow frames" profile: only samples taken during game frames longer than SELFPROF_FRAME_BUDGET_MS.
// Its unit is samples at SELFPROF_FRAME_HZ when that is set (info.hz says which rate).
SELFPROF_API profile snapshot_slow_frames();

// Writes the slow-frames profile like dump() writes the all-frames one (same formats and templates).
SELFPROF_API status dump_slow_frames(const std::string& paths);

// The `n` longest game frames seen so far (at most 16), longest first; each profile holds one game
// frame's samples in the order they were taken (info.view names the frame and its duration).
SELFPROF_API std::vector<profile> worst_frames(std::size_t n);

// Writes the `n` longest game frames, one file each, as flame charts (x is time within the frame) in the
// format of the extension. `%f` in the template becomes the rank (1 = longest); without it, "-frame<rank>"
// goes before the extension ("frames.svg" -> "frames-frame1.svg", ...). No kept frame: nothing is written.
SELFPROF_API status dump_worst_frames(const std::string& path_template, std::size_t n = 3);

// Writes what changed between two profiles (e.g. two snapshot()s, before and after a change): `.svg` gives
// a differential flame graph (red grew, blue shrank, baseline-only stacks still shown), `.folded` or
// `.diff` difffolded's `stack before after` lines. Atomic, mode 0600, like dump().
SELFPROF_API status dump_diff(const profile& before, const profile& after, const std::string& path,
                              const diff_options& options = {});

}  // namespace selfprof

// Start sampling with SELFPROF_* environment overrides; evaluates to a selfprof::status.
#define SELFPROF_START() ::selfprof::start_from_env()
#define SELFPROF_STOP() ::selfprof::stop()

#if SELFPROF_DETAIL_WITH_IMPLEMENTATION
// ---- begin selfprof/core/api.hpp ----
// The definitions of selfprof's public functions (declared and documented in profiler.hpp): inline in
// header-only mode, compiled once with SELFPROF_COMPILED_LIB.
// Context: any thread (not the signal handler).

#include <cstdio>
#include <string>
#include <vector>

// ---- begin selfprof/core/profiler.hpp ----
// The profiler: one per process. Owns the parts of the pipeline (the sample ring, the thread registry and
// its tick sources, the sample store, the collector, the automatic dumps, the wall sampler), starts them
// in order and stops them in reverse, and answers the public API (profiler.hpp).
// Context: setup only (start/stop, under the control lock), any thread for snapshots, dumps and stats.

#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <new>
#include <string>
#include <vector>

// ---- begin selfprof/collect/collector.hpp ----
// The collector: the one thread that does the work off the signal path while sampling. It drains the
// sample ring into the sample store, finds new threads and arms them, rebuilds unwind rows and refreshes
// the module snapshot when libraries come and go, applies SELFPROF_FRAME_HZ to threads that mark game
// frames, runs the contention upgrade, and merges the samples of ended threads when many threads came and
// went (sample_store::merge_ended_threads). It never symbolizes and never writes files.
// Context: its own thread ("selfprof"); start/stop from setup only.
//
// When it wakes. A wake-up costs tens of microseconds of CPU even when there is nothing to do, so:
//  - while ticks arrive (at least half a busy thread's rate over the last wait), the signal handler
//    checks the thread count every kThreadCheckNs (one fstat of /proc/self/task, whose link count is
//    2 + the number of threads) and wakes the collector when it changed, and every half ring of
//    samples; the collector itself then wakes only every
//    kCollectorBusyWakeMs for the full scan (a thread that exited while another started leaves the count
//    unchanged) and the module checks;
//  - while fewer ticks arrive (an idle process, a burst that ended, or only unarmed threads are busy) the
//    handler may not run again soon, so nobody else looks: it wakes every kCollectorWakeMs, and new
//    threads are found within a few tens of milliseconds;
//  - wall mode and boosted game-frame threads keep the short period; the contention monitor shortens it
//    while it watches oversubscribed threads.

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <mutex>
#include <new>
#include <string>
#include <vector>

// ---- begin selfprof/collect/sample_store.hpp ----
// The sample store: the one consumer of the sample ring. Folds each drained record into the cumulative
// stack table, the time windows and the per-thread totals, and hands game-frame samples to the game-frame
// tracker. JIT code is recorded by what was at each address when the sample was taken (the JIT registry,
// the perf map); a sample outside every known mapping is noted so the collector reads the maps again.
// Memory is bounded (store_config's limits, from SELFPROF_MAX_MEMORY): a new distinct stack past the
// limit is counted under a "[selfprof: memory ceiling]" stack, and once many threads were seen, the
// stacks and totals of threads that ended are merged into one thread (merge_ended_threads).
// Context: the collector thread (drain) and any thread taking a snapshot; every method takes the store's
// lock, which is also the ring's consumer lock.

#include <algorithm>
#include <cstdint>
#include <mutex>
#include <new>
#include <unordered_map>
#include <vector>

// ---- begin selfprof/collect/code_watch.hpp ----
// What the sample store knows of executable memory while sampling: the ranges mapped at the last module
// scan, whether a sample has landed outside all of them since (then the collector reads the maps again,
// so code mapped and unmapped between two dumps, such as V8's second mapping of its builtins, is
// recorded with its symbols while it exists), the perf map that names a pc in anonymous code by the
// line that was current when the sample was taken, and which modules with unparsed unwind rows samples
// reached (the collector parses their rows next: unwind/tables.hpp builds lazily).
// Context: the sample store, under its lock (translate); the collector thread (set_ranges, via the store).

#include <algorithm>
#include <cstdint>
#include <utility>
#include <vector>

// ---- begin selfprof/detail/stack_table.hpp ----
// The stack table: raw stacks (addresses, thread, flags) folded into counts. Memory grows with unique
// stacks, not with samples, and never past a limit when one is set (set_limit): a new distinct stack that
// would pass it is counted under one "[selfprof: memory ceiling]" stack instead (add_bounded), so the
// table's total stays right. Threads that ended can be folded into one entry per stack (merge_threads).
// Context: any thread except the signal handler (the collector folds into it under the sample store's lock).

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <vector>

namespace selfprof {
namespace detail {

// The one frame of the stacks merged at the memory ceiling: 0xfc in the top byte is never a canonical
// user or kernel address, nor a JIT (0xfe) or perf map (0xfd) tag. Named when a profile is symbolized.
constexpr std::uint64_t kMemoryCeilingPc = std::uint64_t{0xfc} << 56;
// Kernel code addresses (the ring source's kernel call chains) have 0xff in the top byte on x86-64 (from
// 0xffff800000000000) and AArch64: above every tag, and above user code. x86-64's [vsyscall] page sits
// there too but is a user mapping, named like one.
inline bool is_kernel_address(std::uint64_t a) {
  return (a >> 56) == 0xff && (a & ~std::uint64_t{0xfff}) != 0xffffffffff600000ull;
}
// The thread the stacks of ended threads are merged into (see merge_threads), and the ceiling stacks'.
constexpr std::uint32_t kMergedThreadsTid = 0;

class stack_table {
 public:
  struct entry {
    std::uint64_t hash;
    std::uint64_t count;
    std::uint32_t offset;  // into pcs_
    std::uint32_t tid;
    std::uint16_t depth;
    std::uint16_t flags;
  };

  // The most bytes the table may hold (entries, addresses, index); 0: no limit. Applies to new stacks.
  void set_limit(std::size_t bytes) { limit_ = bytes; }
  std::size_t limit() const { return limit_; }

  // Counts `weight` for the stack. False (and nothing counted) when it is new and there is no room.
  bool add(std::uint32_t tid, std::uint16_t flags, const std::uint64_t* pcs, std::size_t depth,
           std::uint64_t weight) {
    return add_hashed(hash(tid, flags, pcs, depth), tid, flags, pcs, depth, weight, false);
  }

  // add(), and a stack with no room is counted under the memory-ceiling stack of its kind (on-CPU,
  // off-CPU, running) in thread kMergedThreadsTid, so the total stays right.
  void add_bounded(std::uint32_t tid, std::uint16_t flags, const std::uint64_t* pcs, std::size_t depth,
                   std::uint64_t weight) {
    if (add(tid, flags, pcs, depth, weight)) return;
    ++merged_records_;
    merged_weight_ += weight;
    const std::uint64_t ceiling = kMemoryCeilingPc;
    const auto kind = static_cast<std::uint16_t>(flags & kCeilingKeptFlags);
    add_hashed(hash(kMergedThreadsTid, kind, &ceiling, 1), kMergedThreadsTid, kind, &ceiling, 1, weight,
               true);
  }

  void merge(const stack_table& other) {
    for (const entry& e : other.entries_) add(e.tid, e.flags, other.pcs(e), e.depth, e.count);
  }

  // Moves every stack of a thread for which `ended(tid)` is true to thread kMergedThreadsTid, merging
  // those that become equal, in place (no second table). Returns how many entries that freed.
  template <typename Pred>
  std::size_t merge_threads(Pred ended) {
    if (entries_.empty()) return 0;
    std::fill(index_.begin(), index_.end(), 0u);
    const std::size_t mask = index_.size() - 1;
    std::size_t kept = 0, pcs_end = 0;
    for (std::size_t r = 0; r < entries_.size(); ++r) {
      entry e = entries_[r];
      if (e.tid != kMergedThreadsTid && ended(e.tid)) {
        e.tid = kMergedThreadsTid;
        e.hash = hash(e.tid, e.flags, pcs(e), e.depth);
      }
      std::size_t i = e.hash & mask;
      bool merged = false;
      for (; index_[i] != 0; i = (i + 1) & mask) {
        entry& k = entries_[index_[i] - 1];
        if (same(k, e.hash, e.tid, e.flags, pcs(e), e.depth)) {
          k.count += e.count;
          merged = true;
          break;
        }
      }
      if (merged) continue;
      // Kept entries only move towards the front, so this never overwrites addresses not read yet.
      if (e.depth > 0) std::memmove(pcs_.data() + pcs_end, pcs(e), e.depth * sizeof(std::uint64_t));
      e.offset = static_cast<std::uint32_t>(pcs_end);
      pcs_end += e.depth;
      entries_[kept++] = e;
      index_[i] = static_cast<std::uint32_t>(kept);
    }
    const std::size_t freed = entries_.size() - kept;
    entries_.resize(kept);
    pcs_.resize(pcs_end);
    return freed;
  }

  // The count of a stack (0 when the table does not hold it).
  std::uint64_t count_of(std::uint32_t tid, std::uint16_t flags, const std::uint64_t* pcs,
                         std::size_t depth) const {
    if (index_.empty()) return 0;
    const std::uint64_t h = hash(tid, flags, pcs, depth);
    const std::size_t mask = index_.size() - 1;
    for (std::size_t i = h & mask; index_[i] != 0; i = (i + 1) & mask) {
      const entry& e = entries_[index_[i] - 1];
      if (same(e, h, tid, flags, pcs, depth)) return e.count;
    }
    return 0;
  }

  // What `later` counted past `earlier` (a table of the same session taken before it), stack by stack:
  // the samples of the time between the two. A stack whose count did not grow is left out. Unbounded:
  // it is never larger than `later`.
  static stack_table difference(const stack_table& later, const stack_table& earlier) {
    stack_table d;
    for (const entry& e : later.entries_) {
      const std::uint64_t before = earlier.count_of(e.tid, e.flags, later.pcs(e), e.depth);
      if (e.count > before) d.add(e.tid, e.flags, later.pcs(e), e.depth, e.count - before);
    }
    return d;
  }

  const std::vector<entry>& entries() const { return entries_; }
  const std::uint64_t* pcs(const entry& e) const { return pcs_.data() + e.offset; }
  std::size_t unique() const { return entries_.size(); }
  std::uint64_t total() const { return total_; }
  std::size_t memory_bytes() const {
    return entries_.capacity() * sizeof(entry) + pcs_.capacity() * 8 + index_.capacity() * 4;
  }
  // New stacks counted under the memory-ceiling stack: add() calls that found no room, and their weight.
  std::uint64_t merged_records() const { return merged_records_; }
  std::uint64_t merged_weight() const { return merged_weight_; }
  void clear() {
    entries_.clear();
    pcs_.clear();
    index_.assign(index_.size(), 0);
    total_ = 0;
    merged_records_ = 0;
    merged_weight_ = 0;
  }

 private:
  static constexpr std::uint16_t kCeilingKeptFlags = 0x2 | 0x8;  // sample_offcpu | sample_running
  static constexpr std::size_t kFirstIndexSlots = 1024;

  static std::uint64_t hash(std::uint32_t tid, std::uint16_t flags, const std::uint64_t* pcs,
                            std::size_t depth) {
    std::uint64_t h =
        0x9E3779B97F4A7C15ull ^ (std::uint64_t(tid) << 16) ^ flags ^ (std::uint64_t(depth) << 48);
    for (std::size_t i = 0; i < depth; ++i) {
      h ^= pcs[i] + 0x9E3779B97F4A7C15ull + (h << 6) + (h >> 2);
      h *= 0xff51afd7ed558ccdull;
    }
    return h ^ (h >> 33);
  }

  bool same(const entry& e, std::uint64_t h, std::uint32_t tid, std::uint16_t flags, const std::uint64_t* pcs,
            std::size_t depth) const {
    return e.hash == h && e.tid == tid && e.flags == flags && e.depth == depth &&
           (depth == 0 || std::memcmp(pcs_.data() + e.offset, pcs, depth * sizeof(std::uint64_t)) == 0);
  }

  // `always`: the few memory-ceiling stacks, added past the limit in the smallest steps.
  bool add_hashed(std::uint64_t h, std::uint32_t tid, std::uint16_t flags, const std::uint64_t* pcs,
                  std::size_t depth, std::uint64_t weight, bool always) {
    if (!index_.empty()) {
      const std::size_t mask = index_.size() - 1;
      for (std::size_t i = h & mask; index_[i] != 0; i = (i + 1) & mask) {
        entry& e = entries_[index_[i] - 1];
        if (same(e, h, tid, flags, pcs, depth)) {
          e.count += weight;
          total_ += weight;
          return true;
        }
      }
    }
    if (!make_room(depth, always)) return false;
    const std::size_t mask = index_.size() - 1;
    std::size_t i = h & mask;
    while (index_[i] != 0) i = (i + 1) & mask;
    entries_.push_back(entry{h, weight, static_cast<std::uint32_t>(pcs_.size()), tid,
                             static_cast<std::uint16_t>(depth), flags});
    pcs_.insert(pcs_.end(), pcs, pcs + depth);
    index_[i] = static_cast<std::uint32_t>(entries_.size());
    total_ += weight;
    return true;
  }

  // Capacity for one more entry of `depth` addresses, within the limit unless `always`. Near the limit
  // the vectors grow into what is left in one step, so adding never turns into copying on every stack.
  bool make_room(std::size_t depth, bool always) {
    const std::size_t n = entries_.size() + 1, p_need = pcs_.size() + depth;
    std::size_t slots = !index_.empty() ? index_.size() : always && limit_ ? 8 : kFirstIndexSlots;
    while (n * 10 > slots * 7) slots *= 2;
    // The ceiling stacks take a free slot past the load limit rather than double the index.
    if (always && !index_.empty() && n < index_.size()) slots = index_.size();
    if (limit_ == 0) {
      if (slots != index_.size()) rehash(slots);
      return true;
    }
    if (always) {
      reserve(std::max(entries_.capacity(), n + 2), std::max(pcs_.capacity(), p_need + 2), slots);
      return true;
    }
    if (slots * 4 > limit_) return false;
    const std::size_t budget = limit_ - slots * 4;
    const std::size_t e_min = std::max(entries_.capacity(), n), p_min = std::max(pcs_.capacity(), p_need);
    if (e_min * sizeof(entry) + p_min * 8 > budget) return false;
    std::size_t e_cap = e_min, p_cap = p_min;
    if (n > entries_.capacity()) {
      const std::size_t spare = (budget - e_min * sizeof(entry) - p_min * 8) / 2 / sizeof(entry);
      e_cap = std::min(grown(entries_.capacity(), n, sizeof(entry)), e_min + spare);
    }
    if (p_need > pcs_.capacity()) {
      const std::size_t spare = (budget - e_cap * sizeof(entry) - p_min * 8) / 8;
      p_cap = std::min(grown(pcs_.capacity(), p_need, 8), p_min + spare);
    }
    reserve(e_cap, p_cap, slots);
    return true;
  }

  // Capacity after growing from `cap` to hold `need`: by half again, at least a page's worth.
  static std::size_t grown(std::size_t cap, std::size_t need, std::size_t elem) {
    return std::max(need, std::max(cap + cap / 2, 4096 / elem));
  }

  void reserve(std::size_t entries_cap, std::size_t pcs_cap, std::size_t slots) {
    entries_.reserve(entries_cap);
    pcs_.reserve(pcs_cap);
    if (slots != index_.size()) rehash(slots);
  }

  void rehash(std::size_t n) {
    std::vector<std::uint32_t>(n, 0).swap(index_);
    for (std::size_t k = 0; k < entries_.size(); ++k) {
      for (std::size_t i = entries_[k].hash & (n - 1);; i = (i + 1) & (n - 1)) {
        if (index_[i] == 0) {
          index_[i] = static_cast<std::uint32_t>(k + 1);
          break;
        }
      }
    }
  }

  std::vector<entry> entries_;
  std::vector<std::uint64_t> pcs_;
  std::vector<std::uint32_t> index_;
  std::uint64_t total_ = 0;
  std::size_t limit_ = 0;
  std::uint64_t merged_records_ = 0, merged_weight_ = 0;
};

}  // namespace detail
}  // namespace selfprof
// ---- end selfprof/detail/stack_table.hpp ----
// ---- begin selfprof/symbols/perf_map.hpp ----
// Reader of perf's JIT symbol map, /tmp/perf-<pid>.map ("START SIZE name" lines, hex without 0x),
// read as it grows, never created here. A JIT writes a line after placing code and may later place other
// code at the same address (node does), so every line read is kept with the time it became known: a
// sample is named by the latest line covering its address that was known before the sample was taken
// (tag(), done while sampling), and an address looked up without a time gets the last line (as perf).
// Context: collector thread, dumper thread or setup (never the signal handler); internally locked.

#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <deque>
#include <iterator>
#include <map>
#include <mutex>
#include <new>
#include <string>
#include <string_view>
#include <utility>
#include <vector>


namespace selfprof {
namespace detail {

// A perf map larger than this is not read (a runaway JIT or a hostile file).
constexpr std::uint64_t perf_map_max_bytes = std::uint64_t{256} << 20;

// A pc named by a perf map line while sampling: 0xfd in the top byte (never a canonical user or kernel
// address, and not the JIT registry's 0xfe), the line's number in the next 32 bits, offset+1 in the low
// 24 (so `tagged - 1`, looked up for return addresses, decodes to pc - 1 in the same line).
constexpr std::uint64_t perf_map_tag_marker = std::uint64_t{0xfd} << 56;
constexpr unsigned perf_map_tag_offset_bits = 24;
constexpr std::uint64_t perf_map_tag_offset_mask = (std::uint64_t{1} << perf_map_tag_offset_bits) - 1;
inline bool is_perf_map_tagged(std::uint64_t v) { return (v >> 56) == 0xfd; }

class perf_map {
 public:
  struct hit {
    std::string_view name;             // valid for the map's lifetime (names are never moved or freed)
    std::uint64_t start = 0, end = 0;  // the line's range
    std::uint64_t address = 0;         // the address looked up (decoded, for a tagged value)
  };

  // An empty path means /tmp/perf-<getpid()>.map, followed into a fork child's own file.
  explicit perf_map(std::string path = std::string()) : fixed_path_(std::move(path)) {}

  static std::string default_path(long pid) {
    std::string path = "/tmp/perf-";
    path += std::to_string(pid);
    path += ".map";
    return path;
  }
  std::string path() const { return fixed_path_.empty() ? default_path(::getpid()) : fixed_path_; }

  // Reads what was appended since the last call; the whole file again when it was replaced, shrank or
  // rewritten in place (its lines are then the current ones). A missing file keeps the lines read
  // before. A symlink, a non-regular file or a file owned by another user (neither us nor root) is
  // ignored. Returns true when lines were added.
  bool reload_if_changed() {
    std::lock_guard<std::mutex> lock(mu_);
    const std::uint64_t previous_poll = last_poll_ns_;
    last_poll_ns_ = monotonic_ns();
    const std::string p = path();
    struct stat st;
    if (::lstat(p.c_str(), &st) != 0 || !S_ISREG(st.st_mode)) return false;
    if (same_stamp(p, st)) return false;
    int fd = sys().open(p.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK, 0);
    if (fd < 0) return false;
    bool ok = ::fstat(fd, &st) == 0 && S_ISREG(st.st_mode) && (st.st_uid == ::geteuid() || st.st_uid == 0) &&
              static_cast<std::uint64_t>(st.st_size) <= perf_map_max_bytes;
    const auto size = static_cast<std::uint64_t>(st.st_size);
    // Appended to the file read before: read on from where we stopped, if the bytes before are the same.
    bool append =
        ok && has_stamp_ && p == stamp_.path && stamp_.dev == static_cast<std::uint64_t>(st.st_dev) &&
        stamp_.ino == static_cast<std::uint64_t>(st.st_ino) && size >= stamp_.size && tail_matches(fd);
    std::string text;
    if (ok) ok = read_from(fd, append ? stamp_.size : 0, text);
    sys().close(fd);
    if (!ok) return false;
    const std::uint64_t known_since = has_stamp_ ? written_at(st, previous_poll) : 0;
    if (!append) {
      current_.clear();
      pending_.clear();
    }
    std::string old_tail = std::move(stamp_.tail);
    stamp_ = file_stamp{p,
                        static_cast<std::uint64_t>(st.st_dev),
                        static_cast<std::uint64_t>(st.st_ino),
                        (append ? stamp_.size : 0) + text.size(),
                        static_cast<std::uint64_t>(st.st_mtim.tv_sec),
                        static_cast<std::uint64_t>(st.st_mtim.tv_nsec),
                        {}};
    has_stamp_ = true;
    std::string tail = append ? std::move(old_tail) : std::string();
    tail.append(text);
    if (tail.size() > kTailBytes) tail.erase(0, tail.size() - kTailBytes);
    stamp_.tail = std::move(tail);
    const std::size_t before = lines_.size();
    ingest(text, known_since);
    return lines_.size() != before;
  }

  // Forgets every line, then reads `text` as the whole map (known since always). Malformed lines are
  // skipped; size 0 means one byte (as perf reads it).
  void parse(std::string_view text) {
    std::lock_guard<std::mutex> lock(mu_);
    current_.clear();
    pending_.clear();
    has_stamp_ = false;
    ingest(text, 0);
  }

  // The last line read that covers `address`.
  bool lookup(std::uint64_t address, hit& out) const {
    std::lock_guard<std::mutex> lock(mu_);
    const segment* s = find(address);
    if (s == nullptr) return false;
    fill(s->history.back().second, address, out);
    return true;
  }

  // Rewrites `pc` into a tagged value naming the latest line covering it that was known before
  // by `time_ns` (else the first line read for it: the code ran before its line was seen).
  bool tag(std::uint64_t& pc, std::uint64_t time_ns) const {
    std::lock_guard<std::mutex> lock(mu_);
    const segment* s = find(pc);
    if (s == nullptr) return false;
    auto it = std::lower_bound(
        s->history.begin(), s->history.end(), time_ns,
        [](const std::pair<std::uint64_t, std::uint32_t>& e, std::uint64_t t) { return e.first < t; });
    const std::uint32_t line = it == s->history.begin() ? it->second : std::prev(it)->second;
    const std::uint64_t offset = pc - lines_[line].start;
    if (offset + 1 > perf_map_tag_offset_mask) return false;
    pc = perf_map_tag_marker | (std::uint64_t{line} << perf_map_tag_offset_bits) | (offset + 1);
    return true;
  }

  // Names a value made by tag() (or that value minus one).
  bool name_tagged(std::uint64_t tagged, hit& out) const {
    if (!is_perf_map_tagged(tagged)) return false;
    std::lock_guard<std::mutex> lock(mu_);
    const std::uint64_t line = (tagged >> perf_map_tag_offset_bits) & 0xffffffffu;
    const std::uint64_t field = tagged & perf_map_tag_offset_mask;  // offset + 1, or offset for tagged - 1
    if (line >= lines_.size()) return false;
    fill(static_cast<std::uint32_t>(line), lines_[line].start + field - 1, out);
    return true;
  }

  std::size_t size() const {  // address ranges with a distinct line history
    std::lock_guard<std::mutex> lock(mu_);
    return current_.size();
  }

  // fork(2) child: another thread may have held the lock.
  void abandon_after_fork() { new (&mu_) std::mutex(); }

 private:
  struct line_entry {
    std::uint64_t start, end;
    std::uint32_t name;
  };
  // A run of addresses covered by the same lines: (time known since, line) in reading order.
  struct segment {
    std::uint64_t end;
    std::vector<std::pair<std::uint64_t, std::uint32_t>> history;
  };
  static constexpr std::size_t kTailBytes = 64;
  struct file_stamp {
    std::string path;
    std::uint64_t dev, ino, size, mtime_s, mtime_ns;
    std::string tail;  // the last bytes read, compared before reading on
  };

  // When the lines read now were written, as a CLOCK_MONOTONIC time: the file's modification time
  // (when its last line was written), kept between the previous look at the file and now. A sample taken
  // before it keeps the line it had then: a reused address is named by its old code until the new line was
  // written. Lines of the first read are known since always (nothing says when they came).
  std::uint64_t written_at(const struct stat& st, std::uint64_t previous_poll) const {
    const std::uint64_t now = last_poll_ns_;
    struct timespec real;
    ::clock_gettime(CLOCK_REALTIME, &real);
    const std::int64_t real_ns = static_cast<std::int64_t>(real.tv_sec) * 1000000000 + real.tv_nsec;
    const std::int64_t mtime_ns =
        static_cast<std::int64_t>(st.st_mtim.tv_sec) * 1000000000 + st.st_mtim.tv_nsec;
    const std::int64_t ago = real_ns - mtime_ns;
    std::uint64_t at = ago <= 0                                ? now
                       : ago >= static_cast<std::int64_t>(now) ? 0
                                                               : now - static_cast<std::uint64_t>(ago);
    return std::max(at, previous_poll);
  }

  const segment* find(std::uint64_t address) const {
    auto it = current_.upper_bound(address);
    if (it == current_.begin()) return nullptr;
    --it;
    return address < it->second.end ? &it->second : nullptr;
  }

  void fill(std::uint32_t line, std::uint64_t address, hit& out) const {
    out.name = names_[lines_[line].name];
    out.start = lines_[line].start;
    out.end = lines_[line].end;
    out.address = address;
  }

  bool same_stamp(const std::string& p, const struct stat& st) const {
    return has_stamp_ && stamp_.path == p && stamp_.dev == static_cast<std::uint64_t>(st.st_dev) &&
           stamp_.ino == static_cast<std::uint64_t>(st.st_ino) &&
           stamp_.size == static_cast<std::uint64_t>(st.st_size) &&
           stamp_.mtime_s == static_cast<std::uint64_t>(st.st_mtim.tv_sec) &&
           stamp_.mtime_ns == static_cast<std::uint64_t>(st.st_mtim.tv_nsec);
  }

  bool tail_matches(int fd) const {
    if (stamp_.tail.empty()) return stamp_.size == 0;
    std::string now(stamp_.tail.size(), '\0');
    ssize_t n = ::pread(fd, &now[0], now.size(), static_cast<off_t>(stamp_.size - now.size()));
    return n == static_cast<ssize_t>(now.size()) && now == stamp_.tail;
  }

  static bool read_from(int fd, std::uint64_t offset, std::string& text) {
    char buffer[65536];
    for (;;) {
      ssize_t n = ::pread(fd, buffer, sizeof buffer, static_cast<off_t>(offset + text.size()));
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) return false;
      if (n == 0 || offset + text.size() + static_cast<std::size_t>(n) > perf_map_max_bytes) return true;
      text.append(buffer, static_cast<std::size_t>(n));
    }
  }

  // Adds the complete lines of `text` (a partial last line waits for the rest), known since `known_ns`.
  void ingest(std::string_view text, std::uint64_t known_ns) {
    pending_.append(text.data(), text.size());
    std::string_view all(pending_);
    std::size_t pos = 0;
    for (;;) {
      std::size_t eol = all.find('\n', pos);
      if (eol == std::string_view::npos) break;
      std::string_view line = all.substr(pos, eol - pos);
      pos = eol + 1;
      if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
      std::uint64_t start = 0, size = 0;
      if (!take_hex(line, start) || !take_hex(line, size) || line.empty()) continue;
      if (lines_.size() >= 0xffffffffu) break;
      if (size == 0) size = 1;
      const std::uint64_t end = start + size < start ? ~std::uint64_t{0} : start + size;
      names_.emplace_back(line);
      lines_.push_back(line_entry{start, end, static_cast<std::uint32_t>(names_.size() - 1)});
      cover(start, end, known_ns, static_cast<std::uint32_t>(lines_.size() - 1));
    }
    pending_.erase(0, pos);
  }

  // [start, end) is now also named by `line`: split the segments at both ends, add the line to every
  // segment inside, and fill the gaps with new segments.
  void cover(std::uint64_t start, std::uint64_t end, std::uint64_t known_ns, std::uint32_t line) {
    split_at(start);
    split_at(end);
    std::uint64_t at = start;
    auto it = current_.lower_bound(start);
    while (at < end) {
      if (it != current_.end() && it->first == at) {
        it->second.history.emplace_back(known_ns, line);
        at = it->second.end;
        ++it;
        continue;
      }
      const std::uint64_t gap_end = it != current_.end() && it->first < end ? it->first : end;
      current_.emplace_hint(it, at, segment{gap_end, {{known_ns, line}}});
      at = gap_end;
    }
  }

  void split_at(std::uint64_t address) {
    auto it = current_.upper_bound(address);
    if (it == current_.begin()) return;
    --it;
    if (it->first == address || address >= it->second.end) return;
    segment tail{it->second.end, it->second.history};
    it->second.end = address;
    current_.emplace_hint(std::next(it), address, std::move(tail));
  }

  // Takes a hex number (optional 0x) and the spaces after it off the front of `s`.
  static bool take_hex(std::string_view& s, std::uint64_t& out) {
    std::size_t i = 0;
    if (s.size() >= 2 && s[0] == '0' && (s[1] == 'x' || s[1] == 'X')) i = 2;
    std::size_t digits = 0;
    out = 0;
    for (; i < s.size(); ++i, ++digits) {
      char c = s[i];
      unsigned d;
      if (c >= '0' && c <= '9')
        d = static_cast<unsigned>(c - '0');
      else if (c >= 'a' && c <= 'f')
        d = static_cast<unsigned>(c - 'a' + 10);
      else if (c >= 'A' && c <= 'F')
        d = static_cast<unsigned>(c - 'A' + 10);
      else
        break;
      if (digits >= 16) return false;
      out = (out << 4) | d;
    }
    if (digits == 0 || i >= s.size() || s[i] != ' ') return false;
    while (i < s.size() && s[i] == ' ') ++i;
    s.remove_prefix(i);
    return true;
  }

  mutable std::mutex mu_;
  std::string fixed_path_;
  std::deque<std::string> names_;             // every line's name, never moved
  std::vector<line_entry> lines_;             // every line read, in reading order
  std::map<std::uint64_t, segment> current_;  // by start address, over the file read now
  std::string pending_;                       // a partial last line
  file_stamp stamp_{};
  bool has_stamp_ = false;
  std::uint64_t last_poll_ns_ = 0;
};

}  // namespace detail
}  // namespace selfprof
// ---- end selfprof/symbols/perf_map.hpp ----
// ---- begin selfprof/symbols/symbolizer.hpp ----
// selfprof::symbolizer: turns addresses of this process into frames (demangled function, module, offset),
// from ELF symbols of every module ever mapped, separate debug files, the vdso and perf maps for JIT code;
// with SELFPROF_HAS_LIBDW=1 also file:line and inlined calls as their own frames (dwarf_lines.hpp).
// Context: collector thread or any single thread (not thread-safe; never the signal handler).

#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <string>
#include <utility>
#include <vector>

// ---- begin selfprof/symbols/dwarf_lines.hpp ----
// Source lines and inline chains from DWARF through elfutils libdw (SELFPROF_HAS_LIBDW=1): for an address
// of a mapped file, the real function and each inlined callee down to the innermost, each with file:line.
// Context: collector thread or any single thread (not thread-safe; never the signal handler).
//
// One Dwfl session per module file, opened on the first lookup in that file and kept for the lifetime of
// the symbolizer; each address's answer is cached. DWARF comes from the module file itself, else from
// the separate debug file the module registry found (build-id or .gnu_debuglink), else from a search of
// the same debug roots. No debuginfod and no other network access: only local files are read.
// lines_mode (modes.hpp) says which files are read: by default not those whose DWARF is compressed
// (libdw inflates it whole before the first lookup); each such file a lookup reached gives a warning,
// once per take_warnings() (once per profile).
// With SELFPROF_HAS_LIBDW=0 this header holds a stub whose lookups find nothing; with SELFPROF_LIBDW_DLOPEN=1
// libdw is loaded at the first lookup, and lookups find nothing where it cannot be (libdw_api.hpp).

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

// ---- begin selfprof/symbols/modules.hpp ----
// The module registry: executable mappings of this process from /proc/self/maps (files with their load
// bias, the vdso read from memory, anonymous memory, memfd and deleted files), each file's symbols parsed
// once, and unmapped modules kept so samples taken before a dlclose still get names.
// Context: collector thread (refresh ~every 100 ms) or setup; not thread-safe, never the signal handler.
//
// A file's symbols are read at the first lookup of an address in it (find), not when it is first seen:
// a dump costs what its sampled modules weigh, not every mapped library (docs/measurements.md). So
// that a late read never names one file's code with another's symbols, the path's stat (device, inode,
// size, mtime) is noted when the file is first seen. If another file is at the path by the read (an
// upgrade), the mapped one is read through map_files where the process may; if the file changed in
// place, or map_files is closed to it, there are no symbols and a warning says why. Read at once
// instead: deleted files and memfds (they may be gone by the first lookup), files whose path cannot be
// stat'ed, and a file whose mapping went away before any lookup (read when the unmap is seen, so a
// dlclose'd library keeps its names).

#include <dirent.h>
#include <link.h>
#include <sys/auxv.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

// ---- begin selfprof/symbols/debug_file.hpp ----
// Finds the separate debug file of a stripped module: by GNU build-id under each debug root
// (<root>/.build-id/xx/rest.debug), then by .gnu_debuglink (module dir, its .debug/, <root>/<module dir>),
// checking the build-id or the debuglink CRC so a stale debug file is never used.
// Context: collector thread or setup (never the signal handler).

#include <array>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

// ---- begin selfprof/symbols/elf.hpp ----
// A bounds-checked ELF64 reader over bytes in memory (a loaded image such as the vdso) or over a file read
// on demand with pread (mapped_file.hpp): headers, sections by name or type (reusable by an .eh_frame
// parser), PT_LOAD segments, load bias, build-id note and .gnu_debuglink.
// Context: collector thread or setup (never the signal handler).

#include <elf.h>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>
#include <vector>

// ---- begin selfprof/symbols/mapped_file.hpp ----
// The bytes of a file for the ELF reader, read with pread into memory selfprof owns (the file opened
// through the syscall seam), released on destruction.
// Context: collector thread or setup (never the signal handler).
//
// Why pread and not mmap: a mapped file truncated in place (cp over it keeps the inode) raises SIGBUS on
// the next access to a page past its new end, in the collector thread, which kills the application;
// MAP_PRIVATE does not prevent it. A read of a shrunken file is only short. Only the ranges the readers
// ask for are read (ELF, section and program headers, symbol and string tables, notes, .gnu_debuglink,
// .rela.plt) and kept, so a 100 MB library costs about what its symbol tables weigh; a debug file's CRC
// streams through a small buffer. A file rewritten while being read could still mix two versions:
// check() reads every kept range again and compares, so the caller ends with bytes that match the file
// as it is, or an error naming the file ("changed while being read"). libdw reads DWARF itself:
// dwarf_lines.hpp opens it with ELF_C_READ for the same reason.

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <new>
#include <string>
#include <utility>
#include <vector>


namespace selfprof {
namespace detail {

// A span of bytes; every read of the ELF reader checks it.
struct byte_view {
  const unsigned char* data = nullptr;
  std::size_t size = 0;

  bool contains(std::uint64_t offset, std::uint64_t length) const {
    return offset <= size && length <= size - offset;
  }
  byte_view sub(std::uint64_t offset, std::uint64_t length) const {
    if (!contains(offset, length)) return {};
    return byte_view{data + offset, static_cast<std::size_t>(length)};
  }
};

// Largest file we read symbols from; bigger ones are refused (a hostile header could otherwise ask for
// a huge allocation).
constexpr std::uint64_t max_mapped_file_bytes = std::uint64_t{4} << 30;
// Buffer through which check() and read_all() stream.
constexpr std::size_t mapped_file_buffer_bytes = std::size_t{64} << 10;

// Opens `path` read-only through the syscall seam: a descriptor of a regular file whose inode is
// `expect_inode` (when non-zero, so a library replaced on disk since it was mapped is not mistaken for
// the one in memory), else -1 with the reason in `*why`.
inline int open_regular_file(const std::string& path, std::uint64_t expect_inode, status* why = nullptr) {
  auto fail = [&](int fd, const std::string& reason) {
    if (fd >= 0) sys().close(fd);
    if (why != nullptr) *why = status::error(path + ": " + reason);
    return -1;
  };
  int fd = sys().open(path.c_str(), O_RDONLY | O_CLOEXEC, 0);
  if (fd < 0) return fail(fd, std::string("open failed: ") + std::strerror(errno));
  struct stat st;
  if (::fstat(fd, &st) != 0) return fail(fd, std::string("fstat failed: ") + std::strerror(errno));
  if (!S_ISREG(st.st_mode)) return fail(fd, "not a regular file");
  if (expect_inode != 0 && static_cast<std::uint64_t>(st.st_ino) != expect_inode)
    return fail(fd, "file on disk differs from the mapped one (inode changed)");
  return fd;
}

// Reads exactly `length` bytes at `offset`; false on an error or end of file (the file shrank).
inline bool pread_exact(int fd, unsigned char* out, std::size_t length, std::uint64_t offset) {
  while (length > 0) {
    ssize_t n = ::pread(fd, out, length, static_cast<off_t>(offset));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    out += n;
    length -= static_cast<std::size_t>(n);
    offset += static_cast<std::uint64_t>(n);
  }
  return true;
}

class mapped_file {
 public:
  mapped_file() = default;
  // Not movable: an elf_image reading through this object keeps its address.
  mapped_file(const mapped_file&) = delete;
  mapped_file& operator=(const mapped_file&) = delete;
  ~mapped_file() { reset(); }

  // Opens `path` (a regular file with inode `expect_inode` when non-zero) and notes its size; reads
  // nothing yet. The descriptor stays open until reset().
  status open(const std::string& path, std::uint64_t expect_inode = 0) {
    reset();
    status why = status::ok();
    int fd = open_regular_file(path, expect_inode, &why);
    if (fd < 0) return why;
    struct stat st;
    if (::fstat(fd, &st) != 0 || st.st_size <= 0) {
      sys().close(fd);
      return status::error(path + ": empty file");
    }
    if (static_cast<std::uint64_t>(st.st_size) > max_mapped_file_bytes) {
      sys().close(fd);
      return status::error(path + ": file too large to read symbols from (over " +
                           std::to_string(max_mapped_file_bytes) + " bytes)");
    }
    fd_ = fd;
    size_ = static_cast<std::uint64_t>(st.st_size);
    path_ = path;
    return status::ok();
  }

  // The `length` bytes at `offset`, read on the first request for them and kept until reset(). Empty
  // when the range is outside the size the file had at open, when the file is now shorter (then
  // check() fails), or past the bound on bytes kept: twice the file's size, far above what sane headers
  // ask for, but a hostile file with thousands of overlapping sections could ask for much more.
  byte_view read(std::uint64_t offset, std::uint64_t length) {
    if (fd_ < 0 || offset > size_ || length > size_ - offset || length == 0) return {};
    for (const chunk& c : chunks_)
      if (offset >= c.offset && offset - c.offset <= c.size && length <= c.size - (offset - c.offset))
        return byte_view{c.data.get() + (offset - c.offset), static_cast<std::size_t>(length)};
    if (length > 2 * size_ - kept_) return {};
    chunk c{offset, static_cast<std::size_t>(length), std::unique_ptr<unsigned char[]>()};
    c.data.reset(new (std::nothrow) unsigned char[c.size]);
    if (c.data == nullptr) return {};
    if (!pread_exact(fd_, c.data.get(), c.size, offset)) {
      changed_ = true;
      return {};
    }
    kept_ += c.size;
    chunks_.push_back(std::move(c));
    return byte_view{chunks_.back().data.get(), chunks_.back().size};
  }

  // Passes the whole file, in order, to `consume(byte_view)` through a bounded buffer (nothing is
  // kept); false when the file shrank meanwhile.
  template <class Consume>
  bool read_all(Consume&& consume) {
    if (fd_ < 0) return false;
    std::unique_ptr<unsigned char[]> buffer(new unsigned char[mapped_file_buffer_bytes]);
    for (std::uint64_t at = 0; at < size_;) {
      std::size_t n = static_cast<std::size_t>(std::min<std::uint64_t>(mapped_file_buffer_bytes, size_ - at));
      if (!pread_exact(fd_, buffer.get(), n, at)) {
        changed_ = true;
        return false;
      }
      consume(byte_view{buffer.get(), n});
      at += n;
    }
    return true;
  }

  // Ok when the file still has the size it had at open and every range read so far still holds the
  // bytes read: what was parsed describes the file as it is. Call after the last read.
  status check() {
    status changed = status::error(path_ + ": changed while being read");
    struct stat st;
    if (fd_ < 0 || changed_ || ::fstat(fd_, &st) != 0 || static_cast<std::uint64_t>(st.st_size) != size_)
      return changed;
    std::unique_ptr<unsigned char[]> buffer(new unsigned char[mapped_file_buffer_bytes]);
    for (const chunk& c : chunks_) {
      for (std::size_t at = 0; at < c.size;) {
        std::size_t n = std::min(mapped_file_buffer_bytes, c.size - at);
        if (!pread_exact(fd_, buffer.get(), n, c.offset + at) ||
            std::memcmp(buffer.get(), c.data.get() + at, n) != 0)
          return changed;
        at += n;
      }
    }
    return status::ok();
  }

  // Closes the file and frees every range read.
  void reset() {
    if (fd_ >= 0) sys().close(fd_);
    fd_ = -1;
    size_ = 0;
    changed_ = false;
    kept_ = 0;
    chunks_.clear();
    path_.clear();
  }

  bool is_open() const { return fd_ >= 0; }
  std::uint64_t size() const { return size_; }  // as at open
  const std::string& path() const { return path_; }

 private:
  struct chunk {
    std::uint64_t offset;
    std::size_t size;
    std::unique_ptr<unsigned char[]> data;
  };

  int fd_ = -1;
  std::uint64_t size_ = 0;
  std::uint64_t kept_ = 0;  // bytes in chunks_
  bool changed_ = false;    // a read came up short: the file shrank after open
  std::vector<chunk> chunks_;
  std::string path_;
};

}  // namespace detail
}  // namespace selfprof
// ---- end selfprof/symbols/mapped_file.hpp ----

namespace selfprof {
namespace detail {

// Copies a T out of `bytes` at `offset` (no alignment assumed); false when it does not fit.
template <class T>
inline bool read_at(byte_view bytes, std::uint64_t offset, T& out) {
  if (!bytes.contains(offset, sizeof(T))) return false;
  std::memcpy(&out, bytes.data + offset, sizeof(T));
  return true;
}

// The NUL-terminated string at `offset` in a string table; empty when out of bounds or unterminated.
inline std::string_view string_at(byte_view table, std::uint64_t offset) {
  if (offset >= table.size) return {};
  const char* begin = reinterpret_cast<const char*>(table.data + offset);
  const void* nul = std::memchr(begin, 0, table.size - static_cast<std::size_t>(offset));
  if (nul == nullptr) return {};
  return std::string_view(begin, static_cast<std::size_t>(static_cast<const char*>(nul) - begin));
}

struct elf_section {
  std::string name;
  std::uint32_t type = 0;
  std::uint64_t flags = 0;
  std::uint64_t addr = 0;
  std::uint64_t offset = 0;
  std::uint64_t size = 0;
  std::uint32_t link = 0;
  std::uint32_t info = 0;
  std::uint64_t addralign = 0;
  std::uint64_t entsize = 0;
};

struct elf_segment {
  std::uint32_t type = 0;
  std::uint32_t flags = 0;
  std::uint64_t offset = 0;
  std::uint64_t vaddr = 0;
  std::uint64_t filesz = 0;
  std::uint64_t memsz = 0;
  std::uint64_t align = 0;
};

// Limits that keep a hostile header from making us loop or allocate for long.
constexpr std::uint32_t elf_max_sections = 1u << 16;
constexpr std::uint32_t elf_max_segments = 1u << 12;
constexpr std::uint64_t elf_page_size = 4096;  // mapping granularity assumed when rounding p_offset

class elf_image {
 public:
  // Parses the ELF header, section headers (with names) and program headers of `bytes`, which must
  // outlive this object. `what` names the input in error messages (usually the path).
  status parse(byte_view bytes, const std::string& what) {
    *this = elf_image();
    bytes_ = bytes;
    size_ = bytes.size;
    return parse_headers(what);
  }
  // The same for a file: the headers are read now, sections when asked for, through `file` (open, and
  // outliving this object). A file that shrank meanwhile reads as truncated; after the last read,
  // file.check() says whether what was read still matches the file.
  status parse(mapped_file& file, const std::string& what) {
    *this = elf_image();
    file_ = &file;
    size_ = file.size();
    return parse_headers(what);
  }

  // The whole image when parsed from memory; empty when read from a file.
  byte_view bytes() const { return bytes_; }
  std::uint16_t type() const { return type_; }
  std::uint16_t machine() const { return machine_; }
  const std::vector<elf_section>& sections() const { return sections_; }
  const std::vector<elf_segment>& segments() const { return segments_; }

  // The first section called `name`, or nullptr.
  const elf_section* find_section(std::string_view name) const {
    for (const auto& s : sections_)
      if (s.name == name) return &s;
    return nullptr;
  }
  // The first section of ELF type `type` (SHT_SYMTAB, SHT_DYNSYM, ...), or nullptr.
  const elf_section* find_section_type(std::uint32_t type) const {
    for (const auto& s : sections_)
      if (s.type == type) return &s;
    return nullptr;
  }
  const elf_section* section_at(std::uint64_t index) const {
    return index < sections_.size() ? &sections_[static_cast<std::size_t>(index)] : nullptr;
  }
  // The bytes of a section inside the image; empty for SHT_NOBITS or a section that does not fit (or
  // no longer can be read).
  byte_view section_bytes(const elf_section& s) const {
    if (s.type == SHT_NOBITS) return {};
    return fetch(s.offset, s.size);
  }

  // Load bias of a mapping of this file; see elf_load_bias below.
  std::uint64_t load_bias(std::uint64_t map_start, std::uint64_t file_offset) const;

  // GNU build-id as lower-case hex, or empty. Looks in SHT_NOTE sections, else PT_NOTE segments.
  std::string build_id() const {
    std::string out;
    for (const auto& s : sections_)
      if (s.type == SHT_NOTE && find_build_id(section_bytes(s), s.addralign == 8 ? 8 : 4, out)) return out;
    for (const auto& seg : segments_)
      if (seg.type == PT_NOTE && find_build_id(fetch(seg.offset, seg.filesz), seg.align == 8 ? 8 : 4, out))
        return out;
    return {};
  }

  // The .gnu_debuglink file name and CRC; false when absent or malformed.
  bool debuglink(std::string& name, std::uint32_t& crc) const {
    const elf_section* s = find_section(".gnu_debuglink");
    if (s == nullptr) return false;
    byte_view b = section_bytes(*s);
    std::string_view n = string_at(b, 0);
    if (n.empty()) return false;
    std::uint64_t crc_offset = (n.size() + 1 + 3) & ~std::uint64_t{3};
    if (!read_at(b, crc_offset, crc)) return false;
    name = std::string(n);
    return true;
  }

 private:
  // `length` bytes at `offset` of the image, or an empty view when they are not (or no longer) there.
  byte_view fetch(std::uint64_t offset, std::uint64_t length) const {
    return file_ != nullptr ? file_->read(offset, length) : bytes_.sub(offset, length);
  }
  bool in_image(std::uint64_t offset, std::uint64_t length) const {
    return offset <= size_ && length <= size_ - offset;
  }

  status parse_headers(const std::string& what) {
    // In bounds yet unreadable: the file shrank since it was opened.
    auto changed = [&what] { return status::error(what + ": changed while being read"); };
    Elf64_Ehdr eh;
    if (!in_image(0, sizeof eh)) return status::error(what + ": not ELF: shorter than an ELF header");
    if (!read_at(fetch(0, sizeof eh), 0, eh)) return changed();
    if (std::memcmp(eh.e_ident, ELFMAG, SELFMAG) != 0) return status::error(what + ": not ELF: bad magic");
    if (eh.e_ident[EI_CLASS] != ELFCLASS64) return status::error(what + ": ELF: not a 64-bit file");
    if (eh.e_ident[EI_DATA] != host_data_encoding())
      return status::error(what + ": ELF: byte order differs from this machine");
    type_ = eh.e_type;
    machine_ = eh.e_machine;

    // Section headers; e_shnum == 0 with e_shoff set means the count is in section 0 (ELF gABI).
    if (eh.e_shoff != 0) {
      if (eh.e_shentsize < sizeof(Elf64_Shdr))
        return status::error(what + ": ELF: section header entry size " + std::to_string(eh.e_shentsize) +
                             " too small");
      Elf64_Shdr first;
      if (!in_image(eh.e_shoff, sizeof first))
        return status::error(what + ": ELF: section headers at offset " + std::to_string(eh.e_shoff) +
                             " are past the end of the file (truncated?)");
      if (!read_at(fetch(eh.e_shoff, sizeof first), 0, first)) return changed();
      std::uint64_t count = eh.e_shnum != 0 ? eh.e_shnum : first.sh_size;
      std::uint64_t names_index = eh.e_shstrndx == SHN_XINDEX ? first.sh_link : eh.e_shstrndx;
      if (count > elf_max_sections) return status::error(what + ": ELF: too many sections");
      std::uint64_t table_size = count * eh.e_shentsize;
      if (!in_image(eh.e_shoff, table_size))
        return status::error(what + ": ELF: " + std::to_string(count) +
                             " section headers do not fit in the file (truncated?)");
      byte_view table = fetch(eh.e_shoff, table_size);
      if (table.size != table_size) return changed();
      sections_.resize(static_cast<std::size_t>(count));
      std::vector<std::uint32_t> name_offsets(sections_.size());
      for (std::size_t i = 0; i < sections_.size(); ++i) {
        Elf64_Shdr sh;
        read_at(table, i * eh.e_shentsize, sh);
        elf_section& s = sections_[i];
        s.type = sh.sh_type;
        s.flags = sh.sh_flags;
        s.addr = sh.sh_addr;
        s.offset = sh.sh_offset;
        s.size = sh.sh_size;
        s.link = sh.sh_link;
        s.info = sh.sh_info;
        s.addralign = sh.sh_addralign;
        s.entsize = sh.sh_entsize;
        name_offsets[i] = sh.sh_name;
      }
      if (names_index < sections_.size()) {
        byte_view names = section_bytes(sections_[static_cast<std::size_t>(names_index)]);
        for (std::size_t i = 0; i < sections_.size(); ++i)
          sections_[i].name = std::string(string_at(names, name_offsets[i]));
      }
    }

    // Program headers.
    if (eh.e_phoff != 0 && eh.e_phnum != 0) {
      if (eh.e_phentsize < sizeof(Elf64_Phdr))
        return status::error(what + ": ELF: program header entry size too small");
      if (eh.e_phnum > elf_max_segments) return status::error(what + ": ELF: too many program headers");
      std::uint64_t table_size = std::uint64_t{eh.e_phnum} * eh.e_phentsize;
      if (!in_image(eh.e_phoff, table_size))
        return status::error(what + ": ELF: program headers do not fit in the file (truncated?)");
      byte_view table = fetch(eh.e_phoff, table_size);
      if (table.size != table_size) return changed();
      for (std::uint32_t i = 0; i < eh.e_phnum; ++i) {
        Elf64_Phdr ph;
        read_at(table, std::uint64_t{i} * eh.e_phentsize, ph);
        segments_.push_back(
            elf_segment{ph.p_type, ph.p_flags, ph.p_offset, ph.p_vaddr, ph.p_filesz, ph.p_memsz, ph.p_align});
      }
    }
    return status::ok();
  }

  static unsigned char host_data_encoding() {
    const std::uint16_t probe = 1;
    unsigned char first;
    std::memcpy(&first, &probe, 1);
    return first == 1 ? ELFDATA2LSB : ELFDATA2MSB;
  }

  static bool find_build_id(byte_view notes, std::uint64_t align, std::string& out) {
    std::uint64_t pos = 0;
    while (pos < notes.size) {
      Elf64_Nhdr nh;
      if (!read_at(notes, pos, nh)) return false;
      std::uint64_t name_pos = pos + sizeof(nh);
      std::uint64_t desc_pos = name_pos + ((std::uint64_t{nh.n_namesz} + align - 1) & ~(align - 1));
      std::uint64_t next = desc_pos + ((std::uint64_t{nh.n_descsz} + align - 1) & ~(align - 1));
      if (!notes.contains(name_pos, nh.n_namesz) || !notes.contains(desc_pos, nh.n_descsz)) return false;
      if (nh.n_type == NT_GNU_BUILD_ID && nh.n_namesz == 4 &&
          std::memcmp(notes.data + name_pos, "GNU", 4) == 0 && nh.n_descsz > 0) {
        static const char hex[] = "0123456789abcdef";
        out.clear();
        for (std::uint32_t i = 0; i < nh.n_descsz; ++i) {
          unsigned char c = notes.data[desc_pos + i];
          out += hex[c >> 4];
          out += hex[c & 15];
        }
        return true;
      }
      if (next <= pos) return false;
      pos = next;
    }
    return false;
  }

  byte_view bytes_;              // the image, when parsed from memory
  mapped_file* file_ = nullptr;  // the file, when parsed from one
  std::uint64_t size_ = 0;       // of the image or file
  std::uint16_t type_ = 0;
  std::uint16_t machine_ = 0;
  std::vector<elf_section> sections_;
  std::vector<elf_segment> segments_;
};

// Load bias of a mapping that maps file offset `file_offset` at address `map_start`: the value added to
// ELF virtual addresses to get run-time addresses. Uses the PT_LOAD segment that holds the offset
// (preferring an executable one); falls back to start - offset when none matches.
inline std::uint64_t elf_load_bias(const std::vector<elf_segment>& segments, std::uint64_t map_start,
                                   std::uint64_t file_offset) {
  const elf_segment* best = nullptr;
  for (const auto& seg : segments) {
    if (seg.type != PT_LOAD) continue;
    std::uint64_t page_start = seg.offset & ~(elf_page_size - 1);
    if (file_offset < page_start || file_offset - page_start >= seg.filesz + (seg.offset - page_start))
      continue;
    if (best == nullptr || ((seg.flags & PF_X) != 0 && (best->flags & PF_X) == 0)) best = &seg;
  }
  if (best == nullptr) return map_start - file_offset;
  // The segment puts file offset p_offset at p_vaddr, so file_offset lives at p_vaddr + (file_offset -
  // p_offset).
  return map_start - (best->vaddr + file_offset - best->offset);
}

inline std::uint64_t elf_image::load_bias(std::uint64_t map_start, std::uint64_t file_offset) const {
  return elf_load_bias(segments_, map_start, file_offset);
}

}  // namespace detail
}  // namespace selfprof
// ---- end selfprof/symbols/elf.hpp ----

namespace selfprof {
namespace detail {

// The CRC-32 (IEEE, reflected) that .gnu_debuglink stores for its debug file.
inline std::uint32_t debuglink_crc32(byte_view bytes, std::uint32_t crc = 0) {
  static const std::array<std::uint32_t, 256> table = [] {
    std::array<std::uint32_t, 256> t{};
    for (std::uint32_t i = 0; i < 256; ++i) {
      std::uint32_t c = i;
      for (int k = 0; k < 8; ++k) c = (c & 1) != 0 ? 0xEDB88320u ^ (c >> 1) : c >> 1;
      t[i] = c;
    }
    return t;
  }();
  crc = ~crc;
  for (std::size_t i = 0; i < bytes.size; ++i) crc = table[(crc ^ bytes.data[i]) & 0xFF] ^ (crc >> 8);
  return ~crc;
}

inline std::vector<std::string> build_id_debug_paths(const std::vector<std::string>& roots,
                                                     const std::string& build_id) {
  std::vector<std::string> out;
  if (build_id.size() < 3) return out;
  for (const auto& root : roots) {
    std::string path = root;
    path += "/.build-id/";
    path.append(build_id, 0, 2);
    path += '/';
    path.append(build_id, 2, std::string::npos);
    path += ".debug";
    out.push_back(std::move(path));
  }
  return out;
}

inline std::vector<std::string> debuglink_paths(const std::vector<std::string>& roots,
                                                const std::string& module_path, const std::string& link) {
  std::vector<std::string> out;
  if (link.empty() || link.find('/') != std::string::npos || module_path.empty() || module_path[0] != '/')
    return out;
  std::string::size_type slash = module_path.rfind('/');
  std::string dir = module_path.substr(0, slash + 1);  // with its trailing slash
  out.push_back(dir + link);
  out.push_back(dir + ".debug/");
  out.back() += link;
  for (const auto& root : roots) {
    out.push_back(root + dir);
    out.back() += link;
  }
  return out;
}

// A debug file found for a module: `image` reads through `file`, which stays open so its sections can be
// read; file.check() after the last read tells whether it changed meanwhile.
struct debug_file {
  std::string path;
  mapped_file file;
  elf_image image;
};

// Opens the separate debug file for `module` (at `module_path`) with a .symtab; false when none fits.
inline bool find_debug_file(const std::vector<std::string>& roots, const std::string& module_path,
                            const elf_image& module, debug_file& out) {
  auto try_open = [&](const std::string& path, const std::string& want_build_id, bool check_crc,
                      std::uint32_t crc) {
    if (path == module_path) return false;
    if (!out.file.open(path)) return false;
    bool ok = static_cast<bool>(out.image.parse(out.file, path)) &&
              out.image.find_section_type(SHT_SYMTAB) != nullptr;
    if (ok && !want_build_id.empty()) ok = out.image.build_id() == want_build_id;
    if (ok && check_crc) {
      std::uint32_t file_crc = 0;
      ok = out.file.read_all([&file_crc](byte_view b) { file_crc = debuglink_crc32(b, file_crc); }) &&
           file_crc == crc;
    }
    if (!ok) {
      out.image = elf_image();
      out.file.reset();
      return false;
    }
    out.path = path;
    return true;
  };
  std::string id = module.build_id();
  for (const auto& path : build_id_debug_paths(roots, id))
    if (try_open(path, id, false, 0)) return true;
  std::string link;
  std::uint32_t crc = 0;
  if (module.debuglink(link, crc))
    for (const auto& path : debuglink_paths(roots, module_path, link))
      if (try_open(path, id, true, crc)) return true;
  return false;
}

// True when `image`'s DWARF is stored compressed: a .debug_info with SHF_COMPRESSED (objcopy
// --compress-debug-sections, as distributions ship debug files) or the older GNU .zdebug_info.
inline bool dwarf_compressed(const elf_image& image) {
  const elf_section* info = image.find_section(".debug_info");
  return (info != nullptr && (info->flags & SHF_COMPRESSED) != 0) ||
         image.find_section(".zdebug_info") != nullptr;
}

// The file holding the DWARF of the module file at `path` (inode `inode` when non-zero): `path` itself
// when it has .debug_info, else `known_debug` when set (the registry's pick), else the debug file found
// under `roots` (by build-id, and by .gnu_debuglink next to `module_path` unless that is empty). Empty
// when there is none; `readable` says whether `path` could be read as ELF at all, `compressed` whether
// the file returned stores its DWARF compressed (dwarf_compressed).
inline std::string dwarf_source_path(const std::vector<std::string>& roots, const std::string& path,
                                     std::uint64_t inode, const std::string& module_path,
                                     const std::string& known_debug, bool& readable, bool& compressed) {
  compressed = false;
  mapped_file file;
  elf_image image;
  readable = file.open(path, inode) && image.parse(file, path);
  if (!readable) return {};
  for (const char* name : {".debug_info", ".zdebug_info"}) {
    const elf_section* s = image.find_section(name);
    if (s != nullptr && s->type != SHT_NOBITS) {
      compressed = dwarf_compressed(image);
      return path;
    }
  }
  std::string found = known_debug;
  // The registry looks for a debug file only when a module lacks .symtab: a module stripped of DWARF
  // alone (strip -g) gets its debug file found here.
  debug_file debug;
  if (found.empty() && find_debug_file(roots, module_path, image, debug)) found = debug.path;
  if (found.empty()) return {};
  mapped_file debug_mapped;
  elf_image debug_image;
  compressed =
      debug_mapped.open(found, 0) && debug_image.parse(debug_mapped, found) && dwarf_compressed(debug_image);
  return found;
}

}  // namespace detail
}  // namespace selfprof
// ---- end selfprof/symbols/debug_file.hpp ----
// ---- begin selfprof/symbols/minidebuginfo.hpp ----
// MiniDebugInfo: a .gnu_debugdata section holding an xz-compressed ELF file whose .symtab names the
// functions a stripped binary's .dynsym lacks (local and static functions). Fedora, CentOS and others ship
// their binaries this way. The section is decompressed with liblzma, loaded with dlopen("liblzma.so.5")
// at the first such section: no build or link dependency, and a process whose modules have none
// (Debian's) never loads it.
// Context: collector or dump thread (dlopen takes the loader lock; never the signal handler).

#include <dlfcn.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string>

// ---- begin selfprof/symbols/symbol_table.hpp ----
// A per-module table of function symbols (.symtab, .dynsym, synthesized PLT stubs) sorted by address,
// with sizes respected and zero-size symbols extended to the next one, plus cached demangled names.
// Context: collector thread or setup (never the signal handler).

#include <elf.h>

#include <algorithm>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

// ---- begin selfprof/symbols/demangle.hpp ----
// C++ symbol demangling through the C++ runtime's abi::__cxa_demangle, falling back to the raw name.
// Context: collector thread or any thread (allocates; never the signal handler).

#include <cxxabi.h>

#include <cstdlib>
#include <string>
#include <string_view>

namespace selfprof {
namespace detail {

// Demangles an Itanium-ABI name ("_Z..."); a name that is not mangled or does not demangle is returned
// unchanged. A "@plt" suffix (our PLT stub names) is kept after the demangled part.
inline std::string demangle(std::string_view name) {
  std::string_view suffix;
  std::string_view base = name;
  constexpr std::string_view plt = "@plt";
  if (base.size() > plt.size() && base.substr(base.size() - plt.size()) == plt) {
    suffix = plt;
    base.remove_suffix(plt.size());
  }
  if (base.size() < 3 || base[0] != '_' || base[1] != 'Z') return std::string(name);
  std::string raw(base);
  int status = 0;
  char* out = abi::__cxa_demangle(raw.c_str(), nullptr, nullptr, &status);
  if (out == nullptr || status != 0) {
    std::free(out);
    return std::string(name);
  }
  std::string result(out);
  std::free(out);
  result += suffix;
  return result;
}

}  // namespace detail
}  // namespace selfprof
// ---- end selfprof/symbols/demangle.hpp ----

namespace selfprof {
namespace detail {

// How far back a lookup walks past symbols that end before the address, looking for an enclosing
// (overlapping) symbol; overlaps are rare and shallow, so a small bound keeps lookups O(log n).
constexpr int symbol_overlap_lookback = 8;
// Size of one PLT entry on x86-64 and AArch64, and of the PLT header (PLT0) before the entries.
constexpr std::uint64_t plt_entry_bytes = 16;

class symbol_table {
 public:
  struct hit {
    std::uint32_t index = 0;
    std::uint64_t start = 0;  // ELF virtual address of the symbol
    std::uint64_t end = 0;    // one past its last byte
  };

  // Adds the function symbols of a SHT_SYMTAB or SHT_DYNSYM section of `image`; returns how many.
  std::size_t add_symbols(const elf_image& image, const elf_section& symtab) {
    if (symtab.type != SHT_SYMTAB && symtab.type != SHT_DYNSYM) return 0;
    if ((symtab.flags & SHF_COMPRESSED) != 0) return 0;
    const elf_section* strtab_section = image.section_at(symtab.link);
    if (strtab_section == nullptr) return 0;
    byte_view syms = image.section_bytes(symtab);
    byte_view strtab = image.section_bytes(*strtab_section);
    std::size_t count = syms.size / sizeof(Elf64_Sym), added = 0;
    for (std::size_t i = 1; i < count; ++i) {
      Elf64_Sym sym;
      read_at(syms, i * sizeof(Elf64_Sym), sym);
      unsigned type = ELF64_ST_TYPE(sym.st_info);
      unsigned bind = ELF64_ST_BIND(sym.st_info);
      if (sym.st_shndx == SHN_UNDEF || sym.st_shndx >= SHN_LORESERVE) continue;
      const elf_section* in = image.section_at(sym.st_shndx);
      bool exec_section = in != nullptr && (in->flags & SHF_EXECINSTR) != 0;
      if (type == STT_NOTYPE) {
        if (!exec_section) continue;  // a label in code (hand-written assembly, ld.so's _dl_start_user)
      } else if (type != STT_FUNC && type != STT_GNU_IFUNC) {
        continue;
      }
      std::string_view name = string_at(strtab, sym.st_name);
      if (name.empty() || name[0] == '$' || name.substr(0, 2) == ".L") continue;
      std::uint64_t section_end = 0;
      if (in != nullptr && in->size != 0 && sym.st_value >= in->addr && sym.st_value - in->addr < in->size)
        section_end = in->addr + in->size;
      unsigned rank = bind == STB_GLOBAL ? 3 : bind == STB_WEAK ? 1 : 2;
      if (type != STT_NOTYPE) rank += 4;
      add(sym.st_value, sym.st_size, section_end, name, rank);
      ++added;
    }
    return added;
  }

  // Adds `name@plt` for each PLT stub (x86-64 and AArch64; .plt.sec when present). Cheap: one pass
  // over .rela.plt; returns how many were added.
  std::size_t add_plt(const elf_image& image) {
    const elf_section* rela = image.find_section(".rela.plt");
    if (rela == nullptr || rela->type != SHT_RELA) return 0;
    const elf_section* dynsym = image.section_at(rela->link);
    if (dynsym == nullptr || dynsym->type != SHT_DYNSYM) return 0;
    const elf_section* dynstr = image.section_at(dynsym->link);
    if (dynstr == nullptr) return 0;
    std::uint64_t first = 0;
    const elf_section* plt = image.find_section(".plt.sec");
    std::uint32_t jump_slot = 0;
    if (image.machine() == EM_X86_64) {
      jump_slot = R_X86_64_JUMP_SLOT;
      if (plt == nullptr) {
        plt = image.find_section(".plt");
        first = plt_entry_bytes;  // PLT0 is one entry
      }
    } else if (image.machine() == EM_AARCH64) {
      jump_slot = R_AARCH64_JUMP_SLOT;
      plt = image.find_section(".plt");
      first = 2 * plt_entry_bytes;  // PLT0 is 32 bytes
    }
    if (plt == nullptr || jump_slot == 0) return 0;
    byte_view relocs = image.section_bytes(*rela), syms = image.section_bytes(*dynsym);
    byte_view strs = image.section_bytes(*dynstr);
    std::size_t count = relocs.size / sizeof(Elf64_Rela), added = 0;
    for (std::size_t i = 0; i < count; ++i) {
      std::uint64_t offset = first + i * plt_entry_bytes;
      if (offset + plt_entry_bytes > plt->size) break;
      Elf64_Rela r;
      read_at(relocs, i * sizeof(Elf64_Rela), r);
      if (ELF64_R_TYPE(r.r_info) != jump_slot) continue;
      Elf64_Sym sym;
      if (!read_at(syms, std::uint64_t{ELF64_R_SYM(r.r_info)} * sizeof(Elf64_Sym), sym)) continue;
      std::string_view name = string_at(strs, sym.st_name);
      if (name.empty()) continue;
      add(plt->addr + offset, plt_entry_bytes, 0, std::string(name) + "@plt", 0);
      ++added;
    }
    return added;
  }

  // Sorts, keeps the best name per address and computes where zero-size symbols end. Call once after
  // the add_* calls and before lookups.
  void finish() {
    std::sort(entries_.begin(), entries_.end(), [this](const entry& a, const entry& b) {
      if (a.start != b.start) return a.start < b.start;
      return better(a, b);
    });
    std::vector<entry> unique;
    unique.reserve(entries_.size());
    for (const entry& e : entries_) {
      if (!unique.empty() && unique.back().start == e.start) {
        unique.back().size = std::max(unique.back().size, e.size);
        continue;
      }
      unique.push_back(e);
    }
    // A zero-size symbol inside a sized one is a label within that function's body: the function names
    // those addresses, so the label goes.
    std::vector<entry> kept;
    kept.reserve(unique.size());
    std::uint64_t covered_to = 0;
    for (const entry& e : unique) {
      if (e.size == 0 && e.start < covered_to) continue;
      if (e.size != 0 && e.start + e.size > covered_to) covered_to = e.start + e.size;
      kept.push_back(e);
    }
    unique.swap(kept);
    for (std::size_t i = 0; i < unique.size(); ++i) {
      entry& e = unique[i];
      if (e.size != 0) continue;
      // A zero-size symbol (hand-written assembly, a label) runs to the next symbol or the end of its
      // section.
      std::uint64_t end = i + 1 < unique.size() ? unique[i + 1].start : ~std::uint64_t{0};
      if (e.section_end != 0) end = std::min(end, e.section_end);
      e.size = end > e.start && end != ~std::uint64_t{0} ? end - e.start : 1;
    }
    entries_ = std::move(unique);
    entries_.shrink_to_fit();
    demangled_.assign(entries_.size(), std::string());
  }

  // The symbol covering ELF virtual address `vaddr`, if any: an address past a symbol's end is not
  // charged to it.
  bool lookup(std::uint64_t vaddr, hit& out) const {
    auto it = std::upper_bound(entries_.begin(), entries_.end(), vaddr,
                               [](std::uint64_t v, const entry& e) { return v < e.start; });
    for (int back = 0; it != entries_.begin() && back < symbol_overlap_lookback; ++back) {
      --it;
      if (vaddr - it->start < it->size) {
        out.index = static_cast<std::uint32_t>(it - entries_.begin());
        out.start = it->start;
        out.end = it->start + it->size;
        return true;
      }
    }
    return false;
  }

  std::string_view raw_name(std::uint32_t index) const {
    const entry& e = entries_[index];
    return std::string_view(names_).substr(e.name_offset, e.name_size);
  }

  // Demangled name of entry `index`, computed on first use and cached.
  const std::string& name(std::uint32_t index) {
    std::string& d = demangled_[index];
    if (d.empty()) d = demangle(raw_name(index));
    return d;
  }

  std::size_t size() const { return entries_.size(); }

 private:
  struct entry {
    std::uint64_t start;
    std::uint64_t size;
    std::uint64_t section_end;
    std::uint32_t name_offset;
    std::uint32_t name_size;
    std::uint32_t rank;
  };

  void add(std::uint64_t start, std::uint64_t size, std::uint64_t section_end, std::string_view name,
           unsigned rank) {
    entry e{start,
            size,
            section_end,
            static_cast<std::uint32_t>(names_.size()),
            static_cast<std::uint32_t>(name.size()),
            rank};
    names_.append(name.data(), name.size());
    entries_.push_back(e);
  }

  static std::size_t leading_underscores(std::string_view s) {
    std::size_t n = 0;
    while (n < s.size() && s[n] == '_') ++n;
    return n;
  }

  // Which of two symbols at one address names it, as perf chooses (so both tools give one name to
  // aliases such as glibc's __memcpy_avx512_unaligned_erms and __memmove_avx512_unaligned_erms): sized,
  // FUNC over NOTYPE, global over local over weak, fewer leading underscores (malloc over
  // __libc_malloc), longer, then alphabetical. Unlike perf, a symbol version (a .symtab's
  // `__libc_start_main@@GLIBC_2.34`) does not make a name longer: the plain name wins.
  bool better(const entry& a, const entry& b) const {
    if ((a.size != 0) != (b.size != 0)) return a.size != 0;
    if (a.rank != b.rank) return a.rank > b.rank;
    std::string_view na = std::string_view(names_).substr(a.name_offset, a.name_size);
    std::string_view nb = std::string_view(names_).substr(b.name_offset, b.name_size);
    std::size_t ua = leading_underscores(na), ub = leading_underscores(nb);
    if (ua != ub) return ua < ub;
    std::string_view ba = na.substr(0, na.find('@')), bb = nb.substr(0, nb.find('@'));
    if (ba.size() != bb.size()) return ba.size() > bb.size();
    if (na.size() != nb.size()) return na.size() < nb.size();
    return na < nb;
  }

  std::vector<entry> entries_;
  std::string names_;
  std::vector<std::string> demangled_;
};

}  // namespace detail
}  // namespace selfprof
// ---- end selfprof/symbols/symbol_table.hpp ----

namespace selfprof {
namespace detail {

// Bounds on what a section may cost: its decompressed size, and the memory liblzma's decoder may use.
constexpr std::size_t minidebuginfo_max_bytes = std::size_t{64} << 20;
constexpr std::uint64_t minidebuginfo_memlimit = std::uint64_t{256} << 20;

// liblzma's one-call decoder, lzma_stream_buffer_decode, by its stable ABI (soname 5): lzma_ret is an
// int-sized enum; LZMA_OK (0) is success and LZMA_BUF_ERROR (10) an output buffer too small, in which
// case nothing was written and the call may be repeated with a larger one.
using lzma_buffer_decode_fn = int (*)(std::uint64_t* memlimit, std::uint32_t flags, const void* allocator,
                                      const std::uint8_t* in, std::size_t* in_pos, std::size_t in_size,
                                      std::uint8_t* out, std::size_t* out_pos, std::size_t out_size);
constexpr int lzma_ok = 0;
constexpr int lzma_buf_error = 10;

// Loaded once; null when liblzma.so.5 is missing. The handle is never closed: the symbolizer may need it
// again at any time.
inline lzma_buffer_decode_fn lzma_decoder() {
  static const lzma_buffer_decode_fn fn = [] {
    void* handle = ::dlopen("liblzma.so.5", RTLD_NOW | RTLD_LOCAL);
    if (handle == nullptr) return lzma_buffer_decode_fn{nullptr};
    return reinterpret_cast<lzma_buffer_decode_fn>(::dlsym(handle, "lzma_stream_buffer_decode"));
  }();
  return fn;
}

// Decompresses one .xz stream into `out`; the error says what failed.
inline status xz_decompress(byte_view in, std::string& out) {
  out.clear();
  lzma_buffer_decode_fn decode = lzma_decoder();
  if (decode == nullptr) return status::error("liblzma.so.5 cannot be loaded (Debian: liblzma5)");
  // Symbol tables compress about 4:1; each too-small buffer costs one decode, so start near the end.
  std::size_t size = std::min(std::max<std::size_t>(in.size * 6, 4096), minidebuginfo_max_bytes);
  for (;;) {
    out.resize(size);
    std::uint64_t memlimit = minidebuginfo_memlimit;
    std::size_t in_pos = 0, out_pos = 0;
    int r = decode(&memlimit, 0, nullptr, in.data, &in_pos, in.size, reinterpret_cast<std::uint8_t*>(&out[0]),
                   &out_pos, out.size());
    if (r == lzma_ok) {
      out.resize(out_pos);
      return status::ok();
    }
    if (r == lzma_buf_error && size < minidebuginfo_max_bytes) {
      size = std::min(size * 2, minidebuginfo_max_bytes);
      continue;
    }
    out.clear();
    if (r == lzma_buf_error) return status::error("larger than 64 MiB decompressed");
    return status::error("not a valid xz stream (liblzma error " + std::to_string(r) + ")");
  }
}

// Adds the function symbols of `image`'s MiniDebugInfo to `table`; returns how many (0 without a
// .gnu_debugdata section). `why` is set when the section is there but could not be read.
inline std::size_t add_minidebuginfo(const elf_image& image, const std::string& path, symbol_table& table,
                                     std::string& why) {
  why.clear();
  const elf_section* section = image.find_section(".gnu_debugdata");
  if (section == nullptr || section->type == SHT_NOBITS) return 0;
  std::string bytes;
  status st = xz_decompress(image.section_bytes(*section), bytes);
  if (!st) {
    why = st.message();
    return 0;
  }
  elf_image inner;
  byte_view view{reinterpret_cast<const unsigned char*>(bytes.data()), bytes.size()};
  st = inner.parse(view, path + " (.gnu_debugdata)");
  if (!st) {
    why = st.message();
    return 0;
  }
  const elf_section* symtab = inner.find_section_type(SHT_SYMTAB);
  if (symtab == nullptr) {
    why = "no .symtab in the decompressed file";
    return 0;
  }
  return table.add_symbols(inner, *symtab);  // names are copied: `bytes` may go
}

}  // namespace detail
}  // namespace selfprof
// ---- end selfprof/symbols/minidebuginfo.hpp ----
// ---- begin selfprof/symbols/proc_maps.hpp ----
// Reading and parsing /proc/<pid>/maps lines (address range, permissions, offset, device, inode, path).
// Context: collector thread or setup (never the signal handler).

#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <string>
#include <string_view>


namespace selfprof {
namespace detail {

struct maps_entry {
  std::uint64_t start = 0;
  std::uint64_t end = 0;
  std::uint64_t offset = 0;
  std::uint64_t inode = 0;
  std::uint32_t dev_major = 0;
  std::uint32_t dev_minor = 0;
  bool readable = false;
  bool executable = false;
  bool deleted = false;  // the path ended in " (deleted)" (removed file, or a memfd)
  std::string path;      // without the " (deleted)" suffix; empty for anonymous memory

  // A file with no path to open again: deleted, or a memfd ("/memfd:NAME").
  bool hidden_file() const { return deleted || path.compare(0, 7, "/memfd:") == 0; }
};

// Parses one hexadecimal field ending at `stop` (or the end); advances `pos`. False when empty or bad.
inline bool parse_hex_field(std::string_view line, std::size_t& pos, char stop, std::uint64_t& out) {
  out = 0;
  std::size_t begin = pos;
  while (pos < line.size() && line[pos] != stop) {
    char c = line[pos];
    unsigned digit;
    if (c >= '0' && c <= '9')
      digit = static_cast<unsigned>(c - '0');
    else if (c >= 'a' && c <= 'f')
      digit = static_cast<unsigned>(c - 'a' + 10);
    else if (c >= 'A' && c <= 'F')
      digit = static_cast<unsigned>(c - 'A' + 10);
    else
      return false;
    if (pos - begin >= 16) return false;
    out = (out << 4) | digit;
    ++pos;
  }
  if (pos == begin) return false;
  if (pos < line.size()) ++pos;  // the stop character
  return true;
}

// Parses "start-end perms offset major:minor inode   path" (path optional, may hold spaces).
inline bool parse_maps_line(std::string_view line, maps_entry& out) {
  out = maps_entry();
  std::size_t pos = 0;
  if (!parse_hex_field(line, pos, '-', out.start) || !parse_hex_field(line, pos, ' ', out.end)) return false;
  if (pos + 5 > line.size() || line[pos + 4] != ' ') return false;
  out.readable = line[pos] == 'r';
  out.executable = line[pos + 2] == 'x';
  pos += 5;
  std::uint64_t major = 0, minor = 0;
  if (!parse_hex_field(line, pos, ' ', out.offset) || !parse_hex_field(line, pos, ':', major) ||
      !parse_hex_field(line, pos, ' ', minor))
    return false;
  out.dev_major = static_cast<std::uint32_t>(major);
  out.dev_minor = static_cast<std::uint32_t>(minor);
  std::size_t begin = pos;
  while (pos < line.size() && line[pos] >= '0' && line[pos] <= '9')
    out.inode = out.inode * 10 + (line[pos++] - '0');
  if (pos == begin || out.end < out.start) return false;
  while (pos < line.size() && line[pos] == ' ') ++pos;
  std::string_view path = line.substr(pos);
  constexpr std::string_view deleted = " (deleted)";
  if (path.size() > deleted.size() && path.substr(path.size() - deleted.size()) == deleted) {
    out.deleted = true;
    path.remove_suffix(deleted.size());
  }
  out.path = std::string(path);
  return true;
}

// Calls fn(line) for each line of `text` (without its '\n'), the last one also when unterminated.
template <class F>
void for_each_line(std::string_view text, F&& fn) {
  std::size_t pos = 0;
  while (pos < text.size()) {
    std::size_t eol = text.find('\n', pos);
    if (eol == std::string_view::npos) eol = text.size();
    fn(text.substr(pos, eol - pos));
    pos = eol + 1;
  }
}

// Calls fn(entry) for each executable mapping in maps text; lines that do not parse are skipped.
template <class F>
void for_each_executable_mapping(std::string_view text, F&& fn) {
  for_each_line(text, [&](std::string_view line) {
    maps_entry e;
    if (parse_maps_line(line, e) && e.executable) fn(e);
  });
}

// Reads a whole (proc) file into `out`; false on failure.
inline bool read_text_file(const char* path, std::string& out) {
  out.clear();
  int fd = sys().open(path, O_RDONLY | O_CLOEXEC, 0);
  if (fd < 0) return false;
  char buffer[16384];
  for (;;) {
    ssize_t n = ::read(fd, buffer, sizeof buffer);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      sys().close(fd);
      return n == 0;
    }
    out.append(buffer, static_cast<std::size_t>(n));
  }
}

}  // namespace detail
}  // namespace selfprof
// ---- end selfprof/symbols/proc_maps.hpp ----

namespace selfprof {
namespace detail {

enum class module_kind : std::uint8_t {
  file,       // a file-backed mapping (also memfd and deleted files)
  vdso,       // the kernel's vdso, parsed from memory
  anonymous,  // anonymous executable memory (JIT code); named only by perf maps
  special,    // other kernel-provided mappings such as [vsyscall]
};

// What was parsed from one ELF file (shared by every mapping of that file).
struct module_symbols {
  std::string build_id;
  std::string debug_path;             // separate debug file used, if any
  std::vector<elf_segment> segments;  // for the load bias of each mapping
  symbol_table table;
  bool elf_ok = false;
  // Not read yet (see the top of this file): the mapping it was first seen in, and its path's stat then.
  bool pending = false;
  maps_entry first_seen;
  struct stat stamp {};
};

struct module {
  std::uint64_t start = 0;
  std::uint64_t end = 0;
  std::uint64_t offset = 0;  // file offset mapped at start
  std::uint64_t bias = 0;    // run-time address minus ELF virtual address (once bias_known)
  std::uint64_t inode = 0;
  std::uint32_t dev_major = 0;
  std::uint32_t dev_minor = 0;
  std::string path;      // as in the maps (without " (deleted)"), "[vdso]", or "//anon"
  std::string basename;  // for "[basename+0xoffset]" names
  module_kind kind = module_kind::file;
  bool deleted = false;
  bool bias_known = false;                  // false while its file's symbols (and segments) are unread
  bool mapped = true;                       // false once unmapped; kept so earlier samples are still named
  std::uint64_t unmapped_seq = 0;           // orders unmapped modules: a later unmap wins an overlap
  std::shared_ptr<module_symbols> symbols;  // null for anonymous and special mappings
};

// Files' symbols by device, inode and path, shared by the registries of several processes (the recorder
// of `selfprof record --follow-exec` names every process's frames, reading each library once).
using shared_file_symbols = std::unordered_map<std::string, std::shared_ptr<module_symbols>>;

struct module_registry_options {
  std::vector<std::string> debug_roots{"/usr/lib/debug"};  // where build-id and debuglink files live
  std::string maps_path = "/proc/self/maps";
  std::shared_ptr<shared_file_symbols> shared_files;  // null: this registry's own
};

class module_registry {
 public:
  module_registry() = default;
  explicit module_registry(module_registry_options options) : options_(std::move(options)) {}

  // Re-reads the maps when the dynamic loader's load/unload counters (dl_iterate_phdr's dlpi_adds and
  // dlpi_subs) moved since the last snapshot, or on the first call: a few hundred nanoseconds otherwise.
  // Returns true when the module set changed.
  bool refresh() {
    std::pair<unsigned long long, unsigned long long> counters = loader_counters();
    if (scans_ != 0 && counters == last_counters_) return false;
    last_counters_ = counters;
    return rescan();
  }

  // Re-reads the maps unconditionally (for mappings made without the loader: JIT code, mmap of a
  // file); returns early when the text is unchanged. Returns true when the module set changed.
  bool rescan() {
    std::string text;
    if (!read_text_file(options_.maps_path.c_str(), text)) {
      warn("selfprof: cannot read " + options_.maps_path + "; frames will be [unknown]");
      return false;
    }
    ++reads_;
    text = executable_lines(text);  // data mappings come and go with every allocation: ignore them
    if (scans_ != 0 && text == last_text_) return false;
    last_text_ = std::move(text);
    ++scans_;
    apply(last_text_);
    return true;
  }

  // Takes the executable lines of maps text as the module set (another process's, written down by it:
  // see dump/raw_dump.hpp), parsing the symbols of new files.
  void apply_maps_text(const std::string& text) {
    ++scans_;
    apply(text);
  }

  // The module holding `address`: a mapped one first, else the most recently unmapped one; its file's
  // symbols are read now if they were not yet. The pointer is valid until the next refresh()/rescan().
  const module* find(std::uint64_t address) {
    module* m = locate(address);
    if (m != nullptr) load(*m);
    return m;
  }

  // Reads the symbols of every module not read yet (tests; a caller that walks modules()).
  void load_all() {
    for (module& m : modules_) load(m);
  }

  // Every module; a file's `symbols` and `bias` are filled once it was looked up (see load_all).
  const std::vector<module>& modules() const { return modules_; }
  // Messages about modules whose symbols could not be read (one per file); cleared by this call.
  std::vector<std::string> take_warnings() { return std::exchange(warnings_, {}); }
  std::uint64_t scans() const { return scans_; }               // times the maps text changed and was applied
  std::uint64_t reads() const { return reads_; }               // times the maps file was read
  std::size_t parsed_files() const { return parsed_.size(); }  // files seen (read or pending)
  std::size_t loaded_files() const { return loaded_; }         // files whose symbols were read

 private:
  module* locate(std::uint64_t address) {
    auto it = std::upper_bound(mapped_.begin(), mapped_.end(), address,
                               [this](std::uint64_t a, std::size_t i) { return a < modules_[i].start; });
    if (it != mapped_.begin()) {
      module& m = modules_[*(it - 1)];
      if (address < m.end) return &m;
    }
    for (std::size_t i : unmapped_)
      if (address >= modules_[i].start && address < modules_[i].end) return &modules_[i];
    return nullptr;
  }

  // Reads the module's file symbols if still pending, then fixes its bias from the file's segments.
  void load(module& m) {
    if (m.bias_known) return;
    if (m.symbols && m.symbols->pending) read_file_symbols(*m.symbols);
    m.bias = m.symbols && m.symbols->elf_ok ? elf_load_bias(m.symbols->segments, m.start, m.offset)
                                            : m.start - m.offset;
    m.bias_known = true;
  }

  // Keys are bytes: fixed-width numbers, then the path, so one string-keyed map type serves every index
  // (each distinct map type costs every including file its instantiation).
  static void append_key(std::string& key, std::uint64_t v) {
    char bytes[sizeof v];
    std::memcpy(bytes, &v, sizeof v);
    key.append(bytes, sizeof v);
  }

  // Identifies a mapping: start, end, offset, inode, path (anonymous memory: no path).
  static std::string mapping_key(std::uint64_t start, std::uint64_t end, std::uint64_t offset,
                                 std::uint64_t inode, const std::string& path) {
    std::string key;
    key.reserve(32 + path.size());
    append_key(key, start);
    append_key(key, end);
    append_key(key, offset);
    append_key(key, inode);
    key += path;
    return key;
  }

  // Identifies a file: device, inode, path.
  static std::string file_key(const maps_entry& e) {
    std::string key;
    key.reserve(24 + e.path.size());
    append_key(key, e.dev_major);
    append_key(key, e.dev_minor);
    append_key(key, e.inode);
    key += e.path;
    return key;
  }

  // Orders indices into modules_: by start address, or for unmapped ones the latest unmapped first.
  struct module_order {
    const std::vector<module>* modules;
    bool latest_unmapped_first;
    bool operator()(std::size_t a, std::size_t b) const {
      const module& x = (*modules)[a];
      const module& y = (*modules)[b];
      return latest_unmapped_first ? x.unmapped_seq > y.unmapped_seq : x.start < y.start;
    }
  };

  static std::pair<unsigned long long, unsigned long long> loader_counters() {
    std::pair<unsigned long long, unsigned long long> out{0, 0};
    ::dl_iterate_phdr(
        [](struct dl_phdr_info* info, std::size_t size, void* data) -> int {
          if (size >= offsetof(struct dl_phdr_info, dlpi_subs) + sizeof(info->dlpi_subs)) {
            auto* c = static_cast<std::pair<unsigned long long, unsigned long long>*>(data);
            c->first = info->dlpi_adds;
            c->second = info->dlpi_subs;
          }
          return 1;  // the counters are the same in every entry: stop after the first
        },
        &out);
    return out;
  }

  // The lines of maps text whose permissions include 'x' ("start-end r-xp ...").
  static std::string executable_lines(const std::string& text) {
    std::string out;
    std::size_t pos = 0;
    while (pos < text.size()) {
      std::size_t eol = text.find('\n', pos);
      if (eol == std::string::npos) eol = text.size();
      std::size_t space = text.find(' ', pos);
      if (space != std::string::npos && space + 3 < eol && text[space + 3] == 'x')
        out.append(text, pos, eol - pos + 1);
      pos = eol + 1;
    }
    return out;
  }

  void warn(std::string message) { warnings_.push_back(std::move(message)); }

  void warn_no_symbols(const std::string& path, const status& why) {
    std::string m = "selfprof: no symbols for ";
    m += path;
    m += ": ";
    m += why.message();
    m += "; its frames are named [module+0xoffset]";
    warn(std::move(m));
  }

  void apply(const std::string& text) {
    std::vector<module> next;
    std::vector<bool> seen(modules_.size(), false);
    std::unordered_map<std::string, std::size_t> index;
    for (std::size_t i = 0; i < modules_.size(); ++i) index.emplace(key_of(modules_[i]), i);

    for_each_executable_mapping(text, [&](const maps_entry& e) {
      auto found = index.find(mapping_key(e.start, e.end, e.offset, e.inode, e.path));
      if (found != index.end()) {
        seen[found->second] = true;
        next.push_back(modules_[found->second]);
        next.back().mapped = true;
      } else {
        next.push_back(make_module(e));
      }
    });
    // Unmapped modules stay (anonymous memory excepted: it has no symbols to keep).
    for (std::size_t i = 0; i < modules_.size(); ++i) {
      if (seen[i] || modules_[i].kind == module_kind::anonymous) continue;
      module m = modules_[i];
      if (m.mapped) m.unmapped_seq = ++unmapped_seq_;
      load(m);  // the file's path may soon name another file (or none): read it while it is the same
      m.mapped = false;
      next.push_back(std::move(m));
    }
    modules_ = std::move(next);
    mapped_.clear();
    unmapped_.clear();
    for (std::size_t i = 0; i < modules_.size(); ++i) (modules_[i].mapped ? mapped_ : unmapped_).push_back(i);
    std::sort(mapped_.begin(), mapped_.end(), module_order{&modules_, false});
    std::sort(unmapped_.begin(), unmapped_.end(), module_order{&modules_, true});
  }

  static std::string key_of(const module& m) {
    static const std::string no_path;
    return mapping_key(m.start, m.end, m.offset, m.inode,
                       m.kind == module_kind::anonymous && m.path == "//anon" ? no_path : m.path);
  }

  module make_module(const maps_entry& e) {
    module m;
    m.start = e.start;
    m.end = e.end;
    m.offset = e.offset;
    m.inode = e.inode;
    m.dev_major = e.dev_major;
    m.dev_minor = e.dev_minor;
    m.deleted = e.deleted;
    m.path = e.path;
    if (e.path.empty()) {
      m.kind = module_kind::anonymous;
      m.path = "//anon";
    } else if (e.path == "[vdso]") {
      m.kind = module_kind::vdso;
    } else if (e.path[0] == '[') {
      m.kind = e.path == "[vsyscall]" ? module_kind::special : module_kind::anonymous;
    }
    std::string::size_type slash = m.path.rfind('/');
    if (m.kind == module_kind::file)
      m.basename = slash == std::string::npos ? m.path : m.path.substr(slash + 1);
    else if (m.path.size() > 2 && m.path.front() == '[' && m.path.back() == ']')
      m.basename = m.path.substr(1, m.path.size() - 2);  // "[vdso]" names frames "[vdso+0x...]"
    else
      m.basename = m.path;
    if (m.kind == module_kind::file) m.symbols = file_symbols(e);
    if (m.kind == module_kind::vdso) m.symbols = vdso_symbols(e);
    if (!m.symbols || !m.symbols->pending) load(m);  // the bias is known now
    return m;
  }

  std::shared_ptr<module_symbols> file_symbols(const maps_entry& e) {
    auto [cached, fresh] = parsed_index_.try_emplace(file_key(e), parsed_.size());
    if (!fresh) return parsed_[cached->second];
    if (options_.shared_files) {
      auto [shared, first] = options_.shared_files->try_emplace(cached->first);
      if (!first) {
        parsed_.push_back(shared->second);
        return shared->second;
      }
      shared->second = std::make_shared<module_symbols>();
      parsed_.push_back(shared->second);
    } else {
      parsed_.push_back(std::make_shared<module_symbols>());
    }
    std::shared_ptr<module_symbols> result = parsed_.back();
    result->first_seen = e;
    const bool hidden = e.hidden_file();
    result->pending = !hidden && ::stat(e.path.c_str(), &result->stamp) == 0;
    if (!result->pending) read_file_symbols(*result);
    return result;
  }

  static bool same_stamp(const struct stat& a, const struct stat& b) {
    return a.st_dev == b.st_dev && a.st_ino == b.st_ino && a.st_size == b.st_size &&
           a.st_mtim.tv_sec == b.st_mtim.tv_sec && a.st_mtim.tv_nsec == b.st_mtim.tv_nsec;
  }

  // Reads the symbols of the file first seen in `result->first_seen` into `result`.
  void read_file_symbols(module_symbols& result) {
    const bool was_pending = std::exchange(result.pending, false);
    const maps_entry& e = result.first_seen;
    ++loaded_;
    // Deleted files and memfds are reachable through /proc/self/map_files (opening its entries needs
    // CAP_SYS_ADMIN, or CAP_CHECKPOINT_RESTORE since Linux 5.9; see proc(5)), else through a descriptor
    // we still hold; map_files also serves a file replaced on disk since it was mapped.
    char buffer[64];
    std::snprintf(buffer, sizeof buffer, "/proc/self/map_files/%llx-%llx",
                  static_cast<unsigned long long>(e.start), static_cast<unsigned long long>(e.end));
    std::string via_map_files = buffer;
    mapped_file file;
    if (was_pending) {
      struct stat now {};
      const bool same_path = ::stat(e.path.c_str(), &now) == 0;
      if (!same_path || !same_stamp(now, result.stamp)) {
        // Another file at the path now (an upgrade renames a new one over it): the mapped one may still
        // be reached through map_files. The same file changed in place: its old bytes are gone.
        const bool replaced =
            !same_path || now.st_ino != result.stamp.st_ino || now.st_dev != result.stamp.st_dev;
        status st = replaced ? file.open(via_map_files, e.inode) : status::error("rewritten in place");
        if (!st) {
          warn_no_symbols(
              e.path, status::error(e.path + ": changed on disk since it was mapped (" + st.message() + ")"));
          return;
        }
        load_from(file, e, false, result);
        return;
      }
    }
    const bool hidden = e.hidden_file();
    status st = file.open(hidden ? via_map_files : e.path, e.inode);
    if (!st && hidden) st = open_through_fd(e, file);
    if (!st && !hidden) st = file.open(via_map_files, e.inode);
    // Overlay file systems can report another inode in the maps than fstat does: last, trust the path.
    if (!st && !hidden) st = file.open(e.path);
    if (!st) {
      warn_no_symbols(e.path, st);
      return;
    }
    load_from(file, e, hidden, result);
  }

  // Parses the open `file` (the mapping `e`'s) into `result`.
  void load_from(mapped_file& file, const maps_entry& e, bool hidden, module_symbols& result) {
    elf_image image;
    status st = image.parse(file, e.path);
    if (st) load_elf(image, e.path, hidden, result);
    // Symbols of a file that changed while being read could mix two versions: none rather than wrong.
    if (status unchanged = file.check(); !unchanged) {
      maps_entry keep = e;
      result = module_symbols();
      result.first_seen = std::move(keep);
      st = unchanged;
    }
    if (!st) warn_no_symbols(e.path, st);
  }

  // Without the rights map_files needs, a memfd or deleted file is still readable through a
  // descriptor the process holds open (a JIT usually keeps its memfd): find it in /proc/self/fd.
  static status open_through_fd(const maps_entry& e, mapped_file& file) {
    DIR* dir = ::opendir("/proc/self/fd");
    if (dir == nullptr) return status::error(e.path + ": no readable descriptor");
    status st = status::error(e.path + ": not in map_files (permission) nor held open by this process");
    while (struct dirent* d = ::readdir(dir)) {
      if (d->d_name[0] < '0' || d->d_name[0] > '9') continue;
      std::string path = std::string("/proc/self/fd/") + d->d_name;
      struct stat sb;
      if (::stat(path.c_str(), &sb) != 0 || static_cast<std::uint64_t>(sb.st_ino) != e.inode ||
          major(sb.st_dev) != e.dev_major || minor(sb.st_dev) != e.dev_minor || !S_ISREG(sb.st_mode))
        continue;
      if (file.open(path, e.inode)) {
        st = status::ok();
        break;
      }
    }
    ::closedir(dir);
    return st;
  }

  std::shared_ptr<module_symbols> vdso_symbols(const maps_entry& e) {
    auto result = std::make_shared<module_symbols>();
    // The vdso is mapped whole and laid out as its file, so its section headers are in memory too.
    unsigned long base = ::getauxval(AT_SYSINFO_EHDR);
    if (base == 0 || base < e.start || base >= e.end || !e.readable) return result;
    elf_image image;
    byte_view bytes{reinterpret_cast<const unsigned char*>(base), static_cast<std::size_t>(e.end - base)};
    status st = image.parse(bytes, "[vdso]");
    if (st) load_elf(image, "[vdso]", true, *result);
    if (!st) warn_no_symbols("[vdso]", st);
    return result;
  }

  // Fills `out` from a parsed image: its .symtab (else the debug file's, else its MiniDebugInfo's),
  // .dynsym and PLT stubs.
  void load_elf(const elf_image& image, const std::string& path, bool no_debug_search, module_symbols& out) {
    out.elf_ok = true;
    out.segments = image.segments();
    out.build_id = image.build_id();
    std::size_t from_symtab = 0;
    if (const elf_section* symtab = image.find_section_type(SHT_SYMTAB))
      from_symtab = out.table.add_symbols(image, *symtab);
    if (from_symtab == 0) {
      debug_file debug;
      // A deleted or memory file has no directory for debuglink; build-id lookups still work.
      if (find_debug_file(options_.debug_roots, no_debug_search ? std::string() : path, image, debug)) {
        if (const elf_section* symtab = debug.image.find_section_type(SHT_SYMTAB))
          out.table.add_symbols(debug.image, *symtab);
        out.debug_path = debug.path;
        if (status unchanged = debug.file.check(); !unchanged) {  // could mix two versions: not used
          out.table = symbol_table();
          out.debug_path.clear();
          warn("selfprof: debug file not used: " + unchanged.message());
        }
      }
      // No debug file: the MiniDebugInfo some distributions embed names the local functions.
      std::string why;
      if (out.debug_path.empty() && add_minidebuginfo(image, path, out.table, why) == 0 && !why.empty())
        warn("selfprof: MiniDebugInfo (.gnu_debugdata) of " + path + " not read: " + why +
             "; its local functions are named [module+0xoffset]");
    }
    if (const elf_section* dynsym = image.find_section_type(SHT_DYNSYM))
      out.table.add_symbols(image, *dynsym);
    out.table.add_plt(image);
    out.table.finish();
  }

  module_registry_options options_;
  std::vector<module> modules_;
  std::vector<std::size_t> mapped_;                            // indices into modules_, by start address
  std::vector<std::size_t> unmapped_;                          // indices into modules_, latest unmapped first
  std::vector<std::shared_ptr<module_symbols>> parsed_;        // each file's symbols, parsed once
  std::unordered_map<std::string, std::size_t> parsed_index_;  // file_key -> index in parsed_
  std::vector<std::string> warnings_;
  std::string last_text_;
  std::pair<unsigned long long, unsigned long long> last_counters_{0, 0};
  std::uint64_t scans_ = 0;
  std::uint64_t reads_ = 0;
  std::uint64_t unmapped_seq_ = 0;
  std::size_t loaded_ = 0;
};

}  // namespace detail
}  // namespace selfprof
// ---- end selfprof/symbols/modules.hpp ----

#if SELFPROF_HAS_LIBDW
#include <dwarf.h>  // DW_TAG_* and DW_AT_* (elfutils' copy, installed with libdw-dev)
#include <elfutils/libdw.h>
#include <elfutils/libdwfl.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <unordered_map>
#include <utility>

// ---- begin selfprof/symbols/libdw_api.hpp ----
// The libdw and libelf functions dwarf_lines.hpp calls, as one table of function pointers: linked directly
// (the default), or, with SELFPROF_LIBDW_DLOPEN=1, loaded with dlopen("libdw.so.1") at the first DWARF
// lookup. The preload library uses the second: every process it is loaded into would otherwise map and
// relocate libdw, libelf and their compression libraries (about 0.9 ms of CPU per process here) to serve
// only in-process symbolization, which most short processes never do.
// Context: collector or dump thread (dlopen takes the loader lock; never the signal handler).


#if SELFPROF_HAS_LIBDW
#include <elfutils/libdw.h>
#include <elfutils/libdwfl.h>
#include <gelf.h>

// ---- begin selfprof/detail/dl_api.hpp ----
// Tables of an optional library's functions (libdw, zlib), filled either with the linked functions'
// addresses or, for a build that must not map the library in every process (the preload library), with
// dlsym() from dlopen(soname) at first use. One X-macro lists the functions; the table's members carry
// the functions' own names and types, so callers write `api.deflate(...)` as they would `deflate(...)`.
// Context: any thread except the signal handler (dlopen takes the loader lock).
//
//   #define MY_FUNCTIONS(X) X(deflate) X(deflateEnd)
//   struct my_api { MY_FUNCTIONS(SELFPROF_DL_MEMBER) bool ok = false; };
//   SELFPROF_DL_FILL_LINKED(a, MY_FUNCTIONS);                  // links the library
//   SELFPROF_DL_FILL_LOADED(a, MY_FUNCTIONS, "libz.so.1");     // does not; `ok` false if anything is missing
//
// The handle is never closed: the pointers may be used at any later time.

#include <dlfcn.h>

#define SELFPROF_DL_MEMBER(name) decltype(&::name) name = nullptr;
#define SELFPROF_DL_LINK(name) dl_table.name = &::name;
#define SELFPROF_DL_LOOKUP(name)                                                  \
  dl_table.name = reinterpret_cast<decltype(&::name)>(::dlsym(dl_handle, #name)); \
  dl_all = dl_all && dl_table.name != nullptr;

#define SELFPROF_DL_FILL_LINKED(api, FUNCTIONS) \
  do {                                          \
    auto& dl_table = (api);                     \
    FUNCTIONS(SELFPROF_DL_LINK)                 \
    dl_table.ok = true;                         \
  } while (false)

// dlsym with a handle also searches the library's dependencies (libdw's handle finds libelf's functions).
#define SELFPROF_DL_FILL_LOADED(api, FUNCTIONS, soname)                \
  do {                                                                 \
    auto& dl_table = (api);                                            \
    void* const dl_handle = ::dlopen((soname), RTLD_NOW | RTLD_LOCAL); \
    bool dl_all = dl_handle != nullptr;                                \
    if (dl_handle != nullptr) {                                        \
      FUNCTIONS(SELFPROF_DL_LOOKUP)                                    \
    }                                                                  \
    dl_table.ok = dl_all;                                              \
  } while (false)
// ---- end selfprof/detail/dl_api.hpp ----

namespace selfprof {
namespace detail {

// X(name) for each function used; the table's members carry the functions' own names and types.
// clang-format off
#define SELFPROF_LIBDW_FUNCTIONS(X) \
  X(dwarf_attr) X(dwarf_attr_integrate) X(dwarf_child) X(dwarf_dieoffset) X(dwarf_diename) \
  X(dwarf_filesrc) X(dwarf_formstring) X(dwarf_formudata) X(dwarf_getsrc_die) X(dwarf_getsrcfiles) \
  X(dwarf_haschildren) X(dwarf_lineno) X(dwarf_linesrc) X(dwarf_ranges) X(dwarf_siblingof) \
  X(dwarf_tag) X(dwfl_begin) X(dwfl_end) X(dwfl_module_addrdie) X(dwfl_module_getdwarf) \
  X(dwfl_module_info) X(dwfl_report_begin) X(dwfl_report_end) X(dwfl_report_module) X(elf_begin) \
  X(elf_end) X(elf_getphdrnum) X(elf_version) X(gelf_getphdr)
// clang-format on

struct libdw_api {
  SELFPROF_LIBDW_FUNCTIONS(SELFPROF_DL_MEMBER)
  bool ok = false;  // every member is set
};

// Filled once, on first use. Loaded with dlopen, `ok` is false (and DWARF lookups find nothing) when
// libdw.so.1 is missing or lacks a function.
inline const libdw_api& libdw() {
  static const libdw_api api = [] {
    libdw_api a;
#if SELFPROF_LIBDW_DLOPEN
    SELFPROF_DL_FILL_LOADED(a, SELFPROF_LIBDW_FUNCTIONS, "libdw.so.1");
#else
    SELFPROF_DL_FILL_LINKED(a, SELFPROF_LIBDW_FUNCTIONS);
#endif
    return a;
  }();
  return api;
}
#undef SELFPROF_LIBDW_FUNCTIONS

}  // namespace detail
}  // namespace selfprof

#endif  // SELFPROF_HAS_LIBDW
// ---- end selfprof/symbols/libdw_api.hpp ----
#endif

namespace selfprof {
namespace detail {

// One level of the source chain of an address.
struct source_frame {
  std::string function;    // demangled DWARF name (linkage name when present); empty when unnamed
  std::string file;        // source file as DWARF records it (absolute when the compile dir is known)
  std::uint32_t line = 0;  // 0 when unknown
  bool inlined = false;    // true for an inlined callee; false for the real (outermost) function
};

// The source chain of an address, outermost first: the real function, whose file:line is the call
// site of the first inlined callee (or the address's own line when nothing is inlined there), then each
// inlined callee with the file:line of the call into the next, the innermost with the address's line.
using source_chain = std::vector<source_frame>;

#if SELFPROF_HAS_LIBDW

// Largest number of inlined levels reported for one address; deeper nesting loses its outermost levels.
// Real code stays far below (GCC's inline depth limit is in the tens); the bound only stops a corrupt
// parent chain.
constexpr std::size_t dwarf_max_inline_depth = 1024;
// Most function DIEs indexed per compile unit; past it a unit's remaining functions get no inline frames.
constexpr std::size_t dwarf_max_cu_functions = std::size_t{1} << 24;

// DIE tags of code that has a name and source position: real functions and inlined instances.
inline bool dwarf_is_function(int tag) {
  return tag == DW_TAG_subprogram || tag == DW_TAG_inlined_subroutine || tag == DW_TAG_entry_point;
}

// The functions of one compile unit laid out by address, built once per unit on its first lookup:
// libdw's dwarf_getscopes re-walks the whole unit on every call (measured: 14 ms a lookup in a unit
// that includes all of selfprof), this answers in O(log n).
struct dwarf_cu_index {
  struct function {
    Dwarf_Die die;        // DW_TAG_subprogram, DW_TAG_inlined_subroutine or DW_TAG_entry_point
    std::int32_t parent;  // enclosing function in the DIE tree (what addr2line -i follows), -1 at the top
  };
  struct segment {
    Dwarf_Addr start;    // the segment runs to the next one's start
    std::int32_t owner;  // the deepest function whose ranges hold it, -1 for none
  };
  std::vector<function> functions;
  std::vector<segment> segments;  // sorted by start

  // The deepest function holding `pc`, or -1.
  std::int32_t find(Dwarf_Addr pc) const {
    auto it = std::upper_bound(segments.begin(), segments.end(), pc,
                               [](Dwarf_Addr a, const segment& s) { return a < s.start; });
    return it == segments.begin() ? -1 : (it - 1)->owner;
  }

  void build(Dwarf_Die* cu) {
    struct interval {
      Dwarf_Addr low, high;
      int depth;
      std::int32_t function;
    };
    struct pending {
      Dwarf_Die die;
      int depth;
      std::int32_t parent;
    };
    std::vector<interval> intervals;
    std::vector<pending> stack;
    Dwarf_Die first;
    if (libdw().dwarf_child(cu, &first) == 0) stack.push_back(pending{first, 1, -1});
    while (!stack.empty() && functions.size() < dwarf_max_cu_functions) {
      pending at = stack.back();
      stack.pop_back();
      Dwarf_Die next;
      if (libdw().dwarf_siblingof(&at.die, &next) == 0) stack.push_back(pending{next, at.depth, at.parent});
      int tag = libdw().dwarf_tag(&at.die);
      std::int32_t parent = at.parent;
      if (dwarf_is_function(tag)) {
        parent = static_cast<std::int32_t>(functions.size());
        functions.push_back(function{at.die, at.parent});
        Dwarf_Addr base = 0, low = 0, high = 0;
        for (std::ptrdiff_t off = 0; (off = libdw().dwarf_ranges(&at.die, off, &base, &low, &high)) > 0;)
          if (high > low) intervals.push_back(interval{low, high, at.depth, parent});
      }
      // Code lives in functions, blocks, and functions nested in namespaces and classes; types,
      // variables and parameters hold none, so their subtrees are skipped.
      bool may_hold_code = dwarf_is_function(tag) || tag == DW_TAG_lexical_block || tag == DW_TAG_namespace ||
                           tag == DW_TAG_class_type || tag == DW_TAG_structure_type ||
                           tag == DW_TAG_union_type || tag == DW_TAG_module;
      Dwarf_Die child;
      if (may_hold_code && libdw().dwarf_haschildren(&at.die) > 0 &&
          libdw().dwarf_child(&at.die, &child) == 0)
        stack.push_back(pending{child, at.depth + 1, parent});
    }
    // Sweep the range boundaries; the deepest interval active over each elementary piece owns it.
    std::vector<Dwarf_Addr> bounds;
    for (const auto& i : intervals) {
      bounds.push_back(i.low);
      bounds.push_back(i.high);
    }
    std::sort(bounds.begin(), bounds.end());
    bounds.erase(std::unique(bounds.begin(), bounds.end()), bounds.end());
    std::sort(intervals.begin(), intervals.end(),
              [](const interval& a, const interval& b) { return a.low < b.low; });
    auto shallower = [](const interval& a, const interval& b) {
      return a.depth != b.depth ? a.depth < b.depth
                                : a.low < b.low;  // ties: the later start is the inner one
    };
    std::vector<interval> active;  // a heap, the deepest on top (what std::priority_queue would do)
    std::size_t next = 0;
    for (Dwarf_Addr b : bounds) {
      while (next < intervals.size() && intervals[next].low <= b) {
        active.push_back(intervals[next++]);
        std::push_heap(active.begin(), active.end(), shallower);
      }
      while (!active.empty() && active.front().high <= b) {  // lazily drops ended intervals
        std::pop_heap(active.begin(), active.end(), shallower);
        active.pop_back();
      }
      // An ended interval under a deeper active one is dropped when it surfaces: check the top only.
      std::int32_t owner = active.empty() ? -1 : active.front().function;
      if (segments.empty() || segments.back().owner != owner) segments.push_back(segment{b, owner});
    }
  }
};

class dwarf_lines {
 public:
  static constexpr bool enabled = true;

  dwarf_lines() = default;
  explicit dwarf_lines(std::vector<std::string> debug_roots, lines_mode mode = lines_mode::automatic)
      : debug_roots_(std::move(debug_roots)), mode_(mode) {}

  // Which files later lookups read (files already opened or skipped stay so).
  void set_mode(lines_mode mode) { mode_ = mode; }

  // The source chain of `vaddr` (an ELF virtual address of module `m`'s file, i.e. the run-time
  // address minus the module's bias), or nullptr when no DWARF covers it. The pointer stays valid for
  // the lifetime of this object.
  const source_chain* lookup(const module& m, std::uint64_t vaddr) {
    if (mode_ == lines_mode::none || m.kind != module_kind::file || !m.symbols || !m.symbols->elf_ok ||
        !libdw().ok)
      return nullptr;
    dwarf_file* file = file_for(m);  // heap-allocated: Dwfl keeps pointers to its callbacks and userdata
    if (file == nullptr || !file->has_dwarf) {
      if (file != nullptr && !file->skipped.empty() &&
          std::find(noted_.begin(), noted_.end(), file) == noted_.end()) {
        noted_.push_back(file);
        warnings_.push_back(file->skipped);
      }
      return nullptr;
    }
    auto cached = file->chains.find(vaddr);
    if (cached != file->chains.end()) return cached->second.empty() ? nullptr : &cached->second;
    ++queries_;
    source_chain& chain = file->chains[vaddr];
    query(*file, vaddr, chain);
    return chain.empty() ? nullptr : &chain;
  }

  std::size_t files_opened() const { return files_opened_; }  // module files given a Dwfl session
  std::size_t files_with_dwarf() const { return files_with_dwarf_; }
  std::size_t queries() const { return queries_; }              // lookups that reached libdw (cache misses)
  std::size_t files_skipped() const { return files_skipped_; }  // compressed DWARF left unread
  // One line per skipped file that lookups reached since the last call, for a profile's notes.
  std::vector<std::string> take_warnings() {
    noted_.clear();
    return std::exchange(warnings_, {});
  }

 private:
  struct dwarf_file {
    std::shared_ptr<module_symbols> symbols;  // keeps the cache key alive; holds debug_path
    Elf* elf = nullptr;  // the file with the DWARF, read with pread, until find_elf gives it to Dwfl
    int fd = -1;         // its descriptor, likewise
    Dwfl_Callbacks callbacks{};
    Dwfl* dwfl = nullptr;
    Dwfl_Module* mod = nullptr;
    bool has_dwarf = false;
    std::string skipped;  // why its DWARF was left unread (lines_mode), else empty
    std::unordered_map<std::uint64_t, source_chain> chains;
    std::unordered_map<Dwarf_Off, dwarf_cu_index> units;  // by the compile unit DIE's offset

    dwarf_file() = default;
    dwarf_file(const dwarf_file&) = delete;
    dwarf_file& operator=(const dwarf_file&) = delete;
    ~dwarf_file() {
      if (dwfl != nullptr) libdw().dwfl_end(dwfl);
      if (elf != nullptr) libdw().elf_end(elf);
      if (fd >= 0) sys().close(fd);
    }
  };

  // The Dwfl session of m's file, opened on first use (remembered, so a module without debug info
  // costs one attempt); has_dwarf is false when the file cannot be read, has no DWARF or was skipped.
  dwarf_file* file_for(const module& m) {
    auto it = files_.find(m.symbols.get());
    if (it == files_.end()) it = files_.emplace(m.symbols.get(), open_file(m)).first;
    return it->second.get();
  }

  std::unique_ptr<dwarf_file> open_file(const module& m) {
    auto file = std::make_unique<dwarf_file>();
    file->symbols = m.symbols;
    // A deleted file or memfd is reachable only through map_files while mapped (see modules.hpp).
    bool hidden = m.deleted || m.path.compare(0, 7, "/memfd:") == 0, readable = false;
    char buffer[64];
    std::snprintf(buffer, sizeof buffer, "/proc/self/map_files/%llx-%llx",
                  static_cast<unsigned long long>(m.start), static_cast<unsigned long long>(m.end));
    std::string path = hidden ? std::string(buffer) : m.path, search = hidden ? std::string() : m.path;
    bool compressed = false;
    std::string from =
        dwarf_source_path(debug_roots_, path, m.inode, search, m.symbols->debug_path, readable, compressed);
    if (!readable && !hidden) {
      path = buffer;
      from =
          dwarf_source_path(debug_roots_, path, m.inode, search, m.symbols->debug_path, readable, compressed);
    }
    if (!readable) return file;
    if (compressed && mode_ == lines_mode::automatic) {
      ++files_skipped_;
      file->skipped = "no file:line or inline frames for " + m.basename + ": its DWARF (" + from +
                      ") is compressed, and libdw inflates all of it first (SELFPROF_LINES=all reads it)";
      return file;
    }
    ++files_opened_;
    // libdwfl would map the file itself (ELF_C_READ_MMAP_PRIVATE), and a mapped file truncated in place
    // raises SIGBUS: the file with the DWARF is opened here with ELF_C_READ (pread) and given to Dwfl as
    // the module's ELF by find_elf, so nothing needs find_debuginfo.
    // The session, and so the descriptor, lives as long as the cache: above the application's range, where
    // a program that closes or reuses its low descriptors cannot take it from under libdw.
    if (!from.empty()) file->fd = keep_fd_high(open_regular_file(from, from == path ? m.inode : 0));
    if (file->fd >= 0 && libdw().elf_version(EV_CURRENT) != EV_NONE)  // elf_begin fails before elf_version
      file->elf = libdw().elf_begin(file->fd, ELF_C_READ, nullptr);
    Dwarf_Addr low = 0, high = 0;
    if (!load_span(file->elf, low, high)) return file;
    file->callbacks.find_elf = &dwarf_lines::find_elf;
    file->callbacks.find_debuginfo = &dwarf_lines::no_debuginfo;
    file->dwfl = libdw().dwfl_begin(&file->callbacks);
    if (file->dwfl == nullptr) return file;
    libdw().dwfl_report_begin(file->dwfl);
    // Spanning the PT_LOAD segments from the first one's aligned address gives a zero bias: Dwfl
    // addresses are the file's own virtual addresses (ET_DYN and ET_EXEC).
    file->mod = libdw().dwfl_report_module(file->dwfl, m.basename.c_str(), low, high);
    libdw().dwfl_report_end(file->dwfl, nullptr, nullptr);
    if (file->mod == nullptr) return file;
    void** userdata = nullptr;
    libdw().dwfl_module_info(file->mod, &userdata, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr);
    if (userdata != nullptr) *userdata = file.get();
    Dwarf_Addr bias = 0;
    file->has_dwarf = libdw().dwfl_module_getdwarf(file->mod, &bias) != nullptr;
    if (file->has_dwarf) ++files_with_dwarf_;
    return file;
  }

  // The addresses of `elf`'s PT_LOAD segments, from the first one's start aligned down as libdwfl aligns
  // it; false when there are none.
  static bool load_span(Elf* elf, Dwarf_Addr& low, Dwarf_Addr& high) {
    std::size_t count = 0;
    if (elf == nullptr || libdw().elf_getphdrnum(elf, &count) != 0) return false;
    for (std::size_t i = 0; i < count; ++i) {
      GElf_Phdr ph;
      if (libdw().gelf_getphdr(elf, static_cast<int>(i), &ph) == nullptr || ph.p_type != PT_LOAD) continue;
      if (high == 0) low = ph.p_vaddr & ~(ph.p_align - 1);
      high = std::max<Dwarf_Addr>(high, ph.p_vaddr + ph.p_memsz);
    }
    return high > low;
  }

  // Dwfl's find_elf callback: gives Dwfl the file open_file opened (Dwfl takes the Elf and descriptor).
  static int find_elf(Dwfl_Module*, void** userdata, const char*, Dwarf_Addr, char**, Elf** elfp) {
    if (userdata == nullptr || *userdata == nullptr) return -1;
    auto& file = *static_cast<dwarf_file*>(*userdata);
    *elfp = std::exchange(file.elf, nullptr);
    return std::exchange(file.fd, -1);
  }
  // Dwfl's find_debuginfo callback: the file given by find_elf holds the DWARF; there is no other.
  static int no_debuginfo(Dwfl_Module*, void**, const char*, Dwarf_Addr, const char*, const char*, GElf_Word,
                          char**) {
    return -1;
  }

  // Fills `chain` (outermost first) for `vaddr`; leaves it empty when no DWARF covers the address.
  static void query(dwarf_file& file, std::uint64_t vaddr, source_chain& chain) {
    Dwarf_Addr bias = 0;
    Dwarf_Die* cu = libdw().dwfl_module_addrdie(file.mod, vaddr, &bias);
    if (cu == nullptr) return;
    const Dwarf_Addr pc = vaddr - bias;
    Dwarf_Attribute comp_attr;
    const char* comp_dir = libdw().dwarf_formstring(libdw().dwarf_attr(cu, DW_AT_comp_dir, &comp_attr));

    // The innermost location: the line table row of the address.
    source_frame innermost;
    if (Dwarf_Line* row = libdw().dwarf_getsrc_die(cu, pc)) {
      if (const char* name = libdw().dwarf_linesrc(row, nullptr, nullptr))
        innermost.file = source_path(name, comp_dir);
      int line = 0;
      if (libdw().dwarf_lineno(row, &line) == 0 && line > 0)
        innermost.line = static_cast<std::uint32_t>(line);
    }

    // The deepest function holding pc, then its parents in the DIE tree, as addr2line -i walks them
    // (a nested inlined call can hold pc where its parent's ranges do not, seen with GCC -O2).
    auto unit = file.units.find(libdw().dwarf_dieoffset(cu));
    if (unit == file.units.end()) {
      unit = file.units.emplace(libdw().dwarf_dieoffset(cu), dwarf_cu_index()).first;
      unit->second.build(cu);
    }
    const dwarf_cu_index& index = unit->second;
    std::vector<source_frame> inner_first;  // the chain, innermost first
    Dwarf_Files* files = nullptr;
    std::size_t nfiles = 0;
    bool have_files = false, files_tried = false;
    source_frame current = innermost;  // the location inside the scope being visited
    std::int32_t at = index.find(pc);
    for (std::size_t level = 0; at >= 0 && level < dwarf_max_inline_depth; ++level) {
      Dwarf_Die die = index.functions[static_cast<std::size_t>(at)].die;
      at = index.functions[static_cast<std::size_t>(at)].parent;
      Dwarf_Die* scope = &die;
      int tag = libdw().dwarf_tag(scope);
      current.function = function_name(scope);
      current.inlined = tag == DW_TAG_inlined_subroutine;
      if (!current.inlined) {
        inner_first.push_back(std::move(current));
        break;
      }
      // The caller's location is where this inlined instance was called from.
      source_frame caller;
      Dwarf_Attribute attr;
      Dwarf_Word value = 0;
      if (libdw().dwarf_formudata(libdw().dwarf_attr(scope, DW_AT_call_file, &attr), &value) == 0) {
        if (!files_tried) {
          files_tried = true;
          have_files = libdw().dwarf_getsrcfiles(cu, &files, &nfiles) == 0;
        }
        if (have_files && value < nfiles)
          if (const char* name =
                  libdw().dwarf_filesrc(files, static_cast<std::size_t>(value), nullptr, nullptr))
            caller.file = source_path(name, comp_dir);
      }
      if (libdw().dwarf_formudata(libdw().dwarf_attr(scope, DW_AT_call_line, &attr), &value) == 0 &&
          value <= UINT32_MAX)
        caller.line = static_cast<std::uint32_t>(value);
      inner_first.push_back(std::move(current));
      current = std::move(caller);
    }
    if (inner_first.empty() || inner_first.back().inlined) {
      // No enclosing real function in the DWARF (assembly with line info only, or a cut walk): the
      // outermost level is the location reached so far, unnamed.
      current.inlined = false;
      if (!current.file.empty() || current.line != 0 || !inner_first.empty())
        inner_first.push_back(std::move(current));
    }
    chain.assign(std::make_move_iterator(inner_first.rbegin()), std::make_move_iterator(inner_first.rend()));
  }

  // libdw joins a file name with its line-table directory but leaves a relative directory (a file
  // compiled as `cc ../src/x.c`) relative; addr2line then prefixes the compile directory: so do we.
  static std::string source_path(const char* name, const char* comp_dir) {
    if (name[0] == '/' || comp_dir == nullptr || comp_dir[0] == '\0') return name;
    std::string out = comp_dir;
    if (out.back() != '/') out += '/';
    return out + name;
  }

  // Demangled linkage name (following abstract origin and specification), else the plain DWARF name.
  static std::string function_name(Dwarf_Die* die) {
    Dwarf_Attribute attr;
    const char* linkage =
        libdw().dwarf_formstring(libdw().dwarf_attr_integrate(die, DW_AT_linkage_name, &attr));
    if (linkage == nullptr)
      linkage = libdw().dwarf_formstring(libdw().dwarf_attr_integrate(die, DW_AT_MIPS_linkage_name, &attr));
    if (linkage != nullptr) return demangle(linkage);
    const char* name = libdw().dwarf_diename(die);
    return name != nullptr ? std::string(name) : std::string();
  }

  std::vector<std::string> debug_roots_{"/usr/lib/debug"};
  lines_mode mode_ = lines_mode::automatic;
  std::map<const module_symbols*, std::unique_ptr<dwarf_file>> files_;
  std::vector<std::string> warnings_;
  std::vector<dwarf_file*> noted_;  // files whose `skipped` is in the warnings not yet taken
  std::size_t files_skipped_ = 0;
  std::size_t files_opened_ = 0;
  std::size_t files_with_dwarf_ = 0;
  std::size_t queries_ = 0;
};

#else  // !SELFPROF_HAS_LIBDW

// Without libdw: no source lines, no inline frames; the symbolizer names functions from ELF symbols.
class dwarf_lines {
 public:
  static constexpr bool enabled = false;
  dwarf_lines() = default;
  explicit dwarf_lines(const std::vector<std::string>&, lines_mode = lines_mode::automatic) {}
  void set_mode(lines_mode) {}
  const source_chain* lookup(const module&, std::uint64_t) { return nullptr; }
  std::size_t files_skipped() const { return 0; }
  std::vector<std::string> take_warnings() { return {}; }
  std::size_t files_opened() const { return 0; }
  std::size_t files_with_dwarf() const { return 0; }
  std::size_t queries() const { return 0; }
};

#endif  // SELFPROF_HAS_LIBDW

}  // namespace detail
}  // namespace selfprof
// ---- end selfprof/symbols/dwarf_lines.hpp ----
// ---- begin selfprof/symbols/kernel_symbols.hpp ----
// Names of kernel code addresses from /proc/kallsyms, for the kernel call chains the ring source records
// where kernel sampling is permitted (root, CAP_PERFMON, perf_event_paranoid <= 1). Read once, on the
// first kernel address looked up: a profile without kernel frames never reads the file (about 120,000
// lines, a few MB). Where the kernel hides its addresses (kptr_restrict: every address reads as 0) a
// kernel frame is named "[kernel]".
// Context: any thread (never the signal handler); not thread-safe (one per symbolizer).
//
// The file is streamed, never held whole. A dump that knows its kernel addresses first (prepare) keeps
// only the symbol that names each of them, not 120,000: a short process's exit dump then pays little
// more than the kernel's own formatting of the text (docs/measurements.md).

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>
#include <string_view>
#include <vector>


namespace selfprof {
namespace detail {

// Most bytes of /proc/kallsyms read (it is ~5 MB with many modules loaded); symbols past it are unnamed.
constexpr std::size_t kKallsymsMaxBytes = std::size_t{64} << 20;
// A kernel address further than this past the nearest symbol below it is not named by that symbol.
constexpr std::uint64_t kKernelSymbolReach = std::uint64_t{1} << 20;

// Appends the kernel addresses the stacks of `table` are looked up at: the interrupted pc as it is, a
// return address less one (as dump/symbolize.hpp's stacks_from_table looks them up).
inline void append_kernel_lookups(const stack_table& table, std::vector<std::uint64_t>& out) {
  for (const auto& e : table.entries()) {
    const std::uint64_t* pcs = table.pcs(e);
    for (std::size_t i = 0; i < e.depth; ++i) {
      const std::uint64_t lookup = i == 0 ? pcs[0] : pcs[i] - 1;
      if (is_kernel_address(lookup)) out.push_back(lookup);
    }
  }
}

class kernel_symbols {
 public:
  explicit kernel_symbols(std::string path = "/proc/kallsyms") : path_(std::move(path)) {}

  // The frame of kernel address `address`: its symbol (kind kernel, module "[kernel.kallsyms]" or the
  // module's "[name]"), else "[kernel]". An address prepare() was not given reads the whole table.
  frame resolve(std::uint64_t address) {
    if (!loaded_ || (!prepared_.empty() && !std::binary_search(prepared_.begin(), prepared_.end(), address)))
      load(path_.c_str());
    frame f;
    f.kind = frame_kind::kernel;
    f.address = address;
    f.module = "[kernel.kallsyms]";
    auto it = std::upper_bound(symbols_.begin(), symbols_.end(), address,
                               [](std::uint64_t a, const symbol& s) { return a < s.address; });
    if (it == symbols_.begin() || address - (it - 1)->address > kKernelSymbolReach) {
      f.name = "[kernel]";
      return f;
    }
    const symbol& s = *(it - 1);
    f.name.assign(names_, s.name, s.name_size);
    f.module_offset = address - s.address;
    if (s.module_size) f.module = "[" + names_.substr(s.module, s.module_size) + "]";
    return f;
  }

  // Reads the text symbols of `path` (kallsyms format: "address type name [module]"); an unreadable file or
  // hidden addresses leave the table empty. Public for tests.
  void load(const char* path) {
    reset();
    for_each_file_line(path, kKallsymsMaxBytes, [&](std::string_view line) {
      std::uint64_t address;
      std::string_view name, module;
      if (parse_line(line, address, name, module)) add(address, name, module);
    });
    std::stable_sort(symbols_.begin(), symbols_.end(),
                     [](const symbol& a, const symbol& b) { return a.address < b.address; });
  }

  // Reads only what names `addresses` (kernel addresses of one dump): for each, the nearest text
  // symbol at or below it, as load() would find it. resolve() of another address reads the whole file
  // and keeps it: a process that dumps again and again reads the file twice, not at every dump. Does
  // nothing once the file was read.
  void prepare(std::vector<std::uint64_t> addresses) {
    if (loaded_) return;
    std::sort(addresses.begin(), addresses.end());
    addresses.erase(std::unique(addresses.begin(), addresses.end()), addresses.end());
    if (addresses.empty()) return;
    reset();
    // best[j]: the highest symbol in (addresses[j-1], addresses[j]], so the answer for addresses[j] is
    // the last best[k] found for k <= j. One slot changes per line, whatever the order of the file.
    struct slot {
      bool set = false;
      std::uint64_t address = 0;
      std::string name, module;
    };
    std::vector<slot> best(addresses.size());
    for_each_file_line(path_.c_str(), kKallsymsMaxBytes, [&](std::string_view line) {
      std::uint64_t address;
      std::string_view name, module;
      if (!parse_line(line, address, name, module)) return;
      const auto j = static_cast<std::size_t>(std::lower_bound(addresses.begin(), addresses.end(), address) -
                                              addresses.begin());
      if (j == best.size() || (best[j].set && address < best[j].address)) return;
      best[j].set = true;  // an equal address replaces: the last one listed wins, as in load()
      best[j].address = address;
      best[j].name.assign(name);
      best[j].module.assign(module);
    });
    for (const slot& b : best)  // in address order: the slots' ranges follow each other
      if (b.set) add(b.address, b.name, b.module);
    prepared_ = std::move(addresses);
  }

  std::size_t size() const { return symbols_.size(); }

 private:
  struct symbol {
    std::uint64_t address;
    std::uint32_t name, module;  // offsets into names_
    std::uint16_t name_size, module_size;
  };

  void reset() {
    loaded_ = true;
    prepared_.clear();
    symbols_.clear();
    names_.clear();
    last_module_ = last_module_size_ = 0;
  }

  // A text symbol's line: "ffffffff81000000 T _text" or "ffffffffc0a01000 t fn\t[module]".
  static bool parse_line(std::string_view line, std::uint64_t& address, std::string_view& rest,
                         std::string_view& module) {
    std::size_t at = 0;  // past the address and its space
    address = 0;
    if (!parse_hex_field(line, at, ' ', address) || line.size() < at + 3) return false;
    const char type = line[at];
    if (address == 0 || line[at + 1] != ' ' || !(type == 't' || type == 'T' || type == 'w' || type == 'W'))
      return false;
    rest = line.substr(at + 2);
    module = {};
    const std::size_t tab = rest.find('\t');
    if (tab != std::string_view::npos) {
      module = rest.substr(tab + 1);
      rest = rest.substr(0, tab);
      if (module.size() >= 2 && module.front() == '[' && module.back() == ']')
        module = module.substr(1, module.size() - 2);
      else
        module = {};
    }
    return !rest.empty() && rest.size() <= 0xffff && module.size() <= 0xffff;
  }

  void add(std::uint64_t address, std::string_view rest, std::string_view module) {
    if (names_.size() > 0xfffe0000u) return;
    symbol s{address, static_cast<std::uint32_t>(names_.size()), 0, static_cast<std::uint16_t>(rest.size()),
             0};
    names_.append(rest);
    if (!module.empty()) {  // a module's symbols are listed together: its name is stored once
      if (std::string_view(names_).substr(last_module_, last_module_size_) != module) {
        last_module_ = static_cast<std::uint32_t>(names_.size());
        last_module_size_ = static_cast<std::uint16_t>(module.size());
        names_.append(module);
      }
      s.module = last_module_;
      s.module_size = last_module_size_;
    }
    symbols_.push_back(s);
  }

  std::string path_;
  bool loaded_ = false;
  std::vector<std::uint64_t> prepared_;  // sorted: the addresses prepare() read for (empty: all)
  std::uint32_t last_module_ = 0;
  std::uint16_t last_module_size_ = 0;
  std::vector<symbol> symbols_;  // by address
  std::string names_;
};

}  // namespace detail
}  // namespace selfprof
// ---- end selfprof/symbols/kernel_symbols.hpp ----

namespace selfprof {

// Executable memory mapped at the last module scan; anonymous (no file: JIT code) or from a file.
struct code_range {
  std::uint64_t start = 0, end = 0;
  bool anonymous = false;
};

struct symbolizer_options {
  // Roots searched for separate debug files: <root>/.build-id/xx/rest.debug and <root>/<module dir>/<link>.
  std::vector<std::string> debug_roots{"/usr/lib/debug"};
  // perf map naming JIT code; empty means /tmp/perf-<getpid()>.map. Set use_perf_map to false to skip it.
  std::string perf_map_path;
  bool use_perf_map = true;
  std::string maps_path = "/proc/self/maps";
  // Which DWARF gives file:line and inline frames (modes.hpp): by default not compressed DWARF.
  lines_mode lines = lines_mode::automatic;
};

class symbolizer {
 public:
  symbolizer() : symbolizer(symbolizer_options()) {}
  explicit symbolizer(symbolizer_options options)
      : modules_(detail::module_registry_options{options.debug_roots, options.maps_path, nullptr}),
        perf_map_(options.perf_map_path),
        use_perf_map_(options.use_perf_map),
        dwarf_(options.debug_roots, options.lines) {}

  // Snapshots the modules mapped now (parsing the symbols of new ones); keeps unmapped ones. Cheap when
  // no library was loaded or unloaded since the last call: meant to run every ~100 ms while profiling.
  void refresh() {
    modules_.refresh();
    refreshed_ = true;
    rescanned_on_miss_ = false;
    perf_map_checked_ = false;
  }

  // Re-reads the maps even when no library came or went (a file or JIT code mapped directly): what is
  // mapped now is recorded, with its symbols, so it is still named after it is unmapped. Returns true
  // when the module set changed.
  bool rescan() {
    refreshed_ = true;
    perf_map_checked_ = false;
    return modules_.rescan();
  }

  // The executable ranges mapped at the last refresh()/rescan(), by start address.
  std::vector<code_range> code_ranges() const {
    std::vector<code_range> out;
    for (const detail::module& m : modules_.modules())
      if (m.mapped) out.push_back(code_range{m.start, m.end, m.kind == detail::module_kind::anonymous});
    std::sort(out.begin(), out.end(),
              [](const code_range& a, const code_range& b) { return a.start < b.start; });
    return out;
  }

  void abandon_after_fork() { perf_map_.abandon_after_fork(); }

  // Appends the frames for one address, outermost first: one frame, or with libdw the real function
  // (kind native, file:line of its call into the first inlined callee) then each inlined callee (kind
  // inlined) down to the innermost, as `addr2line -f -C -i` lists them bottom up.
  // `address` is what to look up: callers pass pc-1 for return addresses.
  void resolve(std::uint64_t address, std::vector<frame>& out) {
    if (detail::is_kernel_address(address)) {  // a kernel call chain's frame (the ring source, as root)
      out.push_back(kernel_.resolve(address));
      return;
    }
    {
      frame jit;  // code registered with selfprof::jit, named by what was there when the sample was taken
      if (detail::jit_name_tagged(address, jit)) {
        out.push_back(std::move(jit));
        return;
      }
    }
    if (!refreshed_) refresh();
    detail::perf_map::hit line;
    if (detail::is_perf_map_tagged(address)) {
      // Named while sampling by the perf map line current then, unless the code is in a file after all.
      if (!perf_map_.name_tagged(address, line)) {
        frame unknown;
        unknown.name = "[unknown]";
        out.push_back(std::move(unknown));
        return;
      }
      address = line.address;
      const detail::module* in = modules_.find(address);
      if (in == nullptr || in->kind == detail::module_kind::anonymous) {
        out.push_back(jit_frame(line, address));
        return;
      }
    }
    const detail::module* m = modules_.find(address);
    if (m == nullptr && !rescanned_on_miss_) {
      // Mapped without the loader since the last refresh (JIT code, mmap): look once per refresh.
      rescanned_on_miss_ = true;
      modules_.rescan();
      m = modules_.find(address);
    }
    frame f;
    f.address = address;
    if (m == nullptr || m->kind == detail::module_kind::anonymous) {
      if (resolve_jit(address, f)) {
        out.push_back(std::move(f));
        return;
      }
      f.name = "[unknown]";
      if (m != nullptr) {
        f.module = m->path;
        f.module_offset = address - m->start;
      }
      out.push_back(std::move(f));
      return;
    }
    f.module = m->path;
    f.module_offset = address - m->bias;
    detail::symbol_table::hit hit;
    const bool named = m->symbols && m->symbols->table.lookup(f.module_offset, hit);
    if (named) {
      f.name = m->symbols->table.name(hit.index);
    } else {
      char offset[32];
      std::snprintf(offset, sizeof offset, "+0x%llx]", static_cast<unsigned long long>(f.module_offset));
      f.name = "[" + m->basename + offset;
    }
    if (const detail::source_chain* chain = dwarf_.lookup(*m, f.module_offset)) {
      append_source_chain(*chain, named, std::move(f), out);
      return;
    }
    out.push_back(std::move(f));
  }

  // The kernel addresses a dump will resolve (before the first resolve): the first dump reads only
  // what names them from /proc/kallsyms (kernel_symbols::prepare).
  void prepare_kernel(std::vector<std::uint64_t> addresses) { kernel_.prepare(std::move(addresses)); }

  // Convenience for one frame: the real function holding the address (the outermost frame; with libdw
  // it carries the file:line of its call into the inline chain, which is dropped).
  frame resolve_one(std::uint64_t address) {
    std::vector<frame> frames;
    resolve(address, frames);
    return frames.empty() ? frame() : std::move(frames.front());
  }

  // One message per module whose symbols could not be read (truncated ELF, unreadable file, ...);
  // the caller decides where they go (profile notes, stderr). Cleared by this call.
  std::vector<std::string> take_warnings() {
    std::vector<std::string> out = modules_.take_warnings();
    for (std::string& w : dwarf_.take_warnings()) out.push_back(std::move(w));
    return out;
  }
  // Which DWARF later lookups read (SELFPROF_LINES).
  void set_lines(lines_mode mode) { dwarf_.set_mode(mode); }

  const detail::module_registry& modules() const { return modules_; }
  const detail::perf_map& jit_map() const { return perf_map_; }
  // The collector names JIT samples with it while sampling (perf_map is internally locked).
  detail::perf_map* perf_map_if_used() { return use_perf_map_ ? &perf_map_ : nullptr; }
  const detail::dwarf_lines& source_lines() const { return dwarf_; }

 private:
  // `f` as named by the symbol table (`named` false for the "[module+0xoffset]" fallback); `chain` from
  // DWARF, outermost first. The outermost frame keeps the symbol table's name (DWARF's fills in a miss)
  // and takes the chain's first file:line; each further level becomes an inlined frame.
  static void append_source_chain(const detail::source_chain& chain, bool named, frame f,
                                  std::vector<frame>& out) {
    f.file = chain.front().file;
    f.line = chain.front().line;
    if (!named && !chain.front().function.empty()) f.name = chain.front().function;
    out.push_back(f);
    for (std::size_t i = 1; i < chain.size(); ++i) {
      frame callee;
      callee.name = chain[i].function.empty() ? std::string("[inlined]") : chain[i].function;
      callee.module = f.module;
      callee.address = f.address;
      callee.module_offset = f.module_offset;
      callee.file = chain[i].file;
      callee.line = chain[i].line;
      callee.kind = frame_kind::inlined;
      out.push_back(std::move(callee));
    }
  }

  bool resolve_jit(std::uint64_t address, frame& f) {
    if (!use_perf_map_) return false;
    if (!perf_map_checked_) {
      perf_map_checked_ = true;
      perf_map_.reload_if_changed();
    }
    detail::perf_map::hit hit;
    if (!perf_map_.lookup(address, hit)) return false;
    f = jit_frame(hit, address);
    return true;
  }

  frame jit_frame(const detail::perf_map::hit& hit, std::uint64_t address) const {
    frame f;
    f.name = std::string(hit.name);
    f.module = perf_map_.path();
    f.address = address;
    f.module_offset = address - hit.start;
    f.kind = frame_kind::jit;
    return f;
  }

  detail::module_registry modules_;
  detail::perf_map perf_map_;
  bool use_perf_map_ = true;
  bool refreshed_ = false;
  bool rescanned_on_miss_ = false;
  bool perf_map_checked_ = false;
  detail::kernel_symbols kernel_;  // /proc/kallsyms, read at the first kernel address
  detail::dwarf_lines dwarf_;      // file:line and inline frames (a stub finding nothing without libdw)
};

}  // namespace selfprof
// ---- end selfprof/symbols/symbolizer.hpp ----
// ---- begin selfprof/unwind/tables.hpp ----
// Builds the unwind rows of loaded modules (.eh_frame found through dl_iterate_phdr and PT_GNU_EH_FRAME,
// copied out of memory) and publishes them to the signal handler as one immutable set. The collector
// builds lazily: a module is parsed once a sample reached its code (frame pointers there until then).
// Parsed rows are kept while the module stays loaded (across stop/start too) and reused only while the
// same file (device, inode, size, mtime) sits at the same address with the same .eh_frame_hdr and
// .eh_frame bytes. Each module's rows are clipped to its own executable segments.
// Context: setup only (start/stop) and the collector thread; the handler only reads g_unwind_tables.

#include <elf.h>
#include <link.h>
#include <sys/stat.h>

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

// ---- begin selfprof/signal/arch_x86_64.hpp ----
// What stack walking needs to know about the machine: registers of an interrupted context, the x86-64
// frame conventions (return address at CFA-8, DWARF register numbers, prologue bytes), the thread pointer.
// Context: signal handler (async-signal-safe: reads registers and bytes given to it, nothing else).

#include <ucontext.h>

#include <cstddef>
#include <cstdint>

namespace selfprof {
namespace detail {

// The registers a walk starts from.
struct frame_regs {
  std::uintptr_t pc = 0;
  std::uintptr_t sp = 0;
  std::uintptr_t fp = 0;  // the frame-pointer register: rbp (x86-64), x29 (aarch64)
};

// pc, sp and the frame pointer of the context a signal interrupted; zeros on other architectures.
inline frame_regs context_regs(const ucontext_t* uc) {
  frame_regs r;
#if defined(__x86_64__)
  r.pc = static_cast<std::uintptr_t>(uc->uc_mcontext.gregs[REG_RIP]);
  r.sp = static_cast<std::uintptr_t>(uc->uc_mcontext.gregs[REG_RSP]);
  r.fp = static_cast<std::uintptr_t>(uc->uc_mcontext.gregs[REG_RBP]);
#elif defined(__aarch64__)
  r.pc = static_cast<std::uintptr_t>(uc->uc_mcontext.pc);
  r.sp = static_cast<std::uintptr_t>(uc->uc_mcontext.sp);
  r.fp = static_cast<std::uintptr_t>(uc->uc_mcontext.regs[29]);
#else
  (void)uc;
#endif
  return r;
}

// The unwind rows (signal/unwind_rows.hpp) describe x86-64 frames and the prologue bytes below are
// x86-64 code; elsewhere only frame pointers are walked.
#if defined(__x86_64__)
constexpr bool kCfiRowsSupported = true;
constexpr bool kHasPrologueHeuristics = true;
#else
constexpr bool kCfiRowsSupported = false;
constexpr bool kHasPrologueHeuristics = false;
#endif

// DWARF register numbers of x86-64 (System V psABI, figure 3.36).
constexpr unsigned kDwarfRbp = 6, kDwarfRsp = 7, kDwarfRa = 16;

// `call` pushes the return address just below the caller's sp, which CFI calls the CFA.
constexpr std::intptr_t kReturnAddressAtCfa = -8;

// Bytes at the interrupted pc that prologue_return_slot looks at.
constexpr std::size_t kPrologueBytes = 4;

// x86-64 prologue/epilogue bytes at the interrupted pc (async-profiler's heuristics): at a function's
// first byte (push %rbp, endbr64) or on `ret` the return address is at [sp], right after `push %rbp` at
// [sp+8]; %rbp still holds the caller's frame. The slot of the return address, or 0 when the bytes say
// nothing (always 0 on other architectures).
inline std::uintptr_t prologue_return_slot(const unsigned char (&code)[kPrologueBytes], std::uintptr_t sp) {
#if defined(__x86_64__)
  const unsigned char b0 = code[0];
  if (b0 == 0x55 || b0 == 0xC3 || (b0 == 0xF3 && code[1] == 0x0F && code[2] == 0x1E && code[3] == 0xFA))
    return sp;
  if (b0 == 0x48 && code[1] == 0x89 && code[2] == 0xE5) return sp + 8;
#else
  (void)code;
  (void)sp;
#endif
  return 0;
}

// glibc's thread descriptor (what %fs:0x10 points to), which it places at the top of the thread's stack
// block; 0 where it is not known this way.
inline std::uintptr_t thread_descriptor() {
#if defined(__x86_64__) && defined(__GLIBC__)
  std::uintptr_t self;
  __asm__("mov %%fs:0x10, %0" : "=r"(self));
  return self;
#else
  return 0;
#endif
}

}  // namespace detail
}  // namespace selfprof
// ---- end selfprof/signal/arch_x86_64.hpp ----
// ---- begin selfprof/signal/unwind_rows.hpp ----
// The unwind row model: per-module tables of CFA rules (built from .eh_frame off the signal path by
// unwind/tables.hpp), the published set the handler reads, and the lookup of the row in effect at a pc.
// Context: signal handler (async-signal-safe: reads the immutable published set only).

#include <atomic>
#include <cstddef>
#include <cstdint>

namespace selfprof {
namespace detail {

// How the canonical frame address (CFA: the caller's sp, just above the return address) is computed
// at one pc, and what the row means for the walk.
enum unwind_row_kind : std::uint8_t {
  row_cfa_rsp = 0,    // CFA = rsp + cfa_off
  row_cfa_rbp = 1,    // CFA = rbp + cfa_off
  row_cfa_plt = 2,    // PLT entry: CFA = rsp + cfa_off, +8 more once (pc & 15) >= plt_threshold
  row_unknown = 3,    // CFI this walker does not model (expressions, other registers): one FP step
  row_outermost = 4,  // the return address is undefined: the thread's first frame, stop here
  row_no_info = 5,    // a gap between FDEs: no CFI covers the pc, one FP step
};

// One row of a module's table: valid from `pc` (offset from the module's start) to the next row.
// The return address is always at CFA + kReturnAddressAtCfa; rows where it is not are row_unknown.
struct unwind_row {
  std::uint32_t pc;
  std::int32_t cfa_off;
  std::int16_t fp_off;  // the caller's rbp is saved at CFA + fp_off; 0: rbp still holds it
  std::uint8_t kind;    // unwind_row_kind
  std::uint8_t plt_threshold;
};
static_assert(sizeof(unwind_row) == 12, "rows are packed: a libc has tens of thousands of them");

// The frame-pointer step as a row (async-profiler's default frame): a frame record {caller's rbp, return
// address} at rbp, so CFA = rbp + 16 and the caller's rbp is at CFA-16. Used wherever no CFI row covers
// the pc, and for every frame when there are no tables.
inline constexpr unwind_row kFramePointerRow{0, 16, -16, row_cfa_rbp, 0};

// Blocks of 1 << kRowIndexShift bytes of code, each indexed to the rows that can be in effect in it: a
// lookup searches a few rows instead of the module's tens of thousands.
constexpr unsigned kRowIndexShift = 8;

// The rows of one module, covering the runtime addresses [start, end).
struct unwind_module {
  std::uintptr_t start;
  std::uintptr_t end;
  const unwind_row* rows;  // sorted by pc; the last one is row_no_info at `end - start`
  std::size_t count;
  // Optional (null: search every row): index[b] = the number of rows whose pc <= b << kRowIndexShift,
  // for b in [0, index_count); covers [start, end) with one entry to spare.
  const std::uint32_t* index;
  std::size_t index_count;
};

// Every module's rows, sorted by start and not overlapping. Immutable once published.
struct unwind_table_set {
  const unwind_module* modules;
  std::size_t count;
};

// The set the handler reads; published by unwind/tables.hpp, never freed while profiling runs.
inline std::atomic<const unwind_table_set*> g_unwind_tables{nullptr};

// The rows each index entry of `m` leads to, for a table of `count` rows: the number of rows whose pc is
// at most each block's first offset (see unwind_module::index). `out` gets (end - start) >> shift + 2
// entries. Built off the signal path.
template <class Vector>
inline void build_row_index(const unwind_row* rows, std::size_t count, std::uintptr_t size, Vector& out) {
  const std::size_t blocks = static_cast<std::size_t>(size >> kRowIndexShift) + 2;
  out.assign(blocks, 0);
  std::size_t r = 0;
  for (std::size_t b = 0; b < blocks; ++b) {
    const std::uint64_t at = static_cast<std::uint64_t>(b) << kRowIndexShift;
    while (r < count && rows[r].pc <= at) ++r;
    out[b] = static_cast<std::uint32_t>(r);
  }
}

// The row in effect at `pc`, or nullptr when no CFI covers it. Binary searches; reads only the set.
// `hint` (may be null) holds the module found last: consecutive frames are mostly in one module.
inline const unwind_row* find_unwind_row(const unwind_table_set* set, std::uintptr_t pc,
                                         std::size_t* hint = nullptr) {
  if (set == nullptr || set->count == 0) return nullptr;
  std::size_t lo = 0, hi = set->count;  // first module with start > pc
  if (hint != nullptr && *hint < set->count && pc >= set->modules[*hint].start &&
      pc < set->modules[*hint].end) {
    lo = *hint + 1;
  } else {
    while (lo < hi) {
      std::size_t mid = lo + (hi - lo) / 2;
      if (set->modules[mid].start <= pc)
        lo = mid + 1;
      else
        hi = mid;
    }
  }
  if (lo == 0) return nullptr;
  if (hint != nullptr) *hint = lo - 1;
  const unwind_module& m = set->modules[lo - 1];
  if (pc >= m.end || m.count == 0) return nullptr;
  const std::uint32_t off = static_cast<std::uint32_t>(pc - m.start);
  lo = 0;
  hi = m.count;  // first row with pc > off
  const std::size_t block = static_cast<std::size_t>(off >> kRowIndexShift);
  if (m.index != nullptr && block + 1 < m.index_count) {  // the answer lies in [index[b], index[b + 1]]
    lo = m.index[block];
    hi = m.index[block + 1];
    if (hi > m.count) hi = m.count;
    if (lo > hi) lo = hi;
  }
  while (lo < hi) {
    std::size_t mid = lo + (hi - lo) / 2;
    if (m.rows[mid].pc <= off)
      lo = mid + 1;
    else
      hi = mid;
  }
  if (lo == 0) return nullptr;
  const unwind_row* row = &m.rows[lo - 1];
  return row->kind == row_no_info ? nullptr : row;
}

}  // namespace detail
}  // namespace selfprof
// ---- end selfprof/signal/unwind_rows.hpp ----
// ---- begin selfprof/unwind/eh_frame.hpp ----
// The .eh_frame / .eh_frame_hdr reader: turns a module's call frame information (CIEs and FDEs, as GCC,
// clang and glibc emit them) into the compact sorted unwind rows the signal handler follows.
// Context: collector thread or setup only (allocates; never the signal handler).

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <string>
#include <unordered_map>
#include <vector>

// ---- begin selfprof/unwind/cfa_program.hpp ----
// CFA programs: the DWARF call frame instructions of a CIE and an FDE run into the register rules the
// walker follows (signal/unwind_rows.hpp), one row per location change, with the PLT expression binutils
// emits recognized and every other expression marked unknown.
// Context: collector thread or setup only (allocates; never the signal handler).

#include <cstddef>
#include <cstdint>
#include <vector>

// ---- begin selfprof/unwind/eh_cursor.hpp ----
// A bounds-checked little-endian reader of call frame information (.eh_frame, .eh_frame_hdr, CFA
// programs): LEB128, DWARF pointer encodings, and the bytes given to parse.
// Context: collector thread or setup only (never the signal handler).

#include <cstddef>
#include <cstdint>

namespace selfprof {
namespace detail {

// Bytes to parse: `size` readable bytes at `data`, which live at runtime address `address` (pc-relative
// pointers are resolved against it; parsing a copy works when `address` is the original's).
struct eh_frame_input {
  const std::uint8_t* data = nullptr;
  std::size_t size = 0;
  std::uintptr_t address = 0;
};

// A bounds-checked little-endian reader: any read past the end sets ok = false and returns 0.
struct eh_cursor {
  const std::uint8_t* base;  // start of the whole input (offsets are relative to it)
  std::size_t pos, end;
  std::uintptr_t address;  // runtime address of base[0]
  bool ok = true;

  bool has(std::size_t n) const { return ok && pos <= end && end - pos >= n; }
  std::uint64_t fixed(std::size_t n) {
    if (!has(n)) return fail();
    std::uint64_t v = 0;
    for (std::size_t i = 0; i < n; ++i) v |= std::uint64_t(base[pos + i]) << (8 * i);
    pos += n;
    return v;
  }
  std::uint8_t u8() { return static_cast<std::uint8_t>(fixed(1)); }
  std::uint64_t uleb() {
    std::uint64_t v = 0;
    for (unsigned shift = 0;; shift += 7) {
      if (!has(1) || shift > 63) return fail();
      std::uint8_t b = base[pos++];
      v |= std::uint64_t(b & 0x7f) << shift;
      if (!(b & 0x80)) return v;
    }
  }
  std::int64_t sleb() {
    std::uint64_t v = 0;
    unsigned shift = 0;
    std::uint8_t b = 0;
    do {
      if (!has(1) || shift > 63) return static_cast<std::int64_t>(fail());
      b = base[pos++];
      v |= std::uint64_t(b & 0x7f) << shift;
      shift += 7;
    } while (b & 0x80);
    if (shift < 64 && (b & 0x40)) v |= ~std::uint64_t(0) << shift;
    return static_cast<std::int64_t>(v);
  }
  // A DW_EH_PE_* encoded pointer. `apply` = false reads the value only (pc ranges, skipped pointers).
  // Indirect pointers are reported through `indirect` and never dereferenced.
  std::uint64_t pointer(std::uint8_t enc, bool apply = true, bool* indirect = nullptr) {
    if (enc == 0xff) return 0;  // DW_EH_PE_omit
    const std::uintptr_t field = address + pos;
    std::uint64_t v = 0;
    switch (enc & 0x0f) {
      case 0x00:
        v = fixed(8);
        break;  // absptr
      case 0x01:
        v = uleb();
        break;  // uleb128
      case 0x02:
        v = fixed(2);
        break;  // udata2
      case 0x03:
        v = fixed(4);
        break;  // udata4
      case 0x04:
        v = fixed(8);
        break;  // udata8
      case 0x09:
        v = static_cast<std::uint64_t>(sleb());
        break;  // sleb128
      case 0x0a:
        v = static_cast<std::uint64_t>(std::int64_t(std::int16_t(fixed(2))));
        break;  // sdata2
      case 0x0b:
        v = static_cast<std::uint64_t>(std::int64_t(std::int32_t(fixed(4))));
        break;  // sdata4
      case 0x0c:
        v = fixed(8);
        break;  // sdata8
      default:
        return fail();
    }
    if (indirect) *indirect = (enc & 0x80) != 0;
    if (!apply) return v;
    switch (enc & 0x70) {
      case 0x00:
        break;  // absolute
      case 0x10:
        v += field;
        break;  // pcrel
      default:
        return fail();  // textrel/datarel/funcrel/aligned: not used in .eh_frame FDEs
    }
    return v;
  }
  std::uint64_t fail() {
    ok = false;
    return 0;
  }
};

}  // namespace detail
}  // namespace selfprof
// ---- end selfprof/unwind/eh_cursor.hpp ----

namespace selfprof {
namespace detail {

// remember_state nesting kept; deeper nesting makes the rest of that FDE row_unknown.
constexpr std::size_t kMaxRememberDepth = 16;

// One parsed CIE: what its FDEs need.
struct eh_cie {
  bool valid = false;
  std::uint64_t code_align = 1;
  std::int64_t data_align = -8;
  std::uint64_t ra_reg = kDwarfRa;
  std::uint8_t fde_enc = 0;  // DW_EH_PE_absptr unless 'R' says otherwise
  bool has_aug_data = false;
  std::size_t insns = 0, insns_end = 0;  // initial instructions, offsets in the input
};

// The register rules the walker cares about, at one pc.
struct cfa_state {
  std::uint8_t kind = row_cfa_rsp;  // row_cfa_rsp, row_cfa_rbp, row_cfa_plt or row_unknown
  std::int64_t cfa_off = 8;
  std::uint8_t plt_threshold = 0;
  std::int64_t fp_off = 0;  // 0: rbp unchanged
  bool fp_unknown = false;  // rbp saved somewhere this walker does not follow
  bool ra_undefined = false;
  bool ra_unusual = false;  // return address not at CFA + kReturnAddressAtCfa

  unwind_row row(std::uint32_t pc) const {
    unwind_row r{pc, 0, 0, row_unknown, 0};
    if (ra_undefined) {
      r.kind = row_outermost;
      return r;
    }
    // rbp saved where this walker cannot follow (an expression, as in stack-realigning DRAP frames):
    // the caller's rbp is unknown, so the row cannot be used; one frame-pointer step instead.
    if (kind == row_unknown || ra_unusual || fp_unknown || cfa_off < -0x7fffffff || cfa_off > 0x7fffffff ||
        fp_off < -0x8000 || fp_off > 0x7fff)
      return r;
    r.kind = kind;
    r.cfa_off = static_cast<std::int32_t>(cfa_off);
    r.fp_off = static_cast<std::int16_t>(fp_off);
    r.plt_threshold = plt_threshold;
    return r;
  }
};

// The PLT CFA expression binutils emits for lazy PLT entries:
//   DW_OP_breg7 (rsp) N; DW_OP_breg16 (rip) 0; DW_OP_lit15; DW_OP_and; DW_OP_lit<T>; DW_OP_ge;
//   DW_OP_lit3; DW_OP_shl; DW_OP_plus   =>   CFA = rsp + N + ((rip & 15) >= T ? 8 : 0)
// Anything else makes the row row_unknown (one frame-pointer step instead).
inline bool match_plt_expression(eh_cursor c, std::size_t end, cfa_state& s) {
  c.end = end;
  if (c.u8() != 0x77) return false;  // DW_OP_breg7
  std::int64_t n = c.sleb();
  if (c.u8() != 0x80 || c.sleb() != 0) return false;   // DW_OP_breg16 0
  if (c.u8() != 0x3f || c.u8() != 0x1a) return false;  // lit15, and
  std::uint8_t lit = c.u8();
  if (lit < 0x30 || lit > 0x3f) return false;
  if (c.u8() != 0x2a || c.u8() != 0x33 || c.u8() != 0x24 || c.u8() != 0x22) return false;  // ge lit3 shl plus
  if (!c.ok || c.pos != end) return false;
  s.kind = row_cfa_plt;
  s.cfa_off = n;
  s.plt_threshold = static_cast<std::uint8_t>(lit - 0x30);
  return true;
}

// Runs CFA instructions [pos, end) from `state`, appending a row at each location change.
// Returns false on a malformed instruction stream (rows so far are kept: they were valid).
inline bool run_cfa_program(eh_cursor c, std::size_t end, const eh_cie& cie, const cfa_state& initial,
                            cfa_state& state, std::uint64_t& loc, std::uint64_t loc_end, std::uint64_t start,
                            std::vector<unwind_row>* rows) {
  c.end = end;
  cfa_state stack[kMaxRememberDepth];
  std::size_t depth = 0;  // may exceed kMaxRememberDepth: those states are not kept
  auto advance = [&](std::uint64_t delta) {
    std::uint64_t next = loc + delta * cie.code_align;
    if (next < loc || next > loc_end) {  // past the FDE: the remaining rules never apply
      if (rows && loc < loc_end) rows->push_back(state.row(static_cast<std::uint32_t>(loc - start)));
      loc = loc_end;
      return false;
    }
    if (rows && next != loc) rows->push_back(state.row(static_cast<std::uint32_t>(loc - start)));
    loc = next;
    return true;
  };
  auto set_offset = [&](std::uint64_t reg, std::int64_t off) {
    if (reg == kDwarfRbp) state.fp_off = off, state.fp_unknown = false;
    if (reg == cie.ra_reg) state.ra_unusual = off != kReturnAddressAtCfa, state.ra_undefined = false;
  };
  auto other_rule = [&](std::uint64_t reg) {  // register / expression rules we do not follow
    if (reg == kDwarfRbp) state.fp_unknown = true, state.fp_off = 0;
    if (reg == cie.ra_reg) state.ra_unusual = true;
  };
  auto restore = [&](std::uint64_t reg) {
    if (reg == kDwarfRbp) state.fp_off = initial.fp_off, state.fp_unknown = initial.fp_unknown;
    if (reg == cie.ra_reg) state.ra_unusual = initial.ra_unusual, state.ra_undefined = initial.ra_undefined;
  };
  while (c.ok && c.pos < end) {
    std::uint8_t op = c.u8();
    std::uint8_t low = op & 0x3f;
    switch (op >> 6) {
      case 1:  // DW_CFA_advance_loc
        if (!advance(low)) return true;
        continue;
      case 2:  // DW_CFA_offset
        set_offset(low, static_cast<std::int64_t>(c.uleb()) * cie.data_align);
        continue;
      case 3:  // DW_CFA_restore
        restore(low);
        continue;
      default:
        break;
    }
    switch (op) {
      case 0x00:
        break;      // nop
      case 0x01: {  // set_loc
        std::uint64_t to = c.pointer(cie.fde_enc);
        if (!c.ok || to < loc) return false;
        if (!advance((to - loc) / (cie.code_align ? cie.code_align : 1))) return true;
        break;
      }
      case 0x02:
        if (!advance(c.u8())) return true;
        break;
      case 0x03:
        if (!advance(c.fixed(2))) return true;
        break;
      case 0x04:
        if (!advance(c.fixed(4))) return true;
        break;
      case 0x05: {  // offset_extended
        std::uint64_t reg = c.uleb();
        set_offset(reg, static_cast<std::int64_t>(c.uleb()) * cie.data_align);
        break;
      }
      case 0x06:
        restore(c.uleb());
        break;      // restore_extended
      case 0x07: {  // undefined
        std::uint64_t reg = c.uleb();
        if (reg == cie.ra_reg) state.ra_undefined = true;
        if (reg == kDwarfRbp) other_rule(reg);
        break;
      }
      case 0x08: {  // same_value
        std::uint64_t reg = c.uleb();
        if (reg == kDwarfRbp) state.fp_off = 0, state.fp_unknown = false;
        if (reg == cie.ra_reg) state.ra_unusual = true;
        break;
      }
      case 0x09: {  // register
        std::uint64_t reg = c.uleb();
        c.uleb();
        other_rule(reg);
        break;
      }
      case 0x0a:  // remember_state
        if (depth < kMaxRememberDepth) stack[depth] = state;
        ++depth;
        break;
      case 0x0b:  // restore_state
        if (depth == 0) return false;
        --depth;
        if (depth < kMaxRememberDepth)
          state = stack[depth];
        else
          state.kind = row_unknown;
        break;
      case 0x0c: {  // def_cfa
        std::uint64_t reg = c.uleb();
        std::uint64_t off = c.uleb();
        state.kind = reg == kDwarfRsp ? row_cfa_rsp : reg == kDwarfRbp ? row_cfa_rbp : row_unknown;
        state.cfa_off = static_cast<std::int64_t>(off);
        break;
      }
      case 0x0d: {  // def_cfa_register
        std::uint64_t reg = c.uleb();
        if (state.kind == row_cfa_plt)
          state.kind = row_unknown;
        else
          state.kind = reg == kDwarfRsp ? row_cfa_rsp : reg == kDwarfRbp ? row_cfa_rbp : row_unknown;
        break;
      }
      case 0x0e:
        state.cfa_off = static_cast<std::int64_t>(c.uleb());
        break;      // def_cfa_offset
      case 0x0f: {  // def_cfa_expression
        std::uint64_t len = c.uleb();
        if (!c.has(len)) return false;
        if (!match_plt_expression(c, c.pos + len, state)) state.kind = row_unknown;
        c.pos += len;
        break;
      }
      case 0x10:    // expression
      case 0x16: {  // val_expression
        std::uint64_t reg = c.uleb();
        std::uint64_t len = c.uleb();
        if (!c.has(len)) return false;
        c.pos += len;
        other_rule(reg);
        break;
      }
      case 0x11: {  // offset_extended_sf
        std::uint64_t reg = c.uleb();
        set_offset(reg, c.sleb() * cie.data_align);
        break;
      }
      case 0x12: {  // def_cfa_sf
        std::uint64_t reg = c.uleb();
        std::int64_t off = c.sleb() * cie.data_align;
        state.kind = reg == kDwarfRsp ? row_cfa_rsp : reg == kDwarfRbp ? row_cfa_rbp : row_unknown;
        state.cfa_off = off;
        break;
      }
      case 0x13:
        state.cfa_off = c.sleb() * cie.data_align;
        break;      // def_cfa_offset_sf
      case 0x14:    // val_offset
      case 0x15: {  // val_offset_sf
        std::uint64_t reg = c.uleb();
        if (op == 0x14)
          c.uleb();
        else
          c.sleb();
        other_rule(reg);
        break;
      }
      case 0x2e:
        c.uleb();
        break;      // GNU_args_size
      case 0x2f: {  // GNU_negative_offset_extended
        std::uint64_t reg = c.uleb();
        set_offset(reg, -static_cast<std::int64_t>(c.uleb()) * cie.data_align);
        break;
      }
      default:
        return false;  // unknown opcode: the rest of this program cannot be decoded
    }
  }
  return c.ok;
}

}  // namespace detail
}  // namespace selfprof
// ---- end selfprof/unwind/cfa_program.hpp ----

namespace selfprof {
namespace detail {

// A module's rows (pc offsets from `start`) and what the parse met on the way.
struct eh_frame_table {
  std::uintptr_t start = 0, end = 0;  // runtime pc range covered by the FDEs
  std::vector<unwind_row> rows;
  std::size_t cies = 0, fdes = 0;
  std::size_t skipped = 0;  // records left out (malformed, unsupported encoding or augmentation)
  std::size_t unknown = 0;  // rows the handler cannot follow (CFA expressions other than PLT, ...)
  std::string error;        // the first problem, with its offset; empty when none
};

// A module whose FDEs span more than this cannot be expressed with 32-bit row offsets.
constexpr std::uintptr_t kMaxModuleSpan = 0xFFFFFFF0u;

// Parses .eh_frame: a CIE/FDE sequence ended by a zero length word or by the end of the input.
// Never reads outside the input; malformed records are counted in `skipped`, never fatal.
inline eh_frame_table parse_eh_frame(const eh_frame_input& in) {
  eh_frame_table t;
  struct fde_rows {
    std::uint64_t begin, end;
    std::size_t first, count;  // in `all`
  };
  std::vector<fde_rows> fdes;
  std::vector<unwind_row> all;  // pcs relative to each FDE's begin for now
  std::unordered_map<std::size_t, eh_cie> cies;
  auto note = [&](const char* what, std::size_t at, bool count = true) {
    if (count) ++t.skipped;
    if (t.error.empty()) {
      char buf[160];
      std::snprintf(buf, sizeof buf, "eh_frame at 0x%zx (offset 0x%zx): %s",
                    static_cast<std::size_t>(in.address), at, what);
      t.error = buf;
    }
  };
  auto parse_cie = [&](std::size_t at) -> const eh_cie& {
    auto found = cies.find(at);
    if (found != cies.end()) return found->second;
    eh_cie& cie = cies[at];
    eh_cursor c{in.data, at, in.size, in.address};
    std::uint64_t len = c.fixed(4);
    bool wide = len == 0xffffffffu;
    if (wide) len = c.fixed(8);
    if (!c.ok || len == 0 || len > c.end - c.pos) return note("truncated CIE", at, false), cie;
    c.end = c.pos + static_cast<std::size_t>(len);
    if (c.fixed(wide ? 8 : 4) != 0) return note("CIE pointer does not point at a CIE", at, false), cie;
    std::uint8_t version = c.u8();
    if (version != 1 && version != 3 && version != 4) return note("unsupported CIE version", at, false), cie;
    std::string aug;
    while (c.has(1) && in.data[c.pos] != 0 && aug.size() < 16) aug += static_cast<char>(in.data[c.pos++]);
    if (c.u8() != 0) return note("unterminated CIE augmentation", at, false), cie;
    if (aug.find("eh") == 0) c.fixed(8);  // old GCC: an eh_ptr word
    if (version == 4 && (c.u8() != 8 || c.u8() != 0))
      return note("CIE address size is not 8", at, false), cie;
    cie.code_align = c.uleb();
    cie.data_align = c.sleb();
    cie.ra_reg = version == 1 ? c.u8() : c.uleb();
    if (!aug.empty() && aug[0] == 'z') {
      cie.has_aug_data = true;
      std::uint64_t aug_len = c.uleb();
      if (!c.has(aug_len)) return note("truncated CIE augmentation data", at, false), cie;
      std::size_t aug_end = c.pos + static_cast<std::size_t>(aug_len);
      for (std::size_t i = 1; i < aug.size() && c.ok; ++i) {
        if (aug[i] == 'R')
          cie.fde_enc = c.u8();
        else if (aug[i] == 'L')
          c.u8();
        else if (aug[i] == 'P')
          c.pointer(c.u8(), false);
        else if (aug[i] == 'S' || aug[i] == 'B' || aug[i] == 'G')
          continue;
        else
          break;  // unknown letter: 'z' says how long the data is, skip the rest
      }
      if (!c.ok || c.pos > aug_end) return note("malformed CIE augmentation data", at, false), cie;
      c.pos = aug_end;
    } else if (!aug.empty() && aug != "eh") {
      return note("unknown CIE augmentation", at, false), cie;
    }
    if (!c.ok || cie.code_align == 0) return note("malformed CIE", at, false), cie;
    cie.insns = c.pos;
    cie.insns_end = c.end;
    cie.valid = true;
    ++t.cies;
    return cie;
  };

  // Most FDEs of a module share one CIE: its state after the initial instructions is kept for the next.
  std::size_t last_cie_at = ~std::size_t{0}, initial_cie_at = ~std::size_t{0};
  const eh_cie* last_cie = nullptr;
  cfa_state last_initial;
  bool last_initial_ok = false;
  // About one row per five bytes of .eh_frame (GCC's output): room for them at once, not by doubling.
  all.reserve(std::min<std::size_t>(in.size / 4, std::size_t{1} << 24));
  fdes.reserve(std::min<std::size_t>(in.size / 16, std::size_t{1} << 22));
  std::size_t pos = 0;
  while (pos < in.size) {
    const std::size_t at = pos;
    eh_cursor c{in.data, pos, in.size, in.address};
    std::uint64_t len = c.fixed(4);
    if (!c.ok) break;     // fewer than 4 bytes left: treat as the end
    if (len == 0) break;  // the terminator
    bool wide = len == 0xffffffffu;
    if (wide) len = c.fixed(8);
    if (!c.ok || len > c.end - c.pos) {
      note("record runs past the end", at);
      break;
    }
    const std::size_t rec_end = c.pos + static_cast<std::size_t>(len);
    pos = rec_end;
    c.end = rec_end;
    const std::size_t id_at = c.pos;
    std::uint64_t id = c.fixed(wide ? 8 : 4);
    if (!c.ok) {
      note("truncated record", at);
      continue;
    }
    if (id == 0) {  // a CIE: parsed when an FDE uses it
      continue;
    }
    if (id > id_at) {
      note("FDE points before the input", at);
      continue;
    }
    const std::size_t cie_at = id_at - static_cast<std::size_t>(id);
    if (cie_at != last_cie_at) {
      last_cie = &parse_cie(cie_at);  // unordered_map: references stay valid
      last_cie_at = cie_at;
    }
    const eh_cie& cie = *last_cie;
    if (!cie.valid) {
      note("FDE of an unusable CIE", at);
      continue;
    }
    bool indirect = false;
    std::uint64_t begin = c.pointer(cie.fde_enc, true, &indirect);
    std::uint64_t range = c.pointer(cie.fde_enc & 0x0f, false);
    if (cie.has_aug_data) {
      std::uint64_t n = c.uleb();
      if (!c.has(n)) {
        note("truncated FDE augmentation data", at);
        continue;
      }
      c.pos += static_cast<std::size_t>(n);
    }
    if (!c.ok || indirect) {
      note("malformed FDE", at);
      continue;
    }
    if (range == 0) continue;  // an empty FDE covers nothing (linkers leave them for discarded code)
    if (begin + range < begin || range > kMaxModuleSpan) {
      note("FDE range overflows", at);
      continue;
    }
    ++t.fdes;
    // Rows are relative to the FDE's begin for now; rebased once the module's start is known.
    std::uint64_t loc = begin;
    const std::size_t first = all.size();
    if (initial_cie_at != cie_at) {  // the initial instructions may not advance: the state is the CIE's
      initial_cie_at = cie_at;
      const cfa_state defaults;
      last_initial = cfa_state();
      eh_cursor cie_program{in.data, cie.insns, cie.insns_end, in.address};
      last_initial_ok = run_cfa_program(cie_program, cie.insns_end, cie, defaults, last_initial, loc,
                                        begin + range, begin, nullptr) &&
                        loc == begin;
      loc = begin;
    }
    if (!last_initial_ok) {
      note("CIE initial instructions are malformed or advance", at);
      continue;
    }
    const cfa_state& initial = last_initial;
    cfa_state state = initial;
    bool good = run_cfa_program(c, rec_end, cie, initial, state, loc, begin + range, begin, &all);
    if (loc < begin + range) all.push_back(state.row(static_cast<std::uint32_t>(loc - begin)));
    if (!good) {
      // The rows before the bad instruction hold; from it on, the function is unknown territory.
      note("malformed CFA instructions", at);
      if (all.size() > first)
        all.back().kind = row_unknown;
      else
        all.push_back(unwind_row{0, 0, 0, row_unknown, 0});
    }
    fdes.push_back({begin, begin + range, first, all.size() - first});
  }
  if (fdes.empty()) return t;

  std::sort(fdes.begin(), fdes.end(), [](const fde_rows& a, const fde_rows& b) { return a.begin < b.begin; });
  std::uint64_t lo = fdes.front().begin, hi = 0;
  for (auto& f : fdes) hi = std::max(hi, f.end);
  if (hi - lo > kMaxModuleSpan) {
    // FDEs spread over more than 4 GiB: keep the span around the first ones and count the rest out.
    std::size_t keep = 0;
    while (keep < fdes.size() && fdes[keep].end - lo <= kMaxModuleSpan) ++keep;
    t.skipped += fdes.size() - keep;
    if (t.error.empty()) t.error = "eh_frame: FDEs span more than 4 GiB; the rest were left out";
    fdes.resize(keep);
    hi = 0;
    for (auto& f : fdes) hi = std::max(hi, f.end);
  }
  t.start = static_cast<std::uintptr_t>(lo);
  t.end = static_cast<std::uintptr_t>(hi);
  t.rows.reserve(all.size() + fdes.size());
  auto push = [&](const unwind_row& r) {
    if (!t.rows.empty() && t.rows.back().pc == r.pc) t.rows.pop_back();  // a later row at the same pc wins
    if (!t.rows.empty()) {
      const unwind_row& b = t.rows.back();
      if (b.kind == r.kind && b.cfa_off == r.cfa_off && b.fp_off == r.fp_off &&
          b.plt_threshold == r.plt_threshold)
        return;  // same rule continues
    }
    t.rows.push_back(r);
  };
  for (std::size_t i = 0; i < fdes.size(); ++i) {
    const fde_rows& f = fdes[i];
    // Overlapping FDEs (broken input): the later one starts where the earlier one is cut.
    std::uint64_t stop = i + 1 < fdes.size() ? std::min(f.end, fdes[i + 1].begin) : f.end;
    if (!t.rows.empty() && f.begin - lo < t.rows.back().pc) continue;  // fully shadowed
    for (std::size_t k = 0; k < f.count; ++k) {
      unwind_row r = all[f.first + k];
      std::uint64_t pc = f.begin + r.pc;
      if (pc >= stop) break;
      r.pc = static_cast<std::uint32_t>(pc - lo);
      push(r);
    }
    if (stop == f.end && (i + 1 == fdes.size() || fdes[i + 1].begin > f.end))
      push(unwind_row{static_cast<std::uint32_t>(f.end - lo), 0, 0, row_no_info, 0});
  }
  if (t.rows.empty() || t.rows.back().kind != row_no_info)
    t.rows.push_back(unwind_row{static_cast<std::uint32_t>(hi - lo), 0, 0, row_no_info, 0});
  t.end = t.start + t.rows.back().pc;  // overlapping FDEs (broken input) may end before `hi`
  for (const unwind_row& r : t.rows)
    if (r.kind == row_unknown) ++t.unknown;
  return t;
}

// Where .eh_frame starts, from the .eh_frame_hdr at `hdr` (runtime address `hdr.address`), and how far the
// FDEs its search table lists reach (0 when the table is absent). False when the header is malformed.
struct eh_frame_hdr_info {
  std::uintptr_t eh_frame = 0;
  std::uintptr_t fde_limit = 0;  // highest FDE start listed in the search table, 0 when none
  std::size_t fde_count = 0;
};

inline bool parse_eh_frame_hdr(const eh_frame_input& hdr, eh_frame_hdr_info& out) {
  eh_cursor c{hdr.data, 0, hdr.size, hdr.address};
  if (c.u8() != 1) return false;  // version
  std::uint8_t ptr_enc = c.u8(), count_enc = c.u8(), table_enc = c.u8();
  std::uint64_t eh = c.pointer(ptr_enc);
  if (!c.ok || eh == 0) return false;
  out.eh_frame = static_cast<std::uintptr_t>(eh);
  if (count_enc == 0xff || table_enc != 0x3b) return true;  // no binary search table we can read
  std::uint64_t count = c.pointer(count_enc);
  if (!c.ok || count > (c.end - c.pos) / 8) return true;
  out.fde_count = static_cast<std::size_t>(count);
  for (std::uint64_t i = 0; i < count; ++i) {
    c.fixed(4);  // initial location (datarel sdata4)
    std::int64_t fde = std::int32_t(c.fixed(4));
    std::uintptr_t at = hdr.address + static_cast<std::uintptr_t>(fde);
    if (c.ok && at > out.fde_limit) out.fde_limit = at;
  }
  return true;
}

}  // namespace detail
}  // namespace selfprof
// ---- end selfprof/unwind/eh_frame.hpp ----

namespace selfprof {

// What the last build found, for stats and verbose output.
struct unwind_tables_info {
  bool published = false;
  std::size_t modules = 0;         // modules with rows in the published set
  std::size_t rows = 0;            // rows in the published set
  std::size_t bytes = 0;           // memory held by every table and set kept (retired ones too)
  std::size_t builds = 0;          // sets published since the last release
  std::size_t parsed = 0;          // modules whose rows are kept (parsed once while they stay loaded)
  std::size_t reused = 0;          // modules of this session whose rows an earlier session parsed
  std::size_t pending = 0;         // modules seen by a lazy build whose rows no sample has needed yet
  double last_build_ms = 0;        // wall time of the last build that found changed modules
  double parse_ms = 0;             // wall time spent parsing rows since the last release
  std::vector<std::string> notes;  // modules left out or parsed with problems, one line each
};

namespace detail {

// The file a module was loaded from, as stat() sees its path: a rebuilt library (written over in place
// or renamed over the old one) differs in inode, size or mtime. All zero when the path cannot be stat'ed
// (the vDSO).
struct module_file_id {
  std::uint64_t dev = 0, ino = 0, size = 0;
  std::int64_t mtime_s = 0, mtime_ns = 0;
  bool operator==(const module_file_id& o) const {
    return dev == o.dev && ino == o.ino && size == o.size && mtime_s == o.mtime_s && mtime_ns == o.mtime_ns;
  }
  bool operator!=(const module_file_id& o) const { return !(*this == o); }
};

// The rows of one module, parsed once and kept while the module stays loaded (a retired set may still
// point at them). `file` and `content_hash` (of the .eh_frame_hdr and .eh_frame bytes the rows were parsed
// from) must both match for the rows to be used again (see visit()).
struct module_unwind {
  std::string name;
  std::uintptr_t bias = 0, hdr = 0;
  module_file_id file;
  std::uint64_t content_hash = 0;
  eh_frame_table table;
  std::vector<std::uint32_t> index;  // unwind_module::index of the table
};

// Clips a table to the runtime address ranges `code` (sorted, not overlapping: the module's executable
// PT_LOAD segments): pcs outside them get no row (row_no_info), and start/end shrink to what is left.
// A table with nothing inside the ranges ends up empty. Rows stay sorted and relative to the new start.
inline void clip_unwind_rows(eh_frame_table& t,
                             const std::vector<std::pair<std::uintptr_t, std::uintptr_t>>& code) {
  if (t.rows.empty()) return;
  for (const auto& c : code)  // one segment holds every row (the usual case): nothing to clip
    if (c.first <= t.start && t.end <= c.second && t.rows.front().kind != row_no_info) return;
  struct abs_row {
    std::uintptr_t pc;
    unwind_row row;
  };
  std::vector<abs_row> out;
  auto push = [&out](std::uintptr_t pc, const unwind_row& r) {
    if (!out.empty() && out.back().pc == pc) out.pop_back();  // a later row at the same pc wins
    if (!out.empty()) {
      const unwind_row& b = out.back().row;
      if (b.kind == r.kind && b.cfa_off == r.cfa_off && b.fp_off == r.fp_off &&
          b.plt_threshold == r.plt_threshold)
        return;  // same rule continues
    }
    out.push_back(abs_row{pc, r});
  };
  const unwind_row none{0, 0, 0, row_no_info, 0};
  std::size_t c = 0;
  for (std::size_t i = 0; i + 1 < t.rows.size(); ++i) {
    const std::uintptr_t a = t.start + t.rows[i].pc, b = t.start + t.rows[i + 1].pc;
    while (c < code.size() && code[c].second <= a) ++c;
    for (std::size_t k = c; k < code.size() && code[k].first < b; ++k) {
      const std::uintptr_t lo = std::max(a, code[k].first), hi = std::min(b, code[k].second);
      if (lo >= hi) continue;
      push(lo, t.rows[i]);
      if (hi < b || k + 1 == code.size() || code[k + 1].first > hi) push(hi, none);
    }
  }
  while (!out.empty() && out.front().row.kind == row_no_info) out.erase(out.begin());
  if (out.empty()) {
    t.rows.clear();
    t.start = t.end = 0;
    return;
  }
  if (out.back().row.kind != row_no_info) out.push_back(abs_row{t.end, none});  // cannot happen: safety
  t.rows.clear();
  t.start = out.front().pc;
  t.end = out.back().pc;
  for (const abs_row& r : out) {
    unwind_row row = r.row;
    row.pc = static_cast<std::uint32_t>(r.pc - t.start);
    t.rows.push_back(row);
  }
}

// One published set: its module list and the set header the handler reads.
struct unwind_set_storage {
  std::vector<unwind_module> modules;
  unwind_table_set set{nullptr, 0};
};

// The executable address range of a module whose rows a lazy build left unparsed.
struct pending_code {
  std::uintptr_t start = 0, end = 0;
};

// The entry of `code` (sorted by start, not overlapping) that holds `pc`, or nullptr.
inline const pending_code* find_pending(const std::vector<pending_code>& code, std::uint64_t pc) {
  auto it = std::upper_bound(code.begin(), code.end(), pc,
                             [](std::uint64_t v, const pending_code& c) { return v < c.start; });
  if (it == code.begin() || pc >= (it - 1)->end) return nullptr;
  return &*(it - 1);
}

class unwind_tables_state {
 public:
  // Re-reads the module list when dlopen/dlclose changed it (or `force`), parses new modules and
  // publishes a new set. Cheap when nothing changed: one dl_iterate_phdr that stops at the first module.
  // `lazy`: a module not parsed before is parsed only once want() asked for it; until then its code is
  // listed by pending().
  status build(bool force, bool lazy = false) {
    if (!kCfiRowsSupported)
      return status::error("selfprof: DWARF unwinding is implemented for x86-64 only; using frame pointers");
    std::lock_guard<std::mutex> lock(mu_);
    counts now = read_counts();
    const bool moved = !have_counts_ || now.adds != counts_.adds || now.subs != counts_.subs;
    if (!force && !moved && !wanted_new_ && g_unwind_tables.load(std::memory_order_relaxed) != nullptr)
      return status::ok();
    auto t0 = std::chrono::steady_clock::now();
    // Only a change of the module list (or a restart) needs the kept rows checked against their files.
    scan_context ctx{this, {}, {}, {}, lazy, force || moved || revalidate_, 0};
    // The loader lock is held during the callback, so no module can be unmapped while it is parsed.
    dl_iterate_phdr(&unwind_tables_state::visit, &ctx);
    std::sort(ctx.pending.begin(), ctx.pending.end(),
              [](const pending_span& a, const pending_span& b) { return a.code.start < b.code.start; });
    pending_ = std::move(ctx.pending);
    wanted_new_ = false;
    ++pending_generation_;
    info_.pending = 0;
    for (std::size_t i = 0; i < pending_.size(); ++i)
      if (i == 0 || pending_[i].module != pending_[i - 1].module) ++info_.pending;
    info_.parse_ms += ctx.parse_ms;
    auto storage = std::unique_ptr<unwind_set_storage>(new unwind_set_storage());
    for (module_unwind* m : ctx.present) {
      if (m->table.rows.empty()) continue;
      storage->modules.push_back(
          unwind_module{m->table.start, m->table.end, m->table.rows.data(), m->table.rows.size(),
                        m->index.empty() ? nullptr : m->index.data(), m->index.size()});
    }
    std::sort(storage->modules.begin(), storage->modules.end(),
              [](const unwind_module& a, const unwind_module& b) { return a.start < b.start; });
    // Overlapping ranges cannot happen between live modules; if they do (a stale entry), keep the first.
    std::vector<unwind_module> clean;
    for (const unwind_module& m : storage->modules)
      if (clean.empty() || m.start >= clean.back().end) clean.push_back(m);
    storage->modules.swap(clean);
    storage->set = unwind_table_set{storage->modules.data(), storage->modules.size()};
    info_.modules = storage->modules.size();
    info_.rows = 0;
    for (const unwind_module& m : storage->modules) info_.rows += m.count;
    g_unwind_tables.store(&storage->set, std::memory_order_release);
    sets_.push_back(std::move(storage));  // the previous set stays: a handler may be reading it
    counts_ = now;
    have_counts_ = true;
    revalidate_ = false;
    info_.published = true;
    ++info_.builds;
    for (auto& n : ctx.notes)
      if (std::find(info_.notes.begin(), info_.notes.end(), n) == info_.notes.end()) info_.notes.push_back(n);
    info_.last_build_ms =
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    return status::ok();
  }

  // Unpublishes the tables and frees the sets. Only once no handler can be running (after the profiling
  // signal is restored and g_handler.in_flight reached zero), since a handler may hold a pointer into any
  // set. The parsed rows of modules still loaded are kept for the next start (parsing every module again
  // is the costly part of a start): at the next build each is used only if its file and bytes are still
  // the ones it was parsed from (see visit()), so a library rebuilt and reloaded is parsed anew.
  void release() {
    std::lock_guard<std::mutex> lock(mu_);
    g_unwind_tables.store(nullptr, std::memory_order_release);
    sets_.clear();
    retired_.clear();
    std::vector<key> loaded;
    dl_iterate_phdr(
        [](dl_phdr_info* info, std::size_t, void* data) -> int {
          dl_phdr_info copy;
          std::vector<ElfW(Phdr)> phdrs;
          if (!copy_phdrs(info, copy, phdrs)) return 0;
          const ElfW(Phdr)* eh = find_eh(&copy);
          if (eh != nullptr) static_cast<std::vector<key>*>(data)->push_back(key_of(&copy, eh));
          return 0;
        },
        &loaded);
    for (auto it = modules_.begin(); it != modules_.end();)
      it = std::find(loaded.begin(), loaded.end(), it->first) == loaded.end() ? modules_.erase(it) : ++it;
    revalidate_ = true;
    have_counts_ = false;
    pending_.clear();
    wanted_.clear();
    wanted_new_ = false;
    info_ = unwind_tables_info{};
  }

  // Asks a lazy build to parse the module whose code holds `pc`. True when that module was pending and
  // not asked for before (the next build parses it).
  bool want(std::uintptr_t pc) {
    std::lock_guard<std::mutex> lock(mu_);
    for (const pending_span& p : pending_) {
      if (pc < p.code.start || pc >= p.code.end) continue;
      if (std::find(wanted_.begin(), wanted_.end(), p.module) != wanted_.end()) return false;
      wanted_.push_back(p.module);
      wanted_new_ = true;
      return true;
    }
    return false;
  }

  // A number that changes with every build: pending() may differ only when it did.
  std::uint64_t pending_generation() {
    std::lock_guard<std::mutex> lock(mu_);
    return pending_generation_;
  }

  // The code of modules a lazy build left unparsed, by start address.
  std::vector<pending_code> pending() {
    std::lock_guard<std::mutex> lock(mu_);
    std::vector<pending_code> out;
    out.reserve(pending_.size());
    for (const pending_span& p : pending_) out.push_back(p.code);
    return out;
  }

  unwind_tables_info info() {
    std::lock_guard<std::mutex> lock(mu_);
    unwind_tables_info i = info_;
    i.parsed = modules_.size();
    i.bytes = 0;
    auto bytes_of = [](const module_unwind& m) {
      return sizeof(module_unwind) + m.table.rows.capacity() * sizeof(unwind_row) +
             m.index.capacity() * sizeof(std::uint32_t);
    };
    for (auto& m : modules_) i.bytes += bytes_of(*m.second);
    for (auto& m : retired_) i.bytes += bytes_of(*m);
    for (auto& s : sets_)
      i.bytes += sizeof(unwind_set_storage) + s->modules.capacity() * sizeof(unwind_module);
    return i;
  }

 private:
  struct counts {
    unsigned long long adds = 0, subs = 0;
  };
  using key = std::tuple<std::string, std::uintptr_t, std::uintptr_t>;  // name, load bias, eh_frame_hdr
  struct pending_span {  // one executable segment of a module left unparsed
    pending_code code;
    key module;
  };
  struct scan_context {
    unwind_tables_state* self;
    std::vector<module_unwind*> present;
    std::vector<std::string> notes;
    std::vector<pending_span> pending;
    bool lazy;
    bool revalidate;  // check kept rows against their files (the module list changed since they were used)
    double parse_ms;
  };

  static counts read_counts() {
    counts c;
    dl_iterate_phdr(
        [](dl_phdr_info* info, std::size_t size, void* data) -> int {
          counts* out = static_cast<counts*>(data);
          if (size >= offsetof(dl_phdr_info, dlpi_subs) + sizeof(info->dlpi_subs)) {
            out->adds = info->dlpi_adds;
            out->subs = info->dlpi_subs;
          }
          return 1;  // the counters are the same in every entry: one is enough
        },
        &c);
    return c;
  }

  static const ElfW(Phdr) * find_eh(const dl_phdr_info* info) {
    const ElfW(Phdr)* eh = nullptr;
    for (int i = 0; i < info->dlpi_phnum; ++i)
      if (info->dlpi_phdr[i].p_type == PT_GNU_EH_FRAME) eh = &info->dlpi_phdr[i];
    return eh;
  }
  static std::string module_name(const dl_phdr_info* info) {
    return info->dlpi_name && info->dlpi_name[0] ? info->dlpi_name : "[main]";
  }
  static key key_of(const dl_phdr_info* info, const ElfW(Phdr) * eh) {
    return key{module_name(info), info->dlpi_addr, info->dlpi_addr + eh->p_vaddr};
  }
  static module_file_id file_of(const dl_phdr_info* info) {
    module_file_id id;
    struct stat st;
    const char* path = info->dlpi_name && info->dlpi_name[0] ? info->dlpi_name : "/proc/self/exe";
    if (::stat(path, &st) != 0) return id;
    id.dev = static_cast<std::uint64_t>(st.st_dev);
    id.ino = static_cast<std::uint64_t>(st.st_ino);
    id.size = static_cast<std::uint64_t>(st.st_size);
    id.mtime_s = static_cast<std::int64_t>(st.st_mtim.tv_sec);
    id.mtime_ns = static_cast<std::int64_t>(st.st_mtim.tv_nsec);
    return id;
  }

  // A module's .eh_frame_hdr and .eh_frame as the parser reads them: copies (see copy_in), or the memory
  // itself where copies are refused.
  struct eh_bytes {
    eh_frame_input hdr, frames;
    std::vector<std::uint8_t> hdr_copy, frames_copy;
  };

  // Points `in` at a private copy of its bytes, read through sys().read_own_memory: a page of a library
  // truncated in place since it was mapped ends the copy (the rows then stop there) instead of raising
  // SIGBUS in the collector, which a lazy parse long after the mapping makes likelier. Where the kernel
  // refuses the copy (seccomp), `in` keeps reading the memory directly.
  static void copy_in(eh_frame_input& in, std::vector<std::uint8_t>& copy) {
    if (in.size == 0) return;
    copy.resize(in.size);
    const long got = sys().read_own_memory(copy.data(), in.address, in.size);
    if (got < 0) {
      copy.clear();
      return;
    }
    copy.resize(static_cast<std::size_t>(got));
    in.data = copy.data();
    in.size = copy.size();
  }

  // Where a module's .eh_frame_hdr and .eh_frame lie, copied (frames.size 0: not found; `why` says what).
  static void locate(const dl_phdr_info* info, const ElfW(Phdr) * eh, eh_bytes& b, const char*& why) {
    b.frames = eh_frame_input{};
    b.hdr = segment_from(info, info->dlpi_addr + eh->p_vaddr);
    if (b.hdr.size > eh->p_memsz) b.hdr.size = eh->p_memsz;
    copy_in(b.hdr, b.hdr_copy);
    eh_frame_hdr_info hi;
    if (b.hdr.size == 0 || !parse_eh_frame_hdr(b.hdr, hi)) {
      b.hdr.size = 0;
      why = "unreadable .eh_frame_hdr";
      return;
    }
    b.frames = segment_from(info, hi.eh_frame);
    if (b.frames.size == 0) {
      why = ".eh_frame is outside the loaded segments";
      return;
    }
    // The search table lists every FDE: stop after the last one instead of trusting a terminator.
    if (hi.fde_limit > hi.eh_frame && hi.fde_limit - hi.eh_frame < b.frames.size) {
      eh_frame_input last{nullptr, std::min<std::size_t>(12, b.frames.size - (hi.fde_limit - hi.eh_frame)),
                          hi.fde_limit};
      last.data = reinterpret_cast<const std::uint8_t*>(last.address);
      std::vector<std::uint8_t> last_copy;
      copy_in(last, last_copy);
      eh_cursor c{last.data, 0, last.size, last.address};
      std::uint64_t len = c.fixed(4);
      if (len == 0xffffffffu) len = c.fixed(8);
      const std::size_t at = hi.fde_limit - hi.eh_frame;
      if (c.ok && len <= b.frames.size - at - c.pos)
        b.frames.size = at + c.pos + static_cast<std::size_t>(len);
    }
    copy_in(b.frames, b.frames_copy);
  }

  // A hash of the bytes the rows are parsed from (.eh_frame_hdr and .eh_frame), eight at a time: a
  // fraction of a parse (no CFA programs are run), and it sees a changed frame layout that keeps every
  // offset in .eh_frame_hdr the same.
  static std::uint64_t content_hash(const eh_bytes& b) {
    std::uint64_t h = 1469598103934665603ull;
    auto mix = [&h](const eh_frame_input& in) {
      std::size_t i = 0;
      for (; i + 8 <= in.size; i += 8) {
        std::uint64_t w;
        std::memcpy(&w, in.data + i, 8);
        h = (h ^ w) * 0x100000001b3ull;
        h ^= h >> 29;
      }
      for (; i < in.size; ++i) h = (h ^ in.data[i]) * 1099511628211ull;
      h = (h ^ in.size) * 1099511628211ull;
    };
    mix(b.hdr);
    mix(b.frames);
    return h;
  }

  // `out`: `in` with its program headers copied into `phdrs`. dl_iterate_phdr points into the module's
  // first mapped page, which a library truncated in place has lost (a read would raise SIGBUS); false
  // then. Where copies are refused (see copy_in) `out` reads the memory directly.
  static bool copy_phdrs(const dl_phdr_info* in, dl_phdr_info& out, std::vector<ElfW(Phdr)>& phdrs) {
    out = dl_phdr_info{};
    out.dlpi_addr = in->dlpi_addr;
    out.dlpi_name = in->dlpi_name;
    out.dlpi_phdr = in->dlpi_phdr;
    out.dlpi_phnum = in->dlpi_phnum;
    const std::size_t bytes = sizeof(ElfW(Phdr)) * in->dlpi_phnum;
    if (bytes == 0) return true;
    phdrs.resize(in->dlpi_phnum);
    const long got =
        sys().read_own_memory(phdrs.data(), reinterpret_cast<std::uintptr_t>(in->dlpi_phdr), bytes);
    if (got < 0) return true;
    if (static_cast<std::size_t>(got) != bytes) return false;
    out.dlpi_phdr = phdrs.data();
    return true;
  }

  static int visit(dl_phdr_info* mapped, std::size_t, void* data) {
    scan_context& ctx = *static_cast<scan_context*>(data);
    dl_phdr_info copy;
    std::vector<ElfW(Phdr)> phdrs;
    if (!copy_phdrs(mapped, copy, phdrs)) {
      ctx.notes.push_back("unwind: " + module_name(mapped) +
                          ": program headers unreadable (file truncated?)");
      return 0;
    }
    const dl_phdr_info* info = &copy;
    const ElfW(Phdr)* eh = find_eh(info);
    std::string name = module_name(info);
    if (eh == nullptr) {
      bool has_code = false;
      for (int i = 0; i < info->dlpi_phnum; ++i)
        if (info->dlpi_phdr[i].p_type == PT_LOAD && (info->dlpi_phdr[i].p_flags & PF_X)) has_code = true;
      if (has_code) ctx.notes.push_back("unwind: " + name + " has no .eh_frame_hdr: frame pointers only");
      return 0;
    }
    const key k = key_of(info, eh);
    auto found = ctx.self->modules_.find(k);
    if (found != ctx.self->modules_.end() && !ctx.revalidate) {
      ctx.present.push_back(found->second.get());
      return 0;
    }
    const std::vector<key>& wanted = ctx.self->wanted_;
    if (ctx.lazy && found == ctx.self->modules_.end() &&
        std::find(wanted.begin(), wanted.end(), k) == wanted.end()) {
      for (const auto& c : code_ranges(info)) ctx.pending.push_back(pending_span{{c.first, c.second}, k});
      return 0;
    }
    const module_file_id file = file_of(info);
    const auto t0 = std::chrono::steady_clock::now();
    eh_bytes bytes;
    const char* why = nullptr;
    locate(info, eh, bytes, why);
    const std::uint64_t hash = content_hash(bytes);
    if (found != ctx.self->modules_.end()) {
      // Same name, load address and .eh_frame_hdr address: the same module only if it is the same file
      // and the same bytes. Every build checks, not only the first after a stop: a dlclose and a dlopen
      // of the rebuilt library may both happen between two builds.
      if (found->second->file == file) {
        if (found->second->content_hash == hash) {
          if (ctx.self->revalidate_) ++ctx.self->info_.reused;
          ctx.present.push_back(found->second.get());
          return 0;
        }
      }
      // A published set may still point at the old rows: they are freed at release().
      ctx.self->retired_.push_back(std::move(found->second));
      ctx.self->modules_.erase(found);
    }
    std::unique_ptr<module_unwind> m(new module_unwind());
    m->name = name;
    m->bias = info->dlpi_addr;
    m->hdr = std::get<2>(k);
    m->file = file;
    m->content_hash = hash;
    parse_module(info, bytes, why, *m, ctx.notes);
    ctx.parse_ms += std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    ctx.present.push_back(m.get());
    ctx.self->modules_.emplace(k, std::move(m));
    return 0;
  }

  // The module's executable PT_LOAD segments at run time, sorted.
  static std::vector<std::pair<std::uintptr_t, std::uintptr_t>> code_ranges(const dl_phdr_info* info) {
    std::vector<std::pair<std::uintptr_t, std::uintptr_t>> code;
    for (int i = 0; i < info->dlpi_phnum; ++i) {
      const ElfW(Phdr)& p = info->dlpi_phdr[i];
      if (p.p_type == PT_LOAD && (p.p_flags & PF_X) && p.p_memsz > 0)
        code.emplace_back(info->dlpi_addr + p.p_vaddr, info->dlpi_addr + p.p_vaddr + p.p_memsz);
    }
    std::sort(code.begin(), code.end());
    return code;
  }

  // The bytes of the loaded segment holding `address`: [address, segment end), or size 0.
  static eh_frame_input segment_from(const dl_phdr_info* info, std::uintptr_t address) {
    for (int i = 0; i < info->dlpi_phnum; ++i) {
      const ElfW(Phdr)& p = info->dlpi_phdr[i];
      if (p.p_type != PT_LOAD) continue;
      std::uintptr_t lo = info->dlpi_addr + p.p_vaddr, hi = lo + p.p_filesz;
      if (address >= lo && address < hi)
        return eh_frame_input{reinterpret_cast<const std::uint8_t*>(address), hi - address, address};
    }
    return eh_frame_input{};
  }

  static void parse_module(const dl_phdr_info* info, const eh_bytes& bytes, const char* why, module_unwind& m,
                           std::vector<std::string>& notes) {
    if (bytes.frames.size == 0) {
      notes.push_back("unwind: " + m.name + ": " + (why ? why : "no .eh_frame"));
      return;
    }
    m.table = parse_eh_frame(bytes.frames);
    if (!m.table.error.empty())
      notes.push_back("unwind: " + m.name + ": " + std::to_string(m.table.skipped) +
                      " records skipped; first: " + m.table.error);
    // Only the module's own code: an FDE pointing elsewhere (broken input) must not shadow another module.
    const std::size_t before = m.table.rows.size();
    clip_unwind_rows(m.table, code_ranges(info));
    if (before != 0 && m.table.rows.empty())
      notes.push_back("unwind: " + m.name + ": no FDE covers its executable segments");
    m.table.rows.shrink_to_fit();
    if (!m.table.rows.empty())
      build_row_index(m.table.rows.data(), m.table.rows.size(), m.table.end - m.table.start, m.index);
  }

  std::mutex mu_;
  std::map<key, std::unique_ptr<module_unwind>> modules_;
  std::vector<std::unique_ptr<module_unwind>> retired_;  // replaced while a set may point at them
  std::vector<std::unique_ptr<unwind_set_storage>> sets_;
  std::vector<pending_span> pending_;  // by start address
  std::vector<key> wanted_;            // modules want() asked a lazy build to parse
  bool wanted_new_ = false;            // want() asked for one since the last build
  std::uint64_t pending_generation_ = 0;
  counts counts_;
  bool have_counts_ = false;
  bool revalidate_ = false;  // the first build after release(): kept modules found count as reused
  unwind_tables_info info_;
};

inline unwind_tables_state& unwind_tables() {
  static unwind_tables_state* state = new unwind_tables_state();  // never destroyed: usable from atexit
  return *state;
}

}  // namespace detail

// Builds and publishes the unwind tables of every loaded module; rebuilds only when modules were loaded
// or unloaded since the last call (call it at start and from the collector's periodic check).
inline status build_unwind_tables() { return detail::unwind_tables().build(false); }

namespace detail {
// The collector's build: modules are parsed once unwind_tables().want() asked for them.
inline status build_unwind_tables_lazily() { return unwind_tables().build(false, true); }
}  // namespace detail

// Unpublishes the tables (the parsed rows of loaded modules are kept for the next start). Call only when
// no sampling handler can run any more (after stop).
inline void release_unwind_tables() { detail::unwind_tables().release(); }

// fork(2) child, when another thread of the parent may have been inside build(): a fresh state (the old
// one is leaked; no handler runs in the child until a new start() publishes a new set).
inline void abandon_unwind_tables_after_fork() {
  new (&detail::unwind_tables()) detail::unwind_tables_state();
}

inline unwind_tables_info get_unwind_tables_info() { return detail::unwind_tables().info(); }

}  // namespace selfprof
// ---- end selfprof/unwind/tables.hpp ----

namespace selfprof {
namespace detail {

class code_watch {
 public:
  void set_ranges(std::vector<code_range> ranges) {
    ranges_ = std::move(ranges);
    last_ = 0;
  }
  void set_perf_map(const perf_map* map) { map_ = map; }
  // Code of modules whose unwind rows are not parsed yet (by start address).
  void set_pending_rows(std::vector<pending_code> code) {
    pending_ = std::move(code);
    asked_.assign(pending_.size(), false);
  }

  // Notes whether `pc` lies in known code; a pc in anonymous (or unknown) memory becomes a perf-map
  // tagged value when a line covers it. Values already tagged by the JIT registry pass through.
  void translate(std::uint64_t& pc, std::uint64_t time_ns) {
    // Kernel pcs (the ring source's kernel call chains) are named from kallsyms, not from mappings.
    if (is_jit_tagged(pc) || is_perf_map_tagged(pc) || is_kernel_address(pc)) return;
    const code_range* r = find(pc);
    if (r == nullptr) unknown_ = true;
    if ((r == nullptr || r->anonymous) && map_ != nullptr) map_->tag(pc, time_ns);
    if (!pending_.empty()) note_pending(pc);
  }

  // A pc in each pending module samples reached since the last call (once per module).
  std::vector<std::uint64_t> take_row_requests() { return std::exchange(requests_, {}); }

  // True once since a sample landed outside every known range.
  bool take_unknown() { return std::exchange(unknown_, false); }
  void forget() {
    ranges_.clear();
    last_ = 0;
    unknown_ = false;
    pending_.clear();
    asked_.clear();
    requests_.clear();
  }

 private:
  void note_pending(std::uint64_t pc) {
    const pending_code* c = find_pending(pending_, pc);
    if (c == nullptr) return;
    const std::size_t i = static_cast<std::size_t>(c - pending_.data());
    if (asked_[i]) return;
    asked_[i] = true;
    requests_.push_back(pc);
  }

  const code_range* find(std::uint64_t pc) {
    if (last_ < ranges_.size() && pc >= ranges_[last_].start && pc < ranges_[last_].end)
      return &ranges_[last_];
    auto it = std::upper_bound(ranges_.begin(), ranges_.end(), pc,
                               [](std::uint64_t a, const code_range& r) { return a < r.start; });
    if (it == ranges_.begin()) return nullptr;
    --it;
    if (pc >= it->end) return nullptr;
    last_ = static_cast<std::size_t>(it - ranges_.begin());
    return &*it;
  }

  std::vector<code_range> ranges_;  // by start address
  std::size_t last_ = 0;            // the range found last: consecutive pcs are mostly in one module
  const perf_map* map_ = nullptr;
  bool unknown_ = false;
  std::vector<pending_code> pending_;    // code whose unwind rows are not parsed, by start address
  std::vector<bool> asked_;              // per pending_ entry: already in requests_ since it was set
  std::vector<std::uint64_t> requests_;  // a pc in each pending module samples reached
};

}  // namespace detail
}  // namespace selfprof
// ---- end selfprof/collect/code_watch.hpp ----
// ---- begin selfprof/collect/snapshot.hpp ----
// A raw snapshot: what the collector has folded so far (stacks of raw addresses), the names of the
// threads, and what the profile is about. Symbolized only when a profile is written (dump/).
// Context: any thread except the signal handler (a value type).

#include <cstdint>
#include <string>
#include <unordered_map>


namespace selfprof {
namespace detail {

struct raw_snapshot {
  stack_table table;
  std::unordered_map<std::uint32_t, std::string> thread_names;
  profile_info info;
};

}  // namespace detail
}  // namespace selfprof
// ---- end selfprof/collect/snapshot.hpp ----
// ---- begin selfprof/collect/windows.hpp ----
// Time windows: the same samples as the cumulative table, also kept in one-second buckets, so a dump can
// hold "the last N seconds" and consecutive windowed dumps never count a sample twice. The buckets share
// one memory limit: only the newest bucket grows, up to what the others leave of it (past that, new
// stacks go to the memory-ceiling stack).
// Context: collector thread (and dump callers holding the collector's table lock).

#include <cstddef>
#include <cstdint>
#include <deque>


namespace selfprof {
namespace detail {

constexpr std::uint64_t kWindowBucketNs = 1000000000ull;

class window_tables {
 public:
  // `limit_bytes`: of all the buckets together (0: no limit).
  void configure(std::uint64_t window_ns, std::size_t limit_bytes = 0) {
    window_ns_ = window_ns;
    buckets_.clear();
    cut_seq_ = 0;
    next_seq_ = 0;
    merged_records_ = 0;
    merged_weight_ = 0;
    limit_ = limit_bytes;
  }
  bool enabled() const { return window_ns_ != 0; }

  void add(std::uint32_t tid, std::uint16_t flags, const std::uint64_t* pcs, std::size_t depth,
           std::uint64_t weight, std::uint64_t now_ns) {
    if (!enabled()) return;
    if (buckets_.empty() || now_ns - buckets_.back().start_ns >= kWindowBucketNs) {
      drop_old(now_ns);  // before the new bucket's limit is set from what the others hold
      open_bucket(now_ns);
    }
    stack_table& t = buckets_.back().table;
    const std::uint64_t before = t.merged_records();
    t.add_bounded(tid, flags, pcs, depth, weight);
    if (t.merged_records() != before) {
      ++merged_records_;
      merged_weight_ += weight;
    }
    buckets_.back().end_ns = now_ns;
  }

  // Samples of the last window not yet handed out by a successful windowed dump. Closes the open
  // bucket, so samples that arrive from now on belong to the next window. Returns the sequence
  // number to pass to mark_dumped() once the dump was written.
  std::uint64_t take(std::uint64_t now_ns, stack_table& out) {
    drop_old(now_ns);
    std::uint64_t last = cut_seq_;
    for (const bucket& b : buckets_) {
      if (b.seq < cut_seq_) continue;
      if (b.end_ns + window_ns_ < now_ns && b.end_ns != 0) continue;
      out.merge(b.table);
      last = b.seq + 1;
    }
    open_bucket(now_ns);
    return last;
  }
  void mark_dumped(std::uint64_t seq) {
    if (seq > cut_seq_) cut_seq_ = seq;
  }

  // See stack_table::merge_threads.
  template <typename Pred>
  void merge_threads(Pred ended) {
    for (bucket& b : buckets_) b.table.merge_threads(ended);
  }
  std::size_t memory_bytes() const {
    std::size_t n = 0;
    for (const bucket& b : buckets_) n += b.table.memory_bytes();
    return n;
  }
  // Records of new stacks counted under the memory-ceiling stack since configure(), and their weight.
  std::uint64_t merged_records() const { return merged_records_; }
  std::uint64_t merged_weight() const { return merged_weight_; }

 private:
  struct bucket {
    std::uint64_t seq = 0, start_ns = 0, end_ns = 0;
    stack_table table;
  };
  void open_bucket(std::uint64_t now_ns) {
    buckets_.emplace_back();
    buckets_.back().seq = next_seq_++;
    buckets_.back().start_ns = now_ns;
    if (limit_ == 0) return;
    const std::size_t used = memory_bytes();
    buckets_.back().table.set_limit(used < limit_ ? limit_ - used : 1);
  }
  void drop_old(std::uint64_t now_ns) {
    while (buckets_.size() > 1 && buckets_.front().end_ns + window_ns_ < now_ns) buckets_.pop_front();
  }

  std::uint64_t window_ns_ = 0, cut_seq_ = 0, next_seq_ = 0;
  std::size_t limit_ = 0;
  std::uint64_t merged_records_ = 0, merged_weight_ = 0;
  std::deque<bucket> buckets_;
};

}  // namespace detail
}  // namespace selfprof
// ---- end selfprof/collect/windows.hpp ----
// ---- begin selfprof/game/rates.hpp ----
// SELFPROF_FRAME_HZ: threads that mark game frames may be sampled faster than the others, so a slow
// frame has enough samples to show what made it slow. Their samples then enter the all-frames profile at
// the common rate (a fraction of their weight, carried over), so that profile stays proportional to CPU
// time.
// Context: collector thread (and dump callers holding the sample store's lock).

#include <cstdint>
#include <unordered_map>
#include <vector>

namespace selfprof {
namespace detail {

class game_frame_rates {
 public:
  void configure(double hz, double frame_hz) {
    hz_ = hz;
    boost_hz_ = frame_hz > hz ? frame_hz : 0;
    boosted_.clear();
  }
  void clear() { boosted_.clear(); }
  // Forgets which threads were boosted: after a source switch they must be boosted again.
  void forget_boosted() { boosted_.clear(); }

  // The rate of marking threads, or 0 when they run at the common rate.
  double boost_hz() const { return boost_hz_; }

  // Of the threads that mark frames now, those not tried at boost_hz() yet.
  std::vector<std::uint32_t> to_boost(const std::vector<std::uint32_t>& marking) const {
    std::vector<std::uint32_t> out;
    if (boost_hz_ <= 0) return out;
    for (std::uint32_t tid : marking)
      if (!boosted_.count(tid)) out.push_back(tid);
    return out;
  }
  void tried(std::uint32_t tid, bool applied) { boosted_[tid].applied = applied; }

  // The weight a sample of `tid` carries in the all-frames profile.
  std::uint64_t common_weight(std::uint32_t tid, std::uint32_t weight) {
    auto b = boosted_.find(tid);
    if (boost_hz_ <= 0 || b == boosted_.end() || !b->second.applied) return weight;
    double& credit = b->second.credit;
    credit += static_cast<double>(weight) * hz_ / boost_hz_;
    auto whole = static_cast<std::uint64_t>(credit);
    credit -= static_cast<double>(whole);
    return whole;
  }

 private:
  struct boost {
    bool applied = false;
    double credit = 0;
  };
  double hz_ = 99, boost_hz_ = 0;
  std::unordered_map<std::uint32_t, boost> boosted_;
};

}  // namespace detail
}  // namespace selfprof
// ---- end selfprof/game/rates.hpp ----
// ---- begin selfprof/game/tracker.hpp ----
// The collector's view of game/engine frames: holds each tagged sample until its frame closes, keeps the
// samples of frames over budget as the "slow frames" table, the worst frames in time order, and the
// frame-duration statistics of every loop.
// Context: collector thread (and dump callers holding the collector's table lock).

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <map>
#include <string>
#include <utility>
#include <vector>

// ---- begin selfprof/signal/ring.hpp ----
// Signal-handler code: the preallocated multi-producer, single-consumer ring of fixed-size sample records.
// Context: producers run in the signal handler (lock-free, never wait); the one consumer is whoever holds
// the collector's table lock.

#include <atomic>
#include <cstddef>
#include <cstdint>

namespace selfprof {
namespace detail {

enum sample_flags : std::uint16_t {
  sample_truncated = 1u << 0,   // root-side frames are missing: the depth limit, or a copied stack ended
  sample_offcpu = 1u << 1,      // wall mode: the thread was not running
  sample_leaf_fixed = 1u << 2,  // the caller of the interrupted frame was recovered by a leaf heuristic
  sample_running = 1u << 3,     // wall mode without on-CPU signals: CPU time of a thread, no stack
};
// Wall mode: off-CPU samples carry the blocking system call in the flags' upper bits (number + 1; 0 when
// the thread was blocked outside a system call), so stacks that wait in different calls stay apart.
constexpr unsigned kSampleCallShift = 4;
constexpr std::uint16_t kSampleCallMask = 0xFFF0;
constexpr std::uint16_t kSampleKeptFlags =
    sample_truncated | sample_offcpu | sample_running | kSampleCallMask;

// One sample, as the handler writes it. `pcs` follows the header in the slot: pcs[0] is the interrupted
// pc, pcs[1..depth) are return addresses, leaf first.
struct sample_header {
  std::uint32_t tid;
  std::uint16_t depth;
  std::uint16_t flags;
  std::uint32_t weight;   // ticks this sample stands for (1 + timer overruns)
  std::uint64_t time_ns;  // CLOCK_MONOTONIC when taken
  std::uint64_t tag;      // frame marker of the thread (game frames), 0 if none
};

struct ring_slot {
  std::atomic<std::uint64_t> seq;
  sample_header header;
  // followed by max_depth std::uint64_t program counters
  std::uint64_t* pcs() { return reinterpret_cast<std::uint64_t*>(this + 1); }
};
static_assert(sizeof(ring_slot) % 8 == 0, "slots must keep 8-byte alignment");

// A bounded MPSC queue (sequence numbers per slot, after D. Vyukov's design). The memory is given by the
// owner and outlives every handler that may still run.
class sample_ring {
 public:
  sample_ring() = default;
  sample_ring(const sample_ring&) = delete;
  sample_ring& operator=(const sample_ring&) = delete;

  static std::size_t stride_for(std::size_t max_depth) {
    return sizeof(ring_slot) + max_depth * sizeof(std::uint64_t);
  }

  // `memory` must hold capacity * stride_for(max_depth) bytes, 8-byte aligned; capacity a power of two.
  // `zeroed`: the memory is all zero bytes (fresh anonymous pages), the initial state as it is, so no
  // slot is touched here and the kernel provides only the pages that samples reach.
  void init(void* memory, std::size_t capacity, std::size_t max_depth, bool zeroed = false) {
    base_ = static_cast<unsigned char*>(memory);
    capacity_ = capacity;
    mask_ = capacity - 1;
    max_depth_ = max_depth;
    stride_ = stride_for(max_depth);
    // std::atomic<uint64_t> is trivially default-constructible: zeroed memory from the owner holds one.
    if (!zeroed)
      for (std::size_t i = 0; i < capacity; ++i) slot(i)->seq.store(0, std::memory_order_relaxed);
    head_.store(0, std::memory_order_relaxed);
    tail_ = 0;
    mapped_ = zeroed ? 0 : capacity;
  }

  std::size_t capacity() const { return capacity_; }
  // The slots map_ahead() maps past the producers (0: a quarter of the ring, for signal handlers, whose
  // bursts nobody bounds). A source the collector reads writes at most what one read finds.
  void set_map_ahead(std::size_t slots) { ahead_.store(slots, std::memory_order_relaxed); }
  std::size_t max_depth() const { return max_depth_; }

  // Producer: claims a slot or returns nullptr when the ring is full. Fill it, then publish(slot, pos).
  ring_slot* claim(std::uint64_t& pos) {
    std::uint64_t p = head_.load(std::memory_order_relaxed);
    for (;;) {
      ring_slot* s = slot(p & mask_);
      const std::uint64_t seq = sequence(s->seq.load(std::memory_order_acquire), p & mask_);
      auto dif = static_cast<std::int64_t>(seq - p);
      if (dif == 0) {
        if (head_.compare_exchange_weak(p, p + 1, std::memory_order_relaxed)) {
          pos = p;
          return s;
        }
      } else if (dif < 0) {
        return nullptr;  // full: the consumer has not freed this slot yet
      } else {
        p = head_.load(std::memory_order_relaxed);
      }
    }
  }
  static void publish(ring_slot* s, std::uint64_t pos) { s->seq.store(pos + 2, std::memory_order_release); }

  // Consumer: the next published slot, or nullptr. Call release() when done with it.
  ring_slot* peek() {
    ring_slot* s = slot(tail_ & mask_);
    const std::uint64_t seq = sequence(s->seq.load(std::memory_order_acquire), tail_ & mask_);
    return seq == tail_ + 1 ? s : nullptr;
  }
  void release(ring_slot* s) {
    s->seq.store(tail_ + capacity_ + 1, std::memory_order_release);
    ++tail_;
  }
  // Consumer: maps the pages of the slots up to a quarter of the ring (or set_map_ahead's count) past the
  // producers by writing each slot's word (a locked no-op), once in the ring's life. A fresh page whose
  // first access is a read (claim() reads the word) maps the shared zero page, and the producer's write
  // that follows replaces it: a copy-on-write fault that flushes the TLB of every CPU the process runs
  // on, an interrupt in each running application thread, page after page. Written first, a page is
  // mapped once, here.
  void map_ahead() {
    const std::size_t want = ahead_.load(std::memory_order_relaxed);
    const std::uint64_t ahead = head_.load(std::memory_order_relaxed) + (want ? want : capacity_ / 4);
    const std::uint64_t until = ahead < capacity_ ? ahead : capacity_;
    for (; mapped_ < until; ++mapped_) slot(mapped_)->seq.fetch_or(0, std::memory_order_relaxed);
  }

 private:
  // A slot's stored word is its sequence number plus one; 0 is the initial state, sequence = the slot's
  // index (Vyukov's initial value), so zeroed memory is a ready ring.
  static std::uint64_t sequence(std::uint64_t stored, std::size_t index) {
    return stored == 0 ? index : stored - 1;
  }

  ring_slot* slot(std::size_t i) { return reinterpret_cast<ring_slot*>(base_ + i * stride_); }

  unsigned char* base_ = nullptr;
  std::size_t capacity_ = 0, mask_ = 0, max_depth_ = 0, stride_ = 0;
  alignas(64) std::atomic<std::uint64_t> head_{0};
  alignas(64) std::uint64_t tail_ = 0;
  std::uint64_t mapped_ = 0;  // slots below it have been written (consumer only)
  std::atomic<std::size_t> ahead_{0};
};

}  // namespace detail
}  // namespace selfprof
// ---- end selfprof/signal/ring.hpp ----

namespace selfprof {
namespace detail {

// Program counters held for frames not closed yet, over all threads (8 bytes each): 16 MiB. Past it,
// the oldest open frame of the thread that adds loses its samples (counted in held_dropped).
constexpr std::size_t kMaxHeldPcs = std::size_t(1) << 21;
// Worst frames kept with their samples in time order, for the per-frame drill-down.
constexpr std::size_t kWorstGameFramesKept = 16;
// Frame verdicts remembered per thread for samples that reach the collector after their frame closed.
constexpr std::size_t kRecentVerdicts = 64;

// Frame durations in log-spaced buckets 1% wide from 1 µs: bounded memory, quantiles within 1%.
class duration_histogram {
 public:
  static constexpr std::size_t kBuckets = 2200;  // 1 µs * 1.01^2200 ≈ 3 hours
  void add(std::uint64_t ns) {
    if (counts_.empty()) counts_.assign(kBuckets, 0);
    ++counts_[index(ns)];
    ++count_;
    if (ns > max_) max_ = ns;
  }
  std::uint64_t count() const { return count_; }
  std::uint64_t max_ns() const { return max_; }
  // The q-quantile (0 < q <= 1): the geometric middle of the bucket holding the rank ceil(q * count).
  double quantile_ns(double q) const {
    if (count_ == 0) return 0;
    const double at = q * static_cast<double>(count_);
    auto rank = static_cast<std::uint64_t>(at);  // rounded up below, without libm's ceil
    if (static_cast<double>(rank) < at) ++rank;
    if (rank < 1) rank = 1;
    std::uint64_t seen = 0;
    for (std::size_t i = 0; i < counts_.size(); ++i) {
      seen += counts_[i];
      if (seen < rank) continue;
      double mid = i == 0 ? 500.0 : bounds()[i - 1] * kSqrtRatio;
      return std::min(mid, static_cast<double>(max_));
    }
    return static_cast<double>(max_);
  }

 private:
  static constexpr double kRatio = 1.01;
  static constexpr double kSqrtRatio = 1.004987562112089;  // the geometric middle of a bucket
  // bounds()[k] = 1 µs * 1.01^k in ns: bucket k + 1 holds [bounds()[k], bounds()[k + 1]). A table and a
  // binary search instead of log() and pow(): the preload library then needs no libm, one library less
  // for every process it is loaded into to map.
  static const double* bounds() {
    struct table {
      double at[kBuckets];
      table() {
        double b = 1000.0;
        for (double& x : at) {
          x = b;
          b *= kRatio;
        }
      }
    };
    static const table t;
    return t.at;
  }
  static std::size_t index(std::uint64_t ns) {
    const double* b = bounds();
    const double* past = std::upper_bound(b, b + kBuckets - 1, static_cast<double>(ns));
    return static_cast<std::size_t>(past - b);  // 0 below 1 µs; at most kBuckets - 1
  }
  std::vector<std::uint64_t> counts_;
  std::uint64_t count_ = 0, max_ = 0;
};

// One sample of a marked thread, as drained from the ring.
struct held_sample {
  std::uint64_t time_ns = 0;
  std::uint32_t tid = 0;
  std::uint16_t flags = 0;
  std::uint32_t weight = 1;
  std::vector<std::uint64_t> pcs;
};

// One closed frame kept whole for the drill-down; samples in the order they were taken.
struct kept_game_frame {
  std::string loop;
  std::uint32_t tid = 0;
  std::uint64_t seq = 0, start_ns = 0, end_ns = 0;
  std::vector<held_sample> samples;
  double duration_ms() const { return static_cast<double>(end_ns - start_ns) / 1e6; }
};

class game_frame_tracker {
 public:
  // budget_ms: a frame longer than this is slow. Call before the first sample of a profile.
  void configure(double budget_ms, std::uint64_t start_ns) {
    budget_ns_ = static_cast<std::uint64_t>(budget_ms * 1e6);
    budget_ms_ = budget_ms;
    start_ns_ = start_ns;
  }
  void clear() {
    loops_.clear();
    stats_.clear();
    slow_.clear();
    worst_.clear();
    pending_.clear();
    held_pcs_ = held_dropped_ = late_ = 0;
  }

  // Step 1 of a drain: take the frames closed so far (before draining the sample ring, so every sample
  // of these frames that the handler published before the mark is in the ring by then).
  void collect_closed() {
    std::uint32_t n = g_game_frames.high_water.load(std::memory_order_acquire);
    for (std::uint32_t i = 0; i < n && i < kGameFrameSlots; ++i) {
      game_frame_slot& s = g_game_frames.slots[i];
      std::uint32_t st = s.state.load(std::memory_order_acquire);
      if (st != game_frame_live && st != game_frame_retired) continue;
      loop_state& ls = loop_for(i, s);
      std::uint64_t head = s.head.load(std::memory_order_acquire);
      for (std::uint64_t t = s.tail.load(std::memory_order_relaxed); t != head; ++t) {
        const closed_game_frame& f = s.ring[t % kClosedGameFrameRing];
        pending_.push_back(closing{i, f});
        ls.history.push_back(f);
        if (ls.history.size() > kRecentVerdicts) ls.history.pop_front();
      }
      s.tail.store(head, std::memory_order_release);
      std::uint64_t lost = s.lost.load(std::memory_order_relaxed);
      if (lost > ls.lost_seen) {
        stats_for(ls).lost += lost - ls.lost_seen;
        ls.lost_seen = lost;
      }
      if (st == game_frame_retired) ls.retire_after_processing = true;
    }
  }

  // The tag of the frame thread `tid` was running at `time_ns`, or 0: for samples that carry a time and
  // no tag (kGameFrameTagByTime: the ring source's, which the kernel wrote without running any code of
  // selfprof's on the thread). Call after collect_closed(). Frames are looked up among those taken
  // already (the history), those closed and not taken yet (the slot's ring from tail to head, which only
  // the collector advances, so the marking thread never writes there), then the running frame, which
  // began where the last closed one ended (or at the first mark). Closed frames the slot's ring had no
  // room for are not known: samples after such a loss are tagged as the frame after the last one known.
  std::uint64_t tag_at(std::uint32_t tid, std::uint64_t time_ns) const {
    for (const auto& l : loops_) {
      const loop_state& ls = l.second;
      if (ls.tid != tid) continue;
      const std::uint64_t slot_bits = std::uint64_t(l.first + 1) << kGameFrameTagShift;
      auto in = [time_ns](const closed_game_frame& f) { return f.start_ns <= time_ns && time_ns < f.end_ns; };
      for (auto it = ls.history.rbegin(); it != ls.history.rend(); ++it)
        if (in(*it)) return slot_bits | (it->seq & kGameFrameSeqMask);
      const game_frame_slot& s = g_game_frames.slots[l.first];
      const closed_game_frame* last = ls.history.empty() ? nullptr : &ls.history.back();
      const std::uint64_t head = s.head.load(std::memory_order_acquire);
      for (std::uint64_t t = s.tail.load(std::memory_order_relaxed); t != head; ++t) {
        const closed_game_frame& f = s.ring[t % kClosedGameFrameRing];
        if (in(f)) return slot_bits | (f.seq & kGameFrameSeqMask);
        last = &f;
      }
      if (last) {
        if (time_ns >= last->end_ns) return slot_bits | ((last->seq + 1) & kGameFrameSeqMask);
        continue;  // before every frame still known
      }
      const std::uint64_t first = s.start_ns.load(std::memory_order_relaxed);
      if (first != 0 && time_ns >= first) return slot_bits | 1;
    }
    return 0;
  }

  // Step 2, for each drained sample: holds a tagged sample until its frame closes. Returns false when
  // the sample is not on a marked thread.
  bool add_sample(const sample_header& h, const std::uint64_t* pcs, std::size_t depth, std::uint16_t flags) {
    if (h.tag == 0) return false;
    std::size_t slot = game_frame_tag_slot(h.tag);
    if (slot >= kGameFrameSlots || !loops_.count(slot))
      return true;  // the collector has not seen the slot yet
    loop_state& ls = loops_[slot];
    std::uint64_t seq = game_frame_tag_seq(h.tag);
    held_sample hs;
    hs.time_ns = h.time_ns;
    hs.tid = h.tid;
    hs.flags = flags;
    hs.weight = h.weight;
    hs.pcs.assign(pcs, pcs + depth);
    if (seq <= ls.last_closed) {  // its frame was decided already (the sample was late in the ring)
      ++late_;
      for (auto& v : ls.recent)
        if (v.first == seq && v.second) slow_.add(hs.tid, hs.flags, pcs, depth, hs.weight);
      return true;
    }
    held_pcs_ += depth;
    ls.open[seq].push_back(std::move(hs));
    while (held_pcs_ > kMaxHeldPcs && !ls.open.empty()) {
      auto oldest = ls.open.begin();
      for (auto& x : oldest->second) {
        held_pcs_ -= x.pcs.size();
        ++held_dropped_;
      }
      ls.open.erase(oldest);
    }
    return true;
  }

  // Step 3: decide the frames taken in step 1: statistics, slow table, worst frames; free retired slots.
  void process_closed() {
    for (closing& c : pending_) {
      auto it = loops_.find(c.slot);
      if (it == loops_.end()) continue;
      loop_state& ls = it->second;
      std::vector<held_sample> samples;
      auto open = ls.open.find(c.frame.seq);
      if (open != ls.open.end()) {
        samples = std::move(open->second);
        ls.open.erase(open);
        for (auto& x : samples) held_pcs_ -= x.pcs.size();
      }
      // Samples of frames before this one can no longer arrive complete: drop them.
      while (!ls.open.empty() && ls.open.begin()->first < c.frame.seq) {
        for (auto& x : ls.open.begin()->second) held_pcs_ -= x.pcs.size();
        ls.open.erase(ls.open.begin());
      }
      ls.last_closed = std::max(ls.last_closed, c.frame.seq);
      if (c.frame.start_ns < start_ns_) continue;  // began before this profile
      const std::uint64_t dur = c.frame.end_ns - c.frame.start_ns;
      frame_loop_acc& acc = stats_for(ls);
      acc.hist.add(dur);
      const bool slow = dur > budget_ns_;
      if (slow) ++acc.over;
      ls.recent.emplace_back(c.frame.seq, slow);
      if (ls.recent.size() > kRecentVerdicts) ls.recent.pop_front();
      if (slow)
        for (auto& x : samples) slow_.add(x.tid, x.flags, x.pcs.data(), x.pcs.size(), x.weight);
      keep_if_worst(ls, c.frame, std::move(samples));
    }
    pending_.clear();
    for (auto it = loops_.begin(); it != loops_.end();) {
      if (!it->second.retire_after_processing) {
        ++it;
        continue;
      }
      for (auto& o : it->second.open)
        for (auto& x : o.second) held_pcs_ -= x.pcs.size();
      game_frame_slot& s = g_game_frames.slots[it->first];
      std::uint32_t expected = game_frame_retired;
      s.state.compare_exchange_strong(expected, game_frame_free, std::memory_order_acq_rel);
      it = loops_.erase(it);
    }
  }

  bool any_marked() const { return !stats_.empty(); }
  const stack_table& slow_table() const { return slow_; }
  std::uint64_t held_dropped() const { return held_dropped_; }
  std::uint64_t late_samples() const { return late_; }
  double budget_ms() const { return budget_ms_; }
  // Threads that mark frames now (the collector may sample them faster).
  std::vector<std::uint32_t> live_tids() const {
    std::vector<std::uint32_t> out;
    for (auto& l : loops_)
      if (!l.second.retire_after_processing) out.push_back(l.second.tid);
    return out;
  }

  std::vector<frame_loop_stats> stats() const {
    std::vector<frame_loop_stats> out;
    for (auto& e : stats_) {
      frame_loop_stats s;
      s.name = e.first.first;
      s.tid = e.first.second;
      s.count = e.second.hist.count();
      s.over_budget = e.second.over;
      s.lost = e.second.lost;
      s.budget_ms = budget_ms_;
      s.p50_ms = e.second.hist.quantile_ns(0.50) / 1e6;
      s.p95_ms = e.second.hist.quantile_ns(0.95) / 1e6;
      s.p99_ms = e.second.hist.quantile_ns(0.99) / 1e6;
      s.max_ms = static_cast<double>(e.second.hist.max_ns()) / 1e6;
      out.push_back(s);
    }
    return out;
  }

  // The worst frames kept so far, longest first.
  const std::vector<kept_game_frame>& worst() const { return worst_; }

 private:
  struct loop_state {
    std::uint32_t generation = 0, tid = 0;
    std::string name;
    std::uint64_t last_closed = 0, lost_seen = 0;
    bool retire_after_processing = false;
    std::map<std::uint64_t, std::vector<held_sample>> open;  // frame seq -> samples
    std::deque<std::pair<std::uint64_t, bool>> recent;       // (seq, slow) of the last frames decided
    std::deque<closed_game_frame> history;                   // the last frames taken, oldest first
  };
  struct frame_loop_acc {
    duration_histogram hist;
    std::uint64_t over = 0, lost = 0;
  };
  struct closing {
    std::size_t slot;
    closed_game_frame frame;
  };

  loop_state& loop_for(std::size_t i, game_frame_slot& s) {
    std::uint32_t gen = s.generation.load(std::memory_order_relaxed);
    auto it = loops_.find(i);
    if (it != loops_.end() && it->second.generation == gen) return it->second;
    loop_state& ls = loops_[i];
    for (auto& o : ls.open)
      for (auto& x : o.second) held_pcs_ -= x.pcs.size();
    ls = loop_state{};
    ls.generation = gen;
    ls.tid = s.tid.load(std::memory_order_relaxed);
    const char* n = s.name.load(std::memory_order_relaxed);
    ls.name = n ? n : "frame";
    ls.lost_seen = s.lost.load(std::memory_order_relaxed);  // losses before this profile are not its own
    stats_for(ls);  // a loop shows in the statistics from its first mark
    return ls;
  }

  frame_loop_acc& stats_for(const loop_state& ls) { return stats_[{ls.name, ls.tid}]; }

  void keep_if_worst(const loop_state& ls, const closed_game_frame& f, std::vector<held_sample> samples) {
    const std::uint64_t dur = f.end_ns - f.start_ns;
    if (worst_.size() >= kWorstGameFramesKept && dur <= worst_.back().end_ns - worst_.back().start_ns) return;
    kept_game_frame k;
    k.loop = ls.name;
    k.tid = ls.tid;
    k.seq = f.seq;
    k.start_ns = f.start_ns;
    k.end_ns = f.end_ns;
    k.samples = std::move(samples);
    auto pos = std::find_if(worst_.begin(), worst_.end(),
                            [&](const kept_game_frame& w) { return w.end_ns - w.start_ns < dur; });
    worst_.insert(pos, std::move(k));
    if (worst_.size() > kWorstGameFramesKept) worst_.pop_back();
  }

  double budget_ms_ = 16.7;
  std::uint64_t budget_ns_ = 16700000, start_ns_ = 0;
  std::map<std::size_t, loop_state> loops_;                                // by slot index
  std::map<std::pair<std::string, std::uint32_t>, frame_loop_acc> stats_;  // by (loop, tid)
  std::vector<closing> pending_;
  stack_table slow_;
  std::vector<kept_game_frame> worst_;
  std::size_t held_pcs_ = 0;
  std::uint64_t held_dropped_ = 0, late_ = 0;
};

// A profile of one kept frame: `table` holds its distinct stacks and `order` lists, sample by sample in
// time order, the table entry and weight. reorder_game_frame_profile() turns the symbolized stacks into that
// sequence, so a flame chart (svg_options::flamechart) shows the frame left to right in time.
struct game_frame_sequence {
  stack_table table;
  std::vector<std::pair<std::uint32_t, std::uint64_t>> order;
};

inline game_frame_sequence make_game_frame_sequence(const kept_game_frame& k) {
  game_frame_sequence out;
  std::map<std::pair<std::uint32_t, std::vector<std::uint64_t>>, std::uint32_t> index;
  for (const held_sample& s : k.samples) {
    auto key = std::make_pair(static_cast<std::uint32_t>(s.flags), s.pcs);
    auto it = index.find(key);
    std::uint32_t at = 0;
    if (it == index.end()) {
      at = static_cast<std::uint32_t>(out.table.unique());  // add() appends a new entry at the end
      out.table.add(s.tid, s.flags, s.pcs.data(), s.pcs.size(), 1);
      index.emplace(std::move(key), at);
    } else {
      at = it->second;
    }
    out.order.emplace_back(at, s.weight);
  }
  return out;
}

// `p` built from game_frame_sequence::table (one stack per entry, in entry order): stacks become the
// sequence.
inline void reorder_game_frame_profile(profile& p, const game_frame_sequence& seq) {
  std::vector<stack> ordered;
  ordered.reserve(seq.order.size());
  std::uint64_t total = 0;
  for (auto& o : seq.order) {
    if (o.first >= p.stacks.size()) continue;
    stack s = p.stacks[o.first];
    s.count = o.second;
    total += o.second;
    ordered.push_back(std::move(s));
  }
  p.stacks = std::move(ordered);
  p.info.samples = total;
}

}  // namespace detail
}  // namespace selfprof
// ---- end selfprof/game/tracker.hpp ----
// ---- begin selfprof/sources/source.hpp ----
// The tick-source interface: what every sampling mechanism (perf_event, CPU timer, itimer) provides.
// Context: setup only and the collector thread (never the signal handler).

#include <sys/types.h>
#include <time.h>

#include <cstdint>
#include <string>
#include <vector>


namespace selfprof {

namespace detail {

struct source_config {
  double hz = 99;
  int signal_number = 0;
  bool allow_user_only = false;  // perf: accept an event that excludes kernel time
  // perf, wall mode: only a software task clock that excludes the kernel, whose ticks land in user code
  // only (wall/sampler.hpp explains why that keeps EINTR away from blocking calls).
  bool user_clock_only = false;
  std::size_t max_depth = 0;  // ring: the kernel's call-chain depth (0: its default)
};

// A source that pulls samples (the ring): what it read, as the handler's counters say it for signals.
struct pulled_stats {
  std::uint64_t records = 0;    // samples written into the sample ring
  std::uint64_t truncated = 0;  // of them, stacks cut by the depth limit
  std::uint64_t full = 0;       // samples dropped: the sample ring was full
  std::uint64_t lost = 0;       // the kernel's PERF_RECORD_LOST counts, and records that did not parse
  std::uint64_t throttles = 0;  // PERF_RECORD_THROTTLE records
  std::uint64_t user_chain_since_ns = 0;  // CLOCK_MONOTONIC since the kernel's user chain is asked for, or 0
  std::uint64_t chain_cut = 0;    // samples cut where that chain (not asked for then) would have gone on
  bool chain_given_back = false;  // it was asked for, then continued too few stacks, and was given up
  std::uint64_t ring_pages = 0;   // data pages of the largest CPU ring now (the rings grow, see perf_ring)
  std::uint64_t overlap = 0;      // samples both sets of events took while the rings grew (kept once)
};

// What a pulling source may ask of the collector while it unwinds the samples it read, when rows are
// parsed lazily: whether a pc lies in code whose rows were never parsed (such a walk went on by frame
// pointers, which code without them does not keep), and to parse them now. Collector thread only.
class row_requests {
 public:
  virtual ~row_requests() = default;
  virtual bool unparsed(std::uint64_t pc) const = 0;
  // True when the rows of the module holding `pc` were parsed now (and published for the next walk).
  virtual bool parse(std::uint64_t pc) = 0;
};

class tick_source {
 public:
  virtual ~tick_source() = default;
  virtual source_kind kind() const = 0;
  // A short description of what was opened (e.g. "perf task-clock (user+kernel)").
  virtual std::string describe() const = 0;
  // Process-wide setup; checks that the mechanism works (opens one probe for the calling thread).
  virtual status open(const source_config& config) = 0;
  // Per-thread sources arm one thread by tid, from any thread of the process. A failure carries the errno
  // (status::code): EMFILE, ENFILE or ENOMEM mean "out of resources", which a fallback source may cover.
  virtual bool per_thread() const = 0;
  virtual status arm(pid_t tid) = 0;
  virtual void disarm(pid_t tid) = 0;
  // Disarms every thread and releases every kernel object. Idempotent.
  virtual void close() = 0;
  // A forked child holds copies of the parent's kernel objects: forget them without touching the
  // parent's (no disable ioctl); just release this process's references.
  virtual void abandon_after_fork() = 0;
  virtual std::size_t armed_count() const = 0;
  // Sampling rate really delivered per CPU-second (may be lower than requested: timer above the tick).
  virtual double effective_hz() const = 0;
  virtual bool counts_kernel_time() const = 0;
  // Samples one armed thread at `hz` instead (SELFPROF_FRAME_HZ on threads that mark game frames).
  // Sources that send no signal (sources/perf_ring.hpp): the collector reads their samples into the
  // sample ring (`skip`: selfprof's own threads, dropped), every collect_period_ms(). With `rows`, a
  // sample whose walk met code with unparsed rows has them parsed and is walked again.
  virtual bool pulls_samples() const { return false; }
  virtual std::size_t collect(sample_ring& out, const std::vector<pid_t>& skip,
                              row_requests* rows = nullptr) {
    (void)out;
    (void)skip;
    (void)rows;
    return 0;
  }
  virtual std::size_t collect_again(sample_ring& out) {  // with the last `skip` (at stop)
    (void)out;
    return 0;
  }
  // The most samples one collect() may write into the sample ring now (0: not bounded).
  virtual std::size_t records_per_read() const { return 0; }
  virtual unsigned collect_period_ms() const { return 50; }
  virtual pulled_stats pulled() const { return {}; }  // what collect() read, for stats
  virtual status set_thread_rate(pid_t tid, double hz) {
    (void)tid;
    (void)hz;
    return status::error(std::string(source_name(kind())) + ": no per-thread rate");
  }
};

// Kernel tick rate (CONFIG_HZ), read from the resolution of the coarse clock, which advances by one tick.
inline double kernel_tick_hz() {
  struct timespec res {};
  if (clock_getres(CLOCK_MONOTONIC_COARSE, &res) == 0 && (res.tv_sec > 0 || res.tv_nsec > 0))
    return 1e9 / (static_cast<double>(res.tv_sec) * 1e9 + static_cast<double>(res.tv_nsec));
  return 250;  // the most common CONFIG_HZ
}

inline std::int64_t period_ns_for(double hz) {
  if (!(hz > 0)) hz = 99;
  double ns = 1e9 / hz;
  return ns < 1000 ? 1000 : static_cast<std::int64_t>(ns);
}

}  // namespace detail
}  // namespace selfprof
// ---- end selfprof/sources/source.hpp ----

namespace selfprof {
namespace detail {

struct store_config {
  bool wall = false;  // counts are microseconds: a tick stands for one period of CPU time
  double hz = 99;
  double window_s = 0;
  double frame_budget_ms = 16.7;
  double frame_hz = 0;
  std::size_t max_depth = 128;
  std::size_t table_limit = 0;   // bytes of the cumulative stack table (0: no limit)
  std::size_t window_limit = 0;  // bytes of all the window buckets together (0: no limit)
};

// Threads with their own per-thread total (and stacks) before ended ones are merged: a program that
// starts a thread per request must not grow with every thread it ever ran.
constexpr std::size_t kThreadEntriesBeforeMerge = 1024;

// What was merged to stay within the memory limits (stats, profile notes).
struct merge_counts {
  std::uint64_t stack_records = 0;  // records of new stacks counted under the memory-ceiling stack
  std::uint64_t samples = 0;        // their weight (samples; microseconds in wall mode)
  std::uint64_t threads = 0;        // ended threads whose stacks and totals were merged into one
};

class sample_store {
 public:
  // Starts a session: forgets every sample.
  void begin(const store_config& c) {
    std::lock_guard<std::mutex> lock(mu_);
    config_ = c;
    period_ns_ = static_cast<std::uint64_t>(period_ns_for(c.hz));
    table_ = stack_table();  // not clear(): the last session's capacity would count against this one's limit
    table_.set_limit(c.table_limit);
    by_thread_.clear();
    threads_merged_ = 0;
    windows_.configure(static_cast<std::uint64_t>(c.window_s * 1e9), c.window_limit);
    games_.clear();
    games_.configure(c.frame_budget_ms, monotonic_ns());
    rates_.configure(c.hz, c.frame_hz);
    pcs_.assign(c.max_depth, 0);
  }

  // Takes every published record out of `ring`. `ended`: nothing writes the ring any more (stop()), so
  // no page is mapped ahead for writers (a short process would fault them in just before it exits).
  void drain(sample_ring& ring, bool ended = false) {
    std::lock_guard<std::mutex> lock(mu_);
    drain_locked(ring, !ended);
  }

  // Executable ranges from the last module scan, and the perf map to name JIT samples with (or null).
  void set_code(std::vector<code_range> ranges, const perf_map* map) {
    std::lock_guard<std::mutex> lock(mu_);
    code_.set_ranges(std::move(ranges));
    code_.set_perf_map(map);
  }
  // True once after a sample landed outside every known executable range.
  bool take_unknown_code() {
    std::lock_guard<std::mutex> lock(mu_);
    return code_.take_unknown();
  }
  // Code whose unwind rows are not parsed yet; samples that reach it are noted for the collector.
  void set_pending_rows(std::vector<pending_code> code) {
    std::lock_guard<std::mutex> lock(mu_);
    code_.set_pending_rows(std::move(code));
  }
  // A pc in each module of that code that samples reached since the last call.
  std::vector<std::uint64_t> take_row_requests() {
    std::lock_guard<std::mutex> lock(mu_);
    return code_.take_row_requests();
  }

  std::uint64_t total() {
    std::lock_guard<std::mutex> lock(mu_);
    return table_.total();
  }

  // Drains `ring` (when given), then copies the table into `out`: the cumulative one, or with
  // `windowed` (and SELFPROF_WINDOW set) the samples of the last window not yet written, whose sequence
  // number goes to window_written() once the dump is written.
  void copy_table(sample_ring* ring, bool windowed, raw_snapshot& out, std::uint64_t* window_seq) {
    std::lock_guard<std::mutex> lock(mu_);
    if (ring) drain_locked(*ring);
    const bool window = windowed && windows_.enabled();
    if (window) {
      const std::uint64_t seq = windows_.take(monotonic_ns(), out.table);
      if (window_seq) *window_seq = seq;
    } else {
      out.table = table_;
    }
    out.info.frame_loops = games_.stats();
    const merge_counts m = merged_locked(window);
    if (m.samples)
      out.info.notes.push_back(std::to_string(m.samples) + (config_.wall ? " us" : " samples") + " of " +
                               std::to_string(m.stack_records) +
                               " records with new stacks counted under [selfprof: memory ceiling] "
                               "(SELFPROF_MAX_MEMORY)");
    if (m.threads)
      out.info.notes.push_back(std::to_string(m.threads) +
                               " ended threads merged into one, [ended threads] (SELFPROF_MAX_MEMORY)");
    if (games_.held_dropped())
      out.info.notes.push_back(std::to_string(games_.held_dropped()) +
                               " samples of open game frames dropped (held-sample memory bound)");
  }
  void window_written(std::uint64_t seq) {
    std::lock_guard<std::mutex> lock(mu_);
    windows_.mark_dumped(seq);
  }
  bool windowed() {
    std::lock_guard<std::mutex> lock(mu_);
    return windows_.enabled();
  }

  // The samples of game frames over budget; `marked` says whether any game frame was marked at all.
  stack_table slow_table(bool& marked) {
    std::lock_guard<std::mutex> lock(mu_);
    marked = games_.any_marked();
    return games_.slow_table();
  }
  // Up to `n` of the longest game frames, longest first, each with its samples in time order.
  std::vector<kept_game_frame> worst(sample_ring* ring, std::size_t n) {
    std::lock_guard<std::mutex> lock(mu_);
    if (ring) drain_locked(*ring);
    std::vector<kept_game_frame> out = games_.worst();
    if (out.size() > n) out.resize(n);
    return out;
  }
  // The rate samples of marking threads are taken at (the common rate unless SELFPROF_FRAME_HZ).
  double game_frame_hz() {
    std::lock_guard<std::mutex> lock(mu_);
    return rates_.boost_hz() > 0 ? rates_.boost_hz() : config_.hz;
  }
  // Threads that mark game frames and were not tried at SELFPROF_FRAME_HZ yet.
  std::vector<std::uint32_t> to_boost() {
    std::lock_guard<std::mutex> lock(mu_);
    return rates_.to_boost(games_.live_tids());
  }
  void boost_tried(std::uint32_t tid, bool applied) {
    std::lock_guard<std::mutex> lock(mu_);
    rates_.tried(tid, applied);
  }
  void forget_boosted() {
    std::lock_guard<std::mutex> lock(mu_);
    rates_.forget_boosted();
  }

  std::unordered_map<std::uint32_t, std::uint64_t> samples_by_thread() {
    std::lock_guard<std::mutex> lock(mu_);
    return by_thread_;
  }
  struct sizes {
    std::uint64_t samples = 0;
    std::size_t unique = 0, bytes = 0;
  };
  sizes size() {
    std::lock_guard<std::mutex> lock(mu_);
    return sizes{table_.total(), table_.unique(), table_.memory_bytes() + windows_.memory_bytes()};
  }
  merge_counts merged() {
    std::lock_guard<std::mutex> lock(mu_);
    return merged_locked();
  }

  // True when ended threads should be merged: many threads have entries of their own, or the tables
  // are past half their limit.
  bool wants_thread_merge() {
    std::lock_guard<std::mutex> lock(mu_);
    if (by_thread_.size() > kThreadEntriesBeforeMerge) return true;
    return table_.limit() != 0 && table_.memory_bytes() > table_.limit() / 2;
  }
  // Merges the stacks and totals of every thread not in `live` (sorted) into thread kMergedThreadsTid.
  void merge_ended_threads(const std::vector<std::uint32_t>& live) {
    std::lock_guard<std::mutex> lock(mu_);
    auto ended = [&live](std::uint32_t tid) { return !std::binary_search(live.begin(), live.end(), tid); };
    std::uint64_t moved = 0;
    for (auto it = by_thread_.begin(); it != by_thread_.end();) {
      if (it->first == kMergedThreadsTid || !ended(it->first)) {
        ++it;
        continue;
      }
      moved += it->second;
      it = by_thread_.erase(it);
      ++threads_merged_;
    }
    if (moved) by_thread_[kMergedThreadsTid] += moved;
    if (by_thread_.bucket_count() > 4 * (by_thread_.size() + kThreadEntriesBeforeMerge))
      by_thread_.rehash(0);  // the buckets of thousands of gone threads
    table_.merge_threads(ended);
    windows_.merge_threads(ended);
  }

  std::mutex& lock_for_fork() { return mu_; }
  // fork(2) child: the samples are the parent's; start empty.
  void abandon_after_fork() {
    new (&mu_) std::mutex();
    table_.clear();
    by_thread_.clear();
    threads_merged_ = 0;
    games_.clear();
    rates_.clear();
    code_.forget();
  }

 private:
  void drain_locked(sample_ring& ring, bool map_ahead = true) {
    const std::uint64_t now = windows_.enabled() ? monotonic_ns() : 0;
    games_.collect_closed();  // before the ring: the samples of these frames are in it
    while (ring_slot* s = ring.peek()) {
      sample_header h = s->header;
      if (h.tag == kGameFrameTagByTime) h.tag = games_.tag_at(h.tid, h.time_ns);
      const std::uint16_t flags = static_cast<std::uint16_t>(h.flags & kSampleKeptFlags);
      std::size_t depth = h.depth <= ring.max_depth() ? h.depth : ring.max_depth();
      if (depth > pcs_.size()) depth = pcs_.size();
      const bool wall_record = (flags & (sample_offcpu | sample_running)) != 0;
      if (depth > 0 || wall_record) {
        const std::uint64_t* raw = s->pcs();
        for (std::size_t i = 0; i < depth; ++i) {
          pcs_[i] = raw[i];
          if (!jit_translate_pc(pcs_[i], h.time_ns)) code_.translate(pcs_[i], h.time_ns);
        }
        games_.add_sample(h, pcs_.data(), depth, flags);
        std::uint64_t w = rates_.common_weight(h.tid, h.weight);
        // Wall mode counts microseconds: the sampler's records already are; a tick stands for one period.
        if (config_.wall && !wall_record) w = (w * period_ns_ + 500) / 1000;
        if (w > 0) {
          table_.add_bounded(h.tid, flags, pcs_.data(), depth, w);
          windows_.add(h.tid, flags, pcs_.data(), depth, w, now);
          by_thread_[h.tid] += w;
        }
      }
      ring.release(s);
    }
    if (map_ahead) ring.map_ahead();
    games_.process_closed();
  }

  // Of the cumulative table, or of the window buckets (`windowed`).
  merge_counts merged_locked(bool windowed = false) const {
    merge_counts m;
    m.stack_records = windowed ? windows_.merged_records() : table_.merged_records();
    m.samples = windowed ? windows_.merged_weight() : table_.merged_weight();
    m.threads = threads_merged_;
    return m;
  }

  std::mutex mu_;
  store_config config_;
  std::uint64_t period_ns_ = 0;
  stack_table table_;
  window_tables windows_;
  std::unordered_map<std::uint32_t, std::uint64_t> by_thread_;
  std::uint64_t threads_merged_ = 0;
  game_frame_tracker games_;
  game_frame_rates rates_;
  std::vector<std::uint64_t> pcs_;  // one record's addresses, translated
  code_watch code_;
};

}  // namespace detail
}  // namespace selfprof
// ---- end selfprof/collect/sample_store.hpp ----
// ---- begin selfprof/collect/session_info.hpp ----
// What a profiling session chose and remarked: the tick source in use (it can change while sampling, when
// the contention upgrade switches it), why, what was refused, and notes, each marked for whether it
// belongs in the profiles written (the decision is a flag, never a match on the text).
// Context: any thread except the signal handler; every method takes the object's lock.

#include <mutex>
#include <new>
#include <string>
#include <vector>


namespace selfprof {
namespace detail {

struct source_info {
  source_kind kind = source_kind::none;
  std::string detail;  // what was opened
  std::string reason;  // why it was chosen
  double effective_hz = 0;
  bool kernel_time = true;  // its samples include time spent in the kernel
};

class session_info {
 public:
  void clear() {
    std::lock_guard<std::mutex> lock(mu_);
    source_ = source_info{};
    refused_.clear();
    notes_.clear();
  }
  void set_source(const source_info& s) {
    std::lock_guard<std::mutex> lock(mu_);
    source_ = s;
  }
  source_info source() {
    std::lock_guard<std::mutex> lock(mu_);
    return source_;
  }
  void set_refused(std::vector<std::string> r) {
    std::lock_guard<std::mutex> lock(mu_);
    refused_ = std::move(r);
  }
  std::vector<std::string> refused() {
    std::lock_guard<std::mutex> lock(mu_);
    return refused_;
  }
  // `in_profile`: also said in every profile this session writes (its notes, the SVG's subtitle).
  void note(std::string text, bool in_profile = false) {
    std::lock_guard<std::mutex> lock(mu_);
    notes_.push_back(note_entry{std::move(text), in_profile});
  }
  void notes(std::vector<std::string>& all, std::vector<std::string>* profile_only = nullptr) {
    std::lock_guard<std::mutex> lock(mu_);
    for (const note_entry& n : notes_) {
      all.push_back(n.text);
      if (profile_only && n.in_profile) profile_only->push_back(n.text);
    }
  }
  void abandon_after_fork() {
    new (&mu_) std::mutex();
    source_ = source_info{};
    refused_.clear();
    notes_.clear();
  }

 private:
  struct note_entry {
    std::string text;
    bool in_profile;
  };
  std::mutex mu_;
  source_info source_;
  std::vector<std::string> refused_;
  std::vector<note_entry> notes_;
};

}  // namespace detail
}  // namespace selfprof
// ---- end selfprof/collect/session_info.hpp ----
// ---- begin selfprof/collect/thread_registry.hpp ----
// The thread registry: every live thread of the process (found in /proc/self/task or registered by the
// thread itself), armed with the primary tick source or, where that runs out of descriptors or memory,
// with a fallback CPU timer; the names of every thread seen; and the move of every thread to a new
// primary source (the contention upgrade, sources/contention.hpp).
// Context: setup only and the collector thread; register_current() on the registering thread, names() and
// blocking() on a thread taking a snapshot or stats, and scan() there too when a snapshot comes before the
// collector's first scan (scanned()). Every method takes the registry's own lock.
//
// A thread is (tid, start time) (detail/task_start_time): a tid is reused once its thread has exited. A
// record whose tid now shows another start time belongs to a dead thread: it is dropped (its source
// disarmed) and the new thread armed. Known threads are re-checked kVerifyPerScan per scan, round robin
// (one /proc read each: all of them at every scan would cost ~70 ms at 10,000 threads).
// Arming a thread that is not the caller is checked: a perf_event is opened and its signal owner set
// (F_SETOWN_EX F_OWNER_TID) by tid, which may by then name a thread of another process; so the start time
// is re-read just before and just after the arm, and the event is closed at once when the thread is no
// longer the one recorded. perf_event_source::arm also checks, while the event is still disabled, that the
// tid is a thread of this process (the event and its signal owner are bound to the task, not the number),
// so no window remains where another process's thread gets a tick. A CPU timer (SIGEV_THREAD_ID on a thread
// CPU clock) cannot target another process's thread (the kernel refuses with EINVAL), so timers are not
// checked: at worst one lands on a new thread of this process that reused the tid (sampled correctly; the
// record is fixed at a re-check). /proc is read outside the lock (names, masks, start times); the lock covers
// the records and the sources, so register_current() never waits for a snapshot reading 10,000 threads'
// names.

#include <pthread.h>
#include <signal.h>
#include <sys/types.h>
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

// ---- begin selfprof/sources/cpu_timer.hpp ----
// Tick source: one POSIX CPU-time timer per thread (timer_create on the thread's CPU clock, SIGEV_THREAD_ID),
// armed for every thread from one thread, so no code has to run in the target thread.
// Context: setup only and the collector thread.

#include <signal.h>
#include <time.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <string>
#include <unordered_map>

// ---- begin selfprof/signal/handler.hpp ----
// Signal-handler code: the profiling signal handler and the lock-free globals it reads.
// Context: signal handler (async-signal-safe only: no malloc, no locks, no lazy TLS, errno preserved).

#include <signal.h>
#include <sys/stat.h>
#include <ucontext.h>

#include <errno.h>
#include <time.h>
#include <atomic>
#include <cstddef>
#include <cstdint>

// ---- begin selfprof/signal/altstack.hpp ----
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

#include <errno.h>
#include <signal.h>
#include <sys/syscall.h>
#include <ucontext.h>
#include <unistd.h>

#include <atomic>
#include <cstddef>
#include <cstdint>


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
// ---- end selfprof/signal/altstack.hpp ----
// ---- begin selfprof/signal/unwind.hpp ----
// The stack walker: one loop over a memory policy (the interrupted thread's live stack, or a copy of a
// blocked thread's stack) and the row in effect at each pc (a CFI row, else the frame-pointer row).
// Context: signal handler (async-signal-safe: no locks, no allocation, every live-stack read bounded and
// probed); the walk over a copy also runs on the wall sampler's thread.

#include <cstddef>
#include <cstdint>


// NO_SANITIZE: see load_word. ALWAYS_INLINE: see apply_row.
#if defined(__clang__) || defined(__GNUC__)
#define SELFPROF_DETAIL_NO_SANITIZE __attribute__((no_sanitize("address", "thread", "undefined")))
#define SELFPROF_DETAIL_ALWAYS_INLINE __attribute__((always_inline)) inline
#else
#define SELFPROF_DETAIL_NO_SANITIZE
#define SELFPROF_DETAIL_ALWAYS_INLINE inline
#endif

namespace selfprof {
namespace detail {

// Every bound of the walk, with its reason.
// A single frame larger than this is taken for a corrupted chain (async-profiler uses 256 KiB too).
constexpr std::uintptr_t kMaxFrameSize = 256 * 1024;
// How far above sp the walk may go when the thread's stack end is unknown (main-thread default
// RLIMIT_STACK is 8 MiB; deeper stacks are still walked when the thread's end is known).
constexpr std::uintptr_t kMaxStackSpan = 16 * 1024 * 1024;
// A known thread stack larger than this is not trusted as a bound (guards against a bogus descriptor).
constexpr std::uintptr_t kMaxKnownStack = 1024ull * 1024 * 1024;
// CFAs and frame records are 16-byte aligned in ABI-conforming x86-64 code; 8 tolerates hand-written
// assembly.
constexpr std::uintptr_t kFrameAlign = 8;
// Return addresses below this are not code: the chain ended in zeroed memory.
constexpr std::uintptr_t kMinCodeAddress = 4096;
// Readability is probed a page at a time: the smallest page size of the supported systems.
constexpr std::uintptr_t kPageSize = 4096;
// Frame records are 16-byte aligned in ABI-conforming x86-64 code (rsp is 16-aligned after `push %rbp`);
// scanning a copy only at those halves the chance of taking data for a record.
constexpr std::uintptr_t kFrameRecordAlign = 16;
// Candidates for a scanned frame record tried per walk: stale records of earlier calls lie below the
// live one, so the first plausible pair is not always right; the one whose walk ends cleanly is.
constexpr int kMaxRecordCandidates = 32;

// Remembers the highest page range already shown readable, so each page is probed once per walk.
struct read_guard {
  std::uintptr_t ok_lo = 1, ok_hi = 0;  // empty

  bool readable(std::uintptr_t addr, std::size_t len) {
    std::uintptr_t end = addr + len;
    if (end < addr) return false;
    if (addr >= ok_lo && end <= ok_hi) return true;
    std::uintptr_t first = addr & ~(kPageSize - 1);
    std::uintptr_t last = (end - 1) & ~(kPageSize - 1);
    for (std::uintptr_t page = first;; page += kPageSize) {
      if (!(page >= ok_lo && page + kPageSize <= ok_hi) && !raw_readable(page)) return false;
      if (page == last) break;
    }
    if (ok_lo <= ok_hi && first >= ok_lo && first <= ok_hi) {
      if (last + kPageSize > ok_hi) ok_hi = last + kPageSize;  // contiguous: extend
    } else {
      ok_lo = first;
      ok_hi = last + kPageSize;
    }
    return true;
  }
};

// Reads of the interrupted thread's stack and code: bounds-checked and probed by the walker, and not
// instrumented, since a sanitizer would take a read of another frame's saved registers for a bug.
SELFPROF_DETAIL_NO_SANITIZE inline std::uint64_t load_word(std::uintptr_t addr) {
  return *reinterpret_cast<const volatile std::uint64_t*>(addr);
}
SELFPROF_DETAIL_NO_SANITIZE inline unsigned char load_byte(std::uintptr_t addr) {
  return *reinterpret_cast<const volatile unsigned char*>(addr);
}

// The highest address the current thread's frames may occupy, or 0 when unknown.
inline std::uintptr_t current_thread_stack_end(std::uintptr_t sp, std::uintptr_t main_end, bool is_main) {
  if (is_main && main_end > sp && main_end - sp <= kMaxKnownStack) return main_end;
  const std::uintptr_t self = thread_descriptor();
  if (self > sp && self - sp <= kMaxKnownStack) return self;
  return 0;
}

// For a leaf without CFI, interrupted in its prologue or epilogue: the slot of the return address the
// code bytes at `pc` tell (prologue_return_slot), or 0. The code page is probed first.
inline std::uintptr_t leaf_return_slot(std::uintptr_t pc, std::uintptr_t sp) {
  if (!kHasPrologueHeuristics) return 0;
  read_guard code_guard;
  if (pc < kMinCodeAddress || !code_guard.readable(pc, kPrologueBytes)) return 0;
  unsigned char code[kPrologueBytes];
  for (std::size_t i = 0; i < kPrologueBytes; ++i) code[i] = load_byte(pc + i);
  return prologue_return_slot(code, sp);
}

// Why a walk ended.
enum class walk_end : std::uint8_t {
  bad_frame,     // a bound or check failed: what follows is not known to be a stack
  outermost,     // an outermost CFI row: the thread's first frame
  zero_return,   // a null return address: the end of the frame chain
  depth_limit,   // out[] is full and a valid frame is left (truncated)
  ran_off_copy,  // the next read lies past the end of a copied stack (which ended before the stack did)
  rbp_unknown,   // a copy's row needs rbp, which the kernel did not report (the walk scans for a record)
};

struct unwind_result {
  std::size_t depth = 0;
  bool truncated = false;
  bool leaf_fixed = false;  // the leaf's caller came from the prologue/epilogue heuristics
  bool scanned = false;     // a frame record was found by scanning (rbp was not known)
  walk_end end = walk_end::bad_frame;
  // The walk ended where a stack ends (outermost row, null return address, depth limit, end of a copy).
  bool clean() const { return end != walk_end::bad_frame && end != walk_end::rbp_unknown; }
};

// The registers of the frame being unwound.
struct walk_regs {
  std::uintptr_t pc, sp, fp;
  bool fp_known;  // false only in a copy, until a row or a scanned frame record tells rbp
  bool leaf;      // the first frame: its pc is not a return address
};

// The CFA `row` gives at (pc, sp, fp), or 0 when that is no step up the stack: it wraps around, is
// misaligned, leaves no room for the return address above sp, or makes a frame over kMaxFrameSize.
inline std::uintptr_t row_cfa(const unwind_row& row, std::uintptr_t pc, std::uintptr_t sp,
                              std::uintptr_t fp) {
  std::uintptr_t base = row.kind == row_cfa_rbp ? fp : sp;
  std::intptr_t off = row.cfa_off;
  if (row.kind == row_cfa_plt && (pc & 15) >= row.plt_threshold) off += 8;
  std::uintptr_t cfa = base + static_cast<std::uintptr_t>(off);
  if ((off >= 0) != (cfa >= base)) return 0;  // wrapped around
  // One unsigned range test for sp + 8 <= cfa <= sp + kMaxFrameSize (below sp, cfa - sp wraps around).
  if (cfa % kFrameAlign != 0 || cfa - sp - 8 > kMaxFrameSize - 8) return 0;
  return cfa;
}

// Memory policy: the interrupted thread's own stack. Every read lies in [sp, min(stack_end, sp +
// kMaxStackSpan)), is 8-aligned, and each new page is probed before it is read.
class live_stack {
 public:
  static constexpr bool kInterruptedPc = true;  // the leaf's pc may sit in a prologue or epilogue
  static constexpr bool kMayLackFp = false;     // rbp comes with the interrupted context

  live_stack(std::uintptr_t sp, std::uintptr_t stack_end) {
    hi_ = sp + kMaxStackSpan;
    if (hi_ < sp) hi_ = ~std::uintptr_t(0);
    if (stack_end != 0 && stack_end < hi_) hi_ = stack_end;
  }
  bool read(std::uintptr_t addr, std::uint64_t& out) {
    if (!fits(addr, 8)) return false;
    out = load_word(addr);
    return true;
  }
  bool read_pair(std::uintptr_t addr, std::uint64_t& first, std::uint64_t& second) {
    if (!fits(addr, 16)) return false;
    first = load_word(addr);
    second = load_word(addr + 8);
    return true;
  }
  bool past_end(std::uintptr_t) const { return false; }  // a failed live read is a bad frame

 private:
  // The lower bound needs no test: the walker reads nothing below the current sp, which starts at the
  // interrupted sp and only grows (row_cfa and apply_row check it).
  bool fits(std::uintptr_t addr, std::size_t len) {
    return addr + len <= hi_ && addr % 8 == 0 && guard_.readable(addr, len);  // readable: no wrap-around
  }
  std::uintptr_t hi_;
  read_guard guard_;
};

// Memory policy: a copy of part of a thread's stack, `size` bytes that were at [base, base + size).
// Reads stay inside the copy; a read past its end means the copy ended before the stack did.
struct stack_copy {
  static constexpr bool kInterruptedPc = false;  // the pc is where a system call returns, not a prologue
  static constexpr bool kMayLackFp = true;       // the kernel reports a blocked thread's sp and pc only

  std::uintptr_t base = 0;
  const unsigned char* data = nullptr;
  std::size_t size = 0;

  bool read(std::uintptr_t addr, std::uint64_t& out) const {
    if (addr < base || addr - base > size || size - (addr - base) < 8) return false;
    __builtin_memcpy(&out, data + (addr - base), 8);
    return true;
  }
  bool read_pair(std::uintptr_t addr, std::uint64_t& first, std::uint64_t& second) const {
    return read(addr, first) && read(addr + 8, second);
  }
  bool past_end(std::uintptr_t addr) const { return addr >= end(); }
  std::uintptr_t end() const { return base + size; }
};

// Row policy: frame pointers only (no tables): every frame takes the frame-pointer row.
struct frame_pointer_rows {
  const unwind_row* find(std::uintptr_t) const { return nullptr; }
};

// Row policy: the CFI rows of `set` where one covers the pc, the frame-pointer row elsewhere.
struct cfi_rows {
  const unwind_table_set* set;
  mutable std::size_t last_module = ~std::size_t{0};  // the module found last (a walk's own object)
  const unwind_row* find(std::uintptr_t pc) const { return find_unwind_row(set, pc, &last_module); }
};

// One step of the walk: applies `row` at `s` and appends the caller's return address. The row gives the
// CFA; the return address is at CFA + kReturnAddressAtCfa, the caller's rbp at CFA + fp_off when the row
// saves it (else rbp still holds it). False, with r.end set, when the walk ends here. Inlined at each
// call so that a constant row (the frame-pointer row) folds into straight-line code.
template <class Memory>
SELFPROF_DETAIL_ALWAYS_INLINE bool apply_row(Memory& mem, const unwind_row& row, walk_regs& s,
                                             unwind_result& r, std::uint64_t* out, std::size_t max_depth,
                                             bool prologue) {
  const std::uintptr_t cfa = row_cfa(row, s.pc, s.sp, s.fp);
  if (cfa == 0) {
    r.end = walk_end::bad_frame;
    return false;
  }
  const std::uintptr_t ra_at = cfa + static_cast<std::uintptr_t>(kReturnAddressAtCfa);
  std::uint64_t ra = 0, next_fp = s.fp;
  // A leaf in its epilogue: rbp was popped back already, but GCC's CFI keeps saying where it was saved
  // (it emits no DW_CFA_restore), so the slot lies below sp. rbp holds the caller's value again.
  const bool popped = row.fp_off != 0 && s.leaf &&
                      cfa + static_cast<std::uintptr_t>(static_cast<std::intptr_t>(row.fp_off)) < s.sp;
  if (row.fp_off == 0 || popped) {
    if (!mem.read(ra_at, ra)) {
      r.end = mem.past_end(ra_at) ? walk_end::ran_off_copy : walk_end::bad_frame;
      return false;
    }
  } else {
    const std::uintptr_t slot = cfa + static_cast<std::uintptr_t>(static_cast<std::intptr_t>(row.fp_off));
    if (slot < s.sp || slot + 8 > ra_at || slot % 8 != 0) {
      r.end = walk_end::bad_frame;
      return false;
    }
    // The saved rbp usually sits right below the return address (push %rbp after the call): one read.
    const bool ok =
        slot + 8 == ra_at ? mem.read_pair(slot, next_fp, ra) : mem.read(ra_at, ra) && mem.read(slot, next_fp);
    if (!ok) {
      r.end = mem.past_end(ra_at) ? walk_end::ran_off_copy : walk_end::bad_frame;
      return false;
    }
    s.fp_known = true;
  }
  if (ra < kMinCodeAddress) {
    r.end = ra == 0 ? walk_end::zero_return : walk_end::bad_frame;
    return false;
  }
  if (r.depth == max_depth) {
    r.truncated = true;  // a valid frame exists beyond the limit
    r.end = walk_end::depth_limit;
    return false;
  }
  out[r.depth++] = ra;
  if (prologue) r.leaf_fixed = true;
  s.sp = cfa;  // row_cfa made it at least sp + 8: every step moves towards the stack end
  s.fp = static_cast<std::uintptr_t>(next_fp);
  s.pc = static_cast<std::uintptr_t>(ra);
  s.leaf = false;
  return true;
}

// The walk loop. Continues at `s` with out[0..r.depth) filled, appending return addresses until the
// stack, a bound or max_depth ends it. Each frame's row is the CFI row at its pc, else (no row, or one
// this walker does not model) the frame-pointer row; at a leaf without CFI the prologue/epilogue bytes may
// give a row first. Returns with `s` at the frame where the walk stopped.
template <class Memory, class Rows>
inline unwind_result walk_frames(Memory& mem, const Rows& rows, walk_regs& s, unwind_result r,
                                 std::uint64_t* out, std::size_t max_depth) {
  // A return address points after its call: past the leaf, look up pc-1, inside the calling instruction.
  const unwind_row* row = rows.find(s.leaf ? s.pc : s.pc - 1);
  if (Memory::kInterruptedPc && s.leaf && max_depth > 1 && (row == nullptr || row->kind == row_unknown)) {
    // Entry or exit of a function without CFI: rbp still belongs to the caller and the return address is
    // at the slot the code bytes tell. Taken only when that slot holds something like one.
    const std::uintptr_t slot = leaf_return_slot(s.pc, s.sp);
    std::uint64_t ra = 0;
    if (slot != 0 && slot % 8 == 0 && mem.read(slot, ra) && ra >= kMinCodeAddress) {
      const auto cfa_off = static_cast<std::int32_t>(slot - s.sp) - std::int32_t(kReturnAddressAtCfa);
      if (!apply_row(mem, unwind_row{0, cfa_off, 0, row_cfa_rsp, 0}, s, r, out, max_depth, true)) return r;
      row = rows.find(s.pc - 1);
    }
  }
  for (;;) {
    if (row != nullptr && row->kind != row_unknown) {
      if (row->kind == row_outermost) {
        r.end = walk_end::outermost;
        return r;
      }
      if (Memory::kMayLackFp && !s.fp_known && row->kind == row_cfa_rbp) {
        r.end = walk_end::rbp_unknown;
        return r;
      }
      if (!apply_row(mem, *row, s, r, out, max_depth, false)) return r;
    } else {
      if (Memory::kMayLackFp && !s.fp_known) {
        r.end = walk_end::rbp_unknown;
        return r;
      }
      if (!apply_row(mem, kFramePointerRow, s, r, out, max_depth, false)) return r;
    }
    row = rows.find(s.pc - 1);
  }
}

// Walks the live stack from an interrupted context with `set`'s rows (nullptr: frame pointers only).
// out[0] = pc, then return addresses, leaf first. `stack_end`: the thread's stack end, 0 when unknown.
inline unwind_result unwind_live(const unwind_table_set* set, std::uintptr_t pc, std::uintptr_t sp,
                                 std::uintptr_t fp, std::uintptr_t stack_end, std::uint64_t* out,
                                 std::size_t max_depth) {
  unwind_result r;
  if (max_depth == 0) return r;
  out[r.depth++] = pc;
  live_stack mem(sp, stack_end);
  walk_regs s{pc, sp, fp, true, true};
  if (set == nullptr) return walk_frames(mem, frame_pointer_rows{}, s, r, out, max_depth);
  return walk_frames(mem, cfi_rows{set}, s, r, out, max_depth);
}

// The handler's entry point: the live walk with the published tables when there are any (SELFPROF_UNWIND=fp
// publishes none: frame pointers only).
inline unwind_result unwind_interrupted(std::uintptr_t pc, std::uintptr_t sp, std::uintptr_t fp,
                                        std::uintptr_t stack_end, std::uint64_t* out, std::size_t max_depth) {
  return unwind_live(g_unwind_tables.load(std::memory_order_acquire), pc, sp, fp, stack_end, out, max_depth);
}

// Does the pair at `a` look like a frame record: a saved rbp that points further up the stack (or is 0,
// the outermost frame) next to a return address into code (`code.contains`)?
template <class Code>
inline bool plausible_frame_record(const stack_copy& mem, std::uintptr_t a, const Code& code) {
  std::uint64_t saved = 0, ra = 0;
  if (!mem.read(a, saved) || !mem.read(a + 8, ra)) return false;
  if (!code.contains(static_cast<std::uintptr_t>(ra))) return false;
  if (saved == 0) return true;
  return saved > a + 8 && saved % 8 == 0 && saved - a <= kMaxStackSpan;
}

// rbp is not known at frame `s`: find its frame record above sp. Candidates are tried upwards from sp;
// the first whose walk ends cleanly wins, else the deepest walk. A stale record left in this frame's
// locals by an earlier, deeper call can still win (it chains into the live frames above): the price of a
// kernel that reports sp and pc but not rbp. It takes a frame-pointer function between the caller and
// the system call to leave one there (libc's wrappers use none; ASan's interceptors do).
template <class Rows, class Code>
inline unwind_result scan_frame_records(const stack_copy& mem, const Rows& rows, const Code& code,
                                        const walk_regs& s, unwind_result r, std::uint64_t* out,
                                        std::size_t max_depth) {
  r.scanned = true;
  r.end = walk_end::bad_frame;
  unwind_result best = r;
  std::uintptr_t best_fp = 0;
  int tried = 0;
  std::uintptr_t a = (s.sp + kFrameRecordAlign - 1) & ~(kFrameRecordAlign - 1);
  for (; a >= s.sp && a - s.sp <= kMaxFrameSize && a + 16 <= mem.end(); a += kFrameRecordAlign) {
    if (!plausible_frame_record(mem, a, code)) continue;
    walk_regs t{s.pc, s.sp, a, true, s.leaf};
    unwind_result w = walk_frames(mem, rows, t, r, out, max_depth);
    if (w.clean()) return w;  // out[] holds this walk
    if (w.depth > best.depth) {
      best = w;
      best_fp = a;
    }
    if (++tried == kMaxRecordCandidates) break;
  }
  if (best_fp == 0) return r;
  walk_regs t{s.pc, s.sp, best_fp, true, s.leaf};
  return walk_frames(mem, rows, t, r, out, max_depth);  // refill out[] with the best walk
}

// Walks a blocked thread's frames from `pc` (its user pc: out[0], looked up as is) and the copy's base (its
// sp), with `set`'s CFI rows where they cover a pc and frame records elsewhere; every read lies in the
// copy. Where a row needs rbp before any frame told it, frame records are scanned for (`code.contains`
// tells a return address from data). out[1..depth) are return addresses, leaf first, as the signal
// handler records them; running off the end of the copy is a clean end.
template <class Code>
inline unwind_result unwind_stack_copy(const unwind_table_set* set, std::uintptr_t pc, const stack_copy& mem,
                                       const Code& code, std::uint64_t* out, std::size_t max_depth) {
  unwind_result r;
  if (max_depth == 0) return r;
  out[r.depth++] = pc;
  const cfi_rows rows{set};
  walk_regs s{pc, mem.base, 0, false, true};
  r = walk_frames(mem, rows, s, r, out, max_depth);
  if (r.end == walk_end::rbp_unknown) r = scan_frame_records(mem, rows, code, s, r, out, max_depth);
  return r;
}

}  // namespace detail
}  // namespace selfprof
// ---- end selfprof/signal/unwind.hpp ----

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
// ---- end selfprof/signal/handler.hpp ----

namespace selfprof {
namespace detail {

class cpu_timer_source final : public tick_source {
 public:
  ~cpu_timer_source() override { close(); }
  source_kind kind() const override { return source_kind::timer; }
  std::string describe() const override { return "POSIX CPU-time timer per thread"; }
  bool per_thread() const override { return true; }
  bool counts_kernel_time() const override { return true; }
  double effective_hz() const override { return std::min(config_.hz, kernel_tick_hz()); }
  std::size_t armed_count() const override { return timers_.size(); }

  status open(const source_config& config) override {
    config_ = config;
    // Probe: a timer on the calling thread's clock must be creatable (ENOSYS/EPERM under seccomp).
    timer_t probe{};
    if (create(static_cast<pid_t>(raw_gettid()), &probe) != 0)
      return status::error(std::string("timer_create on a thread CPU clock failed: ") + std::strerror(errno));
    sys().timer_delete(probe);
    return status::ok();
  }

  status arm(pid_t tid) override {
    if (timers_.count(tid)) return status::ok();
    timer_t id{};
    if (create(tid, &id) != 0) {
      const int e = errno;
      return status::error(std::string("timer_create: ") + std::strerror(e), e);
    }
    struct itimerspec spec {};
    std::int64_t ns = period_ns_for(config_.hz);
    spec.it_interval.tv_sec = static_cast<time_t>(ns / 1000000000);
    spec.it_interval.tv_nsec = static_cast<long>(ns % 1000000000);
    spec.it_value = spec.it_interval;
    if (sys().timer_settime(id, 0, &spec, nullptr) != 0) {
      int e = errno;
      sys().timer_delete(id);
      return status::error(std::string("timer_settime: ") + std::strerror(e), e);
    }
    timers_.emplace(tid, id);
    return status::ok();
  }

  // A new period for one thread's timer (SELFPROF_FRAME_HZ; the kernel still delivers at most one tick
  // per jiffy, the overrun count weights the sample).
  status set_thread_rate(pid_t tid, double hz) override {
    auto it = timers_.find(tid);
    if (it == timers_.end()) return status::error("timer: thread " + std::to_string(tid) + " is not armed");
    struct itimerspec spec {};
    std::int64_t ns = period_ns_for(hz);
    spec.it_interval.tv_sec = static_cast<time_t>(ns / 1000000000);
    spec.it_interval.tv_nsec = static_cast<long>(ns % 1000000000);
    spec.it_value = spec.it_interval;
    if (sys().timer_settime(it->second, 0, &spec, nullptr) != 0)
      return status::error(std::string("timer_settime: ") + std::strerror(errno));
    return status::ok();
  }

  void disarm(pid_t tid) override {
    auto it = timers_.find(tid);
    if (it == timers_.end()) return;
    sys().timer_delete(it->second);  // also discards a queued tick of this timer
    timers_.erase(it);
    reap_altstacks();  // a thread that ended: its alternate stack can go (signal/altstack.hpp)
  }

  void close() override {
    for (auto& t : timers_) sys().timer_delete(t.second);
    timers_.clear();
    reap_altstacks();
  }

  // POSIX timers are not inherited by fork(2): the child has nothing to release.
  void abandon_after_fork() override { timers_.clear(); }

 private:
  int create(pid_t tid, timer_t* out) {
    struct sigevent sev;
    std::memset(&sev, 0, sizeof sev);
    sev.sigev_notify = SIGEV_THREAD_ID;
    sev.sigev_signo = config_.signal_number;
    sev.sigev_value.sival_ptr = timer_cookie();
    sev._sigev_un._tid = tid;  // glibc's spelling of sigev_notify_thread_id
    return sys().timer_create(thread_cpu_clock(tid), &sev, out);
  }

  source_config config_;
  std::unordered_map<pid_t, timer_t> timers_;
};

}  // namespace detail
}  // namespace selfprof
// ---- end selfprof/sources/cpu_timer.hpp ----

namespace selfprof {
namespace detail {

// Known threads whose identity (start time) each scan re-reads.
constexpr std::size_t kVerifyPerScan = 512;

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
    scanned_ = false;
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
  // threads), forgets the gone ones and those whose tid another thread now has, reads names a thread may
  // have set just after it started. /proc is read outside the lock (see the top of the file).
  void scan(const std::vector<pid_t>& own) {
    std::vector<pid_t> live = list_threads();
    std::vector<probe> plan;
    std::vector<std::pair<pid_t, std::uint64_t>> gone;
    bool arming = false;
    int sig = 0;
    {
      std::lock_guard<std::mutex> lock(mu_);
      arming = primary_ && primary_->per_thread();
      sig = config_.signal_number;
      std::unordered_set<pid_t> seen(live.begin(), live.end());
      for (auto& t : threads_)
        if (!seen.count(t.first)) gone.emplace_back(t.first, t.second.start);
      const std::size_t n = live.size();
      std::size_t budget = kVerifyPerScan, next_from = 0;
      for (std::size_t i = 0; i < n; ++i) {
        const pid_t tid = live[(i + verify_from_) % n];
        bool ours = false;
        for (pid_t o : own) ours = ours || o == tid;
        if (ours) continue;
        probe p;
        p.tid = tid;
        auto known = threads_.find(tid);
        if (known == threads_.end()) {
          p.read_start = p.read_name = true;
          p.read_blocked = arming;
        } else {
          p.known_start = known->second.start;
          p.read_start = budget > 0;  // its identity, re-read round robin
          if (budget > 0 && --budget == 0) next_from = (verify_from_ + i + 1) % n;
          p.read_name = known->second.name_checks < 2;  // threads usually name themselves right after start
          p.read_blocked = arming && known->second.blocked;
          if (!p.read_start && !p.read_name && !p.read_blocked) continue;
        }
        plan.push_back(std::move(p));
      }
      verify_from_ = next_from;
    }
    for (probe& p : plan) read_probe(p, arming, sig);
    for (auto& g : gone)  // still there: it registered itself after the listing
      if (g.second != 0 && task_start_time(g.first) == g.second) g.second = 0;
    std::lock_guard<std::mutex> lock(mu_);
    for (auto& g : gone) {
      auto it = threads_.find(g.first);
      if (it != threads_.end() && g.second != 0 && it->second.start == g.second) drop_locked(it);
    }
    for (probe& p : plan) merge_locked(p);
    scanned_ = true;
  }

  // Whether scan() ran since begin(). A source that arms nothing leaves the first scan to the collector's
  // first wake (a process that ends before then never pays for it), so a snapshot taken earlier scans first.
  bool scanned() {
    std::lock_guard<std::mutex> lock(mu_);
    return scanned_;
  }

  // The calling thread arms itself now (instead of at the next scan); with `unblock`, it first unblocks
  // the sampling signal (selfprof::register_thread(), an explicit request). Without, a thread that blocks
  // it stays unarmed (see add_locked). A record of its tid with another start time is a dead thread's.
  status register_current(int sample_signal, bool unblock = true) {
    if (sample_signal > 0 && unblock) {
      sigset_t set;
      sigemptyset(&set);
      sigaddset(&set, sample_signal);
      pthread_sigmask(SIG_UNBLOCK, &set, nullptr);
    }
    const pid_t tid = static_cast<pid_t>(raw_gettid());
    probe p;
    p.tid = tid;
    p.start = task_start_time(tid);
    p.read_start = p.read_name = true;
    p.name = thread_name(tid);
    sigset_t mask;
    sigemptyset(&mask);
    pthread_sigmask(SIG_BLOCK, nullptr, &mask);
    std::lock_guard<std::mutex> lock(mu_);
    const int sig = config_.signal_number;
    p.read_blocked = true;
    p.blocked = sig > 0 && sigismember(&mask, sig) == 1;  // its own mask, which only it changes
    auto known = threads_.find(tid);
    if (known != threads_.end() && (p.start == 0 || known->second.start == p.start)) {
      if (known->second.blocked && !p.blocked) {  // register_thread() unblocked it
        known->second.blocked = false;
        if (primary_ && primary_->per_thread()) arm_locked(tid, known->second, true);
      }
      return status::ok();
    }
    if (known != threads_.end()) drop_locked(known);  // the tid's previous thread exited
    add_locked(p, true);
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

  // Names of every thread seen in this session, live or not, re-read for live threads (once per call,
  // outside the lock: a thread registering meanwhile does not wait); `reread` false right after a scan().
  std::unordered_map<std::uint32_t, std::string> names(bool reread = true) {
    if (!reread) {  // a scan() just read them
      std::lock_guard<std::mutex> lock(mu_);
      return names_;
    }
    std::vector<std::pair<pid_t, std::uint64_t>> live;
    {
      std::lock_guard<std::mutex> lock(mu_);
      live.reserve(threads_.size());
      for (auto& t : threads_) live.emplace_back(t.first, t.second.start);
    }
    std::vector<std::string> read(live.size());
    for (std::size_t i = 0; i < live.size(); ++i) read[i] = thread_name(live[i].first);
    std::lock_guard<std::mutex> lock(mu_);
    for (std::size_t i = 0; i < live.size(); ++i) {
      auto it = threads_.find(live[i].first);
      if (it == threads_.end() || it->second.start != live[i].second || read[i].empty()) continue;
      it->second.name = names_[static_cast<std::uint32_t>(it->first)] = read[i];
    }
    return names_;
  }

  // Live threads that block `sig`, so never receive a tick (their masks are read outside the lock).
  std::size_t blocking(int sig) {
    std::vector<pid_t> live;
    {
      std::lock_guard<std::mutex> lock(mu_);
      live.reserve(threads_.size());
      for (auto& t : threads_) live.push_back(t.first);
    }
    std::size_t n = 0;
    for (pid_t tid : live)
      if (thread_blocks_signal(tid, sig)) ++n;
    return n;
  }

  // SELFPROF_FRAME_HZ: samples one thread at `hz`, through whichever source armed it.
  status set_thread_rate(pid_t tid, double hz) {
    std::lock_guard<std::mutex> lock(mu_);
    // A source that covers every thread itself (the ring) arms none one by one.
    if (primary_ && !primary_->per_thread()) return primary_->set_thread_rate(tid, hz);
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
      if (arm_checked(*primary_, t.first, t.second.start, false)) {
        ++r.moved;
      } else if (arm_checked(*old, t.first, t.second.start,
                             false)) {  // out of descriptors, say: keeps its old source
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
    verify_from_ = 0;
  }

  std::mutex& lock_for_fork() { return mu_; }

 private:
  struct thread_rec {
    std::uint64_t start = 0;  // start time (task_start_time): with the tid, which thread this is
    std::string name;
    armed_by by = armed_by::none;
    int name_checks = 0;
    bool blocked = false;  // not armed: it blocked the sampling signal when last looked at
  };

  // What scan() reads of one thread outside the lock, and merges under it.
  struct probe {
    pid_t tid = 0;
    std::uint64_t known_start = 0;  // the record's start time when planned; 0: a new tid
    std::uint64_t start = 0;        // read (or, when not read, known_start); 0: gone
    bool read_start = false, read_name = false, read_blocked = false;
    std::string name;
    bool blocked = true;  // until read: an unread mask counts as blocked (not armed, looked at again)
  };

  static void read_probe(probe& p, bool arming, int sig) {
    if (p.read_start) {
      p.start = task_start_time(p.tid);
      if (p.start == 0) return;                              // exited since the listing
      if (p.known_start != 0 && p.start != p.known_start) {  // another thread has the tid now
        p.read_name = true;
        p.read_blocked = arming;
      }
    } else {
      p.start = p.known_start;
    }
    if (p.read_name) p.name = thread_name(p.tid);
    if (p.read_blocked) p.blocked = blocks_sample_signal(p.tid, sig);
  }

  void merge_locked(probe& p) {
    if (p.start == 0) return;
    auto known = threads_.find(p.tid);
    const std::uint64_t recorded = known == threads_.end() ? 0 : known->second.start;
    if (recorded != p.known_start) return;  // changed since planned (register_current): newer than this
    if (known != threads_.end() && p.start != recorded) {  // the recorded thread is dead, its tid reused
      drop_locked(known);
      known = threads_.end();
    }
    if (known == threads_.end()) {
      add_locked(p, false);
      return;
    }
    thread_rec& rec = known->second;
    if (p.read_name) {
      ++rec.name_checks;
      if (!p.name.empty()) rec.name = names_[static_cast<std::uint32_t>(p.tid)] = p.name;
    }
    if (p.read_blocked && rec.blocked && !p.blocked) {  // it unblocked the signal since
      rec.blocked = false;
      if (primary_ && primary_->per_thread()) arm_locked(p.tid, rec, false);
    }
  }

  // True when `tid` blocks signal `sig`. A thread being created runs with every signal blocked for a
  // moment (glibc's pthread_create), so a blocked answer is confirmed over about a millisecond.
  static bool blocks_sample_signal(pid_t tid, int sig) {
    if (sig <= 0) return false;
    for (int look = 0; look < 4; ++look) {
      // An unreadable mask (a thread still being set up) counts as blocked: looked at again at the next scan.
      const std::string status = task_file(tid, "status");
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
  // or signalfd of the program's own would receive them as its own signal. `self`: the calling thread.
  void add_locked(const probe& p, bool self) {
    thread_rec rec;
    rec.start = p.start;
    rec.name = p.name;
    if (primary_ && primary_->per_thread()) {
      rec.blocked = !p.read_blocked || p.blocked;
      if (!rec.blocked) arm_locked(p.tid, rec, self);
    }
    names_[static_cast<std::uint32_t>(p.tid)] = rec.name;
    threads_.emplace(p.tid, std::move(rec));
    ++counts_.seen;
    ++generation_;
  }

  // Disarms and forgets a record (its thread exited).
  void drop_locked(std::unordered_map<pid_t, thread_rec>::iterator it) {
    disarm_locked(it->first, it->second);
    threads_.erase(it);
    ++generation_;
  }

  // Arms `tid` with `src`. Unless it is the calling thread (`self`: alive throughout), a source that can
  // reach another process's thread is checked before and after: `tid` must still be this process's thread
  // that started at `start`, else the arm is undone at once (see the top of the file).
  static status arm_checked(tick_source& src, pid_t tid, std::uint64_t start, bool self) {
    const bool check = !self && src.kind() != source_kind::timer;
    if (check && task_start_time(tid) != start)
      return status::error("thread " + std::to_string(tid) + " exited before it was armed", ESRCH);
    status st = src.arm(tid);
    if (st && check && task_start_time(tid) != start) {
      src.disarm(tid);
      return status::error("thread " + std::to_string(tid) + " exited while it was armed", ESRCH);
    }
    return st;
  }

  void arm_locked(pid_t tid, thread_rec& rec, bool self) {
    status st = arm_checked(*primary_, tid, rec.start, self);
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
      if (fallback_ && arm_checked(*fallback_, tid, rec.start, self)) {
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
  std::size_t verify_from_ = 0;                           // where in the listing scan() re-checks from
  thread_counts counts_;
  std::vector<std::string> notes_;
  std::uint64_t fds_low_before_ = 0;  // fds_in_app_range() when the session began
  bool fds_low_noted_ = false;
  bool scanned_ = false;  // scan() ran since begin()
};

}  // namespace detail
}  // namespace selfprof
// ---- end selfprof/collect/thread_registry.hpp ----
// ---- begin selfprof/sources/contention.hpp ----
// The contention upgrade: `auto` took the CPU timer (the cheapest source), and this watches whether the
// sampled threads wait for CPUs; when they do, a perf_event with kernel time should replace the timer.
// Context: the collector thread.
//
// Why. CPU timers are checked only at the scheduler tick. When threads share CPUs they are switched at
// ticks, every slice is a whole number of ticks, and each thread's samples fall on a tick lattice of its
// CPU time: strictly repeated work then aliases with the lattice. A perf_event has an exact period. So the
// monitor reads the run delay of the busiest sampled threads (/proc/self/task/<tid>/schedstat) and says
// "switch" when they waited for a CPU at least kContentionShare of their run time in two checks in a row.
// The first check is at the first wake that sees ticks; while more threads receive samples than the
// process has CPUs, checks come every kContentionFastCheckMs, so an oversubscribed profile switches within
// a few hundred milliseconds.

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <iterator>
#include <memory>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

// ---- begin selfprof/sources/perf_event.hpp ----
// Tick source: one perf_event per thread (software task clock, or hardware cycles where a PMU exists)
// whose overflow signal is delivered to that thread (F_SETOWN_EX F_OWNER_TID). The handler re-arms it after
// sampling and caps its rate by the handler's measured cost (signal/handler.hpp, kMinGapPerCost).
// Context: setup only and the collector thread.

#include <linux/perf_event.h>
#include <sys/ioctl.h>
#include <sys/syscall.h>
#include <sys/utsname.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <string>
#include <unordered_map>


namespace selfprof {
namespace detail {

// Linux 6.16 and 6.17 hang in the hrtimer path when PERF_EVENT_IOC_REFRESH re-arms a software event
// from its overflow signal (async-profiler issue 1578); selfprof refuses perf_event there.
inline bool kernel_has_refresh_hang() {
  struct utsname u {};
  if (uname(&u) != 0) return false;
  int major = 0, minor = 0;
  if (std::sscanf(u.release, "%d.%d", &major, &minor) != 2) return false;
  return major == 6 && (minor == 16 || minor == 17);
}

class perf_event_source final : public tick_source {
 public:
  ~perf_event_source() override { close(); }
  source_kind kind() const override { return source_kind::perf; }
  bool per_thread() const override { return true; }
  bool counts_kernel_time() const override { return !user_only_; }
  double effective_hz() const override { return config_.hz; }
  std::size_t armed_count() const override { return fds_.size(); }
  std::string describe() const override {
    std::string s = "perf_event ";
    s += hardware_ ? "cpu-cycles" : "task-clock";
    s += user_only_ ? " (user only: time in the kernel is not sampled)" : " (user+kernel)";
    return s;
  }
  status open(const source_config& config) override {
    config_ = config;
    if (kernel_has_refresh_hang())
      return status::error("perf_event refused on Linux 6.16/6.17 (PERF_EVENT_IOC_REFRESH hang)");
    // Probe the calling thread: hardware cycles first, then the software task clock; kernel time
    // included unless the caller accepts user-only events.
    pid_t self = static_cast<pid_t>(raw_gettid());
    int first_errno = 0;
    const bool user_clock = config.user_clock_only;
    for (int user = user_clock ? 1 : 0; user <= (config.allow_user_only || user_clock ? 1 : 0); ++user) {
      for (int hw = user_clock ? 0 : 1; hw >= 0; --hw) {
        hardware_ = hw == 1;
        user_only_ = user == 1;
        int fd = open_event(self);
        if (fd >= 0) {
          sys().close(fd);
          g_handler.perf_freq.store(hardware_, std::memory_order_relaxed);  // the rate cap's units
          return status::ok();
        }
        if (hw == 0 && (user == 0 || user_clock)) first_errno = errno;  // the software event says most
      }
    }
    std::string why = std::string("perf_event_open(task-clock) failed: ") + std::strerror(first_errno);
    if (first_errno == EACCES || first_errno == EPERM)
      why += config.allow_user_only || user_clock
                 ? " (kernel.perf_event_paranoid or seccomp forbids it)"
                 : " (an event including kernel time needs root or kernel.perf_event_paranoid <= 1)";
    return status::error(why, first_errno);
  }

  status arm(pid_t tid) override {
    if (fds_.count(tid)) return status::ok();
    int fd = open_event(tid);
    if (fd < 0) {
      const int e = errno;
      return status::error(std::string("perf_event_open: ") + std::strerror(e), e);
    }
    // One fd per thread: above the application's fds (detail/high_fd.hpp), before O_ASYNC records the
    // number the signals carry in si_fd; below kPerfFdBits, which the handler's bitmap covers.
    const fd_move placed = move_fd_high(fd, handler_globals::kPerfFdBits);
    fd = placed.fd;
    struct f_owner_ex owner {};
    owner.type = F_OWNER_TID;
    owner.pid = tid;
    if (fd >= handler_globals::kPerfFdBits || sys().fcntl_int(fd, F_SETFL, O_ASYNC) != 0 ||
        sys().fcntl_int(fd, F_SETSIG, config_.signal_number) != 0 || ::fcntl(fd, F_SETOWN_EX, &owner) != 0) {
      const int e = fd >= handler_globals::kPerfFdBits ? EMFILE : errno;
      sys().close(fd);
      return status::error(std::string("perf_event fd setup: ") + std::strerror(e), e);
    }
    // The event is bound to the task `tid` named when it was opened, and F_SETOWN_EX to that task's pid
    // struct, which a later task reusing the number does not share. So one check, still disabled, that
    // the tid is a thread of this process (tgkill with signal 0 looks only in our thread group) means no
    // signal ever goes to another process's thread that took a reused tid.
    if (::syscall(SYS_tgkill, ::getpid(), tid, 0) != 0) {
      const int e = errno;
      sys().close(fd);
      return status::error("perf_event: thread " + std::to_string(tid) + " is no longer in this process", e);
    }
    set_bit(fd, true);
    perf_rate_track(g_handler, fd, rate_value(config_.hz));
    // Overflow disables the event (event_limit 1) until the handler refreshes it: no re-entrant ticks.
    if (::ioctl(fd, PERF_EVENT_IOC_REFRESH, 1) != 0) {
      const int e = errno;
      set_bit(fd, false);
      perf_rate_track(g_handler, fd, 0);
      sys().close(fd);
      return status::error(std::string("PERF_EVENT_IOC_REFRESH: ") + std::strerror(e), e);
    }
    if (placed.place != fd_place::moved) count_fd_in_app_range(placed);
    fds_.emplace(tid, fd);
    return status::ok();
  }

  // A new period (task-clock ns) or frequency (cycles) for one thread's event (SELFPROF_FRAME_HZ).
  status set_thread_rate(pid_t tid, double hz) override {
    auto it = fds_.find(tid);
    if (it == fds_.end()) return status::error("perf: thread " + std::to_string(tid) + " is not armed");
    std::uint64_t value = rate_value(hz);
    perf_rate_track(g_handler, it->second, value);  // the handler's cap starts again from this rate
    if (::ioctl(it->second, PERF_EVENT_IOC_PERIOD, &value) != 0)
      return status::error(std::string("PERF_EVENT_IOC_PERIOD: ") + std::strerror(errno));
    return status::ok();
  }

  void disarm(pid_t tid) override {
    auto it = fds_.find(tid);
    if (it == fds_.end()) return;
    release(it->second, true);
    fds_.erase(it);
    reap_altstacks();  // a thread that ended: its alternate stack can go (signal/altstack.hpp)
  }

  void close() override {
    for (auto& f : fds_) release(f.second, true);
    fds_.clear();
    reap_altstacks();
  }

  // The child's fds are copies that still point at the parent's events: close them without disabling.
  void abandon_after_fork() override {
    for (auto& f : fds_) release(f.second, false);
    fds_.clear();
  }

 private:
  int open_event(pid_t tid) {
    struct perf_event_attr attr;
    std::memset(&attr, 0, sizeof attr);
    attr.size = sizeof attr;
    if (hardware_) {
      attr.type = PERF_TYPE_HARDWARE;
      attr.config = PERF_COUNT_HW_CPU_CYCLES;
      attr.freq = 1;
      attr.sample_freq = rate_value(config_.hz);
    } else {
      attr.type = PERF_TYPE_SOFTWARE;
      attr.config = PERF_COUNT_SW_TASK_CLOCK;
      attr.sample_period = rate_value(config_.hz);
    }
    attr.disabled = 1;
    attr.exclude_kernel = user_only_ ? 1 : 0;
    attr.exclude_hv = 1;
    attr.wakeup_events = 1;
    long fd = sys().perf_event_open(&attr, tid, -1, -1, PERF_FLAG_FD_CLOEXEC);
    return static_cast<int>(fd);
  }

  // The event's rate as the kernel takes it: a frequency in Hz (cycles, freq=1) or a period in ns.
  std::uint64_t rate_value(double hz) const {
    return hardware_ ? static_cast<std::uint64_t>(hz > 1 ? hz : 1)
                     : static_cast<std::uint64_t>(period_ns_for(hz));
  }

  void set_bit(int fd, bool on) {
    if (fd < 0 || fd >= handler_globals::kPerfFdBits) return;
    std::uint64_t bit = std::uint64_t(1) << (fd % 64);
    if (on)
      g_handler.perf_fds[fd / 64].fetch_or(bit, std::memory_order_release);
    else
      g_handler.perf_fds[fd / 64].fetch_and(~bit, std::memory_order_release);
  }

  void release(int fd, bool disable) {
    set_bit(fd, false);
    perf_rate_track(g_handler, fd, 0);
    if (disable) ::ioctl(fd, PERF_EVENT_IOC_DISABLE, 0);
    sys().close(fd);
  }

  source_config config_;
  bool hardware_ = false, user_only_ = false;
  std::unordered_map<pid_t, int> fds_;
};

}  // namespace detail
}  // namespace selfprof
// ---- end selfprof/sources/perf_event.hpp ----

namespace selfprof {
namespace detail {

constexpr unsigned kContentionCheckMs = 500;
constexpr unsigned kContentionFastCheckMs = 100;
constexpr double kContentionShare = 0.25;
constexpr std::size_t kContentionThreads = 64;  // schedstat reads per check: the busiest threads

class contention_monitor {
 public:
  // `active`: the source may be upgraded (auto chose the CPU timer, cpu mode).
  void reset(bool active) {
    active_ = active;
    hits_ = 0;
    fast_ = false;
    cpus_ = usable_cpus();
    last_check_ = std::chrono::steady_clock::now() - std::chrono::milliseconds(kContentionCheckMs);
    schedstat_prev_.clear();
    samples_prev_.clear();
  }
  bool active() const { return active_; }
  std::size_t threads_tracked() const { return samples_prev_.size() + schedstat_prev_.size(); }
  // The collector's longest sleep while the monitor watches.
  unsigned period_ms() const { return fast_ ? kContentionFastCheckMs : kContentionCheckMs; }
  bool due(std::chrono::steady_clock::time_point now) const {
    return active_ && now - last_check_ >= std::chrono::milliseconds(period_ms());
  }

  // One check from the samples each thread got so far. True when the source should be switched now
  // (`delay_share` then says how much the threads waited); the monitor stops watching after that.
  bool check(const std::unordered_map<std::uint32_t, std::uint64_t>& samples_by_thread,
             std::chrono::steady_clock::time_point now, double& delay_share) {
    const auto since_ns = std::chrono::duration_cast<std::chrono::nanoseconds>(now - last_check_).count();
    last_check_ = now;
    std::vector<std::pair<std::uint64_t, std::uint32_t>> busy;  // samples since the last check, tid
    for (auto& kv : samples_by_thread) {
      std::uint64_t& before = samples_prev_[kv.first];
      if (kv.second > before) busy.emplace_back(kv.second - before, kv.first);
      before = kv.second;
    }
    // Threads no longer in the table (ended and merged away) are forgotten: the maps stay as small as the
    // table, whatever the thread churn.
    if (samples_prev_.size() > samples_by_thread.size()) {
      for (auto it = samples_prev_.begin(); it != samples_prev_.end();)
        it = samples_by_thread.count(it->first) ? std::next(it) : samples_prev_.erase(it);
      for (auto it = schedstat_prev_.begin(); it != schedstat_prev_.end();)
        it = samples_by_thread.count(it->first) ? std::next(it) : schedstat_prev_.erase(it);
    }
    fast_ = busy.size() > static_cast<std::size_t>(cpus_);
    if (busy.size() > kContentionThreads) {
      std::partial_sort(busy.begin(), busy.begin() + kContentionThreads, busy.end(),
                        [](const std::pair<std::uint64_t, std::uint32_t>& a,
                           const std::pair<std::uint64_t, std::uint32_t>& b) { return a.first > b.first; });
      busy.resize(kContentionThreads);
    }
    std::uint64_t run = 0, delay = 0;
    for (auto& b : busy) {
      std::uint64_t r = 0, d = 0;
      if (!read_schedstat(static_cast<pid_t>(b.second), r, d)) continue;
      auto prev = schedstat_prev_.find(b.second);
      if (prev != schedstat_prev_.end() && r >= prev->second.first && d >= prev->second.second) {
        run += r - prev->second.first;
        delay += d - prev->second.second;
      }
      schedstat_prev_[b.second] = {r, d};
    }
    // Enough CPU time to judge (a tenth of the time since the last check), and a quarter of it again
    // spent waiting for a CPU.
    const bool contended = since_ns > 0 && run >= static_cast<std::uint64_t>(since_ns) / 10 &&
                           static_cast<double>(delay) >= kContentionShare * static_cast<double>(run);
    hits_ = contended ? hits_ + 1 : 0;
    if (hits_ < 2) return false;
    active_ = false;
    delay_share = static_cast<double>(delay) / static_cast<double>(run);
    return true;
  }

 private:
  bool active_ = false;
  int hits_ = 0;
  bool fast_ = false;  // more threads got samples at the last check than there are CPUs
  int cpus_ = 1;
  std::chrono::steady_clock::time_point last_check_{};
  std::unordered_map<std::uint32_t, std::pair<std::uint64_t, std::uint64_t>> schedstat_prev_;  // run, delay
  std::unordered_map<std::uint32_t, std::uint64_t> samples_prev_;
};

// The source the monitor switches to: a perf_event that counts kernel time, as the timer did. nullptr
// with the reason when none opens here.
inline std::unique_ptr<tick_source> open_upgrade_source(const source_config& base, std::string& why_not) {
  std::unique_ptr<tick_source> perf(new perf_event_source());
  source_config cfg = base;
  cfg.allow_user_only = false;
  status st = perf->open(cfg);
  if (!st) {
    why_not = st.message();
    return nullptr;
  }
  return perf;
}

}  // namespace detail
}  // namespace selfprof
// ---- end selfprof/sources/contention.hpp ----
// ---- begin selfprof/sources/perf_ring.hpp ----
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
// ---- end selfprof/sources/perf_ring.hpp ----
// ---- begin selfprof/sources/signal_setup.hpp ----
// Choosing and installing the profiling signal: never replaces an application's handler silently, and
// recognises another copy of selfprof in the same process by a marker in its handler's sa_mask. The handler
// runs on an alternate signal stack (SA_ONSTACK; signal/altstack.hpp says which and why).
// Context: setup only.

#include <pthread.h>
#include <signal.h>
#include <sys/auxv.h>
#include <time.h>

#include <cerrno>
#include <cstring>
#include <string>
#include <vector>


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
// ---- end selfprof/sources/signal_setup.hpp ----
// ---- begin selfprof/symbols/shared_symbolizer.hpp ----
// The process's one symbolizer behind a lock: the collector refreshes its module snapshot while
// libraries come and go (so samples in a library unloaded later keep their names), dumps read it.
// Context: any thread except the signal handler.

#include <time.h>

#include <mutex>
#include <new>
#include <utility>
#include <vector>


namespace selfprof {
namespace detail {

constexpr int kForkWaitMs = 100;

class shared_symbolizer {
 public:
  // Which DWARF later dumps read for file:line and inline frames (SELFPROF_LINES).
  void set_lines(lines_mode mode) {
    std::lock_guard<std::mutex> lock(mu_);
    sym_.set_lines(mode);
  }
  // Re-reads the mapped modules (parsing the new ones).
  void refresh() {
    std::lock_guard<std::mutex> lock(mu_);
    sym_.refresh();
  }
  // Re-reads the maps unconditionally (symbolizer::rescan); returns the executable ranges mapped now.
  std::vector<code_range> rescan() {
    std::lock_guard<std::mutex> lock(mu_);
    sym_.rescan();
    return sym_.code_ranges();
  }
  std::vector<code_range> code_ranges() {
    std::lock_guard<std::mutex> lock(mu_);
    return sym_.code_ranges();
  }
  // The perf map reader, for naming JIT samples while sampling (null when perf maps are not used);
  // internally locked, valid as long as this object. Read on under this lock (poll_jit_map), which
  // fork() takes, so a child never inherits a half-read map.
  perf_map* jit_map() { return sym_.perf_map_if_used(); }
  void poll_jit_map() {
    std::lock_guard<std::mutex> lock(mu_);
    if (perf_map* m = sym_.perf_map_if_used()) m->reload_if_changed();
  }
  // Runs `use(symbolizer&)` under the lock, after a refresh.
  template <class Use>
  auto with_fresh(Use&& use) -> decltype(use(std::declval<symbolizer&>())) {
    std::lock_guard<std::mutex> lock(mu_);
    sym_.refresh();
    return use(sym_);
  }
  // Runs `use(symbolizer&)` under the lock with the modules recorded so far (no refresh: nothing parsed).
  template <class Use>
  auto with_current(Use&& use) -> decltype(use(std::declval<symbolizer&>())) {
    std::lock_guard<std::mutex> lock(mu_);
    return use(sym_);
  }
  // Runs `work` under the lock (work that fork() must not cut in half: the unwind-row rebuild).
  template <class Work>
  void locked(Work&& work) {
    std::lock_guard<std::mutex> lock(mu_);
    work();
  }
  std::mutex& lock_for_fork() { return mu_; }
  // fork(2) prepare: takes the lock if it comes within kForkWaitMs (a module scan or unwind-row build
  // does; naming a large profile may not). Returns whether it was taken.
  bool lock_for_fork_briefly() {
    for (int waited_ms = 0;; ++waited_ms) {
      if (mu_.try_lock()) return true;
      if (waited_ms >= kForkWaitMs) return false;
      struct timespec step {
        0, 1000 * 1000
      };
      ::nanosleep(&step, nullptr);
    }
  }
  // fork(2) child. Without the lock, another thread of the parent may have been inside the symbolizer:
  // it starts afresh here (the old one is leaked, not destroyed half-changed).
  void abandon_after_fork(bool was_locked = true) {
    new (&mu_) std::mutex();
    if (was_locked) {
      sym_.abandon_after_fork();
      return;
    }
    new (&sym_) symbolizer();
  }

 private:
  std::mutex mu_;
  symbolizer sym_;
};

}  // namespace detail
}  // namespace selfprof
// ---- end selfprof/symbols/shared_symbolizer.hpp ----
// ---- begin selfprof/wall/sampler.hpp ----
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

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <mutex>
#include <new>
#include <unordered_map>
#include <vector>

// ---- begin selfprof/unwind/copied_stack.hpp ----
// What walking a copied stack needs beyond the walker (signal/unwind.hpp's unwind_stack_copy): the code
// ranges of every loaded module, which tell a return address from data when scanning for a frame record.
// Context: the wall sampler's thread (allocates; never the signal handler).

#include <link.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <iterator>
#include <utility>
#include <vector>


namespace selfprof {
namespace detail {

// The executable segments of every loaded module (dl_iterate_phdr), to tell a return address from data.
class code_ranges {
 public:
  void refresh() {
    ranges_.clear();
    dl_iterate_phdr(
        [](struct dl_phdr_info* info, std::size_t, void* self) {
          auto* r = static_cast<std::vector<std::pair<std::uintptr_t, std::uintptr_t>>*>(self);
          for (int i = 0; i < info->dlpi_phnum; ++i) {
            const ElfW(Phdr)& ph = info->dlpi_phdr[i];
            if (ph.p_type != PT_LOAD || !(ph.p_flags & PF_X) || ph.p_memsz == 0) continue;
            std::uintptr_t start = info->dlpi_addr + ph.p_vaddr;
            r->emplace_back(start, start + ph.p_memsz);
          }
          return 0;
        },
        &ranges_);
    std::sort(ranges_.begin(), ranges_.end());
  }
  bool contains(std::uintptr_t addr) const {
    auto it = std::upper_bound(ranges_.begin(), ranges_.end(), std::make_pair(addr, ~std::uintptr_t(0)));
    return it != ranges_.begin() && addr < std::prev(it)->second;
  }
  bool empty() const { return ranges_.empty(); }

 private:
  std::vector<std::pair<std::uintptr_t, std::uintptr_t>> ranges_;
};

}  // namespace detail
}  // namespace selfprof
// ---- end selfprof/unwind/copied_stack.hpp ----
// ---- begin selfprof/wall/task_state.hpp ----
// What the wall-clock sampler learns about another thread of this process without touching it: its
// CPU time, whether and where it is blocked (/proc/self/task/<tid>/syscall), and a copy of its stack.
// Context: the wall sampler thread (never the signal handler).

#include <fcntl.h>
#include <time.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>


namespace selfprof {
namespace detail {

// CPU time used so far by thread `tid`, in ns; false when the thread is gone.
inline bool thread_cpu_ns(pid_t tid, std::uint64_t& out) {
  struct timespec ts;
  if (clock_gettime(thread_cpu_clock(tid), &ts) != 0) return false;
  out = static_cast<std::uint64_t>(ts.tv_sec) * 1000000000ull + static_cast<std::uint64_t>(ts.tv_nsec);
  return true;
}

// A thread's state as /proc/self/task/<tid>/syscall gives it. The kernel fills the file only once the
// thread is off the CPU (it waits for that, briefly), so "blocked" is exact at the time of the read.
struct task_syscall {
  enum kind_t { gone, running, in_syscall, blocked_other } kind = gone;
  long nr = -1;           // system call number (in_syscall)
  std::uintptr_t sp = 0;  // user stack pointer at the call
  std::uintptr_t pc = 0;  // user pc: the instruction after the system call
};

// Parses the file's text: "running", "-1 <sp> <pc>", or "<nr> <6 args> <sp> <pc>" (numbers in hex
// after the first). Anything else is `gone` (the thread exited, or the kernel said something new).
inline task_syscall parse_task_syscall(const char* text) {
  task_syscall t;
  if (std::strncmp(text, "running", 7) == 0) {
    t.kind = task_syscall::running;
    return t;
  }
  char* end = nullptr;
  errno = 0;
  long nr = std::strtol(text, &end, 10);
  if (end == text || errno != 0) return t;
  unsigned long long v[8];
  int n = 0;
  const char* p = end;
  while (n < 8) {
    while (*p == ' ') ++p;
    if (*p == '\0' || *p == '\n') break;
    char* e = nullptr;
    v[n] = std::strtoull(p, &e, 16);
    if (e == p) return t;
    ++n;
    p = e;
  }
  while (*p == ' ') ++p;
  if (*p != '\0' && *p != '\n') return t;  // more than the kernel writes
  if (nr == -1 && n == 2) {
    t.kind = task_syscall::blocked_other;
  } else if (nr >= 0 && n == 8) {
    t.kind = task_syscall::in_syscall;
  } else {
    return t;
  }
  t.nr = nr;
  t.sp = static_cast<std::uintptr_t>(v[n - 2]);
  t.pc = static_cast<std::uintptr_t>(v[n - 1]);
  return t;
}

// Opens /proc/self/task/<tid>/syscall through `task_dir` (an open fd of /proc/self/task); -1 if gone.
inline int open_task_syscall(int task_dir, pid_t tid) {
  char path[32];
  std::snprintf(path, sizeof path, "%d/syscall", static_cast<int>(tid));
  return ::openat(task_dir, path, O_RDONLY | O_CLOEXEC);
}

// Reads the file afresh from an fd open_task_syscall gave (procfs regenerates it at offset 0, so one
// fd serves every look: half the cost of open + read + close).
inline task_syscall read_task_syscall(int fd) {
  char buf[256];
  ssize_t n = ::pread(fd, buf, sizeof buf - 1, 0);
  if (n <= 0) return task_syscall{};
  buf[n] = '\0';
  return parse_task_syscall(buf);
}

// Copies up to `len` bytes of this process's memory from `addr` into `out`; returns the bytes copied
// (fewer where an unmapped page begins). Never faults: the kernel does the reading (process_vm_readv,
// else /proc/self/mem), so a thread that exits and unmaps its stack meanwhile costs a short read only.
inline std::size_t copy_own_memory(std::uintptr_t addr, void* out, std::size_t len) {
  const long n = read_process_memory(::getpid(), out, addr, len);
  if (n >= 0) return static_cast<std::size_t>(n);
  if (errno != ENOSYS && errno != EPERM) return 0;
  int fd = ::open("/proc/self/mem", O_RDONLY | O_CLOEXEC);  // seccomp may forbid process_vm_readv alone
  if (fd < 0) return 0;
  std::size_t done = 0;
  while (done < len) {
    ssize_t r = ::pread(fd, static_cast<char*>(out) + done, len - done, static_cast<off_t>(addr + done));
    if (r <= 0) break;
    done += static_cast<std::size_t>(r);
  }
  ::close(fd);
  return done;
}

}  // namespace detail
}  // namespace selfprof
// ---- end selfprof/wall/task_state.hpp ----

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
// ---- end selfprof/wall/sampler.hpp ----

namespace selfprof {
namespace detail {

constexpr unsigned kCollectorWakeMs = 50;
constexpr unsigned kCollectorBusyWakeMs = 500;
constexpr unsigned kFullThreadScanMs = 500;  // full /proc/self/task scan even when the count is stable
constexpr unsigned kSymbolRefreshMs = 200;   // module snapshot while samples arrive and libraries change
constexpr unsigned kPullWaitMs = 2000;  // the longest a snapshot waits for the collector to read the rings
constexpr unsigned kCodeRescanMaxMs = 5000;  // the longest back-off between scans for samples in unknown code

// What a source without signals reported lost (published by the collector for get_stats()).
struct pulled_counts {
  std::atomic<std::uint64_t> records{0}, truncated{0}, full{0}, lost{0}, throttles{0};
  std::atomic<std::uint64_t> user_chain_since_ns{0}, chain_cut{0}, ring_pages{0}, overlap{0};
  std::atomic<bool> chain_given_back{false};
  pulled_counts() = default;
  pulled_counts& operator=(const pulled_counts&) {
    update(pulled_stats{});
    return *this;
  }
  void update(const tick_source& src) { update(src.pulled()); }
  void update(const pulled_stats& p) {
    records.store(p.records, std::memory_order_relaxed);
    truncated.store(p.truncated, std::memory_order_relaxed);
    full.store(p.full, std::memory_order_relaxed);
    lost.store(p.lost, std::memory_order_relaxed);
    throttles.store(p.throttles, std::memory_order_relaxed);
    user_chain_since_ns.store(p.user_chain_since_ns, std::memory_order_relaxed);
    chain_cut.store(p.chain_cut, std::memory_order_relaxed);
    chain_given_back.store(p.chain_given_back, std::memory_order_relaxed);
    ring_pages.store(p.ring_pages, std::memory_order_relaxed);
    overlap.store(p.overlap, std::memory_order_relaxed);
  }
};

struct collector_config {
  sample_ring* ring = nullptr;
  sample_store* store = nullptr;
  thread_registry* threads = nullptr;
  session_info* session = nullptr;
  shared_symbolizer* symbols = nullptr;
  source_config sources;            // what the contention upgrade opens its event with
  bool upgrade = false;             // auto chose the CPU timer: may switch to perf_event under contention
  bool wall = false;                // wall mode: the short period
  bool unwind_rows = false;         // rebuild the handler's CFI rows when libraries come and go
  bool lazy_rows = false;           // parse a module's rows only once samples reached its code
  int sample_signal = 0;            // watched: the program may install its own handler for it
  wall_sampler* sampler = nullptr;  // wall mode: the wall sampler, told the threads to look at
  tick_source* pull = nullptr;      // a source without signals (ring): read into the ring at each wake
  pulled_counts* pulled = nullptr;  // its lost-sample counts, published
  // A worker started on demand (the dumper, core/auto_dumps.hpp): `fd` is watched in every wait, and
  // launch(context) called once when it turns readable. -1: none.
  int standby_fd = -1;
  void (*standby_launch)(void*) = nullptr;
  void* standby_context = nullptr;
};

class collector {
 public:
  collector() = default;
  collector(const collector&) = delete;
  collector& operator=(const collector&) = delete;

  // Starts the thread; the signal handler wakes it through g_handler.wake_fd from now on.
  status start(const collector_config& c) {
    config_ = c;
    wakes_.store(0, std::memory_order_relaxed);
    contention_.reset(c.upgrade);
    listed_generation_ = ~std::uint64_t(0);
    merge_generation_ = ~std::uint64_t(0);
    task_dir_fd_ = keep_fd_high(::open("/proc/self/task", O_RDONLY | O_DIRECTORY | O_CLOEXEC));
    status st = worker_.start("selfprof", &collector::main, this);
    if (!st) {
      close_task_dir();
      return st;
    }
    g_handler.task_links.store(0, std::memory_order_relaxed);  // the first scan sets it
    g_handler.task_dir_fd.store(task_dir_fd_, std::memory_order_release);
    g_handler.wake_fd.store(worker_.wake_fd(), std::memory_order_release);
    {
      std::lock_guard<std::mutex> lock(pull_mu_);
      pull_asked_ = pull_done_ = 0;
      pulling_ = c.pull != nullptr;
    }
    return status::ok();
  }

  // Stops the thread. The handler no longer wakes it (it may still run: its write then goes nowhere).
  void stop() {
    g_handler.next_thread_check.store(0, std::memory_order_relaxed);
    g_handler.wake_fd.store(-1, std::memory_order_release);
    g_handler.task_dir_fd.store(-1, std::memory_order_release);
    {
      std::lock_guard<std::mutex> lock(pull_mu_);
      pulling_ = false;  // a snapshot waiting in pull_now() goes on with what was read
    }
    pull_cv_.notify_all();
    worker_.stop();
  }

  // Any thread but this one's (a snapshot): with a source whose samples wait in the kernel's rings, has
  // this thread read them now, so the snapshot holds everything sampled before it was asked for. Waits at
  // most kPullWaitMs (the first unwind-table build can hold the thread up); only this thread reads rings.
  void pull_now() {
    if (static_cast<pid_t>(raw_gettid()) == worker_.tid()) return;
    std::unique_lock<std::mutex> lock(pull_mu_);
    if (!pulling_) return;
    const std::uint64_t want = ++pull_asked_;
    worker_.wake();
    pull_cv_.wait_for(lock, std::chrono::milliseconds(kPullWaitMs),
                      [&] { return !pulling_ || pull_done_ >= want; });
  }

  // After the last handler returned: the fd the handler fstat()s can go.
  void close_task_dir() {
    if (task_dir_fd_ >= 0) ::close(task_dir_fd_);
    task_dir_fd_ = -1;
  }

  void wake() const { worker_.wake(); }
  pid_t tid() const { return worker_.tid(); }
  std::uint64_t wakes() const { return wakes_.load(std::memory_order_relaxed); }

  void abandon_after_fork() {
    g_handler.wake_fd.store(-1, std::memory_order_release);
    g_handler.task_dir_fd.store(-1, std::memory_order_release);
    worker_.abandon_after_fork();
    close_task_dir();
    new (&pull_mu_) std::mutex();  // a parent thread may have held it at the fork
    new (&pull_cv_) std::condition_variable();
    pulling_ = false;
  }

 private:
  static void main(void* self) { static_cast<collector*>(self)->loop(); }

  // The thread count from the link count of /proc/self/task (2 + threads), -1 when unknown.
  long task_links() const {
    struct stat st {};
    if (task_dir_fd_ < 0 || ::fstat(task_dir_fd_, &st) != 0) return -1;
    return static_cast<long>(st.st_nlink);
  }

  int wait_ms(bool ticks_arrive, bool boosting) const {
    unsigned ms = kCollectorWakeMs;
    if (ticks_arrive && !config_.wall && !boosting && task_dir_fd_ >= 0) ms = kCollectorBusyWakeMs;
    if (contention_.active() && contention_.period_ms() < ms) ms = contention_.period_ms();
    if (config_.pull) ms = config_.pull->collect_period_ms();  // before a ring fills
    return static_cast<int>(ms);
  }

  void loop() {
    const auto start = std::chrono::steady_clock::now();
    chain_noted_ = given_back_noted_ = false;  // this session's source has said nothing yet
    auto last_full_scan = start;
    long last_count = -1;  // scan at once: threads may have started since start() looked
    std::uint64_t last_generation = loader_generation();
    std::uint64_t last_total = 0;
    std::uint64_t last_taken = g_handler.taken.load(std::memory_order_relaxed);
    bool ticks_arrive = false;
    bool boosting = false;
    code_scan code;
    config_.store->set_code({}, config_.symbols->jit_map());  // JIT samples are named from the first drain
    auto last_code_scan = start;  // the first scan waits one interval: a short-lived process never pays it
    auto last_wake = start;
    // Maps the ring's first pages (sample_ring::map_ahead) before a signal handler writes there. A source
    // without signals writes only from this thread, after the first wait: a process that ends before
    // then never pays for the pages.
    bool mapped = config_.pull == nullptr;
    if (mapped) config_.store->drain(*config_.ring);
    int standby = config_.standby_launch ? config_.standby_fd : -1;
    bool standby_ready = false;
    while (worker_.wait(wait_ms(ticks_arrive, boosting), standby, &standby_ready)) {
      wakes_.fetch_add(1, std::memory_order_relaxed);
      if (standby_ready) {
        config_.standby_launch(config_.standby_context);  // it takes over what made the fd readable
        standby = -1;
      }
      config_.symbols->poll_jit_map();  // lines written before these samples were taken name them
      // Before the pull and the drain: the ring source walks its samples with the rows of now (and has
      // the rows of modules it reaches parsed, see ring_rows), the drain notes samples in unparsed ones.
      if (config_.unwind_rows) build_rows();
      if (config_.pull) {
        // Maps ahead what one read can write (rings grow, see perf_ring), before collect() writes it.
        config_.ring->set_map_ahead(config_.pull->records_per_read());
        if (!mapped) config_.store->drain(*config_.ring);
        mapped = true;
        std::uint64_t asked;
        {
          std::lock_guard<std::mutex> lock(pull_mu_);
          asked = pull_asked_;
        }
        config_.pull->collect(*config_.ring, running_worker_tids(), pull_rows());
        if (config_.pulled) {
          config_.pulled->update(*config_.pull);
          note_user_chain(*config_.pulled);
        }
        {
          std::lock_guard<std::mutex> lock(pull_mu_);
          pull_done_ = asked;
        }
        pull_cv_.notify_all();
      }
      config_.store->drain(*config_.ring);
      if (config_.lazy_rows) parse_reached_rows();
      watch_sample_signal();
      const std::uint64_t total = config_.store->total();
      const auto now = std::chrono::steady_clock::now();
      const std::uint64_t taken = g_handler.taken.load(std::memory_order_relaxed);
      // Steady ticks: half of one busy thread's rate over the last wait (timer periods round up to the
      // kernel's tick, so a busy thread may get less than hz). A few ticks of a burst that has ended
      // (start() itself, say) would otherwise buy a long wait in which no handler looks.
      const double waited_s = std::chrono::duration<double>(now - last_wake).count();
      ticks_arrive = taken != last_taken &&
                     static_cast<double>(taken - last_taken) >= 0.5 * config_.sources.hz * waited_s;
      last_taken = taken;
      last_wake = now;
      const long count = task_links();  // read before the scan: a thread born after it changes the count
      const bool full = now - last_full_scan >= std::chrono::milliseconds(kFullThreadScanMs);
      boosting = boost_game_frame_threads();
      if (count != last_count || full || count < 0) {
        config_.threads->scan(running_worker_tids());
        for (auto& n : config_.threads->take_notes()) config_.session->note(n);
        if (config_.sampler && config_.threads->list_if_changed(listed_generation_, listed_))
          config_.sampler->set_threads(listed_);
        last_count = count;
        last_full_scan = now;
      }
      merge_ended_threads();
      if (ticks_arrive && config_.threads->primary() && contention_.due(now)) check_contention(now);
      if (count >= 0) {  // the handler compares with this; its next check is at most kThreadCheckNs away
        g_handler.task_links.store(static_cast<std::uint64_t>(count), std::memory_order_relaxed);
        std::uint64_t zero = 0;
        g_handler.next_thread_check.compare_exchange_strong(zero, monotonic_ns() + kThreadCheckNs,
                                                            std::memory_order_relaxed);
      }
      if (config_.pull)
        config_.pull->collect(*config_.ring, running_worker_tids(),
                              pull_rows());  // the thread scan may be long
      // A library loaded while profiling, or code mapped without the loader that samples landed in, is
      // parsed while it is still mapped, so its samples keep their names after it is unmapped. Nothing to
      // do while no library comes or goes and every sample lands in known code.
      const std::uint64_t generation = loader_generation();
      const bool loader_moved = generation != last_generation && total != last_total;
      const bool unknown = config_.store->take_unknown_code();
      if ((loader_moved || unknown) && now - last_code_scan >= code.interval) {
        code.scanned(config_.symbols->rescan(), loader_moved);
        config_.store->set_code(code.ranges, config_.symbols->jit_map());
        last_code_scan = now;
        last_total = total;
        last_generation = generation;
      }
    }
  }

  // Scans for samples in unknown code back off while the maps do not change (a bad unwind can leave
  // addresses that belong to no mapping), and come back to the short interval when they do.
  struct code_scan {
    std::vector<code_range> ranges;
    std::chrono::milliseconds interval{kSymbolRefreshMs};
    void scanned(std::vector<code_range> now, bool loader_moved) {
      const bool same =
          now.size() == ranges.size() &&
          std::equal(now.begin(), now.end(), ranges.begin(), [](const code_range& a, const code_range& b) {
            return a.start == b.start && a.end == b.end && a.anonymous == b.anonymous;
          });
      if (same && !loader_moved)
        interval = std::min(interval * 2, std::chrono::milliseconds(kCodeRescanMaxMs));
      else
        interval = std::chrono::milliseconds(kSymbolRefreshMs);
      ranges = std::move(now);
    }
  };

  // The handler's CFI rows: built at the first wake (start() leaves them to the collector unless
  // SELFPROF_UNWIND=dwarf), rebuilt when modules come and go; nearly free when none did. Lazily (the
  // automatic choice), a module's rows are parsed only once a sample reached its code: until the next
  // wake after that, the signal sources' samples there are walked by frame pointers (the ring source's
  // are walked after the parse, see ring_rows). A failure is noted once; the handler
  // walks frame pointers where no row covers a pc. Under the lock fork() takes.
  void build_rows() {
    status st;
    const bool lazy = config_.lazy_rows;
    config_.symbols->locked(
        [&st, lazy] { st = lazy ? build_unwind_tables_lazily() : build_unwind_tables(); });
    if (!st && !rows_failed_) {
      rows_failed_ = true;
      config_.session->note(st.message() + "; unwinding with frame pointers only", true);
    }
    if (!lazy) return;
    const std::uint64_t generation = unwind_tables().pending_generation();
    if (generation == pending_generation_) return;  // the store has the list of this build
    pending_generation_ = generation;
    pending_rows_ = unwind_tables().pending();
    config_.store->set_pending_rows(pending_rows_);
  }

  // What the ring source may ask while it walks the samples it read (lazy rows): is a pc in code whose
  // rows were never parsed, and parse them now. So a module's first samples, which reached it before its
  // rows existed, are walked by its rows and not by frame pointers it may not keep.
  class ring_rows final : public row_requests {
   public:
    explicit ring_rows(collector& c) : c_(c) {}
    bool unparsed(std::uint64_t pc) const override { return find_pending(c_.pending_rows_, pc) != nullptr; }
    bool parse(std::uint64_t pc) override {
      if (!unwind_tables().want(static_cast<std::uintptr_t>(pc))) return false;
      c_.build_rows();
      return true;
    }

   private:
    collector& c_;
  };
  row_requests* pull_rows() { return config_.unwind_rows && config_.lazy_rows ? &ring_rows_ : nullptr; }

  // Parses the rows of the modules the drained samples reached.
  void parse_reached_rows() {
    bool asked = false;
    for (std::uint64_t pc : config_.store->take_row_requests())
      asked = unwind_tables().want(static_cast<std::uintptr_t>(pc)) || asked;
    if (asked) build_rows();
  }

  // The program installed its own handler for the sampling signal (without the preload library, which
  // moves selfprof to another signal first): its handler must not keep receiving ticks, so every source
  // is closed at once. Sampling is over for this session; a note says why.
  void watch_sample_signal() {
    if (config_.sample_signal <= 0 || sample_handler_installed(config_.sample_signal)) return;
    config_.threads->end();
    config_.session->note("the program installed its own handler for signal " +
                              std::to_string(config_.sample_signal) +
                              ", the sampling signal: selfprof stopped sending it, and sampling stopped",
                          true);
    config_.sample_signal = 0;
  }

  // A thread per request must not cost memory for every thread the program ever ran: once the store
  // asks for it, the threads that ended since the last merge are merged into one.
  void merge_ended_threads() {
    if (!config_.store->wants_thread_merge()) return;
    std::vector<pid_t> live;
    if (!config_.threads->list_if_changed(merge_generation_, live)) return;  // none ended since
    std::vector<std::uint32_t> tids(live.begin(), live.end());
    std::sort(tids.begin(), tids.end());
    config_.store->merge_ended_threads(tids);
    // Their names too: their samples are thread 0's now, and names() reads the live threads' again.
    config_.threads->clear_names();
  }

  // SELFPROF_FRAME_HZ on threads that started marking game frames; true while such a rate is set.
  bool boost_game_frame_threads() {
    const double hz = config_.store->game_frame_hz();
    for (std::uint32_t tid : config_.store->to_boost()) {
      status st = config_.threads->set_thread_rate(static_cast<pid_t>(tid), hz);
      if (st.code() == EAGAIN) continue;  // not armed yet: at the next wake
      if (!st)
        config_.session->note("SELFPROF_FRAME_HZ not applied to thread " + std::to_string(tid) + ": " +
                              st.message());
      config_.store->boost_tried(tid, static_cast<bool>(st));  // tried once either way
    }
    return hz != config_.sources.hz;
  }

  // The ring source's switch to the kernel's user chain, and its giving the chain up, said once each in
  // the profile: the samples before the switch that lost their outer frames are why some stacks carry
  // [truncated].
  void note_user_chain(const pulled_counts& p) {
    const std::uint64_t cut = p.chain_cut.load(std::memory_order_relaxed);
    const bool given_back = p.chain_given_back.load(std::memory_order_relaxed);
    // cut 0: asked for from the start, or never
    if (!chain_noted_ && cut > 0 &&
        (p.user_chain_since_ns.load(std::memory_order_relaxed) != 0 || given_back)) {
      chain_noted_ = true;
      config_.session->note("ring source: " + chain_asked_note(cut), true);
    }
    if (!given_back_noted_ && given_back) {
      given_back_noted_ = true;
      config_.session->note("ring source: " + chain_given_back_note(), true);
    }
  }

  void check_contention(std::chrono::steady_clock::time_point now) {
    double share = 0;
    if (!contention_.check(config_.store->samples_by_thread(), now, share)) return;
    char why[160];
    std::snprintf(why, sizeof why, "sampled threads waited for a CPU %.0f%% of their run time", 100 * share);
    std::string why_not;
    std::unique_ptr<tick_source> perf = open_upgrade_source(config_.sources, why_not);
    if (!perf) {
      config_.session->note(std::string(why) +
                            ": CPU timers may alias with the tick; no perf_event with kernel time to switch "
                            "to (" +
                            why_not + ")");
      return;
    }
    source_info s;
    s.kind = perf->kind();
    s.detail = perf->describe();
    s.effective_hz = perf->effective_hz();
    s.kernel_time = perf->counts_kernel_time();
    s.reason = std::string("switched from the CPU timer: ") + why +
               ", so CPU timers would sample on the tick lattice (aliasing); perf_event has an exact period";
    thread_registry::switch_result r = config_.threads->switch_primary(std::move(perf));
    config_.store->forget_boosted();  // boosted threads are boosted again on the new source
    config_.session->set_source(s);
    config_.session->note("switched to " + s.detail + " (" + why + "); " + std::to_string(r.moved) +
                          " threads moved" +
                          (r.kept ? ", " + std::to_string(r.kept) + " kept their timer" : ""));
  }

  collector_config config_;
  worker worker_;
  contention_monitor contention_;
  int task_dir_fd_ = -1;  // /proc/self/task (handler_globals::task_dir_fd)
  std::uint64_t listed_generation_ = ~std::uint64_t(0);
  std::vector<pid_t> listed_;
  std::uint64_t merge_generation_ = ~std::uint64_t(0);  // the thread list last merged against
  std::atomic<std::uint64_t> wakes_{0};
  std::mutex pull_mu_;  // pull_now()'s requests and this thread's answers
  std::condition_variable pull_cv_;
  std::uint64_t pull_asked_ = 0, pull_done_ = 0;
  bool pulling_ = false;
  bool chain_noted_ = false, given_back_noted_ = false;   // note_user_chain() said them (collector thread)
  bool rows_failed_ = false;                              // collector thread only
  std::uint64_t pending_generation_ = ~std::uint64_t{0};  // of the pending rows the store was given
  std::vector<pending_code> pending_rows_;  // those rows: this thread's copy, read without the store's lock
  ring_rows ring_rows_{*this};
};

}  // namespace detail
}  // namespace selfprof
// ---- end selfprof/collect/collector.hpp ----
// ---- begin selfprof/collect/handler_counters.hpp ----
// The signal handler's counters, read together: they only grow for the life of the process, so a session
// reports what changed since it began.
// Context: any thread except the signal handler.

#include <cstdint>


namespace selfprof {
namespace detail {

struct handler_counts {
  std::uint64_t taken = 0, full = 0, inactive = 0, foreign = 0, truncated = 0;
  std::uint64_t thread_checks = 0, thread_wakes = 0;
  std::uint64_t rate_capped = 0, periods_skipped = 0;

  static handler_counts now() {
    const handler_globals& g = g_handler;
    handler_counts c;
    c.taken = g.taken.load(std::memory_order_relaxed);
    c.full = g.dropped_full.load(std::memory_order_relaxed);
    c.inactive = g.dropped_inactive.load(std::memory_order_relaxed);
    c.foreign = g.foreign.load(std::memory_order_relaxed);
    c.truncated = g.truncated.load(std::memory_order_relaxed);
    c.thread_checks = g.thread_checks.load(std::memory_order_relaxed);
    c.thread_wakes = g.thread_wakes.load(std::memory_order_relaxed);
    c.rate_capped = g.rate_capped.load(std::memory_order_relaxed);
    c.periods_skipped = g.periods_skipped.load(std::memory_order_relaxed);
    return c;
  }
  handler_counts since(const handler_counts& base) const {
    handler_counts d;
    d.taken = taken - base.taken;
    d.full = full - base.full;
    d.inactive = inactive - base.inactive;
    d.foreign = foreign - base.foreign;
    d.truncated = truncated - base.truncated;
    d.thread_checks = thread_checks - base.thread_checks;
    d.thread_wakes = thread_wakes - base.thread_wakes;
    d.rate_capped = rate_capped - base.rate_capped;
    d.periods_skipped = periods_skipped - base.periods_skipped;
    return d;
  }
};

}  // namespace detail
}  // namespace selfprof
// ---- end selfprof/collect/handler_counters.hpp ----
// ---- begin selfprof/core/auto_dumps.hpp ----
// Dumps the program does not ask for itself: on the dump signal (SIGUSR2 by default) and every
// SELFPROF_INTERVAL seconds, written by the dumper thread ("selfprof-dump") through the one dump path
// (dump/dump.hpp), so the collector keeps draining while a dump is symbolized and written. Requests that
// arrive while a dump is being written are answered together by the next one. The dumper also watches
// the control socket (`selfprof dump PID`, another way to ask for a dump) until its first client, and
// then has the server start its thread (serve/server.hpp: a process nobody asks runs no server thread).
// Context: setup only (start/stop, serve_on_demand); launch() from the watching thread; the dumper
// thread; flush() from any thread; fork child.
//
// Started on demand (the profiler's way), the dumper thread itself starts only at the first request: until
// then another thread (the collector) watches watch_fd(), which turns readable with the dumper's eventfd,
// the signalfd or the control socket, and calls launch(). A process that never asks for a dump runs one
// selfprof thread fewer: creating and ending a thread is a good part of what selfprof costs a short-lived
// process (docs/measurements.md).
//
// The dump signal is taken by the dumper thread, not by an application thread. A process-directed signal
// goes to some thread that does not block it, and a handler run there cuts that thread's blocking call
// short: sleep(), nanosleep(), poll() and epoll_wait() return early whatever SA_RESTART says. So start()
// blocks the signal in the thread that calls it (threads it creates afterwards inherit the block), and the
// dumper reads it from a signalfd: the signal is blocked in every selfprof thread too, so a handler the
// program installs for it later never runs on one (the preload library gives the signal up when the program
// claims it). stop() on the starting thread takes the block off again. Limits, documented in README.md:
// a thread created before start() by another thread keeps the signal unblocked and may still take a request
// (counted all the same); a program that unblocks it takes it back; a child started by posix_spawn(),
// system() or popen() from a blocking thread inherits the block across exec (a fork child drops it, and so
// does exec under the preload library). A signal the starting thread already blocks is one the program may
// wait for (sigwait, signalfd): selfprof does not take it.

#include <pthread.h>
#include <signal.h>
#include <sys/epoll.h>
#include <sys/signalfd.h>
#include <sys/types.h>
#include <time.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <mutex>
#include <new>
#include <string>

// ---- begin selfprof/core/snapshots.hpp ----
// Snapshots of the running (or last) session: the folded stacks with what the profile is about — mode,
// unit, source, rate, duration, what was dropped, the notes that belong in every profile — symbolized
// for a dump, with the slow game frames beside them when frames were marked. What the memory ceiling
// merged is named here: the ceiling stack's frame, and thread 0 for the threads that ended.
// Context: any thread except the signal handler (the dumper thread, API callers); begin/end from setup.

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <iterator>
#include <string>
#include <unordered_set>
#include <vector>

// ---- begin selfprof/dump/dump.hpp ----
// One dump, whatever asked for it (the API, the dump signal, the interval, exit): the JIT perf map is
// flushed first, then every file is written under one dump number and one time — the profile in each
// format of the path list, the off-CPU part of a wall profile ("-offcpu" before the extension) and the
// slow game frames when frames were marked ("-slow") — each with the same titles.
// Context: any thread except the signal handler (the dumper thread, an API caller, exit).

#include <unistd.h>

#include <cstdio>
#include <string>
#include <vector>

// ---- begin selfprof/dump/paths.hpp ----
// Dump path templates: %p pid, %t unix time, %n dump number, %f rank of a worst game frame, %% a percent
// sign; comma-separated lists; a tag before a path's extension for companion files.
// Context: any thread except the signal handler.

#include <unistd.h>

#include <atomic>
#include <cstdint>
#include <ctime>
#include <string>
#include <vector>

namespace selfprof {
namespace detail {

// Where dumps go when SELFPROF_OUT is not set: the working directory, one SVG per dump.
constexpr const char* kDefaultDumpTemplate = "selfprof-%p-%n.svg";

// The values a template's fields take in one dump: every file of a dump gets the same number and time.
struct path_fields {
  long long pid = 0;  // %p; 0: this process (selfprof record names its children's profiles)
  unsigned long number = 0;
  long long unix_time = 0;
  std::string rank;  // %f: empty when the dump has no ranks
};

inline path_fields fields_now(unsigned long number) {
  path_fields f;
  f.number = number;
  f.unix_time = static_cast<long long>(std::time(nullptr));
  return f;
}

inline std::string expand_path_template(const std::string& tmpl, const path_fields& f) {
  std::string out;
  for (std::size_t i = 0; i < tmpl.size(); ++i) {
    if (tmpl[i] != '%' || i + 1 == tmpl.size()) {
      out += tmpl[i];
      continue;
    }
    const char c = tmpl[++i];
    if (c == 'p')
      out += std::to_string(f.pid != 0 ? f.pid : static_cast<long long>(::getpid()));
    else if (c == 't')
      out += std::to_string(f.unix_time);
    else if (c == 'n')
      out += std::to_string(f.number);
    else if (c == 'f' && !f.rank.empty())
      out += f.rank;
    else if (c == '%')
      out += '%';
    else {
      out += '%';
      out += c;
    }
  }
  return out;
}

inline std::vector<std::string> split_paths(const std::string& list) {
  std::vector<std::string> out;
  std::size_t start = 0;
  while (start <= list.size()) {
    std::size_t comma = list.find(',', start);
    std::string part = list.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
    if (!part.empty()) out.push_back(part);
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  return out;
}

// `path` with `tag` inserted before its extension (".pb.gz" counts as one): "cpu.svg" -> "cpu-slow.svg".
inline std::string insert_before_extension(const std::string& path, const std::string& tag) {
  std::size_t slash = path.find_last_of('/');
  std::size_t base = slash == std::string::npos ? 0 : slash + 1;
  std::size_t dot = path.size();
  if (path.size() > base + 6 && path.compare(path.size() - 6, 6, ".pb.gz") == 0)
    dot = path.size() - 6;
  else if (path.find('.', base + 1) != std::string::npos)
    dot = path.find_last_of('.');
  return path.substr(0, dot) + tag + path.substr(dot);
}

// The number of the next dump of this process (1, 2, ...), whatever triggered it.
inline unsigned long next_dump_number() {
  static std::atomic<unsigned long> n{0};
  return n.fetch_add(1) + 1;
}

}  // namespace detail
}  // namespace selfprof
// ---- end selfprof/dump/paths.hpp ----
// ---- begin selfprof/output/format.hpp ----
// Output formats by file extension and the one dispatch from a profile to the bytes of any format, plus
// the render-and-write-atomically step a dump or the CLI performs for one path.
// Context: any thread except the signal handler (the collector thread on a dump, or the CLI).
//
// Extensions (matched case-insensitively at the end of the path's last component):
//   .folded .collapsed → folded stacks    .txt → top list    .pb.gz .pprof → gzipped pprof
//   .svg → flame graph (detail::write_svg of output/svg.hpp, written by the SVG part)
// Anything else is an error that names the path and lists the extensions.

#include <string>
#include <utility>

// ---- begin selfprof/output/folded.hpp ----
// The folded ("collapsed") stack writer: `root;...;leaf COUNT` lines that flamegraph.pl, inferno,
// speedscope and Pyroscope read, keeping the rules each of them imposes on a line (listed below).
// Context: any thread except the signal handler (a pure function of the profile).
//
// What it promises:
//  - One line per distinct stack *by name*: stacks that differ only in addresses, modules or source
//    lines are merged (their counts added, saturating at 2^64-1). Lines are sorted bytewise, counts
//    are decimal integers, zero counts are omitted, LF line endings. Same profile in, same bytes out.
//  - Counts are whatever `profile_info::unit` says (samples for cpu/wall profiles); never periods.
//  - Frame names are made safe (`folded_frame_name`): `;` becomes `:`, CR/LF/NUL are removed, other
//    control characters become spaces, invalid UTF-8 bytes become U+FFFD, trailing spaces are cut, an
//    ending "<space><digits>" gets `_` instead of the space (so no reader mistakes it for a count
//    column), an empty name becomes `[unknown]`. Kinds get the flamegraph.pl annotations: kernel
//    `_[k]`, jit `_[j]`, inlined `_[i]`; markers and native frames get none.
//  - `folded_options::thread_roots` adds a root frame per thread in async-profiler's `-t` convention,
//    `[name tid=N]` (or `[tid=N]` when the thread has no name). We chose it over stackcollapse-perf's
//    `comm-PID/TID` because the profile is of one process (the PID adds nothing), because the
//    brackets mark the frame as synthetic, and because it cannot be confused with a function name.
//    Stacks with tid 0 (merged/unknown) get no thread root.
//  - A stack with `truncated` set gets a `[truncated]` marker right after its thread root (at the
//    root side, where frames are missing). A stack whose frames already start with such markers
//    (e.g. one read back by parse_folded) does not get them twice, so write→parse→write is stable.
//  - Every line, LF included, is at most `max_line_bytes` (default 65535, under Pyroscope's 64 KiB
//    scanner limit). A longer line loses frames at the root side (the thread root is kept) and gets
//    the `[truncated]` marker instead; a single frame longer than the limit is cut at a UTF-8 boundary.

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

// ---- begin selfprof/output/text.hpp ----
// Locale-independent number formatting and UTF-8 checks for the text writers (printf's %f follows LC_NUMERIC,
// which a host program may have set to a locale with a decimal comma; our bytes must not depend on it),
// and the one index sort every writer uses.
// Context: any thread except the signal handler.

#include <algorithm>
#include <cstdint>
#include <limits>
#include <string>
#include <string_view>
#include <vector>

namespace selfprof {
namespace detail {

// `v` rounded to `decimals` places (0..9), with '.' as the decimal point: 2.5 → "2.500".
// NaN and infinities print as "nan", "inf", "-inf"; magnitudes past 2^63 lose precision.
inline std::string format_fixed(double v, int decimals) {
  if (v != v) return "nan";
  if (v > std::numeric_limits<double>::max() || v < -std::numeric_limits<double>::max())
    return v < 0 ? "-inf" : "inf";
  if (decimals < 0) decimals = 0;
  if (decimals > 9) decimals = 9;
  std::uint64_t scale = 1;
  for (int i = 0; i < decimals; ++i) scale *= 10;
  const bool negative = v < 0;
  const long double scaled =
      (negative ? -static_cast<long double>(v) : static_cast<long double>(v)) * scale + 0.5L;
  const std::uint64_t n = scaled >= 18446744073709551615.0L ? UINT64_MAX : static_cast<std::uint64_t>(scaled);
  std::string out = std::to_string(n / scale);
  if (decimals > 0) {
    std::string frac = std::to_string(n % scale);
    out += '.';
    out.append(static_cast<std::size_t>(decimals) - frac.size(), '0');
    out += frac;
  }
  if (negative && n != 0) out.insert(out.begin(), '-');
  return out;
}

// a += b, stopping at the largest count instead of wrapping (counts read from files can be anything).
inline void add_saturating(std::uint64_t& a, std::uint64_t b) { a = (a + b < a) ? UINT64_MAX : a + b; }

// Integral values without decimals ("99"), others with up to `decimals` places, trailing zeros cut.
inline std::string format_compact(double v, int decimals = 3) {
  std::string s = format_fixed(v, decimals);
  if (s.find('.') == std::string::npos) return s;
  while (s.back() == '0') s.pop_back();
  if (s.back() == '.') s.pop_back();
  return s;
}

// Length of the valid UTF-8 sequence starting at s[i], or 0 when it is not valid (overlong forms,
// surrogates and code points above U+10FFFF are invalid); `cp` receives the code point.
inline std::size_t utf8_decode(std::string_view s, std::size_t i, std::uint32_t& cp) {
  const auto b0 = static_cast<unsigned char>(s[i]);
  cp = b0;
  if (b0 < 0x80) return 1;
  std::size_t len;
  if (b0 >= 0xC2 && b0 <= 0xDF) {
    len = 2;
    cp = b0 & 0x1Fu;
  } else if (b0 >= 0xE0 && b0 <= 0xEF) {
    len = 3;
    cp = b0 & 0x0Fu;
  } else if (b0 >= 0xF0 && b0 <= 0xF4) {
    len = 4;
    cp = b0 & 0x07u;
  } else {
    return 0;
  }
  if (i + len > s.size()) return 0;
  for (std::size_t k = 1; k < len; ++k) {
    const auto b = static_cast<unsigned char>(s[i + k]);
    if ((b & 0xC0u) != 0x80u) return 0;
    cp = (cp << 6) | (b & 0x3Fu);
  }
  if ((len == 3 && cp < 0x800) || (len == 4 && (cp < 0x10000 || cp > 0x10FFFF))) return 0;
  if (cp >= 0xD800 && cp <= 0xDFFF) return 0;
  return len;
}

inline std::size_t utf8_sequence_length(std::string_view s, std::size_t i) {
  std::uint32_t cp = 0;
  return utf8_decode(s, i, cp);
}

// Appends `s` with control characters as spaces and invalid UTF-8 bytes as U+FFFD (for header lines).
inline void append_printable(std::string& out, std::string_view s) {
  for (std::size_t i = 0; i < s.size();) {
    const auto u = static_cast<unsigned char>(s[i]);
    if (u >= 0x80) {
      const std::size_t len = utf8_sequence_length(s, i);
      if (len == 0) {
        out += "\xEF\xBF\xBD";
        ++i;
      } else {
        out.append(s.data() + i, len);
        i += len;
      }
      continue;
    }
    out += (u < 0x20 || u == 0x7F) ? ' ' : s[i];
    ++i;
  }
}

// Sorts `order` (indices into something `context` points to) by `less`. The writers sort rows, lines and
// paths through this one function so that the program holds a single std::sort of indices instead of one
// per comparator (each is a few kilobytes of code to compile). Ties keep no particular order: a `less`
// that must be stable breaks them by index.
using index_less = bool (*)(const void* context, std::uint32_t a, std::uint32_t b);

inline void sort_indices(std::vector<std::uint32_t>& order, index_less less, const void* context) {
  struct by_less {
    index_less less;
    const void* context;
    bool operator()(std::uint32_t a, std::uint32_t b) const { return less(context, a, b); }
  };
  std::sort(order.begin(), order.end(), by_less{less, context});
}

// 0, 1, ..., n-1.
inline std::vector<std::uint32_t> identity_order(std::size_t n) {
  std::vector<std::uint32_t> order(n);
  for (std::size_t i = 0; i < n; ++i) order[i] = static_cast<std::uint32_t>(i);
  return order;
}

}  // namespace detail
}  // namespace selfprof
// ---- end selfprof/output/text.hpp ----

namespace selfprof {

struct folded_options {
  bool thread_roots = false;           // prefix `[name tid=N]` (see above)
  bool annotate = true;                // `_[k]` `_[j]` `_[i]` suffixes
  std::size_t max_line_bytes = 65535;  // per line including LF; 0 = no limit
};

namespace detail {

inline constexpr std::string_view truncated_marker = "[truncated]";
inline constexpr std::string_view unknown_frame = "[unknown]";

// Appends `name` made safe for a folded line (the rules in the header comment, without annotation).
inline void append_folded_name(std::string& out, std::string_view name) {
  const std::size_t start = out.size();
  for (std::size_t i = 0; i < name.size();) {
    const char c = name[i];
    const auto u = static_cast<unsigned char>(c);
    if (u >= 0x80) {
      const std::size_t len = utf8_sequence_length(name, i);
      if (len == 0) {
        out += "\xEF\xBF\xBD";
        ++i;
      } else {
        out.append(name.data() + i, len);
        i += len;
      }
      continue;
    }
    if (c == '\r' || c == '\n' || c == '\0') {
    } else if (c == ';') {
      out += ':';
    } else if (u < 0x20 || u == 0x7F) {
      out += ' ';
    } else {
      out += c;
    }
    ++i;
  }
  while (out.size() > start && out.back() == ' ') out.pop_back();
  // "<space><digits>[.<digits>]" at the end would read as a count column: replace that space.
  std::size_t j = out.size();
  while (j > start && out[j - 1] >= '0' && out[j - 1] <= '9') --j;
  if (j < out.size() && j > start && out[j - 1] == '.') {
    std::size_t k = j - 1;
    while (k > start && out[k - 1] >= '0' && out[k - 1] <= '9') --k;
    if (k < j - 1) j = k;
  }
  if (j < out.size() && j > start && out[j - 1] == ' ') out[j - 1] = '_';
  if (out.size() == start) out += unknown_frame;
}

inline std::string_view kind_annotation(frame_kind kind) {
  switch (kind) {
    case frame_kind::kernel:
      return "_[k]";
    case frame_kind::jit:
      return "_[j]";
    case frame_kind::inlined:
      return "_[i]";
    default:
      return {};
  }
}

// The folded text of one frame: the safe name plus its annotation.
inline std::string folded_frame_name(const frame& f, bool annotate = true) {
  std::string out;
  append_folded_name(out, f.name);
  if (annotate) out += kind_annotation(f.kind);
  return out;
}

// `[name tid=N]` or `[tid=N]`; the name is made safe like a frame name.
inline std::string thread_root_name(std::uint32_t tid, const std::string& name) {
  std::string out = "[";
  if (!name.empty()) {
    std::string safe;
    append_folded_name(safe, name);
    if (safe != unknown_frame) {
      out += safe;
      out += ' ';
    }
  }
  out += "tid=";
  out += std::to_string(tid);
  out += ']';
  return out;
}

inline bool is_thread_root_name(std::string_view name) {
  if (name.size() < 7 || name.front() != '[' || name.back() != ']') return false;
  const auto pos = name.rfind("tid=");
  if (pos == std::string_view::npos || (pos != 1 && name[pos - 1] != ' ')) return false;
  const std::size_t digits_begin = pos + 4, digits_end = name.size() - 1;
  if (digits_begin == digits_end) return false;
  for (std::size_t i = digits_begin; i < digits_end; ++i)
    if (name[i] < '0' || name[i] > '9') return false;
  return true;
}

inline const frame* frame_at(const profile& p, std::uint32_t index) {
  return index < p.frames.size() ? &p.frames[index] : nullptr;
}

inline bool is_marker(const profile& p, std::uint32_t index, bool (*pred)(std::string_view)) {
  const frame* f = frame_at(p, index);
  return f && f->kind == frame_kind::marker && pred(f->name);
}

inline bool is_truncated_name(std::string_view name) { return name == truncated_marker; }

// Does stack `s` carry its [truncated] marker already: at frames[first], or right below a root there (a
// recording's process root keeps its stacks, cut ones too, in one tower; read back from folded text,
// that root is an ordinary frame)?
inline bool has_truncated_marker(const profile& p, const stack& s, std::size_t first) {
  const auto at = [&](std::size_t i) {
    return i < s.frames.size() && is_marker(p, s.frames[i], is_truncated_name);
  };
  return at(first) || at(first + 1);
}

// Cuts `s` to at most `n` bytes without splitting a UTF-8 sequence.
inline void cut_utf8(std::string& s, std::size_t n) {
  if (s.size() <= n) return;
  while (n > 0 && (static_cast<unsigned char>(s[n]) & 0xC0u) == 0x80u) --n;
  s.resize(n);
}

// The folded stack text (without count) of one stack; `names` caches folded_frame_name per frame;
// `thread_root` is the root frame to add (empty: none); `budget` is the most bytes the text may take
// (0 = no limit).
inline std::string folded_stack_text(const profile& p, const stack& s, const std::string& thread_root,
                                     const std::vector<std::string>& names, std::size_t budget) {
  std::vector<std::string_view> parts;
  parts.reserve(s.frames.size() + 2);
  std::size_t first = 0;  // index in s.frames of the first frame after existing root markers
  const bool has_root = !s.frames.empty() && is_marker(p, s.frames[0], is_thread_root_name);
  if (has_root) {
    parts.push_back(names[s.frames[0]]);
    first = 1;
  } else if (!thread_root.empty()) {
    parts.push_back(thread_root);
  }
  const std::size_t root_parts = parts.size();
  if (s.truncated && !has_truncated_marker(p, s, first)) parts.push_back(truncated_marker);
  static const std::string bad = std::string(unknown_frame);
  for (std::size_t i = first; i < s.frames.size(); ++i)
    parts.push_back(s.frames[i] < names.size() ? std::string_view(names[s.frames[i]])
                                               : std::string_view(bad));
  if (parts.empty()) parts.push_back(unknown_frame);

  std::size_t total = 0;
  for (auto part : parts) total += part.size() + 1;
  total -= 1;
  if (budget == 0 || total <= budget) {
    std::string out;
    out.reserve(total);
    for (std::size_t i = 0; i < parts.size(); ++i) {
      if (i) out += ';';
      out.append(parts[i].data(), parts[i].size());
    }
    return out;
  }
  // Too long: keep the thread root and a [truncated] marker, then as many leaf-side frames as fit.
  std::string head;
  for (std::size_t i = 0; i < root_parts; ++i) head.append(parts[i].data(), parts[i].size()) += ';';
  head += truncated_marker;
  std::size_t first_data = root_parts;
  if (first_data < parts.size() && parts[first_data] == truncated_marker) ++first_data;
  if (head.size() > budget) {  // even the head does not fit: drop the thread root
    head = std::string(truncated_marker);
  }
  std::size_t used = head.size();
  std::size_t keep_from = parts.size();
  while (keep_from > first_data && used + 1 + parts[keep_from - 1].size() <= budget) {
    used += 1 + parts[keep_from - 1].size();
    --keep_from;
  }
  std::string out = head;
  if (keep_from == parts.size() && first_data < parts.size()) {
    // Not even the leaf fits next to the marker: cut the leaf itself.
    std::string leaf(parts.back());
    cut_utf8(leaf, budget > head.size() + 1 ? budget - head.size() - 1 : 0);
    while (!leaf.empty() && leaf.back() == ' ') leaf.pop_back();
    if (leaf.empty()) return out;
    out += ';';
    out += leaf;
    return out;
  }
  for (std::size_t i = keep_from; i < parts.size(); ++i)
    (out += ';').append(parts[i].data(), parts[i].size());
  return out;
}

// Stack texts merged by name, with their counts; `order` lists them sorted bytewise.
struct folded_table {
  std::vector<std::string> texts;
  std::vector<std::uint64_t> counts;
  std::vector<std::uint32_t> order;
};

inline folded_table folded_lines(const profile& p, const folded_options& opts = {}) {
  std::vector<std::string> names;
  names.reserve(p.frames.size());
  for (const auto& f : p.frames) names.push_back(folded_frame_name(f, opts.annotate));
  // Budget for the stack text: the line minus " COUNT\n" (space, up to 20 digits, LF).
  std::size_t budget = 0;
  if (opts.max_line_bytes) {
    const std::size_t tail = 2 + 20;
    budget = opts.max_line_bytes > tail + 16 ? opts.max_line_bytes - tail : 16;
  }
  std::unordered_map<std::uint32_t, std::string> roots;  // tid → `[name tid=N]`
  static const std::string no_root;
  folded_table t;
  std::unordered_map<std::string, std::size_t> index;  // text -> its place in t.texts
  index.reserve(p.stacks.size());
  for (const auto& s : p.stacks) {
    if (s.count == 0) continue;
    const std::string* root = &no_root;
    if (opts.thread_roots && s.tid != 0) {
      std::string& text = roots[s.tid];  // never empty once made
      if (text.empty()) text = thread_root_name(s.tid, p.thread_name(s.tid));
      root = &text;
    }
    std::string text = folded_stack_text(p, s, *root, names, budget);
    auto [it, fresh] = index.try_emplace(text, t.texts.size());
    if (fresh) {
      t.texts.push_back(std::move(text));
      t.counts.push_back(0);
    }
    add_saturating(t.counts[it->second], s.count);
  }
  t.order = identity_order(t.texts.size());
  sort_indices(
      t.order,
      [](const void* texts, std::uint32_t a, std::uint32_t b) {
        const auto& x = *static_cast<const std::vector<std::string>*>(texts);
        return x[a] < x[b];
      },
      &t.texts);
  return t;
}

}  // namespace detail

// The folded text of a profile (see the promises at the top of this file).
inline std::string write_folded(const profile& p, const folded_options& opts = {}) {
  const detail::folded_table lines = detail::folded_lines(p, opts);
  std::size_t size = 0;
  for (const auto& text : lines.texts) size += text.size() + 22;
  std::string out;
  out.reserve(size);
  for (const std::uint32_t i : lines.order) {
    out += lines.texts[i];
    out += ' ';
    out += std::to_string(lines.counts[i]);
    out += '\n';
  }
  return out;
}

}  // namespace selfprof
// ---- end selfprof/output/folded.hpp ----
// ---- begin selfprof/output/pprof.hpp ----
// The pprof writer: a gzipped profile.proto (package perftools.profiles) that `go tool pprof`,
// Pyroscope, Parca and speedscope read without the binaries.
// Context: any thread except the signal handler (a pure function of the profile).
//
// What it writes, in field order like Go's own encoder:
//  - sample_type: a samples profile gets Go's CPU convention [samples/count, <mode>/nanoseconds] with
//    values [n, n*period] (mode cpu → "cpu", wall → "wall", offcpu → "offcpu"); a profile whose unit
//    is a time (ns/us/ms/s) gets one [<mode>/nanoseconds]; any other unit one [<unit>/count].
//  - Samples merged by (locations, thread); labels thread_id (num) and thread_name (str).
//  - One Mapping per module of native/inlined frames, has_functions set (has_filenames,
//    has_line_numbers, has_inline_frames when true), so pprof never re-symbolizes over our names; its
//    range spans the addresses seen, file_offset = the module offset of the lowest one. Kernel, JIT
//    and marker frames use mapping_id 0.
//  - One Location per distinct (mapping, address, inline chain): a native frame followed by inlined
//    frames becomes one Location whose Lines list the innermost callee first.
//  - Functions with name = our (demangled) name and no system_name: the profile holds no mangled
//    names, and pprof rewrites (simplifies: drops template and parameter lists) any name equal to its
//    system_name, so an empty system_name is what keeps our names intact. When frames gain a mangled
//    name it belongs in system_name (field 3).
//  - A truncated stack gets a `[truncated]` function at its root end, as in the folded output.
//  - time_nanos, duration_nanos, period_type, period (period_ns, else 1e9/hz), comments (tool version,
//    source, hz, dropped, notes). No default_sample_type, so tools show the last type.
// `detail::encode_pprof` gives the raw protobuf bytes (deterministic; pinned by golden files);
// `write_pprof` gzips them (zlib or stored blocks, see gzip.hpp).

#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

// ---- begin selfprof/output/gzip.hpp ----
// gzip framing for the pprof writer: zlib's deflate when SELFPROF_HAS_ZLIB is 1, otherwise stored
// (uncompressed) deflate blocks, both with the RFC 1952 header, CRC-32 and size trailer.
// Context: any thread except the signal handler.
//
// SELFPROF_HAS_ZLIB (config.hpp; 0/1, default 0): 1 needs <zlib.h> and linking with -lz (the build sets
// it when it finds zlib). It must have the same value in every translation unit of a program. The
// stored form is about 0.01% larger than its input but needs nothing; every gzip reader accepts it.
// SELFPROF_ZLIB_DLOPEN=1 (the preload library) loads libz.so.1 with dlopen at the first compression
// instead of linking it: a process that never writes a .pb.gz does not map zlib. Without libz.so.1 the
// output is stored blocks.

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>


#if SELFPROF_HAS_ZLIB
#include <zlib.h>

#endif

namespace selfprof {
namespace detail {

// CRC-32 (ISO-HDLC: reflected polynomial 0xEDB88320, init and final xor 0xFFFFFFFF) as gzip uses it.
// `crc` continues an earlier result (0 to start).
inline std::uint32_t crc32(std::string_view bytes, std::uint32_t crc = 0) {
  struct table_t {
    std::uint32_t v[256];
    table_t() {
      for (std::uint32_t i = 0; i < 256; ++i) {
        std::uint32_t c = i;
        for (int k = 0; k < 8; ++k) c = (c & 1u) ? 0xEDB88320u ^ (c >> 1) : c >> 1;
        v[i] = c;
      }
    }
  };
  static const table_t table;
  crc = ~crc;
  for (const char ch : bytes) crc = table.v[(crc ^ static_cast<unsigned char>(ch)) & 0xFFu] ^ (crc >> 8);
  return ~crc;
}

inline void put_le32(std::string& out, std::uint32_t v) {
  for (int i = 0; i < 4; ++i) out += static_cast<char>((v >> (8 * i)) & 0xFFu);
}

// gzip member with a fixed header (no name, mtime 0, OS 3 = Unix) and stored deflate blocks.
inline std::string gzip_stored(std::string_view bytes) {
  constexpr std::size_t block_max = 65535;  // a stored block's LEN is 16 bits (RFC 1951 §3.2.4)
  std::string out("\x1f\x8b\x08\x00\x00\x00\x00\x00\x00\x03", 10);
  out.reserve(out.size() + bytes.size() + (bytes.size() / block_max + 1) * 5 + 8);
  std::size_t pos = 0;
  do {
    const std::size_t len = bytes.size() - pos < block_max ? bytes.size() - pos : block_max;
    const bool last = pos + len == bytes.size();
    out += static_cast<char>(last ? 1 : 0);  // BFINAL, BTYPE=00; the rest of the byte is padding
    out += static_cast<char>(len & 0xFFu);
    out += static_cast<char>((len >> 8) & 0xFFu);
    out += static_cast<char>(~len & 0xFFu);
    out += static_cast<char>((~len >> 8) & 0xFFu);
    out.append(bytes.data() + pos, len);
    pos += len;
  } while (pos < bytes.size());
  put_le32(out, crc32(bytes));
  put_le32(out, static_cast<std::uint32_t>(bytes.size() & 0xFFFFFFFFu));
  return out;
}

#if SELFPROF_HAS_ZLIB
// The zlib functions gzip_zlib calls: linked, or loaded once from libz.so.1 (SELFPROF_ZLIB_DLOPEN; `ok`
// is false when the library or a function is missing).
#define SELFPROF_ZLIB_FUNCTIONS(X) X(deflateInit2_) X(deflateBound) X(deflate) X(deflateEnd)
struct zlib_api {
  SELFPROF_ZLIB_FUNCTIONS(SELFPROF_DL_MEMBER)
  bool ok = false;
};

inline const zlib_api& zlib() {
  static const zlib_api api = [] {
    zlib_api a;
#if SELFPROF_ZLIB_DLOPEN
    SELFPROF_DL_FILL_LOADED(a, SELFPROF_ZLIB_FUNCTIONS, "libz.so.1");
#else
    SELFPROF_DL_FILL_LINKED(a, SELFPROF_ZLIB_FUNCTIONS);
#endif
    return a;
  }();
  return api;
}
#undef SELFPROF_ZLIB_FUNCTIONS

// zlib deflate with a gzip wrapper; returns an empty string when zlib fails or is missing (the caller
// falls back).
inline std::string gzip_zlib(std::string_view bytes, int level = Z_DEFAULT_COMPRESSION) {
  const zlib_api& z = zlib();
  if (!z.ok) return {};
  z_stream zs{};
  // What the deflateInit2 macro expands to, through the table.
  if (z.deflateInit2_(&zs, level, Z_DEFLATED, 15 + 16, 8, Z_DEFAULT_STRATEGY, ZLIB_VERSION,
                      static_cast<int>(sizeof(z_stream))) != Z_OK)
    return {};
  std::string out(z.deflateBound(&zs, static_cast<uLong>(bytes.size())) + 32, '\0');
  zs.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(bytes.data()));
  zs.avail_in = static_cast<uInt>(bytes.size());
  zs.next_out = reinterpret_cast<Bytef*>(&out[0]);
  zs.avail_out = static_cast<uInt>(out.size());
  const int rc = z.deflate(&zs, Z_FINISH);
  const std::size_t produced = out.size() - zs.avail_out;
  z.deflateEnd(&zs);
  if (rc != Z_STREAM_END) return {};
  out.resize(produced);
  return out;
}
#endif

// gzip of `bytes`: zlib when built with it (and inputs fit its 32-bit sizes), stored blocks otherwise.
inline std::string gzip_compress(std::string_view bytes) {
#if SELFPROF_HAS_ZLIB
  if (bytes.size() < 0xFFFFFFFFu) {
    std::string z = gzip_zlib(bytes);
    if (!z.empty()) return z;
  }
#endif
  return gzip_stored(bytes);
}

}  // namespace detail
}  // namespace selfprof
// ---- end selfprof/output/gzip.hpp ----
// ---- begin selfprof/output/protobuf.hpp ----
// A minimal protocol-buffers encoder (varints, length-delimited fields, packed repeats): enough to
// write pprof's profile.proto without a third-party library.
// Context: any thread except the signal handler.

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace selfprof {
namespace detail {

class proto_writer {
 public:
  enum wire : std::uint32_t { varint_wire = 0, bytes_wire = 2 };

  // An unsigned (or int64 as two's complement: negative values take ten bytes, as in protobuf) field.
  void varint_field(std::uint32_t field, std::uint64_t v) {
    tag(field, varint_wire);
    varint(v);
  }
  // Proto3 leaves fields at their default out: these skip zero / false / empty.
  void varint_field_nz(std::uint32_t field, std::uint64_t v) {
    if (v) varint_field(field, v);
  }
  void int64_field_nz(std::uint32_t field, std::int64_t v) {
    if (v) varint_field(field, static_cast<std::uint64_t>(v));
  }
  void bool_field_nz(std::uint32_t field, bool v) {
    if (v) varint_field(field, 1);
  }
  // Strings, bytes and nested messages; repeated string fields write empty strings too.
  void bytes_field(std::uint32_t field, std::string_view bytes) {
    tag(field, bytes_wire);
    varint(bytes.size());
    out_.append(bytes.data(), bytes.size());
  }
  void message_field(std::uint32_t field, const proto_writer& sub) { bytes_field(field, sub.out_); }
  // A packed repeated varint field (skipped when empty).
  void packed_field(std::uint32_t field, const std::vector<std::uint64_t>& values) {
    if (values.empty()) return;
    proto_writer body;
    for (const auto v : values) body.varint(v);
    bytes_field(field, body.out_);
  }

  void varint(std::uint64_t v) {
    while (v >= 0x80) {
      out_ += static_cast<char>((v & 0x7F) | 0x80);
      v >>= 7;
    }
    out_ += static_cast<char>(v);
  }

  const std::string& bytes() const { return out_; }
  std::string take() { return std::move(out_); }
  void clear() { out_.clear(); }

 private:
  void tag(std::uint32_t field, wire w) { varint((static_cast<std::uint64_t>(field) << 3) | w); }
  std::string out_;
};

}  // namespace detail
}  // namespace selfprof
// ---- end selfprof/output/protobuf.hpp ----
// ---- begin selfprof/version.hpp ----
// The library version, written once here and read by CMake and Meson.
// Context: any thread.

#define SELFPROF_VERSION_MAJOR 0
#define SELFPROF_VERSION_MINOR 1
#define SELFPROF_VERSION_PATCH 0
#define SELFPROF_VERSION_STRING "0.1.0"
#define SELFPROF_VERSION \
  (SELFPROF_VERSION_MAJOR * 10000 + SELFPROF_VERSION_MINOR * 100 + SELFPROF_VERSION_PATCH)
// ---- end selfprof/version.hpp ----

namespace selfprof {

struct pprof_options {
  bool gzip = true;  // on-disk pprof profiles are gzipped; false gives the raw protobuf
};

namespace detail {

class pprof_builder {
 public:
  explicit pprof_builder(const profile& p) : p_(p), frame_location_(p.frames.size(), 0) { intern(""); }

  std::string encode() {
    value_setup();
    for (const auto& s : p_.stacks) add_stack(s);

    proto_writer out;
    for (std::size_t i = 0; i < sample_type_count_; ++i) {
      proto_writer vt;
      vt.varint_field_nz(1, static_cast<std::uint64_t>(intern(sample_types_[i].type)));
      vt.varint_field_nz(2, static_cast<std::uint64_t>(intern(sample_types_[i].unit)));
      out.message_field(1, vt);
    }
    for (const auto& s : samples_) {
      proto_writer m;
      m.packed_field(1, s.locations);
      m.packed_field(2, s.values);
      if (s.tid != 0) {
        proto_writer l;
        l.varint_field_nz(1, static_cast<std::uint64_t>(intern("thread_id")));
        l.varint_field_nz(3, s.tid);
        m.message_field(3, l);
        const std::string& name = p_.thread_name(s.tid);
        if (!name.empty()) {
          proto_writer n;
          n.varint_field_nz(1, static_cast<std::uint64_t>(intern("thread_name")));
          n.varint_field_nz(2, static_cast<std::uint64_t>(intern(name)));
          m.message_field(3, n);
        }
      }
      out.message_field(2, m);
    }
    for (std::size_t i = 0; i < mappings_.size(); ++i) {
      const auto& mp = mappings_[i];
      proto_writer m;
      m.varint_field_nz(1, i + 1);
      m.varint_field_nz(2, mp.start);
      m.varint_field_nz(3, mp.limit);
      m.varint_field_nz(4, mp.offset);
      m.varint_field_nz(5, static_cast<std::uint64_t>(intern(mp.filename)));
      m.bool_field_nz(7, true);
      m.bool_field_nz(8, mp.has_filenames);
      m.bool_field_nz(9, mp.has_lines);
      m.bool_field_nz(10, mp.has_inline);
      out.message_field(3, m);
    }
    for (std::size_t i = 0; i < locations_.size(); ++i) {
      const auto& loc = locations_[i];
      proto_writer m;
      m.varint_field_nz(1, i + 1);
      m.varint_field_nz(2, loc.mapping_id);
      m.varint_field_nz(3, loc.address);
      for (const auto& [function_id, line] : loc.lines) {
        proto_writer l;
        l.varint_field_nz(1, function_id);
        l.varint_field_nz(2, line);
        m.message_field(4, l);
      }
      out.message_field(4, m);
    }
    for (std::size_t i = 0; i < functions_.size(); ++i) {
      const auto& fn = functions_[i];
      proto_writer m;
      m.varint_field_nz(1, i + 1);
      m.varint_field_nz(2, static_cast<std::uint64_t>(fn.name));
      m.varint_field_nz(4, static_cast<std::uint64_t>(fn.filename));
      out.message_field(5, m);
    }
    // Strings used only by the trailing fields must be interned before the table is written.
    const std::int64_t period_type = intern(period_type_name_), period_unit = intern("nanoseconds");
    std::vector<std::uint64_t> comments;
    for (const auto& c : comment_lines()) comments.push_back(static_cast<std::uint64_t>(intern(c)));
    for (const auto& s : strings_) out.bytes_field(6, s);
    out.int64_field_nz(9, static_cast<std::int64_t>(p_.info.start_unix_ns & 0x7FFFFFFFFFFFFFFFull));
    out.int64_field_nz(10, clamp_i64(p_.info.duration_s * 1e9));
    proto_writer pt;
    pt.varint_field_nz(1, static_cast<std::uint64_t>(period_type));
    pt.varint_field_nz(2, static_cast<std::uint64_t>(period_unit));
    out.message_field(11, pt);
    out.int64_field_nz(12, static_cast<std::int64_t>(period_ns_));
    for (const auto c : comments) out.varint_field(13, c);
    return out.take();
  }

 private:
  struct mapping_rec {
    std::string filename;
    std::uint64_t start = 0, limit = 0, offset = 0;
    bool has_filenames = false, has_lines = false, has_inline = false;
  };
  struct location_rec {
    std::uint64_t mapping_id = 0, address = 0;
    std::vector<std::pair<std::uint64_t, std::uint64_t>> lines;  // function id, line; innermost first
  };
  struct function_rec {
    std::int64_t name = 0, filename = 0;
  };
  struct value_type {
    std::string type, unit;
  };
  struct sample_rec {
    std::vector<std::uint64_t> locations;  // leaf first
    std::vector<std::uint64_t> values;     // int64 values, all in [0, INT64_MAX]
    std::uint32_t tid = 0;
  };

  static std::int64_t clamp_i64(long double v) {
    if (!(v > 0)) return 0;
    if (v >= 9.2e18L) return INT64_MAX;
    return static_cast<std::int64_t>(v + 0.5L);
  }

  std::int64_t intern(const std::string& s) {
    auto [it, fresh] = string_ids_.try_emplace(s, strings_.size());
    if (fresh) strings_.push_back(s);
    return static_cast<std::int64_t>(it->second);
  }

  void value_setup() {
    const std::string time_type = mode_name(p_.info.mode);
    period_type_name_ = time_type;
    period_ns_ = p_.info.period_ns;
    if (period_ns_ == 0 && p_.info.hz > 0)
      period_ns_ = static_cast<std::uint64_t>(1e9 / p_.info.hz + 0.5);  // rounded (hz > 0), without libm
    const std::string& unit = p_.info.unit;
    if (unit.empty() || unit == "samples") {
      sample_types_[0] = {"samples", "count"};
      sample_types_[1] = {time_type, "nanoseconds"};
      sample_type_count_ = 2;
      factor_ = static_cast<long double>(period_ns_);
      two_values_ = true;
    } else if (unit == "ns" || unit == "nanoseconds" || unit == "us" || unit == "microseconds" ||
               unit == "ms" || unit == "milliseconds" || unit == "s" || unit == "seconds") {
      const char c = unit[0];
      factor_ = c == 'n' ? 1.0L : c == 'u' ? 1e3L : c == 'm' ? 1e6L : 1e9L;
      sample_types_[0] = {time_type, "nanoseconds"};
      sample_type_count_ = 1;
    } else {
      factor_ = 1;
      sample_types_[0] = {unit, "count"};
      sample_type_count_ = 1;
    }
  }

  std::vector<std::string> comment_lines() const {
    std::vector<std::string> c;
    c.emplace_back("selfprof " SELFPROF_VERSION_STRING);
    std::string line = "mode=";
    line += mode_name(p_.info.mode);
    line += " unit=";
    line += p_.info.unit;
    if (!p_.info.source.empty()) {
      line += " source=";
      line += p_.info.source;
    }
    line += " hz=";
    line += format_compact(p_.info.hz);
    line += " samples=";
    line += std::to_string(p_.info.samples);
    line += " dropped=";
    line += std::to_string(p_.info.dropped);
    line += " truncated=";
    line += std::to_string(p_.info.truncated);
    c.push_back(std::move(line));
    if (!p_.info.view.empty()) c.push_back("view=" + p_.info.view);
    for (const auto& l : p_.info.frame_loops) c.push_back("frames: " + frame_stats_line(l));
    for (const auto& n : p_.info.notes) c.push_back(n);
    return c;
  }

  std::uint64_t mapping_for(const frame& f) {
    if (f.module.empty() || f.kind == frame_kind::kernel || f.kind == frame_kind::jit ||
        f.kind == frame_kind::marker)
      return 0;
    auto [it, fresh] = mapping_ids_.try_emplace(f.module, mappings_.size() + 1);
    if (fresh) {
      mapping_rec m;
      m.filename = f.module;
      m.start = f.address;
      m.limit = f.address + 1;
      m.offset = f.module_offset;
      mappings_.push_back(m);
    }
    auto& m = mappings_[it->second - 1];
    if (f.address < m.start) {
      m.start = f.address;
      m.offset = f.module_offset;
    }
    if (f.address >= m.limit) m.limit = f.address + 1;
    if (!f.file.empty()) m.has_filenames = true;
    if (f.line != 0) m.has_lines = true;
    if (f.kind == frame_kind::inlined) m.has_inline = true;
    return it->second;
  }

  std::uint64_t function_for(const std::string& name, const std::string& file) {
    std::string key = name;
    key += '\0';
    key += file;
    auto [it, fresh] = function_ids_.try_emplace(std::move(key), functions_.size() + 1);
    if (fresh)
      functions_.push_back({intern(name.empty() ? "[unknown]" : name), file.empty() ? 0 : intern(file)});
    return it->second;
  }

  // A location for frames [first, last] of a stack (a physical frame and the frames inlined into it).
  std::uint64_t location_for(const std::vector<const frame*>& group) {
    location_rec loc;
    const frame& phys = *group.front();
    loc.address = phys.address;
    loc.mapping_id = 0;
    for (const frame* f : group) {
      const std::uint64_t m = mapping_for(*f);
      if (!loc.mapping_id) loc.mapping_id = m;
    }
    for (auto it = group.rbegin(); it != group.rend(); ++it)
      loc.lines.push_back({function_for((*it)->name, (*it)->file), (*it)->line});
    std::string key;
    append_key(key, loc.mapping_id);
    append_key(key, loc.address);
    for (const auto& [fn, line] : loc.lines) {
      append_key(key, fn);
      append_key(key, line);
    }
    auto [it, fresh] = location_ids_.try_emplace(std::move(key), locations_.size() + 1);
    if (fresh) locations_.push_back(std::move(loc));
    return it->second;
  }

  void add_stack(const stack& s) {
    if (s.count == 0) return;
    static const frame unknown{"[unknown]", "", 0, 0, "", 0, frame_kind::marker};
    static const frame truncated{"[truncated]", "", 0, 0, "", 0, frame_kind::marker};
    std::vector<std::uint64_t> root_first;
    std::vector<const frame*> group;
    std::size_t group_index = 0;  // frame index of a one-frame group, for the per-frame cache
    auto flush = [&] {
      if (group.size() == 1 && group_index < frame_location_.size()) {
        auto& cached = frame_location_[group_index];
        if (!cached) cached = location_for(group);
        root_first.push_back(cached);
      } else if (!group.empty()) {
        root_first.push_back(location_for(group));
      }
      group.clear();
    };
    bool marker_present = false;
    for (std::size_t i = 0; i < s.frames.size(); ++i) {
      const frame* f = s.frames[i] < p_.frames.size() ? &p_.frames[s.frames[i]] : &unknown;
      if (i < 2 && f->kind == frame_kind::marker && f->name == "[truncated]") marker_present = true;
      if (!(f->kind == frame_kind::inlined && !group.empty())) {
        flush();
        group_index = s.frames[i];
      }
      group.push_back(f);
    }
    flush();
    std::uint64_t truncated_id = 0;  // location ids start at 1
    if (s.truncated && !marker_present) truncated_id = location_for({&truncated});
    if (root_first.empty() && truncated_id == 0) root_first.push_back(location_for({&unknown}));

    sample_rec rec;  // leaf first: root_first backwards, then the [truncated] root
    rec.locations.reserve(root_first.size() + 1);
    for (std::size_t i = root_first.size(); i-- > 0;) rec.locations.push_back(root_first[i]);
    if (truncated_id != 0) rec.locations.push_back(truncated_id);
    rec.tid = s.tid;
    std::string key;
    append_key(key, s.tid);
    for (const auto id : rec.locations) append_key(key, id);
    auto [it, fresh] = sample_ids_.try_emplace(std::move(key), samples_.size());
    if (fresh) {
      rec.values.assign(sample_type_count_, 0);
      samples_.push_back(std::move(rec));
    }
    auto& values = samples_[it->second].values;
    const long double n = static_cast<long double>(s.count);
    if (two_values_) {
      values[0] = add_clamped(values[0], clamp_i64(n));
      values[1] = add_clamped(values[1], clamp_i64(n * factor_));
    } else {
      values[0] = add_clamped(values[0], clamp_i64(n * factor_));
    }
  }

  // Appends `v` to a map key as a varint (unambiguous: each value ends with a byte below 0x80).
  static void append_key(std::string& key, std::uint64_t v) {
    while (v >= 0x80) {
      key += static_cast<char>((v & 0x7F) | 0x80);
      v >>= 7;
    }
    key += static_cast<char>(v);
  }

  // a + b capped at INT64_MAX, for a in [0, INT64_MAX] and b >= 0.
  static std::uint64_t add_clamped(std::uint64_t a, std::int64_t b) {
    return a > static_cast<std::uint64_t>(INT64_MAX - b) ? static_cast<std::uint64_t>(INT64_MAX)
                                                         : a + static_cast<std::uint64_t>(b);
  }

  const profile& p_;
  std::vector<std::string> strings_;
  // Every index by bytes below is this one map type (one instantiation for all the writers).
  std::unordered_map<std::string, std::size_t> string_ids_;
  value_type sample_types_[2];
  std::size_t sample_type_count_ = 0;
  std::string period_type_name_;
  std::uint64_t period_ns_ = 0;
  long double factor_ = 1;
  bool two_values_ = false;
  std::vector<mapping_rec> mappings_;
  std::unordered_map<std::string, std::uint64_t> mapping_ids_;
  std::vector<std::uint64_t> frame_location_;  // per frame index: its one-frame location id (0: none yet)
  std::vector<location_rec> locations_;
  std::unordered_map<std::string, std::uint64_t> location_ids_;
  std::vector<function_rec> functions_;
  std::unordered_map<std::string, std::uint64_t> function_ids_;
  std::vector<sample_rec> samples_;
  std::unordered_map<std::string, std::size_t> sample_ids_;
};

// The raw (not gzipped) profile.proto bytes of a profile.
inline std::string encode_pprof(const profile& p) { return pprof_builder(p).encode(); }

}  // namespace detail

// The pprof bytes of a profile: gzipped unless `opts.gzip` is false.
inline std::string write_pprof(const profile& p, const pprof_options& opts = {}) {
  std::string raw = detail::encode_pprof(p);
  return opts.gzip ? detail::gzip_compress(raw) : raw;
}

}  // namespace selfprof
// ---- end selfprof/output/pprof.hpp ----
// ---- begin selfprof/output/sink.hpp ----
// The file sink: writes a profile's bytes to a path atomically (temp file + rename), mode 0600, never
// through a symbolic link and, unless told otherwise, never into a directory other users can write.
// Context: any thread except the signal handler (the collector thread on a dump, or the CLI).
//
// Policy, in the order it is checked (every refusal names the path and the reason):
//  1. The directory is opened once, without following a symbolic link in any of its components, and
//     every later step works relative to that descriptor, so nothing is resolved by path again and a
//     directory swapped underneath us cannot redirect the write (safe_dir.hpp).
//  2. Every directory on the way, and the destination, is judged by mode and owner (safe_dir.hpp): a
//     *shared* one (writable by users other than us) is refused unless `sink_options::allow_shared_dir`
//     when it has no sticky bit (anyone may rename or delete our file after we wrote it, or replace
//     the next component) or belongs to neither us nor root (the sticky bit does not restrain its
//     owner). /tmp and /var/tmp (root's, sticky) pass.
//  3. The target itself must not be a symbolic link, even a dangling one, nor anything but a regular
//     file (a FIFO, a device or a directory is refused): we replace files, we do not write into them.
//     In a shared directory an existing target owned by someone else is refused (someone planted it;
//     Linux's fs.protected_regular would refuse it as well).
//  4. The bytes go to a fresh temp file ".<name>.tmp-<16 random hex digits>" in the same directory (the
//     name is not guessable in advance; a taken one is retried), created with
//     O_CREAT|O_EXCL|O_NOFOLLOW|O_CLOEXEC and mode 0600 (and fchmod 0600, whatever the umask), written
//     with a full write loop that retries EINTR, fsync'ed, closed (close errors count: NFS reports
//     write-back failures there), then renamed over the target. The directory is fsync'ed afterwards.
//  5. On any failure the temp file is removed and the old target (if any) is left untouched.

#include <fcntl.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>
#include <utility>

// ---- begin selfprof/output/safe_dir.hpp ----
// Opens the directory an output file goes into without following a symbolic link in any component, and
// judges, by mode and owner, whether other users could swap what the path leads to.
// Context: any thread except the signal handler (the dumper thread, an API caller, or the CLI).
//
// The path. `..` is resolved lexically: it cancels the name before it, which is then never opened (no
// component may be a link, so the text and the kernel's walk agree). `..` left at the start of a
// relative path go up from the working directory, by the kernel's `..` of an open directory, which is
// never a link; "/.." is "/". A relative path starts at the working directory, however it was reached.
//
// Opening, two ways that judge the same directories and give the same verdicts:
//  - openat2(2) with RESOLVE_NO_SYMLINKS (Linux 5.6) opens the whole path in one call; then the
//    directories it looked names up in are judged by climbing `..` from the opened descriptor (a
//    directory moves to another parent only with write permission on it).
//  - the walk, used when openat2 fails for any reason (ENOSYS on older kernels, EPERM from a seccomp
//    filter; or ENOENT, ELOOP, EACCES, ... so that the error names the component): one component at a
//    time, openat(O_PATH|O_NOFOLLOW) relative to the descriptor of the previous one, judged before a name
//    is looked up in it; a component that is a symbolic link or not a directory is refused.
// Nothing is resolved by path after it was judged: the caller works relative to the returned descriptor.
//
// The judgement, the same for every directory a name is looked up in and for the destination itself. A
// directory is *shared* when users other than us can write it: writable by "other", or by its group
// when that group is not our effective group (with user-private groups and umask 002 a user's own 0775
// directory is not shared). A shared directory is refused, unless `allow_shared`, when
//   - it has no sticky bit: anyone who can write it may rename, delete or replace its entries (the next
//     component, or our file after we wrote it), whoever owns the directory;
//   - it belongs to neither us nor root: the sticky bit does not restrain the directory's owner.
// /tmp (root's, sticky) passes; a directory that is not shared passes whoever owns it.

#include <fcntl.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#if __has_include(<linux/openat2.h>)
#include <linux/openat2.h>
#endif

#include <cerrno>
#include <cstdint>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

namespace selfprof {
namespace detail {

#ifdef RESOLVE_NO_SYMLINKS
using open_how_v0 = ::open_how;
constexpr std::uint64_t k_resolve_no_symlinks = RESOLVE_NO_SYMLINKS;
constexpr std::uint64_t k_resolve_no_magiclinks = RESOLVE_NO_MAGICLINKS;
#else
// The kernel's struct open_how and flags (include/uapi/linux/openat2.h), for headers older than 5.6.
struct open_how_v0 {
  std::uint64_t flags;
  std::uint64_t mode;
  std::uint64_t resolve;
};
constexpr std::uint64_t k_resolve_no_symlinks = 0x04;
constexpr std::uint64_t k_resolve_no_magiclinks = 0x02;
#endif

// Which way open_dir_nofollow resolves: openat2 with the walk as fallback, or the walk only (tests).
enum class dir_resolver { openat2_first, walk_only };

inline std::string errno_text(int err) {
  char buf[256];
  // GNU strerror_r returns the message pointer (which may or may not be buf).
#if defined(__GLIBC__) && defined(_GNU_SOURCE)
  const char* text = ::strerror_r(err, buf, sizeof buf);
  return text ? std::string(text) : std::string("error ") + std::to_string(err);
#else
  if (::strerror_r(err, buf, sizeof buf) != 0) return "error " + std::to_string(err);
  return std::string(buf);
#endif
}

// A descriptor closed on destruction (directory descriptors: opened and closed outside the seam).
class owned_fd {
 public:
  owned_fd() = default;
  explicit owned_fd(int fd) : fd_(fd) {}
  owned_fd(owned_fd&& o) noexcept : fd_(std::exchange(o.fd_, -1)) {}
  owned_fd& operator=(owned_fd&& o) noexcept {
    if (this != &o) {
      if (fd_ >= 0) ::close(fd_);
      fd_ = std::exchange(o.fd_, -1);
    }
    return *this;
  }
  owned_fd(const owned_fd&) = delete;
  owned_fd& operator=(const owned_fd&) = delete;
  ~owned_fd() {
    if (fd_ >= 0) ::close(fd_);
  }
  int get() const { return fd_; }

 private:
  int fd_ = -1;
};

// A directory path after the lexical pass described at the top of this file.
struct dir_path {
  bool absolute = false;
  unsigned up = 0;                 // leading ".." of a relative path
  std::vector<std::string> names;  // the other components, without "", "." and the names ".." cancelled

  // The directory that holds names[n], as text ("/", ".", "../a", "/a/b"); n == names.size(): the whole.
  std::string prefix(std::size_t n) const {
    std::string s = absolute ? "/" : "";
    for (unsigned i = 0; i < up; ++i) s += "../";
    for (std::size_t i = 0; i < n && i < names.size(); ++i) s += names[i] + "/";
    if (s.size() > 1) s.pop_back();
    return s.empty() ? std::string(".") : s;
  }
};

inline dir_path parse_dir_path(const std::string& dir) {
  dir_path p;
  p.absolute = !dir.empty() && dir[0] == '/';
  std::size_t i = 0;
  while (i <= dir.size()) {
    std::size_t end = dir.find('/', i);
    if (end == std::string::npos) end = dir.size();
    const std::string name = dir.substr(i, end - i);
    if (name == "..") {
      if (!p.names.empty()) {
        p.names.pop_back();
      } else if (!p.absolute) {
        ++p.up;
      }
    } else if (!name.empty() && name != ".") {
      p.names.push_back(name);
    }
    i = end + 1;
  }
  return p;
}

// True when users other than us may create, rename or delete entries of a directory with this stat.
inline bool dir_is_shared(const struct stat& st) {
  if (st.st_mode & S_IWOTH) return true;
  if ((st.st_mode & S_IWGRP) && st.st_gid != ::getegid()) return true;
  return false;
}

// Why a directory with this stat is refused (the judgement above), or "" when it is not.
inline std::string dir_refusal(const struct stat& st, bool allow_shared) {
  if (allow_shared || !dir_is_shared(st)) return "";
  const char* const tail = " (refusing; allow_shared_dir overrides)";
  if (!(st.st_mode & S_ISVTX)) return std::string("is writable by other users and has no sticky bit") + tail;
  if (st.st_uid != ::geteuid() && st.st_uid != 0)
    return "is writable by other users and belongs to another user (uid " + std::to_string(st.st_uid) +
           "), who may rename or delete entries despite the sticky bit" + tail;
  return "";
}

// The destination directory, or why it was refused.
struct opened_dir {
  owned_fd fd;        // O_RDONLY|O_DIRECTORY (fsync needs more than O_PATH); -1 when refused
  struct stat st {};  // the destination's stat
  std::string error;  // names the directory or component; empty when fd is open
};

inline opened_dir dir_refused(std::string why) {
  opened_dir out;
  out.error = std::move(why);
  return out;
}

// The walk (see the top of this file). Public for tests: on a kernel with openat2 it runs only on errors.
inline opened_dir open_dir_walk(const std::string& dir, bool allow_shared) {
  const dir_path p = parse_dir_path(dir);
  const std::string start = p.prefix(0), whole = p.prefix(p.names.size()), dotdot = "..";
  // Takes errno as an argument, read before any message is built (allocation may change errno).
  auto failed = [](int err, const char* kind, const std::string& name) {
    return dir_refused(std::string(kind) + " '" + name + "': " + errno_text(err));
  };
  owned_fd cur(::open(p.absolute ? "/" : ".", O_PATH | O_DIRECTORY | O_CLOEXEC));
  if (cur.get() < 0) return failed(errno, "directory", start);
  for (unsigned i = 0; i < p.up; ++i) {
    owned_fd parent(::openat(cur.get(), "..", O_PATH | O_DIRECTORY | O_CLOEXEC));
    if (parent.get() < 0) return failed(errno, "component", dotdot);
    cur = std::move(parent);
  }
  struct stat st {};
  if (::fstat(cur.get(), &st) != 0) return failed(errno, "directory", start);
  for (std::size_t i = 0; i < p.names.size(); ++i) {
    const std::string why = dir_refusal(st, allow_shared);
    if (!why.empty()) return dir_refused("directory '" + p.prefix(i) + "' " + why);
    const std::string& name = p.names[i];
    // Without O_DIRECTORY a link opens as itself (O_PATH|O_NOFOLLOW), so fstat tells a link from a file.
    owned_fd next(::openat(cur.get(), name.c_str(), O_PATH | O_NOFOLLOW | O_CLOEXEC));
    if (next.get() < 0 || ::fstat(next.get(), &st) != 0) return failed(errno, "component", name);
    if (S_ISLNK(st.st_mode))
      return dir_refused("component '" + name + "' is a symbolic link (refusing to follow it)");
    if (!S_ISDIR(st.st_mode)) return dir_refused("component '" + name + "' is not a directory");
    cur = std::move(next);
  }
  opened_dir out;
  out.fd = owned_fd(::openat(cur.get(), ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (out.fd.get() < 0 || ::fstat(out.fd.get(), &out.st) != 0) return failed(errno, "directory", whole);
  const std::string why = dir_refusal(out.st, allow_shared);
  if (!why.empty()) return dir_refused("directory '" + whole + "' " + why);
  return out;
}

// openat2 and the climb (see the top of this file). False when a system call failed: the walk then
// decides and names the component. True with `out` set otherwise (opened, or refused by the judgement).
inline bool open_dir_openat2(const std::string& dir, bool allow_shared, opened_dir& out) {
#ifdef SYS_openat2
  const dir_path p = parse_dir_path(dir);
  const std::string whole = p.prefix(p.names.size());
  open_how_v0 how{};
  how.flags = O_RDONLY | O_DIRECTORY | O_CLOEXEC;
  how.resolve = k_resolve_no_symlinks | k_resolve_no_magiclinks;
  const long fd = ::syscall(SYS_openat2, AT_FDCWD, whole.c_str(), &how, sizeof how);
  if (fd < 0) return false;
  owned_fd dest(static_cast<int>(fd));
  struct stat st {};
  if (::fstat(dest.get(), &st) != 0) return false;
  // Each `..` is the directory that holds the next name up (the last one: the start). The refusal kept
  // is the topmost, the one the walk reports.
  std::string refusal;
  owned_fd cur;
  int at = dest.get();
  for (std::size_t i = p.names.size(); i-- > 0;) {
    owned_fd parent(::openat(at, "..", O_PATH | O_DIRECTORY | O_CLOEXEC));
    struct stat pst {};
    if (parent.get() < 0 || ::fstat(parent.get(), &pst) != 0) return false;
    const std::string why = dir_refusal(pst, allow_shared);
    if (!why.empty()) refusal = "directory '" + p.prefix(i) + "' " + why;
    cur = std::move(parent);
    at = cur.get();
  }
  if (refusal.empty()) {
    const std::string why = dir_refusal(st, allow_shared);
    if (!why.empty()) refusal = "directory '" + whole + "' " + why;
  }
  out = opened_dir();
  if (!refusal.empty()) {
    out.error = std::move(refusal);
  } else {
    out.fd = std::move(dest);
    out.st = st;
  }
  return true;
#else
  (void)dir, (void)allow_shared, (void)out;
  return false;
#endif
}

// Opens `dir` for an output file: no symbolic link in any component, every directory judged.
inline opened_dir open_dir_nofollow(const std::string& dir, bool allow_shared,
                                    dir_resolver how = dir_resolver::openat2_first) {
  opened_dir out;
  if (how == dir_resolver::openat2_first && open_dir_openat2(dir, allow_shared, out)) return out;
  return open_dir_walk(dir, allow_shared);
}

}  // namespace detail
}  // namespace selfprof
// ---- end selfprof/output/safe_dir.hpp ----

namespace selfprof {

struct sink_options {
  // Write into a directory that other users can write without the sticky bit (see the policy above).
  bool allow_shared_dir = false;
  // fsync the file before the rename and the directory after it. Off only for tests and benchmarks.
  bool sync = true;
};

namespace detail {

// "selfprof: cannot write PATH: REASON"
inline status sink_error(const std::string& path, const std::string& reason) {
  std::string message = "selfprof: cannot write ";
  message += path;
  message += ": ";
  message += reason;
  return status::error(std::move(message));
}

// Splits "a/b/c" into "a/b" and "c"; "c" into "." and "c"; "/c" into "/" and "c".
inline void split_path(const std::string& path, std::string& dir, std::string& base) {
  const auto slash = path.find_last_of('/');
  if (slash == std::string::npos) {
    dir = ".";
    base = path;
  } else {
    dir = slash == 0 ? std::string("/") : path.substr(0, slash);
    base = path.substr(slash + 1);
  }
}

// Owns a descriptor opened through the seam and closes it through the seam.
class sink_fd {
 public:
  explicit sink_fd(int fd) : fd_(fd) {}
  sink_fd(const sink_fd&) = delete;
  sink_fd& operator=(const sink_fd&) = delete;
  ~sink_fd() { reset(); }
  int get() const { return fd_; }
  // Closes now and returns close()'s result (0 when there was nothing to close).
  int reset() {
    int rc = 0;
    if (fd_ >= 0) rc = sys().close(fd_);
    fd_ = -1;
    return rc;
  }

 private:
  int fd_;
};

// Writes all of `bytes`, retrying EINTR and short writes. Returns 0 or an errno value.
inline int write_all(int fd, std::string_view bytes) {
  const char* p = bytes.data();
  std::size_t left = bytes.size();
  while (left > 0) {
    const ssize_t n = ::write(fd, p, left);
    if (n < 0) {
      if (errno == EINTR) continue;
      return errno;
    }
    if (n == 0) return EIO;  // a regular file never returns 0 for a non-empty write
    p += n;
    left -= static_cast<std::size_t>(n);
  }
  return 0;
}

// 64 bits nobody can guess in advance: getrandom(2), else /dev/urandom, else (neither available, as in
// some sandboxes) the clock, the pid and a counter, mixed: not secret, but not known ahead of time.
inline std::uint64_t random_u64() {
  std::uint64_t v = 0;
#ifdef SYS_getrandom
  constexpr unsigned grnd_nonblock = 0x0001;  // GRND_NONBLOCK (getrandom(2)): never wait for the pool
  if (::syscall(SYS_getrandom, &v, sizeof v, grnd_nonblock) == static_cast<long>(sizeof v)) return v;
#endif
  const int fd = ::open("/dev/urandom", O_RDONLY | O_CLOEXEC);
  if (fd >= 0) {
    const ssize_t n = ::read(fd, &v, sizeof v);
    ::close(fd);
    if (n == static_cast<ssize_t>(sizeof v)) return v;
  }
  static std::atomic<std::uint64_t> counter{0};
  struct timespec ts {};
  ::clock_gettime(CLOCK_REALTIME, &ts);
  v = static_cast<std::uint64_t>(ts.tv_sec) * 1000000007u + static_cast<std::uint64_t>(ts.tv_nsec);
  v ^= static_cast<std::uint64_t>(::getpid()) << 40;
  v += counter.fetch_add(1, std::memory_order_relaxed) * 0x9e3779b97f4a7c15u;
  // splitmix64's finalizer: every input bit moves about half of the output bits.
  v = (v ^ (v >> 30)) * 0xbf58476d1ce4e5b9u;
  v = (v ^ (v >> 27)) * 0x94d049bb133111ebu;
  return v ^ (v >> 31);
}

// ".<base>.tmp-<16 random hex digits>". A long base keeps its first 200 bytes, so the temp name stays
// under NAME_MAX (255).
inline std::string temp_name_for(const std::string& base) {
  static const char digits[] = "0123456789abcdef";
  std::string name = ".";
  name.append(base, 0, 200);
  name += ".tmp-";
  const std::uint64_t r = random_u64();
  for (int shift = 60; shift >= 0; shift -= 4) name += digits[(r >> shift) & 0xf];
  return name;
}

// Writes `bytes` to `path` atomically, following the policy at the top of this file. `how` chooses how
// the directory is opened (tests force the walk that stands in for openat2 on older kernels).
inline status write_file_atomic(const std::string& path, std::string_view bytes, const sink_options& opts,
                                dir_resolver how) {
  if (path.empty()) return status::error("selfprof: cannot write an empty path");
  std::string dir, base;
  split_path(path, dir, base);
  if (base.empty() || base == "." || base == "..")
    return sink_error(path, "not a file name (the path ends in '/', '.' or '..')");

  const opened_dir d = open_dir_nofollow(dir, opts.allow_shared_dir, how);
  if (!d.error.empty()) return sink_error(path, d.error);
  const int dirfd = d.fd.get();
  const bool shared = dir_is_shared(d.st);

  struct stat tst {};
  if (::fstatat(dirfd, base.c_str(), &tst, AT_SYMLINK_NOFOLLOW) == 0) {
    if (S_ISLNK(tst.st_mode))
      return sink_error(path, "the target is a symbolic link (refusing to follow it)");
    if (!S_ISREG(tst.st_mode)) return sink_error(path, "the target exists and is not a regular file");
    if (shared && tst.st_uid != ::geteuid() && !opts.allow_shared_dir)
      return sink_error(path, "the target exists in a shared directory and belongs to another user (uid " +
                                  std::to_string(tst.st_uid) + ")");
  } else if (errno != ENOENT) {
    return sink_error(path, errno_text(errno));
  }

  std::string temp;
  int tfd = -1;
  for (unsigned attempt = 0; attempt < 100; ++attempt) {
    temp = temp_name_for(base);
    tfd = sys().openat(dirfd, temp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
    if (tfd >= 0 || errno != EEXIST) break;
  }
  if (tfd < 0) return sink_error(path, errno_text(errno));
  sink_fd file(tfd);

  auto fail = [&](int err, const char* step) {
    file.reset();
    ::unlinkat(dirfd, temp.c_str(), 0);
    std::string reason = errno_text(err);
    if (step) {
      reason += " (";
      reason += step;
      reason += ')';
    }
    return sink_error(path, reason);
  };

  if (::fchmod(file.get(), 0600) != 0) return fail(errno, "fchmod");
  if (const int err = write_all(file.get(), bytes)) return fail(err, "write");
  if (opts.sync && ::fsync(file.get()) != 0) return fail(errno, "fsync");
  if (file.reset() != 0) return fail(errno, "close");
  if (::renameat(dirfd, temp.c_str(), dirfd, base.c_str()) != 0) return fail(errno, "rename");
  if (opts.sync) ::fsync(dirfd);  // best effort: the file is complete either way
  return status::ok();
}

inline status write_file_atomic(const std::string& path, std::string_view bytes,
                                const sink_options& opts = {}) {
  return write_file_atomic(path, bytes, opts, dir_resolver::openat2_first);
}

}  // namespace detail
}  // namespace selfprof
// ---- end selfprof/output/sink.hpp ----
// ---- begin selfprof/output/svg.hpp ----
// The interactive SVG flame graph writer: flamegraph.pl's DOM and tooltips, inferno's fg:x/fg:w, one
// self-contained file.
// Context: any thread (pure function of the profile; runs on the dump path, never in the signal handler).

#include <cstdint>
#include <ctime>
#include <string>
#include <string_view>
#include <vector>

// ---- begin selfprof/output/flame_tree.hpp ----
// The merged call tree behind a flame graph: stacks merged by frame name, laid out in sample space, pruned
// to a minimum width.
// Context: any thread (pure data structure; built on the dump path).

#include <algorithm>
#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>


namespace selfprof {
namespace detail {

constexpr std::uint32_t no_node = 0xffffffffu;

// Name of a frame as the picture shows it, with flamegraph.pl's annotation suffix for its kind.
// A name that already carries a `_[x]` suffix (read back from a folded file) keeps it as it is.
inline std::string annotated_frame_name(const frame& f) {
  std::string n = f.name.empty() ? std::string("[unknown]") : f.name;
  auto has_suffix = [&n] {
    return n.size() >= 4 && n[n.size() - 4] == '_' && n[n.size() - 3] == '[' && n.back() == ']' &&
           (n[n.size() - 2] == 'k' || n[n.size() - 2] == 'w' || n[n.size() - 2] == 'i' ||
            n[n.size() - 2] == 'j');
  };
  if (has_suffix()) return n;
  switch (f.kind) {
    case frame_kind::kernel:
      n += "_[k]";
      break;
    case frame_kind::jit:
      n += "_[j]";
      break;
    case frame_kind::inlined:
      n += "_[i]";
      break;
    default:
      break;
  }
  return n;
}

// The name without a trailing `_[k]`, `_[w]`, `_[i]` or `_[j]` (label and tooltip drop it).
inline std::string_view strip_annotation(std::string_view n) {
  if (n.size() >= 4 && n[n.size() - 4] == '_' && n[n.size() - 3] == '[' && n.back() == ']') {
    char k = n[n.size() - 2];
    if (k == 'k' || k == 'w' || k == 'i' || k == 'j') return n.substr(0, n.size() - 4);
  }
  return n;
}

// Which annotation a name carries: 'k', 'w', 'i', 'j', or 0.
inline char annotation_of(std::string_view n) {
  return strip_annotation(n).size() == n.size() ? 0 : n[n.size() - 2];
}

struct flame_node {
  std::uint32_t name = 0;  // index into flame_tree::names()
  std::uint32_t parent = no_node;
  std::uint32_t first_child = no_node;
  std::uint32_t last_child = no_node;
  std::uint32_t next_sibling = no_node;
  std::uint64_t width = 0;              // inclusive value of the layout channel
  std::uint64_t before = 0, after = 0;  // inclusive values (diff: baseline and new; else both equal)
  std::uint64_t self_before = 0, self_after = 0;  // exclusive values
};

// One frame placed for drawing, in emission order (parents before children).
struct laid_frame {
  std::uint32_t node = no_node;    // tree node, or no_node for an aggregate of elided frames
  std::uint32_t parent = no_node;  // index into the laid vector (no_node for the root)
  std::uint32_t depth = 0;         // 0 = root
  std::uint64_t x = 0, width = 0;  // sample space
  std::uint64_t before = 0, after = 0, self_before = 0, self_after = 0;
  std::uint32_t elided = 0;  // for aggregates: how many frames (with their subtrees) it stands for
};

// Stacks are collected first, then merged in one pass: sorted by name (or kept in order for a flame
// chart) so that equal prefixes are adjacent, and merged by walking each stack's common prefix with
// the previous one. No per-node hash lookups: this is the hot path for 100,000-stack profiles.
class flame_tree {
 public:
  flame_tree() {
    names_.emplace_back("all");
    nodes_.emplace_back();
  }

  // Interns a frame name (annotated) and returns its id.
  std::uint32_t intern(std::string name) {
    auto [it, fresh] = name_ids_.try_emplace(name, names_.size());
    if (fresh) names_.push_back(std::move(name));
    return static_cast<std::uint32_t>(it->second);
  }

  // Queues one stack (root first) with its values; build() merges the queue into the tree.
  void add(const std::uint32_t* ids, std::size_t n, std::uint64_t before, std::uint64_t after,
           std::uint64_t width) {
    pending p;
    p.offset = path_ids_.size();
    p.length = n;
    p.before = before;
    p.after = after;
    p.width = width;
    path_ids_.insert(path_ids_.end(), ids, ids + n);
    pending_.push_back(p);
  }

  // Merges the queued stacks. `sorted`: siblings ordered by name bytes and all equal prefixes merged;
  // else (flame chart) stacks keep their order and only adjacent equal prefixes merge.
  void build(bool sorted) {
    std::vector<std::uint32_t> key(names_.size());  // what paths are compared by
    if (sorted) {
      std::vector<std::uint32_t> by_name = identity_order(names_.size());
      sort_indices(
          by_name,
          [](const void* tree, std::uint32_t a, std::uint32_t b) {
            const auto& names = static_cast<const flame_tree*>(tree)->names_;
            return names[a] < names[b];
          },
          this);
      for (std::uint32_t r = 0; r < by_name.size(); ++r) key[by_name[r]] = r;
    } else {
      for (std::uint32_t i = 0; i < key.size(); ++i) key[i] = i;
    }
    std::vector<std::uint32_t> order = identity_order(pending_.size());
    if (sorted) {
      for (auto& id : path_ids_) id = key[id];  // compare ranks, then map back below
      sort_indices(order, path_less, this);
      std::vector<std::uint32_t> unrank(key.size());
      for (std::uint32_t i = 0; i < key.size(); ++i) unrank[key[i]] = i;
      for (auto& id : path_ids_) id = unrank[id];
    }
    std::vector<std::uint32_t> path_nodes{0};  // path_nodes[d] = node at depth d of the previous stack
    const std::uint32_t* prev = nullptr;
    std::size_t prev_len = 0;
    for (std::uint32_t idx : order) {
      const pending& p = pending_[idx];
      const std::uint32_t* ids = path_ids_.data() + p.offset;
      std::size_t common = 0;
      while (common < p.length && common < prev_len && ids[common] == prev[common]) ++common;
      path_nodes.resize(common + 1);
      for (std::size_t d = common; d < p.length; ++d) path_nodes.push_back(new_child(path_nodes[d], ids[d]));
      for (std::size_t d = 0; d <= p.length; ++d) {  // sums saturate: counts from files can be huge
        flame_node& n = nodes_[path_nodes[d]];
        add_saturating(n.before, p.before);
        add_saturating(n.after, p.after);
        add_saturating(n.width, p.width);
      }
      flame_node& leaf = nodes_[path_nodes[p.length]];
      add_saturating(leaf.self_before, p.before);
      add_saturating(leaf.self_after, p.after);
      prev = ids;
      prev_len = p.length;
    }
    pending_.clear();
    path_ids_.clear();
  }

  const std::vector<std::string>& names() const { return names_; }
  const std::vector<flame_node>& nodes() const { return nodes_; }
  std::uint64_t total_width() const { return nodes_[0].width; }

  // Places every frame at least `min_width` wide (sample units); the narrower children of a node
  // are merged into one aggregate frame placed after its other children, kept if it is itself at
  // least `min_width` wide. Siblings keep the order build() gave them.
  std::vector<laid_frame> layout(double min_width) const {
    std::vector<laid_frame> out;
    laid_frame root;
    root.node = 0;
    fill_values(root, nodes_[0]);
    root.width = nodes_[0].width;
    out.push_back(root);
    std::vector<std::uint32_t> stack{0};  // indices into `out` whose children are still to place
    while (!stack.empty()) {
      const std::uint32_t parent_laid = stack.back();
      stack.pop_back();
      const std::uint32_t depth = out[parent_laid].depth + 1;
      std::uint64_t x = out[parent_laid].x;
      laid_frame agg;
      agg.parent = parent_laid;
      agg.depth = depth;
      const std::size_t first_new = out.size();
      for (auto c = nodes_[out[parent_laid].node].first_child; c != no_node; c = nodes_[c].next_sibling) {
        const flame_node& n = nodes_[c];
        if (n.width == 0 && n.before == 0 && n.after == 0) continue;
        if (n.width == 0 || static_cast<double>(n.width) < min_width) {
          add_saturating(agg.width, n.width);
          add_saturating(agg.before, n.before);
          add_saturating(agg.after, n.after);
          ++agg.elided;
          continue;
        }
        laid_frame f;
        f.node = c;
        f.parent = parent_laid;
        f.depth = depth;
        f.x = x;
        f.width = n.width;
        fill_values(f, n);
        x += n.width;
        out.push_back(f);
      }
      if (agg.elided > 0 && agg.width > 0 && static_cast<double>(agg.width) >= min_width) {
        agg.x = x;
        out.push_back(agg);
      }
      for (std::size_t i = out.size(); i-- > first_new;)
        if (out[i].node != no_node) stack.push_back(static_cast<std::uint32_t>(i));
    }
    return out;
  }

 private:
  struct pending {
    std::size_t offset = 0, length = 0;
    std::uint64_t before = 0, after = 0, width = 0;
  };

  // Orders queued stacks by their paths (ranks of names), equal paths by queue order (a stable sort).
  static bool path_less(const void* tree, std::uint32_t a, std::uint32_t b) {
    const flame_tree& t = *static_cast<const flame_tree*>(tree);
    const pending& x = t.pending_[a];
    const pending& y = t.pending_[b];
    const std::uint32_t* p = t.path_ids_.data();
    const std::size_t n = x.length < y.length ? x.length : y.length;
    for (std::size_t i = 0; i < n; ++i)
      if (p[x.offset + i] != p[y.offset + i]) return p[x.offset + i] < p[y.offset + i];
    if (x.length != y.length) return x.length < y.length;
    return a < b;
  }

  static void fill_values(laid_frame& f, const flame_node& n) {
    f.before = n.before;
    f.after = n.after;
    f.self_before = n.self_before;
    f.self_after = n.self_after;
  }

  std::uint32_t new_child(std::uint32_t parent, std::uint32_t name) {
    auto id = static_cast<std::uint32_t>(nodes_.size());
    flame_node n;
    n.name = name;
    n.parent = parent;
    nodes_.push_back(n);
    flame_node& p = nodes_[parent];
    if (p.last_child == no_node)
      p.first_child = id;
    else
      nodes_[p.last_child].next_sibling = id;
    p.last_child = id;
    return id;
  }

  std::vector<std::string> names_;
  std::unordered_map<std::string, std::size_t> name_ids_;  // the writers' one string-keyed map type
  std::vector<flame_node> nodes_;
  std::vector<pending> pending_;
  std::vector<std::uint32_t> path_ids_;
};

// Options that shape the tree (not its drawing).
struct flame_build_options {
  bool reverse = false;      // leaf becomes the root: merge from the leaf end
  bool flamechart = false;   // keep the profile's stack order; only adjacent identical prefixes merge
  bool mark_wakers = false;  // chain palette: frames after a `--` frame get `_[w]`
};

// Adds every stack of `p` to `tree` with the given channel (0: before, 1: after, 2: both).
// `width_of` maps (before, after) of one stack to its layout width.
template <class WidthOf>
void add_profile(flame_tree& tree, const profile& p, int channel, const flame_build_options& o,
                 WidthOf width_of) {
  std::vector<std::uint32_t> frame_ids(p.frames.size(), no_node);
  std::vector<std::uint32_t> path;
  for (const stack& s : p.stacks) {
    if (s.count == 0) continue;
    path.clear();
    bool after_separator = false;
    for (std::uint32_t fi : s.frames) {
      if (fi >= p.frames.size()) continue;  // a bad index names nothing: skip the frame, keep the stack
      std::uint32_t id;
      if (o.mark_wakers && after_separator && p.frames[fi].name != "--") {
        std::string n = annotated_frame_name(p.frames[fi]);
        if (annotation_of(n) == 0) n += "_[w]";
        id = tree.intern(std::move(n));
      } else {
        if (frame_ids[fi] == no_node) frame_ids[fi] = tree.intern(annotated_frame_name(p.frames[fi]));
        id = frame_ids[fi];
      }
      if (o.mark_wakers && p.frames[fi].name == "--") after_separator = true;
      path.push_back(id);
    }
    if (o.reverse) std::reverse(path.begin(), path.end());
    std::uint64_t before = channel == 1 ? 0 : s.count;
    std::uint64_t after = channel == 0 ? 0 : s.count;
    tree.add(path.data(), path.size(), before, after, width_of(before, after));
  }
  tree.build(!o.flamechart);
}

}  // namespace detail
}  // namespace selfprof
// ---- end selfprof/output/flame_tree.hpp ----
// ---- begin selfprof/output/palette.hpp ----
// Flame-graph colours: flamegraph.pl's hue formulas and multi palettes, stable name hashes, palette.map
// files.
// Context: any thread (pure functions; used by the SVG writers on the dump path).

#include <cstdint>
#include <cstdio>
#include <map>
#include <string>
#include <string_view>

namespace selfprof {

// Palettes of flamegraph.pl (`--colors`) plus inferno's python and rust.
enum class palette : std::uint8_t {
  hot,
  mem,
  io,
  red,
  green,
  blue,
  aqua,
  yellow,
  purple,
  orange,  // single hues
  java,
  js,
  perl,
  python,
  rust,
  wakeup,
  chain,  // pick a hue per frame
};

// How the per-name values v1..v3 in [0,1) are derived.
enum class color_hash : std::uint8_t {
  stable,     // FNV-1a of the name (default): the same name has the same colour in every graph
  perl_hash,  // flamegraph.pl --hash: weighted hash of the first characters (similar names, similar colours)
};

// Name -> "rgb(r,g,b)" mapping, the content of flamegraph.pl's palette.map (`--cp`).
using palette_map = std::map<std::string, std::string>;

namespace detail {

struct rgb {
  int r = 0, g = 0, b = 0;
};

inline std::string rgb_string(rgb c) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "rgb(%d,%d,%d)", c.r, c.g, c.b);
  return buf;
}

// Parses a palette name; false (and `out` untouched) when unknown.
inline bool parse_palette(std::string_view name, palette& out) {
  static const struct {
    const char* name;
    palette p;
  } table[] = {
      {"hot", palette::hot},       {"mem", palette::mem},       {"io", palette::io},
      {"red", palette::red},       {"green", palette::green},   {"blue", palette::blue},
      {"aqua", palette::aqua},     {"yellow", palette::yellow}, {"purple", palette::purple},
      {"orange", palette::orange}, {"java", palette::java},     {"js", palette::js},
      {"perl", palette::perl},     {"python", palette::python}, {"rust", palette::rust},
      {"wakeup", palette::wakeup}, {"chain", palette::chain},
  };
  for (const auto& e : table)
    if (name == e.name) {
      out = e.p;
      return true;
    }
  return false;
}

// flamegraph.pl's namehash: the module part up to the first backtick is dropped, then up to three
// characters are weighted 1, 0.7, 0.49 (mod 10, 11, 12). Works on bytes, as Perl does for ASCII.
inline double perl_namehash(std::string_view name) {
  auto tick = name.find('`');
  if (tick != std::string_view::npos && tick >= 1) name.remove_prefix(tick + 1);
  double vector = 0, weight = 1, max = 1;
  int mod = 10;
  for (unsigned char c : name) {
    int i = c % mod;
    vector += (static_cast<double>(i) / (mod - 1)) * weight;
    ++mod;
    max += weight;
    weight *= 0.70;
    if (mod > 12) break;
  }
  return 1 - vector / max;
}

inline std::uint64_t fnv1a64(std::string_view s) {
  std::uint64_t h = 0xcbf29ce484222325ULL;
  for (unsigned char c : s) {
    h ^= c;
    h *= 0x100000001b3ULL;
  }
  return h;
}

struct hash_values {
  double v1 = 0, v2 = 0, v3 = 0;
};

inline double unit_from_bits(std::uint64_t h) {
  return static_cast<double>(h >> 11) / 9007199254740992.0;  // top 53 bits / 2^53: [0,1)
}

inline hash_values name_values(std::string_view name, color_hash how) {
  hash_values v;
  if (how == color_hash::perl_hash) {
    v.v1 = perl_namehash(name);
    std::string rev(name.rbegin(), name.rend());
    v.v2 = v.v3 = perl_namehash(rev);
    return v;
  }
  // One value for all three, as flamegraph.pl's default (seeded rand) gives: the classic red-to-yellow look.
  v.v1 = v.v2 = v.v3 = unit_from_bits(fnv1a64(name) * 0x9e3779b97f4a7c15ULL);
  return v;
}

inline bool ends_with(std::string_view s, std::string_view suffix) {
  return s.size() >= suffix.size() && s.substr(s.size() - suffix.size()) == suffix;
}
inline bool contains(std::string_view s, std::string_view part) {
  return s.find(part) != std::string_view::npos;
}

// java palette rule `^L?(java|javax|jdk|net|org|com|io|sun)/`.
inline bool java_package_prefix(std::string_view n) {
  if (!n.empty() && n[0] == 'L') {
    std::string_view rest = n.substr(1);
    if (java_package_prefix(rest)) return true;
  }
  static const char* const pkgs[] = {"java/", "javax/", "jdk/", "net/", "org/", "com/", "io/", "sun/"};
  for (const char* p : pkgs)
    if (n.substr(0, std::char_traits<char>::length(p)) == p) return true;
  return false;
}

// The hue a multi palette gives a (still annotated) name, as flamegraph.pl and inferno decide it.
inline palette resolve_hue(palette p, std::string_view n) {
  // Wall profiles: where a thread waited is drawn in the io palette's blue amid the hot on-CPU frames.
  if (p == palette::hot && (n.rfind("[blocked", 0) == 0 || n == "[off-cpu]")) return palette::io;
  switch (p) {
    case palette::java:
      if (ends_with(n, "_[j]")) return palette::green;
      if (ends_with(n, "_[i]")) return palette::aqua;
      if (java_package_prefix(n)) return palette::green;
      if (contains(n, ":::")) return palette::green;
      if (contains(n, "::")) return palette::yellow;
      if (ends_with(n, "_[k]")) return palette::orange;
      return palette::red;
    case palette::perl:
      if (contains(n, "::")) return palette::yellow;
      if (contains(n, "Perl") || contains(n, ".pl")) return palette::green;
      if (ends_with(n, "_[k]")) return palette::orange;
      return palette::red;
    case palette::js: {
      if (ends_with(n, "_[j]")) return contains(n, "/") ? palette::green : palette::aqua;
      if (contains(n, "::")) return palette::yellow;
      auto slash = n.find('/');
      if (slash != std::string_view::npos && n.find(".js", slash + 1) != std::string_view::npos)
        return palette::green;
      if (contains(n, ":")) return palette::aqua;
      if (n == " ") return palette::green;
      if (contains(n, "_[k]")) return palette::orange;
      return palette::red;
    }
    case palette::python: {
      if (ends_with(n, "_[k]")) return palette::orange;
      if (contains(n, "site-packages")) return palette::aqua;
      if (contains(n, "<built-in") || contains(n, "<method") || contains(n, "<frozen"))
        return palette::yellow;
      auto py = n.find("python");
      if (py != std::string_view::npos && py + 6 < n.size() && n[py + 6] >= '0' && n[py + 6] <= '9')
        return palette::yellow;
      return palette::red;
    }
    case palette::rust: {
      if (ends_with(n, "_[k]")) return palette::orange;
      std::string_view s = n;
      if (!s.empty() && s[0] == '<') s.remove_prefix(1);
      if (s.rfind("core::", 0) == 0 || s.rfind("std::", 0) == 0 || s.rfind("alloc::", 0) == 0)
        return palette::orange;
      if (contains(n, "::")) return palette::aqua;
      return palette::yellow;
    }
    case palette::wakeup:
      return palette::aqua;
    case palette::chain:
      return contains(n, "_[w]") ? palette::aqua : palette::blue;
    default:
      return p;
  }
}

// flamegraph.pl's hue formulas (each term truncated to an integer).
inline rgb hue_color(palette hue, const hash_values& v) {
  auto t = [](double k, double x) { return static_cast<int>(k * x); };
  switch (hue) {
    case palette::hot:
      return {205 + t(50, v.v3), t(230, v.v1), t(55, v.v2)};
    case palette::mem:
      return {0, 190 + t(50, v.v2), t(210, v.v1)};
    case palette::io: {
      int r = 80 + t(60, v.v1);
      return {r, r, 190 + t(55, v.v2)};
    }
    case palette::red: {
      int x = 50 + t(80, v.v1);
      return {200 + t(55, v.v1), x, x};
    }
    case palette::green: {
      int x = 50 + t(60, v.v1);
      return {x, 200 + t(55, v.v1), x};
    }
    case palette::blue: {
      int x = 80 + t(60, v.v1);
      return {x, x, 205 + t(50, v.v1)};
    }
    case palette::yellow: {
      int x = 175 + t(55, v.v1);
      return {x, x, 50 + t(20, v.v1)};
    }
    case palette::purple: {
      int x = 190 + t(65, v.v1);
      return {x, 80 + t(60, v.v1), x};
    }
    case palette::aqua:
      return {50 + t(60, v.v1), 165 + t(55, v.v1), 165 + t(55, v.v1)};
    case palette::orange:
      return {190 + t(65, v.v1), 90 + t(65, v.v1), 0};
    default:
      return {0, 0, 0};
  }
}

// Colour of one frame. `annotated_name` keeps its `_[k]`-style suffix: palettes look at it.
// `-` and `--` separator frames are grey, as in flamegraph.pl.
inline rgb frame_color(palette p, color_hash how, std::string_view annotated_name) {
  if (annotated_name == "--") return {160, 160, 160};
  if (annotated_name == "-") return {200, 200, 200};
  return hue_color(resolve_hue(p, annotated_name), name_values(annotated_name, how));
}

// Differential colour (flamegraph.pl's color_scale): red grows, blue shrinks, white unchanged.
inline rgb diff_color(std::int64_t delta, std::int64_t max_delta, bool negate) {
  if (negate) delta = -delta;
  if (max_delta < 1) max_delta = 1;
  rgb c{255, 255, 255};
  if (delta > 0) {
    if (delta > max_delta) delta = max_delta;
    c.g = c.b = static_cast<int>(210 * (max_delta - delta) / max_delta);
  } else if (delta < 0) {
    if (-delta > max_delta) delta = -max_delta;
    c.r = c.g = static_cast<int>(210 * (max_delta + delta) / max_delta);
  }
  return c;
}

// Background gradient stops (#background) for `--bgcolors` or the palette's default.
struct background {
  std::string top, bottom;
};

// `name` is yellow, blue, green, grey, #rrggbb (flat), or empty for the palette's default.
// Returns false for anything else (the default is then used).
inline bool resolve_background(std::string_view name, palette p, background& out) {
  if (name.empty()) {
    if (p == palette::mem)
      name = "green";
    else if (p == palette::io || p == palette::wakeup || p == palette::chain)
      name = "blue";
    else if (p == palette::red || p == palette::green || p == palette::blue || p == palette::aqua ||
             p == palette::yellow || p == palette::purple || p == palette::orange)
      name = "grey";
    else
      name = "yellow";
  }
  if (name == "yellow")
    out = {"#eeeeee", "#eeeeb0"};
  else if (name == "blue")
    out = {"#eeeeee", "#e0e0ff"};
  else if (name == "green")
    out = {"#eef2ee", "#e0ffe0"};
  else if (name == "grey")
    out = {"#f8f8f8", "#e8e8e8"};
  else if (name.size() == 7 && name[0] == '#' &&
           name.find_first_not_of("0123456789abcdefABCDEF", 1) == std::string_view::npos)
    out = {std::string(name), std::string(name)};
  else {
    resolve_background("", p, out);
    return false;
  }
  return true;
}

inline bool is_hex_color(std::string_view s) {
  return s.size() == 7 && s[0] == '#' &&
         s.find_first_not_of("0123456789abcdefABCDEF", 1) == std::string_view::npos;
}

// Parses palette.map text (`name->rgb(r,g,b)` per line). Lines without `->` are skipped.
inline palette_map parse_palette_map(std::string_view text) {
  palette_map m;
  while (!text.empty()) {
    auto nl = text.find('\n');
    std::string_view line = text.substr(0, nl);
    text = nl == std::string_view::npos ? std::string_view() : text.substr(nl + 1);
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    auto arrow = line.find("->");
    if (arrow == std::string_view::npos) continue;
    m[std::string(line.substr(0, arrow))] = std::string(line.substr(arrow + 2));
  }
  return m;
}

// palette.map text, sorted by name (flamegraph.pl writes it the same way).
inline std::string format_palette_map(const palette_map& m) {
  std::string out;
  for (const auto& kv : m) {
    out += kv.first;
    out += "->";
    out += kv.second;
    out += '\n';
  }
  return out;
}

}  // namespace detail
}  // namespace selfprof
// ---- end selfprof/output/palette.hpp ----
// ---- begin selfprof/output/svg_frames.hpp ----
// The pieces of an SVG flame graph frame: the geometry, each frame's tooltip and fill colour, the
// footer line that says what was sampled, and the diff data a frame carries.
// Context: any thread except the signal handler (a pure function of the laid-out frames).

#include <cstdint>
#include <ctime>
#include <string>
#include <string_view>
#include <vector>

// ---- begin selfprof/output/svg_options.hpp ----
// The options of the SVG flame graph writer (flamegraph.pl's, with their defaults) and the parser of
// its --minwidth value.
// Context: any thread except the signal handler.

#include <cstdint>
#include <string>
#include <string_view>


namespace selfprof {

// How the flame graph is drawn. Defaults follow flamegraph.pl, except the width (fluid) and the
// colours (stable per name without flags).
struct svg_options {
  std::string title;  // empty: "Flame Graph", "Icicle Graph" or "Flame Chart"
  std::string subtitle;
  int width = 1200;       // px; the initial width when fluid
  bool fluid = true;      // the picture follows the window width (fixed at `width` when false)
  int frame_height = 16;  // row pitch in px (the rect is one less)
  double font_size = 12;
  double font_width = 0.59;  // average glyph width as a fraction of font_size (label truncation)
  std::string font = "Verdana,DejaVu Sans,sans-serif";
  double min_width = 0.1;          // frames narrower are merged into one aggregate frame per parent
  bool min_width_percent = false;  // min_width is a % of the total instead of px
  std::string count_name = "samples";
  std::string name_type = "Function:";
  bool inverted = false;    // icicle: root at the top
  bool reverse = false;     // merge from the leaf end (leaf becomes the root)
  bool flamechart = false;  // x is time: keep the profile's stack order, merge only adjacent stacks
  palette colors = palette::hot;
  color_hash hash = color_hash::stable;
  std::string bg_colors;                      // yellow|blue|green|grey|#rrggbb; empty: by palette
  palette_map* consistent_palette = nullptr;  // --cp: names found here keep their colour, new names are added
  std::string search_color = "#e600e6";
  std::string stroke_color;  // #rrggbb outline on every frame; empty: none
  std::string ui_color = "#000000";
  bool truncate_text_left = false;  // labels keep the end of long names ("..tail")
  std::uint64_t total = 0;          // 100% width when larger than the real total (same scale across graphs)
  std::string notes;                // goes into a <!-- NOTES: --> comment
  bool footer = true;               // sampling metadata line at the bottom
  bool javascript = true;           // false: static picture (smaller; for golden files)
};

// Parses flamegraph.pl's --minwidth value: "N" (px) or "N%".
inline status parse_min_width(std::string_view text, svg_options& o) {
  bool pct = !text.empty() && text.back() == '%';
  std::string_view num = pct ? text.substr(0, text.size() - 1) : text;
  if (num.empty() || num.find_first_not_of("0123456789.") != std::string_view::npos ||
      num.find('.') != num.rfind('.'))
    return status::error("minwidth: '" + std::string(text) +
                         "' is not a number of px or a percentage like 0.5%");
  o.min_width = std::stod(std::string(num));
  o.min_width_percent = pct;
  return status::ok();
}

}  // namespace selfprof
// ---- end selfprof/output/svg_options.hpp ----
// ---- begin selfprof/output/svg_text.hpp ----
// Text helpers for the SVG writers: UTF-8 sanitizing, XML and JS escaping, number formatting, label
// truncation.
// Context: any thread (pure functions).

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <string>
#include <string_view>


namespace selfprof {
namespace detail {

inline void append_replacement_char(std::string& out) { out += "\xEF\xBF\xBD"; }

// Copies `in` as valid UTF-8 holding only characters legal in XML 1.0 text: invalid sequences,
// surrogates, U+FFFE/U+FFFF and control characters (tab, LF and CR included: names are one line)
// become U+FFFD.
inline std::string sanitize_utf8(std::string_view in) {
  std::string out;
  out.reserve(in.size());
  std::size_t i = 0, n = in.size();
  while (i < n) {
    unsigned char c = static_cast<unsigned char>(in[i]);
    if (c < 0x80) {
      if (c < 0x20 || c == 0x7f)
        append_replacement_char(out);
      else
        out += static_cast<char>(c);
      ++i;
      continue;
    }
    std::uint32_t cp = 0;
    const std::size_t len = utf8_decode(in, i, cp);
    // Valid UTF-8 that XML still refuses: U+FFFE, U+FFFF and the C1 controls.
    const bool ok = len != 0 && !(cp == 0xFFFE || cp == 0xFFFF || (cp >= 0x80 && cp <= 0x9F));
    if (!ok) {
      append_replacement_char(out);
      ++i;  // resynchronise on the next byte
      continue;
    }
    out.append(in.data() + i, len);
    i += len;
  }
  return out;
}

// Escapes for XML text and attribute values (input must already be sanitized).
inline void append_xml_escaped(std::string& out, std::string_view s) {
  for (char c : s) {
    switch (c) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&quot;";
        break;
      default:
        out += c;
    }
  }
}

inline std::string xml_escape(std::string_view s) {
  std::string out;
  append_xml_escaped(out, sanitize_utf8(s));
  return out;
}

// A JavaScript string literal (with quotes) safe inside CDATA and <script>: <, >, & and every
// non-printable become \u escapes, so `]]>` and `</script>` can never appear.
inline std::string js_string(std::string_view raw) {
  std::string s = sanitize_utf8(raw);
  std::string out = "\"";
  for (char ch : s) {
    unsigned char c = static_cast<unsigned char>(ch);
    if (c == '"' || c == '\\' || c == '<' || c == '>' || c == '&' || c == '\'' || c < 0x20) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\u%04x", c);
      out += buf;
    } else {
      out += ch;
    }
  }
  out += '"';
  return out;
}

// 1234567 -> "1,234,567" (flamegraph.pl's tooltip style).
inline std::string with_commas(std::uint64_t v) {
  std::string digits = std::to_string(v);
  std::string out;
  for (std::size_t i = 0; i < digits.size(); ++i) {
    if (i != 0 && (digits.size() - i) % 3 == 0) out += ',';
    out += digits[i];
  }
  return out;
}

inline std::string fixed(double v, int decimals) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.*f", decimals, v);
  return buf;
}

// Appends `v` with `decimals` digits, dropping trailing zeros (and the dot): 12.5000 -> 12.5, 3.0 -> 3.
inline void append_trimmed(std::string& out, double v, int decimals) {
  char buf[64];
  int n = std::snprintf(buf, sizeof buf, "%.*f", decimals, v);
  if (n <= 0) return;
  std::string_view s(buf, static_cast<std::size_t>(n));
  if (s.find('.') != std::string_view::npos) {
    while (!s.empty() && s.back() == '0') s.remove_suffix(1);
    if (!s.empty() && s.back() == '.') s.remove_suffix(1);
  }
  if (s == "-0") s = "0";
  out.append(s.data(), s.size());
}

inline std::size_t utf8_length(std::string_view s) {
  std::size_t n = 0;
  for (char c : s)
    if ((static_cast<unsigned char>(c) & 0xC0) != 0x80) ++n;
  return n;
}

// Byte offset of the first `chars` code points of `s` (s must be valid UTF-8).
inline std::size_t utf8_prefix_bytes(std::string_view s, std::size_t chars) {
  std::size_t seen = 0;
  for (std::size_t i = 0; i < s.size(); ++i) {
    if ((static_cast<unsigned char>(s[i]) & 0xC0) != 0x80) {
      if (seen == chars) return i;
      ++seen;
    }
  }
  return s.size();
}

// flamegraph.pl's server-side label: whole name when it fits `max_chars`, else the first
// max_chars-2 characters and "..", and nothing below 3 characters. `left` keeps the end instead.
inline std::string truncate_label(std::string_view name, std::size_t max_chars, bool left) {
  if (max_chars < 3) return std::string();
  std::size_t len = utf8_length(name);
  if (len <= max_chars) return std::string(name);
  if (left) return ".." + std::string(name.substr(utf8_prefix_bytes(name, len - (max_chars - 2))));
  return std::string(name.substr(0, utf8_prefix_bytes(name, max_chars - 2))) + "..";
}

}  // namespace detail
}  // namespace selfprof
// ---- end selfprof/output/svg_text.hpp ----

namespace selfprof {
namespace detail {

// Geometry shared by the frame and chrome emitters.
struct svg_geometry {
  double width = 1200, height = 0;
  double xpad = 10, ypad1 = 0, ypad2 = 0, footer_h = 0;
  double frame_height = 16, font_size = 12;
  std::uint32_t depth_max = 0;
  bool inverted = false;

  double frame_y(std::uint32_t depth) const {
    if (inverted) return ypad1 + depth * frame_height;
    return height - ypad2 - (depth + 1) * frame_height + 1;
  }
};

inline svg_geometry make_geometry(const svg_options& o, std::uint32_t depth_max, bool footer) {
  svg_geometry g;
  g.width = o.width < 100 ? 100 : o.width;
  g.font_size = o.font_size > 0 ? o.font_size : 12;
  g.frame_height = o.frame_height < 2 ? 2 : o.frame_height;
  g.ypad1 = g.font_size * 3 + (o.subtitle.empty() ? 0 : g.font_size * 2);
  g.footer_h = footer ? g.font_size + 4 : 0;
  g.ypad2 = g.font_size * 2 + 10 + g.footer_h;
  g.depth_max = depth_max;
  g.inverted = o.inverted;
  g.height = (depth_max + 1) * g.frame_height + g.ypad1 + g.ypad2;
  return g;
}

inline std::string css_font_family(std::string_view font) {
  std::string out;
  for (char c : font) {  // no CSS or XML syntax can leak through: letters, digits and a few separators
    unsigned char u = static_cast<unsigned char>(c);
    if ((u >= 'a' && u <= 'z') || (u >= 'A' && u <= 'Z') || (u >= '0' && u <= '9') || c == ' ' || c == ',' ||
        c == '-' || c == '_' || c == '\'' || u >= 0x80)
      out += c;
  }
  out = sanitize_utf8(out);
  return out.empty() ? std::string("Verdana") : out;
}

inline std::string format_duration(double s) {
  std::string out = s >= 100 ? fixed(s, 0) : s >= 1 ? fixed(s, 2) : fixed(s * 1000, 1);
  out += s >= 1 ? " s" : " ms";
  return out;
}

// The footer line: what was sampled, how, and how much was lost.
inline std::string footer_text(const profile_info& info, std::uint64_t total, const std::string& count_name) {
  std::string s = mode_name(info.mode);
  s += " profile";
  if (info.hz > 0) {
    s += " | ";
    append_trimmed(s, info.hz, 2);
    s += " Hz";
  }
  if (info.duration_s > 0) {
    s += " | ";
    s += format_duration(info.duration_s);
  }
  std::uint64_t samples = info.samples ? info.samples : total;
  s += " | ";
  s += with_commas(samples);
  s += ' ';
  s += info.unit.empty() ? count_name : info.unit;
  s += " | ";
  s += with_commas(info.dropped);
  s += " dropped";
  if (info.truncated) {
    s += " | ";
    s += with_commas(info.truncated);
    s += " truncated";
  }
  if (!info.source.empty()) {
    s += " | source: ";
    s += info.source;
  }
  if (!info.view.empty()) {
    s += " | view: ";
    s += info.view;
  }
  if (info.start_unix_ns) {
    std::time_t t = static_cast<std::time_t>(info.start_unix_ns / 1000000000ULL);
    std::tm tm{};
    if (gmtime_r(&t, &tm)) {
      char buf[40];
      std::strftime(buf, sizeof buf, "%Y-%m-%d %H:%M:%S UTC", &tm);
      s += " | started ";
      s += buf;
    }
  }
  s += " | selfprof " SELFPROF_VERSION_STRING;
  return s;
}

// What a flame graph needs beyond the laid-out frames: diff data and labels.
struct svg_input {
  const flame_tree* tree = nullptr;
  std::vector<laid_frame> frames;
  std::uint64_t total = 0;        // 100% of the layout width (sample space)
  std::uint64_t value_total = 0;  // 100% for the tooltip percentages (the "after" total in a diff)
  std::uint64_t before_total = 0;
  bool diff = false;
  bool negate = false;
  bool inclusive_delta = false;  // colour by the inclusive change instead of the self change
  std::int64_t max_delta = 1;
  const profile_info* info = nullptr;
  std::string default_title = "Flame Graph";
};

inline std::int64_t frame_delta(const laid_frame& f, bool inclusive) {
  if (f.node == no_node || inclusive)
    return static_cast<std::int64_t>(f.after) - static_cast<std::int64_t>(f.before);
  return static_cast<std::int64_t>(f.self_after) - static_cast<std::int64_t>(f.self_before);
}

inline void append_pct(std::string& out, std::uint64_t part, std::uint64_t whole) {
  out += fixed(whole ? 100.0 * static_cast<double>(part) / static_cast<double>(whole) : 0.0, 2);
  out += '%';
}

// Tooltip text (unescaped): flamegraph.pl's first line, then selfprof's detail lines.
inline void append_tooltip(std::string& out, const svg_input& in, const laid_frame& f, std::string_view name,
                           const svg_options& o) {
  const laid_frame* parent = f.parent == no_node ? nullptr : &in.frames[f.parent];
  out += name;
  out += " (";
  out += with_commas(f.after);
  out += ' ';
  out += o.count_name;
  out += ", ";
  if (!parent)
    out += "100%";
  else
    append_pct(out, f.after, in.value_total);
  if (in.diff) {
    std::int64_t d = frame_delta(f, in.inclusive_delta);
    if (in.negate) d = -d;
    double pct = in.value_total ? 100.0 * static_cast<double>(d) / static_cast<double>(in.value_total) : 0.0;
    out += "; ";
    if (d > 0) out += '+';
    out += fixed(pct, 2);
    out += '%';
  }
  out += ')';
  if (f.node == no_node) {
    if (in.diff) {
      out += "\nbefore ";
      out += with_commas(f.before);
      out += ", after ";
      out += with_commas(f.after);
    }
    return;
  }
  if (in.diff) {
    out += "\nbefore ";
    out += with_commas(f.before);
    out += " (";
    append_pct(out, f.before, in.before_total);
    out += "), after ";
    out += with_commas(f.after);
    out += " (";
    append_pct(out, f.after, in.value_total);
    out += ")\nself before ";
    out += with_commas(f.self_before);
    out += ", after ";
    out += with_commas(f.self_after);
    return;
  }
  // Only the self count is stored (when not zero): the script derives % of total, % of parent and
  // depth from it on hover, which keeps large graphs no larger than flamegraph.pl's.
  if (f.self_after) {
    out += "\nself ";
    out += with_commas(f.self_after);
  }
}

inline std::string frame_fill(const svg_input& in, const laid_frame& f, std::string_view annotated,
                              const svg_options& o, std::vector<std::string>& cache) {
  if (in.diff) return rgb_string(diff_color(frame_delta(f, in.inclusive_delta), in.max_delta, in.negate));
  if (f.node == no_node) return "rgb(215,215,215)";
  std::uint32_t id = in.tree->nodes()[f.node].name;
  if (f.parent == no_node) return rgb_string(frame_color(o.colors, o.hash, "all"));
  std::string& c = cache[id];
  if (!c.empty()) return c;
  if (o.consistent_palette) {
    auto it = o.consistent_palette->find(std::string(annotated));
    const std::string* v = it == o.consistent_palette->end() ? nullptr : &it->second;
    if (v && v->size() < 24 && v->rfind("rgb(", 0) == 0 && v->back() == ')' &&
        v->find_first_not_of("rgb(0123456789,)") == std::string::npos) {
      c = *v;
      return c;
    }
    c = rgb_string(frame_color(o.colors, o.hash, annotated));
    (*o.consistent_palette)[std::string(annotated)] = c;
    return c;
  }
  c = rgb_string(frame_color(o.colors, o.hash, annotated));
  return c;
}

inline void append_num(std::string& out, double v, int decimals) { append_trimmed(out, v, decimals); }

}  // namespace detail
}  // namespace selfprof
// ---- end selfprof/output/svg_frames.hpp ----
// ---- begin selfprof/output/svg_script.hpp ----
// The style sheet and the script embedded in every interactive flame-graph SVG (zoom, search, URL state).
// Context: any thread (constant text).

namespace selfprof {
namespace detail {

// CSS; the writer appends the font, sizes and colours that depend on options.
constexpr const char* svg_static_css = R"SPCSS(#title{text-anchor:middle}
#subtitle{text-anchor:middle;fill:rgb(90,90,90)}
#search,#ignorecase{opacity:0.1;cursor:pointer}
#search:hover,#search.show,#ignorecase:hover,#ignorecase.show{opacity:1}
#search,#ignorecase,#matched{text-anchor:end}
#unzoom{cursor:pointer}
#footer{fill:rgb(100,100,100)}
#frames>*{cursor:pointer}
#frames rect{rx:2px;ry:2px}
#frames>*:hover>rect{stroke:black;stroke-width:0.5}
#frames>.current>rect{stroke:black;stroke-width:2}
.hide{display:none}
.parent{opacity:0.5}
)SPCSS";

// The script. Configuration (nametype, fontsize, fontwidth, xpad, inverted, searchcolor,
// fluiddrawing, truncate_text_right, frameheight) is emitted before it as `var` statements.
// Everything is found from the DOM: each frame's <rect> carries fg:x and fg:w (sample space) and
// its <title> starts with "name (N countname, P%)".
constexpr const char* svg_static_js = R"SPJS("use strict";
var svg, frames, details, searchbtn, unzoombtn, matchedtxt, icbtn, sbox, sinput;
var fr = [], total = 1, nominalwidth = 1200, fwidth = 1180, charw = 7, monospace = false;
var ignorecase = false, searchterm = "", zoomed = null, matches = [], lit = [], cur = -1;
function el(id) { return document.getElementById(id); }
function init(evt) {
  frames = el("frames");
  if (!frames) return;
  svg = frames.ownerSVGElement || document.documentElement;
  details = el("details"); searchbtn = el("search"); unzoombtn = el("unzoom");
  matchedtxt = el("matched"); icbtn = el("ignorecase");
  nominalwidth = +svg.getAttribute("width") || 1200;
  fwidth = +frames.getAttribute("width") || (nominalwidth - 2 * xpad);
  total = +frames.getAttribute("total_samples") || 1;
  var gs = frames.children, y0 = 0;
  for (var i = 0; i < gs.length; i++) {
    var g = gs[i], r = g.querySelector("rect"), tt = g.querySelector("title");
    if (!r) continue;
    var t = g.querySelector("text");
    if (!t) { t = document.createElementNS("http://www.w3.org/2000/svg", "text"); g.appendChild(t); }
    var title = tt ? tt.textContent : "", nl = title.indexOf("\n");
    var first = nl < 0 ? title : title.substring(0, nl), p = first.lastIndexOf(" (");
    var f = { g: g, r: r, t: t, title: title, name: p < 0 ? first : first.substring(0, p),
      x: +r.getAttribute("fg:x"), w: +r.getAttribute("fg:w"), y: +r.getAttribute("y"),
      fill: r.getAttribute("fill"), ox: r.getAttribute("x"), ow: r.getAttribute("width"),
      tx: t.getAttribute("x"), label: t.textContent, i: fr.length };
    if (fr.length === 0) y0 = f.y;
    f.d = Math.round(Math.abs(f.y - y0) / frameheight);
    g.setAttribute("data-i", f.i);
    fr.push(f);
  }
  measure_font();
  frames.addEventListener("mouseover", function (e) { var f = frame_of(e.target); if (f) show_details(f); });
  frames.addEventListener("mouseout", function (e) { if (frame_of(e.target)) details.textContent = " "; });
  frames.addEventListener("click", function (e) {
    var f = frame_of(e.target);
    if (!f) return;
    e.preventDefault();
    if (f.i === 0) unzoom(); else if (f !== zoomed) zoom(f);
  });
  unzoombtn.addEventListener("click", function () { unzoom(); });
  searchbtn.addEventListener("click", function () { if (searchterm) reset_search(); else open_box(); });
  icbtn.addEventListener("click", toggle_case);
  window.addEventListener("keydown", keydown);
  make_box();
  if (fluiddrawing) {
    svg.removeAttribute("width");
    svg.removeAttribute("viewBox");
    window.addEventListener("resize", relayout);
    relayout();
  }
  var q = params();
  if (q.get("ic")) { ignorecase = true; icbtn.classList.add("show"); }
  var qx = q.get("x"), qy = q.get("y");
  if (qx !== null && qy !== null) { var t0 = find_frame(qx, +qy); if (t0) zoom(t0); }
  var qs = q.get("s");
  if (qs) { sinput.value = qs; search(qs); }
}
function frame_of(n) {
  while (n && n.parentNode !== frames) n = n.parentNode;
  return n ? fr[+n.getAttribute("data-i")] : null;
}
// Completes a tooltip from what the file stores ("name (N unit, P%)" and "self S"): self %, % of parent, depth.
function enrich(f) {
  if (f.rich) return;
  f.rich = true;
  var lines = f.title.split("\n"), m = /\(([\d,]+) (.*), [\d.]+%\)$/.exec(lines[0]);
  if (!m || (lines[1] && lines[1].indexOf("self ") !== 0) || f.name.charAt(0) === "[" && / elided frames\]$/.test(f.name)) return;
  var self = lines[1] ? +lines[1].substring(5).replace(/,/g, "") : 0, i, p = null;
  for (i = 0; i < fr.length; i++) {
    var q = fr[i];
    if (q.d === f.d - 1 && q.x <= f.x && q.x + q.w >= f.x + f.w) { p = q; break; }
  }
  s = "self " + (lines[1] ? lines[1].substring(5) : "0") + " (" + (100 * self / total).toFixed(2) + "%)";
  if (p) s += ", " + (100 * f.w / p.w).toFixed(2) + "% of parent";
  s += ", depth " + f.d;
  f.title = lines[0] + "\n" + s;
  var tt = f.g.querySelector("title");
  if (tt) tt.textContent = f.title;
}
function show_details(f) {
  enrich(f);
  var s = f.title.replace(/\n/g, "; ");
  details.textContent = nametype + " " + s;
}
function params() { try { return new URLSearchParams(location.search); } catch (e) { return new URLSearchParams(""); } }
function set_params(upd) {
  try {
    var p = params();
    for (var k in upd) { if (upd[k] === null) p.delete(k); else p.set(k, upd[k]); }
    var s = p.toString();
    history.replaceState(null, "", location.pathname + (s ? "?" + s : "") + location.hash);
  } catch (e) { }
}
// x is fg:x (sample offset, selfprof and inferno) or flamegraph.pl's pixel x ("123.4").
function find_frame(x, y) {
  var i, f, best = null, bd = Infinity;
  for (i = 0; i < fr.length; i++) { f = fr[i]; if (f.y === y && String(f.x) === x) return f; }
  var px = parseFloat(x);
  if (isNaN(px)) return null;
  var sx = (px - xpad) / (nominalwidth - 2 * xpad) * total, tol = total / (nominalwidth - 2 * xpad);
  for (i = 0; i < fr.length; i++) {
    f = fr[i];
    if (f.y !== y) continue;
    var d = Math.abs(f.x - sx);
    if (d <= tol && d < bd) { bd = d; best = f; }
  }
  return best;
}
function measure_font() {
  var t = document.createElementNS("http://www.w3.org/2000/svg", "text");
  t.setAttribute("x", 0); t.setAttribute("y", -100);
  svg.appendChild(t);
  try {
    t.textContent = "iiiiiiiiii"; var a = t.getComputedTextLength();
    t.textContent = "WWWWWWWWWW"; var b = t.getComputedTextLength();
    if (a > 0 && Math.abs(a - b) < 0.01) { monospace = true; charw = a / 10; }
    else charw = fontsize * fontwidth;
  } catch (e) { charw = fontsize * fontwidth; }
  svg.removeChild(t);
}
function relayout() {
  var W = svg.getBoundingClientRect().width || nominalwidth;
  fwidth = Math.max(W - 2 * xpad, 10);
  frames.setAttribute("width", fwidth);
  searchbtn.setAttribute("x", W - xpad - 24);
  icbtn.setAttribute("x", W - xpad);
  matchedtxt.setAttribute("x", W - xpad);
  var fo = el("searchbox");
  if (fo) fo.setAttribute("x", W - xpad - 24 - 70 - 230);
  var bg = el("background_rect");
  if (bg) bg.setAttribute("width", W);
  for (var i = 0; i < fr.length; i++) {
    var f = fr[i];
    if (f.g.classList.contains("hide")) continue;
    var pct = parseFloat(f.r.getAttribute("x")), wp = parseFloat(f.r.getAttribute("width"));
    place_text(f, pct, wp);
  }
}
// Label for a frame drawn at x% with width w% of the frames area.
function place_text(f, xpct, wpct) {
  var wpx = wpct / 100 * fwidth - 3, t = f.t;
  var txt = f.i === 0 ? "all" : f.name;
  if (wpx < 2 * charw) { if (t.textContent !== "") t.textContent = ""; return; }
  t.setAttribute("x", (xpct + 300 / fwidth).toFixed(4) + "%");
  if (!t.getAttribute("y")) t.setAttribute("y", (f.y + (frameheight - 1) / 2 + 3).toFixed(1));
  var n = Math.floor(wpx / charw), s = txt;
  if (txt.length > n) s = cut(txt, n);
  t.textContent = s;
  if (monospace || s.length < 3) return;
  try {
    while (s.length >= 3 && t.getComputedTextLength() > wpx) {
      n = s === txt ? txt.length - 1 : n - 1;
      s = n >= 3 ? cut(txt, n) : "";
      t.textContent = s;
    }
  } catch (e) { }
}
function cut(txt, n) {
  if (n < 3) return "";
  return truncate_text_right ? txt.substring(0, n - 2) + ".." : ".." + txt.substring(txt.length - (n - 2));
}
function zoom(t) {
  zoomed = t;
  unzoombtn.classList.remove("hide");
  for (var i = 0; i < fr.length; i++) {
    var f = fr[i], g = f.g, cl = g.classList;
    if (f === t || (f.d < t.d && f.x <= t.x && f.x + f.w >= t.x + t.w)) {
      cl.remove("hide");
      if (f === t) cl.remove("parent"); else cl.add("parent");
      set_geom(f, 0, 100);
    } else if (f.d > t.d && f.x >= t.x && f.x + f.w <= t.x + t.w) {
      cl.remove("hide"); cl.remove("parent");
      set_geom(f, (f.x - t.x) / t.w * 100, f.w / t.w * 100);
    } else {
      cl.add("hide"); cl.remove("parent");
    }
  }
  set_params({ x: String(t.x), y: String(t.y) });
  rerun_search();
}
function set_geom(f, xp, wp) {
  f.r.setAttribute("x", xp.toFixed(4) + "%");
  f.r.setAttribute("width", wp.toFixed(4) + "%");
  place_text(f, xp, wp);
}
function unzoom() {
  zoomed = null;
  unzoombtn.classList.add("hide");
  for (var i = 0; i < fr.length; i++) {
    var f = fr[i], cl = f.g.classList;
    cl.remove("hide"); cl.remove("parent");
    f.r.setAttribute("x", f.ox); f.r.setAttribute("width", f.ow);
    if (fluiddrawing) place_text(f, parseFloat(f.ox), parseFloat(f.ow));
    else { if (f.tx !== null) f.t.setAttribute("x", f.tx); f.t.textContent = f.label; }
  }
  set_params({ x: null, y: null });
  rerun_search();
}
function make_box() {
  var ns = "http://www.w3.org/2000/svg", xh = "http://www.w3.org/1999/xhtml";
  sbox = document.createElementNS(ns, "foreignObject");
  sbox.setAttribute("id", "searchbox");
  sbox.setAttribute("class", "hide");
  sbox.setAttribute("x", +searchbtn.getAttribute("x") - 70 - 230);
  sbox.setAttribute("y", +searchbtn.getAttribute("y") - fontsize - 4);
  sbox.setAttribute("width", 230); sbox.setAttribute("height", fontsize + 10);
  sinput = document.createElementNS(xh, "input");
  sinput.setAttribute("type", "text");
  sinput.setAttribute("placeholder", "regex; Enter next, Esc close");
  sinput.setAttribute("style", "width:220px;font-size:" + fontsize + "px;padding:1px 3px;box-sizing:border-box;height:" + (fontsize + 8) + "px");
  sinput.addEventListener("input", function () { search(sinput.value); });
  sbox.appendChild(sinput);
  svg.appendChild(sbox);
}
function open_box() { sbox.classList.remove("hide"); sinput.focus(); sinput.select(); }
function close_box() { sbox.classList.add("hide"); sinput.blur(); }
function toggle_case() {
  ignorecase = !ignorecase;
  if (ignorecase) icbtn.classList.add("show"); else icbtn.classList.remove("show");
  set_params({ ic: ignorecase ? "1" : null });
  rerun_search();
}
function keydown(e) {
  var inbox = document.activeElement === sinput;
  var k = e.key;
  if (((e.ctrlKey || e.metaKey) && (k === "f" || k === "F")) || k === "F3" || (!inbox && k === "/")) {
    e.preventDefault(); open_box(); return;
  }
  if (e.ctrlKey && (k === "i" || k === "I")) { e.preventDefault(); toggle_case(); return; }
  if (k === "Escape") {
    if (inbox || !sbox.classList.contains("hide")) close_box();
    else if (zoomed) unzoom();
    else if (searchterm) reset_search();
    return;
  }
  if (inbox) { if (k === "Enter") { e.preventDefault(); step(e.shiftKey ? -1 : 1); } return; }
  if (k === "n") step(1); else if (k === "N") step(-1);
}
function rerun_search() { if (searchterm) search(searchterm); }
function reset_search() {
  clear_marks();
  searchterm = ""; matches = []; cur = -1;
  sinput.value = "";
  matchedtxt.textContent = " ";
  searchbtn.textContent = "Search";
  searchbtn.classList.remove("show");
  set_params({ s: null });
}
function clear_marks() {
  for (var i = 0; i < lit.length; i++) { lit[i].r.setAttribute("fill", lit[i].fill); lit[i].g.classList.remove("current"); }
  lit = [];
}
// Regex over frame names only. Matched % unites nested matches and counts only what the current zoom shows.
function search(term) {
  clear_marks();
  matches = []; cur = -1;
  if (!term) { reset_search(); return; }
  var re;
  try { re = new RegExp(term, ignorecase ? "i" : ""); }
  catch (e) { searchterm = ""; matchedtxt.textContent = "Bad regex"; return; }
  searchterm = term;
  for (var i = 0; i < fr.length; i++) {
    var f = fr[i], cl = f.g.classList;
    if (cl.contains("hide") || !re.test(f.name)) continue;
    f.r.setAttribute("fill", searchcolor);
    lit.push(f);
    if (!cl.contains("parent")) matches.push(f);
  }
  matches.sort(function (a, b) { return a.x - b.x || a.d - b.d; });
  var end = -1, sum = 0;
  for (i = 0; i < matches.length; i++) {
    var m = matches[i];
    if (m.x >= end) { sum += m.w; end = m.x + m.w; }
  }
  var view = zoomed ? zoomed.w : total;
  var txt = "Matched: " + pct(100 * sum / view);
  if (zoomed) txt += " of view, " + pct(100 * sum / total) + " of all";
  txt += " (" + matches.length + (matches.length === 1 ? " frame)" : " frames)");
  matchedtxt.textContent = txt;
  matchedtxt.setAttribute("data-base", txt);
  searchbtn.textContent = "Reset Search";
  searchbtn.classList.add("show");
  set_params({ s: term });
}
function pct(v) { return v >= 100 ? "100%" : v.toFixed(1) + "%"; }
function step(dir) {
  if (!matches.length) return;
  if (cur >= 0) matches[cur].g.classList.remove("current");
  cur = (cur + dir + matches.length) % matches.length;
  var m = matches[cur];
  m.g.classList.add("current");
  show_details(m);
  matchedtxt.textContent = matchedtxt.getAttribute("data-base") + " [" + (cur + 1) + " of " + matches.length + "]";
}
)SPJS";

}  // namespace detail
}  // namespace selfprof
// ---- end selfprof/output/svg_script.hpp ----

namespace selfprof {
namespace detail {

// The whole document for laid-out frames.
inline std::string render_svg(const svg_input& in, const svg_options& o) {
  std::uint32_t depth_max = 0;
  for (const auto& f : in.frames) depth_max = f.depth > depth_max ? f.depth : depth_max;
  const svg_geometry g = make_geometry(o, depth_max, o.footer && in.info);
  const double W = g.width, H = g.height, f = g.font_size;
  const double frames_w = W - 2 * g.xpad;
  const double char_w = f * (o.font_width > 0 ? o.font_width : 0.59);
  const std::string ui = is_hex_color(o.ui_color) ? o.ui_color : std::string("#000000");

  std::string out;
  out.reserve(4096 + in.frames.size() * 200);
  out +=
      "<?xml version=\"1.0\" standalone=\"no\"?>\n"
      "<!DOCTYPE svg PUBLIC \"-//W3C//DTD SVG 1.1//EN\" "
      "\"http://www.w3.org/Graphics/SVG/1.1/DTD/svg11.dtd\">\n"
      "<svg version=\"1.1\" width=\"";
  append_num(out, W, 0);
  out += "\" height=\"";
  append_num(out, H, 0);
  out += "\"";
  if (o.javascript) out += " onload=\"init(evt)\"";
  out += " viewBox=\"0 0 ";
  append_num(out, W, 0);
  out += ' ';
  append_num(out, H, 0);
  out +=
      "\" xmlns=\"http://www.w3.org/2000/svg\" xmlns:xlink=\"http://www.w3.org/1999/xlink\""
      " xmlns:fg=\"http://github.com/jonhoo/inferno\">\n"
      "<!-- Flame graph by selfprof " SELFPROF_VERSION_STRING
      " (conventions of Brendan Gregg's flamegraph.pl and inferno). -->\n<!-- NOTES: ";
  {
    std::string notes = xml_escape(o.notes);
    for (std::size_t p; (p = notes.find("--")) != std::string::npos;)
      notes.replace(p, 2, "- ");  // no "--" in comments
    out += notes;
  }
  out += " -->\n";

  background bg;
  resolve_background(o.bg_colors, o.colors, bg);
  out += "<defs><linearGradient id=\"background\" y1=\"0\" y2=\"1\" x1=\"0\" x2=\"0\"><stop stop-color=\"";
  out += bg.top;
  out += "\" offset=\"5%\"/><stop stop-color=\"";
  out += bg.bottom;
  out += "\" offset=\"95%\"/></linearGradient></defs>\n";

  out += "<style type=\"text/css\">\ntext{font-family:";
  out += xml_escape(css_font_family(o.font));
  out += ";font-size:";
  append_num(out, f, 2);
  out += "px;fill:rgb(0,0,0)}\n#title{font-size:";
  append_num(out, f + 5, 2);
  out += "px}\n#title,#subtitle,#details,#unzoom,#search,#ignorecase,#matched{fill:";
  out += ui;
  out += "}\n#footer{font-size:";
  append_num(out, f > 3 ? f - 2 : f, 2);
  out += "px}\n";
  if (is_hex_color(o.stroke_color)) {
    out += "#frames rect{stroke:";
    out += o.stroke_color;
    out += ";stroke-width:0.5}\n";
  }
  out += svg_static_css;
  out += "</style>\n";

  if (o.javascript) {
    out += "<script type=\"text/ecmascript\"><![CDATA[\nvar nametype = ";
    out += js_string(o.name_type);
    out += ";\nvar fontsize = ";
    append_num(out, f, 2);
    out += ";\nvar fontwidth = ";
    append_num(out, o.font_width > 0 ? o.font_width : 0.59, 4);
    out += ";\nvar xpad = 10;\nvar inverted = ";
    out += o.inverted ? "true" : "false";
    out += ";\nvar searchcolor = ";
    out += js_string(is_hex_color(o.search_color) ? o.search_color : "#e600e6");
    out += ";\nvar fluiddrawing = ";
    out += o.fluid ? "true" : "false";
    out += ";\nvar truncate_text_right = ";
    out += o.truncate_text_left ? "false" : "true";
    out += ";\nvar frameheight = ";
    append_num(out, g.frame_height, 2);
    out += ";\n]]><![CDATA[\n";
    out += svg_static_js;
    out += "]]></script>\n";
  }

  std::string title = o.title.empty() ? in.default_title : o.title;
  out += "<rect id=\"background_rect\" x=\"0\" y=\"0\" width=\"";
  append_num(out, W, 0);
  out += "\" height=\"";
  append_num(out, H, 0);
  out += "\" fill=\"url(#background)\"/>\n<text id=\"title\" x=\"50%\" y=\"";
  append_num(out, f * 2, 2);
  out += "\">";
  out += xml_escape(title);
  out += "</text>\n";
  if (!o.subtitle.empty()) {
    out += "<text id=\"subtitle\" x=\"50%\" y=\"";
    append_num(out, f * 4, 2);
    out += "\">";
    out += xml_escape(o.subtitle);
    out += "</text>\n";
  }
  const double bottom_line = H - g.footer_h - (g.ypad2 - g.footer_h) / 2;
  out += "<text id=\"details\" x=\"10\" y=\"";
  append_num(out, bottom_line, 2);
  out += "\"> </text>\n<text id=\"unzoom\" class=\"hide\" x=\"10\" y=\"";
  append_num(out, f * 2, 2);
  out += "\">Reset Zoom</text>\n<text id=\"search\" x=\"";
  append_num(out, W - g.xpad - 24, 2);
  out += "\" y=\"";
  append_num(out, f * 2, 2);
  out += "\">Search</text>\n<text id=\"ignorecase\" x=\"";
  append_num(out, W - g.xpad, 2);
  out += "\" y=\"";
  append_num(out, f * 2, 2);
  out += "\">ic</text>\n<text id=\"matched\" x=\"";
  append_num(out, W - g.xpad, 2);
  out += "\" y=\"";
  append_num(out, bottom_line, 2);
  out += "\"> </text>\n";
  if (o.footer && in.info) {
    out += "<text id=\"footer\" x=\"10\" y=\"";
    append_num(out, H - 6, 2);
    out += "\">";
    out += xml_escape(footer_text(*in.info, in.value_total, o.count_name));
    out += "</text>\n";
  }

  out += "<svg id=\"frames\" x=\"10\" width=\"";
  append_num(out, frames_w, 0);
  out += "\" total_samples=\"";
  out += std::to_string(in.total);
  out += "\">\n";

  const auto& names = in.tree->names();
  std::vector<std::string> fill_cache(names.size());
  std::vector<std::string> display_cache(names.size());  // sanitized, de-annotated, unescaped
  std::string tip, agg_name;
  const double total_d = in.total ? static_cast<double>(in.total) : 1.0;
  const double text_dx = 300.0 / frames_w;  // 3 px as a % of the frames area
  for (const laid_frame& fr : in.frames) {
    std::string_view annotated;
    std::string_view display;
    if (fr.node == no_node) {
      agg_name = "[";
      agg_name += std::to_string(fr.elided);
      agg_name += " elided frames]";
      annotated = display = agg_name;
    } else if (fr.parent == no_node) {
      annotated = display = "all";
    } else {
      std::uint32_t id = in.tree->nodes()[fr.node].name;
      annotated = names[id];
      std::string& d = display_cache[id];
      if (d.empty()) d = sanitize_utf8(strip_annotation(annotated));
      display = d;
    }
    const double xp = 100.0 * static_cast<double>(fr.x) / total_d;
    const double wp = 100.0 * static_cast<double>(fr.width) / total_d;
    const double y = g.frame_y(fr.depth);
    out += "<g><title>";
    tip.clear();
    append_tooltip(tip, in, fr, display, o);
    append_xml_escaped(out, tip);
    out += "</title><rect x=\"";
    append_num(out, xp, 3);
    out += "%\" y=\"";
    append_num(out, y, 2);
    out += "\" width=\"";
    append_num(out, wp, 3);
    out += "%\" height=\"";
    append_num(out, g.frame_height - 1, 2);
    out += "\" fill=\"";
    out += frame_fill(in, fr, annotated, o, fill_cache);
    out += "\" fg:x=\"";
    out += std::to_string(fr.x);
    out += "\" fg:w=\"";
    out += std::to_string(fr.width);
    out += "\"/>";
    const double width_px = wp / 100.0 * frames_w;
    std::string label =
        truncate_label(display, static_cast<std::size_t>(width_px / char_w), o.truncate_text_left);
    if (label.empty()) {
      out += "<text></text></g>\n";
      continue;
    }
    out += "<text x=\"";
    append_num(out, xp + text_dx, 3);
    out += "%\" y=\"";
    append_num(out, y + (g.frame_height - 1) / 2 + 3, 2);
    out += "\">";
    append_xml_escaped(out, label);
    out += "</text></g>\n";
  }
  out += "</svg>\n</svg>\n";
  return out;
}

// flamegraph.pl's picture for a profile with no samples (it exits with an error; we still write a file).
inline std::string render_error_svg(const svg_options& o, std::string_view message) {
  const double W = o.width < 100 ? 100 : o.width;
  std::string out =
      "<?xml version=\"1.0\" standalone=\"no\"?>\n"
      "<!DOCTYPE svg PUBLIC \"-//W3C//DTD SVG 1.1//EN\" "
      "\"http://www.w3.org/Graphics/SVG/1.1/DTD/svg11.dtd\">\n"
      "<svg version=\"1.1\" width=\"";
  append_num(out, W, 0);
  out += "\" height=\"60\" viewBox=\"0 0 ";
  append_num(out, W, 0);
  out +=
      " 60\" xmlns=\"http://www.w3.org/2000/svg\">\n<text id=\"title\" x=\"50%\" y=\"36\" "
      "text-anchor=\"middle\" font-family=\"Verdana\" font-size=\"17\">";
  out += xml_escape(message);
  out += "</text>\n</svg>\n";
  return out;
}

inline double min_width_samples(const svg_options& o, std::uint64_t total) {
  if (o.min_width <= 0) return 0;
  if (o.min_width_percent) return static_cast<double>(total) * o.min_width / 100.0;
  double frames_w = (o.width < 100 ? 100 : o.width) - 20.0;
  return o.min_width * static_cast<double>(total) / frames_w;
}

// The SVG flame graph of a profile. Frames are merged by name; an empty profile gives a small
// error picture (as flamegraph.pl does) rather than nothing.
inline std::string write_svg(const profile& p, const svg_options& o) {
  flame_tree tree;
  flame_build_options b;
  b.reverse = o.reverse;
  b.flamechart = o.flamechart;
  b.mark_wakers = o.colors == palette::chain;
  add_profile(tree, p, 2, b, [](std::uint64_t, std::uint64_t after) { return after; });
  if (tree.total_width() == 0) return render_error_svg(o, "ERROR: No stack counts found");
  svg_input in;
  in.tree = &tree;
  in.total = tree.total_width() > o.total ? tree.total_width() : o.total;
  in.value_total = in.total;
  in.before_total = in.total;
  in.info = &p.info;
  in.default_title = o.flamechart ? "Flame Chart" : (o.inverted ? "Icicle Graph" : "Flame Graph");
  in.frames = tree.layout(min_width_samples(o, in.total));
  in.frames[0].width = in.total;  // the root spans the whole width, also with a larger `total`
  if (p.info.frame_loops.empty()) return render_svg(in, o);
  svg_options with_frames = o;  // game-frame statistics under the title
  for (const auto& l : p.info.frame_loops) {
    if (!with_frames.subtitle.empty()) with_frames.subtitle += "; ";
    with_frames.subtitle += frame_stats_line(l);
  }
  return render_svg(in, with_frames);
}

}  // namespace detail
}  // namespace selfprof
// ---- end selfprof/output/svg.hpp ----
// ---- begin selfprof/output/top.hpp ----
// The top-list writer (`.txt`): the flat ranking `perf report --no-children` prints, self and total
// per function (optionally per module too), under a header with the profile's sampling metadata.
// Context: any thread except the signal handler (a pure function of the profile).
//
// Definitions: self = samples whose leaf is the function; total = samples whose stack contains the
// function, counted once per stack even when it recurses; percentages are of all samples in the
// profile's stacks. Functions are identified by their folded name (so the kinds' `_[k]` `_[j]` `_[i]`
// show and hostile characters are made safe as in the folded output); thread-root markers are not
// functions and are skipped. Rows are sorted by self, then total (both descending), then name
// (bytewise). Numbers are formatted without the C locale's help, so the bytes never depend on it.

#include <algorithm>
#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>


namespace selfprof {

struct top_options {
  std::size_t limit = 0;   // rows per table; 0 = all
  bool by_module = false;  // add a table ranking modules the same way
};

namespace detail {

struct top_row {
  std::string name;
  std::uint64_t self = 0, total = 0;
};

// Module label of a frame for the per-module table.
inline std::string top_module_name(const frame& f) {
  if (!f.module.empty()) {
    std::string safe;
    append_folded_name(safe, f.module);
    return safe;
  }
  switch (f.kind) {
    case frame_kind::kernel:
      return "[kernel]";
    case frame_kind::jit:
      return "[jit]";
    case frame_kind::marker:
      return "[selfprof]";
    default:
      return "[unknown]";
  }
}

// The row key of a frame: its folded name, or its module with `by_module`; no frame is "[unknown]".
inline std::string top_key(const frame* f, bool by_module) {
  if (f == nullptr) return std::string(unknown_frame);
  return by_module ? top_module_name(*f) : folded_frame_name(*f);
}

// Self/total rows per function (per module with `by_module`); an index past the frame table counts as
// "[unknown]". Sorted by self, then total (both descending), then name.
inline std::vector<top_row> top_rows(const profile& p, std::uint64_t& grand_total, bool by_module) {
  std::unordered_map<std::string, std::size_t> index;
  std::vector<top_row> rows;
  std::vector<std::size_t> seen_mark;  // per row: last stack number that counted it (+1)
  auto row_for = [&](std::string key) -> std::size_t {
    auto [it, fresh] = index.try_emplace(key, rows.size());
    if (fresh) {
      rows.push_back({std::move(key), 0, 0});
      seen_mark.push_back(0);
    }
    return it->second;
  };
  grand_total = 0;
  std::size_t stack_number = 0;
  for (const auto& s : p.stacks) {
    if (s.count == 0) continue;
    ++stack_number;
    add_saturating(grand_total, s.count);
    std::size_t leaf = static_cast<std::size_t>(-1);
    for (const auto fi : s.frames) {
      const frame* f = frame_at(p, fi);
      if (f && f->kind == frame_kind::marker && is_thread_root_name(f->name)) continue;
      const std::size_t r = row_for(top_key(f, by_module));
      if (seen_mark[r] != stack_number) {
        seen_mark[r] = stack_number;
        add_saturating(rows[r].total, s.count);
      }
      leaf = r;
    }
    if (leaf == static_cast<std::size_t>(-1)) {
      leaf = row_for(std::string(unknown_frame));
      add_saturating(rows[leaf].total, s.count);
    }
    add_saturating(rows[leaf].self, s.count);
  }
  std::vector<std::uint32_t> order = identity_order(rows.size());
  sort_indices(
      order,
      [](const void* all, std::uint32_t ia, std::uint32_t ib) {
        const top_row& a = (*static_cast<const std::vector<top_row>*>(all))[ia];
        const top_row& b = (*static_cast<const std::vector<top_row>*>(all))[ib];
        if (a.self != b.self) return a.self > b.self;
        if (a.total != b.total) return a.total > b.total;
        return a.name < b.name;
      },
      &rows);
  std::vector<top_row> sorted;
  sorted.reserve(rows.size());
  for (std::uint32_t i : order) sorted.push_back(std::move(rows[i]));
  return sorted;
}

inline std::string top_percent(std::uint64_t part, std::uint64_t whole) {
  const double pct = whole ? 100.0 * static_cast<double>(part) / static_cast<double>(whole) : 0.0;
  std::string s = format_fixed(pct, 2);
  s += '%';
  return s;
}

// Appends `s` right-aligned in `width` columns.
inline void append_padded(std::string& out, std::string_view s, std::size_t width) {
  if (s.size() < width) out.append(width - s.size(), ' ');
  out += s;
}

inline void append_top_table(std::string& out, const std::vector<top_row>& rows, std::uint64_t total,
                             const char* what, std::size_t limit) {
  std::size_t width = 5;
  for (const auto& r : rows) width = std::max(width, std::to_string(r.total).size());
  append_padded(out, "self%", 7);
  out += ' ';
  append_padded(out, "total%", 7);
  out += "  ";
  append_padded(out, "self", width);
  out += "  ";
  append_padded(out, "total", width);
  out += "  ";
  out += what;
  out += '\n';
  const std::size_t shown = limit && limit < rows.size() ? limit : rows.size();
  for (std::size_t i = 0; i < shown; ++i) {
    const auto& r = rows[i];
    append_padded(out, top_percent(r.self, total), 7);
    out += ' ';
    append_padded(out, top_percent(r.total, total), 7);
    out += "  ";
    append_padded(out, std::to_string(r.self), width);
    out += "  ";
    append_padded(out, std::to_string(r.total), width);
    out += "  ";
    out += r.name;
    out += '\n';
  }
  if (shown < rows.size()) {
    out += "... ";
    out += std::to_string(rows.size() - shown);
    out += " more (limit ";
    out += std::to_string(limit);
    out += ")\n";
  }
}

}  // namespace detail

// The top list of a profile (see the definitions at the top of this file).
inline std::string write_top(const profile& p, const top_options& opts = {}) {
  std::uint64_t total = 0;
  const auto functions = detail::top_rows(p, total, false);
  const auto& info = p.info;
  std::string out =
      "# selfprof " SELFPROF_VERSION_STRING " top: self and total per function (perf report --no-children)\n";
  out += "# mode: ";
  out += mode_name(info.mode);
  out += "  unit: ";
  out += info.unit;
  out += "  source: ";
  out += info.source.empty() ? "-" : info.source;
  out += "  hz: ";
  out += detail::format_compact(info.hz);
  out += "  duration: ";
  out += detail::format_fixed(info.duration_s, 3);
  out += " s\n# samples: ";
  out += std::to_string(total);
  out += "  dropped: ";
  out += std::to_string(info.dropped);
  out += "  truncated: ";
  out += std::to_string(info.truncated);
  out += '\n';
  if (!info.view.empty()) {
    out += "# view: ";
    out += info.view;
    out += '\n';
  }
  for (const auto& loop : info.frame_loops) {
    out += "# frames: ";
    detail::append_printable(out, frame_stats_line(loop));
    out += "\n";
  }
  for (const auto& note : info.notes) {
    out += "# note: ";
    detail::append_printable(out, note);
    out += "\n";
  }
  out += "\n";
  if (total == 0) return out + "(no samples)\n";
  detail::append_top_table(out, functions, total, "function", opts.limit);
  if (opts.by_module) {
    std::uint64_t module_total = 0;
    const auto modules = detail::top_rows(p, module_total, true);
    out += "\n";
    detail::append_top_table(out, modules, module_total, "module", opts.limit);
  }
  return out;
}

}  // namespace selfprof
// ---- end selfprof/output/top.hpp ----

namespace selfprof {

enum class output_format { folded, top, pprof, svg };

// Options of every writer, for render() to pick from.
struct output_options {
  folded_options folded;
  top_options top;
  pprof_options pprof;
  svg_options svg;
};

struct format_lookup {
  output_format format = output_format::folded;
  status result;  // an error naming the path when the extension is unknown
};

inline const char* format_name(output_format f) {
  switch (f) {
    case output_format::folded:
      return "folded";
    case output_format::top:
      return "top";
    case output_format::pprof:
      return "pprof";
    case output_format::svg:
      return "svg";
  }
  return "?";
}

namespace detail {
inline bool ends_with_ci(const std::string& s, const char* suffix) {
  const std::size_t n = std::char_traits<char>::length(suffix);
  if (s.size() < n) return false;
  for (std::size_t i = 0; i < n; ++i) {
    char c = s[s.size() - n + i];
    if (c >= 'A' && c <= 'Z') c = static_cast<char>(c - 'A' + 'a');
    if (c != suffix[i]) return false;
  }
  return true;
}
}  // namespace detail

// The format a path asks for by its extension.
inline format_lookup format_for_path(const std::string& path) {
  format_lookup r;
  const auto slash = path.find_last_of('/');
  const std::string name = slash == std::string::npos ? path : path.substr(slash + 1);
  struct entry {
    const char* ext;
    output_format format;
  };
  static const entry table[] = {{".folded", output_format::folded}, {".collapsed", output_format::folded},
                                {".txt", output_format::top},       {".pb.gz", output_format::pprof},
                                {".pprof", output_format::pprof},   {".svg", output_format::svg}};
  for (const auto& e : table) {
    if (name.size() > std::char_traits<char>::length(e.ext) && detail::ends_with_ci(name, e.ext)) {
      r.format = e.format;
      return r;
    }
  }
  std::string message = "selfprof: cannot write ";
  message += path;
  message += ": unknown output format (use .folded, .collapsed, .txt, .pb.gz, .pprof or .svg)";
  r.result = status::error(std::move(message));
  return r;
}

// The bytes of a profile in a format.
inline std::string render(const profile& p, output_format f, const output_options& opts = {}) {
  switch (f) {
    case output_format::folded:
      return write_folded(p, opts.folded);
    case output_format::top:
      return write_top(p, opts.top);
    case output_format::pprof:
      return write_pprof(p, opts.pprof);
    case output_format::svg:
      return detail::write_svg(p, opts.svg);
  }
  return {};
}

// Renders `p` in the format of `path`'s extension and writes it atomically (see sink.hpp). On failure
// nothing at `path` changes and the message names the path and the reason.
inline status write_profile_file(const profile& p, const std::string& path, const output_options& opts = {},
                                 const sink_options& sink = {}) {
  const format_lookup lookup = format_for_path(path);
  if (!lookup.result) return lookup.result;
  return detail::write_file_atomic(path, render(p, lookup.format, opts), sink);
}

}  // namespace selfprof
// ---- end selfprof/output/format.hpp ----
// ---- begin selfprof/output/markers.hpp ----
// Marker frames made explicit: per-thread root frames and `[truncated]` become frames of the profile,
// so every writer (folded, SVG, top, pprof) shows the same stacks.
// Context: any thread except the signal handler.

#include <map>
#include <string>


namespace selfprof {
namespace detail {

// Synthetic frames (frame_kind::marker) added to a profile once per name: marker(name) is its index.
class marker_frames {
 public:
  explicit marker_frames(profile& p) : p_(p) {}
  std::uint32_t operator()(const std::string& name) {
    auto it = made_.find(name);
    if (it != made_.end()) return it->second;
    frame f;
    f.name = name;
    f.kind = frame_kind::marker;
    p_.frames.push_back(f);
    auto index = static_cast<std::uint32_t>(p_.frames.size() - 1);
    made_.emplace(name, index);
    return index;
  }

 private:
  profile& p_;
  std::map<std::string, std::uint32_t> made_;
};

inline void add_marker_frames(profile& p, bool thread_roots) {
  marker_frames marker(p);
  for (stack& s : p.stacks) {
    std::size_t first = 0;
    bool has_root = !s.frames.empty() && is_marker(p, s.frames[0], is_thread_root_name);
    if (has_root) first = 1;
    std::vector<std::uint32_t> head;
    if (thread_roots && !has_root) head.push_back(marker(thread_root_name(s.tid, p.thread_name(s.tid))));
    if (s.truncated && !has_truncated_marker(p, s, first))
      head.push_back(marker(std::string(truncated_marker)));
    if (head.empty()) continue;
    s.frames.insert(s.frames.begin() + static_cast<std::ptrdiff_t>(first), head.begin(), head.end());
  }
}

// The off-CPU part of a wall profile: only the stacks of time spent off the CPU, same frames and threads.
inline profile offcpu_view(const profile& wall) {
  profile p;
  p.frames = wall.frames;
  p.threads = wall.threads;
  p.info = wall.info;
  p.info.mode = profile_mode::offcpu;
  std::uint64_t total = 0, truncated = 0;
  for (const stack& s : wall.stacks) {
    if (!s.offcpu) continue;
    p.stacks.push_back(s);
    total += s.count;
    if (s.truncated) truncated += s.count;
  }
  p.info.samples = total;
  p.info.truncated = truncated;
  return p;
}

}  // namespace detail
}  // namespace selfprof
// ---- end selfprof/output/markers.hpp ----

namespace selfprof {
namespace detail {

struct dump_settings {
  std::string paths;  // comma-separated path templates
  sink_options sink;
  bool thread_roots = false;      // a root frame per thread
  double frame_budget_ms = 16.7;  // named in the slow-frames title
};

// What one dump holds: the profile and, when game frames were marked, the samples of the slow ones.
struct dump_contents {
  profile main;
  bool slow_marked = false;
  profile slow;
};

// The name of this program for titles: /proc/self/comm.
inline std::string program_name() {
  std::string comm;
  std::FILE* f = std::fopen("/proc/self/comm", "r");
  if (f) {
    char buf[64] = {0};
    if (std::fgets(buf, sizeof buf, f)) comm = buf;
    std::fclose(f);
  }
  while (!comm.empty() && (comm.back() == '\n' || comm.back() == ' ')) comm.pop_back();
  return comm;
}

// What a dump of this process writes: the SVG titled with the program's name and pid, and what the
// samples do not cover (kernel time) as its subtitle.
inline output_options dump_output_options(const profile& p) {
  output_options oo;
  const std::string comm = program_name();
  const profile_mode mode = p.info.mode;
  oo.svg.title = (mode == profile_mode::cpu    ? std::string("CPU profile of ")
                  : mode == profile_mode::wall ? std::string("Wall-clock profile of ")
                                               : std::string("Off-CPU time of ")) +
                 (comm.empty() ? std::string("this process") : comm) + " (pid " + std::to_string(::getpid()) +
                 ")";
  if (mode == profile_mode::offcpu) oo.svg.colors = palette::io;  // Gregg's off-CPU convention: blue frames
  if (!p.info.unit.empty() && p.info.unit != "samples") oo.svg.count_name = p.info.unit;
  if (!p.info.kernel_time) oo.svg.subtitle = "time spent in the kernel is not sampled (user-only ticks)";
  return oo;
}

// Writes `p` to every path of the list `paths` (templates expanded with `fields`), each in the format of
// its extension. Errors of all paths are joined; the others are still written.
inline status write_profile_paths(const profile& p, const std::string& paths, const path_fields& fields,
                                  const output_options& oo, const sink_options& sink) {
  const std::vector<std::string> list = split_paths(paths);
  if (list.empty()) return status::error("selfprof: no output path given");
  std::string errors;
  for (const std::string& tmpl : list) {
    status st = write_profile_file(p, expand_path_template(tmpl, fields), oo, sink);
    if (!st) errors += (errors.empty() ? "" : "\n") + st.message();
  }
  return errors.empty() ? status::ok() : status::error(errors);
}

// `paths` with `tag` before each path's extension.
inline std::string companion_paths(const std::string& paths, const std::string& tag) {
  std::string out;
  for (const std::string& p : split_paths(paths))
    out += (out.empty() ? "" : ",") + insert_before_extension(p, tag);
  return out;
}

// The one dump: see the top of this file. Every file is attempted even when an earlier one failed;
// the errors are joined. Nothing collected is lost either way (`c` is a copy).
inline status write_dump(dump_contents& c, const dump_settings& s) {
  if (jit_runtime_slot().load(std::memory_order_acquire) != nullptr) {
    status j = jit_global().flush();  // the perf map is complete whenever a profile is
    (void)j;                          // reported on stderr once by the runtime; the profile is still written
  }
  const path_fields fields = fields_now(next_dump_number());
  std::string errors;
  auto keep = [&](const status& st) {
    if (!st) errors += (errors.empty() ? "" : "\n") + st.message();
  };
  add_marker_frames(c.main, s.thread_roots);
  keep(write_profile_paths(c.main, s.paths, fields, dump_output_options(c.main), s.sink));
  if (c.main.info.mode == profile_mode::wall) {
    const profile off = offcpu_view(c.main);
    keep(write_profile_paths(off, companion_paths(s.paths, "-offcpu"), fields, dump_output_options(off),
                             s.sink));
  }
  if (c.slow_marked) {
    add_marker_frames(c.slow, s.thread_roots);
    output_options oo = dump_output_options(c.slow);
    oo.svg.title = "Slow frames (over " + format_compact(s.frame_budget_ms) + " ms): " + oo.svg.title;
    keep(write_profile_paths(c.slow, companion_paths(s.paths, "-slow"), fields, oo, s.sink));
  }
  return errors.empty() ? status::ok() : status::error(errors);
}

}  // namespace detail
}  // namespace selfprof
// ---- end selfprof/dump/dump.hpp ----
// ---- begin selfprof/dump/symbolize.hpp ----
// Turns the raw stack table into a profile value: addresses become frames (pc - 1 for return
// addresses), stacks become root-first frame lists.
// Context: any thread (never the signal handler); runs only when a profile is written.

#include <algorithm>
#include <cstdint>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

// ---- begin selfprof/wall/syscalls.hpp ----
// Names of the system calls a thread can block in, for the `[blocked: name]` frames of wall-clock
// profiles (the number comes from /proc/self/task/<tid>/syscall).
// Context: any thread (never the signal handler).

#include <sys/syscall.h>

#include <string>

namespace selfprof {
namespace detail {

// The name of system call `nr` on this architecture, or "syscall <nr>" for one not in the list (the
// list holds the calls that wait: I/O, locks, sleeps, process and signal waits, and their neighbours).
inline std::string syscall_name(long nr) {
  struct entry {
    long nr;
    const char* name;
  };
  static const entry
      table
          [] =
              {
#define SELFPROF_DETAIL_SYSCALL(n) {SYS_##n, #n},
#ifdef SYS_read
                  SELFPROF_DETAIL_SYSCALL(read)
#endif
#ifdef SYS_write
                      SELFPROF_DETAIL_SYSCALL(write)
#endif
#ifdef SYS_readv
                          SELFPROF_DETAIL_SYSCALL(readv)
#endif
#ifdef SYS_writev
                              SELFPROF_DETAIL_SYSCALL(writev)
#endif
#ifdef SYS_pread64
                                  SELFPROF_DETAIL_SYSCALL(pread64)
#endif
#ifdef SYS_pwrite64
                                      SELFPROF_DETAIL_SYSCALL(pwrite64)
#endif
#ifdef SYS_preadv2
                                          SELFPROF_DETAIL_SYSCALL(preadv2)
#endif
#ifdef SYS_pwritev2
                                              SELFPROF_DETAIL_SYSCALL(pwritev2)
#endif
#ifdef SYS_open
                                                  SELFPROF_DETAIL_SYSCALL(open)
#endif
#ifdef SYS_openat
                                                      SELFPROF_DETAIL_SYSCALL(openat)
#endif
#ifdef SYS_close
                                                          SELFPROF_DETAIL_SYSCALL(close)
#endif
#ifdef SYS_fsync
                                                              SELFPROF_DETAIL_SYSCALL(fsync)
#endif
#ifdef SYS_fdatasync
                                                                  SELFPROF_DETAIL_SYSCALL(fdatasync)
#endif
#ifdef SYS_sync_file_range
                                                                      SELFPROF_DETAIL_SYSCALL(sync_file_range)
#endif
#ifdef SYS_flock
                                                                          SELFPROF_DETAIL_SYSCALL(flock)
#endif
#ifdef SYS_fcntl
                                                                              SELFPROF_DETAIL_SYSCALL(fcntl)
#endif
#ifdef SYS_ioctl
                                                                                  SELFPROF_DETAIL_SYSCALL(
                                                                                      ioctl)
#endif
#ifdef SYS_futex
                                                                                      SELFPROF_DETAIL_SYSCALL(
                                                                                          futex)
#endif
#ifdef SYS_futex_waitv
                                                                                          SELFPROF_DETAIL_SYSCALL(
                                                                                              futex_waitv)
#endif
#ifdef SYS_poll
                                                                                              SELFPROF_DETAIL_SYSCALL(
                                                                                                  poll)
#endif
#ifdef SYS_ppoll
                                                                                                  SELFPROF_DETAIL_SYSCALL(
                                                                                                      ppoll)
#endif
#ifdef SYS_select
                                                                                                      SELFPROF_DETAIL_SYSCALL(
                                                                                                          select)
#endif
#ifdef SYS_pselect6
                                                                                                          SELFPROF_DETAIL_SYSCALL(
                                                                                                              pselect6)
#endif
#ifdef SYS_epoll_wait
                                                                                                              SELFPROF_DETAIL_SYSCALL(
                                                                                                                  epoll_wait)
#endif
#ifdef SYS_epoll_pwait
                                                                                                                  SELFPROF_DETAIL_SYSCALL(
                                                                                                                      epoll_pwait)
#endif
#ifdef SYS_epoll_pwait2
                                                                                                                      SELFPROF_DETAIL_SYSCALL(
                                                                                                                          epoll_pwait2)
#endif
#ifdef SYS_nanosleep
                                                                                                                          SELFPROF_DETAIL_SYSCALL(
                                                                                                                              nanosleep)
#endif
#ifdef SYS_clock_nanosleep
                                                                                                                              SELFPROF_DETAIL_SYSCALL(
                                                                                                                                  clock_nanosleep)
#endif
#ifdef SYS_pause
                                                                                                                                  SELFPROF_DETAIL_SYSCALL(
                                                                                                                                      pause)
#endif
#ifdef SYS_sched_yield
                                                                                                                                      SELFPROF_DETAIL_SYSCALL(
                                                                                                                                          sched_yield)
#endif
#ifdef SYS_accept
                                                                                                                                          SELFPROF_DETAIL_SYSCALL(
                                                                                                                                              accept)
#endif
#ifdef SYS_accept4
                                                                                                                                              SELFPROF_DETAIL_SYSCALL(
                                                                                                                                                  accept4)
#endif
#ifdef SYS_connect
                                                                                                                                                  SELFPROF_DETAIL_SYSCALL(
                                                                                                                                                      connect)
#endif
#ifdef SYS_recvfrom
                                                                                                                                                      SELFPROF_DETAIL_SYSCALL(
                                                                                                                                                          recvfrom)
#endif
#ifdef SYS_recvmsg
                                                                                                                                                          SELFPROF_DETAIL_SYSCALL(
                                                                                                                                                              recvmsg)
#endif
#ifdef SYS_recvmmsg
                                                                                                                                                              SELFPROF_DETAIL_SYSCALL(
                                                                                                                                                                  recvmmsg)
#endif
#ifdef SYS_sendto
                                                                                                                                                                  SELFPROF_DETAIL_SYSCALL(
                                                                                                                                                                      sendto)
#endif
#ifdef SYS_sendmsg
                                                                                                                                                                      SELFPROF_DETAIL_SYSCALL(
                                                                                                                                                                          sendmsg)
#endif
#ifdef SYS_sendmmsg
                                                                                                                                                                          SELFPROF_DETAIL_SYSCALL(
                                                                                                                                                                              sendmmsg)
#endif
#ifdef SYS_wait4
                                                                                                                                                                              SELFPROF_DETAIL_SYSCALL(
                                                                                                                                                                                  wait4)
#endif
#ifdef SYS_waitid
                                                                                                                                                                                  SELFPROF_DETAIL_SYSCALL(
                                                                                                                                                                                      waitid)
#endif
#ifdef SYS_rt_sigsuspend
                                                                                                                                                                                      SELFPROF_DETAIL_SYSCALL(rt_sigsuspend)
#endif
#ifdef SYS_rt_sigtimedwait
                                                                                                                                                                                          SELFPROF_DETAIL_SYSCALL(
                                                                                                                                                                                              rt_sigtimedwait)
#endif
#ifdef SYS_msgrcv
                                                                                                                                                                                              SELFPROF_DETAIL_SYSCALL(
                                                                                                                                                                                                  msgrcv)
#endif
#ifdef SYS_msgsnd
                                                                                                                                                                                                  SELFPROF_DETAIL_SYSCALL(
                                                                                                                                                                                                      msgsnd)
#endif
#ifdef SYS_semop
                                                                                                                                                                                                      SELFPROF_DETAIL_SYSCALL(
                                                                                                                                                                                                          semop)
#endif
#ifdef SYS_semtimedop
                                                                                                                                                                                                          SELFPROF_DETAIL_SYSCALL(
                                                                                                                                                                                                              semtimedop)
#endif
#ifdef SYS_io_getevents
                                                                                                                                                                                                              SELFPROF_DETAIL_SYSCALL(
                                                                                                                                                                                                                  io_getevents)
#endif
#ifdef SYS_io_uring_enter
                                                                                                                                                                                                                  SELFPROF_DETAIL_SYSCALL(
                                                                                                                                                                                                                      io_uring_enter)
#endif
#ifdef SYS_splice
                                                                                                                                                                                                                      SELFPROF_DETAIL_SYSCALL(
                                                                                                                                                                                                                          splice)
#endif
#ifdef SYS_sendfile
                                                                                                                                                                                                                          SELFPROF_DETAIL_SYSCALL(
                                                                                                                                                                                                                              sendfile)
#endif
#ifdef SYS_copy_file_range
                                                                                                                                                                                                                              SELFPROF_DETAIL_SYSCALL(
                                                                                                                                                                                                                                  copy_file_range)
#endif
#ifdef SYS_mmap
                                                                                                                                                                                                                                  SELFPROF_DETAIL_SYSCALL(
                                                                                                                                                                                                                                      mmap)
#endif
#ifdef SYS_munmap
                                                                                                                                                                                                                                      SELFPROF_DETAIL_SYSCALL(
                                                                                                                                                                                                                                          munmap)
#endif
#ifdef SYS_madvise
                                                                                                                                                                                                                                          SELFPROF_DETAIL_SYSCALL(
                                                                                                                                                                                                                                              madvise)
#endif
#ifdef SYS_msync
                                                                                                                                                                                                                                              SELFPROF_DETAIL_SYSCALL(
                                                                                                                                                                                                                                                  msync)
#endif
#ifdef SYS_exit
                                                                                                                                                                                                                                                  SELFPROF_DETAIL_SYSCALL(
                                                                                                                                                                                                                                                      exit)
#endif
#ifdef SYS_exit_group
                                                                                                                                                                                                                                                      SELFPROF_DETAIL_SYSCALL(
                                                                                                                                                                                                                                                          exit_group)
#endif
#ifdef SYS_clone
                                                                                                                                                                                                                                                          SELFPROF_DETAIL_SYSCALL(clone)
#endif
#ifdef SYS_clone3
                                                                                                                                                                                                                                                              SELFPROF_DETAIL_SYSCALL(
                                                                                                                                                                                                                                                                  clone3)
#endif
#ifdef SYS_execve
                                                                                                                                                                                                                                                                  SELFPROF_DETAIL_SYSCALL(
                                                                                                                                                                                                                                                                      execve)
#endif
#ifdef SYS_getrandom
                                                                                                                                                                                                                                                                      SELFPROF_DETAIL_SYSCALL(
                                                                                                                                                                                                                                                                          getrandom)
#endif
#undef SELFPROF_DETAIL_SYSCALL
              };
  for (const entry& e : table)
    if (e.nr == nr) return e.name;
  return "syscall " + std::to_string(nr);
}

}  // namespace detail
}  // namespace selfprof
// ---- end selfprof/wall/syscalls.hpp ----

namespace selfprof {
namespace detail {

// The leaf marker of an off-CPU stack: the system call it waits in, "[blocked]" when it waits outside
// one (a page fault, a stop), "[off-cpu]" when the sampler did not see where (no stack).
inline std::string offcpu_marker_name(std::uint16_t flags, std::size_t depth) {
  if (depth == 0) return "[off-cpu]";
  unsigned call = (flags & kSampleCallMask) >> kSampleCallShift;
  if (call == 0) return "[blocked]";
  return "[blocked: " + syscall_name(static_cast<long>(call) - 1) + "]";
}

// Appends to `out` one stack per entry of `table`, root first, with the wall-mode leaf markers; `root`
// (when not null) first in each, and a cut stack's [truncated] marker right below it, so that a root
// keeps its stacks, cut ones too, in one tower (without a root the writers put the marker first).
// `frames(lookup, s)` appends the frames of one address to s.frames (the
// interrupted pc as it is, a return address less one: it points after its call); `marker(name)` gives
// the index of a marker frame. Returns {samples, truncated samples}.
template <class Frames, class Marker>
std::pair<std::uint64_t, std::uint64_t> stacks_from_table(const stack_table& table, const std::uint32_t* root,
                                                          Frames&& frames, Marker&& marker,
                                                          std::vector<selfprof::stack>& out) {
  std::uint64_t samples = 0, truncated = 0;
  for (const auto& e : table.entries()) {
    const std::uint64_t* pcs = table.pcs(e);
    selfprof::stack s;
    s.count = e.count;
    s.tid = e.tid;
    s.truncated = (e.flags & sample_truncated) != 0;
    if (root) {
      s.frames.push_back(*root);
      if (s.truncated) s.frames.push_back(marker(std::string(truncated_marker)));
    }
    // Walk the captured addresses from the outermost return address to the interrupted pc.
    for (std::size_t i = e.depth; i-- > 0;) frames(i == 0 ? pcs[0] : pcs[i] - 1, s);
    if (e.flags & sample_offcpu) {
      s.offcpu = true;
      s.frames.push_back(marker(offcpu_marker_name(e.flags, e.depth)));
    } else if (e.flags & sample_running) {
      s.frames.push_back(marker("[running]"));
    }
    samples += e.count;
    if (s.truncated) truncated += e.count;
    out.push_back(std::move(s));
  }
  return {samples, truncated};
}

inline profile build_profile(const raw_snapshot& raw, symbolizer& sym) {
  profile p;
  p.info = raw.info;
  // lookup address -> [first frame, count) in p.frames
  std::unordered_map<std::uint64_t, std::pair<std::uint32_t, std::uint32_t>> cache;
  std::vector<selfprof::frame> scratch;
  auto frames_for = [&](std::uint64_t lookup) -> std::pair<std::uint32_t, std::uint32_t> {
    auto it = cache.find(lookup);
    if (it != cache.end()) return it->second;
    scratch.clear();
    sym.resolve(lookup, scratch);
    if (scratch.empty()) {
      selfprof::frame f;
      f.name = "[unknown]";
      f.address = lookup;
      scratch.push_back(f);
    }
    std::pair<std::uint32_t, std::uint32_t> range{static_cast<std::uint32_t>(p.frames.size()),
                                                  static_cast<std::uint32_t>(scratch.size())};
    for (auto& f : scratch) p.frames.push_back(std::move(f));
    cache.emplace(lookup, range);
    return range;
  };
  {
    std::vector<std::uint64_t> kernel;
    append_kernel_lookups(raw.table, kernel);
    if (!kernel.empty()) sym.prepare_kernel(std::move(kernel));
  }
  marker_frames marker(p);  // wall mode's leaves: where a thread waited, or time without a stack
  const auto counts = stacks_from_table(
      raw.table, nullptr,
      [&](std::uint64_t lookup, selfprof::stack& s) {
        auto r = frames_for(lookup);
        for (std::uint32_t k = 0; k < r.second; ++k) s.frames.push_back(r.first + k);
      },
      marker, p.stacks);
  const std::uint64_t samples = counts.first, truncated = counts.second;
  for (const auto& t : raw.thread_names) p.threads.push_back(thread_info{t.first, t.second});
  std::sort(p.threads.begin(), p.threads.end(),
            [](const thread_info& a, const thread_info& b) { return a.tid < b.tid; });
  p.info.samples = samples;
  p.info.truncated = truncated;
  for (auto& w : sym.take_warnings()) p.info.notes.push_back(w);
  return p;
}

}  // namespace detail
}  // namespace selfprof
// ---- end selfprof/dump/symbolize.hpp ----

namespace selfprof {
namespace detail {

// The parts a snapshot reads; they live as long as the profiler.
struct session_parts {
  sample_ring* ring = nullptr;
  sample_store* store = nullptr;
  thread_registry* threads = nullptr;
  session_info* session = nullptr;
  shared_symbolizer* symbols = nullptr;
  collector* collect = nullptr;  // reads the kernel's rings at a snapshot (the ring source)
};

class snapshot_maker {
 public:
  explicit snapshot_maker(session_parts parts) : parts_(parts) {}

  // A session starts (setup only): what later snapshots say about it.
  void begin(const options& o, const handler_counts& base) {
    opts_ = o;
    base_ = base;
    start_unix_ns_ = static_cast<std::uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(
                                                    std::chrono::system_clock::now().time_since_epoch())
                                                    .count());
    start_ = std::chrono::steady_clock::now();
    running_ = true;
  }
  // The session ends (setup only): its duration stops growing.
  void end() {
    stop_ = std::chrono::steady_clock::now();
    running_ = false;
  }
  bool began() const { return start_unix_ns_ != 0; }

  // Everything collected so far (the ring is drained first), or with `windowed` the last window not yet
  // written (see sample_store::copy_table). `sampled_names`: thread names only where there are samples to
  // name (the raw exit dump: a short process that took none reads no thread's name).
  raw_snapshot raw(bool windowed = false, std::uint64_t* window_seq = nullptr, bool sampled_names = false) {
    raw_snapshot s;
    if (running_ && parts_.collect) parts_.collect->pull_now();  // samples still in the kernel's rings
    parts_.store->copy_table(running_ ? parts_.ring : nullptr, windowed, s, window_seq);
    if (!sampled_names || !s.table.entries().empty()) {
      const bool first = !parts_.threads->scanned();  // before the collector's first wake
      if (first) parts_.threads->scan(running_worker_tids());
      s.thread_names = parts_.threads->names(!first);
    }
    if (parts_.store->merged().threads) {
      // Only the threads still in the table: the merged ones are not, and may be thousands.
      std::unordered_set<std::uint32_t> in_table;
      for (const auto& e : s.table.entries()) in_table.insert(e.tid);
      for (auto it = s.thread_names.begin(); it != s.thread_names.end();)
        it = in_table.count(it->first) ? std::next(it) : s.thread_names.erase(it);
      if (in_table.count(kMergedThreadsTid)) s.thread_names[kMergedThreadsTid] = "ended threads";
    }
    const bool wall = opts_.mode == profile_mode::wall;
    const source_info src = parts_.session->source();
    s.info.mode = opts_.mode;
    s.info.unit = wall ? "us" : "samples";
    s.info.source = source_name(src.kind);
    s.info.hz = opts_.hz;
    s.info.period_ns = static_cast<std::uint64_t>(period_ns_for(opts_.hz));
    s.info.dropped = handler_counts::now().since(base_).full;
    s.info.start_unix_ns = start_unix_ns_;
    s.info.kernel_time =
        wall || src.kernel_time;  // a wall profile counts every microsecond, on or off the CPU
    const auto end = running_ ? std::chrono::steady_clock::now() : stop_;
    s.info.duration_s = began() ? std::chrono::duration<double>(end - start_).count() : 0;
    if (!src.kernel_time && !wall)
      s.info.notes.push_back("time spent in the kernel is not sampled (user-only perf_event)");
    std::vector<std::string> all;
    parts_.session->notes(all, &s.info.notes);
    if (wall && src.kind == source_kind::none)
      s.info.notes.push_back("wall mode without on-CPU stacks: " + src.reason);
    for (auto& r : parts_.session->refused()) s.info.notes.push_back("refused " + r);
    return s;
  }

  profile symbolize(const raw_snapshot& raw) {
    profile p = parts_.symbols->with_fresh([&](symbolizer& sym) { return build_profile(raw, sym); });
    name_ceiling_frame(p);
    return p;
  }

  // The samples of game frames over budget, described like raw(); `marked`: any game frame was marked.
  raw_snapshot slow_raw(bool& marked) {
    raw_snapshot s = raw();
    s.table = parts_.store->slow_table(marked);
    s.info.view = "slow frames";
    const double hz = parts_.store->game_frame_hz();
    s.info.hz = hz;
    s.info.period_ns = static_cast<std::uint64_t>(period_ns_for(hz));
    return s;
  }

  // A windowed dump was written: its samples are not handed out again.
  void window_written(std::uint64_t seq) { parts_.store->window_written(seq); }

  // What one dump writes (dump/dump.hpp).
  dump_contents contents(bool windowed = false, std::uint64_t* window_seq = nullptr) {
    dump_contents c;
    c.main = symbolize(raw(windowed, window_seq));
    raw_snapshot slow = slow_raw(c.slow_marked);
    if (c.slow_marked) c.slow = symbolize(slow);
    return c;
  }

  // The `n` longest game frames as flame charts in time order, longest first.
  std::vector<profile> worst_game_frames(std::size_t n) {
    std::vector<kept_game_frame> kept = parts_.store->worst(running_ ? parts_.ring : nullptr, n);
    std::vector<profile> out;
    const raw_snapshot base = raw();
    const double hz = parts_.store->game_frame_hz();
    for (std::size_t i = 0; i < kept.size(); ++i) {
      const kept_game_frame& k = kept[i];
      game_frame_sequence seq = make_game_frame_sequence(k);
      raw_snapshot r;
      r.table = seq.table;
      r.thread_names = base.thread_names;
      r.info = base.info;
      r.info.hz = hz;
      r.info.period_ns = static_cast<std::uint64_t>(period_ns_for(hz));
      r.info.duration_s = static_cast<double>(k.end_ns - k.start_ns) / 1e9;
      char buf[160];
      std::snprintf(buf, sizeof buf, "frame %llu of %s (tid %u): %.2f ms, worst %zu of %zu, time order",
                    static_cast<unsigned long long>(k.seq), k.loop.c_str(), static_cast<unsigned>(k.tid),
                    k.duration_ms(), i + 1, kept.size());
      r.info.view = buf;
      profile p = symbolize(r);
      reorder_game_frame_profile(p, seq);
      out.push_back(std::move(p));
    }
    return out;
  }

  // The stack that new stacks past the memory ceiling were counted under has one frame, at an address
  // no module holds: the symbolizer left it unnamed.
  static void name_ceiling_frame(profile& p) {
    for (frame& f : p.frames) {
      if (f.address != kMemoryCeilingPc || !f.module.empty()) continue;
      f.name = "[selfprof: memory ceiling]";
      f.kind = frame_kind::marker;
    }
  }

  const options& opts() const { return opts_; }
  handler_counts counts() const { return handler_counts::now().since(base_); }

 private:
  session_parts parts_;
  options opts_;
  handler_counts base_;
  std::uint64_t start_unix_ns_ = 0;
  std::chrono::steady_clock::time_point start_{}, stop_{};
  bool running_ = false;
};

}  // namespace detail
}  // namespace selfprof
// ---- end selfprof/core/snapshots.hpp ----
// ---- begin selfprof/serve/server.hpp ----
// The profile endpoint's server: one poll loop over every listening socket and connection (thread
// "selfprof-http"), and the responses that take work — a profile of the next N seconds, symbolized and
// rendered — made off that loop on a second thread ("selfprof-render"), so a slow render or a slow
// client never holds up another client. That thread starts at the first such request; with only the
// control socket open, so does the loop's (start_on_demand). Both are detail::worker threads.
// Context: setup only (start, stop, abandon_after_fork); the two server threads; counters(),
// lazy_listener() and start_on_demand() from any thread.
//
// Threads start when needed: a process nobody asks for a profile runs no server thread when only the
// control socket listens (a thread costs a short-lived process a noticeable share of its CPU); another
// thread (the dumper) watches lazy_listener() and calls start_on_demand() at the first connection. The
// threads run at nice 19, so serving takes only CPU the application leaves; signals are blocked in them.
//
// Listeners, all speaking the same protocol (serve/http.hpp), one request per connection:
//  - the endpoint (options::http, SELFPROF_HTTP): "HOST:PORT" with a numeric IPv4 address or
//    "localhost", "[IPV6]:PORT", or "unix:/path". Loopback unless told otherwise; a non-loopback address
//    needs a bearer token (start() refuses it without one). A unix socket is made 0600 and the peer's uid
//    is checked (SO_PEERCRED: ours or root).
//  - the control socket (options::control, on by default): the abstract unix socket "@selfprof-<pid>",
//    peer uid checked the same way; `selfprof dump PID` is an HTTP client of it. No signal is sent, so no
//    thread of the application sees EINTR because of a dump.
// Bounds: connections open at once (over it, a 503 and close), the head's size and the time to receive it
// (slowloris), the time a response may go without progress, the profiles in the making (503 past it).
// A bad endpoint address, or a non-loopback one without a token, fails start(); an address in use is a
// note (sampling goes on without the endpoint). Every descriptor is
// non-blocking, close-on-exec and above the application's range (detail/high_fd.hpp). Failures are
// counted, never raised: nothing here can stop or stall the application.

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <functional>
#include <memory>
#include <mutex>
#include <new>
#include <string>
#include <utility>
#include <vector>

// ---- begin selfprof/serve/http.hpp ----
// The HTTP/1.1 request parser and response heads of selfprof's profile endpoint (serve/server.hpp): GET
// and HEAD only, every size bounded, every malformed input answered with a status code and a reason.
// Context: any thread except the signal handler (the server thread; a pure function of its input).
//
// Why a parser of our own rather than a library: the endpoint serves a handful of fixed GET paths to
// pprof clients and scrapers, one request per connection. An HTTP library would be a dependency of every
// program that embeds the profiler (selfprof needs only the C++ library and Linux) and brings far more
// surface than this needs (bodies, chunking, keep-alive, TLS); this parser is small enough to read whole
// and is fuzzed on its own (tests/fuzz/http_request_fuzz.cpp).
//
// What it accepts: "METHOD SP origin-form SP HTTP/1.x" (CRLF or bare LF line ends), header fields
// "name: value". Rejected: a request line longer than `max_request_line` (414), a head longer than
// `max_head_bytes` or with more than `max_fields` fields (431), a method other than GET and HEAD (405; an
// unknown one too), an HTTP version other than 1.0 and 1.1 (505), a target that is not "/..." with
// printable characters, a bad percent escape or an escaped NUL, obsolete line folding, control characters
// in a value, two Authorization fields (400). A body is never read: every response closes the connection.

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace selfprof {
namespace detail {

struct http_limits {
  std::size_t max_request_line = 2048;
  std::size_t max_head_bytes = 8192;  // request line and fields, up to the empty line
  std::size_t max_fields = 64;
};

struct http_request {
  std::string method;                                      // "GET" or "HEAD"
  std::string path;                                        // percent-decoded, starts with '/'
  std::vector<std::pair<std::string, std::string>> query;  // decoded, in order
  std::string authorization;                               // the Authorization field's value, if any
  bool has_authorization = false;

  // The value of query parameter `name` (the first one), or nullptr.
  const std::string* param(std::string_view name) const {
    for (const auto& kv : query)
      if (kv.first == name) return &kv.second;
    return nullptr;
  }
};

enum class http_parse { incomplete, done, bad };

struct http_parse_result {
  http_parse state = http_parse::incomplete;
  int status = 0;      // bad: the status code to answer with
  std::string reason;  // bad: what was wrong, for the response body
};

inline bool http_token_char(char c) {
  if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9')) return true;
  switch (c) {
    case '!':
    case '#':
    case '$':
    case '%':
    case '&':
    case '\'':
    case '*':
    case '+':
    case '-':
    case '.':
    case '^':
    case '_':
    case '`':
    case '|':
    case '~':
      return true;
    default:
      return false;
  }
}

inline int http_hex(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

// Percent-decodes `in` (and '+' as a space when `plus`). False on a bad escape or an escaped NUL.
inline bool http_decode(std::string_view in, bool plus, std::string& out) {
  out.clear();
  for (std::size_t i = 0; i < in.size(); ++i) {
    const char c = in[i];
    if (c == '%') {
      if (i + 2 >= in.size()) return false;
      const int hi = http_hex(in[i + 1]), lo = http_hex(in[i + 2]);
      if (hi < 0 || lo < 0 || (hi == 0 && lo == 0)) return false;
      out += static_cast<char>(hi * 16 + lo);
      i += 2;
    } else if (c == '+' && plus) {
      out += ' ';
    } else {
      out += c;
    }
  }
  return true;
}

inline bool http_equal_ci(std::string_view a, std::string_view b) {
  if (a.size() != b.size()) return false;
  for (std::size_t i = 0; i < a.size(); ++i) {
    char x = a[i], y = b[i];
    if (x >= 'A' && x <= 'Z') x = static_cast<char>(x - 'A' + 'a');
    if (y >= 'A' && y <= 'Z') y = static_cast<char>(y - 'A' + 'a');
    if (x != y) return false;
  }
  return true;
}

inline http_parse_result http_bad(int status, std::string reason) {
  http_parse_result r;
  r.state = http_parse::bad;
  r.status = status;
  r.reason = std::move(reason);
  return r;
}

// Parses the request target (origin form) into path and query.
inline http_parse_result http_parse_target(std::string_view target, http_request& out) {
  if (target.empty() || target[0] != '/') return http_bad(400, "the request target must start with '/'");
  for (char c : target)
    if (static_cast<unsigned char>(c) <= 0x20 || static_cast<unsigned char>(c) >= 0x7f)
      return http_bad(400, "the request target has a character that is not printable ASCII");
  const std::size_t q = target.find('?');
  std::string_view path = target.substr(0, q);
  const std::size_t hash = path.find('#');
  if (hash != std::string_view::npos) path = path.substr(0, hash);
  if (!http_decode(path, false, out.path)) return http_bad(400, "bad percent escape in the request path");
  if (q == std::string_view::npos) return {http_parse::done, 0, {}};
  std::string_view query = target.substr(q + 1);
  const std::size_t qhash = query.find('#');
  if (qhash != std::string_view::npos) query = query.substr(0, qhash);
  while (!query.empty()) {
    const std::size_t amp = query.find('&');
    const std::string_view item = query.substr(0, amp);
    query = amp == std::string_view::npos ? std::string_view() : query.substr(amp + 1);
    if (item.empty()) continue;
    const std::size_t eq = item.find('=');
    std::string k, v;
    if (!http_decode(item.substr(0, eq), true, k) ||
        (eq != std::string_view::npos && !http_decode(item.substr(eq + 1), true, v)))
      return http_bad(400, "bad percent escape in the query string");
    if (out.query.size() >= 32) return http_bad(400, "more than 32 query parameters");
    out.query.emplace_back(std::move(k), std::move(v));
  }
  return {http_parse::done, 0, {}};
}

// Parses the head of a request from the bytes received so far. `incomplete` until the empty line that
// ends the head arrives (or a limit is passed, which is `bad`).
inline http_parse_result parse_http_request(std::string_view in, http_request& out,
                                            const http_limits& lim = {}) {
  out = http_request();
  // The end of the head: the first empty line.
  std::size_t head_end = std::string_view::npos, body = 0;
  for (std::size_t i = 0; i < in.size(); ++i) {
    if (in[i] != '\n') continue;
    if (i + 1 < in.size() && in[i + 1] == '\n') {
      head_end = i + 1;
      body = i + 2;
      break;
    }
    if (i + 2 < in.size() && in[i + 1] == '\r' && in[i + 2] == '\n') {
      head_end = i + 1;
      body = i + 3;
      break;
    }
  }
  (void)body;
  const std::size_t line_end = in.find('\n');
  if (line_end == std::string_view::npos ? in.size() > lim.max_request_line : line_end > lim.max_request_line)
    return http_bad(414,
                    "the request line is longer than " + std::to_string(lim.max_request_line) + " bytes");
  if (head_end == std::string_view::npos ? in.size() > lim.max_head_bytes : head_end > lim.max_head_bytes)
    return http_bad(431, "the request head is longer than " + std::to_string(lim.max_head_bytes) + " bytes");
  if (line_end == std::string_view::npos) return {};
  // The request line, checked as soon as it is complete (a bad method is refused without the fields).
  std::string_view line = in.substr(0, line_end);
  if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
  const std::size_t sp1 = line.find(' ');
  if (sp1 == std::string_view::npos || sp1 == 0) return http_bad(400, "malformed request line");
  const std::string_view method = line.substr(0, sp1);
  for (char c : method)
    if (!http_token_char(c)) return http_bad(400, "malformed request method");
  if (method != "GET" && method != "HEAD") return http_bad(405, "only GET and HEAD are served");
  const std::size_t sp2 = line.find(' ', sp1 + 1);
  if (sp2 == std::string_view::npos || line.find(' ', sp2 + 1) != std::string_view::npos)
    return http_bad(400, "malformed request line (expected: METHOD TARGET HTTP/1.1)");
  const std::string_view version = line.substr(sp2 + 1);
  if (version.size() != 8 || version.substr(0, 5) != "HTTP/" || version[6] != '.' || version[5] < '0' ||
      version[5] > '9' || version[7] < '0' || version[7] > '9')
    return http_bad(400, "malformed HTTP version");
  if (version != "HTTP/1.1" && version != "HTTP/1.0")
    return http_bad(505, "only HTTP/1.0 and 1.1 are served");
  if (head_end == std::string_view::npos) return {};
  out.method = std::string(method);
  http_parse_result t = http_parse_target(line.substr(sp1 + 1, sp2 - sp1 - 1), out);
  if (t.state == http_parse::bad) return t;
  // The fields.
  std::size_t pos = line_end + 1, fields = 0;
  while (pos < head_end) {
    std::size_t eol = in.find('\n', pos);
    std::string_view f = in.substr(pos, eol - pos);
    pos = eol + 1;
    if (!f.empty() && f.back() == '\r') f.remove_suffix(1);
    if (f.empty()) break;
    if (++fields > lim.max_fields)
      return http_bad(431, "more than " + std::to_string(lim.max_fields) + " header fields");
    if (f[0] == ' ' || f[0] == '\t') return http_bad(400, "obsolete line folding in a header field");
    const std::size_t colon = f.find(':');
    if (colon == std::string_view::npos || colon == 0) return http_bad(400, "malformed header field");
    const std::string_view name = f.substr(0, colon);
    for (char c : name)
      if (!http_token_char(c)) return http_bad(400, "malformed header field name");
    std::string_view value = f.substr(colon + 1);
    while (!value.empty() && (value.front() == ' ' || value.front() == '\t')) value.remove_prefix(1);
    while (!value.empty() && (value.back() == ' ' || value.back() == '\t')) value.remove_suffix(1);
    for (char c : value)
      if ((static_cast<unsigned char>(c) < 0x20 && c != '\t') || c == 0x7f)
        return http_bad(400, "control character in a header field value");
    if (http_equal_ci(name, "authorization")) {
      if (out.has_authorization) return http_bad(400, "more than one Authorization field");
      out.has_authorization = true;
      out.authorization = std::string(value);
    }
  }
  return {http_parse::done, 0, {}};
}

inline const char* http_reason(int status) {
  switch (status) {
    case 200:
      return "OK";
    case 400:
      return "Bad Request";
    case 401:
      return "Unauthorized";
    case 403:
      return "Forbidden";
    case 404:
      return "Not Found";
    case 405:
      return "Method Not Allowed";
    case 408:
      return "Request Timeout";
    case 414:
      return "URI Too Long";
    case 431:
      return "Request Header Fields Too Large";
    case 500:
      return "Internal Server Error";
    case 503:
      return "Service Unavailable";
    case 505:
      return "HTTP Version Not Supported";
    default:
      return "Error";
  }
}

// A response head: status line, the content type and length, `extra` fields (each ending in CRLF), and
// "Connection: close" (one request per connection).
inline std::string http_response_head(int status, std::string_view content_type, std::size_t length,
                                      std::string_view extra = {}) {
  std::string h = "HTTP/1.1 " + std::to_string(status) + " " + http_reason(status) + "\r\n";
  h += "Content-Type: ";
  h += content_type;
  h += "\r\nContent-Length: " + std::to_string(length) + "\r\n";
  h += "X-Content-Type-Options: nosniff\r\nCache-Control: no-store\r\n";
  if (status == 405) h += "Allow: GET, HEAD\r\n";
  if (status == 401) h += "WWW-Authenticate: Bearer realm=\"selfprof\"\r\n";
  h += extra;
  h += "Connection: close\r\n\r\n";
  return h;
}

// A complete plain-text error response ("selfprof: <reason>\n").
inline std::string http_error_response(int status, std::string_view reason, bool head_only = false) {
  std::string body = "selfprof: ";
  body += reason;
  body += '\n';
  std::string r = http_response_head(status, "text/plain; charset=utf-8", body.size());
  if (!head_only) r += body;
  return r;
}

// Compares a presented secret with the expected one in time that depends only on the presented one's
// length, so the time to refuse reveals nothing about how much of a guess was right.
inline bool http_equal_constant_time(std::string_view given, std::string_view expected) {
  unsigned char diff = given.size() == expected.size() ? 0 : 1;
  for (std::size_t i = 0; i < given.size(); ++i) {
    const unsigned char e = expected.empty() ? 0 : static_cast<unsigned char>(expected[i % expected.size()]);
    diff = static_cast<unsigned char>(diff | (static_cast<unsigned char>(given[i]) ^ e));
  }
  return diff == 0 && !expected.empty();
}

}  // namespace detail
}  // namespace selfprof
// ---- end selfprof/serve/http.hpp ----

namespace selfprof {
namespace detail {

using serve_clock = std::chrono::steady_clock;

constexpr int kServerNice = 19;  // the server threads' nice value: the lowest priority

// What a route answers: complete response bytes, or a job that makes them on the render thread once
// `due` has come (the bytes are then whatever the job returns).
struct http_answer {
  std::string bytes;
  std::function<std::string()> job;
  serve_clock::time_point due{};
};

// Answers a parsed, authorized request. Runs on the server thread: it must be quick (copies, no
// symbolizing or rendering; those go in the job).
using http_route = std::function<http_answer(const http_request&)>;

struct server_config {
  std::string http;   // the endpoint's address ("" none)
  std::string token;  // bearer token the endpoint asks for ("" none)
  bool control = true;
  double head_timeout_s = 10;  // from accept to the end of the request head
  double io_timeout_s = 30;    // the longest a response may go without a byte written
  std::size_t max_connections = 32;
  // Responses waiting for their time or their render at once; more get a 503. Each profile of the next
  // N seconds holds a copy of the stack table while it waits, so this bounds that memory.
  std::size_t max_jobs = 8;
  http_limits limits;
};

struct server_counters {
  std::uint64_t connections = 0;   // accepted
  std::uint64_t requests = 0;      // complete, authorized requests answered by a route
  std::uint64_t bad_requests = 0;  // answered 4xx/5xx by the parser (400, 405, 414, 431, 505)
  std::uint64_t unauthorized = 0;  // 401 (token) and 403 (peer uid)
  std::uint64_t refused = 0;       // over the connection limit: 503
  std::uint64_t timeouts = 0;      // dropped: head too slow, or no write progress
  std::uint64_t failures = 0;      // accept, write or render failures, and clients gone early
};

// A parsed listening address.
struct listen_address {
  int family = 0;  // AF_INET, AF_INET6, AF_UNIX
  sockaddr_storage addr{};
  socklen_t len = 0;
  bool loopback = false;
  std::string path;  // AF_UNIX
};

inline status parse_listen_address(const std::string& text, listen_address& out) {
  out = listen_address();
  auto bad = [&](const std::string& why) {
    return status::error("selfprof: SELFPROF_HTTP=\"" + text + "\": " + why);
  };
  if (text.rfind("unix:", 0) == 0) {
    const std::string path = text.substr(5);
    sockaddr_un un{};
    if (path.empty() || path[0] != '/') return bad("a unix socket needs an absolute path (unix:/path)");
    if (path.size() >= sizeof un.sun_path) return bad("the socket path is too long");
    un.sun_family = AF_UNIX;
    std::memcpy(un.sun_path, path.c_str(), path.size() + 1);
    std::memcpy(&out.addr, &un, sizeof un);
    out.len = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + path.size() + 1);
    out.family = AF_UNIX;
    out.path = path;
    out.loopback = true;
    return status::ok();
  }
  const std::size_t colon = text.rfind(':');
  if (colon == std::string::npos) return bad("expected HOST:PORT, [IPV6]:PORT or unix:/path");
  std::string host = text.substr(0, colon);
  const std::string port_text = text.substr(colon + 1);
  if (port_text.empty() || port_text.size() > 5 ||
      port_text.find_first_not_of("0123456789") != std::string::npos)
    return bad("the port must be a number from 0 to 65535");
  const unsigned long port = std::stoul(port_text);
  if (port > 65535) return bad("the port must be a number from 0 to 65535");
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') {
    host = host.substr(1, host.size() - 2);
    sockaddr_in6 a{};
    a.sin6_family = AF_INET6;
    a.sin6_port = htons(static_cast<std::uint16_t>(port));
    if (inet_pton(AF_INET6, host.c_str(), &a.sin6_addr) != 1) return bad("not a numeric IPv6 address");
    std::memcpy(&out.addr, &a, sizeof a);
    out.len = sizeof a;
    out.family = AF_INET6;
    out.loopback = IN6_IS_ADDR_LOOPBACK(&a.sin6_addr) ||
                   (IN6_IS_ADDR_V4MAPPED(&a.sin6_addr) && a.sin6_addr.s6_addr[12] == 127);
    return status::ok();
  }
  if (host == "localhost") host = "127.0.0.1";
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<std::uint16_t>(port));
  if (inet_pton(AF_INET, host.c_str(), &a.sin_addr) != 1)
    return bad("not a numeric IPv4 address (names are not resolved; IPv6 goes in brackets)");
  std::memcpy(&out.addr, &a, sizeof a);
  out.len = sizeof a;
  out.family = AF_INET;
  out.loopback = (ntohl(a.sin_addr.s_addr) >> 24) == 127;
  return status::ok();
}

// "127.0.0.1:6060", "[::1]:6060", "unix:/path", "@name" of a bound socket.
inline std::string describe_bound(int fd) {
  sockaddr_storage ss{};
  socklen_t len = sizeof ss;
  if (::getsockname(fd, reinterpret_cast<sockaddr*>(&ss), &len) != 0) return "?";
  char buf[INET6_ADDRSTRLEN] = {0};
  if (ss.ss_family == AF_INET) {
    const auto* a = reinterpret_cast<const sockaddr_in*>(&ss);
    inet_ntop(AF_INET, &a->sin_addr, buf, sizeof buf);
    return std::string(buf) + ":" + std::to_string(ntohs(a->sin_port));
  }
  if (ss.ss_family == AF_INET6) {
    const auto* a = reinterpret_cast<const sockaddr_in6*>(&ss);
    inet_ntop(AF_INET6, &a->sin6_addr, buf, sizeof buf);
    return "[" + std::string(buf) + "]:" + std::to_string(ntohs(a->sin6_port));
  }
  const auto* u = reinterpret_cast<const sockaddr_un*>(&ss);
  const std::size_t n = len > offsetof(sockaddr_un, sun_path) ? len - offsetof(sockaddr_un, sun_path) : 0;
  if (n > 0 && u->sun_path[0] == '\0') return "@" + std::string(u->sun_path + 1, n - 1);
  return "unix:" + std::string(u->sun_path, strnlen(u->sun_path, n));
}

// The control socket's abstract name for `pid` (without the leading NUL).
inline std::string control_socket_name(long pid) { return "selfprof-" + std::to_string(pid); }

// True when the peer of unix socket `fd` runs as our uid or as root.
inline bool peer_uid_allowed(int fd) {
  struct ucred cred {};
  socklen_t len = sizeof cred;
  if (::getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0) return false;
  return cred.uid == ::geteuid() || cred.uid == 0;
}

class http_server {
 public:
  http_server() = default;
  http_server(const http_server&) = delete;
  http_server& operator=(const http_server&) = delete;
  ~http_server() { stop(); }

  // Opens the listeners and starts the loop's thread. A bad endpoint address, or a non-loopback one without
  // a token, is an error; an endpoint address in use or a control socket that cannot be bound is only a
  // note (`notes`), the rest runs. `on_demand`: with the control socket alone, the thread is left to
  // start_on_demand().
  status start(const server_config& cfg, http_route route, std::vector<std::string>& notes,
               bool on_demand = false) {
    stop();
    cfg_ = cfg;
    route_ = std::move(route);
    {
      std::lock_guard<std::mutex> lock(mu_);
      jobs_.clear();
      done_.clear();
    }
    if (!cfg.http.empty()) {
      status st = open_endpoint(notes);
      if (!st) {
        close_listeners();
        return st;
      }
    }
    if (cfg.control) {
      const std::string name = control_socket_name(::getpid());
      sockaddr_un un{};
      un.sun_family = AF_UNIX;
      std::memcpy(un.sun_path + 1, name.data(), name.size());
      const socklen_t len = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + 1 + name.size());
      const int fd = listen_on(AF_UNIX, reinterpret_cast<const sockaddr*>(&un), len);
      if (fd < 0)
        notes.push_back("control socket @" + name + " not opened (" + std::strerror(errno) +
                        "): `selfprof dump` cannot reach this process");
      else {
        listeners_.push_back({fd, kind_control, false});
        control_ = "@" + name;
      }
    }
    if (listeners_.empty()) return status::ok();
    std::lock_guard<std::mutex> lazy(lazy_mu_);
    if (on_demand && listeners_.size() == 1 && listeners_[0].kind == kind_control) {
      lazy_fd_.store(listeners_[0].fd, std::memory_order_release);
      return status::ok();
    }
    status st = io_.start("selfprof-http", &http_server::io_main, this);
    if (!st) close_listeners();
    return st;
  }

  // The control socket while its loop's thread is not started (else -1): readable when a client
  // connects. The watcher then calls start_on_demand().
  int lazy_listener() const { return lazy_fd_.load(std::memory_order_acquire); }

  // Any thread: starts the loop's thread if start() left it to this and stop() has not come since. A
  // failure is counted; the watcher then stops watching (lazy_listener() is -1 either way).
  void start_on_demand() {
    std::lock_guard<std::mutex> lazy(lazy_mu_);
    if (lazy_fd_.load(std::memory_order_relaxed) < 0) return;  // started, stopped, or not on demand
    lazy_fd_.store(-1, std::memory_order_release);
    if (!io_.start("selfprof-http", &http_server::io_main, this)) ++n_.failures;
  }

  // Stops the threads and closes every socket; a client waiting for a profile sees its connection
  // closed.
  void stop() {
    {
      std::lock_guard<std::mutex> lazy(lazy_mu_);
      lazy_fd_.store(-1, std::memory_order_release);
    }
    io_.stop();
    render_.stop();
    for (auto& c : conns_) close_conn(c);
    conns_.clear();
    close_listeners();
    std::lock_guard<std::mutex> lock(mu_);
    jobs_.clear();
    done_.clear();
  }

  // A forked child: the threads are not there; its copies of the sockets are closed (a unix socket's
  // path belongs to the parent and stays).
  void abandon_after_fork() {
    io_.abandon_after_fork();
    render_.abandon_after_fork();
    new (&lazy_mu_) std::mutex();
    lazy_fd_.store(-1, std::memory_order_relaxed);
    for (auto& c : conns_)
      if (c.fd >= 0) ::close(c.fd);
    conns_.clear();
    for (auto& l : listeners_) ::close(l.fd);
    listeners_.clear();
    unix_path_.clear();
    new (&mu_) std::mutex();
    jobs_.clear();
    done_.clear();
  }

  bool running() const { return io_.running(); }
  // The server's threads now (the render thread once started).
  std::vector<pid_t> tids() const {
    std::vector<pid_t> t;
    for (pid_t id : {io_.tid(), render_.tid()})
      if (id != 0) t.push_back(id);
    return t;
  }
  const std::string& address() const { return address_; }  // the endpoint as bound ("" none)
  const std::string& control_name() const { return control_; }

  server_counters counters() const {
    server_counters c;
    c.connections = n_.connections.load();
    c.requests = n_.requests.load();
    c.bad_requests = n_.bad_requests.load();
    c.unauthorized = n_.unauthorized.load();
    c.refused = n_.refused.load();
    c.timeouts = n_.timeouts.load();
    c.failures = n_.failures.load();
    return c;
  }

 private:
  enum listener_kind { kind_tcp, kind_unix, kind_control };
  struct listener {
    int fd;
    listener_kind kind;
    bool token;  // ask for the bearer token
  };
  enum conn_state { reading, waiting, writing, draining };
  struct conn {
    int fd = -1;
    std::uint64_t id = 0;
    listener_kind kind = kind_tcp;
    bool token = false;
    conn_state state = reading;
    bool head_only = false;
    bool forbidden = false;  // a unix peer of another uid: answered 403 once its request is read
    std::string in, out;
    std::size_t sent = 0;
    serve_clock::time_point deadline{};
    std::shared_ptr<std::atomic<bool>> cancelled;
  };
  struct job {
    std::uint64_t conn = 0;
    serve_clock::time_point due{};
    std::function<std::string()> make;
    std::shared_ptr<std::atomic<bool>> cancelled;
  };
  struct finished {
    std::uint64_t conn = 0;
    std::string bytes;
  };
  struct atomic_counters {
    std::atomic<std::uint64_t> connections{0}, requests{0}, bad_requests{0}, unauthorized{0}, refused{0},
        timeouts{0}, failures{0};
  };

  static int listen_on(int family, const sockaddr* a, socklen_t len) {
    int fd = ::socket(family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0) return -1;
    fd = keep_fd_high(fd);
    if (family != AF_UNIX) {
      const int one = 1;
      ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
      if (family == AF_INET6) ::setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &one, sizeof one);
    }
    if (::bind(fd, a, len) != 0 || ::listen(fd, 64) != 0) {
      const int e = errno;
      ::close(fd);
      errno = e;
      return -1;
    }
    return fd;
  }

  status open_endpoint(std::vector<std::string>& notes) {
    listen_address la;
    status st = parse_listen_address(cfg_.http, la);
    if (!st) return st;
    if (!la.loopback && cfg_.token.empty())
      return status::error("selfprof: SELFPROF_HTTP=\"" + cfg_.http +
                           "\" is not a loopback address: refusing to serve profiles there without a "
                           "bearer token (set SELFPROF_HTTP_TOKEN_FILE, or bind 127.0.0.1 / [::1] / unix:)");
    if (la.family == AF_UNIX) {
      struct stat sb {};
      if (::lstat(la.path.c_str(), &sb) == 0) {
        if (!S_ISSOCK(sb.st_mode) || sb.st_uid != ::geteuid())
          return status::error("selfprof: SELFPROF_HTTP=\"" + cfg_.http +
                               "\": the path exists and is not a socket of ours; not replacing it");
        ::unlink(la.path.c_str());  // a socket left by an earlier run of ours
      }
    }
    const int fd = listen_on(la.family, reinterpret_cast<const sockaddr*>(&la.addr), la.len);
    if (fd < 0) {
      // The address is fine but taken (another instance, a child that exec'd with the same environment):
      // sampling goes on without the endpoint, and says so.
      const std::string why = "SELFPROF_HTTP=\"" + cfg_.http + "\": cannot listen (" + std::strerror(errno) +
                              "): no profile endpoint in this process";
      notes.push_back(why);
      std::fprintf(stderr, "selfprof: %s\n", why.c_str());
      return status::ok();
    }
    if (la.family == AF_UNIX) {
      // Bound with the umask's mode; 0600 before the first accept (and peers are checked by uid anyway).
      if (::chmod(la.path.c_str(), 0600) != 0) notes.push_back("cannot chmod 0600 " + la.path);
      unix_path_ = la.path;
    }
    listeners_.push_back({fd, la.family == AF_UNIX ? kind_unix : kind_tcp, !cfg_.token.empty()});
    address_ = describe_bound(fd);
    return status::ok();
  }

  void close_listeners() {
    for (auto& l : listeners_) ::close(l.fd);
    listeners_.clear();
    if (!unix_path_.empty()) ::unlink(unix_path_.c_str());
    unix_path_.clear();
    address_.clear();
    control_.clear();
  }

  void close_conn(conn& c) {
    if (c.cancelled) c.cancelled->store(true, std::memory_order_relaxed);
    if (c.fd >= 0) ::close(c.fd);
    c.fd = -1;
  }

  static serve_clock::duration secs(double s) {
    return std::chrono::duration_cast<serve_clock::duration>(std::chrono::duration<double>(s));
  }

  // Both threads yield to the application: a scrape must not take CPU the program wants (under full load
  // a render waits for the CPU share a nice-19 thread gets; the client's own timeout bounds that).
  static void io_main(void* self) {
    ::setpriority(PRIO_PROCESS, static_cast<id_t>(raw_gettid()), kServerNice);
    static_cast<http_server*>(self)->io_loop();
  }
  static void render_main(void* self) {
    ::setpriority(PRIO_PROCESS, static_cast<id_t>(raw_gettid()), kServerNice);
    static_cast<http_server*>(self)->render_loop();
  }

  void io_loop() {
    std::vector<pollfd> fds;
    for (;;) {
      fds.clear();
      fds.push_back({io_.wake_fd(), POLLIN, 0});
      for (auto& l : listeners_) fds.push_back({l.fd, POLLIN, 0});
      const std::size_t first_conn = fds.size();
      auto now = serve_clock::now();
      serve_clock::time_point next = now + std::chrono::seconds(60);
      for (auto& c : conns_) {
        short ev = c.state == reading || c.state == draining ? POLLIN
                   : c.state == writing                      ? POLLOUT
                                                             : POLLRDHUP;
        fds.push_back({c.fd, ev, 0});
        if (c.state != waiting) next = std::min(next, c.deadline);
      }
      const auto wait = std::chrono::duration_cast<std::chrono::milliseconds>(next - now).count() + 1;
      const int n = ::poll(fds.data(), fds.size(), static_cast<int>(std::max<long long>(0, wait)));
      if (io_.stopping()) return;
      if (n > 0 && (fds[0].revents & POLLIN)) {
        std::uint64_t v;
        ssize_t r = ::read(io_.wake_fd(), &v, sizeof v);
        (void)r;
      }
      take_finished();
      now = serve_clock::now();
      // Connections first (the vector changes when new ones are accepted).
      for (std::size_t i = 0; i < conns_.size() && first_conn + i < fds.size(); ++i) {
        conn& c = conns_[i];
        const short re = fds[first_conn + i].revents;
        if (c.fd < 0) continue;
        if (c.state == reading && (re & (POLLIN | POLLHUP | POLLERR)))
          read_some(c);
        else if (c.state == writing && (re & (POLLOUT | POLLHUP | POLLERR)))
          write_some(c);
        else if (c.state == draining && (re & (POLLIN | POLLHUP | POLLERR)))
          drain(c);  // the client's close ends the lingering at once, not at its deadline
        else if (c.state == waiting && (re & (POLLRDHUP | POLLHUP | POLLERR))) {
          ++n_.failures;  // the client left before its profile was ready
          close_conn(c);
        }
        if (c.fd >= 0 && c.state != waiting && now >= c.deadline) {
          if (c.state == reading && !c.in.empty() && c.in.size() < 16384) {
            // Tell a slow client why, best effort, then drop it.
            const std::string r = http_error_response(408, "the request head took too long");
            ssize_t w = ::send(c.fd, r.data(), r.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
            (void)w;
          }
          if (c.state != draining) ++n_.timeouts;
          close_conn(c);
        }
      }
      conns_.erase(std::remove_if(conns_.begin(), conns_.end(), [](const conn& c) { return c.fd < 0; }),
                   conns_.end());
      for (std::size_t i = 0; i < listeners_.size(); ++i)
        if (fds[1 + i].revents & POLLIN) accept_all(listeners_[i]);
    }
  }

  void accept_all(const listener& l) {
    for (int k = 0; k < 64; ++k) {
      int fd = ::accept4(l.fd, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
      if (fd < 0) {
        if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) ++n_.failures;
        return;
      }
      fd = move_fd_high(fd).fd;
      ++n_.connections;
      if (conns_.size() >= cfg_.max_connections) {
        ++n_.refused;
        const std::string r = http_error_response(503, "too many connections at once; try again");
        ssize_t w = ::send(fd, r.data(), r.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
        (void)w;
        ::close(fd);
        continue;
      }
      conn c;
      c.fd = fd;
      c.id = ++next_id_;
      c.kind = l.kind;
      c.token = l.token;
      c.deadline = serve_clock::now() + secs(cfg_.head_timeout_s);
      c.cancelled = std::make_shared<std::atomic<bool>>(false);
      c.forbidden = l.kind != kind_tcp && !peer_uid_allowed(fd);
      conns_.push_back(std::move(c));
    }
  }

  void respond(conn& c, std::string bytes) {
    if (c.head_only) {
      const std::size_t end = bytes.find("\r\n\r\n");
      if (end != std::string::npos) bytes.resize(end + 4);
    }
    c.out = std::move(bytes);
    c.sent = 0;
    c.state = writing;
    c.deadline = serve_clock::now() + secs(cfg_.io_timeout_s);
    write_some(c);
  }

  void read_some(conn& c) {
    char buf[4096];
    for (;;) {
      const ssize_t n = ::recv(c.fd, buf, sizeof buf, MSG_DONTWAIT);
      if (n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)) {
        close_conn(c);  // the client left before its request was complete
        return;
      }
      if (n < 0) break;
      c.in.append(buf, static_cast<std::size_t>(n));
      if (c.in.size() > cfg_.limits.max_head_bytes + 4) break;  // enough to judge
    }
    http_request req;
    const http_parse_result r = parse_http_request(c.in, req, cfg_.limits);
    if (r.state == http_parse::incomplete) return;
    c.in.clear();
    c.in.shrink_to_fit();
    if (c.forbidden) {
      ++n_.unauthorized;
      c.head_only = false;
      respond(c, http_error_response(403, "this socket serves only its owner's uid and root"));
      return;
    }
    if (r.state == http_parse::bad) {
      ++n_.bad_requests;
      c.head_only = false;
      respond(c, http_error_response(r.status, r.reason));
      return;
    }
    c.head_only = req.method == "HEAD";
    if (c.token && !token_ok(req)) {
      ++n_.unauthorized;
      respond(c, http_error_response(401, "a bearer token is required (Authorization: Bearer ...)"));
      return;
    }
    ++n_.requests;
    http_answer a;
    try {
      a = route_(req);
    } catch (...) {
      ++n_.failures;
      respond(c, http_error_response(500, "the request could not be answered (out of memory?)"));
      return;
    }
    if (!a.job) {
      if (a.bytes.size() > 9 && (a.bytes[9] == '4' || a.bytes[9] == '5')) ++n_.bad_requests;
      respond(c, std::move(a.bytes));
      return;
    }
    // The io thread is the only one that starts the render thread; stop() joins the io thread first.
    if (!render_.running() && !render_.start("selfprof-render", &http_server::render_main, this)) {
      ++n_.failures;
      respond(c, http_error_response(503, "the profile cannot be made now (no thread); try again later"));
      return;
    }
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (jobs_.size() < cfg_.max_jobs) {
        c.state = waiting;
        jobs_.push_back({c.id, a.due, std::move(a.job), c.cancelled});
        render_.wake();
        return;
      }
    }
    ++n_.refused;
    respond(c, http_error_response(503, "too many profiles in the making at once; try again later"));
  }

  bool token_ok(const http_request& req) const {
    if (!req.has_authorization) return false;
    const std::string& v = req.authorization;
    if (v.size() < 7 || !http_equal_ci(std::string_view(v).substr(0, 7), "bearer ")) return false;
    std::string_view given = std::string_view(v).substr(7);
    while (!given.empty() && given.front() == ' ') given.remove_prefix(1);
    return http_equal_constant_time(given, cfg_.token);
  }

  void write_some(conn& c) {
    while (c.sent < c.out.size()) {
      const ssize_t n =
          ::send(c.fd, c.out.data() + c.sent, c.out.size() - c.sent, MSG_NOSIGNAL | MSG_DONTWAIT);
      if (n < 0) {
        if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) return;
        ++n_.failures;
        close_conn(c);
        return;
      }
      c.sent += static_cast<std::size_t>(n);
      c.deadline = serve_clock::now() + secs(cfg_.io_timeout_s);
    }
    // A lingering close: what the client still sends (the rest of a refused request) is read and dropped
    // for a moment, so closing with unread bytes does not reset the connection before it read the answer.
    ::shutdown(c.fd, SHUT_WR);
    c.out.clear();
    c.out.shrink_to_fit();
    c.state = draining;
    c.sent = 0;
    c.deadline = serve_clock::now() + std::chrono::seconds(1);
    drain(c);
  }

  void drain(conn& c) {
    char buf[4096];
    for (;;) {
      const ssize_t n = ::recv(c.fd, buf, sizeof buf, MSG_DONTWAIT);
      if (n > 0 && (c.sent += static_cast<std::size_t>(n)) < 65536) continue;
      if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) return;
      close_conn(c);  // the client closed, an error, or too much
      return;
    }
  }

  void take_finished() {
    std::vector<finished> got;
    {
      std::lock_guard<std::mutex> lock(mu_);
      got.swap(done_);
    }
    for (auto& f : got)
      for (auto& c : conns_)
        if (c.id == f.conn && c.fd >= 0 && c.state == waiting) respond(c, std::move(f.bytes));
  }

  void render_loop() {
    for (;;) {
      job next;
      std::int64_t wait_ns = -1;
      {
        std::lock_guard<std::mutex> lock(mu_);
        jobs_.erase(std::remove_if(jobs_.begin(), jobs_.end(),
                                   [](const job& j) { return j.cancelled->load(std::memory_order_relaxed); }),
                    jobs_.end());
        auto it = std::min_element(jobs_.begin(), jobs_.end(),
                                   [](const job& a, const job& b) { return a.due < b.due; });
        const auto now = serve_clock::now();
        if (it != jobs_.end()) {
          if (it->due <= now) {
            next = std::move(*it);
            jobs_.erase(it);
          } else {
            wait_ns = std::chrono::duration_cast<std::chrono::nanoseconds>(it->due - now).count();
          }
        }
      }
      if (!next.make) {
        if (!render_.wait_ns(wait_ns)) return;
        continue;
      }
      std::string bytes;
      try {
        bytes = next.make();
      } catch (...) {
        ++n_.failures;
        bytes = http_error_response(500, "the profile could not be made (out of memory?)");
      }
      {
        std::lock_guard<std::mutex> lock(mu_);
        done_.push_back({next.conn, std::move(bytes)});
      }
      io_.wake();
      if (render_.stopping()) return;
    }
  }

  server_config cfg_;
  http_route route_;
  std::vector<listener> listeners_;
  std::string unix_path_, address_, control_;
  std::mutex lazy_mu_;            // start_on_demand() against stop()
  std::atomic<int> lazy_fd_{-1};  // -1 once stopped: no thread starts on demand after stop()
  std::vector<conn> conns_;       // the io thread's
  std::uint64_t next_id_ = 0;
  std::mutex mu_;  // jobs_ and done_
  std::vector<job> jobs_;
  std::vector<finished> done_;
  atomic_counters n_;
  worker io_, render_;
};

}  // namespace detail
}  // namespace selfprof
// ---- end selfprof/serve/server.hpp ----
// ---- begin selfprof/signal/dump_request.hpp ----
// Signal-handler code: the dump signal (SIGUSR2 by default) only counts a request and wakes the dumper
// thread through its eventfd; that thread does the work (a handler that opens files and allocates, as
// some profilers' dump signals do, deadlocks when it interrupts malloc).
// Context: signal handler (async-signal-safe: atomic adds and one raw write(2), not libc's interposable
// wrapper).

#include <signal.h>
#include <time.h>
#include <unistd.h>

#include <errno.h>
#include <atomic>
#include <cstdint>


namespace selfprof {
namespace detail {

struct dump_request_globals {
  std::atomic<std::uint64_t> requests{0};  // dump signals received
  std::atomic<int> wake_fd{-1};            // the dumper's eventfd, -1 when no dumper runs
  std::atomic<int> in_flight{0};           // handlers running now: the eventfd closes only at zero
  std::atomic<int> dumper_tid{0};          // the dumper thread, 0 when none runs
  std::atomic<int> exit_requested{0};      // the process is ending: write the exit dump, then set exit_done
  std::atomic<int> exit_done{0};
  std::atomic<int> exit_dump_wanted{0};  // the session writes an exit dump (an output path was given)
  // The dump signal while selfprof routes it to the dumper (blocked in the starting thread and so in every
  // thread it creates later), 0 otherwise: a fork child and an exec take the block off (core/auto_dumps.hpp).
  std::atomic<int> routed_signal{0};
};

inline dump_request_globals g_dump_requests;

// in_flight and wake_fd are seq_cst, as the sampling handler's in_flight and active: stop() stores -1 in
// wake_fd and then waits for in_flight to be zero, so a handler either sees -1 or is waited for, and
// never writes into a descriptor number that was closed and reused.
inline void dump_signal_handler(int, siginfo_t*, void*) {
  const int saved_errno = errno;
  g_dump_requests.in_flight.fetch_add(1, std::memory_order_seq_cst);
  g_dump_requests.requests.fetch_add(1, std::memory_order_acq_rel);
  const int fd = g_dump_requests.wake_fd.load(std::memory_order_seq_cst);
  if (fd >= 0) {
    const std::uint64_t one = 1;
    raw_syscall3(SYS_write, fd, reinterpret_cast<long>(&one), sizeof one);
  }
  g_dump_requests.in_flight.fetch_sub(1, std::memory_order_release);
  errno = saved_errno;
}

// The exit dump, asked of the dumper thread by a thread that is ending the process (the preload library's
// _exit: possibly inside a signal handler, or with a libc lock held by the thread it interrupted). No
// dump work happens on the calling thread; it waits for the dumper while the dumper makes progress (its
// CPU time grows) and gives up after `stall_ms` without any, or after `limit_ms` in all: a dumper blocked
// on a lock the caller holds cannot make it wait longer. True when the dump was written.
// Async-signal-safe: atomics, raw write(2), clock_gettime(2) and nanosleep(2).
// A dumper started on demand (core/auto_dumps.hpp) is not running yet: the wake starts it, and the wait
// counts as a stall until its tid is published.
inline bool exit_dump_by_dumper(unsigned stall_ms = 500, unsigned limit_ms = 60000) {
  if (g_dump_requests.exit_dump_wanted.load(std::memory_order_acquire) == 0) return false;
  if (g_dump_requests.dumper_tid.load(std::memory_order_acquire) <= 0 &&
      g_dump_requests.wake_fd.load(std::memory_order_acquire) < 0)
    return false;
  g_dump_requests.in_flight.fetch_add(1, std::memory_order_seq_cst);
  g_dump_requests.exit_requested.store(1, std::memory_order_seq_cst);
  const int fd = g_dump_requests.wake_fd.load(std::memory_order_seq_cst);
  if (fd >= 0) {
    const std::uint64_t one = 1;
    raw_syscall3(SYS_write, fd, reinterpret_cast<long>(&one), sizeof one);
  }
  g_dump_requests.in_flight.fetch_sub(1, std::memory_order_release);
  if (fd < 0) return false;
  long long last_cpu = -1;
  int last_tid = 0;
  unsigned still_ms = 0;
  for (unsigned waited_ms = 0; waited_ms < limit_ms; ++waited_ms) {
    if (g_dump_requests.exit_done.load(std::memory_order_acquire)) return true;
    const int tid = g_dump_requests.dumper_tid.load(std::memory_order_acquire);
    if (tid != last_tid) {
      last_tid = tid;
      last_cpu = -1;
      still_ms = 0;
    }
    if (tid <= 0) {
      if (++still_ms >= stall_ms) return false;
    } else {
      // The thread's CPU clock (clock_getcpuclockid's encoding for a thread: ~tid << 3 | CPUCLOCK_SCHED |
      // CPUCLOCK_PERTHREAD); reading it fails once the thread is gone.
      const clockid_t cpu = static_cast<clockid_t>((~static_cast<unsigned>(tid) << 3) | 6u);
      struct timespec t {};
      if (raw_syscall3(SYS_clock_gettime, cpu, reinterpret_cast<long>(&t), 0) != 0) return false;
      const long long now_cpu = static_cast<long long>(t.tv_sec) * 1000000000 + t.tv_nsec;
      still_ms = now_cpu == last_cpu ? still_ms + 1 : 0;
      if (still_ms >= stall_ms) return false;
      last_cpu = now_cpu;
    }
    struct timespec step {
      0, 1000 * 1000
    };
    raw_syscall3(SYS_nanosleep, reinterpret_cast<long>(&step), 0, 0);
  }
  return false;
}

}  // namespace detail
}  // namespace selfprof
// ---- end selfprof/signal/dump_request.hpp ----

namespace selfprof {
namespace detail {

class auto_dumps {
 public:
  // `exit_dump` writes the exit profile; run on this thread when the process ends through _exit() (see
  // exit_dump_by_dumper in signal/dump_request.hpp).
  auto_dumps(snapshot_maker& snapshots, void (*exit_dump)()) : snapshots_(snapshots), exit_dump_(exit_dump) {}

  // Takes the dump signal when no one else handles it (else a note says so) and starts the dumper thread,
  // or with `on_demand` (and no interval) only prepares it: watch_fd() then tells when to launch() it.
  status start(const options& o, session_info& session, bool on_demand = false) {
    opts_ = o;
    settings_.paths = o.out.empty() ? kDefaultDumpTemplate : o.out;
    settings_.sink.allow_shared_dir = o.allow_shared_dir;
    settings_.thread_roots = o.thread_roots;
    settings_.frame_budget_ms = o.frame_budget_ms;
    written_.store(0);
    failed_.store(0);
    {
      std::lock_guard<std::mutex> lock(mu_);
      handled_ = g_dump_requests.requests.load();
      done_ = handled_;
      busy_ = false;
    }
    on_demand_.store(nullptr, std::memory_order_relaxed);  // serve_on_demand() after this, if at all
    take_signal(o.dump_signal, session);
    status st = worker_.prepare("selfprof-dump");
    if (!st) {
      give_signal_back();
      return st;
    }
    g_dump_requests.exit_requested.store(0, std::memory_order_relaxed);
    g_dump_requests.exit_done.store(0, std::memory_order_relaxed);
    g_dump_requests.exit_dump_wanted.store(o.out.empty() ? 0 : 1, std::memory_order_relaxed);
    g_dump_requests.wake_fd.store(worker_.wake_fd(), std::memory_order_release);
    g_dump_requests.dumper_tid.store(0, std::memory_order_release);
    if (on_demand && o.interval_s <= 0) make_watch_fd();
    if (watch_fd_ < 0) {
      st = launch();
      if (!st) {
        g_dump_requests.wake_fd.store(-1, std::memory_order_seq_cst);
        worker_.stop();
        give_signal_back();
        return st;
      }
    }
    if (watch_fd_ < 0 || requests_waiting())
      worker_.wake();  // one the handler counted before wake_fd was set
    return status::ok();
  }

  // Readable when the dumper, not started yet, has something to do; -1 once it runs (or when started
  // without on_demand). Watched by one other thread, which calls launch() when it turns readable.
  int watch_fd() const { return watch_fd_; }

  // Starts the dumper thread if it is prepared and not running yet (else does nothing).
  status launch() {
    std::lock_guard<std::mutex> lock(launch_mu_);
    if (worker_.running() || worker_.wake_fd() < 0) return status::ok();
    status st = worker_.launch(&auto_dumps::main, this);
    if (st) {
      g_dump_requests.dumper_tid.store(static_cast<int>(worker_.tid()), std::memory_order_release);
    } else {
      std::fprintf(stderr, "%s: dump requests are not answered\n", st.message().c_str());
    }
    return st;
  }
  // launch() for a watcher that holds a plain function pointer.
  static void launch_from(void* self) { (void)static_cast<auto_dumps*>(self)->launch(); }

  // Answers what was requested, stops the thread, and gives the dump signal back to the application —
  // unless `keep_signal` (the exit dump: a late request must not meet the default action, terminate,
  // while the last profile is written; the handler then only counts it).
  void stop(bool keep_signal = false) {
    bool never_launched = false;
    {  // the lock orders this read with a launch() by flush() on another thread or by a watcher still running
      std::lock_guard<std::mutex> lock(launch_mu_);
      never_launched = !worker_.running() && worker_.wake_fd() >= 0;
    }
    if (never_launched) {
      // Never launched: requests that arrived since the watcher stopped are still answered.
      if (sfd_ >= 0) read_signalfd();
      if (requests_waiting()) (void)launch();
    }
    g_dump_requests.dumper_tid.store(0, std::memory_order_release);
    g_dump_requests.wake_fd.store(-1, std::memory_order_seq_cst);
    // A handler that read the descriptor before the store writes it before the thread closes it.
    for (int waited_us = 0;
         g_dump_requests.in_flight.load(std::memory_order_seq_cst) != 0 && waited_us < 1000000;
         waited_us += 100) {
      struct timespec step {
        0, 100 * 1000
      };
      ::nanosleep(&step, nullptr);
    }
    worker_.stop();
    close_watch_fd();
    if (!keep_signal) give_signal_back();
  }

  // Waits until every dump requested so far is written (tests, exit); at most `limit`.
  void flush(std::chrono::milliseconds limit = std::chrono::milliseconds(30000)) {
    (void)launch();  // requests may be waiting for the watcher to start the dumper
    std::unique_lock<std::mutex> lock(mu_);
    const std::uint64_t want = g_dump_requests.requests.load();
    worker_.wake();
    done_cv_.wait_for(lock, limit, [&] { return !worker_.running() || (done_ >= want && !busy_); });
  }

  void abandon_after_fork() {
    on_demand_.store(nullptr, std::memory_order_relaxed);
    g_dump_requests.dumper_tid.store(0, std::memory_order_release);
    g_dump_requests.wake_fd.store(-1, std::memory_order_release);
    worker_.abandon_after_fork();
    close_watch_fd();
    new (&mu_) std::mutex();
    new (&launch_mu_) std::mutex();
    new (&done_cv_) std::condition_variable();
    if (signal_ != 0) {
      sys().sigaction(signal_, &previous_, nullptr);
      if (sfd_ >= 0) ::close(sfd_);
      sfd_ = -1;
      // The child's only thread is a copy of the forking one: it blocks the signal only because of
      // selfprof (start() never takes a signal its thread blocks), and an exec'd program must not inherit
      // that. routed_signal stays: a child that puts its saved mask back before exec (shells do) gets the
      // block off again from the preload library's exec hooks.
      if (blocked_) unblock_here(signal_);
    }
    signal_ = 0;
    blocked_ = false;
  }

  // Watch `server`'s lazy_listener() and call its start_on_demand() when a client connects (null: stop
  // watching). The server may stop meanwhile: it then starts nothing.
  void serve_on_demand(http_server* server) {
    on_demand_.store(server, std::memory_order_release);
    if (server && watch_fd_ >= 0) watch(server->lazy_listener());  // a client starts the dumper first
    // A running dumper's next wait watches it; one not started must not be woken (the wake would start it).
    std::lock_guard<std::mutex> lock(launch_mu_);
    if (worker_.running()) worker_.wake();
  }

  int signal_number() const { return signal_; }
  pid_t tid() const { return worker_.tid(); }
  unsigned long written() const { return written_.load(); }
  unsigned long failed() const { return failed_.load(); }
  const dump_settings& settings() const { return settings_; }

 private:
  static void main(void* self) { static_cast<auto_dumps*>(self)->loop(); }

  bool requests_waiting() {
    std::lock_guard<std::mutex> lock(mu_);
    return g_dump_requests.requests.load() != handled_;
  }

  // An epoll set of the eventfd and the signalfd (and the control socket, see serve_on_demand): readable
  // when any of them is. Left at -1 when it cannot be made: the dumper then starts at once.
  void make_watch_fd() {
    watch_fd_ = keep_fd_high(::epoll_create1(EPOLL_CLOEXEC));
    if (watch_fd_ >= 0 && (!watch(worker_.wake_fd()) || (sfd_ >= 0 && !watch(sfd_)))) close_watch_fd();
  }
  bool watch(int fd) {
    if (fd < 0) return true;
    struct epoll_event ev {};
    ev.events = EPOLLIN;
    ev.data.fd = fd;
    return ::epoll_ctl(watch_fd_, EPOLL_CTL_ADD, fd, &ev) == 0;
  }
  void close_watch_fd() {
    if (watch_fd_ >= 0) ::close(watch_fd_);
    watch_fd_ = -1;
  }

  static sigset_t only(int sig) {
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, sig);
    return set;
  }
  static void unblock_here(int sig) {
    const sigset_t set = only(sig);
    pthread_sigmask(SIG_UNBLOCK, &set, nullptr);
  }

  // Installs the dump handler when the signal is free (no handler of the program's, not blocked by the
  // calling thread), and blocks it in the calling thread so that only the dumper takes it.
  void take_signal(int sig, session_info& session) {
    if (sig <= 0) return;
    struct sigaction cur {};
    sys().sigaction(sig, nullptr, &cur);
    sigset_t mask;
    pthread_sigmask(SIG_BLOCK, nullptr, &mask);
    const char* why = nullptr;
    if ((cur.sa_flags & SA_SIGINFO) || (cur.sa_handler != SIG_DFL && cur.sa_handler != SIG_IGN))
      why = "already has a handler installed by the application";
    else if (sigismember(&mask, sig) == 1)
      why =
          "is blocked by the thread that starts selfprof (the program may wait for it with sigwait or "
          "signalfd)";
    if (why) {
      std::string n = "signal " + std::to_string(sig) + " " + why +
                      ": dumps on that signal are off (set SELFPROF_SIGNAL to another one)";
      session.note(n);
      std::fprintf(stderr, "selfprof: %s\n", n.c_str());
      return;
    }
    struct sigaction act {};
    act.sa_sigaction = &dump_signal_handler;
    act.sa_flags = SA_SIGINFO | SA_RESTART;
    sigfillset(&act.sa_mask);  // no application handler runs inside it (and jumps out)
    sigdelset(&act.sa_mask, SIGSYS);
    if (sys().sigaction(sig, &act, &previous_) != 0) return;
    signal_ = sig;
    const sigset_t set = only(sig);
    sfd_ = keep_fd_high(::signalfd(-1, &set, SFD_CLOEXEC | SFD_NONBLOCK));
    if (sfd_ < 0) return;  // the handler alone then: a request may land on any thread
    blocked_ = pthread_sigmask(SIG_BLOCK, &set, nullptr) == 0;
    blocker_tid_ = static_cast<pid_t>(raw_gettid());
    if (blocked_) g_dump_requests.routed_signal.store(sig, std::memory_order_release);
  }

  // Counts the dump signals waiting in the signalfd as requests.
  void read_signalfd() {
    struct signalfd_siginfo info[8];
    for (;;) {
      const ssize_t n = ::read(sfd_, info, sizeof info);
      if (n <= 0) return;
      g_dump_requests.requests.fetch_add(static_cast<std::uint64_t>(n) / sizeof info[0],
                                         std::memory_order_acq_rel);
    }
  }

  // Gives the signal back: requests already pending for blocked threads are taken here (counted, as the
  // handler would) so none meets the program's action, then the action is restored and, on the thread
  // that blocked it, the block is taken off. Another thread cannot change the starting thread's mask:
  // there the block stays (README.md says so).
  void give_signal_back() {
    if (signal_ == 0) return;
    const sigset_t set = only(signal_);
    sigset_t mask;
    pthread_sigmask(SIG_BLOCK, nullptr, &mask);
    if (sfd_ >= 0) {
      read_signalfd();
      ::close(sfd_);
      sfd_ = -1;
    }
    if (sigismember(&mask, signal_) == 1) {
      const struct timespec zero {};
      while (sigtimedwait(&set, nullptr, &zero) == signal_) g_dump_requests.requests.fetch_add(1);
    }
    sys().sigaction(signal_, &previous_, nullptr);
    if (blocked_ && blocker_tid_ == static_cast<pid_t>(raw_gettid())) {
      unblock_here(signal_);
      g_dump_requests.routed_signal.store(0, std::memory_order_release);
    }
    signal_ = 0;
    blocked_ = false;
  }

  std::chrono::steady_clock::duration interval() const {
    return std::chrono::duration_cast<std::chrono::steady_clock::duration>(
        std::chrono::duration<double>(opts_.interval_s));
  }

  void loop() {
    auto next = std::chrono::steady_clock::now() + interval();
    for (;;) {
      int timeout = -1;
      if (opts_.interval_s > 0) {
        const auto left = next - std::chrono::steady_clock::now();
        timeout =
            left <= std::chrono::steady_clock::duration::zero()
                ? 0
                : static_cast<int>(std::chrono::duration_cast<std::chrono::milliseconds>(left).count()) + 1;
      }
      bool signalled = false, connecting = false;
      http_server* server = on_demand_.load(std::memory_order_acquire);
      const int lazy = server ? server->lazy_listener() : -1;
      const bool stopping = !worker_.wait(timeout, sfd_, &signalled, lazy, &connecting);
      if (signalled) read_signalfd();
      if (connecting) server->start_on_demand();
      if (g_dump_requests.exit_requested.load(std::memory_order_acquire)) {
        exit_dump_();  // the process ends when this is written; nothing after it matters
        g_dump_requests.exit_done.store(1, std::memory_order_release);
        return;
      }
      const auto now = std::chrono::steady_clock::now();
      const bool due = !stopping && opts_.interval_s > 0 && now >= next;
      if (due) next = now + interval();
      const std::uint64_t requests = g_dump_requests.requests.load(std::memory_order_acquire);
      {
        std::lock_guard<std::mutex> lock(mu_);
        if (requests == handled_ && !due) {
          if (stopping) return;
          continue;
        }
        handled_ = requests;
        busy_ = true;
      }
      write();
      {
        std::lock_guard<std::mutex> lock(mu_);
        done_ = requests;
        busy_ = false;
      }
      done_cv_.notify_all();
      if (stopping) return;  // a request that came before stop() was answered
    }
  }

  void write() {
    std::uint64_t window_seq = 0;
    const bool windowed = opts_.window_s > 0;
    dump_contents c = snapshots_.contents(windowed, &window_seq);
    status st = write_dump(c, settings_);
    if (st) {
      ++written_;
      if (windowed) snapshots_.window_written(window_seq);
    } else {
      ++failed_;  // the cumulative profile is intact, and an unwritten window stays for the next dump
      std::fprintf(stderr, "%s\n", st.message().c_str());
    }
  }

  snapshot_maker& snapshots_;
  void (*exit_dump_)();
  std::atomic<http_server*> on_demand_{nullptr};
  options opts_;
  dump_settings settings_;
  worker worker_;
  std::mutex launch_mu_;  // launch() from the watcher, flush() and stop()
  int watch_fd_ = -1;     // see watch_fd()
  int signal_ = 0;
  int sfd_ = -1;           // signalfd of signal_, read by the dumper
  bool blocked_ = false;   // the starting thread's block of signal_ is selfprof's
  pid_t blocker_tid_ = 0;  // that thread
  struct sigaction previous_ {};
  std::mutex mu_;
  std::condition_variable done_cv_;
  std::uint64_t handled_ = 0, done_ = 0;
  bool busy_ = false;
  std::atomic<unsigned long> written_{0}, failed_{0};
};

}  // namespace detail
}  // namespace selfprof
// ---- end selfprof/core/auto_dumps.hpp ----
// ---- begin selfprof/core/endpoint.hpp ----
// The routes of the profile endpoint and the control socket (serve/server.hpp): Go's
// /debug/pprof/profile and index, and selfprof's flame graph, folded and top forms, each either of the
// next N seconds or (since=start) of everything collected so far. Also the bearer token file.
// Context: the server thread (routes: quick copies only) and the render thread (the jobs); setup reads
// the token file.
//
// A profile of the next N seconds is the difference of two snapshots of the one running session, taken
// when the request arrives and N seconds later: concurrent requests share the same sampling (no second
// profiler) and each costs a copy of the stack table while it waits. A thread that ends meanwhile under
// the memory ceiling's thread merge may move a few of its earlier samples into the window under thread 0.

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <memory>
#include <string>
#include <utility>


namespace selfprof {
namespace detail {

constexpr double kDefaultProfileSeconds = 30;  // Go's default for /debug/pprof/profile

// Reads the bearer token from `path`: a regular file of ours that no one else may read (mode 0600 or
// 0400), its first line without surrounding blanks, at least 16 characters.
inline status read_token_file(const std::string& path, std::string& token) {
  auto bad = [&](const std::string& why) {
    return status::error("selfprof: SELFPROF_HTTP_TOKEN_FILE=\"" + path + "\": " + why);
  };
  const int fd = ::open(path.c_str(), O_RDONLY | O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) return bad(std::strerror(errno));
  struct stat sb {};
  std::string text;
  if (::fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode)) {
    ::close(fd);
    return bad("not a regular file");
  }
  if (sb.st_uid != ::geteuid()) {
    ::close(fd);
    return bad("belongs to uid " + std::to_string(sb.st_uid) + ", not to this process's user");
  }
  if (sb.st_mode & 077) {
    ::close(fd);
    return bad("other users may read or write it (chmod 600 it)");
  }
  char buf[4097];
  const ssize_t n = ::read(fd, buf, sizeof buf);
  ::close(fd);
  if (n < 0) return bad(std::strerror(errno));
  if (n > 4096) return bad("longer than 4096 bytes");
  text.assign(buf, static_cast<std::size_t>(n));
  const std::size_t eol = text.find('\n');
  if (eol != std::string::npos) text.resize(eol);
  while (!text.empty() && (text.back() == '\r' || text.back() == ' ' || text.back() == '\t')) text.pop_back();
  std::size_t start = 0;
  while (start < text.size() && (text[start] == ' ' || text[start] == '\t')) ++start;
  text.erase(0, start);
  if (text.size() < 16) return bad("the token must be at least 16 characters");
  for (char c : text)
    if (static_cast<unsigned char>(c) < 0x21 || static_cast<unsigned char>(c) > 0x7e)
      return bad("the token must be printable ASCII without spaces");
  token = std::move(text);
  return status::ok();
}

// What a profile route serves.
struct profile_route {
  output_format format = output_format::pprof;
  const char* content_type = "application/octet-stream";
  const char* extra = "";  // more response fields
};

inline bool find_profile_route(const std::string& path, profile_route& r) {
  if (path == "/debug/pprof/profile" || path == "/debug/selfprof/profile.pb.gz") {
    r = {output_format::pprof, "application/octet-stream",
         "Content-Disposition: attachment; filename=\"profile\"\r\n"};
    return true;
  }
  if (path == "/debug/selfprof/flamegraph.svg") {
    r = {output_format::svg, "image/svg+xml", ""};
    return true;
  }
  if (path == "/debug/selfprof/folded") {
    r = {output_format::folded, "text/plain; charset=utf-8", ""};
    return true;
  }
  if (path == "/debug/selfprof/top") {
    r = {output_format::top, "text/plain; charset=utf-8", ""};
    return true;
  }
  return false;
}

inline std::string endpoint_index(const options& o) {
  const bool wall = o.mode == profile_mode::wall;
  std::string b =
      "<html><head><title>/debug/pprof/</title></head><body>\n/debug/pprof/ "
      "(selfprof " SELFPROF_VERSION_STRING
      ")<br>\n<br>\nProfile descriptions:\n<ul>\n"
      "<li><div><a href=\"profile?seconds=30\">profile</a>: ";
  b += wall ? "Wall-clock profile (on and off the CPU, in nanoseconds)" : "CPU profile";
  b += ". You can specify the duration in the seconds GET parameter (at most " +
       format_compact(o.http_max_seconds) +
       "); since=start gives everything since profiling started. After you get the profile file, use the "
       "go tool pprof command to investigate the profile.</div></li>\n"
       "<li><div><a href=\"/debug/selfprof/flamegraph.svg?seconds=30\">flamegraph.svg</a>: the same as an "
       "interactive flame graph</div></li>\n"
       "<li><div><a href=\"/debug/selfprof/folded?seconds=30\">folded</a>: folded stacks "
       "(flamegraph.pl's input)</div></li>\n"
       "<li><div><a href=\"/debug/selfprof/top?seconds=30\">top</a>: functions ranked by self and total "
       "samples</div></li>\n";
  if (wall) b += "<li><div>view=offcpu on any of them: only the time threads spent off the CPU</div></li>\n";
  b += "</ul>\n</body></html>\n";
  return b;
}

// The response bytes for a profile: symbolized, marker frames added, the off-CPU view when asked.
inline std::string profile_response(snapshot_maker& snapshots, const raw_snapshot& raw,
                                    const profile_route& r, bool offcpu, bool thread_roots) {
  profile p = snapshots.symbolize(raw);
  add_marker_frames(p, thread_roots);
  if (offcpu) p = offcpu_view(p);
  const std::string body = render(p, r.format, dump_output_options(p));
  return http_response_head(200, r.content_type, body.size(), r.extra) + body;
}

// The route of both listeners: see the top of this file.
inline http_answer answer_request(snapshot_maker& snapshots, const options& o, const http_request& req) {
  http_answer a;
  auto bad = [&](int code, const std::string& why) {
    a.bytes = http_error_response(code, why);
    return a;
  };
  if (req.path == "/debug/pprof/" || req.path == "/debug/pprof" || req.path == "/") {
    const std::string body = endpoint_index(o);
    a.bytes = http_response_head(200, "text/html; charset=utf-8", body.size()) + body;
    return a;
  }
  profile_route route;
  if (!find_profile_route(req.path, route))
    return bad(404, "no such page: " + req.path + " (see /debug/pprof/)");
  for (const auto& kv : req.query)
    if (kv.first != "seconds" && kv.first != "since" && kv.first != "view")
      return bad(400, "unknown query parameter \"" + kv.first + "\" (seconds, since, view)");
  bool since_start = false;
  if (const std::string* s = req.param("since")) {
    if (*s != "start") return bad(400, "since=\"" + *s + "\": the one value is since=start");
    since_start = true;
  }
  bool offcpu = false;
  if (const std::string* v = req.param("view")) {
    if (*v == "offcpu" && o.mode == profile_mode::wall)
      offcpu = true;
    else if (!(*v == "wall" && o.mode == profile_mode::wall) && !(*v == "cpu" && o.mode == profile_mode::cpu))
      return bad(400, "view=\"" + *v + "\": " +
                          (o.mode == profile_mode::wall ? "wall or offcpu"
                                                        : "cpu (offcpu needs SELFPROF_MODE=wall)"));
  }
  double seconds = kDefaultProfileSeconds;
  if (const std::string* s = req.param("seconds")) {
    if (since_start) return bad(400, "seconds and since=start cannot be combined");
    double v = 0;
    if (!parse_double(s->c_str(), 0, 1e9, v) || !(v > 0))
      return bad(400, "seconds=\"" + *s + "\": expected a number of seconds greater than 0");
    if (v > o.http_max_seconds)
      return bad(400, "seconds=" + *s + " is over this server's maximum, " +
                          format_compact(o.http_max_seconds) + " (SELFPROF_HTTP_MAX_SECONDS)");
    seconds = v;
  }
  if (seconds > o.http_max_seconds) seconds = o.http_max_seconds;
  const bool roots = o.thread_roots || o.mode == profile_mode::wall;
  snapshot_maker* maker = &snapshots;
  if (since_start) {
    a.due = serve_clock::now();
    a.job = [maker, route, offcpu, roots] {
      return profile_response(*maker, maker->raw(), route, offcpu, roots);
    };
    return a;
  }
  auto before = std::make_shared<raw_snapshot>(snapshots.raw());
  a.due = serve_clock::now() +
          std::chrono::duration_cast<serve_clock::duration>(std::chrono::duration<double>(seconds));
  a.job = [maker, route, offcpu, roots, before] {
    raw_snapshot after = maker->raw();
    after.table = stack_table::difference(after.table, before->table);
    after.info.duration_s -= before->info.duration_s;
    after.info.dropped =
        after.info.dropped > before->info.dropped ? after.info.dropped - before->info.dropped : 0;
    after.info.start_unix_ns =
        before->info.start_unix_ns + static_cast<std::uint64_t>(before->info.duration_s * 1e9);
    return profile_response(*maker, after, route, offcpu, roots);
  };
  return a;
}

}  // namespace detail
}  // namespace selfprof
// ---- end selfprof/core/endpoint.hpp ----
// ---- begin selfprof/dump/raw_dump.hpp ----
// The raw exit dump of `selfprof record --follow-exec`: instead of naming its frames, a process writes
// its stacks of addresses, the executable mappings they point into (with what identifies each file)
// and its threads to a private directory; `selfprof record` names them all at the end, reading each
// library's symbols once for every process (tools/selfprof/raw_merge.hpp reads this format).
// Context: any thread except the signal handler (the exit dump).
//
// Format "selfprof-raw 1", one record a line, numbers in decimal unless said:
//   selfprof-raw 1
//   pid PID
//   comm NAME                      the process name (/proc/self/comm)
//   info MODE UNIT HZ PERIOD_NS DROPPED START_UNIX_NS DURATION_S KERNEL_TIME SOURCE
//   note TEXT                      any number
//   map START END OFFSET MAJOR:MINOR INODE MTIME_NS SIZE PATH   hex START END OFFSET MAJOR MINOR; MTIME_NS
//                                  and SIZE of the file at PATH at exit, "-" when there is none
//   name PC TEXT                   hex PC: a JIT or perf-map address named by this process
//   thread TID NAME
//   stack TID FLAGS COUNT PC...    hex PCs, the interrupted pc first (as the stack table holds them)
//   end STACKS SAMPLES             last line: the file is complete

#include <sys/stat.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <string>
#include <unordered_set>
#include <vector>


namespace selfprof {
namespace detail {

constexpr const char* kRawDumpExtension = ".selfprof-raw";

inline bool is_raw_dump_path(const std::string& path) { return ends_with_ci(path, kRawDumpExtension); }

// Text with no newline (names and notes are one line each).
inline std::string raw_one_line(std::string s) {
  for (char& c : s)
    if (c == '\n' || c == '\r') c = ' ';
  return s;
}

inline void raw_hex(std::string& out, std::uint64_t v) {
  char buf[24];
  std::snprintf(buf, sizeof buf, "%llx", static_cast<unsigned long long>(v));
  out += buf;
}

// One "map" line for an executable mapping; the file's modification time and size tell the reader
// whether the file it opens later is still this one. (Not the inode: on overlay file systems stat and
// the maps disagree about it.)
inline void raw_map_line(std::string& out, const maps_entry& e) {
  out += "map ";
  raw_hex(out, e.start);
  out += ' ';
  raw_hex(out, e.end);
  out += ' ';
  raw_hex(out, e.offset);
  out += ' ';
  raw_hex(out, e.dev_major);
  out += ':';
  raw_hex(out, e.dev_minor);
  out += ' ' + std::to_string(e.inode) + ' ';
  struct stat sb {};
  const bool file = !e.path.empty() && e.path[0] == '/' && !e.deleted;
  if (file && ::stat(e.path.c_str(), &sb) == 0 && S_ISREG(sb.st_mode)) {
    const std::uint64_t mtime_ns = static_cast<std::uint64_t>(sb.st_mtim.tv_sec) * 1000000000u +
                                   static_cast<std::uint64_t>(sb.st_mtim.tv_nsec);
    out += std::to_string(mtime_ns) + ' ' + std::to_string(static_cast<std::uint64_t>(sb.st_size));
  } else {
    out += "- -";
  }
  out += ' ';
  out += e.path.empty() ? std::string("//anon") : e.path;
  out += '\n';
}

inline const char* raw_mode_name(profile_mode m) {
  return m == profile_mode::wall ? "wall" : m == profile_mode::offcpu ? "offcpu" : "cpu";
}

// The bytes of a raw dump of `raw`, taken in this process. `sym` names the JIT and perf-map tagged
// addresses (only when a stack holds one: those names exist only in this process).
inline std::string raw_dump_bytes(const raw_snapshot& raw, shared_symbolizer& sym, const std::string& comm) {
  std::string out =
      "selfprof-raw 1\npid " + std::to_string(::getpid()) + "\ncomm " + raw_one_line(comm) + "\n";
  const profile_info& i = raw.info;
  char buf[256];
  std::snprintf(buf, sizeof buf, "info %s %s %.17g %llu %llu %llu %.17g %d ", raw_mode_name(i.mode),
                i.unit.empty() ? "samples" : i.unit.c_str(), i.hz,
                static_cast<unsigned long long>(i.period_ns), static_cast<unsigned long long>(i.dropped),
                static_cast<unsigned long long>(i.start_unix_ns), i.duration_s, i.kernel_time ? 1 : 0);
  out += buf;
  out += i.source.empty() ? std::string("-") : raw_one_line(i.source);
  out += '\n';
  for (const std::string& n : i.notes) out += "note " + raw_one_line(n) + "\n";

  // The executable mappings now, then those the collector saw that are gone (a dlclose) where nothing
  // mapped now overlaps them. Only to name samples: a process that took none (most short-lived ones at
  // the default rate) reads neither.
  const bool sampled = !raw.table.entries().empty();
  std::string maps;
  std::vector<maps_entry> mapped;
  if (sampled && read_text_file("/proc/self/maps", maps))
    for_each_executable_mapping(maps, [&](const maps_entry& e) {
      raw_map_line(out, e);
      mapped.push_back(e);
    });
  if (sampled)
    sym.with_current([&](symbolizer& s) {
      for (const module& m : s.modules().modules()) {
        if (m.mapped || m.kind != module_kind::file) continue;
        bool overlaps = false;
        for (const maps_entry& e : mapped) overlaps = overlaps || (m.start < e.end && e.start < m.end);
        if (overlaps) continue;
        maps_entry e;
        e.start = m.start;
        e.end = m.end;
        e.offset = m.offset;
        e.inode = m.inode;
        e.dev_major = m.dev_major;
        e.dev_minor = m.dev_minor;
        e.deleted = m.deleted;
        e.path = m.path;
        raw_map_line(out, e);
        mapped.push_back(e);
      }
      return 0;
    });

  // Tagged addresses (JIT code named while sampling) are named here, where their names live.
  std::unordered_set<std::uint64_t> tagged;
  for (const auto& e : raw.table.entries()) {
    const std::uint64_t* pcs = raw.table.pcs(e);
    for (std::size_t k = 0; k < e.depth; ++k)
      if (is_jit_tagged(pcs[k]) || is_perf_map_tagged(pcs[k])) tagged.insert(k == 0 ? pcs[k] : pcs[k] - 1);
  }
  if (!tagged.empty()) {
    sym.with_fresh([&](symbolizer& s) {
      std::vector<frame> frames;
      for (std::uint64_t pc : tagged) {
        frames.clear();
        s.resolve(pc, frames);
        out += "name ";
        raw_hex(out, pc);
        out += ' ' + raw_one_line(frames.empty() ? std::string("[unknown]") : frames.front().name) + "\n";
      }
      return 0;
    });
  }
  for (const auto& t : raw.thread_names)
    out += "thread " + std::to_string(t.first) + " " + raw_one_line(t.second) + "\n";
  std::uint64_t samples = 0;
  for (const auto& e : raw.table.entries()) {
    out += "stack " + std::to_string(e.tid) + " " + std::to_string(e.flags) + " " + std::to_string(e.count);
    const std::uint64_t* pcs = raw.table.pcs(e);
    for (std::size_t k = 0; k < e.depth; ++k) {
      out += ' ';
      raw_hex(out, pcs[k]);
    }
    out += '\n';
    samples += e.count;
  }
  out += "end " + std::to_string(raw.table.entries().size()) + " " + std::to_string(samples) + "\n";
  return out;
}

// Writes the raw dump to `path` (atomic, 0600; see sink.hpp). No fsync: the recorder reads it as soon as
// the process has ended, and a crash of the machine loses the recording anyway.
inline status write_raw_dump(const raw_snapshot& raw, shared_symbolizer& sym, const std::string& path,
                             sink_options sink) {
  sink.sync = false;
  return write_file_atomic(path, raw_dump_bytes(raw, sym, program_name()), sink);
}

}  // namespace detail
}  // namespace selfprof
// ---- end selfprof/dump/raw_dump.hpp ----
// ---- begin selfprof/sources/select.hpp ----
// Picks the tick source: `auto` takes the cheapest mechanism that honours the request (rate, kernel
// time, even coverage of threads) and records why each earlier one was refused.
// Context: setup only.

#include <signal.h>

#include <cstdio>
#include <functional>
#include <memory>
#include <string>
#include <vector>

// ---- begin selfprof/sources/itimer.hpp ----
// Tick source: the process-wide setitimer(ITIMER_PROF), the last resort (one signal per tick for the whole
// process, delivered to whichever thread is running: uneven across threads).
// Context: setup only and the collector thread.

#include <sys/time.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <string>


namespace selfprof {
namespace detail {

class itimer_source final : public tick_source {
 public:
  ~itimer_source() override { close(); }
  source_kind kind() const override { return source_kind::itimer; }
  std::string describe() const override { return "process-wide setitimer(ITIMER_PROF)"; }
  bool per_thread() const override { return false; }
  bool counts_kernel_time() const override { return true; }
  double effective_hz() const override { return std::min(config_.hz, kernel_tick_hz()); }
  std::size_t armed_count() const override { return armed_ ? 1 : 0; }

  status open(const source_config& config) override {
    config_ = config;
    if (config.signal_number != SIGPROF)
      return status::error("setitimer(ITIMER_PROF) can only deliver SIGPROF, which is taken");
    struct itimerval v {};
    std::int64_t ns = period_ns_for(config.hz);
    v.it_interval.tv_sec = static_cast<time_t>(ns / 1000000000);
    v.it_interval.tv_usec = static_cast<suseconds_t>((ns % 1000000000) / 1000);
    if (v.it_interval.tv_sec == 0 && v.it_interval.tv_usec == 0) v.it_interval.tv_usec = 1;
    v.it_value = v.it_interval;
    if (sys().setitimer(ITIMER_PROF, &v, nullptr) != 0)
      return status::error(std::string("setitimer(ITIMER_PROF): ") + std::strerror(errno));
    armed_ = true;
    return status::ok();
  }
  status arm(pid_t) override { return status::ok(); }
  void disarm(pid_t) override { reap_altstacks(); }  // a thread that ended (signal/altstack.hpp)
  void close() override {
    reap_altstacks();
    if (!armed_) return;
    struct itimerval off {};
    sys().setitimer(ITIMER_PROF, &off, nullptr);
    armed_ = false;
  }
  // Interval timers are not inherited by fork(2).
  void abandon_after_fork() override { armed_ = false; }

 private:
  source_config config_;
  bool armed_ = false;
};

}  // namespace detail
}  // namespace selfprof
// ---- end selfprof/sources/itimer.hpp ----

namespace selfprof {
namespace detail {

struct source_choice {
  std::unique_ptr<tick_source> source;
  std::string reason;                // why this one was taken
  std::vector<std::string> refused;  // why earlier ones were not
};

inline std::unique_ptr<tick_source> make_source(source_kind k) {
  switch (k) {
    case source_kind::perf:
      return std::unique_ptr<tick_source>(new perf_event_source());
    case source_kind::timer:
      return std::unique_ptr<tick_source>(new cpu_timer_source());
    case source_kind::itimer:
      return std::unique_ptr<tick_source>(new itimer_source());
    case source_kind::ring:
      return std::unique_ptr<tick_source>(new perf_ring_source());
    default:
      return nullptr;
  }
}

// The decision (bench/overhead.cpp measures it; figures in docs/measurements.md). First the ring: the
// kernel writes samples into buffers that the collector reads, so no signal ever reaches the program (no
// EINTR, no handler to conflict with, nothing pending at exec) and the cost per sample is perf record's.
// Where it cannot open (perf_event refused, descriptors or locked memory used up), the signal sources: a
// CPU-timer tick costs far less than a perf_event tick, whose hrtimer interrupt is expensive in virtual
// machines. Up to the kernel tick rate both deliver the requested rate and count kernel time, so the
// timer wins. Above it a CPU timer fires at most once per tick (the rest only show up as si_overrun), so
// perf_event is taken: with kernel time when it opens; user-only otherwise, which delivers the rate but
// cannot see time spent in syscalls (said in the reason). The itimer is the last resort: one signal per
// tick for the whole process, uneven across threads.
// `signal_ready`, when given, is called once before the first signal source is tried: it installs the
// sampling handler and sets cfg.signal_number, so a process the ring samples never has selfprof's handler
// (and does not pay for installing it); its error refuses every signal source.
inline source_choice choose_source(source_kind requested, source_config cfg,
                                   const std::function<status(source_config&)>& signal_ready = nullptr) {
  source_choice out;
  char buf[160];
  const double tick = kernel_tick_hz();
  std::vector<std::pair<source_kind, bool>> order;  // kind, allow user-only perf
  // `auto` and SELFPROF_SOURCE=ring try the ring first; where it cannot open, the signal sources follow,
  // and the refusal says why.
  const bool ring_forced = requested == source_kind::ring;
  const bool ring_first = ring_forced || requested == source_kind::automatic;
  if (ring_forced) requested = source_kind::automatic;
  if (ring_first) {
    auto ring = make_source(source_kind::ring);
    status st = ring->open(cfg);
    if (st) {
      out.reason = ring_forced ? "forced by SELFPROF_SOURCE/options"
                               : "the kernel writes samples into ring buffers: no signal reaches the program";
      out.source = std::move(ring);
      return out;
    }
    out.refused.push_back(std::string(source_name(source_kind::ring)) + ": " + st.message());
  }
  if (signal_ready) {
    status st = signal_ready(cfg);
    if (!st) {
      out.refused.push_back("signal sources: " + st.message());
      return out;
    }
  }
  if (requested == source_kind::automatic) {
    if (cfg.hz <= tick)
      order = {{source_kind::timer, false}, {source_kind::perf, false}, {source_kind::itimer, false}};
    else
      order = {{source_kind::perf, false},
               {source_kind::perf, true},
               {source_kind::timer, false},
               {source_kind::itimer, false}};
    // The itimer delivers SIGPROF only: tried here when that is the sampling signal; otherwise the caller
    // takes SIGPROF and asks for the itimer itself when nothing else opened.
    if (cfg.signal_number != SIGPROF) order.pop_back();
  } else {
    order = {{requested, requested == source_kind::perf}};
  }
  for (auto& o : order) {
    auto src = make_source(o.first);
    cfg.allow_user_only = o.second;
    status st = src->open(cfg);
    if (!st) {
      std::string name = source_name(o.first);
      if (o.first == source_kind::perf) name += o.second ? " (user-only)" : " (with kernel time)";
      out.refused.push_back(name + ": " + st.message());
      continue;
    }
    if (requested != source_kind::automatic) {
      out.reason = std::string("forced by SELFPROF_SOURCE/options");
    } else if (o.first == source_kind::timer && cfg.hz <= tick) {
      std::snprintf(buf, sizeof buf,
                    "cheapest source that honours %g Hz (<= kernel tick %g Hz) and counts kernel time",
                    cfg.hz, tick);
      out.reason = buf;
    } else if (o.first == source_kind::perf) {
      std::snprintf(buf, sizeof buf, "%g Hz is above the kernel tick (%g Hz) that limits CPU timers", cfg.hz,
                    tick);
      out.reason = buf;
      if (src->counts_kernel_time() == false)
        out.reason += "; user-only event: time in the kernel is not sampled";
    } else if (o.first == source_kind::timer) {
      std::snprintf(buf, sizeof buf,
                    "perf_event unavailable; timer ticks are limited to %g Hz and weighted by overruns",
                    tick);
      out.reason = buf;
    } else {
      out.reason = "last resort: per-thread sources unavailable (samples are uneven across threads)";
    }
    if (ring_first && !out.refused.empty())
      out.reason = "fell back from the ring source (" + out.refused.front() + "); " + out.reason;
    out.source = std::move(src);
    return out;
  }
  return out;
}

// Wall mode (wall/sampler.hpp): on-CPU stacks come only from a user-only software task clock, whose
// ticks never land in the kernel, so they cannot turn a blocking call into EINTR. CPU timers and the
// itimer can, and are refused even when asked for. No usable event: no signals at all (CPU time is then
// counted without stacks), which the reason says.
inline source_choice choose_wall_source(source_kind requested, source_config cfg) {
  source_choice out;
  if (requested == source_kind::timer || requested == source_kind::itimer) {
    out.refused.push_back(std::string(source_name(requested)) +
                          ": refused in wall mode (it can fire while a thread is in the kernel on its way to "
                          "sleep, and the blocking call then fails with EINTR)");
    return out;
  }
  cfg.user_clock_only = true;
  auto src = make_source(source_kind::perf);
  status st = src->open(cfg);
  if (!st) {
    out.refused.push_back("perf (user-only task clock): " + st.message());
    return out;
  }
  out.reason = "wall mode: a user-only task clock never interrupts a blocking call";
  out.source = std::move(src);
  return out;
}

}  // namespace detail
}  // namespace selfprof
// ---- end selfprof/sources/select.hpp ----

namespace selfprof {
namespace detail {

// The sample ring holds about this long of samples from 16 busy threads (at least 512 slots): the
// collector wakes early when it is half full, and otherwise every kCollectorBusyWakeMs. It never takes
// more than a quarter of options::max_memory (down to kRingMinSlots slots).
constexpr double kRingSeconds = 0.2;
constexpr std::size_t kRingThreads = 16;
constexpr std::size_t kRingMinSlots = 64;

// How options::max_memory is shared (see its comment): the ring's part, then of what the ring leaves,
// the stack tables' (the cumulative table, and the window buckets with SELFPROF_WINDOW).
struct memory_shares {
  std::size_t ring = 0, table = 0, windows = 0;
};
inline memory_shares share_memory(std::size_t max_memory, std::size_t ring_bytes, bool windows) {
  memory_shares m;
  m.ring = max_memory / 4;
  const std::size_t rest = max_memory > ring_bytes ? max_memory - ring_bytes : 0;
  const std::size_t tables = rest / 5 * 2;
  m.table = windows ? tables / 2 : tables;
  m.windows = windows ? tables - m.table : 0;
  return m;
}

class profiler_core {
 public:
  static profiler_core& instance() {
    static profiler_core* core = new profiler_core();  // never destroyed: usable from atexit and signals
    return *core;
  }

  // Never throws: a failed allocation (the ring, a table) makes it return an error.
  status start(const options& opts) {
    std::lock_guard<std::mutex> control(control_mu_);
    if (running_) return status::ok();
    starting_threads_ = false;
    try {
      const std::uint64_t cpu0 = this_thread_cpu_ns(), wall0 = monotonic_ns();
      process_cpu0_ = process_cpu_ns();
      own_cpu0_ = workers_cpu_ns();
      status st = start_locked(opts);
      start_cpu_ms_ = static_cast<double>(this_thread_cpu_ns() - cpu0) / 1e6;
      start_wall_ms_ = static_cast<double>(monotonic_ns() - wall0) / 1e6;
      if (st && opts_.verbose)
        std::fprintf(stderr, "selfprof: start took %.2f ms of CPU (%.2f ms wall)\n", start_cpu_ms_,
                     start_wall_ms_);
      return st;
    } catch (const std::exception& e) {
      return start_threw(std::string("selfprof: start failed: ") + e.what());
    } catch (...) {
      return start_threw("selfprof: start failed: unknown exception");
    }
  }

 private:
  status start_threw(const std::string& why) {
    if (starting_threads_) {
      running_ = true;  // stop_locked() undoes everything started so far
      stop_locked();
    } else {
      fail_start(status::ok());
    }
    return status::error(why);
  }

  status start_locked(const options& opts) {
    install_fork_handlers_once();
    if (opts.mode == profile_mode::offcpu)
      return status::error("selfprof: mode offcpu names profiles; start in cpu or wall mode");
    opts_ = opts;
    wall_ = opts_.mode == profile_mode::wall;
    if (wall_) opts_.thread_roots = true;  // per-thread roots: a pool's idle workers show as idle
    if (opts_.max_depth < 2) opts_.max_depth = 2;
    if (opts_.max_depth > 1024) opts_.max_depth = 1024;
    session_.clear();
    registry_.clear_names();
    symbols_.set_lines(opts_.lines);
    if (opts_.max_memory < kMinMaxMemory) {
      notes_.push_back("max_memory raised to the smallest ceiling, " + std::to_string(kMinMaxMemory >> 20) +
                       " MiB");
      opts_.max_memory = kMinMaxMemory;
    }
    status st = prepare_ring();
    if (!st) return fail_start(st);
    st = check_no_other_copy();  // the ring installs no handler, but defers to a copy that did
    if (!st) return fail_start(st);
    st = choose_tick_source();
    if (!st) return fail_start(st);
    prepare_unwind();
    if (!unwind_ok_) return fail_start(unwind_error_);
    store_config sc;
    sc.wall = wall_;
    sc.hz = opts_.hz;
    sc.window_s = opts_.window_s;
    sc.frame_budget_ms = opts_.frame_budget_ms;
    sc.frame_hz = opts_.frame_hz;
    sc.max_depth = opts_.max_depth;
    const memory_shares shares = share_memory(opts_.max_memory, ring_memory_.size() * 8, opts_.window_s > 0);
    sc.table_limit = shares.table;
    sc.window_limit = shares.windows;
    store_.begin(sc);
    snapshots_.begin(opts_, handler_counts::now());
    g_handler.active.store(true, std::memory_order_release);
    // Threads alive now: a signal source arms them (selfprof's own, the JIT flusher, left out). The ring
    // covers them without arming: the collector's first wake scans for their names.
    if (!pull_) registry_.scan(running_worker_tids());
    starting_threads_ = true;
    st = start_threads();
    if (!st) {
      running_ = true;  // stop_locked() undoes everything started so far
      stop_locked();
      return st;
    }
    for (auto& n : notes_) session_.note(n);
    notes_.clear();
    if (!opts_.out.empty()) install_exit_dump_once();
    session_ran_ = true;
    session_pid_ = ::getpid();
    starting_threads_ = false;
    running_ = true;
    if (opts_.verbose) std::fprintf(stderr, "%s", describe_locked().c_str());
    return status::ok();
  }

 public:
  status stop() {
    std::lock_guard<std::mutex> control(control_mu_);
    return stop_locked();
  }

  bool running() const { return running_; }
  bool thread_roots() const { return opts_.thread_roots; }
  // The signal ticks arrive on while sampling runs, else 0.
  int sample_signal() const { return running_ ? sample_signal_ : 0; }
  int dump_signal() const { return running_ ? dump_signal_ : 0; }

  // The options of the running (or last) session, as start() applied them.
  options current_options() {
    std::lock_guard<std::mutex> control(control_mu_);
    return opts_;
  }

  // Arms the calling thread now (instead of at the next scan) and unblocks the sampling signal in it.
  // `unblock`: also unblock the sampling signal in the thread (the API); the preload library arms new
  // threads without touching their signal mask.
  status register_current_thread(bool unblock = true) {
    if (!running_) return status::error("selfprof: register_thread() called while not profiling");
    arm_thread_altstack();  // from the thread itself, before its first tick (signal/altstack.hpp)
    return registry_.register_current(signal_.number, unblock);
  }

  // A copy of everything collected so far (drains the ring first); the profile stays in place.
  raw_snapshot snapshot_raw(bool windowed = false, std::uint64_t* window_seq = nullptr) {
    return snapshots_.raw(windowed, window_seq);
  }
  profile symbolize(const raw_snapshot& raw) { return snapshots_.symbolize(raw); }
  profile snapshot() { return symbolize(snapshot_raw()); }
  snapshot_maker& snapshots() { return snapshots_; }
  shared_symbolizer& symbols() { return symbols_; }  // the process's one symbolizer (tests)

  // The one dump path with the session's settings and `paths` (the API's dump()).
  status dump(const std::string& paths) {
    dump_settings s = dump_settings_for(paths);
    dump_contents c = snapshots_.contents();
    return write_dump(c, s);
  }
  dump_settings dump_settings_for(const std::string& paths) const {
    dump_settings s;
    s.paths = paths;
    s.sink.allow_shared_dir = opts_.allow_shared_dir;
    s.thread_roots = opts_.thread_roots;
    s.frame_budget_ms = opts_.frame_budget_ms;
    return s;
  }

  // Waits until the signal and interval dumps requested so far are written.
  void flush_dumps() { dumps_.flush(); }

  stats get_stats() {
    stats s;
    s.running = running_;
    s.mode = opts_.mode;
    s.hz = opts_.hz;
    s.sample_signal = sample_signal_;
    s.unwind = unwind_;
    const source_info src = session_.source();
    s.source = src.kind;
    s.source_detail = src.detail;
    s.source_reason = src.reason;
    s.effective_hz = src.effective_hz;
    s.kernel_time = wall_ || src.kernel_time;
    s.refused = session_.refused();
    session_.notes(s.notes);
    const thread_counts tc = registry_.counts();
    s.threads_seen = tc.seen;
    s.threads_armed = tc.armed;
    s.threads_fallback = tc.fallback;
    s.threads_arm_failed = tc.arm_failed;
    if (running_) s.threads_blocking_signal = registry_.blocking(signal_.number);
    const handler_counts h = snapshots_.counts();
    // Records and their losses: the handler's, and the ring source's (one of the two counts).
    s.records = h.taken + pulled_.records.load(std::memory_order_relaxed);
    s.dropped_full = h.full + pulled_.full.load(std::memory_order_relaxed);
    s.dropped_inactive = h.inactive;
    s.foreign_signals = h.foreign;
    s.truncated = h.truncated + pulled_.truncated.load(std::memory_order_relaxed);
    s.thread_checks = h.thread_checks;
    s.thread_wakes = h.thread_wakes;
    s.rate_capped = h.rate_capped;
    s.periods_skipped = h.periods_skipped;
    s.collector_wakes = collector_.wakes();
    s.start_cpu_ms = start_cpu_ms_;
    s.start_wall_ms = start_wall_ms_;
    const std::uint64_t process_now = running_ ? process_cpu_ns() : process_cpu_end_;
    const std::uint64_t own_now = running_ ? workers_cpu_ns() : own_cpu_end_;
    s.process_cpu_ns = process_now > process_cpu0_ ? process_now - process_cpu0_ : 0;
    s.own_cpu_ns = own_now > own_cpu0_ ? own_now - own_cpu0_ : 0;
    if (unwind_ == unwind_mode::dwarf) {
      const unwind_tables_info u = get_unwind_tables_info();
      s.unwind_modules_parsed = u.parsed;
      s.unwind_modules_pending = u.pending;
      s.unwind_rows = u.rows;
      s.unwind_parse_ms = u.parse_ms;
    }
    s.kernel_lost = pulled_.lost.load(std::memory_order_relaxed);
    s.kernel_throttles = pulled_.throttles.load(std::memory_order_relaxed);
    s.ring_user_chain = pulled_.user_chain_since_ns.load(std::memory_order_relaxed) != 0;
    s.ring_chain_cut = pulled_.chain_cut.load(std::memory_order_relaxed);
    s.ring_chain_given_back = pulled_.chain_given_back.load(std::memory_order_relaxed);
    s.ring_pages = pulled_.ring_pages.load(std::memory_order_relaxed);
    s.ring_grow_overlap = pulled_.overlap.load(std::memory_order_relaxed);
    const sample_store::sizes z = store_.size();
    s.samples = z.samples;
    s.unique_stacks = z.unique;
    s.table_bytes = z.bytes;
    s.max_memory = opts_.max_memory;
    s.ring_slots = ring_.capacity();
    s.ring_bytes = ring_memory_.size() * 8;
    s.ring_clipped = ring_clipped_;
    const merge_counts m = store_.merged();
    s.stacks_merged = m.stack_records;
    s.samples_merged = m.samples;
    s.threads_merged = m.threads;
    s.samples_by_thread = store_.samples_by_thread();
    if (wall_) s.wall = wall_sampler_.counters();
    s.dump_signal = dump_signal_;
    s.dumps_written = dumps_.written();
    s.dumps_failed = dumps_.failed();
    if (running_) {
      s.http.address = server_.address();
      s.http.control = server_.control_name();
    }
    const server_counters sc = server_.counters();
    s.http.connections = sc.connections;
    s.http.requests = sc.requests;
    s.http.bad_requests = sc.bad_requests;
    s.http.unauthorized = sc.unauthorized;
    s.http.refused = sc.refused;
    s.http.timeouts = sc.timeouts;
    s.http.failures = sc.failures;
    return s;
  }

  std::string describe() {
    std::lock_guard<std::mutex> control(control_mu_);
    return describe_locked();
  }

  // What a normal exit runs when SELFPROF_OUT is set: the last session's profile is written there, whether
  // the session still runs (it is stopped first, so every sample is in it) or was stopped before. Only in
  // the process that ran the session: a forked child's exit writes nothing.
  // `on_dumper`: run by the dumper thread for a process ending through _exit(), which keeps that thread.
  void exit_dump(bool on_dumper = false) {
    if (!session_ran_ || session_pid_ != ::getpid() || opts_.out.empty()) return;
    {
      std::lock_guard<std::mutex> control(control_mu_);
      stop_locked(true, on_dumper);  // the dump signal stays taken: the process ends after this
    }
    if (is_raw_dump_path(opts_.out)) {
      // `selfprof record --follow-exec`: named by the recorder. Silent when it fails: a process that
      // outlives the recording (a daemon) finds the directory gone, and its stderr is the program's.
      (void)write_raw_dump(snapshots_.raw(false, nullptr, true), symbols_,
                           expand_path_template(opts_.out, fields_now(next_dump_number())),
                           dump_settings_for(opts_.out).sink);
      return;
    }
    dump_contents c = snapshots_.contents();
    status st = write_dump(c, dump_settings_for(opts_.out));
    if (!st) std::fprintf(stderr, "%s\n", st.message().c_str());
  }

  // fork(2), see core/fork.hpp: every lock is taken before the fork, so no copy is held by a thread that
  // does not exist in the child; the child forgets the parent's threads and kernel objects.
  // The symbolizer's lock is the exception: a dump may hold it for seconds while it names frames, so
  // fork() waits for it only briefly (see shared_symbolizer::lock_for_fork_briefly), and a child that did
  // not get it starts with a fresh symbolizer.
  void fork_prepare() {
    control_mu_.lock();
    registry_.lock_for_fork().lock();
    store_.lock_for_fork().lock();
    symbols_locked_for_fork_ = symbols_.lock_for_fork_briefly();
  }
  void fork_parent() {
    if (symbols_locked_for_fork_) symbols_.lock_for_fork().unlock();
    store_.lock_for_fork().unlock();
    registry_.lock_for_fork().unlock();
    control_mu_.unlock();
  }
  void fork_child();

 private:
  profiler_core() = default;

  // Sizes the ring from the rate (or options::ring_slots), clipped to its part of max_memory; an
  // allocation that fails is an error, never an exception out of start().
  status prepare_ring() {
    std::size_t want = opts_.ring_slots ? opts_.ring_slots
                                        : static_cast<std::size_t>(opts_.hz * kRingThreads * kRingSeconds);
    std::size_t cap = 512;
    while (cap < want && cap < (1u << 20)) cap <<= 1;
    const std::size_t stride = sample_ring::stride_for(opts_.max_depth);
    const std::size_t share = share_memory(opts_.max_memory, 0, false).ring;
    ring_clipped_ = false;
    while (cap > kRingMinSlots && cap * stride > share) {
      cap >>= 1;
      ring_clipped_ = true;
    }
    if (ring_clipped_)
      notes_.push_back("sample ring clipped to " + std::to_string(cap) + " slots (" +
                       std::to_string(cap * stride >> 10) + " KiB, a quarter of SELFPROF_MAX_MEMORY " +
                       std::to_string(opts_.max_memory >> 20) +
                       " MiB): samples the collector cannot take in time are dropped and counted");
    // Kept across restarts when the size is the same: init() resets every slot's sequence word, and
    // a slot's other bytes are written before it is published (a new zeroed block would page-fault again).
    const std::size_t ring_words = cap * stride / 8;
    bool zeroed = false;
    if (ring_memory_.size() != ring_words) {
      g_handler.ring.store(nullptr, std::memory_order_release);
      ring_memory_.release();  // the old block goes first: never both at once
      zeroed = ring_memory_.allocate(ring_words);
      if (!zeroed) {
        return status::error("selfprof: cannot allocate the sample ring (" + std::to_string(ring_words * 8) +
                             " bytes for " + std::to_string(cap) + " slots of " +
                             std::to_string(opts_.max_depth) +
                             " frames); lower SELFPROF_MAX_MEMORY, "
                             "SELFPROF_HZ or SELFPROF_MAX_DEPTH");
      }
    }
    ring_.init(ring_memory_.data(), cap, opts_.max_depth, zeroed);
    g_handler.main_tid.store(static_cast<std::uint32_t>(::getpid()), std::memory_order_relaxed);
    g_handler.ring.store(&ring_, std::memory_order_release);
    return status::ok();
  }

  // The sampling handler, for a source that signals: installed before such a source opens (its first tick
  // may come at once), after the main thread's stack end that its walks stop at is known.
  status install_handler(source_config& cfg) {
    // A forced itimer can only deliver SIGPROF.
    const int wanted =
        opts_.sample_signal == 0 && opts_.source == source_kind::itimer ? SIGPROF : opts_.sample_signal;
    g_handler.main_stack_end.store(main_stack_end(), std::memory_order_relaxed);
    status st = install_sample_handler(wanted, signal_, notes_);
    if (!st) return st;
    sample_signal_ = signal_.number;
    cfg.signal_number = signal_.number;
    return status::ok();
  }

  status choose_tick_source() {
    source_config cfg;
    cfg.hz = opts_.hz;
    cfg.max_depth = opts_.max_depth;
    // The ring signals nothing: `auto` and a forced ring install the handler only when the ring is refused.
    const bool ring_first =
        !wall_ && (opts_.source == source_kind::automatic || opts_.source == source_kind::ring);
    if (!ring_first) {
      status st = install_handler(cfg);
      if (!st) return st;
    }
    std::function<status(source_config&)> signal_ready;
    if (ring_first) signal_ready = [this](source_config& c) { return install_handler(c); };
    source_choice choice =
        wall_ ? choose_wall_source(opts_.source, cfg) : choose_source(opts_.source, cfg, signal_ready);
    cfg.signal_number = signal_.number;  // installed on the way, or 0 (the ring)
    if (!choice.source && !wall_ && opts_.source == source_kind::automatic && opts_.sample_signal == 0 &&
        signal_.number != SIGPROF) {
      // Only the itimer is left, and it delivers SIGPROF alone: sample on SIGPROF when it is free.
      installed_signal on_prof;
      if (install_sample_handler(SIGPROF, on_prof, notes_)) {
        restore_sample_handler(signal_);
        signal_ = on_prof;
        sample_signal_ = SIGPROF;
        cfg.signal_number = SIGPROF;
        source_choice again = choose_source(source_kind::itimer, cfg);
        for (auto& r : again.refused) choice.refused.push_back(r);
        if (again.source) {
          choice.source = std::move(again.source);
          choice.reason = "last resort: per-thread sources unavailable (samples are uneven across threads)";
        }
      }
    }
    session_.set_refused(choice.refused);
    const bool forced = opts_.source != source_kind::automatic;
    if (!choice.source && (!wall_ || forced)) {
      std::string why = wall_ ? "selfprof: wall mode cannot use the requested source"
                              : "selfprof: no tick source works here";
      for (auto& r : choice.refused) why += "; " + r;
      return status::error(why);
    }
    source_config_ = cfg;
    source_info s;
    if (choice.source) {
      s.kind = choice.source->kind();
      s.detail = choice.source->describe();
      s.reason = choice.reason;
      s.effective_hz = choice.source->effective_hz();
      s.kernel_time = choice.source->counts_kernel_time();
    } else {  // wall mode without signals: the sampler counts CPU time from the CPU clocks
      s.kind = source_kind::none;
      s.detail = "wall sampler only (no on-CPU stacks)";
      s.reason = "no user-only perf_event: CPU time is counted as [running], without stacks";
      s.effective_hz = opts_.hz;
    }
    session_.set_source(s);
    if (wall_ && choice.source)
      notes_.push_back(
          "wall mode: on-CPU stacks from user-only ticks; CPU time spent in the kernel is not in them");
    upgrade_ = !wall_ && !forced && choice.source && choice.source->kind() == source_kind::timer;
    pull_ = choice.source && choice.source->pulls_samples() ? choice.source.get() : nullptr;
    pulled_ = pulled_counts{};
    if (pull_) {  // no signal is ever sent: the sampling handler goes
      restore_sample_handler(signal_);
      sample_signal_ = 0;
    }
    oncpu_ticks_ = choice.source != nullptr;
    registry_.begin(std::move(choice.source), cfg);
    return status::ok();
  }

  void prepare_unwind() {
    unwind_ = unwind_mode::fp;
    unwind_ok_ = true;
    if (opts_.unwind == unwind_mode::fp) return;
    if (opts_.unwind == unwind_mode::automatic) {
      // The collector parses a module's rows once samples reached its code: a process never pays for the
      // .eh_frame of code it does not run, and until then the handler walks frame pointers there.
      unwind_ = unwind_mode::dwarf;
      return;
    }
    status u = build_unwind_tables();  // SELFPROF_UNWIND=dwarf: rows from the first sample, or an error
    if (u) {
      unwind_ = unwind_mode::dwarf;
      return;
    }
    if (opts_.unwind == unwind_mode::dwarf) {
      unwind_ok_ = false;
      unwind_error_ = u;
      return;
    }
    notes_.push_back(u.message() + "; unwinding with frame pointers only");
  }

  // Starts selfprof's threads: the automatic dumps and the wall sampler first, so the collector knows
  // their tids and never arms them.
  status start_threads() {
    // The dumper starts at the first dump request (or at once, for an interval); the collector watches.
    status st = dumps_.start(opts_, session_, true);
    if (!st) return st;
    dump_signal_ = dumps_.signal_number();
    st = start_server();
    if (!st) return st;
    if (wall_) {
      wall_config wc;
      wc.hz = opts_.hz;
      wc.oncpu_signals = oncpu_ticks_;
      wc.ring = &ring_;
      wc.wake_fd = &g_handler.wake_fd;
      st = wall_sampler_.start(wc);
      if (!st) return st;
      std::uint64_t generation = ~std::uint64_t(0);
      std::vector<pid_t> tids;
      registry_.list_if_changed(generation, tids);
      wall_sampler_.set_threads(tids);
    }
    collector_config cc;
    cc.ring = &ring_;
    cc.store = &store_;
    cc.threads = &registry_;
    cc.session = &session_;
    cc.symbols = &symbols_;
    cc.sources = source_config_;
    cc.upgrade = upgrade_;
    cc.wall = wall_;
    cc.unwind_rows = unwind_ == unwind_mode::dwarf;
    cc.lazy_rows = cc.unwind_rows && opts_.unwind == unwind_mode::automatic;
    cc.sample_signal = signal_.number;
    cc.pull = pull_;
    cc.pulled = &pulled_;
    cc.sampler = wall_ ? &wall_sampler_ : nullptr;
    cc.standby_fd = dumps_.watch_fd();
    cc.standby_launch = &auto_dumps::launch_from;
    cc.standby_context = &dumps_;
    st = collector_.start(cc);
    if (!st) return st;
    return status::ok();
  }

  // The profile endpoint and the control socket (core/endpoint.hpp), when asked for.
  status start_server() {
    server_config sc;
    sc.http = opts_.http;
    sc.control = opts_.control;
    sc.head_timeout_s = opts_.http_head_timeout_s;
    if (!opts_.http_token_file.empty()) {
      if (opts_.http.empty())
        return status::error(
            "selfprof: SELFPROF_HTTP_TOKEN_FILE is set but SELFPROF_HTTP is not: no endpoint");
      status st = read_token_file(opts_.http_token_file, sc.token);
      if (!st) return st;
    }
    if (sc.http.empty() && !sc.control) return status::ok();
    const options o = opts_;
    // The control socket alone: its thread starts at the first client, the dumper watching the socket.
    status st = server_.start(
        sc, [this, o](const http_request& r) { return answer_request(snapshots_, o, r); }, notes_, true);
    if (st) dumps_.serve_on_demand(server_.lazy_listener() >= 0 ? &server_ : nullptr);
    return st;
  }

  status stop_locked(bool keep_dump_signal = false, bool on_dumper = false) {
    if (!running_) return status::ok();
    server_.stop();        // first: a waiting request reads snapshots
    wall_sampler_.stop();  // first: it reads the ring and the unwind tables
    collector_.stop();
    if (pull_) {  // what the kernel wrote since the collector's last read
      pull_->collect_again(ring_);
      pulled_.update(*pull_);
      pull_ = nullptr;
    }
    if (!on_dumper) dumps_.stop(keep_dump_signal);  // answers what was requested, gives the signal back
    registry_.end();
    g_handler.active.store(false, std::memory_order_seq_cst);  // pairs with the handler's in_flight
    // Waits (bounded) until no handler runs: the tables can go. A handler still running after the wait
    // is stuck in a fault of its own; its tables are kept (a leak) rather than freed under it.
    const bool quiet = restore_sample_handler(signal_);
    collector_.close_task_dir();
    if (quiet) release_unwind_tables();
    store_.drain(ring_, true);
    g_handler.ring.store(nullptr, std::memory_order_release);
    snapshots_.end();
    process_cpu_end_ = process_cpu_ns();
    own_cpu_end_ = workers_cpu_ns();
    running_ = false;
    return status::ok();
  }

  status fail_start(status st) {
    pull_ = nullptr;
    g_handler.active.store(false, std::memory_order_seq_cst);  // pairs with the handler's in_flight
    registry_.end();
    if (restore_sample_handler(signal_)) release_unwind_tables();
    g_handler.ring.store(nullptr, std::memory_order_release);
    notes_.clear();
    return st;
  }

  std::string describe_locked() {
    char buf[256];
    std::string s;
    const source_info src = session_.source();
    std::snprintf(buf, sizeof buf, "selfprof: sampling at %g Hz (effective %g Hz) with %s", opts_.hz,
                  src.effective_hz, src.detail.c_str());
    s += buf;
    s += signal_.number > 0 ? " on signal " + std::to_string(signal_.number) + "\n" : std::string("\n");
    s += std::string("selfprof: source ") + source_name(src.kind) + ": " + src.reason + "\n";
    for (auto& r : session_.refused()) s += "selfprof: refused " + r + "\n";
    std::vector<std::string> notes;
    session_.notes(notes);
    for (auto& n : notes) s += "selfprof: " + n + "\n";
    const std::string out = opts_.out.empty() ? std::string(kDefaultDumpTemplate) + " (default)" : opts_.out;
    if (dumps_.signal_number() != 0)
      s += "selfprof: kill -" + std::to_string(dumps_.signal_number()) + " " + std::to_string(::getpid()) +
           " writes " + out + "\n";
    if (opts_.interval_s > 0)
      s += "selfprof: every " + std::to_string(opts_.interval_s) + " s writes " + out + "\n";
    if (opts_.window_s > 0)
      s += "selfprof: each dump holds the last " + std::to_string(opts_.window_s) + " s\n";
    if (!opts_.out.empty()) s += "selfprof: at exit writes " + opts_.out + "\n";
    if (!server_.address().empty())
      s += "selfprof: serving profiles at http://" + server_.address() + "/debug/pprof/\n";
    if (!server_.control_name().empty())
      s += "selfprof: selfprof dump " + std::to_string(::getpid()) + " asks " + server_.control_name() + "\n";
    return s;
  }

  // SELFPROF_OUT set: a normal exit writes the profile of the last session (see exit_dump()).
  void install_exit_dump_once() {
    static bool done = false;
    if (done) return;
    done = true;
    std::atexit([] { instance().exit_dump(); });
  }

  void install_fork_handlers_once();

  std::mutex control_mu_;  // start/stop; taken first
  bool running_ = false;
  bool session_ran_ = false;
  pid_t session_pid_ = 0;
  bool wall_ = false;
  bool upgrade_ = false;
  tick_source* pull_ = nullptr;  // the registry's primary source when it sends no signal (ring)
  pulled_counts pulled_;
  bool oncpu_ticks_ = false;
  bool unwind_ok_ = true;
  status unwind_error_;
  unwind_mode unwind_ = unwind_mode::fp;
  double start_cpu_ms_ = 0, start_wall_ms_ = 0;  // what the last start() cost its caller
  // The process's and selfprof's threads' CPU clocks at the last start() and stop() (stats).
  std::uint64_t process_cpu0_ = 0, own_cpu0_ = 0, process_cpu_end_ = 0, own_cpu_end_ = 0;
  options opts_;
  std::vector<std::string> notes_;  // remarks made while starting, given to the session once it runs
  installed_signal signal_;
  int sample_signal_ = 0, dump_signal_ = 0;  // the session's signals, still reported after stop()
  source_config source_config_;
  // The sample ring's memory: anonymous pages, zero until touched, so a process pays only for the slots
  // its samples reach (the ring holds 0.2 s of samples of 16 threads: megabytes at high rates).
  struct ring_block {
    std::uint64_t* block = nullptr;
    std::size_t words = 0;
    std::size_t size() const { return words; }
    std::uint64_t* data() const { return block; }
    bool allocate(std::size_t n) {
      void* p = ::mmap(nullptr, n * 8, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
      if (p == MAP_FAILED) return false;
      block = static_cast<std::uint64_t*>(p);
      words = n;
      return true;
    }
    void release() {
      if (block != nullptr) ::munmap(block, words * 8);
      block = nullptr;
      words = 0;
    }
  };
  ring_block ring_memory_;
  sample_ring ring_;
  bool ring_clipped_ = false;
  bool starting_threads_ = false;  // start() got as far as starting threads: stop_locked() undoes it
  session_info session_;
  thread_registry registry_;
  sample_store store_;
  shared_symbolizer symbols_;
  bool symbols_locked_for_fork_ = false;  // between fork_prepare and fork_parent/fork_child
  snapshot_maker snapshots_{session_parts{&ring_, &store_, &registry_, &session_, &symbols_, &collector_}};
  auto_dumps dumps_{snapshots_, [] { instance().exit_dump(true); }};
  http_server server_;
  wall_sampler wall_sampler_;
  collector collector_;
};

}  // namespace detail
}  // namespace selfprof

// ---- begin selfprof/core/fork.hpp ----
// fork(2) and the profiler: a forked child has one thread and copies of every lock and kernel object of
// the parent. Before the fork every lock of the profiler is taken, so no copy is held by a thread that
// does not exist in the child. The child forgets the parent's threads (collector, dumper, wall sampler),
// tick sources (leaked, never disarmed: they are the parent's) and samples, gives the sampling signal
// back, and is not profiled until it calls start() itself. The parent goes on as before.
// Context: pthread_atfork handlers (the forking thread, and the child's only thread).

#include <pthread.h>

#include <new>


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
// ---- end selfprof/core/fork.hpp ----
// ---- end selfprof/core/profiler.hpp ----
// ---- begin selfprof/output/diff.hpp ----
// Differential profiles: difffolded's `stack c1 c2` text and the red/blue differential flame graph SVG.
// Context: any thread (pure functions; run on the dump path or by the CLI).

#include <algorithm>
#include <cctype>
#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>


namespace selfprof {
namespace detail {

// A frame name in folded text: annotated, `;` -> `:`, CR/LF/NUL removed, never empty.
inline std::string folded_frame_text(const frame& f) {
  std::string n = annotated_frame_name(f);
  std::string out;
  out.reserve(n.size());
  for (char c : n) {
    if (c == ';')
      out += ':';
    else if (c == '\n' || c == '\r' || c == '\0')
      continue;
    else
      out += c;
  }
  return out.empty() ? std::string("[unknown]") : out;
}

inline std::string strip_hex_numbers(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (std::size_t i = 0; i < s.size();) {
    if (s[i] == '0' && i + 2 < s.size() && s[i + 1] == 'x' &&
        std::isxdigit(static_cast<unsigned char>(s[i + 2]))) {
      std::size_t j = i + 2;
      while (j < s.size() && std::isxdigit(static_cast<unsigned char>(s[j]))) ++j;
      out += "0x...";
      i = j;
    } else {
      out += s[i++];
    }
  }
  return out;
}

// One stack of either profile by its folded text, with its count in each.
struct diff_row {
  std::string stack;
  std::uint64_t before = 0, after = 0;
};

struct diff_table {
  std::vector<diff_row> rows;                       // sorted by stack bytes
  std::uint64_t total_before = 0, total_after = 0;  // after normalisation
};

// Adds each stack of `p` as a folded key to `rows` (channel 0: before, 1: after), `index` finding the
// row of a key; returns the total.
inline std::uint64_t fold_into(std::unordered_map<std::string, std::size_t>& index,
                               std::vector<diff_row>& rows, const profile& p, int channel, bool strip_hex) {
  std::vector<std::string> names(p.frames.size());
  std::vector<bool> named(p.frames.size(), false);
  std::uint64_t total = 0;
  std::string key;
  for (const stack& s : p.stacks) {
    if (s.count == 0) continue;
    key.clear();
    for (std::uint32_t fi : s.frames) {
      if (fi >= p.frames.size()) continue;
      if (!named[fi]) {
        names[fi] = folded_frame_text(p.frames[fi]);
        named[fi] = true;
      }
      if (!key.empty()) key += ';';
      key += names[fi];
    }
    if (key.empty()) key = "[unknown]";
    if (strip_hex) key = strip_hex_numbers(key);
    auto [it, fresh] = index.try_emplace(key, rows.size());
    if (fresh) rows.push_back(diff_row{key, 0, 0});
    diff_row& r = rows[it->second];
    (channel == 0 ? r.before : r.after) += s.count;
    total += s.count;
  }
  return total;
}

inline diff_table diff_counts(const profile& before, const profile& after, const diff_options& o) {
  diff_table t;
  std::vector<diff_row> rows;
  {
    std::unordered_map<std::string, std::size_t> index;
    std::uint64_t t1 = fold_into(index, rows, before, 0, o.strip_hex);
    std::uint64_t t2 = fold_into(index, rows, after, 1, o.strip_hex);
    t.total_after = t2;
    if (o.normalize && t1 != t2 && t1 != 0) {
      const std::uint64_t original = t1;
      t1 = 0;
      for (auto& r : rows) {  // as difffolded: int(c1 * total2 / total1), in double arithmetic
        double scaled =
            static_cast<double>(r.before) * static_cast<double>(t2) / static_cast<double>(original);
        r.before = static_cast<std::uint64_t>(scaled);
        t1 += r.before;
      }
    }
    t.total_before = t1;
  }
  std::vector<std::uint32_t> order = identity_order(rows.size());
  sort_indices(
      order,
      [](const void* all, std::uint32_t a, std::uint32_t b) {
        const auto& r = *static_cast<const std::vector<diff_row>*>(all);
        return r[a].stack < r[b].stack;
      },
      &rows);
  t.rows.reserve(rows.size());
  for (std::uint32_t i : order) t.rows.push_back(std::move(rows[i]));
  return t;
}

// difffolded output: `stack before after` for every stack of either profile, sorted by bytes.
inline std::string write_diff_folded(const profile& before, const profile& after, const diff_options& o) {
  diff_table t = diff_counts(before, after, o);
  std::string out;
  for (const diff_row& r : t.rows) {
    out += r.stack;
    out += ' ';
    out += std::to_string(r.before);
    out += ' ';
    out += std::to_string(r.after);
    out += '\n';
  }
  return out;
}

// The differential flame graph: red frames grew, blue ones shrank (by self change unless
// `inclusive`); tooltips carry before and after counts. `before`-only stacks stay visible unless
// widths follow `after`.
inline std::string write_diff_svg(const profile& before, const profile& after, const svg_options& so,
                                  const diff_options& o) {
  diff_table t = diff_counts(before, after, o);
  flame_tree tree;
  std::vector<std::uint32_t> path;
  for (const diff_row& r : t.rows) {
    const std::string& key = r.stack;
    path.clear();
    std::size_t start = 0;
    while (start <= key.size()) {
      std::size_t semi = key.find(';', start);
      if (semi == std::string::npos) semi = key.size();
      path.push_back(tree.intern(key.substr(start, semi - start)));
      start = semi + 1;
    }
    if (so.reverse) std::reverse(path.begin(), path.end());
    std::uint64_t c1 = r.before, c2 = r.after;
    std::uint64_t w = o.widths == diff_width::after    ? c2
                      : o.widths == diff_width::before ? c1
                                                       : std::max(c1, c2);
    tree.add(path.data(), path.size(), c1, c2, w);
  }
  tree.build(true);
  svg_options opt = so;
  if (opt.title.empty()) opt.title = "Differential Flame Graph";
  if (opt.subtitle.empty()) {
    opt.subtitle = o.negate ? "blue: grew, red: shrank" : "red: grew, blue: shrank";
    opt.subtitle += o.inclusive ? " (inclusive change)" : " (self change)";
    opt.subtitle += "; widths: ";
    opt.subtitle += o.widths == diff_width::after    ? "after"
                    : o.widths == diff_width::before ? "before"
                                                     : "larger of before and after";
  }
  if (tree.total_width() == 0) return render_error_svg(opt, "ERROR: No stack counts found");
  svg_input in;
  in.tree = &tree;
  in.total = std::max<std::uint64_t>(tree.total_width(), so.total);
  in.value_total = t.total_after;
  in.before_total = t.total_before;
  in.diff = true;
  in.negate = o.negate;
  in.inclusive_delta = o.inclusive;
  in.info = &after.info;
  in.frames = tree.layout(min_width_samples(opt, in.total));
  in.frames[0].width = in.total;
  std::int64_t max_delta = 1;
  for (const auto& n : tree.nodes()) {
    std::int64_t d = o.inclusive
                         ? static_cast<std::int64_t>(n.after) - static_cast<std::int64_t>(n.before)
                         : static_cast<std::int64_t>(n.self_after) - static_cast<std::int64_t>(n.self_before);
    if (d < 0) d = -d;
    if (d > max_delta) max_delta = d;
  }
  in.max_delta = max_delta;
  return render_svg(in, opt);
}

}  // namespace detail
}  // namespace selfprof
// ---- end selfprof/output/diff.hpp ----

namespace selfprof {

SELFPROF_API status start(const options& opts) { return detail::profiler_core::instance().start(opts); }

SELFPROF_API status start_from_env() {
  std::vector<std::string> warnings;
  options o = options_from_env(&warnings);
  for (auto& w : warnings) std::fprintf(stderr, "%s\n", w.c_str());
  status st = start(o);
  if (!st) std::fprintf(stderr, "%s\n", st.message().c_str());
  return st;
}

SELFPROF_API status stop() { return detail::profiler_core::instance().stop(); }

SELFPROF_API bool running() { return detail::profiler_core::instance().running(); }

SELFPROF_API status register_thread() { return detail::profiler_core::instance().register_current_thread(); }

SELFPROF_API profile snapshot() { return detail::profiler_core::instance().snapshot(); }

SELFPROF_API stats get_stats() { return detail::profiler_core::instance().get_stats(); }

SELFPROF_API status dump(const std::string& paths) { return detail::profiler_core::instance().dump(paths); }

SELFPROF_API profile snapshot_offcpu() { return detail::offcpu_view(snapshot()); }

namespace detail {
// One profile the API writes on its own (not a whole dump): markers, titles and numbering as a dump's.
// The SVG title is the dump's, after `title_prefix`, or `title` when given.
inline status write_single(profile p, const std::string& paths, const std::string& title_prefix,
                           const std::string& title = "", bool flamechart = false,
                           const std::string& rank = "") {
  profiler_core& core = profiler_core::instance();
  const dump_settings s = core.dump_settings_for(paths);
  add_marker_frames(p, s.thread_roots);
  output_options oo = dump_output_options(p);
  oo.svg.title = title.empty() ? title_prefix + oo.svg.title : title;
  oo.svg.flamechart = flamechart;
  path_fields f = fields_now(next_dump_number());
  f.rank = rank;
  return write_profile_paths(p, paths, f, oo, s.sink);
}
}  // namespace detail

SELFPROF_API status dump_offcpu(const std::string& paths) {
  return detail::write_single(snapshot_offcpu(), paths, "");
}

SELFPROF_API std::vector<frame_loop_stats> frame_stats() {
  return detail::profiler_core::instance().snapshot_raw().info.frame_loops;
}

SELFPROF_API profile snapshot_slow_frames() {
  detail::snapshot_maker& s = detail::profiler_core::instance().snapshots();
  bool marked = false;
  return s.symbolize(s.slow_raw(marked));
}

SELFPROF_API status dump_slow_frames(const std::string& paths) {
  const double budget = detail::profiler_core::instance().snapshots().opts().frame_budget_ms;
  return detail::write_single(snapshot_slow_frames(), paths,
                              "Slow frames (over " + detail::format_compact(budget) + " ms): ");
}

SELFPROF_API std::vector<profile> worst_frames(std::size_t n) {
  return detail::profiler_core::instance().snapshots().worst_game_frames(n);
}

SELFPROF_API status dump_worst_frames(const std::string& path_template, std::size_t n) {
  std::vector<profile> frames = worst_frames(n);
  std::string errors;
  for (std::size_t i = 0; i < frames.size(); ++i) {
    const std::string rank = std::to_string(i + 1);
    const std::string paths = path_template.find("%f") == std::string::npos
                                  ? detail::companion_paths(path_template, "-frame" + rank)
                                  : path_template;
    status st =
        detail::write_single(frames[i], paths, "", "Flame chart of " + frames[i].info.view, true, rank);
    if (!st) errors += (errors.empty() ? "" : "\n") + st.message();
  }
  return errors.empty() ? status::ok() : status::error(errors);
}

SELFPROF_API status dump_diff(const profile& before, const profile& after, const std::string& path,
                              const diff_options& options) {
  const bool svg = detail::ends_with_ci(path, ".svg");
  if (!svg && !detail::ends_with_ci(path, ".folded") && !detail::ends_with_ci(path, ".diff"))
    return status::error("selfprof: cannot write " + path + ": a diff is written as .svg, .folded or .diff");
  profile b = before, a = after;
  detail::add_marker_frames(b, false);
  detail::add_marker_frames(a, false);
  std::string bytes = svg ? detail::write_diff_svg(b, a, detail::dump_output_options(a).svg, options)
                          : detail::write_diff_folded(b, a, options);
  return detail::write_file_atomic(path, bytes);
}

}  // namespace selfprof
// ---- end selfprof/core/api.hpp ----
#endif
// ---- end selfprof/profiler.hpp ----

#if SELFPROF_DETAIL_WITH_IMPLEMENTATION
// ---- begin selfprof/output/folded_parse.hpp ----
// The folded ("collapsed") stack reader: turns the folded dialects (flamegraph.pl's, inferno's,
// difffolded's two-count lines; see below) back into a profile, with the reasons for every line it could
// not use.
// Context: any thread except the signal handler (used by the CLI, the diff and SVG writers, tests).
//
// Accepted: `FRAME(;FRAME)* COUNT` with one or more spaces or tabs before the count; CRLF line ends;
// blank lines and `# ` comment lines (skipped); surrounding whitespace; fractional counts like
// flamegraph.pl's `12.5` (truncated to integers as inferno does, with a warning); differential lines
// `STACK COUNT1 COUNT2` (the profile takes COUNT2, the "after" column; COUNT1 goes to before_counts).
// Frames are interned by name: a trailing `_[k]`/`_[j]`/`_[i]` sets frame_kind and is stripped from
// the name; `[name tid=N]` as first frame and `[truncated]` at the root side become marker frames (kept
// in the stack, so writing the profile again gives the same bytes) and set stack::tid / a thread name
// and stack::truncated. Identical lines are merged. Malformed lines are skipped and reported with
// source name and 1-based line number; nothing here throws or crashes on bad input.

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>


namespace selfprof {

struct folded_parse_error {
  std::string source;    // the source_name given to parse_folded (a path, "<stdin>", ...)
  std::size_t line = 0;  // 1-based
  std::string message;
  // "source:line: message"
  std::string to_string() const { return source + ":" + std::to_string(line) + ": " + message; }
};

struct folded_parse_result {
  selfprof::profile prof;                    // frames by name, one stack per distinct line
  std::vector<folded_parse_error> errors;    // lines skipped, first `max_reported` of them
  std::vector<folded_parse_error> warnings;  // lines used but changed (the first fractional count)
  std::size_t lines = 0;                     // lines read (the last one may lack its LF)
  std::size_t ignored_lines = 0;             // malformed lines skipped (all of them, reported or not)
  std::size_t comment_lines = 0;             // blank lines and `# ` comments
  std::size_t zero_count_lines = 0;          // well-formed lines whose count is 0 (no stack made)
  std::size_t fractional_lines = 0;          // counts that had a fraction cut off
  bool differential = false;                 // some line had two counts
  std::vector<std::uint64_t> before_counts;  // per stack, COUNT1 of differential lines (else 0)

  static constexpr std::size_t max_reported = 100;
  bool ok() const { return ignored_lines == 0; }
};

namespace detail {

inline bool is_folded_space(char c) { return c == ' ' || c == '\t'; }

// Parses `\d+(\.\d*)?` into an integer (fraction cut). Returns false when the token is not a count
// or overflows; `fractional` is set when digits after the dot were non-zero.
inline bool parse_folded_count(std::string_view tok, std::uint64_t& value, bool& fractional) {
  value = 0;
  fractional = false;
  std::size_t i = 0;
  if (tok.empty() || tok[0] < '0' || tok[0] > '9') return false;
  for (; i < tok.size() && tok[i] >= '0' && tok[i] <= '9'; ++i) {
    const std::uint64_t d = static_cast<std::uint64_t>(tok[i] - '0');
    if (value > (UINT64_MAX - d) / 10) return false;
    value = value * 10 + d;
  }
  if (i == tok.size()) return true;
  if (tok[i] != '.') return false;
  for (++i; i < tok.size(); ++i) {
    if (tok[i] < '0' || tok[i] > '9') return false;
    if (tok[i] != '0') fractional = true;
  }
  return true;
}

// Splits off the last whitespace-separated token of `s` (already trimmed on the right).
inline bool split_last_token(std::string_view s, std::string_view& rest, std::string_view& tok) {
  std::size_t end = s.size();
  std::size_t b = end;
  while (b > 0 && !is_folded_space(s[b - 1])) --b;
  if (b == 0) return false;
  tok = s.substr(b, end - b);
  std::size_t r = b;
  while (r > 0 && is_folded_space(s[r - 1])) --r;
  rest = s.substr(0, r);
  return true;
}

inline frame_kind strip_folded_annotation(std::string_view& name) {
  if (name.size() >= 4 && name.substr(name.size() - 4, 2) == "_[" && name.back() == ']') {
    const char k = name[name.size() - 2];
    frame_kind kind = frame_kind::native;
    if (k == 'k')
      kind = frame_kind::kernel;
    else if (k == 'j')
      kind = frame_kind::jit;
    else if (k == 'i')
      kind = frame_kind::inlined;
    if (kind != frame_kind::native) name.remove_suffix(4);
    return kind;
  }
  return frame_kind::native;
}

class folded_parser {
 public:
  folded_parser(folded_parse_result& r, const std::string& source) : r_(r), source_(source) {}

  void line(std::size_t number, std::string_view text) {
    if (!text.empty() && text.back() == '\r') text.remove_suffix(1);
    while (!text.empty() && is_folded_space(text.front())) text.remove_prefix(1);
    while (!text.empty() && is_folded_space(text.back())) text.remove_suffix(1);
    if (text.empty() || text == "#" || text.substr(0, 2) == "# ") {
      ++r_.comment_lines;
      return;
    }
    std::string_view stack_text, tok;
    if (!split_last_token(text, stack_text, tok)) return error(number, "no count at the end of the line");
    std::uint64_t count = 0, before = 0;
    bool frac = false, frac_before = false, diff = false;
    if (!parse_folded_count(tok, count, frac))
      return error(number, "count '" + std::string(tok.substr(0, 40)) + "' is not a non-negative number");
    std::string_view rest2, tok2;
    if (split_last_token(stack_text, rest2, tok2) && parse_folded_count(tok2, before, frac_before)) {
      diff = true;
      stack_text = rest2;
    }
    if (stack_text.empty()) return error(number, "empty stack before the count");
    if (frac || frac_before) {
      if (r_.fractional_lines++ == 0)
        r_.warnings.push_back({source_, number,
                               "fractional count '" + std::string(tok.substr(0, 40)) +
                                   "' cut to an integer (counts are integers; scale the input first)"});
    }
    if (count == 0 && !diff) {
      ++r_.zero_count_lines;
      return;
    }
    if (count == 0 && before == 0) {
      ++r_.zero_count_lines;
      return;
    }
    if (diff) r_.differential = true;
    add_stack(stack_text, count, before);
  }

 private:
  void error(std::size_t number, std::string message) {
    ++r_.ignored_lines;
    if (r_.errors.size() < folded_parse_result::max_reported)
      r_.errors.push_back({source_, number, std::move(message)});
  }

  std::uint32_t intern(std::string_view name, frame_kind kind) {
    std::string key(1, static_cast<char>('0' + static_cast<int>(kind)));
    key.append(name.data(), name.size());
    auto [it, fresh] = frames_.try_emplace(std::move(key), std::size_t{0});
    if (fresh) {
      it->second = r_.prof.frames.size();
      frame f;
      f.name = std::string(name);
      f.kind = kind;
      r_.prof.frames.push_back(std::move(f));
    }
    return static_cast<std::uint32_t>(it->second);
  }

  void add_stack(std::string_view text, std::uint64_t count, std::uint64_t before) {
    auto found = stacks_.find(std::string(text));
    if (found != stacks_.end()) {
      auto& s = r_.prof.stacks[found->second];
      add_saturating(s.count, count);
      add_saturating(r_.before_counts[found->second], before);
      return;
    }
    stack s;
    s.count = count;
    std::size_t pos = 0, index = 0;
    while (pos <= text.size()) {
      std::size_t semi = text.find(';', pos);
      if (semi == std::string_view::npos) semi = text.size();
      std::string_view name = text.substr(pos, semi - pos);
      frame_kind kind = strip_folded_annotation(name);
      if (kind == frame_kind::native) {
        if (index == 0 && is_thread_root_name(name)) {
          kind = frame_kind::marker;
          note_thread(name, s);
        } else if (name == truncated_marker &&
                   (index == 0 || (index == 1 && (s.tid != 0 || semi < text.size())))) {
          // At the root, or right below a thread's or a recording's process root (`cc1plus;[truncated];
          // ...`) with frames after it; at the leaf (`x;[truncated]`) it is an ordinary name.
          kind = frame_kind::marker;
          s.truncated = true;
        }
      }
      s.frames.push_back(intern(name, kind));
      ++index;
      pos = semi + 1;
    }
    stacks_.try_emplace(std::string(text), r_.prof.stacks.size());
    r_.prof.stacks.push_back(std::move(s));
    r_.before_counts.push_back(before);
  }

  void note_thread(std::string_view root, stack& s) {
    const auto pos = root.rfind("tid=");
    std::uint64_t tid = 0;
    bool frac = false;
    if (!parse_folded_count(root.substr(pos + 4, root.size() - 1 - (pos + 4)), tid, frac) ||
        tid > UINT32_MAX || tid == 0)
      return;
    s.tid = static_cast<std::uint32_t>(tid);
    if (thread_index_.emplace(s.tid, r_.prof.threads.size()).second) {
      thread_info t;
      t.tid = s.tid;
      if (pos > 2) t.name = std::string(root.substr(1, pos - 2));
      r_.prof.threads.push_back(std::move(t));
    }
  }

  folded_parse_result& r_;
  const std::string& source_;
  // Map types shared with the writers and the collector: no instantiation of their own.
  std::unordered_map<std::string, std::size_t> frames_;            // kind digit + name -> frame index
  std::unordered_map<std::string, std::size_t> stacks_;            // line text -> stack index
  std::unordered_map<std::uint32_t, std::uint64_t> thread_index_;  // tid -> index in prof.threads
};

}  // namespace detail

// Reads folded text; `source_name` only labels errors. See the top of this file for the dialects.
inline folded_parse_result parse_folded(std::string_view text, const std::string& source_name) {
  folded_parse_result r;
  r.prof.info.source = "file";
  {
    detail::folded_parser parser(r, source_name);
    std::size_t pos = 0;
    while (pos < text.size()) {
      std::size_t nl = text.find('\n', pos);
      if (nl == std::string_view::npos) nl = text.size();
      parser.line(++r.lines, text.substr(pos, nl - pos));
      pos = nl + 1;
    }
  }
  for (const auto& s : r.prof.stacks) {
    detail::add_saturating(r.prof.info.samples, s.count);
    if (s.truncated) detail::add_saturating(r.prof.info.truncated, s.count);
  }
  return r;
}

namespace detail {
using selfprof::folded_parse_result;  // the brief's spelling: detail::folded_parse_result
using selfprof::parse_folded;
}  // namespace detail

}  // namespace selfprof
// ---- end selfprof/output/folded_parse.hpp ----
#endif
