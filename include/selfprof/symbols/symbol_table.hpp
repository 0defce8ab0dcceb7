// A per-module table of function symbols (.symtab, .dynsym, synthesized PLT stubs) sorted by address,
// with sizes respected and zero-size symbols extended to the next one, plus cached demangled names.
// Context: collector thread or setup (never the signal handler).
#pragma once

#include <elf.h>

#include <algorithm>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "selfprof/symbols/demangle.hpp"
#include "selfprof/symbols/elf.hpp"

namespace selfprof {
namespace detail {

// How far back a lookup walks past symbols that end before the address, looking for an enclosing
// (overlapping) symbol; overlaps are rare and shallow, so a small bound keeps lookups O(log n).
constexpr int symbol_overlap_lookback = 8;
// Size of one PLT entry on x86-64 and AArch64, and of the PLT header (PLT0) before the entries.
constexpr std::uint64_t plt_entry_bytes = 16;

class symbol_table {
 public:
  struct hit {
    std::uint32_t index = 0;
    std::uint64_t start = 0;  // ELF virtual address of the symbol
    std::uint64_t end = 0;    // one past its last byte
  };

  // Adds the function symbols of a SHT_SYMTAB or SHT_DYNSYM section of `image`; returns how many.
  std::size_t add_symbols(const elf_image& image, const elf_section& symtab) {
    if (symtab.type != SHT_SYMTAB && symtab.type != SHT_DYNSYM) return 0;
    if ((symtab.flags & SHF_COMPRESSED) != 0) return 0;
    const elf_section* strtab_section = image.section_at(symtab.link);
    if (strtab_section == nullptr) return 0;
    byte_view syms = image.section_bytes(symtab);
    byte_view strtab = image.section_bytes(*strtab_section);
    std::size_t count = syms.size / sizeof(Elf64_Sym), added = 0;
    for (std::size_t i = 1; i < count; ++i) {
      Elf64_Sym sym;
      read_at(syms, i * sizeof(Elf64_Sym), sym);
      unsigned type = ELF64_ST_TYPE(sym.st_info);
      unsigned bind = ELF64_ST_BIND(sym.st_info);
      if (sym.st_shndx == SHN_UNDEF || sym.st_shndx >= SHN_LORESERVE) continue;
      const elf_section* in = image.section_at(sym.st_shndx);
      bool exec_section = in != nullptr && (in->flags & SHF_EXECINSTR) != 0;
      if (type == STT_NOTYPE) {
        if (!exec_section) continue;  // a label in code (hand-written assembly, ld.so's _dl_start_user)
      } else if (type != STT_FUNC && type != STT_GNU_IFUNC) {
        continue;
      }
      std::string_view name = string_at(strtab, sym.st_name);
      if (name.empty() || name[0] == '$' || name.substr(0, 2) == ".L") continue;
      std::uint64_t section_end = 0;
      if (in != nullptr && in->size != 0 && sym.st_value >= in->addr && sym.st_value - in->addr < in->size)
        section_end = in->addr + in->size;
      unsigned rank = bind == STB_GLOBAL ? 3 : bind == STB_WEAK ? 1 : 2;
      if (type != STT_NOTYPE) rank += 4;
      add(sym.st_value, sym.st_size, section_end, name, rank);
      ++added;
    }
    return added;
  }

  // Adds `name@plt` for each PLT stub (x86-64 and AArch64; .plt.sec when present). Cheap: one pass
  // over .rela.plt; returns how many were added.
  std::size_t add_plt(const elf_image& image) {
    const elf_section* rela = image.find_section(".rela.plt");
    if (rela == nullptr || rela->type != SHT_RELA) return 0;
    const elf_section* dynsym = image.section_at(rela->link);
    if (dynsym == nullptr || dynsym->type != SHT_DYNSYM) return 0;
    const elf_section* dynstr = image.section_at(dynsym->link);
    if (dynstr == nullptr) return 0;
    std::uint64_t first = 0;
    const elf_section* plt = image.find_section(".plt.sec");
    std::uint32_t jump_slot = 0;
    if (image.machine() == EM_X86_64) {
      jump_slot = R_X86_64_JUMP_SLOT;
      if (plt == nullptr) {
        plt = image.find_section(".plt");
        first = plt_entry_bytes;  // PLT0 is one entry
      }
    } else if (image.machine() == EM_AARCH64) {
      jump_slot = R_AARCH64_JUMP_SLOT;
      plt = image.find_section(".plt");
      first = 2 * plt_entry_bytes;  // PLT0 is 32 bytes
    }
    if (plt == nullptr || jump_slot == 0) return 0;
    byte_view relocs = image.section_bytes(*rela), syms = image.section_bytes(*dynsym);
    byte_view strs = image.section_bytes(*dynstr);
    std::size_t count = relocs.size / sizeof(Elf64_Rela), added = 0;
    for (std::size_t i = 0; i < count; ++i) {
      std::uint64_t offset = first + i * plt_entry_bytes;
      if (offset + plt_entry_bytes > plt->size) break;
      Elf64_Rela r;
      read_at(relocs, i * sizeof(Elf64_Rela), r);
      if (ELF64_R_TYPE(r.r_info) != jump_slot) continue;
      Elf64_Sym sym;
      if (!read_at(syms, std::uint64_t{ELF64_R_SYM(r.r_info)} * sizeof(Elf64_Sym), sym)) continue;
      std::string_view name = string_at(strs, sym.st_name);
      if (name.empty()) continue;
      add(plt->addr + offset, plt_entry_bytes, 0, std::string(name) + "@plt", 0);
      ++added;
    }
    return added;
  }

  // Sorts, keeps the best name per address and computes where zero-size symbols end. Call once after
  // the add_* calls and before lookups.
  void finish() {
    std::sort(entries_.begin(), entries_.end(), [this](const entry& a, const entry& b) {
      if (a.start != b.start) return a.start < b.start;
      return better(a, b);
    });
    std::vector<entry> unique;
    unique.reserve(entries_.size());
    for (const entry& e : entries_) {
      if (!unique.empty() && unique.back().start == e.start) {
        unique.back().size = std::max(unique.back().size, e.size);
        continue;
      }
      unique.push_back(e);
    }
    // A zero-size symbol inside a sized one is a label within that function's body: the function names
    // those addresses, so the label goes.
    std::vector<entry> kept;
    kept.reserve(unique.size());
    std::uint64_t covered_to = 0;
    for (const entry& e : unique) {
      if (e.size == 0 && e.start < covered_to) continue;
      if (e.size != 0 && e.start + e.size > covered_to) covered_to = e.start + e.size;
      kept.push_back(e);
    }
    unique.swap(kept);
    for (std::size_t i = 0; i < unique.size(); ++i) {
      entry& e = unique[i];
      if (e.size != 0) continue;
      // A zero-size symbol (hand-written assembly, a label) runs to the next symbol or the end of its
      // section.
      std::uint64_t end = i + 1 < unique.size() ? unique[i + 1].start : ~std::uint64_t{0};
      if (e.section_end != 0) end = std::min(end, e.section_end);
      e.size = end > e.start && end != ~std::uint64_t{0} ? end - e.start : 1;
    }
    entries_ = std::move(unique);
    entries_.shrink_to_fit();
    demangled_.assign(entries_.size(), std::string());
  }

  // The symbol covering ELF virtual address `vaddr`, if any: an address past a symbol's end is not
  // charged to it.
  bool lookup(std::uint64_t vaddr, hit& out) const {
    auto it = std::upper_bound(entries_.begin(), entries_.end(), vaddr,
                               [](std::uint64_t v, const entry& e) { return v < e.start; });
    for (int back = 0; it != entries_.begin() && back < symbol_overlap_lookback; ++back) {
      --it;
      if (vaddr - it->start < it->size) {
        out.index = static_cast<std::uint32_t>(it - entries_.begin());
        out.start = it->start;
        out.end = it->start + it->size;
        return true;
      }
    }
    return false;
  }

  std::string_view raw_name(std::uint32_t index) const {
    const entry& e = entries_[index];
    return std::string_view(names_).substr(e.name_offset, e.name_size);
  }

  // Demangled name of entry `index`, computed on first use and cached.
  const std::string& name(std::uint32_t index) {
    std::string& d = demangled_[index];
    if (d.empty()) d = demangle(raw_name(index));
    return d;
  }

  std::size_t size() const { return entries_.size(); }

 private:
  struct entry {
    std::uint64_t start;
    std::uint64_t size;
    std::uint64_t section_end;
    std::uint32_t name_offset;
    std::uint32_t name_size;
    std::uint32_t rank;
  };

  void add(std::uint64_t start, std::uint64_t size, std::uint64_t section_end, std::string_view name,
           unsigned rank) {
    entry e{start,
            size,
            section_end,
            static_cast<std::uint32_t>(names_.size()),
            static_cast<std::uint32_t>(name.size()),
            rank};
    names_.append(name.data(), name.size());
    entries_.push_back(e);
  }

  static std::size_t leading_underscores(std::string_view s) {
    std::size_t n = 0;
    while (n < s.size() && s[n] == '_') ++n;
    return n;
  }

  // Which of two symbols at one address names it, as perf chooses (so both tools give one name to
  // aliases such as glibc's __memcpy_avx512_unaligned_erms and __memmove_avx512_unaligned_erms): sized,
  // FUNC over NOTYPE, global over local over weak, fewer leading underscores (malloc over
  // __libc_malloc), longer, then alphabetical. Unlike perf, a symbol version (a .symtab's
  // `__libc_start_main@@GLIBC_2.34`) does not make a name longer: the plain name wins.
  bool better(const entry& a, const entry& b) const {
    if ((a.size != 0) != (b.size != 0)) return a.size != 0;
    if (a.rank != b.rank) return a.rank > b.rank;
    std::string_view na = std::string_view(names_).substr(a.name_offset, a.name_size);
    std::string_view nb = std::string_view(names_).substr(b.name_offset, b.name_size);
    std::size_t ua = leading_underscores(na), ub = leading_underscores(nb);
    if (ua != ub) return ua < ub;
    std::string_view ba = na.substr(0, na.find('@')), bb = nb.substr(0, nb.find('@'));
    if (ba.size() != bb.size()) return ba.size() > bb.size();
    if (na.size() != nb.size()) return na.size() < nb.size();
    return na < nb;
  }

  std::vector<entry> entries_;
  std::string names_;
  std::vector<std::string> demangled_;
};

}  // namespace detail
}  // namespace selfprof
