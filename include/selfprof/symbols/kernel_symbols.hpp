// Names of kernel code addresses from /proc/kallsyms, for the kernel call chains the ring source records
// where kernel sampling is permitted (root, CAP_PERFMON, perf_event_paranoid <= 1). Read once, on the
// first kernel address looked up: a profile without kernel frames never reads the file (about 120,000
// lines, a few MB). Where the kernel hides its addresses (kptr_restrict: every address reads as 0) a
// kernel frame is named "[kernel]".
// Context: any thread (never the signal handler); not thread-safe (one per symbolizer).
//
// The file is streamed, never held whole. A dump that knows its kernel addresses first (prepare) keeps
// only the symbol that names each of them, not 120,000: a short process's exit dump then pays little
// more than the kernel's own formatting of the text (docs/measurements.md).
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
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

// Appends the kernel addresses the stacks of `table` are looked up at: the interrupted pc as it is, a
// return address less one (as dump/symbolize.hpp's stacks_from_table looks them up).
inline void append_kernel_lookups(const stack_table& table, std::vector<std::uint64_t>& out) {
  for (const auto& e : table.entries()) {
    const std::uint64_t* pcs = table.pcs(e);
    for (std::size_t i = 0; i < e.depth; ++i) {
      const std::uint64_t lookup = i == 0 ? pcs[0] : pcs[i] - 1;
      if (is_kernel_address(lookup)) out.push_back(lookup);
    }
  }
}

class kernel_symbols {
 public:
  explicit kernel_symbols(std::string path = "/proc/kallsyms") : path_(std::move(path)) {}

  // The frame of kernel address `address`: its symbol (kind kernel, module "[kernel.kallsyms]" or the
  // module's "[name]"), else "[kernel]". An address prepare() was not given reads the whole table.
  frame resolve(std::uint64_t address) {
    if (!loaded_ || (!prepared_.empty() && !std::binary_search(prepared_.begin(), prepared_.end(), address)))
      load(path_.c_str());
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
    reset();
    for_each_file_line(path, kKallsymsMaxBytes, [&](std::string_view line) {
      std::uint64_t address;
      std::string_view name, module;
      if (parse_line(line, address, name, module)) add(address, name, module);
    });
    std::stable_sort(symbols_.begin(), symbols_.end(),
                     [](const symbol& a, const symbol& b) { return a.address < b.address; });
  }

  // Reads only what names `addresses` (kernel addresses of one dump): for each, the nearest text
  // symbol at or below it, as load() would find it. resolve() of another address reads the whole file
  // and keeps it: a process that dumps again and again reads the file twice, not at every dump. Does
  // nothing once the file was read.
  void prepare(std::vector<std::uint64_t> addresses) {
    if (loaded_) return;
    std::sort(addresses.begin(), addresses.end());
    addresses.erase(std::unique(addresses.begin(), addresses.end()), addresses.end());
    if (addresses.empty()) return;
    reset();
    // best[j]: the highest symbol in (addresses[j-1], addresses[j]], so the answer for addresses[j] is
    // the last best[k] found for k <= j. One slot changes per line, whatever the order of the file.
    struct slot {
      bool set = false;
      std::uint64_t address = 0;
      std::string name, module;
    };
    std::vector<slot> best(addresses.size());
    for_each_file_line(path_.c_str(), kKallsymsMaxBytes, [&](std::string_view line) {
      std::uint64_t address;
      std::string_view name, module;
      if (!parse_line(line, address, name, module)) return;
      const auto j = static_cast<std::size_t>(std::lower_bound(addresses.begin(), addresses.end(), address) -
                                              addresses.begin());
      if (j == best.size() || (best[j].set && address < best[j].address)) return;
      best[j].set = true;  // an equal address replaces: the last one listed wins, as in load()
      best[j].address = address;
      best[j].name.assign(name);
      best[j].module.assign(module);
    });
    for (const slot& b : best)  // in address order: the slots' ranges follow each other
      if (b.set) add(b.address, b.name, b.module);
    prepared_ = std::move(addresses);
  }

  std::size_t size() const { return symbols_.size(); }

 private:
  struct symbol {
    std::uint64_t address;
    std::uint32_t name, module;  // offsets into names_
    std::uint16_t name_size, module_size;
  };

  void reset() {
    loaded_ = true;
    prepared_.clear();
    symbols_.clear();
    names_.clear();
    last_module_ = last_module_size_ = 0;
  }

  // A text symbol's line: "ffffffff81000000 T _text" or "ffffffffc0a01000 t fn\t[module]".
  static bool parse_line(std::string_view line, std::uint64_t& address, std::string_view& rest,
                         std::string_view& module) {
    std::size_t at = 0;  // past the address and its space
    address = 0;
    if (!parse_hex_field(line, at, ' ', address) || line.size() < at + 3) return false;
    const char type = line[at];
    if (address == 0 || line[at + 1] != ' ' || !(type == 't' || type == 'T' || type == 'w' || type == 'W'))
      return false;
    rest = line.substr(at + 2);
    module = {};
    const std::size_t tab = rest.find('\t');
    if (tab != std::string_view::npos) {
      module = rest.substr(tab + 1);
      rest = rest.substr(0, tab);
      if (module.size() >= 2 && module.front() == '[' && module.back() == ']')
        module = module.substr(1, module.size() - 2);
      else
        module = {};
    }
    return !rest.empty() && rest.size() <= 0xffff && module.size() <= 0xffff;
  }

  void add(std::uint64_t address, std::string_view rest, std::string_view module) {
    if (names_.size() > 0xfffe0000u) return;
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

  std::string path_;
  bool loaded_ = false;
  std::vector<std::uint64_t> prepared_;  // sorted: the addresses prepare() read for (empty: all)
  std::uint32_t last_module_ = 0;
  std::uint16_t last_module_size_ = 0;
  std::vector<symbol> symbols_;  // by address
  std::string names_;
};

}  // namespace detail
}  // namespace selfprof
