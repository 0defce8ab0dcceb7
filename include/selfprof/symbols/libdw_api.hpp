// The libdw and libelf functions dwarf_lines.hpp calls, as one table of function pointers: linked directly
// (the default), or, with SELFPROF_LIBDW_DLOPEN=1, loaded with dlopen("libdw.so.1") at the first DWARF
// lookup. The preload library uses the second: every process it is loaded into would otherwise map and
// relocate libdw, libelf and their compression libraries (about 0.9 ms of CPU per process here) to serve
// only in-process symbolization, which most short processes never do.
// Context: collector or dump thread (dlopen takes the loader lock; never the signal handler).
#pragma once

#include "selfprof/config.hpp"

#if SELFPROF_HAS_LIBDW
#include <elfutils/libdw.h>
#include <elfutils/libdwfl.h>
#include <gelf.h>

#if SELFPROF_LIBDW_DLOPEN
#include <dlfcn.h>
#endif

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
#define SELFPROF_LIBDW_MEMBER(name) decltype(&::name) name = nullptr;
  SELFPROF_LIBDW_FUNCTIONS(SELFPROF_LIBDW_MEMBER)
#undef SELFPROF_LIBDW_MEMBER
  bool ok = false;  // every member is set
};

#if SELFPROF_LIBDW_DLOPEN
// Loaded once, on first use; `ok` is false (and DWARF lookups find nothing) when libdw.so.1 is missing or
// lacks a function. The handle is never closed: the symbolizer may run again at any time.
inline const libdw_api& libdw() {
  static const libdw_api api = [] {
    libdw_api a;
    void* handle = ::dlopen("libdw.so.1", RTLD_NOW | RTLD_LOCAL);
    if (handle == nullptr) return a;
    bool all = true;
    // dlsym with a handle searches the library and its dependencies: libelf's functions are found too.
#define SELFPROF_LIBDW_LOAD(name)                                       \
  a.name = reinterpret_cast<decltype(&::name)>(::dlsym(handle, #name)); \
  all = all && a.name != nullptr;
    SELFPROF_LIBDW_FUNCTIONS(SELFPROF_LIBDW_LOAD)
#undef SELFPROF_LIBDW_LOAD
    a.ok = all;
    return a;
  }();
  return api;
}
#else
inline const libdw_api& libdw() {
  static const libdw_api api = [] {
    libdw_api a;
#define SELFPROF_LIBDW_LINK(name) a.name = &::name;
    SELFPROF_LIBDW_FUNCTIONS(SELFPROF_LIBDW_LINK)
#undef SELFPROF_LIBDW_LINK
    a.ok = true;
    return a;
  }();
  return api;
}
#endif
#undef SELFPROF_LIBDW_FUNCTIONS

}  // namespace detail
}  // namespace selfprof

#endif  // SELFPROF_HAS_LIBDW
