// The options of the SVG flame graph writer (flamegraph.pl's, with their defaults) and the parser of
// its --minwidth value.
// Context: any thread except the signal handler.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "selfprof/output/palette.hpp"
#include "selfprof/output/text.hpp"
#include "selfprof/status.hpp"

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

}  // namespace selfprof
