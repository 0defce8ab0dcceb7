// C++ symbol demangling through the C++ runtime's abi::__cxa_demangle, falling back to the raw name.
// Context: collector thread or any thread (allocates; never the signal handler).
#pragma once

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
