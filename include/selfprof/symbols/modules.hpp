// The module registry: executable mappings of this process from /proc/self/maps (files with their load
// bias, the vdso read from memory, anonymous memory, memfd and deleted files), each file's symbols parsed
// once, and unmapped modules kept so samples taken before a dlclose still get names.
// Context: collector thread (refresh ~every 100 ms) or setup; not thread-safe, never the signal handler.
//
// A file's symbols are read at the first lookup of an address in it (find), not when it is first seen:
// a dump costs what its sampled modules weigh, not every mapped library (docs/measurements.md). So
// that a late read never names one file's code with another's symbols, the path's stat (device, inode,
// size, mtime) is noted when the file is first seen. If another file is at the path by the read (an
// upgrade), the mapped one is read through map_files where the process may; if the file changed in
// place, or map_files is closed to it, there are no symbols and a warning says why. Read at once
// instead: deleted files and memfds (they may be gone by the first lookup), files whose path cannot be
// stat'ed, and a file whose mapping went away before any lookup (read when the unmap is seen, so a
// dlclose'd library keeps its names).
#pragma once

#include <dirent.h>
#include <link.h>
#include <sys/auxv.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "selfprof/symbols/debug_file.hpp"
#include "selfprof/symbols/elf.hpp"
#include "selfprof/symbols/mapped_file.hpp"
#include "selfprof/symbols/minidebuginfo.hpp"
#include "selfprof/symbols/proc_maps.hpp"
#include "selfprof/symbols/symbol_table.hpp"

namespace selfprof {
namespace detail {

enum class module_kind : std::uint8_t {
  file,       // a file-backed mapping (also memfd and deleted files)
  vdso,       // the kernel's vdso, parsed from memory
  anonymous,  // anonymous executable memory (JIT code); named only by perf maps
  special,    // other kernel-provided mappings such as [vsyscall]
};

// What was parsed from one ELF file (shared by every mapping of that file).
struct module_symbols {
  std::string build_id;
  std::string debug_path;             // separate debug file used, if any
  std::vector<elf_segment> segments;  // for the load bias of each mapping
  symbol_table table;
  bool elf_ok = false;
  // Not read yet (see the top of this file): the mapping it was first seen in, and its path's stat then.
  bool pending = false;
  maps_entry first_seen;
  struct stat stamp {};
};

struct module {
  std::uint64_t start = 0;
  std::uint64_t end = 0;
  std::uint64_t offset = 0;  // file offset mapped at start
  std::uint64_t bias = 0;    // run-time address minus ELF virtual address (once bias_known)
  std::uint64_t inode = 0;
  std::uint32_t dev_major = 0;
  std::uint32_t dev_minor = 0;
  std::string path;      // as in the maps (without " (deleted)"), "[vdso]", or "//anon"
  std::string basename;  // for "[basename+0xoffset]" names
  module_kind kind = module_kind::file;
  bool deleted = false;
  bool bias_known = false;                  // false while its file's symbols (and segments) are unread
  bool mapped = true;                       // false once unmapped; kept so earlier samples are still named
  std::uint64_t unmapped_seq = 0;           // orders unmapped modules: a later unmap wins an overlap
  std::shared_ptr<module_symbols> symbols;  // null for anonymous and special mappings
};

// Files' symbols by device, inode and path, shared by the registries of several processes (the recorder
// of `selfprof record --follow-exec` names every process's frames, reading each library once).
using shared_file_symbols = std::unordered_map<std::string, std::shared_ptr<module_symbols>>;

struct module_registry_options {
  std::vector<std::string> debug_roots{"/usr/lib/debug"};  // where build-id and debuglink files live
  std::string maps_path = "/proc/self/maps";
  std::shared_ptr<shared_file_symbols> shared_files;  // null: this registry's own
};

class module_registry {
 public:
  module_registry() = default;
  explicit module_registry(module_registry_options options) : options_(std::move(options)) {}

  // Re-reads the maps when the dynamic loader's load/unload counters (dl_iterate_phdr's dlpi_adds and
  // dlpi_subs) moved since the last snapshot, or on the first call: a few hundred nanoseconds otherwise.
  // Returns true when the module set changed.
  bool refresh() {
    std::pair<unsigned long long, unsigned long long> counters = loader_counters();
    if (scans_ != 0 && counters == last_counters_) return false;
    last_counters_ = counters;
    return rescan();
  }

  // Re-reads the maps unconditionally (for mappings made without the loader: JIT code, mmap of a
  // file); returns early when the text is unchanged. Returns true when the module set changed.
  bool rescan() {
    std::string text;
    if (!read_text_file(options_.maps_path.c_str(), text)) {
      warn("selfprof: cannot read " + options_.maps_path + "; frames will be [unknown]");
      return false;
    }
    ++reads_;
    text = executable_lines(text);  // data mappings come and go with every allocation: ignore them
    if (scans_ != 0 && text == last_text_) return false;
    last_text_ = std::move(text);
    ++scans_;
    apply(last_text_);
    return true;
  }

  // Takes the executable lines of maps text as the module set (another process's, written down by it:
  // see dump/raw_dump.hpp), parsing the symbols of new files.
  void apply_maps_text(const std::string& text) {
    ++scans_;
    apply(text);
  }

  // The module holding `address`: a mapped one first, else the most recently unmapped one; its file's
  // symbols are read now if they were not yet. The pointer is valid until the next refresh()/rescan().
  const module* find(std::uint64_t address) {
    module* m = locate(address);
    if (m != nullptr) load(*m);
    return m;
  }

  // Reads the symbols of every module not read yet (tests; a caller that walks modules()).
  void load_all() {
    for (module& m : modules_) load(m);
  }

  // Every module; a file's `symbols` and `bias` are filled once it was looked up (see load_all).
  const std::vector<module>& modules() const { return modules_; }
  // Messages about modules whose symbols could not be read (one per file); cleared by this call.
  std::vector<std::string> take_warnings() { return std::exchange(warnings_, {}); }
  std::uint64_t scans() const { return scans_; }               // times the maps text changed and was applied
  std::uint64_t reads() const { return reads_; }               // times the maps file was read
  std::size_t parsed_files() const { return parsed_.size(); }  // files seen (read or pending)
  std::size_t loaded_files() const { return loaded_; }         // files whose symbols were read

 private:
  module* locate(std::uint64_t address) {
    auto it = std::upper_bound(mapped_.begin(), mapped_.end(), address,
                               [this](std::uint64_t a, std::size_t i) { return a < modules_[i].start; });
    if (it != mapped_.begin()) {
      module& m = modules_[*(it - 1)];
      if (address < m.end) return &m;
    }
    for (std::size_t i : unmapped_)
      if (address >= modules_[i].start && address < modules_[i].end) return &modules_[i];
    return nullptr;
  }

  // Reads the module's file symbols if still pending, then fixes its bias from the file's segments.
  void load(module& m) {
    if (m.bias_known) return;
    if (m.symbols && m.symbols->pending) read_file_symbols(*m.symbols);
    m.bias = m.symbols && m.symbols->elf_ok ? elf_load_bias(m.symbols->segments, m.start, m.offset)
                                            : m.start - m.offset;
    m.bias_known = true;
  }

  // Keys are bytes: fixed-width numbers, then the path, so one string-keyed map type serves every index
  // (each distinct map type costs every including file its instantiation).
  static void append_key(std::string& key, std::uint64_t v) {
    char bytes[sizeof v];
    std::memcpy(bytes, &v, sizeof v);
    key.append(bytes, sizeof v);
  }

  // Identifies a mapping: start, end, offset, inode, path (anonymous memory: no path).
  static std::string mapping_key(std::uint64_t start, std::uint64_t end, std::uint64_t offset,
                                 std::uint64_t inode, const std::string& path) {
    std::string key;
    key.reserve(32 + path.size());
    append_key(key, start);
    append_key(key, end);
    append_key(key, offset);
    append_key(key, inode);
    key += path;
    return key;
  }

  // Identifies a file: device, inode, path.
  static std::string file_key(const maps_entry& e) {
    std::string key;
    key.reserve(24 + e.path.size());
    append_key(key, e.dev_major);
    append_key(key, e.dev_minor);
    append_key(key, e.inode);
    key += e.path;
    return key;
  }

  // Orders indices into modules_: by start address, or for unmapped ones the latest unmapped first.
  struct module_order {
    const std::vector<module>* modules;
    bool latest_unmapped_first;
    bool operator()(std::size_t a, std::size_t b) const {
      const module& x = (*modules)[a];
      const module& y = (*modules)[b];
      return latest_unmapped_first ? x.unmapped_seq > y.unmapped_seq : x.start < y.start;
    }
  };

  static std::pair<unsigned long long, unsigned long long> loader_counters() {
    std::pair<unsigned long long, unsigned long long> out{0, 0};
    ::dl_iterate_phdr(
        [](struct dl_phdr_info* info, std::size_t size, void* data) -> int {
          if (size >= offsetof(struct dl_phdr_info, dlpi_subs) + sizeof(info->dlpi_subs)) {
            auto* c = static_cast<std::pair<unsigned long long, unsigned long long>*>(data);
            c->first = info->dlpi_adds;
            c->second = info->dlpi_subs;
          }
          return 1;  // the counters are the same in every entry: stop after the first
        },
        &out);
    return out;
  }

  // The lines of maps text whose permissions include 'x' ("start-end r-xp ...").
  static std::string executable_lines(const std::string& text) {
    std::string out;
    std::size_t pos = 0;
    while (pos < text.size()) {
      std::size_t eol = text.find('\n', pos);
      if (eol == std::string::npos) eol = text.size();
      std::size_t space = text.find(' ', pos);
      if (space != std::string::npos && space + 3 < eol && text[space + 3] == 'x')
        out.append(text, pos, eol - pos + 1);
      pos = eol + 1;
    }
    return out;
  }

  void warn(std::string message) { warnings_.push_back(std::move(message)); }

  void warn_no_symbols(const std::string& path, const status& why) {
    std::string m = "selfprof: no symbols for ";
    m += path;
    m += ": ";
    m += why.message();
    m += "; its frames are named [module+0xoffset]";
    warn(std::move(m));
  }

  void apply(const std::string& text) {
    std::vector<module> next;
    std::vector<bool> seen(modules_.size(), false);
    std::unordered_map<std::string, std::size_t> index;
    for (std::size_t i = 0; i < modules_.size(); ++i) index.emplace(key_of(modules_[i]), i);

    for_each_executable_mapping(text, [&](const maps_entry& e) {
      auto found = index.find(mapping_key(e.start, e.end, e.offset, e.inode, e.path));
      if (found != index.end()) {
        seen[found->second] = true;
        next.push_back(modules_[found->second]);
        next.back().mapped = true;
      } else {
        next.push_back(make_module(e));
      }
    });
    // Unmapped modules stay (anonymous memory excepted: it has no symbols to keep).
    for (std::size_t i = 0; i < modules_.size(); ++i) {
      if (seen[i] || modules_[i].kind == module_kind::anonymous) continue;
      module m = modules_[i];
      if (m.mapped) m.unmapped_seq = ++unmapped_seq_;
      load(m);  // the file's path may soon name another file (or none): read it while it is the same
      m.mapped = false;
      next.push_back(std::move(m));
    }
    modules_ = std::move(next);
    mapped_.clear();
    unmapped_.clear();
    for (std::size_t i = 0; i < modules_.size(); ++i) (modules_[i].mapped ? mapped_ : unmapped_).push_back(i);
    std::sort(mapped_.begin(), mapped_.end(), module_order{&modules_, false});
    std::sort(unmapped_.begin(), unmapped_.end(), module_order{&modules_, true});
  }

  static std::string key_of(const module& m) {
    static const std::string no_path;
    return mapping_key(m.start, m.end, m.offset, m.inode,
                       m.kind == module_kind::anonymous && m.path == "//anon" ? no_path : m.path);
  }

  module make_module(const maps_entry& e) {
    module m;
    m.start = e.start;
    m.end = e.end;
    m.offset = e.offset;
    m.inode = e.inode;
    m.dev_major = e.dev_major;
    m.dev_minor = e.dev_minor;
    m.deleted = e.deleted;
    m.path = e.path;
    if (e.path.empty()) {
      m.kind = module_kind::anonymous;
      m.path = "//anon";
    } else if (e.path == "[vdso]") {
      m.kind = module_kind::vdso;
    } else if (e.path[0] == '[') {
      m.kind = e.path == "[vsyscall]" ? module_kind::special : module_kind::anonymous;
    }
    std::string::size_type slash = m.path.rfind('/');
    if (m.kind == module_kind::file)
      m.basename = slash == std::string::npos ? m.path : m.path.substr(slash + 1);
    else if (m.path.size() > 2 && m.path.front() == '[' && m.path.back() == ']')
      m.basename = m.path.substr(1, m.path.size() - 2);  // "[vdso]" names frames "[vdso+0x...]"
    else
      m.basename = m.path;
    if (m.kind == module_kind::file) m.symbols = file_symbols(e);
    if (m.kind == module_kind::vdso) m.symbols = vdso_symbols(e);
    if (!m.symbols || !m.symbols->pending) load(m);  // the bias is known now
    return m;
  }

  std::shared_ptr<module_symbols> file_symbols(const maps_entry& e) {
    auto [cached, fresh] = parsed_index_.try_emplace(file_key(e), parsed_.size());
    if (!fresh) return parsed_[cached->second];
    if (options_.shared_files) {
      auto [shared, first] = options_.shared_files->try_emplace(cached->first);
      if (!first) {
        parsed_.push_back(shared->second);
        return shared->second;
      }
      shared->second = std::make_shared<module_symbols>();
      parsed_.push_back(shared->second);
    } else {
      parsed_.push_back(std::make_shared<module_symbols>());
    }
    std::shared_ptr<module_symbols> result = parsed_.back();
    result->first_seen = e;
    const bool hidden = e.hidden_file();
    result->pending = !hidden && ::stat(e.path.c_str(), &result->stamp) == 0;
    if (!result->pending) read_file_symbols(*result);
    return result;
  }

  static bool same_stamp(const struct stat& a, const struct stat& b) {
    return a.st_dev == b.st_dev && a.st_ino == b.st_ino && a.st_size == b.st_size &&
           a.st_mtim.tv_sec == b.st_mtim.tv_sec && a.st_mtim.tv_nsec == b.st_mtim.tv_nsec;
  }

  // Reads the symbols of the file first seen in `result->first_seen` into `result`.
  void read_file_symbols(module_symbols& result) {
    const bool was_pending = std::exchange(result.pending, false);
    const maps_entry& e = result.first_seen;
    ++loaded_;
    // Deleted files and memfds are reachable through /proc/self/map_files (opening its entries needs
    // CAP_SYS_ADMIN, or CAP_CHECKPOINT_RESTORE since Linux 5.9; see proc(5)), else through a descriptor
    // we still hold; map_files also serves a file replaced on disk since it was mapped.
    char buffer[64];
    std::snprintf(buffer, sizeof buffer, "/proc/self/map_files/%llx-%llx",
                  static_cast<unsigned long long>(e.start), static_cast<unsigned long long>(e.end));
    std::string via_map_files = buffer;
    mapped_file file;
    if (was_pending) {
      struct stat now {};
      const bool same_path = ::stat(e.path.c_str(), &now) == 0;
      if (!same_path || !same_stamp(now, result.stamp)) {
        // Another file at the path now (an upgrade renames a new one over it): the mapped one may still
        // be reached through map_files. The same file changed in place: its old bytes are gone.
        const bool replaced =
            !same_path || now.st_ino != result.stamp.st_ino || now.st_dev != result.stamp.st_dev;
        status st = replaced ? file.open(via_map_files, e.inode) : status::error("rewritten in place");
        if (!st) {
          warn_no_symbols(
              e.path, status::error(e.path + ": changed on disk since it was mapped (" + st.message() + ")"));
          return;
        }
        load_from(file, e, false, result);
        return;
      }
    }
    const bool hidden = e.hidden_file();
    status st = file.open(hidden ? via_map_files : e.path, e.inode);
    if (!st && hidden) st = open_through_fd(e, file);
    if (!st && !hidden) st = file.open(via_map_files, e.inode);
    // Overlay file systems can report another inode in the maps than fstat does: last, trust the path.
    if (!st && !hidden) st = file.open(e.path);
    if (!st) {
      warn_no_symbols(e.path, st);
      return;
    }
    load_from(file, e, hidden, result);
  }

  // Parses the open `file` (the mapping `e`'s) into `result`.
  void load_from(mapped_file& file, const maps_entry& e, bool hidden, module_symbols& result) {
    elf_image image;
    status st = image.parse(file, e.path);
    if (st) load_elf(image, e.path, hidden, result);
    // Symbols of a file that changed while being read could mix two versions: none rather than wrong.
    if (status unchanged = file.check(); !unchanged) {
      maps_entry keep = e;
      result = module_symbols();
      result.first_seen = std::move(keep);
      st = unchanged;
    }
    if (!st) warn_no_symbols(e.path, st);
  }

  // Without the rights map_files needs, a memfd or deleted file is still readable through a
  // descriptor the process holds open (a JIT usually keeps its memfd): find it in /proc/self/fd.
  static status open_through_fd(const maps_entry& e, mapped_file& file) {
    DIR* dir = ::opendir("/proc/self/fd");
    if (dir == nullptr) return status::error(e.path + ": no readable descriptor");
    status st = status::error(e.path + ": not in map_files (permission) nor held open by this process");
    while (struct dirent* d = ::readdir(dir)) {
      if (d->d_name[0] < '0' || d->d_name[0] > '9') continue;
      std::string path = std::string("/proc/self/fd/") + d->d_name;
      struct stat sb;
      if (::stat(path.c_str(), &sb) != 0 || static_cast<std::uint64_t>(sb.st_ino) != e.inode ||
          major(sb.st_dev) != e.dev_major || minor(sb.st_dev) != e.dev_minor || !S_ISREG(sb.st_mode))
        continue;
      if (file.open(path, e.inode)) {
        st = status::ok();
        break;
      }
    }
    ::closedir(dir);
    return st;
  }

  std::shared_ptr<module_symbols> vdso_symbols(const maps_entry& e) {
    auto result = std::make_shared<module_symbols>();
    // The vdso is mapped whole and laid out as its file, so its section headers are in memory too.
    unsigned long base = ::getauxval(AT_SYSINFO_EHDR);
    if (base == 0 || base < e.start || base >= e.end || !e.readable) return result;
    elf_image image;
    byte_view bytes{reinterpret_cast<const unsigned char*>(base), static_cast<std::size_t>(e.end - base)};
    status st = image.parse(bytes, "[vdso]");
    if (st) load_elf(image, "[vdso]", true, *result);
    if (!st) warn_no_symbols("[vdso]", st);
    return result;
  }

  // Fills `out` from a parsed image: its .symtab (else the debug file's, else its MiniDebugInfo's),
  // .dynsym and PLT stubs.
  void load_elf(const elf_image& image, const std::string& path, bool no_debug_search, module_symbols& out) {
    out.elf_ok = true;
    out.segments = image.segments();
    out.build_id = image.build_id();
    std::size_t from_symtab = 0;
    if (const elf_section* symtab = image.find_section_type(SHT_SYMTAB))
      from_symtab = out.table.add_symbols(image, *symtab);
    if (from_symtab == 0) {
      debug_file debug;
      // A deleted or memory file has no directory for debuglink; build-id lookups still work.
      if (find_debug_file(options_.debug_roots, no_debug_search ? std::string() : path, image, debug)) {
        if (const elf_section* symtab = debug.image.find_section_type(SHT_SYMTAB))
          out.table.add_symbols(debug.image, *symtab);
        out.debug_path = debug.path;
        if (status unchanged = debug.file.check(); !unchanged) {  // could mix two versions: not used
          out.table = symbol_table();
          out.debug_path.clear();
          warn("selfprof: debug file not used: " + unchanged.message());
        }
      }
      // No debug file: the MiniDebugInfo some distributions embed names the local functions.
      std::string why;
      if (out.debug_path.empty() && add_minidebuginfo(image, path, out.table, why) == 0 && !why.empty())
        warn("selfprof: MiniDebugInfo (.gnu_debugdata) of " + path + " not read: " + why +
             "; its local functions are named [module+0xoffset]");
    }
    if (const elf_section* dynsym = image.find_section_type(SHT_DYNSYM))
      out.table.add_symbols(image, *dynsym);
    out.table.add_plt(image);
    out.table.finish();
  }

  module_registry_options options_;
  std::vector<module> modules_;
  std::vector<std::size_t> mapped_;                            // indices into modules_, by start address
  std::vector<std::size_t> unmapped_;                          // indices into modules_, latest unmapped first
  std::vector<std::shared_ptr<module_symbols>> parsed_;        // each file's symbols, parsed once
  std::unordered_map<std::string, std::size_t> parsed_index_;  // file_key -> index in parsed_
  std::vector<std::string> warnings_;
  std::string last_text_;
  std::pair<unsigned long long, unsigned long long> last_counters_{0, 0};
  std::uint64_t scans_ = 0;
  std::uint64_t reads_ = 0;
  std::uint64_t unmapped_seq_ = 0;
  std::size_t loaded_ = 0;
};

}  // namespace detail
}  // namespace selfprof
