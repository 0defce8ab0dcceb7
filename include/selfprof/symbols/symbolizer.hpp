// selfprof::symbolizer: turns addresses of this process into frames (demangled function, module, offset),
// from ELF symbols of every module ever mapped, separate debug files, the vdso and perf maps for JIT code;
// with SELFPROF_HAS_LIBDW=1 also file:line and inlined calls as their own frames (dwarf_lines.hpp).
// Context: collector thread or any single thread (not thread-safe; never the signal handler).
#pragma once

#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <string>
#include <utility>
#include <vector>

#include "selfprof/jit/runtime.hpp"
#include "selfprof/profile.hpp"
#include "selfprof/symbols/dwarf_lines.hpp"
#include "selfprof/symbols/kernel_symbols.hpp"
#include "selfprof/symbols/modules.hpp"
#include "selfprof/symbols/perf_map.hpp"

namespace selfprof {

// Executable memory mapped at the last module scan; anonymous (no file: JIT code) or from a file.
struct code_range {
  std::uint64_t start = 0, end = 0;
  bool anonymous = false;
};

struct symbolizer_options {
  // Roots searched for separate debug files: <root>/.build-id/xx/rest.debug and <root>/<module dir>/<link>.
  std::vector<std::string> debug_roots{"/usr/lib/debug"};
  // perf map naming JIT code; empty means /tmp/perf-<getpid()>.map. Set use_perf_map to false to skip it.
  std::string perf_map_path;
  bool use_perf_map = true;
  std::string maps_path = "/proc/self/maps";
  // Which DWARF gives file:line and inline frames (modes.hpp): by default not compressed DWARF.
  lines_mode lines = lines_mode::automatic;
};

class symbolizer {
 public:
  symbolizer() : symbolizer(symbolizer_options()) {}
  explicit symbolizer(symbolizer_options options)
      : modules_(detail::module_registry_options{options.debug_roots, options.maps_path, nullptr}),
        perf_map_(options.perf_map_path),
        use_perf_map_(options.use_perf_map),
        dwarf_(options.debug_roots, options.lines) {}

  // Snapshots the modules mapped now (parsing the symbols of new ones); keeps unmapped ones. Cheap when
  // no library was loaded or unloaded since the last call: meant to run every ~100 ms while profiling.
  void refresh() {
    modules_.refresh();
    refreshed_ = true;
    rescanned_on_miss_ = false;
    perf_map_checked_ = false;
  }

  // Re-reads the maps even when no library came or went (a file or JIT code mapped directly): what is
  // mapped now is recorded, with its symbols, so it is still named after it is unmapped. Returns true
  // when the module set changed.
  bool rescan() {
    refreshed_ = true;
    perf_map_checked_ = false;
    return modules_.rescan();
  }

  // The executable ranges mapped at the last refresh()/rescan(), by start address.
  std::vector<code_range> code_ranges() const {
    std::vector<code_range> out;
    for (const detail::module& m : modules_.modules())
      if (m.mapped) out.push_back(code_range{m.start, m.end, m.kind == detail::module_kind::anonymous});
    std::sort(out.begin(), out.end(),
              [](const code_range& a, const code_range& b) { return a.start < b.start; });
    return out;
  }

  void abandon_after_fork() { perf_map_.abandon_after_fork(); }

  // Appends the frames for one address, outermost first: one frame, or with libdw the real function
  // (kind native, file:line of its call into the first inlined callee) then each inlined callee (kind
  // inlined) down to the innermost, as `addr2line -f -C -i` lists them bottom up.
  // `address` is what to look up: callers pass pc-1 for return addresses.
  void resolve(std::uint64_t address, std::vector<frame>& out) {
    if (detail::is_kernel_address(address)) {  // a kernel call chain's frame (the ring source, as root)
      out.push_back(kernel_.resolve(address));
      return;
    }
    {
      frame jit;  // code registered with selfprof::jit, named by what was there when the sample was taken
      if (detail::jit_name_tagged(address, jit)) {
        out.push_back(std::move(jit));
        return;
      }
    }
    if (!refreshed_) refresh();
    detail::perf_map::hit line;
    if (detail::is_perf_map_tagged(address)) {
      // Named while sampling by the perf map line current then, unless the code is in a file after all.
      if (!perf_map_.name_tagged(address, line)) {
        frame unknown;
        unknown.name = "[unknown]";
        out.push_back(std::move(unknown));
        return;
      }
      address = line.address;
      const detail::module* in = modules_.find(address);
      if (in == nullptr || in->kind == detail::module_kind::anonymous) {
        out.push_back(jit_frame(line, address));
        return;
      }
    }
    const detail::module* m = modules_.find(address);
    if (m == nullptr && !rescanned_on_miss_) {
      // Mapped without the loader since the last refresh (JIT code, mmap): look once per refresh.
      rescanned_on_miss_ = true;
      modules_.rescan();
      m = modules_.find(address);
    }
    frame f;
    f.address = address;
    if (m == nullptr || m->kind == detail::module_kind::anonymous) {
      if (resolve_jit(address, f)) {
        out.push_back(std::move(f));
        return;
      }
      f.name = "[unknown]";
      if (m != nullptr) {
        f.module = m->path;
        f.module_offset = address - m->start;
      }
      out.push_back(std::move(f));
      return;
    }
    f.module = m->path;
    f.module_offset = address - m->bias;
    detail::symbol_table::hit hit;
    const bool named = m->symbols && m->symbols->table.lookup(f.module_offset, hit);
    if (named) {
      f.name = m->symbols->table.name(hit.index);
    } else {
      char offset[32];
      std::snprintf(offset, sizeof offset, "+0x%llx]", static_cast<unsigned long long>(f.module_offset));
      f.name = "[" + m->basename + offset;
    }
    if (const detail::source_chain* chain = dwarf_.lookup(*m, f.module_offset)) {
      append_source_chain(*chain, named, std::move(f), out);
      return;
    }
    out.push_back(std::move(f));
  }

  // The kernel addresses a dump will resolve (before the first resolve): the first dump reads only
  // what names them from /proc/kallsyms (kernel_symbols::prepare).
  void prepare_kernel(std::vector<std::uint64_t> addresses) { kernel_.prepare(std::move(addresses)); }

  // Convenience for one frame: the real function holding the address (the outermost frame; with libdw
  // it carries the file:line of its call into the inline chain, which is dropped).
  frame resolve_one(std::uint64_t address) {
    std::vector<frame> frames;
    resolve(address, frames);
    return frames.empty() ? frame() : std::move(frames.front());
  }

  // One message per module whose symbols could not be read (truncated ELF, unreadable file, ...);
  // the caller decides where they go (profile notes, stderr). Cleared by this call.
  std::vector<std::string> take_warnings() {
    std::vector<std::string> out = modules_.take_warnings();
    for (std::string& w : dwarf_.take_warnings()) out.push_back(std::move(w));
    return out;
  }
  // Which DWARF later lookups read (SELFPROF_LINES).
  void set_lines(lines_mode mode) { dwarf_.set_mode(mode); }

  const detail::module_registry& modules() const { return modules_; }
  const detail::perf_map& jit_map() const { return perf_map_; }
  // The collector names JIT samples with it while sampling (perf_map is internally locked).
  detail::perf_map* perf_map_if_used() { return use_perf_map_ ? &perf_map_ : nullptr; }
  const detail::dwarf_lines& source_lines() const { return dwarf_; }

 private:
  // `f` as named by the symbol table (`named` false for the "[module+0xoffset]" fallback); `chain` from
  // DWARF, outermost first. The outermost frame keeps the symbol table's name (DWARF's fills in a miss)
  // and takes the chain's first file:line; each further level becomes an inlined frame.
  static void append_source_chain(const detail::source_chain& chain, bool named, frame f,
                                  std::vector<frame>& out) {
    f.file = chain.front().file;
    f.line = chain.front().line;
    if (!named && !chain.front().function.empty()) f.name = chain.front().function;
    out.push_back(f);
    for (std::size_t i = 1; i < chain.size(); ++i) {
      frame callee;
      callee.name = chain[i].function.empty() ? std::string("[inlined]") : chain[i].function;
      callee.module = f.module;
      callee.address = f.address;
      callee.module_offset = f.module_offset;
      callee.file = chain[i].file;
      callee.line = chain[i].line;
      callee.kind = frame_kind::inlined;
      out.push_back(std::move(callee));
    }
  }

  bool resolve_jit(std::uint64_t address, frame& f) {
    if (!use_perf_map_) return false;
    if (!perf_map_checked_) {
      perf_map_checked_ = true;
      perf_map_.reload_if_changed();
    }
    detail::perf_map::hit hit;
    if (!perf_map_.lookup(address, hit)) return false;
    f = jit_frame(hit, address);
    return true;
  }

  frame jit_frame(const detail::perf_map::hit& hit, std::uint64_t address) const {
    frame f;
    f.name = std::string(hit.name);
    f.module = perf_map_.path();
    f.address = address;
    f.module_offset = address - hit.start;
    f.kind = frame_kind::jit;
    return f;
  }

  detail::module_registry modules_;
  detail::perf_map perf_map_;
  bool use_perf_map_ = true;
  bool refreshed_ = false;
  bool rescanned_on_miss_ = false;
  bool perf_map_checked_ = false;
  detail::kernel_symbols kernel_;  // /proc/kallsyms, read at the first kernel address
  detail::dwarf_lines dwarf_;      // file:line and inline frames (a stub finding nothing without libdw)
};

}  // namespace selfprof
