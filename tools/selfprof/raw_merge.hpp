// The recorder's side of `selfprof record --follow-exec`: reads the raw dumps the processes of a
// recording wrote (format: include/selfprof/dump/raw_dump.hpp), or takes what the recorder sampled itself
// (perf_record.hpp), and names them into one profile, the process name (or "name [pid]") as each stack's
// root frame, or into a profile per process. Each library's symbols, and /proc/kallsyms, are read once
// for the whole recording. A file changed since the process exited (other modification time or size) is not
// read: its frames are named [module+0xoffset] (file offset), never by another file's symbols.
// Context: setup only (the command-line tool).
#pragma once

#include <sys/stat.h>

#include <cstdint>
#include <cstdlib>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include <selfprof/collect/snapshot.hpp>
#include <selfprof/dump/symbolize.hpp>
#include <selfprof/output/markers.hpp>
#include <selfprof/profile.hpp>
#include <selfprof/status.hpp>
#include <selfprof/symbols/kernel_symbols.hpp>
#include <selfprof/symbols/modules.hpp>

namespace selfprof_cli {

struct raw_map {
  selfprof::detail::maps_entry e;
  bool identity = false;  // the modification time and size were recorded
  std::uint64_t mtime_ns = 0, size = 0;
};

// One process's raw dump, as read.
struct raw_process {
  std::string file;
  std::uint32_t pid = 0;
  std::string comm;
  std::vector<raw_map> maps;
  std::unordered_map<std::uint64_t, std::string> names;  // tagged lookup address -> name
  selfprof::detail::raw_snapshot raw;
};

namespace raw_detail {

inline bool hex(std::string_view s, std::uint64_t& out) {
  if (s.empty() || s.size() > 16) return false;
  out = 0;
  for (char c : s) {
    unsigned d;
    if (c >= '0' && c <= '9')
      d = static_cast<unsigned>(c - '0');
    else if (c >= 'a' && c <= 'f')
      d = static_cast<unsigned>(c - 'a' + 10);
    else
      return false;
    out = out << 4 | d;
  }
  return true;
}

inline bool dec(std::string_view s, std::uint64_t& out) {
  if (s.empty() || s.size() > 20) return false;
  out = 0;
  for (char c : s) {
    if (c < '0' || c > '9') return false;
    const std::uint64_t next = out * 10 + static_cast<std::uint64_t>(c - '0');
    if (next / 10 != out) return false;  // overflow
    out = next;
  }
  return true;
}

inline bool real(std::string_view s, double& out) {
  if (s.empty() || s.size() > 40) return false;
  const std::string copy(s);
  char* end = nullptr;
  out = std::strtod(copy.c_str(), &end);
  return end == copy.c_str() + copy.size();
}

// The next space-separated field of `line` from `pos`; empty at the end.
inline std::string_view field(std::string_view line, std::size_t& pos) {
  while (pos < line.size() && line[pos] == ' ') ++pos;
  const std::size_t begin = pos;
  while (pos < line.size() && line[pos] != ' ') ++pos;
  return line.substr(begin, pos - begin);
}

// The rest of the line after one space (names may hold spaces).
inline std::string rest(std::string_view line, std::size_t pos) {
  if (pos < line.size() && line[pos] == ' ') ++pos;
  return std::string(line.substr(pos < line.size() ? pos : line.size()));
}

}  // namespace raw_detail

// Parses one raw dump. Errors name the file and line: "FILE:LINE: what is wrong".
inline selfprof::status parse_raw_dump(const std::string& text, const std::string& file, raw_process& out) {
  using namespace raw_detail;
  out = raw_process();
  out.file = file;
  std::size_t pos = 0, number = 0;
  bool ended = false, has_info = false;
  std::uint64_t samples = 0, stack_lines = 0;
  auto bad = [&](const std::string& why) {
    return selfprof::status::error("selfprof record: " + file + ":" + std::to_string(number) + ": " + why);
  };
  while (pos < text.size()) {
    std::size_t eol = text.find('\n', pos);
    if (eol == std::string::npos) {
      ++number;
      return bad("the last line has no newline (the file was cut short)");
    }
    const std::string_view line = std::string_view(text).substr(pos, eol - pos);
    pos = eol + 1;
    ++number;
    if (ended) return bad("a line after 'end'");
    std::size_t at = 0;
    const std::string_view key = field(line, at);
    if (number == 1) {
      if (line != "selfprof-raw 1") return bad("not a selfprof raw dump (want 'selfprof-raw 1')");
      continue;
    }
    std::uint64_t a = 0, b = 0, c = 0;
    if (key == "pid") {
      if (!dec(field(line, at), a) || a == 0 || a > 0xffffffffu) return bad("bad pid");
      out.pid = static_cast<std::uint32_t>(a);
    } else if (key == "comm") {
      out.comm = rest(line, at);
    } else if (key == "info") {
      selfprof::profile_info& i = out.raw.info;
      const std::string_view mode = field(line, at);
      if (mode == "cpu")
        i.mode = selfprof::profile_mode::cpu;
      else if (mode == "wall")
        i.mode = selfprof::profile_mode::wall;
      else
        return bad("bad mode '" + std::string(mode) + "'");
      i.unit = std::string(field(line, at));
      if (i.unit.empty()) return bad("no unit");
      double hz = 0, duration = 0;
      std::uint64_t kernel = 0;
      if (!real(field(line, at), hz) || !dec(field(line, at), i.period_ns) ||
          !dec(field(line, at), i.dropped) || !dec(field(line, at), i.start_unix_ns) ||
          !real(field(line, at), duration) || !dec(field(line, at), kernel) || kernel > 1)
        return bad("bad info numbers");
      i.hz = hz;
      i.duration_s = duration;
      i.kernel_time = kernel == 1;
      i.source = rest(line, at);
      has_info = true;
    } else if (key == "note") {
      out.raw.info.notes.push_back(rest(line, at));
    } else if (key == "map") {
      raw_map m;
      if (!hex(field(line, at), m.e.start) || !hex(field(line, at), m.e.end) ||
          !hex(field(line, at), m.e.offset) || m.e.end <= m.e.start)
        return bad("bad map range");
      const std::string_view devs = field(line, at);
      const std::size_t colon = devs.find(':');
      if (colon == std::string_view::npos || !hex(devs.substr(0, colon), a) ||
          !hex(devs.substr(colon + 1), b) || a > 0xffffffffu || b > 0xffffffffu)
        return bad("bad device '" + std::string(devs) + "'");
      m.e.dev_major = static_cast<std::uint32_t>(a);
      m.e.dev_minor = static_cast<std::uint32_t>(b);
      if (!dec(field(line, at), m.e.inode)) return bad("bad inode");
      const std::string_view mtime = field(line, at), size = field(line, at);
      if (mtime == "-" && size == "-") {
        m.identity = false;
      } else if (dec(mtime, m.mtime_ns) && dec(size, m.size)) {
        m.identity = true;
      } else {
        return bad("bad modification time or size");
      }
      m.e.path = rest(line, at);
      if (m.e.path.empty()) return bad("map without a path");
      if (m.e.path == "//anon") m.e.path.clear();
      m.e.readable = m.e.executable = true;
      out.maps.push_back(std::move(m));
    } else if (key == "name") {
      if (!hex(field(line, at), a)) return bad("bad address");
      out.names[a] = rest(line, at);
    } else if (key == "thread") {
      if (!dec(field(line, at), a) || a > 0xffffffffu) return bad("bad thread id");
      out.raw.thread_names[static_cast<std::uint32_t>(a)] = rest(line, at);
    } else if (key == "stack") {
      if (!dec(field(line, at), a) || a > 0xffffffffu || !dec(field(line, at), b) || b > 0xffff ||
          !dec(field(line, at), c) || c == 0)
        return bad("bad stack thread, flags or count");
      std::vector<std::uint64_t> pcs;
      for (std::string_view f = field(line, at); !f.empty(); f = field(line, at)) {
        std::uint64_t pc = 0;
        if (!hex(f, pc)) return bad("bad address '" + std::string(f) + "'");
        pcs.push_back(pc);
      }
      if (pcs.size() > 0xffff) return bad("stack too deep");
      out.raw.table.add(static_cast<std::uint32_t>(a), static_cast<std::uint16_t>(b), pcs.data(), pcs.size(),
                        c);
      if (samples + c < samples) return bad("sample counts overflow");
      samples += c;
      ++stack_lines;
    } else if (key == "end") {
      if (!dec(field(line, at), a) || !dec(field(line, at), b)) return bad("bad end counts");
      if (a != stack_lines || b != samples)
        return bad("'end' says " + std::to_string(a) + " stacks of " + std::to_string(b) +
                   " samples, the file holds " + std::to_string(stack_lines) + " of " +
                   std::to_string(samples));
      ended = true;
    } else {
      return bad("unknown record '" + std::string(key) + "'");
    }
  }
  if (number == 0) return bad("empty file");
  if (out.pid == 0 || !has_info) return bad("no pid or info line");
  if (!ended) return bad("no 'end' line (the file was cut short)");
  return selfprof::status::ok();
}

// What the profiles of one recording share while they are named: each file's symbols and the kernel's.
struct raw_naming {
  std::shared_ptr<selfprof::detail::shared_file_symbols> files =
      std::make_shared<selfprof::detail::shared_file_symbols>();
  selfprof::detail::kernel_symbols kernel;

  // Before the first profile is named, the processes of the recording: /proc/kallsyms is then read only
  // for their kernel addresses (kernel_symbols::prepare), not whole.
  void prepare_kernel(const std::vector<raw_process>& processes) {
    std::vector<std::uint64_t> addresses;
    for (const raw_process& p : processes) selfprof::detail::append_kernel_lookups(p.raw.table, addresses);
    kernel.prepare(std::move(addresses));
  }
};

// The root frame of each process's stacks: its name, "name [pid]", or none (a profile of one image).
enum class raw_roots { name, name_pid, none };

// Names processes of a recording into one profile.
class raw_merger {
 public:
  explicit raw_merger(bool pid_roots)
      : raw_merger(pid_roots ? raw_roots::name_pid : raw_roots::name, std::make_shared<raw_naming>()) {}
  raw_merger(raw_roots roots, std::shared_ptr<raw_naming> naming)
      : roots_(roots), naming_(std::move(naming)) {}

  void prepare_kernel(const std::vector<raw_process>& processes) { naming_->prepare_kernel(processes); }

  void add(const raw_process& p) {
    using namespace selfprof;
    using namespace selfprof::detail;
    // The mappings whose file is still the one the process had; the others are named by offset.
    std::string text;
    std::vector<bool> stale(p.maps.size(), false);
    for (std::size_t k = 0; k < p.maps.size(); ++k) {
      const raw_map& m = p.maps[k];
      if (!m.e.path.empty() && m.e.path[0] == '/') {
        struct stat sb {};
        stale[k] = !m.identity || ::stat(m.e.path.c_str(), &sb) != 0 ||
                   static_cast<std::uint64_t>(sb.st_size) != m.size ||
                   static_cast<std::uint64_t>(sb.st_mtim.tv_sec) * 1000000000u +
                           static_cast<std::uint64_t>(sb.st_mtim.tv_nsec) !=
                       m.mtime_ns;
      }
      if (stale[k] || m.e.path == "[vdso]") continue;  // the vdso in memory here is not the process's
      char line[128];
      std::snprintf(line, sizeof line, "%llx-%llx r-xp %llx %x:%x %llu ",
                    static_cast<unsigned long long>(m.e.start), static_cast<unsigned long long>(m.e.end),
                    static_cast<unsigned long long>(m.e.offset), m.e.dev_major, m.e.dev_minor,
                    static_cast<unsigned long long>(m.e.inode));
      text += line;
      text += m.e.path;
      text += '\n';
    }
    module_registry_options o;
    o.maps_path = "/nonexistent";  // never read: the text is the process's
    o.shared_files = naming_->files;
    module_registry reg(o);
    reg.apply_maps_text(text);  // a file's symbols are read at its first lookup below

    marker_frames marker(out_);
    const std::string root_name =
        roots_ == raw_roots::name_pid ? (p.comm + " [" + std::to_string(p.pid) + "]") : p.comm;
    const std::uint32_t root = roots_ == raw_roots::none
                                   ? 0
                                   : marker(root_name.empty() ? std::string("[unknown process]") : root_name);
    std::unordered_map<std::uint64_t, std::uint32_t> named;  // lookup address -> frame index
    auto frame_for = [&](std::uint64_t lookup) -> std::uint32_t {
      auto it = named.find(lookup);
      if (it != named.end()) return it->second;
      frame f;
      f.address = lookup;
      auto n = p.names.find(lookup);
      if (n != p.names.end()) {
        f.name = n->second;
        f.kind = frame_kind::jit;
      } else if (lookup == kMemoryCeilingPc) {
        f.name = "[selfprof: memory ceiling]";
        f.kind = frame_kind::marker;
      } else if (is_kernel_address(lookup)) {  // named from this machine's /proc/kallsyms, read once
        f = naming_->kernel.resolve(lookup);
      } else {
        f.name = "[unknown]";
        for (std::size_t k = 0; k < p.maps.size(); ++k) {
          const raw_map& m = p.maps[k];
          if (lookup < m.e.start || lookup >= m.e.end) continue;
          const std::string base = m.e.path.substr(m.e.path.rfind('/') + 1);
          const module* mod = stale[k] ? nullptr : reg.find(lookup);
          f.module = m.e.path;
          f.module_offset = lookup - m.e.start + m.e.offset;
          symbol_table::hit hit;
          if (mod && mod->symbols) {
            f.module_offset = lookup - mod->bias;
            if (mod->symbols->table.lookup(f.module_offset, hit)) {
              f.name = mod->symbols->table.name(hit.index);
              break;
            }
          }
          char off[40];
          std::snprintf(off, sizeof off, "+0x%llx]", static_cast<unsigned long long>(f.module_offset));
          f.name =
              "[" + (base.size() > 2 && base.front() == '[' ? base.substr(1, base.size() - 2) : base) + off;
          break;
        }
      }
      out_.frames.push_back(std::move(f));
      const auto index = static_cast<std::uint32_t>(out_.frames.size() - 1);
      named.emplace(lookup, index);
      return index;
    };

    const auto counts = stacks_from_table(
        p.raw.table, roots_ == raw_roots::none ? nullptr : &root,
        [&](std::uint64_t lookup, stack& s) { s.frames.push_back(frame_for(lookup)); }, marker, out_.stacks);
    for (std::string& w : reg.take_warnings()) warnings_.push_back(std::move(w));
    const std::uint64_t samples = counts.first, truncated = counts.second;
    for (const auto& t : p.raw.thread_names) out_.threads.push_back(thread_info{t.first, t.second});

    profile_info& i = out_.info;
    const profile_info& pi = p.raw.info;
    if (processes_ == 0) {
      i.mode = pi.mode;
      i.unit = pi.unit;
      i.hz = pi.hz;
      i.period_ns = pi.period_ns;
      i.source = pi.source;
      i.kernel_time = pi.kernel_time;
      i.start_unix_ns = pi.start_unix_ns;
    }
    if (pi.source != i.source && i.source.find(pi.source) == std::string::npos) i.source += "," + pi.source;
    i.kernel_time = i.kernel_time && pi.kernel_time;
    const double end_s = static_cast<double>(pi.start_unix_ns) / 1e9 + pi.duration_s;
    if (pi.start_unix_ns != 0 && pi.start_unix_ns < i.start_unix_ns) i.start_unix_ns = pi.start_unix_ns;
    if (end_s > end_s_) end_s_ = end_s;
    i.samples += samples;
    i.truncated += truncated;
    i.dropped += pi.dropped;
    for (const std::string& n : pi.notes)
      if (notes_seen_.emplace(n, true).second) i.notes.push_back(n);
    ++processes_;
  }

  // The merged profile; `lost` raw dumps could not be read (counted in the notes). `merged`: say in the
  // notes how many processes the profile holds (not for a profile of one process).
  selfprof::profile take(std::size_t lost, bool merged = true) {
    out_.info.duration_s = end_s_ - static_cast<double>(out_.info.start_unix_ns) / 1e9;
    if (out_.info.duration_s < 0) out_.info.duration_s = 0;
    if (merged)
      out_.info.notes.push_back(std::to_string(processes_) +
                                " processes merged (selfprof record --follow-exec)");
    if (lost)
      out_.info.notes.push_back(std::to_string(lost) +
                                " processes' raw dumps could not be read: not counted");
    for (std::string& w : warnings_) out_.info.notes.push_back(std::move(w));
    return std::move(out_);
  }
  std::size_t processes() const { return processes_; }

 private:
  raw_roots roots_;
  std::shared_ptr<raw_naming> naming_;
  selfprof::profile out_;
  std::size_t processes_ = 0;
  double end_s_ = 0;
  std::unordered_map<std::string, bool> notes_seen_;
  std::vector<std::string> warnings_;
};

}  // namespace selfprof_cli
