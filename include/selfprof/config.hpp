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
#pragma once

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
