// Builds the unwind rows of loaded modules (.eh_frame found through dl_iterate_phdr and PT_GNU_EH_FRAME,
// copied out of memory) and publishes them to the signal handler as one immutable set. The collector
// builds lazily: a module is parsed once a sample reached its code (frame pointers there until then).
// Parsed rows are kept while the module stays loaded (across stop/start too) and reused only while the
// same file (device, inode, size, mtime) sits at the same address with the same .eh_frame_hdr and
// .eh_frame bytes. Each module's rows are clipped to its own executable segments.
// Context: setup only (start/stop) and the collector thread; the handler only reads g_unwind_tables.
#pragma once

#include <elf.h>
#include <link.h>
#include <sys/stat.h>

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "selfprof/detail/sys.hpp"
#include "selfprof/signal/arch_x86_64.hpp"
#include "selfprof/signal/unwind_rows.hpp"
#include "selfprof/status.hpp"
#include "selfprof/unwind/eh_frame.hpp"

namespace selfprof {

// What the last build found, for stats and verbose output.
struct unwind_tables_info {
  bool published = false;
  std::size_t modules = 0;         // modules with rows in the published set
  std::size_t rows = 0;            // rows in the published set
  std::size_t bytes = 0;           // memory held by every table and set kept (retired ones too)
  std::size_t builds = 0;          // sets published since the last release
  std::size_t parsed = 0;          // modules whose rows are kept (parsed once while they stay loaded)
  std::size_t reused = 0;          // modules of this session whose rows an earlier session parsed
  std::size_t pending = 0;         // modules seen by a lazy build whose rows no sample has needed yet
  double last_build_ms = 0;        // wall time of the last build that found changed modules
  double parse_ms = 0;             // wall time spent parsing rows since the last release
  std::vector<std::string> notes;  // modules left out or parsed with problems, one line each
};

namespace detail {

// The file a module was loaded from, as stat() sees its path: a rebuilt library (written over in place
// or renamed over the old one) differs in inode, size or mtime. All zero when the path cannot be stat'ed
// (the vDSO).
struct module_file_id {
  std::uint64_t dev = 0, ino = 0, size = 0;
  std::int64_t mtime_s = 0, mtime_ns = 0;
  bool operator==(const module_file_id& o) const {
    return dev == o.dev && ino == o.ino && size == o.size && mtime_s == o.mtime_s && mtime_ns == o.mtime_ns;
  }
  bool operator!=(const module_file_id& o) const { return !(*this == o); }
};

// The rows of one module, parsed once and kept while the module stays loaded (a retired set may still
// point at them). `file` and `content_hash` (of the .eh_frame_hdr and .eh_frame bytes the rows were parsed
// from) must both match for the rows to be used again (see visit()).
struct module_unwind {
  std::string name;
  std::uintptr_t bias = 0, hdr = 0;
  module_file_id file;
  std::uint64_t content_hash = 0;
  eh_frame_table table;
  std::vector<std::uint32_t> index;  // unwind_module::index of the table
};

// Clips a table to the runtime address ranges `code` (sorted, not overlapping: the module's executable
// PT_LOAD segments): pcs outside them get no row (row_no_info), and start/end shrink to what is left.
// A table with nothing inside the ranges ends up empty. Rows stay sorted and relative to the new start.
inline void clip_unwind_rows(eh_frame_table& t,
                             const std::vector<std::pair<std::uintptr_t, std::uintptr_t>>& code) {
  if (t.rows.empty()) return;
  for (const auto& c : code)  // one segment holds every row (the usual case): nothing to clip
    if (c.first <= t.start && t.end <= c.second && t.rows.front().kind != row_no_info) return;
  struct abs_row {
    std::uintptr_t pc;
    unwind_row row;
  };
  std::vector<abs_row> out;
  auto push = [&out](std::uintptr_t pc, const unwind_row& r) {
    if (!out.empty() && out.back().pc == pc) out.pop_back();  // a later row at the same pc wins
    if (!out.empty()) {
      const unwind_row& b = out.back().row;
      if (b.kind == r.kind && b.cfa_off == r.cfa_off && b.fp_off == r.fp_off &&
          b.plt_threshold == r.plt_threshold)
        return;  // same rule continues
    }
    out.push_back(abs_row{pc, r});
  };
  const unwind_row none{0, 0, 0, row_no_info, 0};
  std::size_t c = 0;
  for (std::size_t i = 0; i + 1 < t.rows.size(); ++i) {
    const std::uintptr_t a = t.start + t.rows[i].pc, b = t.start + t.rows[i + 1].pc;
    while (c < code.size() && code[c].second <= a) ++c;
    for (std::size_t k = c; k < code.size() && code[k].first < b; ++k) {
      const std::uintptr_t lo = std::max(a, code[k].first), hi = std::min(b, code[k].second);
      if (lo >= hi) continue;
      push(lo, t.rows[i]);
      if (hi < b || k + 1 == code.size() || code[k + 1].first > hi) push(hi, none);
    }
  }
  while (!out.empty() && out.front().row.kind == row_no_info) out.erase(out.begin());
  if (out.empty()) {
    t.rows.clear();
    t.start = t.end = 0;
    return;
  }
  if (out.back().row.kind != row_no_info) out.push_back(abs_row{t.end, none});  // cannot happen: safety
  t.rows.clear();
  t.start = out.front().pc;
  t.end = out.back().pc;
  for (const abs_row& r : out) {
    unwind_row row = r.row;
    row.pc = static_cast<std::uint32_t>(r.pc - t.start);
    t.rows.push_back(row);
  }
}

// One published set: its module list and the set header the handler reads.
struct unwind_set_storage {
  std::vector<unwind_module> modules;
  unwind_table_set set{nullptr, 0};
};

// The executable address range of a module whose rows a lazy build left unparsed.
struct pending_code {
  std::uintptr_t start = 0, end = 0;
};

// The entry of `code` (sorted by start, not overlapping) that holds `pc`, or nullptr.
inline const pending_code* find_pending(const std::vector<pending_code>& code, std::uint64_t pc) {
  auto it = std::upper_bound(code.begin(), code.end(), pc,
                             [](std::uint64_t v, const pending_code& c) { return v < c.start; });
  if (it == code.begin() || pc >= (it - 1)->end) return nullptr;
  return &*(it - 1);
}

class unwind_tables_state {
 public:
  // Re-reads the module list when dlopen/dlclose changed it (or `force`), parses new modules and
  // publishes a new set. Cheap when nothing changed: one dl_iterate_phdr that stops at the first module.
  // `lazy`: a module not parsed before is parsed only once want() asked for it; until then its code is
  // listed by pending().
  status build(bool force, bool lazy = false) {
    if (!kCfiRowsSupported)
      return status::error("selfprof: DWARF unwinding is implemented for x86-64 only; using frame pointers");
    std::lock_guard<std::mutex> lock(mu_);
    counts now = read_counts();
    const bool moved = !have_counts_ || now.adds != counts_.adds || now.subs != counts_.subs;
    if (!force && !moved && !wanted_new_ && g_unwind_tables.load(std::memory_order_relaxed) != nullptr)
      return status::ok();
    auto t0 = std::chrono::steady_clock::now();
    // Only a change of the module list (or a restart) needs the kept rows checked against their files.
    scan_context ctx{this, {}, {}, {}, lazy, force || moved || revalidate_, 0};
    // The loader lock is held during the callback, so no module can be unmapped while it is parsed.
    dl_iterate_phdr(&unwind_tables_state::visit, &ctx);
    std::sort(ctx.pending.begin(), ctx.pending.end(),
              [](const pending_span& a, const pending_span& b) { return a.code.start < b.code.start; });
    pending_ = std::move(ctx.pending);
    wanted_new_ = false;
    ++pending_generation_;
    info_.pending = 0;
    for (std::size_t i = 0; i < pending_.size(); ++i)
      if (i == 0 || pending_[i].module != pending_[i - 1].module) ++info_.pending;
    info_.parse_ms += ctx.parse_ms;
    auto storage = std::unique_ptr<unwind_set_storage>(new unwind_set_storage());
    for (module_unwind* m : ctx.present) {
      if (m->table.rows.empty()) continue;
      storage->modules.push_back(
          unwind_module{m->table.start, m->table.end, m->table.rows.data(), m->table.rows.size(),
                        m->index.empty() ? nullptr : m->index.data(), m->index.size()});
    }
    std::sort(storage->modules.begin(), storage->modules.end(),
              [](const unwind_module& a, const unwind_module& b) { return a.start < b.start; });
    // Overlapping ranges cannot happen between live modules; if they do (a stale entry), keep the first.
    std::vector<unwind_module> clean;
    for (const unwind_module& m : storage->modules)
      if (clean.empty() || m.start >= clean.back().end) clean.push_back(m);
    storage->modules.swap(clean);
    storage->set = unwind_table_set{storage->modules.data(), storage->modules.size()};
    info_.modules = storage->modules.size();
    info_.rows = 0;
    for (const unwind_module& m : storage->modules) info_.rows += m.count;
    g_unwind_tables.store(&storage->set, std::memory_order_release);
    sets_.push_back(std::move(storage));  // the previous set stays: a handler may be reading it
    counts_ = now;
    have_counts_ = true;
    revalidate_ = false;
    info_.published = true;
    ++info_.builds;
    for (auto& n : ctx.notes)
      if (std::find(info_.notes.begin(), info_.notes.end(), n) == info_.notes.end()) info_.notes.push_back(n);
    info_.last_build_ms =
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    return status::ok();
  }

  // Unpublishes the tables and frees the sets. Only once no handler can be running (after the profiling
  // signal is restored and g_handler.in_flight reached zero), since a handler may hold a pointer into any
  // set. The parsed rows of modules still loaded are kept for the next start (parsing every module again
  // is the costly part of a start): at the next build each is used only if its file and bytes are still
  // the ones it was parsed from (see visit()), so a library rebuilt and reloaded is parsed anew.
  void release() {
    std::lock_guard<std::mutex> lock(mu_);
    g_unwind_tables.store(nullptr, std::memory_order_release);
    sets_.clear();
    retired_.clear();
    std::vector<key> loaded;
    dl_iterate_phdr(
        [](dl_phdr_info* info, std::size_t, void* data) -> int {
          dl_phdr_info copy;
          std::vector<ElfW(Phdr)> phdrs;
          if (!copy_phdrs(info, copy, phdrs)) return 0;
          const ElfW(Phdr)* eh = find_eh(&copy);
          if (eh != nullptr) static_cast<std::vector<key>*>(data)->push_back(key_of(&copy, eh));
          return 0;
        },
        &loaded);
    for (auto it = modules_.begin(); it != modules_.end();)
      it = std::find(loaded.begin(), loaded.end(), it->first) == loaded.end() ? modules_.erase(it) : ++it;
    revalidate_ = true;
    have_counts_ = false;
    pending_.clear();
    wanted_.clear();
    wanted_new_ = false;
    info_ = unwind_tables_info{};
  }

  // Asks a lazy build to parse the module whose code holds `pc`. True when that module was pending and
  // not asked for before (the next build parses it).
  bool want(std::uintptr_t pc) {
    std::lock_guard<std::mutex> lock(mu_);
    for (const pending_span& p : pending_) {
      if (pc < p.code.start || pc >= p.code.end) continue;
      if (std::find(wanted_.begin(), wanted_.end(), p.module) != wanted_.end()) return false;
      wanted_.push_back(p.module);
      wanted_new_ = true;
      return true;
    }
    return false;
  }

  // A number that changes with every build: pending() may differ only when it did.
  std::uint64_t pending_generation() {
    std::lock_guard<std::mutex> lock(mu_);
    return pending_generation_;
  }

  // The code of modules a lazy build left unparsed, by start address.
  std::vector<pending_code> pending() {
    std::lock_guard<std::mutex> lock(mu_);
    std::vector<pending_code> out;
    out.reserve(pending_.size());
    for (const pending_span& p : pending_) out.push_back(p.code);
    return out;
  }

  unwind_tables_info info() {
    std::lock_guard<std::mutex> lock(mu_);
    unwind_tables_info i = info_;
    i.parsed = modules_.size();
    i.bytes = 0;
    auto bytes_of = [](const module_unwind& m) {
      return sizeof(module_unwind) + m.table.rows.capacity() * sizeof(unwind_row) +
             m.index.capacity() * sizeof(std::uint32_t);
    };
    for (auto& m : modules_) i.bytes += bytes_of(*m.second);
    for (auto& m : retired_) i.bytes += bytes_of(*m);
    for (auto& s : sets_)
      i.bytes += sizeof(unwind_set_storage) + s->modules.capacity() * sizeof(unwind_module);
    return i;
  }

 private:
  struct counts {
    unsigned long long adds = 0, subs = 0;
  };
  using key = std::tuple<std::string, std::uintptr_t, std::uintptr_t>;  // name, load bias, eh_frame_hdr
  struct pending_span {  // one executable segment of a module left unparsed
    pending_code code;
    key module;
  };
  struct scan_context {
    unwind_tables_state* self;
    std::vector<module_unwind*> present;
    std::vector<std::string> notes;
    std::vector<pending_span> pending;
    bool lazy;
    bool revalidate;  // check kept rows against their files (the module list changed since they were used)
    double parse_ms;
  };

  static counts read_counts() {
    counts c;
    dl_iterate_phdr(
        [](dl_phdr_info* info, std::size_t size, void* data) -> int {
          counts* out = static_cast<counts*>(data);
          if (size >= offsetof(dl_phdr_info, dlpi_subs) + sizeof(info->dlpi_subs)) {
            out->adds = info->dlpi_adds;
            out->subs = info->dlpi_subs;
          }
          return 1;  // the counters are the same in every entry: one is enough
        },
        &c);
    return c;
  }

  static const ElfW(Phdr) * find_eh(const dl_phdr_info* info) {
    const ElfW(Phdr)* eh = nullptr;
    for (int i = 0; i < info->dlpi_phnum; ++i)
      if (info->dlpi_phdr[i].p_type == PT_GNU_EH_FRAME) eh = &info->dlpi_phdr[i];
    return eh;
  }
  static std::string module_name(const dl_phdr_info* info) {
    return info->dlpi_name && info->dlpi_name[0] ? info->dlpi_name : "[main]";
  }
  static key key_of(const dl_phdr_info* info, const ElfW(Phdr) * eh) {
    return key{module_name(info), info->dlpi_addr, info->dlpi_addr + eh->p_vaddr};
  }
  static module_file_id file_of(const dl_phdr_info* info) {
    module_file_id id;
    struct stat st;
    const char* path = info->dlpi_name && info->dlpi_name[0] ? info->dlpi_name : "/proc/self/exe";
    if (::stat(path, &st) != 0) return id;
    id.dev = static_cast<std::uint64_t>(st.st_dev);
    id.ino = static_cast<std::uint64_t>(st.st_ino);
    id.size = static_cast<std::uint64_t>(st.st_size);
    id.mtime_s = static_cast<std::int64_t>(st.st_mtim.tv_sec);
    id.mtime_ns = static_cast<std::int64_t>(st.st_mtim.tv_nsec);
    return id;
  }

  // A module's .eh_frame_hdr and .eh_frame as the parser reads them: copies (see copy_in), or the memory
  // itself where copies are refused.
  struct eh_bytes {
    eh_frame_input hdr, frames;
    std::vector<std::uint8_t> hdr_copy, frames_copy;
  };

  // Points `in` at a private copy of its bytes, read through sys().read_own_memory: a page of a library
  // truncated in place since it was mapped ends the copy (the rows then stop there) instead of raising
  // SIGBUS in the collector, which a lazy parse long after the mapping makes likelier. Where the kernel
  // refuses the copy (seccomp), `in` keeps reading the memory directly.
  static void copy_in(eh_frame_input& in, std::vector<std::uint8_t>& copy) {
    if (in.size == 0) return;
    copy.resize(in.size);
    const long got = sys().read_own_memory(copy.data(), in.address, in.size);
    if (got < 0) {
      copy.clear();
      return;
    }
    copy.resize(static_cast<std::size_t>(got));
    in.data = copy.data();
    in.size = copy.size();
  }

  // Where a module's .eh_frame_hdr and .eh_frame lie, copied (frames.size 0: not found; `why` says what).
  static void locate(const dl_phdr_info* info, const ElfW(Phdr) * eh, eh_bytes& b, const char*& why) {
    b.frames = eh_frame_input{};
    b.hdr = segment_from(info, info->dlpi_addr + eh->p_vaddr);
    if (b.hdr.size > eh->p_memsz) b.hdr.size = eh->p_memsz;
    copy_in(b.hdr, b.hdr_copy);
    eh_frame_hdr_info hi;
    if (b.hdr.size == 0 || !parse_eh_frame_hdr(b.hdr, hi)) {
      b.hdr.size = 0;
      why = "unreadable .eh_frame_hdr";
      return;
    }
    b.frames = segment_from(info, hi.eh_frame);
    if (b.frames.size == 0) {
      why = ".eh_frame is outside the loaded segments";
      return;
    }
    // The search table lists every FDE: stop after the last one instead of trusting a terminator.
    if (hi.fde_limit > hi.eh_frame && hi.fde_limit - hi.eh_frame < b.frames.size) {
      eh_frame_input last{nullptr, std::min<std::size_t>(12, b.frames.size - (hi.fde_limit - hi.eh_frame)),
                          hi.fde_limit};
      last.data = reinterpret_cast<const std::uint8_t*>(last.address);
      std::vector<std::uint8_t> last_copy;
      copy_in(last, last_copy);
      eh_cursor c{last.data, 0, last.size, last.address};
      std::uint64_t len = c.fixed(4);
      if (len == 0xffffffffu) len = c.fixed(8);
      const std::size_t at = hi.fde_limit - hi.eh_frame;
      if (c.ok && len <= b.frames.size - at - c.pos)
        b.frames.size = at + c.pos + static_cast<std::size_t>(len);
    }
    copy_in(b.frames, b.frames_copy);
  }

  // A hash of the bytes the rows are parsed from (.eh_frame_hdr and .eh_frame), eight at a time: a
  // fraction of a parse (no CFA programs are run), and it sees a changed frame layout that keeps every
  // offset in .eh_frame_hdr the same.
  static std::uint64_t content_hash(const eh_bytes& b) {
    std::uint64_t h = 1469598103934665603ull;
    auto mix = [&h](const eh_frame_input& in) {
      std::size_t i = 0;
      for (; i + 8 <= in.size; i += 8) {
        std::uint64_t w;
        std::memcpy(&w, in.data + i, 8);
        h = (h ^ w) * 0x100000001b3ull;
        h ^= h >> 29;
      }
      for (; i < in.size; ++i) h = (h ^ in.data[i]) * 1099511628211ull;
      h = (h ^ in.size) * 1099511628211ull;
    };
    mix(b.hdr);
    mix(b.frames);
    return h;
  }

  // `out`: `in` with its program headers copied into `phdrs`. dl_iterate_phdr points into the module's
  // first mapped page, which a library truncated in place has lost (a read would raise SIGBUS); false
  // then. Where copies are refused (see copy_in) `out` reads the memory directly.
  static bool copy_phdrs(const dl_phdr_info* in, dl_phdr_info& out, std::vector<ElfW(Phdr)>& phdrs) {
    out = dl_phdr_info{};
    out.dlpi_addr = in->dlpi_addr;
    out.dlpi_name = in->dlpi_name;
    out.dlpi_phdr = in->dlpi_phdr;
    out.dlpi_phnum = in->dlpi_phnum;
    const std::size_t bytes = sizeof(ElfW(Phdr)) * in->dlpi_phnum;
    if (bytes == 0) return true;
    phdrs.resize(in->dlpi_phnum);
    const long got =
        sys().read_own_memory(phdrs.data(), reinterpret_cast<std::uintptr_t>(in->dlpi_phdr), bytes);
    if (got < 0) return true;
    if (static_cast<std::size_t>(got) != bytes) return false;
    out.dlpi_phdr = phdrs.data();
    return true;
  }

  static int visit(dl_phdr_info* mapped, std::size_t, void* data) {
    scan_context& ctx = *static_cast<scan_context*>(data);
    dl_phdr_info copy;
    std::vector<ElfW(Phdr)> phdrs;
    if (!copy_phdrs(mapped, copy, phdrs)) {
      ctx.notes.push_back("unwind: " + module_name(mapped) +
                          ": program headers unreadable (file truncated?)");
      return 0;
    }
    const dl_phdr_info* info = &copy;
    const ElfW(Phdr)* eh = find_eh(info);
    std::string name = module_name(info);
    if (eh == nullptr) {
      bool has_code = false;
      for (int i = 0; i < info->dlpi_phnum; ++i)
        if (info->dlpi_phdr[i].p_type == PT_LOAD && (info->dlpi_phdr[i].p_flags & PF_X)) has_code = true;
      if (has_code) ctx.notes.push_back("unwind: " + name + " has no .eh_frame_hdr: frame pointers only");
      return 0;
    }
    const key k = key_of(info, eh);
    auto found = ctx.self->modules_.find(k);
    if (found != ctx.self->modules_.end() && !ctx.revalidate) {
      ctx.present.push_back(found->second.get());
      return 0;
    }
    const std::vector<key>& wanted = ctx.self->wanted_;
    if (ctx.lazy && found == ctx.self->modules_.end() &&
        std::find(wanted.begin(), wanted.end(), k) == wanted.end()) {
      for (const auto& c : code_ranges(info)) ctx.pending.push_back(pending_span{{c.first, c.second}, k});
      return 0;
    }
    const module_file_id file = file_of(info);
    const auto t0 = std::chrono::steady_clock::now();
    eh_bytes bytes;
    const char* why = nullptr;
    locate(info, eh, bytes, why);
    const std::uint64_t hash = content_hash(bytes);
    if (found != ctx.self->modules_.end()) {
      // Same name, load address and .eh_frame_hdr address: the same module only if it is the same file
      // and the same bytes. Every build checks, not only the first after a stop: a dlclose and a dlopen
      // of the rebuilt library may both happen between two builds.
      if (found->second->file == file) {
        if (found->second->content_hash == hash) {
          if (ctx.self->revalidate_) ++ctx.self->info_.reused;
          ctx.present.push_back(found->second.get());
          return 0;
        }
      }
      // A published set may still point at the old rows: they are freed at release().
      ctx.self->retired_.push_back(std::move(found->second));
      ctx.self->modules_.erase(found);
    }
    std::unique_ptr<module_unwind> m(new module_unwind());
    m->name = name;
    m->bias = info->dlpi_addr;
    m->hdr = std::get<2>(k);
    m->file = file;
    m->content_hash = hash;
    parse_module(info, bytes, why, *m, ctx.notes);
    ctx.parse_ms += std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    ctx.present.push_back(m.get());
    ctx.self->modules_.emplace(k, std::move(m));
    return 0;
  }

  // The module's executable PT_LOAD segments at run time, sorted.
  static std::vector<std::pair<std::uintptr_t, std::uintptr_t>> code_ranges(const dl_phdr_info* info) {
    std::vector<std::pair<std::uintptr_t, std::uintptr_t>> code;
    for (int i = 0; i < info->dlpi_phnum; ++i) {
      const ElfW(Phdr)& p = info->dlpi_phdr[i];
      if (p.p_type == PT_LOAD && (p.p_flags & PF_X) && p.p_memsz > 0)
        code.emplace_back(info->dlpi_addr + p.p_vaddr, info->dlpi_addr + p.p_vaddr + p.p_memsz);
    }
    std::sort(code.begin(), code.end());
    return code;
  }

  // The bytes of the loaded segment holding `address`: [address, segment end), or size 0.
  static eh_frame_input segment_from(const dl_phdr_info* info, std::uintptr_t address) {
    for (int i = 0; i < info->dlpi_phnum; ++i) {
      const ElfW(Phdr)& p = info->dlpi_phdr[i];
      if (p.p_type != PT_LOAD) continue;
      std::uintptr_t lo = info->dlpi_addr + p.p_vaddr, hi = lo + p.p_filesz;
      if (address >= lo && address < hi)
        return eh_frame_input{reinterpret_cast<const std::uint8_t*>(address), hi - address, address};
    }
    return eh_frame_input{};
  }

  static void parse_module(const dl_phdr_info* info, const eh_bytes& bytes, const char* why, module_unwind& m,
                           std::vector<std::string>& notes) {
    if (bytes.frames.size == 0) {
      notes.push_back("unwind: " + m.name + ": " + (why ? why : "no .eh_frame"));
      return;
    }
    m.table = parse_eh_frame(bytes.frames);
    if (!m.table.error.empty())
      notes.push_back("unwind: " + m.name + ": " + std::to_string(m.table.skipped) +
                      " records skipped; first: " + m.table.error);
    // Only the module's own code: an FDE pointing elsewhere (broken input) must not shadow another module.
    const std::size_t before = m.table.rows.size();
    clip_unwind_rows(m.table, code_ranges(info));
    if (before != 0 && m.table.rows.empty())
      notes.push_back("unwind: " + m.name + ": no FDE covers its executable segments");
    m.table.rows.shrink_to_fit();
    if (!m.table.rows.empty())
      build_row_index(m.table.rows.data(), m.table.rows.size(), m.table.end - m.table.start, m.index);
  }

  std::mutex mu_;
  std::map<key, std::unique_ptr<module_unwind>> modules_;
  std::vector<std::unique_ptr<module_unwind>> retired_;  // replaced while a set may point at them
  std::vector<std::unique_ptr<unwind_set_storage>> sets_;
  std::vector<pending_span> pending_;  // by start address
  std::vector<key> wanted_;            // modules want() asked a lazy build to parse
  bool wanted_new_ = false;            // want() asked for one since the last build
  std::uint64_t pending_generation_ = 0;
  counts counts_;
  bool have_counts_ = false;
  bool revalidate_ = false;  // the first build after release(): kept modules found count as reused
  unwind_tables_info info_;
};

inline unwind_tables_state& unwind_tables() {
  static unwind_tables_state* state = new unwind_tables_state();  // never destroyed: usable from atexit
  return *state;
}

}  // namespace detail

// Builds and publishes the unwind tables of every loaded module; rebuilds only when modules were loaded
// or unloaded since the last call (call it at start and from the collector's periodic check).
inline status build_unwind_tables() { return detail::unwind_tables().build(false); }

namespace detail {
// The collector's build: modules are parsed once unwind_tables().want() asked for them.
inline status build_unwind_tables_lazily() { return unwind_tables().build(false, true); }
}  // namespace detail

// Unpublishes the tables (the parsed rows of loaded modules are kept for the next start). Call only when
// no sampling handler can run any more (after stop).
inline void release_unwind_tables() { detail::unwind_tables().release(); }

// fork(2) child, when another thread of the parent may have been inside build(): a fresh state (the old
// one is leaked; no handler runs in the child until a new start() publishes a new set).
inline void abandon_unwind_tables_after_fork() {
  new (&detail::unwind_tables()) detail::unwind_tables_state();
}

inline unwind_tables_info get_unwind_tables_info() { return detail::unwind_tables().info(); }

}  // namespace selfprof
