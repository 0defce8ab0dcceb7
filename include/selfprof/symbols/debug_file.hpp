// Finds the separate debug file of a stripped module: by GNU build-id under each debug root
// (<root>/.build-id/xx/rest.debug), then by .gnu_debuglink (module dir, its .debug/, <root>/<module dir>),
// checking the build-id or the debuglink CRC so a stale debug file is never used.
// Context: collector thread or setup (never the signal handler).
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "selfprof/symbols/elf.hpp"
#include "selfprof/symbols/mapped_file.hpp"

namespace selfprof {
namespace detail {

// The CRC-32 (IEEE, reflected) that .gnu_debuglink stores for its debug file.
inline std::uint32_t debuglink_crc32(byte_view bytes, std::uint32_t crc = 0) {
  static const std::array<std::uint32_t, 256> table = [] {
    std::array<std::uint32_t, 256> t{};
    for (std::uint32_t i = 0; i < 256; ++i) {
      std::uint32_t c = i;
      for (int k = 0; k < 8; ++k) c = (c & 1) != 0 ? 0xEDB88320u ^ (c >> 1) : c >> 1;
      t[i] = c;
    }
    return t;
  }();
  crc = ~crc;
  for (std::size_t i = 0; i < bytes.size; ++i) crc = table[(crc ^ bytes.data[i]) & 0xFF] ^ (crc >> 8);
  return ~crc;
}

inline std::vector<std::string> build_id_debug_paths(const std::vector<std::string>& roots,
                                                     const std::string& build_id) {
  std::vector<std::string> out;
  if (build_id.size() < 3) return out;
  for (const auto& root : roots) {
    std::string path = root;
    path += "/.build-id/";
    path.append(build_id, 0, 2);
    path += '/';
    path.append(build_id, 2, std::string::npos);
    path += ".debug";
    out.push_back(std::move(path));
  }
  return out;
}

inline std::vector<std::string> debuglink_paths(const std::vector<std::string>& roots,
                                                const std::string& module_path, const std::string& link) {
  std::vector<std::string> out;
  if (link.empty() || link.find('/') != std::string::npos || module_path.empty() || module_path[0] != '/')
    return out;
  std::string::size_type slash = module_path.rfind('/');
  std::string dir = module_path.substr(0, slash + 1);  // with its trailing slash
  out.push_back(dir + link);
  out.push_back(dir + ".debug/");
  out.back() += link;
  for (const auto& root : roots) {
    out.push_back(root + dir);
    out.back() += link;
  }
  return out;
}

// A debug file found for a module: `image` reads through `file`, which stays open so its sections can be
// read; file.check() after the last read tells whether it changed meanwhile.
struct debug_file {
  std::string path;
  mapped_file file;
  elf_image image;
};

// Opens the separate debug file for `module` (at `module_path`) with a .symtab; false when none fits.
inline bool find_debug_file(const std::vector<std::string>& roots, const std::string& module_path,
                            const elf_image& module, debug_file& out) {
  auto try_open = [&](const std::string& path, const std::string& want_build_id, bool check_crc,
                      std::uint32_t crc) {
    if (path == module_path) return false;
    if (!out.file.open(path)) return false;
    bool ok = static_cast<bool>(out.image.parse(out.file, path)) &&
              out.image.find_section_type(SHT_SYMTAB) != nullptr;
    if (ok && !want_build_id.empty()) ok = out.image.build_id() == want_build_id;
    if (ok && check_crc) {
      std::uint32_t file_crc = 0;
      ok = out.file.read_all([&file_crc](byte_view b) { file_crc = debuglink_crc32(b, file_crc); }) &&
           file_crc == crc;
    }
    if (!ok) {
      out.image = elf_image();
      out.file.reset();
      return false;
    }
    out.path = path;
    return true;
  };
  std::string id = module.build_id();
  for (const auto& path : build_id_debug_paths(roots, id))
    if (try_open(path, id, false, 0)) return true;
  std::string link;
  std::uint32_t crc = 0;
  if (module.debuglink(link, crc))
    for (const auto& path : debuglink_paths(roots, module_path, link))
      if (try_open(path, id, true, crc)) return true;
  return false;
}

// True when `image`'s DWARF is stored compressed: a .debug_info with SHF_COMPRESSED (objcopy
// --compress-debug-sections, as distributions ship debug files) or the older GNU .zdebug_info.
inline bool dwarf_compressed(const elf_image& image) {
  const elf_section* info = image.find_section(".debug_info");
  return (info != nullptr && (info->flags & SHF_COMPRESSED) != 0) ||
         image.find_section(".zdebug_info") != nullptr;
}

// The file holding the DWARF of the module file at `path` (inode `inode` when non-zero): `path` itself
// when it has .debug_info, else `known_debug` when set (the registry's pick), else the debug file found
// under `roots` (by build-id, and by .gnu_debuglink next to `module_path` unless that is empty). Empty
// when there is none; `readable` says whether `path` could be read as ELF at all, `compressed` whether
// the file returned stores its DWARF compressed (dwarf_compressed).
inline std::string dwarf_source_path(const std::vector<std::string>& roots, const std::string& path,
                                     std::uint64_t inode, const std::string& module_path,
                                     const std::string& known_debug, bool& readable, bool& compressed) {
  compressed = false;
  mapped_file file;
  elf_image image;
  readable = file.open(path, inode) && image.parse(file, path);
  if (!readable) return {};
  for (const char* name : {".debug_info", ".zdebug_info"}) {
    const elf_section* s = image.find_section(name);
    if (s != nullptr && s->type != SHT_NOBITS) {
      compressed = dwarf_compressed(image);
      return path;
    }
  }
  std::string found = known_debug;
  // The registry looks for a debug file only when a module lacks .symtab: a module stripped of DWARF
  // alone (strip -g) gets its debug file found here.
  debug_file debug;
  if (found.empty() && find_debug_file(roots, module_path, image, debug)) found = debug.path;
  if (found.empty()) return {};
  mapped_file debug_mapped;
  elf_image debug_image;
  compressed =
      debug_mapped.open(found, 0) && debug_image.parse(debug_mapped, found) && dwarf_compressed(debug_image);
  return found;
}

}  // namespace detail
}  // namespace selfprof
