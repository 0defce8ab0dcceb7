// Unwind rows for another process's code, read from the files it mapped (`selfprof record` without the
// preload library: perf_record.hpp). A file's .eh_frame is parsed once, by link-time address, however
// many processes map it; each executable mapping (start, end, file offset) then gets the rows of the part
// of the file it maps, moved to where the mapping put it. A file that is not the one mapped (another
// inode, or no longer there) gets no rows: its frames fall back to frame pointers.
// Context: setup only (the command-line tool's recording loop), never a signal handler.
#pragma once

#include <elf.h>

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include <selfprof/signal/unwind_rows.hpp>
#include <selfprof/symbols/elf.hpp>
#include <selfprof/symbols/mapped_file.hpp>
#include <selfprof/unwind/eh_frame.hpp>
#include <selfprof/unwind/tables.hpp>

namespace selfprof_cli {

// One file's rows by link-time address, and its loadable segments.
struct file_unwind {
  std::vector<selfprof::detail::elf_segment> loads;  // PT_LOAD, in file order
  selfprof::detail::eh_frame_table table;            // start/end and rows by link-time address
  std::vector<std::uint32_t> index;                  // unwind_module::index of `table`
  std::string error;                                 // why there are no rows (empty when there are)
};

// A file's rows clipped to what one mapping shows, with their index.
struct clipped_rows {
  selfprof::detail::eh_frame_table table;
  std::vector<std::uint32_t> index;
};

class file_unwind_cache {
 public:
  // The rows for one executable mapping of `path` (inode `inode`: 0 accepts any) at runtime
  // [start, end) holding file offset `offset` at `start`. False when there are none: the file could
  // not be read, is not the one mapped, has no .eh_frame, or no FDE covers the mapped code.
  bool module_for(const std::string& path, std::uint64_t inode, std::uint64_t start, std::uint64_t end,
                  std::uint64_t offset, selfprof::detail::unwind_module& out) {
    const file_unwind* f = file(path, inode);
    if (f == nullptr || f->table.rows.empty()) return false;
    // Runtime = link-time + bias, for the segment that holds the mapped offset.
    const std::uint64_t bias = selfprof::detail::elf_load_bias(f->loads, start, offset);
    const std::uint64_t lo = start - bias, hi = end - bias;  // the link-time range this mapping shows
    const selfprof::detail::eh_frame_table* t = &f->table;
    const std::vector<std::uint32_t>* index = &f->index;
    if (t->start < lo || t->end > hi) {  // only part of the code is mapped here: its rows, clipped
      auto key = std::make_tuple(f, lo, hi);
      auto it = clipped_.find(key);
      if (it == clipped_.end()) {
        auto c = std::make_unique<clipped_rows>();
        c->table = f->table;
        std::vector<std::pair<std::uintptr_t, std::uintptr_t>> code;
        code.emplace_back(static_cast<std::uintptr_t>(lo), static_cast<std::uintptr_t>(hi));
        selfprof::detail::clip_unwind_rows(c->table, code);
        if (!c->table.rows.empty())
          selfprof::detail::build_row_index(c->table.rows.data(), c->table.rows.size(),
                                            c->table.end - c->table.start, c->index);
        it = clipped_.emplace(key, std::move(c)).first;
      }
      t = &it->second->table;
      index = &it->second->index;
      if (t->rows.empty()) return false;
    }
    out.start = static_cast<std::uintptr_t>(t->start + bias);
    out.end = static_cast<std::uintptr_t>(t->end + bias);
    out.rows = t->rows.data();
    out.count = t->rows.size();
    out.index = index->empty() ? nullptr : index->data();
    out.index_count = index->size();
    return true;
  }

  // The parsed file, or nullptr when it cannot be read (the reason is kept for notes()).
  const file_unwind* file(const std::string& path, std::uint64_t inode) {
    auto key = std::make_pair(path, inode);
    auto it = files_.find(key);
    if (it != files_.end()) return it->second.get();
    auto f = std::make_unique<file_unwind>();
    parse(path, inode, *f);
    if (!f->error.empty()) notes_.push_back("unwind: " + path + ": " + f->error);
    return files_.emplace(key, std::move(f)).first->second.get();
  }

  // Has file() been asked for this file already (parsed, or found unreadable)?
  bool parsed(const std::string& path, std::uint64_t inode) const {
    return files_.count(std::make_pair(path, inode)) != 0;
  }

  std::size_t files() const { return files_.size(); }
  std::size_t rows() const {
    std::size_t n = 0;
    for (const auto& f : files_) n += f.second->table.rows.size();
    return n;
  }
  const std::vector<std::string>& notes() const { return notes_; }

 private:
  static void parse(const std::string& path, std::uint64_t inode, file_unwind& f) {
    using namespace selfprof::detail;
    mapped_file file;
    selfprof::status st = file.open(path, inode);
    if (!st) {
      f.error = st.message();
      return;
    }
    elf_image elf;
    st = elf.parse(file, path);
    if (!st) {
      f.error = st.message();
      return;
    }
    for (const elf_segment& s : elf.segments())
      if (s.type == PT_LOAD) f.loads.push_back(s);
    const elf_section* sec = elf.find_section(".eh_frame");
    if (sec == nullptr || sec->type == SHT_NOBITS || sec->size == 0) {
      f.error = "no .eh_frame section";
      return;
    }
    byte_view bytes = elf.section_bytes(*sec);
    if (bytes.size == 0) {
      f.error = ".eh_frame could not be read";
      return;
    }
    f.table = parse_eh_frame(eh_frame_input{bytes.data, bytes.size, static_cast<std::uintptr_t>(sec->addr)});
    // Only the file's own executable segments: an FDE pointing elsewhere must not shadow other code.
    std::vector<std::pair<std::uintptr_t, std::uintptr_t>> code;
    for (const elf_segment& s : f.loads)
      if ((s.flags & PF_X) && s.memsz > 0)
        code.emplace_back(static_cast<std::uintptr_t>(s.vaddr),
                          static_cast<std::uintptr_t>(s.vaddr + s.memsz));
    std::sort(code.begin(), code.end());
    clip_unwind_rows(f.table, code);
    f.table.rows.shrink_to_fit();
    if (f.table.rows.empty())
      f.error = "no FDE covers its executable segments";
    else
      build_row_index(f.table.rows.data(), f.table.rows.size(), f.table.end - f.table.start, f.index);
  }

  std::map<std::pair<std::string, std::uint64_t>, std::unique_ptr<file_unwind>> files_;
  std::map<std::tuple<const file_unwind*, std::uint64_t, std::uint64_t>, std::unique_ptr<clipped_rows>>
      clipped_;
  std::vector<std::string> notes_;
};

}  // namespace selfprof_cli
