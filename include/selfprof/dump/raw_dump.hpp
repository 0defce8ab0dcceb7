// The raw exit dump of `selfprof record --follow-exec`: instead of naming its frames, a process writes
// its stacks of addresses, the executable mappings they point into (with what identifies each file)
// and its threads to a private directory; `selfprof record` names them all at the end, reading each
// library's symbols once for every process (tools/selfprof/raw_merge.hpp reads this format).
// Context: any thread except the signal handler (the exit dump).
//
// Format "selfprof-raw 1", one record a line, numbers in decimal unless said:
//   selfprof-raw 1
//   pid PID
//   comm NAME                      the process name (/proc/self/comm)
//   info MODE UNIT HZ PERIOD_NS DROPPED START_UNIX_NS DURATION_S KERNEL_TIME SOURCE
//   note TEXT                      any number
//   map START END OFFSET MAJOR:MINOR INODE MTIME_NS SIZE PATH   hex START END OFFSET MAJOR MINOR; MTIME_NS
//                                  and SIZE of the file at PATH at exit, "-" when there is none
//   name PC TEXT                   hex PC: a JIT or perf-map address named by this process
//   thread TID NAME
//   stack TID FLAGS COUNT PC...    hex PCs, the interrupted pc first (as the stack table holds them)
//   end STACKS SAMPLES             last line: the file is complete
#pragma once

#include <sys/stat.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <string>
#include <unordered_set>
#include <vector>

#include "selfprof/collect/snapshot.hpp"
#include "selfprof/dump/dump.hpp"
#include "selfprof/jit/registry.hpp"
#include "selfprof/output/sink.hpp"
#include "selfprof/profile.hpp"
#include "selfprof/status.hpp"
#include "selfprof/symbols/perf_map.hpp"
#include "selfprof/symbols/proc_maps.hpp"
#include "selfprof/symbols/shared_symbolizer.hpp"

namespace selfprof {
namespace detail {

constexpr const char* kRawDumpExtension = ".selfprof-raw";

inline bool is_raw_dump_path(const std::string& path) { return ends_with_ci(path, kRawDumpExtension); }

// Text with no newline (names and notes are one line each).
inline std::string raw_one_line(std::string s) {
  for (char& c : s)
    if (c == '\n' || c == '\r') c = ' ';
  return s;
}

inline void raw_hex(std::string& out, std::uint64_t v) {
  char buf[24];
  std::snprintf(buf, sizeof buf, "%llx", static_cast<unsigned long long>(v));
  out += buf;
}

// One "map" line for an executable mapping; the file's modification time and size tell the reader
// whether the file it opens later is still this one. (Not the inode: on overlay file systems stat and
// the maps disagree about it.)
inline void raw_map_line(std::string& out, const maps_entry& e) {
  out += "map ";
  raw_hex(out, e.start);
  out += ' ';
  raw_hex(out, e.end);
  out += ' ';
  raw_hex(out, e.offset);
  out += ' ';
  raw_hex(out, e.dev_major);
  out += ':';
  raw_hex(out, e.dev_minor);
  out += ' ' + std::to_string(e.inode) + ' ';
  struct stat sb {};
  const bool file = !e.path.empty() && e.path[0] == '/' && !e.deleted;
  if (file && ::stat(e.path.c_str(), &sb) == 0 && S_ISREG(sb.st_mode)) {
    const std::uint64_t mtime_ns = static_cast<std::uint64_t>(sb.st_mtim.tv_sec) * 1000000000u +
                                   static_cast<std::uint64_t>(sb.st_mtim.tv_nsec);
    out += std::to_string(mtime_ns) + ' ' + std::to_string(static_cast<std::uint64_t>(sb.st_size));
  } else {
    out += "- -";
  }
  out += ' ';
  out += e.path.empty() ? std::string("//anon") : e.path;
  out += '\n';
}

inline const char* raw_mode_name(profile_mode m) {
  return m == profile_mode::wall ? "wall" : m == profile_mode::offcpu ? "offcpu" : "cpu";
}

// The bytes of a raw dump of `raw`, taken in this process. `sym` names the JIT and perf-map tagged
// addresses (only when a stack holds one: those names exist only in this process).
inline std::string raw_dump_bytes(const raw_snapshot& raw, shared_symbolizer& sym, const std::string& comm) {
  std::string out =
      "selfprof-raw 1\npid " + std::to_string(::getpid()) + "\ncomm " + raw_one_line(comm) + "\n";
  const profile_info& i = raw.info;
  char buf[256];
  std::snprintf(buf, sizeof buf, "info %s %s %.17g %llu %llu %llu %.17g %d ", raw_mode_name(i.mode),
                i.unit.empty() ? "samples" : i.unit.c_str(), i.hz,
                static_cast<unsigned long long>(i.period_ns), static_cast<unsigned long long>(i.dropped),
                static_cast<unsigned long long>(i.start_unix_ns), i.duration_s, i.kernel_time ? 1 : 0);
  out += buf;
  out += i.source.empty() ? std::string("-") : raw_one_line(i.source);
  out += '\n';
  for (const std::string& n : i.notes) out += "note " + raw_one_line(n) + "\n";

  // The executable mappings now, then those the collector saw that are gone (a dlclose) where nothing
  // mapped now overlaps them. Only to name samples: a process that took none (most short-lived ones at
  // the default rate) reads neither.
  const bool sampled = !raw.table.entries().empty();
  std::string maps;
  std::vector<maps_entry> mapped;
  if (sampled && read_text_file("/proc/self/maps", maps))
    for_each_executable_mapping(maps, [&](const maps_entry& e) {
      raw_map_line(out, e);
      mapped.push_back(e);
    });
  if (sampled)
    sym.with_current([&](symbolizer& s) {
      for (const module& m : s.modules().modules()) {
        if (m.mapped || m.kind != module_kind::file) continue;
        bool overlaps = false;
        for (const maps_entry& e : mapped) overlaps = overlaps || (m.start < e.end && e.start < m.end);
        if (overlaps) continue;
        maps_entry e;
        e.start = m.start;
        e.end = m.end;
        e.offset = m.offset;
        e.inode = m.inode;
        e.dev_major = m.dev_major;
        e.dev_minor = m.dev_minor;
        e.deleted = m.deleted;
        e.path = m.path;
        raw_map_line(out, e);
        mapped.push_back(e);
      }
      return 0;
    });

  // Tagged addresses (JIT code named while sampling) are named here, where their names live.
  std::unordered_set<std::uint64_t> tagged;
  for (const auto& e : raw.table.entries()) {
    const std::uint64_t* pcs = raw.table.pcs(e);
    for (std::size_t k = 0; k < e.depth; ++k)
      if (is_jit_tagged(pcs[k]) || is_perf_map_tagged(pcs[k])) tagged.insert(k == 0 ? pcs[k] : pcs[k] - 1);
  }
  if (!tagged.empty()) {
    sym.with_fresh([&](symbolizer& s) {
      std::vector<frame> frames;
      for (std::uint64_t pc : tagged) {
        frames.clear();
        s.resolve(pc, frames);
        out += "name ";
        raw_hex(out, pc);
        out += ' ' + raw_one_line(frames.empty() ? std::string("[unknown]") : frames.front().name) + "\n";
      }
      return 0;
    });
  }
  for (const auto& t : raw.thread_names)
    out += "thread " + std::to_string(t.first) + " " + raw_one_line(t.second) + "\n";
  std::uint64_t samples = 0;
  for (const auto& e : raw.table.entries()) {
    out += "stack " + std::to_string(e.tid) + " " + std::to_string(e.flags) + " " + std::to_string(e.count);
    const std::uint64_t* pcs = raw.table.pcs(e);
    for (std::size_t k = 0; k < e.depth; ++k) {
      out += ' ';
      raw_hex(out, pcs[k]);
    }
    out += '\n';
    samples += e.count;
  }
  out += "end " + std::to_string(raw.table.entries().size()) + " " + std::to_string(samples) + "\n";
  return out;
}

// Writes the raw dump to `path` (atomic, 0600; see sink.hpp). No fsync: the recorder reads it as soon as
// the process has ended, and a crash of the machine loses the recording anyway.
inline status write_raw_dump(const raw_snapshot& raw, shared_symbolizer& sym, const std::string& path,
                             sink_options sink) {
  sink.sync = false;
  return write_file_atomic(path, raw_dump_bytes(raw, sym, program_name()), sink);
}

}  // namespace detail
}  // namespace selfprof
