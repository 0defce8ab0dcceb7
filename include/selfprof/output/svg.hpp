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
#include "selfprof/output/svg_frames.hpp"
#include "selfprof/output/svg_options.hpp"
#include "selfprof/output/svg_script.hpp"
#include "selfprof/output/svg_text.hpp"
#include "selfprof/profile.hpp"
#include "selfprof/status.hpp"
#include "selfprof/version.hpp"

namespace selfprof {
namespace detail {

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
