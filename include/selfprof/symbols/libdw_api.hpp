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

#include "selfprof/detail/dl_api.hpp"

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
