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
#pragma once

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
