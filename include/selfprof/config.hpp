// Every compile-time switch of selfprof in one place, each with its default and meaning.
// Context: any thread (macros only; includes nothing, so signal/ headers may include it).
//
// Switches are 0/1 (or a number) and are always defined after this header, so code tests them with
// `#if SELFPROF_HAS_LIBDW`, never `#ifdef`, and the tree compiles cleanly with -Wundef. Define one on
// the command line (-DSELFPROF_HAS_ZLIB=1) to override the default; the CMake and Meson builds define
// the SELFPROF_HAS_* switches from what they detect.
//
// | switch                 | default | meaning                                                        |
// | ---------------------- | ------- | -------------------------------------------------------------- |
// | SELFPROF_HAS_LIBDW     | 0       | 1: the symbolizer uses elfutils libdw for file:line and inline |
// |                        |         | frames (link -ldw). 0: ELF symbol tables only.                 |
// | SELFPROF_HAS_LIBUNWIND | 0       | 1: libunwind may unwind code built without frame pointers      |
// |                        |         | (link -lunwind). 0: frame-pointer walking only.                |
// | SELFPROF_HAS_ZLIB      | 0       | 1: .pb.gz (pprof) output is deflate-compressed with zlib (link |
// |                        |         | -lz). 0: a valid gzip stream made of stored (uncompressed)     |
// |                        |         | blocks.                                                        |
// | SELFPROF_MAX_DEPTH     | 128     | the most frames one sample can hold (sizes the fixed records   |
// |                        |         | of the sample ring); deeper stacks are marked truncated.       |
#pragma once

#ifndef SELFPROF_HAS_LIBDW
#define SELFPROF_HAS_LIBDW 0
#endif

#ifndef SELFPROF_HAS_LIBUNWIND
#define SELFPROF_HAS_LIBUNWIND 0
#endif

#ifndef SELFPROF_HAS_ZLIB
#define SELFPROF_HAS_ZLIB 0
#endif

#ifndef SELFPROF_MAX_DEPTH
#define SELFPROF_MAX_DEPTH 128
#endif

#if SELFPROF_HAS_LIBDW != 0 && SELFPROF_HAS_LIBDW != 1
#error "SELFPROF_HAS_LIBDW must be 0 or 1"
#endif
#if SELFPROF_HAS_LIBUNWIND != 0 && SELFPROF_HAS_LIBUNWIND != 1
#error "SELFPROF_HAS_LIBUNWIND must be 0 or 1"
#endif
#if SELFPROF_HAS_ZLIB != 0 && SELFPROF_HAS_ZLIB != 1
#error "SELFPROF_HAS_ZLIB must be 0 or 1"
#endif
#if SELFPROF_MAX_DEPTH < 8 || SELFPROF_MAX_DEPTH > 4096
#error "SELFPROF_MAX_DEPTH must be between 8 and 4096"
#endif

// A switch turned on without its library installed fails here with its name rather than deep inside a
// system header.
#if defined(__has_include)
#if SELFPROF_HAS_LIBDW && !__has_include(<elfutils/libdw.h>)
#error "SELFPROF_HAS_LIBDW=1 but <elfutils/libdw.h> is missing (Debian: libdw-dev)"
#endif
#if SELFPROF_HAS_LIBUNWIND && !__has_include(<libunwind.h>)
#error "SELFPROF_HAS_LIBUNWIND=1 but <libunwind.h> is missing (Debian: libunwind-dev)"
#endif
#if SELFPROF_HAS_ZLIB && !__has_include(<zlib.h>)
#error "SELFPROF_HAS_ZLIB=1 but <zlib.h> is missing (Debian: zlib1g-dev)"
#endif
#endif
