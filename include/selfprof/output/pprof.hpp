// The pprof writer: a gzipped profile.proto (package perftools.profiles) that `go tool pprof`,
// Pyroscope, Parca and speedscope read without the binaries.
// Context: any thread except the signal handler (a pure function of the profile).
//
// What it writes, in field order like Go's own encoder:
//  - sample_type: a samples profile gets Go's CPU convention [samples/count, <mode>/nanoseconds] with
//    values [n, n*period] (mode cpu → "cpu", wall → "wall", offcpu → "offcpu"); a profile whose unit
//    is a time (ns/us/ms/s) gets one [<mode>/nanoseconds]; any other unit one [<unit>/count].
//  - Samples merged by (locations, thread); labels thread_id (num) and thread_name (str).
//  - One Mapping per module of native/inlined frames, has_functions set (has_filenames,
//    has_line_numbers, has_inline_frames when true), so pprof never re-symbolizes over our names; its
//    range spans the addresses seen, file_offset = the module offset of the lowest one. Kernel, JIT
//    and marker frames use mapping_id 0.
//  - One Location per distinct (mapping, address, inline chain): a native frame followed by inlined
//    frames becomes one Location whose Lines list the innermost callee first.
//  - Functions with name = our (demangled) name and no system_name: the profile holds no mangled
//    names, and pprof rewrites (simplifies: drops template and parameter lists) any name equal to its
//    system_name, so an empty system_name is what keeps our names intact. When frames gain a mangled
//    name it belongs in system_name (field 3).
//  - A truncated stack gets a `[truncated]` function at its root end, as in the folded output.
//  - time_nanos, duration_nanos, period_type, period (period_ns, else 1e9/hz), comments (tool version,
//    source, hz, dropped, notes). No default_sample_type, so tools show the last type.
// `detail::encode_pprof` gives the raw protobuf bytes (deterministic; pinned by golden files);
// `write_pprof` gzips them (zlib or stored blocks, see gzip.hpp).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "selfprof/output/gzip.hpp"
#include "selfprof/output/protobuf.hpp"
#include "selfprof/output/text.hpp"
#include "selfprof/profile.hpp"
#include "selfprof/version.hpp"

namespace selfprof {

struct pprof_options {
  bool gzip = true;  // on-disk pprof profiles are gzipped; false gives the raw protobuf
};

namespace detail {

class pprof_builder {
 public:
  explicit pprof_builder(const profile& p) : p_(p), frame_location_(p.frames.size(), 0) { intern(""); }

  std::string encode() {
    value_setup();
    for (const auto& s : p_.stacks) add_stack(s);

    proto_writer out;
    for (std::size_t i = 0; i < sample_type_count_; ++i) {
      proto_writer vt;
      vt.varint_field_nz(1, static_cast<std::uint64_t>(intern(sample_types_[i].type)));
      vt.varint_field_nz(2, static_cast<std::uint64_t>(intern(sample_types_[i].unit)));
      out.message_field(1, vt);
    }
    for (const auto& s : samples_) {
      proto_writer m;
      m.packed_field(1, s.locations);
      m.packed_field(2, s.values);
      if (s.tid != 0) {
        proto_writer l;
        l.varint_field_nz(1, static_cast<std::uint64_t>(intern("thread_id")));
        l.varint_field_nz(3, s.tid);
        m.message_field(3, l);
        const std::string& name = p_.thread_name(s.tid);
        if (!name.empty()) {
          proto_writer n;
          n.varint_field_nz(1, static_cast<std::uint64_t>(intern("thread_name")));
          n.varint_field_nz(2, static_cast<std::uint64_t>(intern(name)));
          m.message_field(3, n);
        }
      }
      out.message_field(2, m);
    }
    for (std::size_t i = 0; i < mappings_.size(); ++i) {
      const auto& mp = mappings_[i];
      proto_writer m;
      m.varint_field_nz(1, i + 1);
      m.varint_field_nz(2, mp.start);
      m.varint_field_nz(3, mp.limit);
      m.varint_field_nz(4, mp.offset);
      m.varint_field_nz(5, static_cast<std::uint64_t>(intern(mp.filename)));
      m.bool_field_nz(7, true);
      m.bool_field_nz(8, mp.has_filenames);
      m.bool_field_nz(9, mp.has_lines);
      m.bool_field_nz(10, mp.has_inline);
      out.message_field(3, m);
    }
    for (std::size_t i = 0; i < locations_.size(); ++i) {
      const auto& loc = locations_[i];
      proto_writer m;
      m.varint_field_nz(1, i + 1);
      m.varint_field_nz(2, loc.mapping_id);
      m.varint_field_nz(3, loc.address);
      for (const auto& [function_id, line] : loc.lines) {
        proto_writer l;
        l.varint_field_nz(1, function_id);
        l.varint_field_nz(2, line);
        m.message_field(4, l);
      }
      out.message_field(4, m);
    }
    for (std::size_t i = 0; i < functions_.size(); ++i) {
      const auto& fn = functions_[i];
      proto_writer m;
      m.varint_field_nz(1, i + 1);
      m.varint_field_nz(2, static_cast<std::uint64_t>(fn.name));
      m.varint_field_nz(4, static_cast<std::uint64_t>(fn.filename));
      out.message_field(5, m);
    }
    // Strings used only by the trailing fields must be interned before the table is written.
    const std::int64_t period_type = intern(period_type_name_), period_unit = intern("nanoseconds");
    std::vector<std::uint64_t> comments;
    for (const auto& c : comment_lines()) comments.push_back(static_cast<std::uint64_t>(intern(c)));
    for (const auto& s : strings_) out.bytes_field(6, s);
    out.int64_field_nz(9, static_cast<std::int64_t>(p_.info.start_unix_ns & 0x7FFFFFFFFFFFFFFFull));
    out.int64_field_nz(10, clamp_i64(p_.info.duration_s * 1e9));
    proto_writer pt;
    pt.varint_field_nz(1, static_cast<std::uint64_t>(period_type));
    pt.varint_field_nz(2, static_cast<std::uint64_t>(period_unit));
    out.message_field(11, pt);
    out.int64_field_nz(12, static_cast<std::int64_t>(period_ns_));
    for (const auto c : comments) out.varint_field(13, c);
    return out.take();
  }

 private:
  struct mapping_rec {
    std::string filename;
    std::uint64_t start = 0, limit = 0, offset = 0;
    bool has_filenames = false, has_lines = false, has_inline = false;
  };
  struct location_rec {
    std::uint64_t mapping_id = 0, address = 0;
    std::vector<std::pair<std::uint64_t, std::uint64_t>> lines;  // function id, line; innermost first
  };
  struct function_rec {
    std::int64_t name = 0, filename = 0;
  };
  struct value_type {
    std::string type, unit;
  };
  struct sample_rec {
    std::vector<std::uint64_t> locations;  // leaf first
    std::vector<std::uint64_t> values;     // int64 values, all in [0, INT64_MAX]
    std::uint32_t tid = 0;
  };

  static std::int64_t clamp_i64(long double v) {
    if (!(v > 0)) return 0;
    if (v >= 9.2e18L) return INT64_MAX;
    return static_cast<std::int64_t>(v + 0.5L);
  }

  std::int64_t intern(const std::string& s) {
    auto [it, fresh] = string_ids_.try_emplace(s, strings_.size());
    if (fresh) strings_.push_back(s);
    return static_cast<std::int64_t>(it->second);
  }

  void value_setup() {
    const std::string time_type = mode_name(p_.info.mode);
    period_type_name_ = time_type;
    period_ns_ = p_.info.period_ns;
    if (period_ns_ == 0 && p_.info.hz > 0)
      period_ns_ = static_cast<std::uint64_t>(1e9 / p_.info.hz + 0.5);  // rounded (hz > 0), without libm
    const std::string& unit = p_.info.unit;
    if (unit.empty() || unit == "samples") {
      sample_types_[0] = {"samples", "count"};
      sample_types_[1] = {time_type, "nanoseconds"};
      sample_type_count_ = 2;
      factor_ = static_cast<long double>(period_ns_);
      two_values_ = true;
    } else if (unit == "ns" || unit == "nanoseconds" || unit == "us" || unit == "microseconds" ||
               unit == "ms" || unit == "milliseconds" || unit == "s" || unit == "seconds") {
      const char c = unit[0];
      factor_ = c == 'n' ? 1.0L : c == 'u' ? 1e3L : c == 'm' ? 1e6L : 1e9L;
      sample_types_[0] = {time_type, "nanoseconds"};
      sample_type_count_ = 1;
    } else {
      factor_ = 1;
      sample_types_[0] = {unit, "count"};
      sample_type_count_ = 1;
    }
  }

  std::vector<std::string> comment_lines() const {
    std::vector<std::string> c;
    c.emplace_back("selfprof " SELFPROF_VERSION_STRING);
    std::string line = "mode=";
    line += mode_name(p_.info.mode);
    line += " unit=";
    line += p_.info.unit;
    if (!p_.info.source.empty()) {
      line += " source=";
      line += p_.info.source;
    }
    line += " hz=";
    line += format_compact(p_.info.hz);
    line += " samples=";
    line += std::to_string(p_.info.samples);
    line += " dropped=";
    line += std::to_string(p_.info.dropped);
    line += " truncated=";
    line += std::to_string(p_.info.truncated);
    c.push_back(std::move(line));
    if (!p_.info.view.empty()) c.push_back("view=" + p_.info.view);
    for (const auto& l : p_.info.frame_loops) c.push_back("frames: " + frame_stats_line(l));
    for (const auto& n : p_.info.notes) c.push_back(n);
    return c;
  }

  std::uint64_t mapping_for(const frame& f) {
    if (f.module.empty() || f.kind == frame_kind::kernel || f.kind == frame_kind::jit ||
        f.kind == frame_kind::marker)
      return 0;
    auto [it, fresh] = mapping_ids_.try_emplace(f.module, mappings_.size() + 1);
    if (fresh) {
      mapping_rec m;
      m.filename = f.module;
      m.start = f.address;
      m.limit = f.address + 1;
      m.offset = f.module_offset;
      mappings_.push_back(m);
    }
    auto& m = mappings_[it->second - 1];
    if (f.address < m.start) {
      m.start = f.address;
      m.offset = f.module_offset;
    }
    if (f.address >= m.limit) m.limit = f.address + 1;
    if (!f.file.empty()) m.has_filenames = true;
    if (f.line != 0) m.has_lines = true;
    if (f.kind == frame_kind::inlined) m.has_inline = true;
    return it->second;
  }

  std::uint64_t function_for(const std::string& name, const std::string& file) {
    std::string key = name;
    key += '\0';
    key += file;
    auto [it, fresh] = function_ids_.try_emplace(std::move(key), functions_.size() + 1);
    if (fresh)
      functions_.push_back({intern(name.empty() ? "[unknown]" : name), file.empty() ? 0 : intern(file)});
    return it->second;
  }

  // A location for frames [first, last] of a stack (a physical frame and the frames inlined into it).
  std::uint64_t location_for(const std::vector<const frame*>& group) {
    location_rec loc;
    const frame& phys = *group.front();
    loc.address = phys.address;
    loc.mapping_id = 0;
    for (const frame* f : group) {
      const std::uint64_t m = mapping_for(*f);
      if (!loc.mapping_id) loc.mapping_id = m;
    }
    for (auto it = group.rbegin(); it != group.rend(); ++it)
      loc.lines.push_back({function_for((*it)->name, (*it)->file), (*it)->line});
    std::string key;
    append_key(key, loc.mapping_id);
    append_key(key, loc.address);
    for (const auto& [fn, line] : loc.lines) {
      append_key(key, fn);
      append_key(key, line);
    }
    auto [it, fresh] = location_ids_.try_emplace(std::move(key), locations_.size() + 1);
    if (fresh) locations_.push_back(std::move(loc));
    return it->second;
  }

  void add_stack(const stack& s) {
    if (s.count == 0) return;
    static const frame unknown{"[unknown]", "", 0, 0, "", 0, frame_kind::marker};
    static const frame truncated{"[truncated]", "", 0, 0, "", 0, frame_kind::marker};
    std::vector<std::uint64_t> root_first;
    std::vector<const frame*> group;
    std::size_t group_index = 0;  // frame index of a one-frame group, for the per-frame cache
    auto flush = [&] {
      if (group.size() == 1 && group_index < frame_location_.size()) {
        auto& cached = frame_location_[group_index];
        if (!cached) cached = location_for(group);
        root_first.push_back(cached);
      } else if (!group.empty()) {
        root_first.push_back(location_for(group));
      }
      group.clear();
    };
    bool marker_present = false;
    for (std::size_t i = 0; i < s.frames.size(); ++i) {
      const frame* f = s.frames[i] < p_.frames.size() ? &p_.frames[s.frames[i]] : &unknown;
      if (i < 2 && f->kind == frame_kind::marker && f->name == "[truncated]") marker_present = true;
      if (!(f->kind == frame_kind::inlined && !group.empty())) {
        flush();
        group_index = s.frames[i];
      }
      group.push_back(f);
    }
    flush();
    std::uint64_t truncated_id = 0;  // location ids start at 1
    if (s.truncated && !marker_present) truncated_id = location_for({&truncated});
    if (root_first.empty() && truncated_id == 0) root_first.push_back(location_for({&unknown}));

    sample_rec rec;  // leaf first: root_first backwards, then the [truncated] root
    rec.locations.reserve(root_first.size() + 1);
    for (std::size_t i = root_first.size(); i-- > 0;) rec.locations.push_back(root_first[i]);
    if (truncated_id != 0) rec.locations.push_back(truncated_id);
    rec.tid = s.tid;
    std::string key;
    append_key(key, s.tid);
    for (const auto id : rec.locations) append_key(key, id);
    auto [it, fresh] = sample_ids_.try_emplace(std::move(key), samples_.size());
    if (fresh) {
      rec.values.assign(sample_type_count_, 0);
      samples_.push_back(std::move(rec));
    }
    auto& values = samples_[it->second].values;
    const long double n = static_cast<long double>(s.count);
    if (two_values_) {
      values[0] = add_clamped(values[0], clamp_i64(n));
      values[1] = add_clamped(values[1], clamp_i64(n * factor_));
    } else {
      values[0] = add_clamped(values[0], clamp_i64(n * factor_));
    }
  }

  // Appends `v` to a map key as a varint (unambiguous: each value ends with a byte below 0x80).
  static void append_key(std::string& key, std::uint64_t v) {
    while (v >= 0x80) {
      key += static_cast<char>((v & 0x7F) | 0x80);
      v >>= 7;
    }
    key += static_cast<char>(v);
  }

  // a + b capped at INT64_MAX, for a in [0, INT64_MAX] and b >= 0.
  static std::uint64_t add_clamped(std::uint64_t a, std::int64_t b) {
    return a > static_cast<std::uint64_t>(INT64_MAX - b) ? static_cast<std::uint64_t>(INT64_MAX)
                                                         : a + static_cast<std::uint64_t>(b);
  }

  const profile& p_;
  std::vector<std::string> strings_;
  // Every index by bytes below is this one map type (one instantiation for all the writers).
  std::unordered_map<std::string, std::size_t> string_ids_;
  value_type sample_types_[2];
  std::size_t sample_type_count_ = 0;
  std::string period_type_name_;
  std::uint64_t period_ns_ = 0;
  long double factor_ = 1;
  bool two_values_ = false;
  std::vector<mapping_rec> mappings_;
  std::unordered_map<std::string, std::uint64_t> mapping_ids_;
  std::vector<std::uint64_t> frame_location_;  // per frame index: its one-frame location id (0: none yet)
  std::vector<location_rec> locations_;
  std::unordered_map<std::string, std::uint64_t> location_ids_;
  std::vector<function_rec> functions_;
  std::unordered_map<std::string, std::uint64_t> function_ids_;
  std::vector<sample_rec> samples_;
  std::unordered_map<std::string, std::size_t> sample_ids_;
};

// The raw (not gzipped) profile.proto bytes of a profile.
inline std::string encode_pprof(const profile& p) { return pprof_builder(p).encode(); }

}  // namespace detail

// The pprof bytes of a profile: gzipped unless `opts.gzip` is false.
inline std::string write_pprof(const profile& p, const pprof_options& opts = {}) {
  std::string raw = detail::encode_pprof(p);
  return opts.gzip ? detail::gzip_compress(raw) : raw;
}

}  // namespace selfprof
