// The interactive SVG flame graph writer: flamegraph.pl's DOM and tooltips, inferno's fg:x/fg:w, one
// self-contained file.
// Context: any thread (pure function of the profile; runs on the dump path, never in the signal handler).
#pragma once

#include <cstdint>
#include <ctime>
#include <string>
#include <string_view>
#include <vector>

#include "selfprof/output/flame_tree.hpp"
#include "selfprof/output/palette.hpp"
#include "selfprof/output/svg_script.hpp"
#include "selfprof/output/svg_text.hpp"
#include "selfprof/profile.hpp"
#include "selfprof/status.hpp"
#include "selfprof/version.hpp"

namespace selfprof {

// How the flame graph is drawn. Defaults follow flamegraph.pl, except the width (fluid) and the
// colours (stable per name without flags).
struct svg_options {
  std::string title;  // empty: "Flame Graph", "Icicle Graph" or "Flame Chart"
  std::string subtitle;
  int width = 1200;       // px; the initial width when fluid
  bool fluid = true;      // the picture follows the window width (fixed at `width` when false)
  int frame_height = 16;  // row pitch in px (the rect is one less)
  double font_size = 12;
  double font_width = 0.59;  // average glyph width as a fraction of font_size (label truncation)
  std::string font = "Verdana,DejaVu Sans,sans-serif";
  double min_width = 0.1;          // frames narrower are merged into one aggregate frame per parent
  bool min_width_percent = false;  // min_width is a % of the total instead of px
  std::string count_name = "samples";
  std::string name_type = "Function:";
  bool inverted = false;    // icicle: root at the top
  bool reverse = false;     // merge from the leaf end (leaf becomes the root)
  bool flamechart = false;  // x is time: keep the profile's stack order, merge only adjacent stacks
  palette colors = palette::hot;
  color_hash hash = color_hash::stable;
  std::string bg_colors;                      // yellow|blue|green|grey|#rrggbb; empty: by palette
  palette_map* consistent_palette = nullptr;  // --cp: names found here keep their colour, new names are added
  std::string search_color = "#e600e6";
  std::string stroke_color;  // #rrggbb outline on every frame; empty: none
  std::string ui_color = "#000000";
  bool truncate_text_left = false;  // labels keep the end of long names ("..tail")
  std::uint64_t total = 0;          // 100% width when larger than the real total (same scale across graphs)
  std::string notes;                // goes into a <!-- NOTES: --> comment
  bool footer = true;               // sampling metadata line at the bottom
  bool javascript = true;           // false: static picture (smaller; for golden files)
};

// Parses flamegraph.pl's --minwidth value: "N" (px) or "N%".
inline status parse_min_width(std::string_view text, svg_options& o) {
  bool pct = !text.empty() && text.back() == '%';
  std::string_view num = pct ? text.substr(0, text.size() - 1) : text;
  if (num.empty() || num.find_first_not_of("0123456789.") != std::string_view::npos ||
      num.find('.') != num.rfind('.'))
    return status::error("minwidth: '" + std::string(text) +
                         "' is not a number of px or a percentage like 0.5%");
  o.min_width = std::stod(std::string(num));
  o.min_width_percent = pct;
  return status::ok();
}

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

// The whole document for laid-out frames.
inline std::string render_svg(const svg_input& in, const svg_options& o) {
  std::uint32_t depth_max = 0;
  for (const auto& f : in.frames) depth_max = f.depth > depth_max ? f.depth : depth_max;
  const svg_geometry g = make_geometry(o, depth_max, o.footer && in.info);
  const double W = g.width, H = g.height, f = g.font_size;
  const double frames_w = W - 2 * g.xpad;
  const double char_w = f * (o.font_width > 0 ? o.font_width : 0.59);
  const std::string ui = is_hex_color(o.ui_color) ? o.ui_color : std::string("#000000");

  std::string out;
  out.reserve(4096 + in.frames.size() * 200);
  out +=
      "<?xml version=\"1.0\" standalone=\"no\"?>\n"
      "<!DOCTYPE svg PUBLIC \"-//W3C//DTD SVG 1.1//EN\" "
      "\"http://www.w3.org/Graphics/SVG/1.1/DTD/svg11.dtd\">\n"
      "<svg version=\"1.1\" width=\"";
  append_num(out, W, 0);
  out += "\" height=\"";
  append_num(out, H, 0);
  out += "\"";
  if (o.javascript) out += " onload=\"init(evt)\"";
  out += " viewBox=\"0 0 ";
  append_num(out, W, 0);
  out += ' ';
  append_num(out, H, 0);
  out +=
      "\" xmlns=\"http://www.w3.org/2000/svg\" xmlns:xlink=\"http://www.w3.org/1999/xlink\""
      " xmlns:fg=\"http://github.com/jonhoo/inferno\">\n"
      "<!-- Flame graph by selfprof " SELFPROF_VERSION_STRING
      " (conventions of Brendan Gregg's flamegraph.pl and inferno). -->\n<!-- NOTES: ";
  {
    std::string notes = xml_escape(o.notes);
    for (std::size_t p; (p = notes.find("--")) != std::string::npos;)
      notes.replace(p, 2, "- ");  // no "--" in comments
    out += notes;
  }
  out += " -->\n";

  background bg;
  resolve_background(o.bg_colors, o.colors, bg);
  out += "<defs><linearGradient id=\"background\" y1=\"0\" y2=\"1\" x1=\"0\" x2=\"0\"><stop stop-color=\"";
  out += bg.top;
  out += "\" offset=\"5%\"/><stop stop-color=\"";
  out += bg.bottom;
  out += "\" offset=\"95%\"/></linearGradient></defs>\n";

  out += "<style type=\"text/css\">\ntext{font-family:";
  out += xml_escape(css_font_family(o.font));
  out += ";font-size:";
  append_num(out, f, 2);
  out += "px;fill:rgb(0,0,0)}\n#title{font-size:";
  append_num(out, f + 5, 2);
  out += "px}\n#title,#subtitle,#details,#unzoom,#search,#ignorecase,#matched{fill:";
  out += ui;
  out += "}\n#footer{font-size:";
  append_num(out, f > 3 ? f - 2 : f, 2);
  out += "px}\n";
  if (is_hex_color(o.stroke_color)) {
    out += "#frames rect{stroke:";
    out += o.stroke_color;
    out += ";stroke-width:0.5}\n";
  }
  out += svg_static_css;
  out += "</style>\n";

  if (o.javascript) {
    out += "<script type=\"text/ecmascript\"><![CDATA[\nvar nametype = ";
    out += js_string(o.name_type);
    out += ";\nvar fontsize = ";
    append_num(out, f, 2);
    out += ";\nvar fontwidth = ";
    append_num(out, o.font_width > 0 ? o.font_width : 0.59, 4);
    out += ";\nvar xpad = 10;\nvar inverted = ";
    out += o.inverted ? "true" : "false";
    out += ";\nvar searchcolor = ";
    out += js_string(is_hex_color(o.search_color) ? o.search_color : "#e600e6");
    out += ";\nvar fluiddrawing = ";
    out += o.fluid ? "true" : "false";
    out += ";\nvar truncate_text_right = ";
    out += o.truncate_text_left ? "false" : "true";
    out += ";\nvar frameheight = ";
    append_num(out, g.frame_height, 2);
    out += ";\n]]><![CDATA[\n";
    out += svg_static_js;
    out += "]]></script>\n";
  }

  std::string title = o.title.empty() ? in.default_title : o.title;
  out += "<rect id=\"background_rect\" x=\"0\" y=\"0\" width=\"";
  append_num(out, W, 0);
  out += "\" height=\"";
  append_num(out, H, 0);
  out += "\" fill=\"url(#background)\"/>\n<text id=\"title\" x=\"50%\" y=\"";
  append_num(out, f * 2, 2);
  out += "\">";
  out += xml_escape(title);
  out += "</text>\n";
  if (!o.subtitle.empty()) {
    out += "<text id=\"subtitle\" x=\"50%\" y=\"";
    append_num(out, f * 4, 2);
    out += "\">";
    out += xml_escape(o.subtitle);
    out += "</text>\n";
  }
  const double bottom_line = H - g.footer_h - (g.ypad2 - g.footer_h) / 2;
  out += "<text id=\"details\" x=\"10\" y=\"";
  append_num(out, bottom_line, 2);
  out += "\"> </text>\n<text id=\"unzoom\" class=\"hide\" x=\"10\" y=\"";
  append_num(out, f * 2, 2);
  out += "\">Reset Zoom</text>\n<text id=\"search\" x=\"";
  append_num(out, W - g.xpad - 24, 2);
  out += "\" y=\"";
  append_num(out, f * 2, 2);
  out += "\">Search</text>\n<text id=\"ignorecase\" x=\"";
  append_num(out, W - g.xpad, 2);
  out += "\" y=\"";
  append_num(out, f * 2, 2);
  out += "\">ic</text>\n<text id=\"matched\" x=\"";
  append_num(out, W - g.xpad, 2);
  out += "\" y=\"";
  append_num(out, bottom_line, 2);
  out += "\"> </text>\n";
  if (o.footer && in.info) {
    out += "<text id=\"footer\" x=\"10\" y=\"";
    append_num(out, H - 6, 2);
    out += "\">";
    out += xml_escape(footer_text(*in.info, in.value_total, o.count_name));
    out += "</text>\n";
  }

  out += "<svg id=\"frames\" x=\"10\" width=\"";
  append_num(out, frames_w, 0);
  out += "\" total_samples=\"";
  out += std::to_string(in.total);
  out += "\">\n";

  const auto& names = in.tree->names();
  std::vector<std::string> fill_cache(names.size());
  std::vector<std::string> display_cache(names.size());  // sanitized, de-annotated, unescaped
  std::string tip, agg_name;
  const double total_d = in.total ? static_cast<double>(in.total) : 1.0;
  const double text_dx = 300.0 / frames_w;  // 3 px as a % of the frames area
  for (const laid_frame& fr : in.frames) {
    std::string_view annotated;
    std::string_view display;
    if (fr.node == no_node) {
      agg_name = "[";
      agg_name += std::to_string(fr.elided);
      agg_name += " elided frames]";
      annotated = display = agg_name;
    } else if (fr.parent == no_node) {
      annotated = display = "all";
    } else {
      std::uint32_t id = in.tree->nodes()[fr.node].name;
      annotated = names[id];
      std::string& d = display_cache[id];
      if (d.empty()) d = sanitize_utf8(strip_annotation(annotated));
      display = d;
    }
    const double xp = 100.0 * static_cast<double>(fr.x) / total_d;
    const double wp = 100.0 * static_cast<double>(fr.width) / total_d;
    const double y = g.frame_y(fr.depth);
    out += "<g><title>";
    tip.clear();
    append_tooltip(tip, in, fr, display, o);
    append_xml_escaped(out, tip);
    out += "</title><rect x=\"";
    append_num(out, xp, 3);
    out += "%\" y=\"";
    append_num(out, y, 2);
    out += "\" width=\"";
    append_num(out, wp, 3);
    out += "%\" height=\"";
    append_num(out, g.frame_height - 1, 2);
    out += "\" fill=\"";
    out += frame_fill(in, fr, annotated, o, fill_cache);
    out += "\" fg:x=\"";
    out += std::to_string(fr.x);
    out += "\" fg:w=\"";
    out += std::to_string(fr.width);
    out += "\"/>";
    const double width_px = wp / 100.0 * frames_w;
    std::string label =
        truncate_label(display, static_cast<std::size_t>(width_px / char_w), o.truncate_text_left);
    if (label.empty()) {
      out += "<text></text></g>\n";
      continue;
    }
    out += "<text x=\"";
    append_num(out, xp + text_dx, 3);
    out += "%\" y=\"";
    append_num(out, y + (g.frame_height - 1) / 2 + 3, 2);
    out += "\">";
    append_xml_escaped(out, label);
    out += "</text></g>\n";
  }
  out += "</svg>\n</svg>\n";
  return out;
}

// flamegraph.pl's picture for a profile with no samples (it exits with an error; we still write a file).
inline std::string render_error_svg(const svg_options& o, std::string_view message) {
  const double W = o.width < 100 ? 100 : o.width;
  std::string out =
      "<?xml version=\"1.0\" standalone=\"no\"?>\n"
      "<!DOCTYPE svg PUBLIC \"-//W3C//DTD SVG 1.1//EN\" "
      "\"http://www.w3.org/Graphics/SVG/1.1/DTD/svg11.dtd\">\n"
      "<svg version=\"1.1\" width=\"";
  append_num(out, W, 0);
  out += "\" height=\"60\" viewBox=\"0 0 ";
  append_num(out, W, 0);
  out +=
      " 60\" xmlns=\"http://www.w3.org/2000/svg\">\n<text id=\"title\" x=\"50%\" y=\"36\" "
      "text-anchor=\"middle\" font-family=\"Verdana\" font-size=\"17\">";
  out += xml_escape(message);
  out += "</text>\n</svg>\n";
  return out;
}

inline double min_width_samples(const svg_options& o, std::uint64_t total) {
  if (o.min_width <= 0) return 0;
  if (o.min_width_percent) return static_cast<double>(total) * o.min_width / 100.0;
  double frames_w = (o.width < 100 ? 100 : o.width) - 20.0;
  return o.min_width * static_cast<double>(total) / frames_w;
}

// The SVG flame graph of a profile. Frames are merged by name; an empty profile gives a small
// error picture (as flamegraph.pl does) rather than nothing.
inline std::string write_svg(const profile& p, const svg_options& o) {
  flame_tree tree;
  flame_build_options b;
  b.reverse = o.reverse;
  b.flamechart = o.flamechart;
  b.mark_wakers = o.colors == palette::chain;
  add_profile(tree, p, 2, b, [](std::uint64_t, std::uint64_t after) { return after; });
  if (tree.total_width() == 0) return render_error_svg(o, "ERROR: No stack counts found");
  svg_input in;
  in.tree = &tree;
  in.total = tree.total_width() > o.total ? tree.total_width() : o.total;
  in.value_total = in.total;
  in.before_total = in.total;
  in.info = &p.info;
  in.default_title = o.flamechart ? "Flame Chart" : (o.inverted ? "Icicle Graph" : "Flame Graph");
  in.frames = tree.layout(min_width_samples(o, in.total));
  in.frames[0].width = in.total;  // the root spans the whole width, also with a larger `total`
  if (p.info.frame_loops.empty()) return render_svg(in, o);
  svg_options with_frames = o;  // game-frame statistics under the title
  for (const auto& l : p.info.frame_loops) {
    if (!with_frames.subtitle.empty()) with_frames.subtitle += "; ";
    with_frames.subtitle += frame_stats_line(l);
  }
  return render_svg(in, with_frames);
}

}  // namespace detail
}  // namespace selfprof
