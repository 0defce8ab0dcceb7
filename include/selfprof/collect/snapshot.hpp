// A raw snapshot: what the collector has folded so far (stacks of raw addresses), the names of the
// threads, and what the profile is about. Symbolized only when a profile is written (dump/).
// Context: any thread except the signal handler (a value type).
#pragma once

#include <cstdint>
#include <string>
#include <unordered_map>

#include "selfprof/detail/stack_table.hpp"
#include "selfprof/profile.hpp"

namespace selfprof {
namespace detail {

struct raw_snapshot {
  stack_table table;
  std::unordered_map<std::uint32_t, std::string> thread_names;
  profile_info info;
};

}  // namespace detail
}  // namespace selfprof
