// A bounds-checked ELF64 reader over bytes in memory (a loaded image such as the vdso) or over a file read
// on demand with pread (mapped_file.hpp): headers, sections by name or type (reusable by an .eh_frame
// parser), PT_LOAD segments, load bias, build-id note and .gnu_debuglink.
// Context: collector thread or setup (never the signal handler).
#pragma once

#include <elf.h>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>
#include <vector>

#include "selfprof/status.hpp"
#include "selfprof/symbols/mapped_file.hpp"

namespace selfprof {
namespace detail {

// Copies a T out of `bytes` at `offset` (no alignment assumed); false when it does not fit.
template <class T>
inline bool read_at(byte_view bytes, std::uint64_t offset, T& out) {
  if (!bytes.contains(offset, sizeof(T))) return false;
  std::memcpy(&out, bytes.data + offset, sizeof(T));
  return true;
}

// The NUL-terminated string at `offset` in a string table; empty when out of bounds or unterminated.
inline std::string_view string_at(byte_view table, std::uint64_t offset) {
  if (offset >= table.size) return {};
  const char* begin = reinterpret_cast<const char*>(table.data + offset);
  const void* nul = std::memchr(begin, 0, table.size - static_cast<std::size_t>(offset));
  if (nul == nullptr) return {};
  return std::string_view(begin, static_cast<std::size_t>(static_cast<const char*>(nul) - begin));
}

struct elf_section {
  std::string name;
  std::uint32_t type = 0;
  std::uint64_t flags = 0;
  std::uint64_t addr = 0;
  std::uint64_t offset = 0;
  std::uint64_t size = 0;
  std::uint32_t link = 0;
  std::uint32_t info = 0;
  std::uint64_t addralign = 0;
  std::uint64_t entsize = 0;
};

struct elf_segment {
  std::uint32_t type = 0;
  std::uint32_t flags = 0;
  std::uint64_t offset = 0;
  std::uint64_t vaddr = 0;
  std::uint64_t filesz = 0;
  std::uint64_t memsz = 0;
  std::uint64_t align = 0;
};

// Limits that keep a hostile header from making us loop or allocate for long.
constexpr std::uint32_t elf_max_sections = 1u << 16;
constexpr std::uint32_t elf_max_segments = 1u << 12;
constexpr std::uint64_t elf_page_size = 4096;  // mapping granularity assumed when rounding p_offset

class elf_image {
 public:
  // Parses the ELF header, section headers (with names) and program headers of `bytes`, which must
  // outlive this object. `what` names the input in error messages (usually the path).
  status parse(byte_view bytes, const std::string& what) {
    *this = elf_image();
    bytes_ = bytes;
    size_ = bytes.size;
    return parse_headers(what);
  }
  // The same for a file: the headers are read now, sections when asked for, through `file` (open, and
  // outliving this object). A file that shrank meanwhile reads as truncated; after the last read,
  // file.check() says whether what was read still matches the file.
  status parse(mapped_file& file, const std::string& what) {
    *this = elf_image();
    file_ = &file;
    size_ = file.size();
    return parse_headers(what);
  }

  // The whole image when parsed from memory; empty when read from a file.
  byte_view bytes() const { return bytes_; }
  std::uint16_t type() const { return type_; }
  std::uint16_t machine() const { return machine_; }
  const std::vector<elf_section>& sections() const { return sections_; }
  const std::vector<elf_segment>& segments() const { return segments_; }

  // The first section called `name`, or nullptr.
  const elf_section* find_section(std::string_view name) const {
    for (const auto& s : sections_)
      if (s.name == name) return &s;
    return nullptr;
  }
  // The first section of ELF type `type` (SHT_SYMTAB, SHT_DYNSYM, ...), or nullptr.
  const elf_section* find_section_type(std::uint32_t type) const {
    for (const auto& s : sections_)
      if (s.type == type) return &s;
    return nullptr;
  }
  const elf_section* section_at(std::uint64_t index) const {
    return index < sections_.size() ? &sections_[static_cast<std::size_t>(index)] : nullptr;
  }
  // The bytes of a section inside the image; empty for SHT_NOBITS or a section that does not fit (or
  // no longer can be read).
  byte_view section_bytes(const elf_section& s) const {
    if (s.type == SHT_NOBITS) return {};
    return fetch(s.offset, s.size);
  }

  // Load bias of a mapping of this file; see elf_load_bias below.
  std::uint64_t load_bias(std::uint64_t map_start, std::uint64_t file_offset) const;

  // GNU build-id as lower-case hex, or empty. Looks in SHT_NOTE sections, else PT_NOTE segments.
  std::string build_id() const {
    std::string out;
    for (const auto& s : sections_)
      if (s.type == SHT_NOTE && find_build_id(section_bytes(s), s.addralign == 8 ? 8 : 4, out)) return out;
    for (const auto& seg : segments_)
      if (seg.type == PT_NOTE && find_build_id(fetch(seg.offset, seg.filesz), seg.align == 8 ? 8 : 4, out))
        return out;
    return {};
  }

  // The .gnu_debuglink file name and CRC; false when absent or malformed.
  bool debuglink(std::string& name, std::uint32_t& crc) const {
    const elf_section* s = find_section(".gnu_debuglink");
    if (s == nullptr) return false;
    byte_view b = section_bytes(*s);
    std::string_view n = string_at(b, 0);
    if (n.empty()) return false;
    std::uint64_t crc_offset = (n.size() + 1 + 3) & ~std::uint64_t{3};
    if (!read_at(b, crc_offset, crc)) return false;
    name = std::string(n);
    return true;
  }

 private:
  // `length` bytes at `offset` of the image, or an empty view when they are not (or no longer) there.
  byte_view fetch(std::uint64_t offset, std::uint64_t length) const {
    return file_ != nullptr ? file_->read(offset, length) : bytes_.sub(offset, length);
  }
  bool in_image(std::uint64_t offset, std::uint64_t length) const {
    return offset <= size_ && length <= size_ - offset;
  }

  status parse_headers(const std::string& what) {
    // In bounds yet unreadable: the file shrank since it was opened.
    auto changed = [&what] { return status::error(what + ": changed while being read"); };
    Elf64_Ehdr eh;
    if (!in_image(0, sizeof eh)) return status::error(what + ": not ELF: shorter than an ELF header");
    if (!read_at(fetch(0, sizeof eh), 0, eh)) return changed();
    if (std::memcmp(eh.e_ident, ELFMAG, SELFMAG) != 0) return status::error(what + ": not ELF: bad magic");
    if (eh.e_ident[EI_CLASS] != ELFCLASS64) return status::error(what + ": ELF: not a 64-bit file");
    if (eh.e_ident[EI_DATA] != host_data_encoding())
      return status::error(what + ": ELF: byte order differs from this machine");
    type_ = eh.e_type;
    machine_ = eh.e_machine;

    // Section headers; e_shnum == 0 with e_shoff set means the count is in section 0 (ELF gABI).
    if (eh.e_shoff != 0) {
      if (eh.e_shentsize < sizeof(Elf64_Shdr))
        return status::error(what + ": ELF: section header entry size " + std::to_string(eh.e_shentsize) +
                             " too small");
      Elf64_Shdr first;
      if (!in_image(eh.e_shoff, sizeof first))
        return status::error(what + ": ELF: section headers at offset " + std::to_string(eh.e_shoff) +
                             " are past the end of the file (truncated?)");
      if (!read_at(fetch(eh.e_shoff, sizeof first), 0, first)) return changed();
      std::uint64_t count = eh.e_shnum != 0 ? eh.e_shnum : first.sh_size;
      std::uint64_t names_index = eh.e_shstrndx == SHN_XINDEX ? first.sh_link : eh.e_shstrndx;
      if (count > elf_max_sections) return status::error(what + ": ELF: too many sections");
      std::uint64_t table_size = count * eh.e_shentsize;
      if (!in_image(eh.e_shoff, table_size))
        return status::error(what + ": ELF: " + std::to_string(count) +
                             " section headers do not fit in the file (truncated?)");
      byte_view table = fetch(eh.e_shoff, table_size);
      if (table.size != table_size) return changed();
      sections_.resize(static_cast<std::size_t>(count));
      std::vector<std::uint32_t> name_offsets(sections_.size());
      for (std::size_t i = 0; i < sections_.size(); ++i) {
        Elf64_Shdr sh;
        read_at(table, i * eh.e_shentsize, sh);
        elf_section& s = sections_[i];
        s.type = sh.sh_type;
        s.flags = sh.sh_flags;
        s.addr = sh.sh_addr;
        s.offset = sh.sh_offset;
        s.size = sh.sh_size;
        s.link = sh.sh_link;
        s.info = sh.sh_info;
        s.addralign = sh.sh_addralign;
        s.entsize = sh.sh_entsize;
        name_offsets[i] = sh.sh_name;
      }
      if (names_index < sections_.size()) {
        byte_view names = section_bytes(sections_[static_cast<std::size_t>(names_index)]);
        for (std::size_t i = 0; i < sections_.size(); ++i)
          sections_[i].name = std::string(string_at(names, name_offsets[i]));
      }
    }

    // Program headers.
    if (eh.e_phoff != 0 && eh.e_phnum != 0) {
      if (eh.e_phentsize < sizeof(Elf64_Phdr))
        return status::error(what + ": ELF: program header entry size too small");
      if (eh.e_phnum > elf_max_segments) return status::error(what + ": ELF: too many program headers");
      std::uint64_t table_size = std::uint64_t{eh.e_phnum} * eh.e_phentsize;
      if (!in_image(eh.e_phoff, table_size))
        return status::error(what + ": ELF: program headers do not fit in the file (truncated?)");
      byte_view table = fetch(eh.e_phoff, table_size);
      if (table.size != table_size) return changed();
      for (std::uint32_t i = 0; i < eh.e_phnum; ++i) {
        Elf64_Phdr ph;
        read_at(table, std::uint64_t{i} * eh.e_phentsize, ph);
        segments_.push_back(
            elf_segment{ph.p_type, ph.p_flags, ph.p_offset, ph.p_vaddr, ph.p_filesz, ph.p_memsz, ph.p_align});
      }
    }
    return status::ok();
  }

  static unsigned char host_data_encoding() {
    const std::uint16_t probe = 1;
    unsigned char first;
    std::memcpy(&first, &probe, 1);
    return first == 1 ? ELFDATA2LSB : ELFDATA2MSB;
  }

  static bool find_build_id(byte_view notes, std::uint64_t align, std::string& out) {
    std::uint64_t pos = 0;
    while (pos < notes.size) {
      Elf64_Nhdr nh;
      if (!read_at(notes, pos, nh)) return false;
      std::uint64_t name_pos = pos + sizeof(nh);
      std::uint64_t desc_pos = name_pos + ((std::uint64_t{nh.n_namesz} + align - 1) & ~(align - 1));
      std::uint64_t next = desc_pos + ((std::uint64_t{nh.n_descsz} + align - 1) & ~(align - 1));
      if (!notes.contains(name_pos, nh.n_namesz) || !notes.contains(desc_pos, nh.n_descsz)) return false;
      if (nh.n_type == NT_GNU_BUILD_ID && nh.n_namesz == 4 &&
          std::memcmp(notes.data + name_pos, "GNU", 4) == 0 && nh.n_descsz > 0) {
        static const char hex[] = "0123456789abcdef";
        out.clear();
        for (std::uint32_t i = 0; i < nh.n_descsz; ++i) {
          unsigned char c = notes.data[desc_pos + i];
          out += hex[c >> 4];
          out += hex[c & 15];
        }
        return true;
      }
      if (next <= pos) return false;
      pos = next;
    }
    return false;
  }

  byte_view bytes_;              // the image, when parsed from memory
  mapped_file* file_ = nullptr;  // the file, when parsed from one
  std::uint64_t size_ = 0;       // of the image or file
  std::uint16_t type_ = 0;
  std::uint16_t machine_ = 0;
  std::vector<elf_section> sections_;
  std::vector<elf_segment> segments_;
};

// Load bias of a mapping that maps file offset `file_offset` at address `map_start`: the value added to
// ELF virtual addresses to get run-time addresses. Uses the PT_LOAD segment that holds the offset
// (preferring an executable one); falls back to start - offset when none matches.
inline std::uint64_t elf_load_bias(const std::vector<elf_segment>& segments, std::uint64_t map_start,
                                   std::uint64_t file_offset) {
  const elf_segment* best = nullptr;
  for (const auto& seg : segments) {
    if (seg.type != PT_LOAD) continue;
    std::uint64_t page_start = seg.offset & ~(elf_page_size - 1);
    if (file_offset < page_start || file_offset - page_start >= seg.filesz + (seg.offset - page_start))
      continue;
    if (best == nullptr || ((seg.flags & PF_X) != 0 && (best->flags & PF_X) == 0)) best = &seg;
  }
  if (best == nullptr) return map_start - file_offset;
  // The segment puts file offset p_offset at p_vaddr, so file_offset lives at p_vaddr + (file_offset -
  // p_offset).
  return map_start - (best->vaddr + file_offset - best->offset);
}

inline std::uint64_t elf_image::load_bias(std::uint64_t map_start, std::uint64_t file_offset) const {
  return elf_load_bias(segments_, map_start, file_offset);
}

}  // namespace detail
}  // namespace selfprof
