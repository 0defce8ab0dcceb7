// Names of kernel code addresses from /proc/kallsyms, for the kernel call chains the ring source records
// where kernel sampling is permitted (root, CAP_PERFMON, perf_event_paranoid <= 1). Read once, on the
// first kernel address looked up: a profile without kernel frames never reads the file (about 120,000
// lines, a few MB). Where the kernel hides its addresses (kptr_restrict: every address reads as 0) a
// kernel frame is named "[kernel]".
// Context: any thread (never the signal handler); not thread-safe (one per symbolizer).
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>
#include <vector>

#include "selfprof/detail/process.hpp"
#include "selfprof/detail/stack_table.hpp"
#include "selfprof/profile.hpp"
#include "selfprof/symbols/proc_maps.hpp"

namespace selfprof {
namespace detail {

// Most bytes of /proc/kallsyms read (it is ~5 MB with many modules loaded); symbols past it are unnamed.
constexpr std::size_t kKallsymsMaxBytes = std::size_t{64} << 20;
// A kernel address further than this past the nearest symbol below it is not named by that symbol.
constexpr std::uint64_t kKernelSymbolReach = std::uint64_t{1} << 20;

class kernel_symbols {
 public:
  // The frame of kernel address `address`: its symbol (kind kernel, module "[kernel.kallsyms]" or the
  // module's "[name]"), else "[kernel]".
  frame resolve(std::uint64_t address) {
    if (!loaded_) load("/proc/kallsyms");
    frame f;
    f.kind = frame_kind::kernel;
    f.address = address;
    f.module = "[kernel.kallsyms]";
    auto it = std::upper_bound(symbols_.begin(), symbols_.end(), address,
                               [](std::uint64_t a, const symbol& s) { return a < s.address; });
    if (it == symbols_.begin() || address - (it - 1)->address > kKernelSymbolReach) {
      f.name = "[kernel]";
      return f;
    }
    const symbol& s = *(it - 1);
    f.name.assign(names_, s.name, s.name_size);
    f.module_offset = address - s.address;
    if (s.module_size) f.module = "[" + names_.substr(s.module, s.module_size) + "]";
    return f;
  }

  // Reads the text symbols of `path` (kallsyms format: "address type name [module]"); an unreadable file or
  // hidden addresses leave the table empty. Public for tests.
  void load(const char* path) {
    loaded_ = true;
    symbols_.clear();
    names_.clear();
    last_module_ = last_module_size_ = 0;
    for_each_line(read_small_file(path, kKallsymsMaxBytes), [&](std::string_view line) { parse_line(line); });
    std::stable_sort(symbols_.begin(), symbols_.end(),
                     [](const symbol& a, const symbol& b) { return a.address < b.address; });
  }

  std::size_t size() const { return symbols_.size(); }

 private:
  struct symbol {
    std::uint64_t address;
    std::uint32_t name, module;  // offsets into names_
    std::uint16_t name_size, module_size;
  };

  void parse_line(std::string_view line) {
    // "ffffffff81000000 T _text" or "ffffffffc0a01000 t fn\t[module]"
    std::size_t at = 0;  // past the address and its space
    std::uint64_t address = 0;
    if (!parse_hex_field(line, at, ' ', address) || line.size() < at + 3) return;
    const char type = line[at];
    if (address == 0 || line[at + 1] != ' ' || !(type == 't' || type == 'T' || type == 'w' || type == 'W'))
      return;
    std::string_view rest = line.substr(at + 2), module;
    const std::size_t tab = rest.find('\t');
    if (tab != std::string_view::npos) {
      module = rest.substr(tab + 1);
      rest = rest.substr(0, tab);
      if (module.size() >= 2 && module.front() == '[' && module.back() == ']')
        module = module.substr(1, module.size() - 2);
      else
        module = {};
    }
    if (rest.empty() || rest.size() > 0xffff || module.size() > 0xffff || names_.size() > 0xfffe0000u) return;
    symbol s{address, static_cast<std::uint32_t>(names_.size()), 0, static_cast<std::uint16_t>(rest.size()),
             0};
    names_.append(rest);
    if (!module.empty()) {  // a module's symbols are listed together: its name is stored once
      if (std::string_view(names_).substr(last_module_, last_module_size_) != module) {
        last_module_ = static_cast<std::uint32_t>(names_.size());
        last_module_size_ = static_cast<std::uint16_t>(module.size());
        names_.append(module);
      }
      s.module = last_module_;
      s.module_size = last_module_size_;
    }
    symbols_.push_back(s);
  }

  bool loaded_ = false;
  std::uint32_t last_module_ = 0;
  std::uint16_t last_module_size_ = 0;
  std::vector<symbol> symbols_;  // by address
  std::string names_;
};

}  // namespace detail
}  // namespace selfprof
