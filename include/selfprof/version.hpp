// The library version, written once here and read by CMake and Meson.
// Context: any thread.
#pragma once

#define SELFPROF_VERSION_MAJOR 0
#define SELFPROF_VERSION_MINOR 1
#define SELFPROF_VERSION_PATCH 0
#define SELFPROF_VERSION_STRING "0.1.0"
#define SELFPROF_VERSION \
  (SELFPROF_VERSION_MAJOR * 10000 + SELFPROF_VERSION_MINOR * 100 + SELFPROF_VERSION_PATCH)
