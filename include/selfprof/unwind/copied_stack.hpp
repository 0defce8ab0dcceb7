// What walking a copied stack needs beyond the walker (signal/unwind.hpp's unwind_stack_copy): the code
// ranges of every loaded module, which tell a return address from data when scanning for a frame record.
// Context: the wall sampler's thread (allocates; never the signal handler).
#pragma once

#include <link.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <iterator>
#include <utility>
#include <vector>

#include "selfprof/signal/unwind.hpp"

namespace selfprof {
namespace detail {

// The executable segments of every loaded module (dl_iterate_phdr), to tell a return address from data.
class code_ranges {
 public:
  void refresh() {
    ranges_.clear();
    dl_iterate_phdr(
        [](struct dl_phdr_info* info, std::size_t, void* self) {
          auto* r = static_cast<std::vector<std::pair<std::uintptr_t, std::uintptr_t>>*>(self);
          for (int i = 0; i < info->dlpi_phnum; ++i) {
            const ElfW(Phdr)& ph = info->dlpi_phdr[i];
            if (ph.p_type != PT_LOAD || !(ph.p_flags & PF_X) || ph.p_memsz == 0) continue;
            std::uintptr_t start = info->dlpi_addr + ph.p_vaddr;
            r->emplace_back(start, start + ph.p_memsz);
          }
          return 0;
        },
        &ranges_);
    std::sort(ranges_.begin(), ranges_.end());
  }
  bool contains(std::uintptr_t addr) const {
    auto it = std::upper_bound(ranges_.begin(), ranges_.end(), std::make_pair(addr, ~std::uintptr_t(0)));
    return it != ranges_.begin() && addr < std::prev(it)->second;
  }
  bool empty() const { return ranges_.empty(); }

 private:
  std::vector<std::pair<std::uintptr_t, std::uintptr_t>> ranges_;
};

}  // namespace detail
}  // namespace selfprof
