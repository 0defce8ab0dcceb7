// selfprof flamegraph / diff / top / pprof: the writers of include/selfprof/output/ over folded files.
#include <unistd.h>

#include <cstdio>
#include <functional>
#include <string>
#include <vector>

#include "args.hpp"
#include "commands.hpp"
#include "folded_input.hpp"
#include "selfprof/output/diff.hpp"
#include "selfprof/output/palette.hpp"
#include "selfprof/output/pprof.hpp"
#include "selfprof/output/sink.hpp"
#include "selfprof/output/svg.hpp"
#include "selfprof/output/top.hpp"

namespace selfprof_cli {
namespace {

using selfprof::status;
using namespace selfprof::detail;

// Writes `bytes` to `path` atomically, or to stdout when `path` is empty.
status emit(const std::string& path, const std::string& bytes) {
  if (!path.empty()) return write_file_atomic(path, bytes);
  if (write_all(1, bytes) != 0) return status::error("cannot write to stdout");
  return status::ok();
}

const char* const svg_options_help =
    "SVG options (flamegraph.pl's names; unique prefixes work, e.g. --color=java):\n"
    "  --title=TEXT          heading (default \"Flame Graph\", \"Icicle Graph\", \"Flame Chart\")\n"
    "  --subtitle=TEXT       second heading\n"
    "  --width=PX            fixed image width (default: fluid, follows the window; 1200 initially)\n"
    "  --height=PX           row height (default 16)\n"
    "  --minwidth=PX|PCT%    frames narrower than PX pixels (or PCT% of the total) are merged into one\n"
    "                        aggregate frame per parent (default 0.1 px)\n"
    "  --fonttype=FONT       CSS font family (default Verdana)\n"
    "  --fontsize=SIZE       font size (default 12)\n"
    "  --fontwidth=RATIO     average glyph width / font size, for label truncation (default 0.59)\n"
    "  --countname=WORD      unit shown in tooltips (default samples)\n"
    "  --nametype=TEXT       prefix of the details line (default \"Function:\")\n"
    "  --colors=PALETTE      hot (default), mem, io, wakeup, chain, java, js, perl, python, rust, red,\n"
    "                        green, blue, aqua, yellow, purple, orange\n"
    "  --bgcolors=COLOR      yellow, blue, green, grey or #rrggbb (default by palette)\n"
    "  --hash                colours from flamegraph.pl's weighted name hash (default: a stable FNV\n"
    "                        hash; either way a name has the same colour in every graph)\n"
    "  --cp                  consistent palette: read ./palette.map, add new names, write it back\n"
    "  --reverse             reverse the stacks: merge from the leaf (a \"who calls the hot leaves\" view)\n"
    "  --inverted, -i        icicle graph: root at the top\n"
    "  --flamechart          x is time: keep the input order, merge only adjacent identical stacks\n"
    "  --negate              differential input: swap the red and blue hues and the sign of deltas\n"
    "  --total=N             width of 100% when larger than the real total (same scale across graphs)\n"
    "  --notes=TEXT          text for a <!-- NOTES: --> comment\n"
    "  --search-color=#RGB   search highlight (default #e600e6)\n"
    "  --stroke-color=#RGB   outline every frame\n"
    "  --truncate-left       long labels keep their end (\"..tail\") instead of their start\n"
    "  --no-javascript       a static picture (no zoom or search)\n"
    "  --no-footer           no sampling metadata line at the bottom\n";

const std::vector<option_spec>& svg_specs() {
  static const std::vector<option_spec> specs = {
      {"title", 0, true},          {"subtitle", 0, true},     {"width", 0, true},
      {"height", 0, true},         {"minwidth", 0, true},     {"fonttype", 0, true},
      {"fontsize", 0, true},       {"fontwidth", 0, true},    {"countname", 0, true},
      {"nametype", 0, true},       {"colors", 0, true},       {"bgcolors", 0, true},
      {"hash", 0, false},          {"random", 0, false},      {"cp", 0, false},
      {"reverse", 0, false},       {"inverted", 'i', false},  {"flamechart", 0, false},
      {"negate", 0, false},        {"total", 0, true},        {"notes", 0, true},
      {"search-color", 0, true},   {"stroke-color", 0, true}, {"truncate-left", 0, false},
      {"no-javascript", 0, false}, {"no-footer", 0, false},   {"factor", 0, true},
      {"nameattr", 0, true},       {"encoding", 0, true},     {"output", 'o', true},
      {"strict", 0, false},        {"quiet", 'q', false},     {"help", 'h', false},
  };
  return specs;
}

// Fills svg_options from parsed flags. `cp` receives the palette map when --cp is given.
status svg_from_args(const parsed_args& a, selfprof::svg_options& o, bool& cp) {
  unsigned long long u = 0;
  double d = 0;
  if (a.has("title")) o.title = a.get("title");
  if (a.has("subtitle")) o.subtitle = a.get("subtitle");
  if (a.has("width")) {
    if (!parse_uint_arg(a.get("width"), 100, 100000, u))
      return status::error("--width: expected pixels from 100 to 100000");
    o.width = static_cast<int>(u);
    o.fluid = false;
  }
  if (a.has("height")) {
    if (!parse_uint_arg(a.get("height"), 2, 1000, u))
      return status::error("--height: expected pixels from 2 to 1000");
    o.frame_height = static_cast<int>(u);
  }
  if (a.has("minwidth")) {
    status st = selfprof::parse_min_width(a.get("minwidth"), o);
    if (!st) return status::error("--" + st.message());
  }
  if (a.has("fonttype")) o.font = a.get("fonttype");
  if (a.has("fontsize")) {
    if (!parse_double_arg(a.get("fontsize"), 1, 200, d))
      return status::error("--fontsize: expected a size from 1 to 200");
    o.font_size = d;
  }
  if (a.has("fontwidth")) {
    if (!parse_double_arg(a.get("fontwidth"), 0.05, 5, d))
      return status::error("--fontwidth: expected a ratio from 0.05 to 5");
    o.font_width = d;
  }
  if (a.has("countname")) o.count_name = a.get("countname");
  if (a.has("nametype")) o.name_type = a.get("nametype");
  if (a.has("colors") && !parse_palette(a.get("colors"), o.colors))
    return status::error(
        "--colors: unknown palette '" + a.get("colors") +
        "' (hot mem io wakeup chain java js perl python rust red green blue aqua yellow purple orange)");
  if (a.has("bgcolors")) {
    background bg;
    if (!resolve_background(a.get("bgcolors"), o.colors, bg))
      return status::error("--bgcolors: expected yellow, blue, green, grey or #rrggbb, not '" +
                           a.get("bgcolors") + "'");
    o.bg_colors = a.get("bgcolors");
  }
  if (a.has("hash")) o.hash = selfprof::color_hash::perl_hash;
  if (a.has("random") && !a.has("quiet"))
    std::fprintf(stderr, "selfprof: --random is not supported; colours stay stable per name\n");
  cp = a.has("cp");
  o.reverse = a.has("reverse");
  o.inverted = a.has("inverted");
  o.flamechart = a.has("flamechart");
  if (a.has("total")) {
    if (!parse_uint_arg(a.get("total"), 0, 999999999999999999ull, u))
      return status::error("--total: expected a count");
    o.total = u;
  }
  if (a.has("notes")) {
    o.notes = a.get("notes");
    if (o.notes.find_first_of("<>") != std::string::npos)
      return status::error("--notes: may not contain < or >");
  }
  if (a.has("search-color")) {
    if (!is_hex_color(a.get("search-color"))) return status::error("--search-color: expected #rrggbb");
    o.search_color = a.get("search-color");
  }
  if (a.has("stroke-color")) {
    if (!is_hex_color(a.get("stroke-color"))) return status::error("--stroke-color: expected #rrggbb");
    o.stroke_color = a.get("stroke-color");
  }
  o.truncate_text_left = a.has("truncate-left");
  o.javascript = !a.has("no-javascript");
  o.footer = !a.has("no-footer");
  for (const char* unsupported : {"factor", "nameattr", "encoding"})
    if (a.has(unsupported))
      return status::error(std::string("--") + unsupported +
                           " is not supported (output is always UTF-8; counts are integers)");
  return status::ok();
}

// The "before" profile of differential folded input (COUNT1 per stack).
selfprof::profile before_profile(const selfprof::folded_parse_result& r) {
  selfprof::profile b;
  b.frames = r.prof.frames;
  b.info = r.prof.info;
  for (std::size_t i = 0; i < r.prof.stacks.size(); ++i) {
    selfprof::stack s = r.prof.stacks[i];
    s.count = i < r.before_counts.size() ? r.before_counts[i] : 0;
    b.stacks.push_back(std::move(s));
  }
  return b;
}

status render_svg_with_cp(const char* cmd, bool cp, selfprof::svg_options& o, std::string& svg,
                          const std::function<std::string(const selfprof::svg_options&)>& render) {
  selfprof::palette_map map;
  if (cp) {
    std::string text;
    if (::access("palette.map", F_OK) == 0) {
      status st = read_all("palette.map", text);
      if (!st) return st;
    }
    map = parse_palette_map(text);
    o.consistent_palette = &map;
  }
  svg = render(o);
  if (cp) {
    status st = write_file_atomic("palette.map", format_palette_map(map));
    if (!st) std::fprintf(stderr, "selfprof %s: %s\n", cmd, st.message().c_str());
  }
  return status::ok();
}

int help_or_parse(const char* cmd, int argc, char** argv, std::vector<option_spec> specs, parsed_args& a,
                  const char* help, bool& done) {
  done = false;
  status st = parse_args(argc, argv, 2, specs, a);
  if (!st) {
    done = true;
    return fail(cmd, st.message(), 2);
  }
  if (a.has("help")) {
    std::fputs(help, stdout);
    done = true;
  }
  return 0;
}

}  // namespace

int run_flamegraph(int argc, char** argv) {
  static const std::string help =
      std::string(
          "usage: selfprof flamegraph [options] [FILE...|-] > out.svg\n"
          "\n"
          "Draws folded stacks (one 'frame;frame;... COUNT' line per stack) as an interactive SVG flame\n"
          "graph: hover for details, click to zoom, Ctrl-F or / to search. Reads the files one after the\n"
          "other (stdin when none or `-`; gzip recognised) and accepts every folded dialect: the output of\n"
          "stackcollapse-*.pl, inferno, async-profiler (`[name tid=N]` thread roots), bcc, selfprof;\n"
          "`_[k]` `_[j]` `_[i]` annotations; blank and `# ` comment lines; fractional counts (truncated,\n"
          "with a warning); differential input with two counts per line (as difffolded.pl prints), drawn\n"
          "red (grew) and blue (shrank) with the widths of the second column.\n"
          "Malformed lines are skipped and reported with their file and line number; --strict makes them\n"
          "fatal. No stacks at all gives a small error picture and exit status 2 (as flamegraph.pl).\n"
          "\n") +
      svg_options_help +
      "other options:\n"
      "  -o, --output=FILE     write the SVG to FILE (atomically, mode 0600) instead of stdout\n"
      "  --strict              malformed input lines are an error (exit 1)\n"
      "  -q, --quiet           no warnings\n"
      "  -h, --help            this text\n"
      "\n"
      "example:\n"
      "  perf script | selfprof collapse | selfprof flamegraph --title=\"my app\" > app.svg\n";
  parsed_args a;
  bool done = false;
  int rc = help_or_parse("flamegraph", argc, argv, svg_specs(), a, help.c_str(), done);
  if (done) return rc;
  selfprof::svg_options o;
  bool cp = false;
  status st = svg_from_args(a, o, cp);
  if (!st) return fail("flamegraph", st.message(), 2);
  std::vector<std::string> inputs = a.positional;
  for (auto& r : a.rest) inputs.push_back(r);
  if (inputs.empty()) inputs.push_back("-");
  load_options lo;
  lo.strict = a.has("strict");
  lo.quiet = a.has("quiet");
  selfprof::folded_parse_result r;
  st = load_folded("flamegraph", inputs, lo, r);
  if (!st) return fail("flamegraph", st.message());
  std::string svg;
  const bool diff = r.differential;
  selfprof::profile before;
  if (diff) before = before_profile(r);
  render_svg_with_cp("flamegraph", cp, o, svg, [&](const selfprof::svg_options& so) {
    if (!diff) return write_svg(r.prof, so);
    selfprof::diff_options d;
    d.negate = a.has("negate");
    d.widths = selfprof::diff_width::after;
    selfprof::svg_options o2 = so;
    if (o2.title.empty()) o2.title = "Flame Graph";
    return write_diff_svg(before, r.prof, o2, d);
  });
  std::uint64_t total = 0;
  for (const auto& s : r.prof.stacks) selfprof::detail::add_saturating(total, s.count);
  if (!lo.quiet && total > 0 && total < 100 && o.count_name == "samples")
    std::fprintf(stderr, "selfprof flamegraph: warning: stack count is low (%llu); the graph may mislead\n",
                 static_cast<unsigned long long>(total));
  st = emit(a.get("output"), svg);
  if (!st) return fail("flamegraph", st.message());
  if (total == 0) {
    std::fprintf(stderr, "selfprof flamegraph: ERROR: no stack counts found in the input\n");
    return 2;
  }
  return 0;
}

int run_diff(int argc, char** argv) {
  static const std::string help =
      std::string(
          "usage: selfprof diff [options] BEFORE AFTER > diff.svg\n"
          "       selfprof diff --folded [-n] [-s] BEFORE AFTER > diff.folded\n"
          "\n"
          "Compares two folded profiles. By default draws a differential flame graph: a frame is red when\n"
          "its own (self) samples grew from BEFORE to AFTER and blue when they shrank, the stronger the\n"
          "larger the change; tooltips show both counts and the change. Frame widths are the larger of the\n"
          "two counts, so code that vanished stays visible (--widths=after draws as flamegraph.pl would).\n"
          "With --folded prints difffolded.pl's three columns instead: 'stack BEFORE_COUNT AFTER_COUNT' for\n"
          "every stack of either file (sorted), ready for `selfprof flamegraph` or flamegraph.pl.\n"
          "\n"
          "diff options:\n"
          "  -n, --normalize       scale BEFORE to AFTER's total first (compare shapes, not amounts)\n"
          "  -s, --strip-hex       replace every 0x... hex number with 0x... before matching stacks\n"
          "  --folded              print the three-column text instead of an SVG\n"
          "  --widths=WHICH        larger (default), after or before: which counts set the widths\n"
          "  --inclusive           colour by each frame's inclusive change instead of its self change\n"
          "  -o, --output=FILE     write to FILE (atomically) instead of stdout\n"
          "  --strict, -q, -h      as for flamegraph\n"
          "\n") +
      svg_options_help;
  std::vector<option_spec> specs = svg_specs();
  specs.push_back({"normalize", 'n', false});
  specs.push_back({"strip-hex", 's', false});
  specs.push_back({"folded", 0, false});
  specs.push_back({"widths", 0, true});
  specs.push_back({"inclusive", 0, false});
  parsed_args a;
  bool done = false;
  int rc = help_or_parse("diff", argc, argv, specs, a, help.c_str(), done);
  if (done) return rc;
  std::vector<std::string> inputs = a.positional;
  for (auto& r : a.rest) inputs.push_back(r);
  if (inputs.size() != 2) return fail("diff", "expected two files, BEFORE and AFTER (see --help)", 2);
  selfprof::diff_options d;
  d.normalize = a.has("normalize");
  d.strip_hex = a.has("strip-hex");
  d.negate = a.has("negate");
  d.inclusive = a.has("inclusive");
  const std::string widths = a.get("widths", "larger");
  if (widths == "after")
    d.widths = selfprof::diff_width::after;
  else if (widths == "before")
    d.widths = selfprof::diff_width::before;
  else if (widths != "larger")
    return fail("diff", "--widths: expected larger, after or before", 2);
  selfprof::svg_options o;
  bool cp = false;
  status st = svg_from_args(a, o, cp);
  if (!st) return fail("diff", st.message(), 2);
  load_options lo;
  lo.strict = a.has("strict");
  lo.quiet = a.has("quiet");
  selfprof::folded_parse_result before, after;
  st = load_folded("diff", {inputs[0]}, lo, before);
  if (st) st = load_folded("diff", {inputs[1]}, lo, after);
  if (!st) return fail("diff", st.message());
  std::string out;
  if (a.has("folded")) {
    out = write_diff_folded(before.prof, after.prof, d);
  } else {
    render_svg_with_cp("diff", cp, o, out, [&](const selfprof::svg_options& so) {
      return write_diff_svg(before.prof, after.prof, so, d);
    });
  }
  st = emit(a.get("output"), out);
  if (!st) return fail("diff", st.message());
  return 0;
}

int run_top(int argc, char** argv) {
  static const char* const help =
      "usage: selfprof top [options] [FILE|-]\n"
      "\n"
      "Prints the flat ranking `perf report --no-children` would: for every function its self samples\n"
      "(the stack ended in it) and total samples (it was anywhere on the stack, counted once per stack),\n"
      "as counts and percentages, sorted by self. Input is folded stacks (see `selfprof flamegraph\n"
      "--help` for the dialects).\n"
      "\n"
      "options:\n"
      "  -n, --limit=N         at most N rows (default: all)\n"
      "  -m, --modules         add the same ranking per module (needs module information in the frames)\n"
      "  -o, --output=FILE     write to FILE (atomically) instead of stdout\n"
      "  --strict, -q, -h      as for flamegraph\n";
  static const std::vector<option_spec> specs = {{"limit", 'n', true},  {"modules", 'm', false},
                                                 {"output", 'o', true}, {"strict", 0, false},
                                                 {"quiet", 'q', false}, {"help", 'h', false}};
  parsed_args a;
  bool done = false;
  int rc = help_or_parse("top", argc, argv, specs, a, help, done);
  if (done) return rc;
  selfprof::top_options t;
  unsigned long long u = 0;
  if (a.has("limit")) {
    if (!parse_uint_arg(a.get("limit"), 1, 100000000, u))
      return fail("top", "--limit: expected a positive number", 2);
    t.limit = static_cast<std::size_t>(u);
  }
  t.by_module = a.has("modules");
  std::vector<std::string> inputs = a.positional;
  if (inputs.empty()) inputs.push_back("-");
  load_options lo;
  lo.strict = a.has("strict");
  lo.quiet = a.has("quiet");
  selfprof::folded_parse_result r;
  status st = load_folded("top", inputs, lo, r);
  if (!st) return fail("top", st.message());
  st = emit(a.get("output"), selfprof::write_top(r.prof, t));
  if (!st) return fail("top", st.message());
  return 0;
}

int run_pprof(int argc, char** argv) {
  static const char* const help =
      "usage: selfprof pprof [options] [FILE|-] -o OUT.pb.gz\n"
      "\n"
      "Converts folded stacks to a gzipped pprof profile.proto, readable by `go tool pprof`, pprof's web\n"
      "UI, Pyroscope, Parca and speedscope. Frames keep their annotation as the function's kind.\n"
      "\n"
      "options:\n"
      "  -o, --output=FILE     where to write (atomically, mode 0600); stdout when it is not a terminal\n"
      "  --raw                 write the protobuf without gzip\n"
      "  --strict, -q, -h      as for flamegraph\n";
  static const std::vector<option_spec> specs = {{"output", 'o', true},
                                                 {"raw", 0, false},
                                                 {"strict", 0, false},
                                                 {"quiet", 'q', false},
                                                 {"help", 'h', false}};
  parsed_args a;
  bool done = false;
  int rc = help_or_parse("pprof", argc, argv, specs, a, help, done);
  if (done) return rc;
  if (!a.has("output") && ::isatty(1) == 1)
    return fail("pprof", "refusing to write binary data to a terminal; give -o OUT.pb.gz", 2);
  std::vector<std::string> inputs = a.positional;
  if (inputs.empty()) inputs.push_back("-");
  load_options lo;
  lo.strict = a.has("strict");
  lo.quiet = a.has("quiet");
  selfprof::folded_parse_result r;
  status st = load_folded("pprof", inputs, lo, r);
  if (!st) return fail("pprof", st.message());
  selfprof::pprof_options po;
  po.gzip = !a.has("raw");
  st = emit(a.get("output"), selfprof::write_pprof(r.prof, po));
  if (!st) return fail("pprof", st.message());
  return 0;
}

}  // namespace selfprof_cli
