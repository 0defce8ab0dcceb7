// The pieces of an SVG flame graph frame: the geometry, each frame's tooltip and fill colour, the
// footer line that says what was sampled, and the diff data a frame carries.
// Context: any thread except the signal handler (a pure function of the laid-out frames).
#pragma once

#include <cstdint>
#include <ctime>
#include <string>
#include <string_view>
#include <vector>

#include "selfprof/output/flame_tree.hpp"
#include "selfprof/output/palette.hpp"
#include "selfprof/output/svg_options.hpp"
#include "selfprof/output/svg_text.hpp"
#include "selfprof/output/text.hpp"
#include "selfprof/profile.hpp"
#include "selfprof/version.hpp"

namespace selfprof {
namespace detail {

// Geometry shared by the frame and chrome emitters.
struct svg_geometry {
  double width = 1200, height = 0;
  double xpad = 10, ypad1 = 0, ypad2 = 0, footer_h = 0;
  double frame_height = 16, font_size = 12;
  std::uint32_t depth_max = 0;
  bool inverted = false;

  double frame_y(std::uint32_t depth) const {
    if (inverted) return ypad1 + depth * frame_height;
    return height - ypad2 - (depth + 1) * frame_height + 1;
  }
};

inline svg_geometry make_geometry(const svg_options& o, std::uint32_t depth_max, bool footer) {
  svg_geometry g;
  g.width = o.width < 100 ? 100 : o.width;
  g.font_size = o.font_size > 0 ? o.font_size : 12;
  g.frame_height = o.frame_height < 2 ? 2 : o.frame_height;
  g.ypad1 = g.font_size * 3 + (o.subtitle.empty() ? 0 : g.font_size * 2);
  g.footer_h = footer ? g.font_size + 4 : 0;
  g.ypad2 = g.font_size * 2 + 10 + g.footer_h;
  g.depth_max = depth_max;
  g.inverted = o.inverted;
  g.height = (depth_max + 1) * g.frame_height + g.ypad1 + g.ypad2;
  return g;
}

inline std::string css_font_family(std::string_view font) {
  std::string out;
  for (char c : font) {  // no CSS or XML syntax can leak through: letters, digits and a few separators
    unsigned char u = static_cast<unsigned char>(c);
    if ((u >= 'a' && u <= 'z') || (u >= 'A' && u <= 'Z') || (u >= '0' && u <= '9') || c == ' ' || c == ',' ||
        c == '-' || c == '_' || c == '\'' || u >= 0x80)
      out += c;
  }
  out = sanitize_utf8(out);
  return out.empty() ? std::string("Verdana") : out;
}

inline std::string format_duration(double s) {
  std::string out = s >= 100 ? fixed(s, 0) : s >= 1 ? fixed(s, 2) : fixed(s * 1000, 1);
  out += s >= 1 ? " s" : " ms";
  return out;
}

// The footer line: what was sampled, how, and how much was lost.
inline std::string footer_text(const profile_info& info, std::uint64_t total, const std::string& count_name) {
  std::string s = mode_name(info.mode);
  s += " profile";
  if (info.hz > 0) {
    s += " | ";
    append_trimmed(s, info.hz, 2);
    s += " Hz";
  }
  if (info.duration_s > 0) {
    s += " | ";
    s += format_duration(info.duration_s);
  }
  std::uint64_t samples = info.samples ? info.samples : total;
  s += " | ";
  s += with_commas(samples);
  s += ' ';
  s += info.unit.empty() ? count_name : info.unit;
  s += " | ";
  s += with_commas(info.dropped);
  s += " dropped";
  if (info.truncated) {
    s += " | ";
    s += with_commas(info.truncated);
    s += " truncated";
  }
  if (!info.source.empty()) {
    s += " | source: ";
    s += info.source;
  }
  if (!info.view.empty()) {
    s += " | view: ";
    s += info.view;
  }
  if (info.start_unix_ns) {
    std::time_t t = static_cast<std::time_t>(info.start_unix_ns / 1000000000ULL);
    std::tm tm{};
    if (gmtime_r(&t, &tm)) {
      char buf[40];
      std::strftime(buf, sizeof buf, "%Y-%m-%d %H:%M:%S UTC", &tm);
      s += " | started ";
      s += buf;
    }
  }
  s += " | selfprof " SELFPROF_VERSION_STRING;
  return s;
}

// What a flame graph needs beyond the laid-out frames: diff data and labels.
struct svg_input {
  const flame_tree* tree = nullptr;
  std::vector<laid_frame> frames;
  std::uint64_t total = 0;        // 100% of the layout width (sample space)
  std::uint64_t value_total = 0;  // 100% for the tooltip percentages (the "after" total in a diff)
  std::uint64_t before_total = 0;
  bool diff = false;
  bool negate = false;
  bool inclusive_delta = false;  // colour by the inclusive change instead of the self change
  std::int64_t max_delta = 1;
  const profile_info* info = nullptr;
  std::string default_title = "Flame Graph";
};

inline std::int64_t frame_delta(const laid_frame& f, bool inclusive) {
  if (f.node == no_node || inclusive)
    return static_cast<std::int64_t>(f.after) - static_cast<std::int64_t>(f.before);
  return static_cast<std::int64_t>(f.self_after) - static_cast<std::int64_t>(f.self_before);
}

inline void append_pct(std::string& out, std::uint64_t part, std::uint64_t whole) {
  out += fixed(whole ? 100.0 * static_cast<double>(part) / static_cast<double>(whole) : 0.0, 2);
  out += '%';
}

// Tooltip text (unescaped): flamegraph.pl's first line, then selfprof's detail lines.
inline void append_tooltip(std::string& out, const svg_input& in, const laid_frame& f, std::string_view name,
                           const svg_options& o) {
  const laid_frame* parent = f.parent == no_node ? nullptr : &in.frames[f.parent];
  out += name;
  out += " (";
  out += with_commas(f.after);
  out += ' ';
  out += o.count_name;
  out += ", ";
  if (!parent)
    out += "100%";
  else
    append_pct(out, f.after, in.value_total);
  if (in.diff) {
    std::int64_t d = frame_delta(f, in.inclusive_delta);
    if (in.negate) d = -d;
    double pct = in.value_total ? 100.0 * static_cast<double>(d) / static_cast<double>(in.value_total) : 0.0;
    out += "; ";
    if (d > 0) out += '+';
    out += fixed(pct, 2);
    out += '%';
  }
  out += ')';
  if (f.node == no_node) {
    if (in.diff) {
      out += "\nbefore ";
      out += with_commas(f.before);
      out += ", after ";
      out += with_commas(f.after);
    }
    return;
  }
  if (in.diff) {
    out += "\nbefore ";
    out += with_commas(f.before);
    out += " (";
    append_pct(out, f.before, in.before_total);
    out += "), after ";
    out += with_commas(f.after);
    out += " (";
    append_pct(out, f.after, in.value_total);
    out += ")\nself before ";
    out += with_commas(f.self_before);
    out += ", after ";
    out += with_commas(f.self_after);
    return;
  }
  // Only the self count is stored (when not zero): the script derives % of total, % of parent and
  // depth from it on hover, which keeps large graphs no larger than flamegraph.pl's.
  if (f.self_after) {
    out += "\nself ";
    out += with_commas(f.self_after);
  }
}

inline std::string frame_fill(const svg_input& in, const laid_frame& f, std::string_view annotated,
                              const svg_options& o, std::vector<std::string>& cache) {
  if (in.diff) return rgb_string(diff_color(frame_delta(f, in.inclusive_delta), in.max_delta, in.negate));
  if (f.node == no_node) return "rgb(215,215,215)";
  std::uint32_t id = in.tree->nodes()[f.node].name;
  if (f.parent == no_node) return rgb_string(frame_color(o.colors, o.hash, "all"));
  std::string& c = cache[id];
  if (!c.empty()) return c;
  if (o.consistent_palette) {
    auto it = o.consistent_palette->find(std::string(annotated));
    const std::string* v = it == o.consistent_palette->end() ? nullptr : &it->second;
    if (v && v->size() < 24 && v->rfind("rgb(", 0) == 0 && v->back() == ')' &&
        v->find_first_not_of("rgb(0123456789,)") == std::string::npos) {
      c = *v;
      return c;
    }
    c = rgb_string(frame_color(o.colors, o.hash, annotated));
    (*o.consistent_palette)[std::string(annotated)] = c;
    return c;
  }
  c = rgb_string(frame_color(o.colors, o.hash, annotated));
  return c;
}

inline void append_num(std::string& out, double v, int decimals) { append_trimmed(out, v, decimals); }

}  // namespace detail
}  // namespace selfprof
