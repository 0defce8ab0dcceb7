// Source lines and inline chains from DWARF through elfutils libdw (SELFPROF_HAS_LIBDW=1): for an address
// of a mapped file, the real function and each inlined callee down to the innermost, each with file:line.
// Context: collector thread or any single thread (not thread-safe; never the signal handler).
//
// One Dwfl session per module file, opened on the first lookup in that file and kept for the lifetime of
// the symbolizer; each address's answer is cached. DWARF comes from the module file itself, else from
// the separate debug file the module registry found (build-id or .gnu_debuglink), else from a search of
// the same debug roots. No debuginfod and no other network access: only local files are read.
// lines_mode (modes.hpp) says which files are read: by default not those whose DWARF is compressed
// (libdw inflates it whole before the first lookup); each such file a lookup reached gives a warning,
// once per take_warnings() (once per profile).
// With SELFPROF_HAS_LIBDW=0 this header holds a stub whose lookups find nothing; with SELFPROF_LIBDW_DLOPEN=1
// libdw is loaded at the first lookup, and lookups find nothing where it cannot be (libdw_api.hpp).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "selfprof/config.hpp"
#include "selfprof/modes.hpp"
#include "selfprof/symbols/modules.hpp"

#if SELFPROF_HAS_LIBDW
#include <dwarf.h>  // DW_TAG_* and DW_AT_* (elfutils' copy, installed with libdw-dev)
#include <elfutils/libdw.h>
#include <elfutils/libdwfl.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <unordered_map>
#include <utility>

#include "selfprof/detail/high_fd.hpp"
#include "selfprof/detail/sys.hpp"
#include "selfprof/symbols/debug_file.hpp"
#include "selfprof/symbols/demangle.hpp"
#include "selfprof/symbols/elf.hpp"
#include "selfprof/symbols/libdw_api.hpp"
#include "selfprof/symbols/mapped_file.hpp"
#endif

namespace selfprof {
namespace detail {

// One level of the source chain of an address.
struct source_frame {
  std::string function;    // demangled DWARF name (linkage name when present); empty when unnamed
  std::string file;        // source file as DWARF records it (absolute when the compile dir is known)
  std::uint32_t line = 0;  // 0 when unknown
  bool inlined = false;    // true for an inlined callee; false for the real (outermost) function
};

// The source chain of an address, outermost first: the real function, whose file:line is the call
// site of the first inlined callee (or the address's own line when nothing is inlined there), then each
// inlined callee with the file:line of the call into the next, the innermost with the address's line.
using source_chain = std::vector<source_frame>;

#if SELFPROF_HAS_LIBDW

// Largest number of inlined levels reported for one address; deeper nesting loses its outermost levels.
// Real code stays far below (GCC's inline depth limit is in the tens); the bound only stops a corrupt
// parent chain.
constexpr std::size_t dwarf_max_inline_depth = 1024;
// Most function DIEs indexed per compile unit; past it a unit's remaining functions get no inline frames.
constexpr std::size_t dwarf_max_cu_functions = std::size_t{1} << 24;

// DIE tags of code that has a name and source position: real functions and inlined instances.
inline bool dwarf_is_function(int tag) {
  return tag == DW_TAG_subprogram || tag == DW_TAG_inlined_subroutine || tag == DW_TAG_entry_point;
}

// The functions of one compile unit laid out by address, built once per unit on its first lookup:
// libdw's dwarf_getscopes re-walks the whole unit on every call (measured: 14 ms a lookup in a unit
// that includes all of selfprof), this answers in O(log n).
struct dwarf_cu_index {
  struct function {
    Dwarf_Die die;        // DW_TAG_subprogram, DW_TAG_inlined_subroutine or DW_TAG_entry_point
    std::int32_t parent;  // enclosing function in the DIE tree (what addr2line -i follows), -1 at the top
  };
  struct segment {
    Dwarf_Addr start;    // the segment runs to the next one's start
    std::int32_t owner;  // the deepest function whose ranges hold it, -1 for none
  };
  std::vector<function> functions;
  std::vector<segment> segments;  // sorted by start

  // The deepest function holding `pc`, or -1.
  std::int32_t find(Dwarf_Addr pc) const {
    auto it = std::upper_bound(segments.begin(), segments.end(), pc,
                               [](Dwarf_Addr a, const segment& s) { return a < s.start; });
    return it == segments.begin() ? -1 : (it - 1)->owner;
  }

  void build(Dwarf_Die* cu) {
    struct interval {
      Dwarf_Addr low, high;
      int depth;
      std::int32_t function;
    };
    struct pending {
      Dwarf_Die die;
      int depth;
      std::int32_t parent;
    };
    std::vector<interval> intervals;
    std::vector<pending> stack;
    Dwarf_Die first;
    if (libdw().dwarf_child(cu, &first) == 0) stack.push_back(pending{first, 1, -1});
    while (!stack.empty() && functions.size() < dwarf_max_cu_functions) {
      pending at = stack.back();
      stack.pop_back();
      Dwarf_Die next;
      if (libdw().dwarf_siblingof(&at.die, &next) == 0) stack.push_back(pending{next, at.depth, at.parent});
      int tag = libdw().dwarf_tag(&at.die);
      std::int32_t parent = at.parent;
      if (dwarf_is_function(tag)) {
        parent = static_cast<std::int32_t>(functions.size());
        functions.push_back(function{at.die, at.parent});
        Dwarf_Addr base = 0, low = 0, high = 0;
        for (std::ptrdiff_t off = 0; (off = libdw().dwarf_ranges(&at.die, off, &base, &low, &high)) > 0;)
          if (high > low) intervals.push_back(interval{low, high, at.depth, parent});
      }
      // Code lives in functions, blocks, and functions nested in namespaces and classes; types,
      // variables and parameters hold none, so their subtrees are skipped.
      bool may_hold_code = dwarf_is_function(tag) || tag == DW_TAG_lexical_block || tag == DW_TAG_namespace ||
                           tag == DW_TAG_class_type || tag == DW_TAG_structure_type ||
                           tag == DW_TAG_union_type || tag == DW_TAG_module;
      Dwarf_Die child;
      if (may_hold_code && libdw().dwarf_haschildren(&at.die) > 0 &&
          libdw().dwarf_child(&at.die, &child) == 0)
        stack.push_back(pending{child, at.depth + 1, parent});
    }
    // Sweep the range boundaries; the deepest interval active over each elementary piece owns it.
    std::vector<Dwarf_Addr> bounds;
    for (const auto& i : intervals) {
      bounds.push_back(i.low);
      bounds.push_back(i.high);
    }
    std::sort(bounds.begin(), bounds.end());
    bounds.erase(std::unique(bounds.begin(), bounds.end()), bounds.end());
    std::sort(intervals.begin(), intervals.end(),
              [](const interval& a, const interval& b) { return a.low < b.low; });
    auto shallower = [](const interval& a, const interval& b) {
      return a.depth != b.depth ? a.depth < b.depth
                                : a.low < b.low;  // ties: the later start is the inner one
    };
    std::vector<interval> active;  // a heap, the deepest on top (what std::priority_queue would do)
    std::size_t next = 0;
    for (Dwarf_Addr b : bounds) {
      while (next < intervals.size() && intervals[next].low <= b) {
        active.push_back(intervals[next++]);
        std::push_heap(active.begin(), active.end(), shallower);
      }
      while (!active.empty() && active.front().high <= b) {  // lazily drops ended intervals
        std::pop_heap(active.begin(), active.end(), shallower);
        active.pop_back();
      }
      // An ended interval under a deeper active one is dropped when it surfaces: check the top only.
      std::int32_t owner = active.empty() ? -1 : active.front().function;
      if (segments.empty() || segments.back().owner != owner) segments.push_back(segment{b, owner});
    }
  }
};

class dwarf_lines {
 public:
  static constexpr bool enabled = true;

  dwarf_lines() = default;
  explicit dwarf_lines(std::vector<std::string> debug_roots, lines_mode mode = lines_mode::automatic)
      : debug_roots_(std::move(debug_roots)), mode_(mode) {}

  // Which files later lookups read (files already opened or skipped stay so).
  void set_mode(lines_mode mode) { mode_ = mode; }

  // The source chain of `vaddr` (an ELF virtual address of module `m`'s file, i.e. the run-time
  // address minus the module's bias), or nullptr when no DWARF covers it. The pointer stays valid for
  // the lifetime of this object.
  const source_chain* lookup(const module& m, std::uint64_t vaddr) {
    if (mode_ == lines_mode::none || m.kind != module_kind::file || !m.symbols || !m.symbols->elf_ok ||
        !libdw().ok)
      return nullptr;
    dwarf_file* file = file_for(m);  // heap-allocated: Dwfl keeps pointers to its callbacks and userdata
    if (file == nullptr || !file->has_dwarf) {
      if (file != nullptr && !file->skipped.empty() &&
          std::find(noted_.begin(), noted_.end(), file) == noted_.end()) {
        noted_.push_back(file);
        warnings_.push_back(file->skipped);
      }
      return nullptr;
    }
    auto cached = file->chains.find(vaddr);
    if (cached != file->chains.end()) return cached->second.empty() ? nullptr : &cached->second;
    ++queries_;
    source_chain& chain = file->chains[vaddr];
    query(*file, vaddr, chain);
    return chain.empty() ? nullptr : &chain;
  }

  std::size_t files_opened() const { return files_opened_; }  // module files given a Dwfl session
  std::size_t files_with_dwarf() const { return files_with_dwarf_; }
  std::size_t queries() const { return queries_; }              // lookups that reached libdw (cache misses)
  std::size_t files_skipped() const { return files_skipped_; }  // compressed DWARF left unread
  // One line per skipped file that lookups reached since the last call, for a profile's notes.
  std::vector<std::string> take_warnings() {
    noted_.clear();
    return std::exchange(warnings_, {});
  }

 private:
  struct dwarf_file {
    std::shared_ptr<module_symbols> symbols;  // keeps the cache key alive; holds debug_path
    Elf* elf = nullptr;  // the file with the DWARF, read with pread, until find_elf gives it to Dwfl
    int fd = -1;         // its descriptor, likewise
    Dwfl_Callbacks callbacks{};
    Dwfl* dwfl = nullptr;
    Dwfl_Module* mod = nullptr;
    bool has_dwarf = false;
    std::string skipped;  // why its DWARF was left unread (lines_mode), else empty
    std::unordered_map<std::uint64_t, source_chain> chains;
    std::unordered_map<Dwarf_Off, dwarf_cu_index> units;  // by the compile unit DIE's offset

    dwarf_file() = default;
    dwarf_file(const dwarf_file&) = delete;
    dwarf_file& operator=(const dwarf_file&) = delete;
    ~dwarf_file() {
      if (dwfl != nullptr) libdw().dwfl_end(dwfl);
      if (elf != nullptr) libdw().elf_end(elf);
      if (fd >= 0) sys().close(fd);
    }
  };

  // The Dwfl session of m's file, opened on first use (remembered, so a module without debug info
  // costs one attempt); has_dwarf is false when the file cannot be read, has no DWARF or was skipped.
  dwarf_file* file_for(const module& m) {
    auto it = files_.find(m.symbols.get());
    if (it == files_.end()) it = files_.emplace(m.symbols.get(), open_file(m)).first;
    return it->second.get();
  }

  std::unique_ptr<dwarf_file> open_file(const module& m) {
    auto file = std::make_unique<dwarf_file>();
    file->symbols = m.symbols;
    // A deleted file or memfd is reachable only through map_files while mapped (see modules.hpp).
    bool hidden = m.deleted || m.path.compare(0, 7, "/memfd:") == 0, readable = false;
    char buffer[64];
    std::snprintf(buffer, sizeof buffer, "/proc/self/map_files/%llx-%llx",
                  static_cast<unsigned long long>(m.start), static_cast<unsigned long long>(m.end));
    std::string path = hidden ? std::string(buffer) : m.path, search = hidden ? std::string() : m.path;
    bool compressed = false;
    std::string from =
        dwarf_source_path(debug_roots_, path, m.inode, search, m.symbols->debug_path, readable, compressed);
    if (!readable && !hidden) {
      path = buffer;
      from =
          dwarf_source_path(debug_roots_, path, m.inode, search, m.symbols->debug_path, readable, compressed);
    }
    if (!readable) return file;
    if (compressed && mode_ == lines_mode::automatic) {
      ++files_skipped_;
      file->skipped = "no file:line or inline frames for " + m.basename + ": its DWARF (" + from +
                      ") is compressed, and libdw inflates all of it first (SELFPROF_LINES=all reads it)";
      return file;
    }
    ++files_opened_;
    // libdwfl would map the file itself (ELF_C_READ_MMAP_PRIVATE), and a mapped file truncated in place
    // raises SIGBUS: the file with the DWARF is opened here with ELF_C_READ (pread) and given to Dwfl as
    // the module's ELF by find_elf, so nothing needs find_debuginfo.
    // The session, and so the descriptor, lives as long as the cache: above the application's range, where
    // a program that closes or reuses its low descriptors cannot take it from under libdw.
    if (!from.empty()) file->fd = keep_fd_high(open_regular_file(from, from == path ? m.inode : 0));
    if (file->fd >= 0 && libdw().elf_version(EV_CURRENT) != EV_NONE)  // elf_begin fails before elf_version
      file->elf = libdw().elf_begin(file->fd, ELF_C_READ, nullptr);
    Dwarf_Addr low = 0, high = 0;
    if (!load_span(file->elf, low, high)) return file;
    file->callbacks.find_elf = &dwarf_lines::find_elf;
    file->callbacks.find_debuginfo = &dwarf_lines::no_debuginfo;
    file->dwfl = libdw().dwfl_begin(&file->callbacks);
    if (file->dwfl == nullptr) return file;
    libdw().dwfl_report_begin(file->dwfl);
    // Spanning the PT_LOAD segments from the first one's aligned address gives a zero bias: Dwfl
    // addresses are the file's own virtual addresses (ET_DYN and ET_EXEC).
    file->mod = libdw().dwfl_report_module(file->dwfl, m.basename.c_str(), low, high);
    libdw().dwfl_report_end(file->dwfl, nullptr, nullptr);
    if (file->mod == nullptr) return file;
    void** userdata = nullptr;
    libdw().dwfl_module_info(file->mod, &userdata, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr);
    if (userdata != nullptr) *userdata = file.get();
    Dwarf_Addr bias = 0;
    file->has_dwarf = libdw().dwfl_module_getdwarf(file->mod, &bias) != nullptr;
    if (file->has_dwarf) ++files_with_dwarf_;
    return file;
  }

  // The addresses of `elf`'s PT_LOAD segments, from the first one's start aligned down as libdwfl aligns
  // it; false when there are none.
  static bool load_span(Elf* elf, Dwarf_Addr& low, Dwarf_Addr& high) {
    std::size_t count = 0;
    if (elf == nullptr || libdw().elf_getphdrnum(elf, &count) != 0) return false;
    for (std::size_t i = 0; i < count; ++i) {
      GElf_Phdr ph;
      if (libdw().gelf_getphdr(elf, static_cast<int>(i), &ph) == nullptr || ph.p_type != PT_LOAD) continue;
      if (high == 0) low = ph.p_vaddr & ~(ph.p_align - 1);
      high = std::max<Dwarf_Addr>(high, ph.p_vaddr + ph.p_memsz);
    }
    return high > low;
  }

  // Dwfl's find_elf callback: gives Dwfl the file open_file opened (Dwfl takes the Elf and descriptor).
  static int find_elf(Dwfl_Module*, void** userdata, const char*, Dwarf_Addr, char**, Elf** elfp) {
    if (userdata == nullptr || *userdata == nullptr) return -1;
    auto& file = *static_cast<dwarf_file*>(*userdata);
    *elfp = std::exchange(file.elf, nullptr);
    return std::exchange(file.fd, -1);
  }
  // Dwfl's find_debuginfo callback: the file given by find_elf holds the DWARF; there is no other.
  static int no_debuginfo(Dwfl_Module*, void**, const char*, Dwarf_Addr, const char*, const char*, GElf_Word,
                          char**) {
    return -1;
  }

  // Fills `chain` (outermost first) for `vaddr`; leaves it empty when no DWARF covers the address.
  static void query(dwarf_file& file, std::uint64_t vaddr, source_chain& chain) {
    Dwarf_Addr bias = 0;
    Dwarf_Die* cu = libdw().dwfl_module_addrdie(file.mod, vaddr, &bias);
    if (cu == nullptr) return;
    const Dwarf_Addr pc = vaddr - bias;
    Dwarf_Attribute comp_attr;
    const char* comp_dir = libdw().dwarf_formstring(libdw().dwarf_attr(cu, DW_AT_comp_dir, &comp_attr));

    // The innermost location: the line table row of the address.
    source_frame innermost;
    if (Dwarf_Line* row = libdw().dwarf_getsrc_die(cu, pc)) {
      if (const char* name = libdw().dwarf_linesrc(row, nullptr, nullptr))
        innermost.file = source_path(name, comp_dir);
      int line = 0;
      if (libdw().dwarf_lineno(row, &line) == 0 && line > 0)
        innermost.line = static_cast<std::uint32_t>(line);
    }

    // The deepest function holding pc, then its parents in the DIE tree, as addr2line -i walks them
    // (a nested inlined call can hold pc where its parent's ranges do not, seen with GCC -O2).
    auto unit = file.units.find(libdw().dwarf_dieoffset(cu));
    if (unit == file.units.end()) {
      unit = file.units.emplace(libdw().dwarf_dieoffset(cu), dwarf_cu_index()).first;
      unit->second.build(cu);
    }
    const dwarf_cu_index& index = unit->second;
    std::vector<source_frame> inner_first;  // the chain, innermost first
    Dwarf_Files* files = nullptr;
    std::size_t nfiles = 0;
    bool have_files = false, files_tried = false;
    source_frame current = innermost;  // the location inside the scope being visited
    std::int32_t at = index.find(pc);
    for (std::size_t level = 0; at >= 0 && level < dwarf_max_inline_depth; ++level) {
      Dwarf_Die die = index.functions[static_cast<std::size_t>(at)].die;
      at = index.functions[static_cast<std::size_t>(at)].parent;
      Dwarf_Die* scope = &die;
      int tag = libdw().dwarf_tag(scope);
      current.function = function_name(scope);
      current.inlined = tag == DW_TAG_inlined_subroutine;
      if (!current.inlined) {
        inner_first.push_back(std::move(current));
        break;
      }
      // The caller's location is where this inlined instance was called from.
      source_frame caller;
      Dwarf_Attribute attr;
      Dwarf_Word value = 0;
      if (libdw().dwarf_formudata(libdw().dwarf_attr(scope, DW_AT_call_file, &attr), &value) == 0) {
        if (!files_tried) {
          files_tried = true;
          have_files = libdw().dwarf_getsrcfiles(cu, &files, &nfiles) == 0;
        }
        if (have_files && value < nfiles)
          if (const char* name =
                  libdw().dwarf_filesrc(files, static_cast<std::size_t>(value), nullptr, nullptr))
            caller.file = source_path(name, comp_dir);
      }
      if (libdw().dwarf_formudata(libdw().dwarf_attr(scope, DW_AT_call_line, &attr), &value) == 0 &&
          value <= UINT32_MAX)
        caller.line = static_cast<std::uint32_t>(value);
      inner_first.push_back(std::move(current));
      current = std::move(caller);
    }
    if (inner_first.empty() || inner_first.back().inlined) {
      // No enclosing real function in the DWARF (assembly with line info only, or a cut walk): the
      // outermost level is the location reached so far, unnamed.
      current.inlined = false;
      if (!current.file.empty() || current.line != 0 || !inner_first.empty())
        inner_first.push_back(std::move(current));
    }
    chain.assign(std::make_move_iterator(inner_first.rbegin()), std::make_move_iterator(inner_first.rend()));
  }

  // libdw joins a file name with its line-table directory but leaves a relative directory (a file
  // compiled as `cc ../src/x.c`) relative; addr2line then prefixes the compile directory: so do we.
  static std::string source_path(const char* name, const char* comp_dir) {
    if (name[0] == '/' || comp_dir == nullptr || comp_dir[0] == '\0') return name;
    std::string out = comp_dir;
    if (out.back() != '/') out += '/';
    return out + name;
  }

  // Demangled linkage name (following abstract origin and specification), else the plain DWARF name.
  static std::string function_name(Dwarf_Die* die) {
    Dwarf_Attribute attr;
    const char* linkage =
        libdw().dwarf_formstring(libdw().dwarf_attr_integrate(die, DW_AT_linkage_name, &attr));
    if (linkage == nullptr)
      linkage = libdw().dwarf_formstring(libdw().dwarf_attr_integrate(die, DW_AT_MIPS_linkage_name, &attr));
    if (linkage != nullptr) return demangle(linkage);
    const char* name = libdw().dwarf_diename(die);
    return name != nullptr ? std::string(name) : std::string();
  }

  std::vector<std::string> debug_roots_{"/usr/lib/debug"};
  lines_mode mode_ = lines_mode::automatic;
  std::map<const module_symbols*, std::unique_ptr<dwarf_file>> files_;
  std::vector<std::string> warnings_;
  std::vector<dwarf_file*> noted_;  // files whose `skipped` is in the warnings not yet taken
  std::size_t files_skipped_ = 0;
  std::size_t files_opened_ = 0;
  std::size_t files_with_dwarf_ = 0;
  std::size_t queries_ = 0;
};

#else  // !SELFPROF_HAS_LIBDW

// Without libdw: no source lines, no inline frames; the symbolizer names functions from ELF symbols.
class dwarf_lines {
 public:
  static constexpr bool enabled = false;
  dwarf_lines() = default;
  explicit dwarf_lines(const std::vector<std::string>&, lines_mode = lines_mode::automatic) {}
  void set_mode(lines_mode) {}
  const source_chain* lookup(const module&, std::uint64_t) { return nullptr; }
  std::size_t files_skipped() const { return 0; }
  std::vector<std::string> take_warnings() { return {}; }
  std::size_t files_opened() const { return 0; }
  std::size_t files_with_dwarf() const { return 0; }
  std::size_t queries() const { return 0; }
};

#endif  // SELFPROF_HAS_LIBDW

}  // namespace detail
}  // namespace selfprof
