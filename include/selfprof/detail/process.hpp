// Two facts about this process that several background threads read: the clock samples are stamped
// with, and how many times the dynamic loader has added or removed a library.
// Context: any thread except the signal handler (dl_iterate_phdr takes the loader's lock).
#pragma once

#include <link.h>
#include <time.h>

#include <cstddef>
#include <cstdint>

namespace selfprof {
namespace detail {

// CLOCK_MONOTONIC in ns: the clock the signal handler stamps samples with.
inline std::uint64_t monotonic_ns() {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<std::uint64_t>(ts.tv_sec) * 1000000000ull + static_cast<std::uint64_t>(ts.tv_nsec);
}

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

}  // namespace detail
}  // namespace selfprof
