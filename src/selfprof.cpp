// The compiled library of selfprof (CMake SELFPROF_COMPILED=ON, Meson -Dcompiled=true): the one
// translation unit that holds the implementation; its users compile with SELFPROF_COMPILED_LIB=1 and
// include only declarations.
#define SELFPROF_IMPLEMENTATION
#include <selfprof.hpp>
