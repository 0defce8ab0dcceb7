// The definitions of selfprof::jit's public functions (declared and documented in jit.hpp): inline in
// header-only mode, compiled once with SELFPROF_COMPILED_LIB.
// Context: any thread (never the signal handler).
#pragma once

#include <cstddef>
#include <mutex>
#include <string>
#include <string_view>

#include "selfprof/config.hpp"
#include "selfprof/jit/options.hpp"
#include "selfprof/jit/runtime.hpp"
#include "selfprof/status.hpp"

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
