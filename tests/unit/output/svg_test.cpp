// Tests of the SVG flame-graph writer: structure, sample-space attributes, tooltips, escaping, options,
// goldens.
#include <doctest/doctest.h>

#include <selfprof/output/svg.hpp>

#include <string>
#include <vector>

#include "fixtures.hpp"

namespace {

using selfprof::frame_kind;
using selfprof::profile;
using selfprof::svg_options;

struct builder {
  profile p;
  std::uint32_t frame(const std::string& name, frame_kind k = frame_kind::native, std::uint64_t addr = 0) {
    selfprof::frame f;
    f.name = name;
    f.kind = k;
    f.address = addr;
    p.frames.push_back(f);
    return static_cast<std::uint32_t>(p.frames.size() - 1);
  }
  // "a;b;c" with plain frames (a fresh frame per occurrence, as different addresses would give).
  builder& add(const std::string& folded, std::uint64_t count) {
    selfprof::stack s;
    std::size_t start = 0;
    while (start <= folded.size()) {
      auto semi = folded.find(';', start);
      if (semi == std::string::npos) semi = folded.size();
      s.frames.push_back(frame(folded.substr(start, semi - start), frame_kind::native, p.frames.size()));
      start = semi + 1;
    }
    s.count = count;
    p.stacks.push_back(s);
    return *this;
  }
};

profile simple_profile() {
  builder b;
  b.add("main;a;b", 70).add("main;a", 20).add("main;c", 10);
  b.p.info.hz = 99;
  b.p.info.duration_s = 1.5;
  b.p.info.samples = 100;
  b.p.info.dropped = 3;
  b.p.info.source = "perf";
  return b.p;
}

std::size_t count_of(const std::string& hay, const std::string& needle) {
  std::size_t n = 0;
  for (std::size_t p = hay.find(needle); p != std::string::npos; p = hay.find(needle, p + needle.size())) ++n;
  return n;
}

// One frame as parsed back from the SVG text.
struct parsed_frame {
  std::string title, rect, text;
  std::string attr(const std::string& name) const {
    auto p = rect.find(" " + name + "=\"");
    if (p == std::string::npos) return "";
    p += name.size() + 3;
    return rect.substr(p, rect.find('"', p) - p);
  }
};

std::vector<parsed_frame> parse_frames(const std::string& svg) {
  std::vector<parsed_frame> out;
  auto start = svg.find("<svg id=\"frames\"");
  REQUIRE(start != std::string::npos);
  for (auto p = svg.find("<g>", start); p != std::string::npos; p = svg.find("<g>", p + 1)) {
    auto end = svg.find("</g>", p);
    REQUIRE(end != std::string::npos);
    std::string g = svg.substr(p + 3, end - p - 3);
    parsed_frame f;
    auto t0 = g.find("<title>"), t1 = g.find("</title>");
    auto r0 = g.find("<rect "), r1 = g.find("/>", r0);
    auto x0 = g.find("<text");
    REQUIRE(t0 == 0);  // title, rect, text in this order
    REQUIRE(t1 != std::string::npos);
    REQUIRE(r0 == t1 + 8);
    REQUIRE(x0 == r1 + 2);
    f.title = g.substr(t0 + 7, t1 - t0 - 7);
    f.rect = g.substr(r0, r1 - r0 + 2);
    auto gt = g.find('>', x0);
    f.text = g.substr(gt + 1, g.find("</text>", gt) - gt - 1);
    out.push_back(f);
  }
  return out;
}

const parsed_frame* find_frame(const std::vector<parsed_frame>& fs, const std::string& title_prefix) {
  for (const auto& f : fs)
    if (f.title.compare(0, title_prefix.size(), title_prefix) == 0) return &f;
  return nullptr;
}

// Minimal well-formedness check: tags balance, attributes quoted, no raw '<' or '&' in text.
bool well_formed(const std::string& s, std::string& why) {
  std::vector<std::string> open;
  std::size_t i = 0;
  while (i < s.size()) {
    if (s.compare(i, 9, "<![CDATA[") == 0) {
      auto e = s.find("]]>", i);
      if (e == std::string::npos) return why = "unterminated CDATA", false;
      i = e + 3;
    } else if (s.compare(i, 4, "<!--") == 0) {
      auto e = s.find("-->", i);
      if (e == std::string::npos) return why = "unterminated comment", false;
      if (s.substr(i + 4, e - i - 4).find("--") != std::string::npos)
        return why = "-- inside a comment", false;
      i = e + 3;
    } else if (s.compare(i, 2, "<?") == 0 || s.compare(i, 2, "<!") == 0) {
      i = s.find('>', i) + 1;
    } else if (s[i] == '<') {
      auto e = s.find('>', i);
      if (e == std::string::npos) return why = "unterminated tag", false;
      std::string tag = s.substr(i + 1, e - i - 1);
      if (count_of(tag, "\"") % 2 != 0) return why = "odd quotes in " + tag, false;
      if (tag.find('<') != std::string::npos) return why = "'<' inside tag " + tag, false;
      if (tag[0] == '/') {
        if (open.empty() || open.back() != tag.substr(1))
          return why = "mismatched </" + tag.substr(1) + ">", false;
        open.pop_back();
      } else if (tag.back() != '/') {
        open.push_back(tag.substr(0, tag.find_first_of(" \n")));
      }
      i = e + 1;
    } else {
      if (s[i] == '&') {
        auto e = s.find(';', i);
        std::string ent = s.substr(i, e - i + 1);
        if (ent != "&amp;" && ent != "&lt;" && ent != "&gt;" && ent != "&quot;")
          return why = "bad entity " + ent, false;
      }
      ++i;
    }
  }
  if (!open.empty()) return why = "unclosed <" + open.back() + ">", false;
  return true;
}

}  // namespace

TEST_CASE("svg: flamegraph.pl ids, inferno attributes and one <g> per frame") {
  const std::string svg = selfprof::detail::write_svg(simple_profile(), svg_options{});
  for (const char* id :
       {"title", "details", "unzoom", "search", "ignorecase", "matched", "frames", "background"})
    CHECK(svg.find(std::string("id=\"") + id + "\"") != std::string::npos);
  CHECK(svg.find("xmlns:fg=\"http://github.com/jonhoo/inferno\"") != std::string::npos);
  CHECK(svg.find("total_samples=\"100\"") != std::string::npos);
  CHECK(svg.find(".hide{display:none}") != std::string::npos);
  CHECK(svg.find(".parent{opacity:0.5}") != std::string::npos);
  CHECK(svg.find("onload=\"init(evt)\"") != std::string::npos);
  auto fs = parse_frames(svg);
  REQUIRE(fs.size() == 5);  // all, main, a, c, b
  const parsed_frame* a = find_frame(fs, "a (");
  const parsed_frame* b = find_frame(fs, "b (");
  const parsed_frame* c = find_frame(fs, "c (");
  REQUIRE(a);
  REQUIRE(b);
  REQUIRE(c);
  CHECK(a->attr("fg:x") == "0");
  CHECK(a->attr("fg:w") == "90");
  CHECK(a->attr("width") == "90%");
  CHECK(c->attr("fg:x") == "90");
  CHECK(c->attr("x") == "90%");
  CHECK(b->attr("fg:w") == "70");
  CHECK(fs[0].title.rfind("all (100 samples, 100%)", 0) == 0);
  CHECK(fs[0].text == "all");
  std::string why;
  CHECK_MESSAGE(well_formed(svg, why), why);
}

TEST_CASE("svg: tooltips carry flamegraph.pl's first line and the self count") {
  // The script completes self %, % of parent and depth on hover (checked by tests/browser).
  auto fs = parse_frames(selfprof::detail::write_svg(simple_profile(), svg_options{}));
  const parsed_frame* a = find_frame(fs, "a (");
  REQUIRE(a);
  CHECK(a->title == "a (90 samples, 90.00%)\nself 20");
  const parsed_frame* b = find_frame(fs, "b (");
  REQUIRE(b);
  CHECK(b->title == "b (70 samples, 70.00%)\nself 70");
  CHECK(find_frame(fs, "main (")->title == "main (100 samples, 100.00%)");  // no self samples: one line

  builder big;
  big.add("main;work", 1234567);
  svg_options o;
  o.count_name = "us";
  auto fb = parse_frames(selfprof::detail::write_svg(big.p, o));
  CHECK(find_frame(fb, "work (1,234,567 us, 100.00%)") != nullptr);
}

TEST_CASE("svg: frames merge by name; input order does not change the bytes") {
  builder x;
  x.add("main;a", 5).add("main;b", 3).add("main;a", 2);  // each frame its own entry (different addresses)
  builder y;
  y.add("main;b", 3).add("main;a", 7);
  const std::string sx = selfprof::detail::write_svg(x.p, svg_options{});
  const std::string sy = selfprof::detail::write_svg(y.p, svg_options{});
  CHECK(sx == sy);
  CHECK(sx == selfprof::detail::write_svg(x.p, svg_options{}));
  auto fs = parse_frames(sx);
  CHECK(fs.size() == 4);
  CHECK(find_frame(fs, "a (7 samples") != nullptr);
}

TEST_CASE("svg: counts whose sum passes 2^64 saturate instead of wrapping (issue 15, item 13)") {
  builder x;
  const std::uint64_t half = std::uint64_t(1) << 63;
  x.add("main;a", half).add("main;b", half);  // wrapped, the sum was 0: "No stack counts found"
  const std::string sx = selfprof::detail::write_svg(x.p, svg_options{});
  CHECK(sx.find("No stack counts found") == std::string::npos);
  auto fs = parse_frames(sx);
  CHECK(fs.size() == 4);  // all, main, a, b
  CHECK(find_frame(fs, "all (18,446,744,073,709,551,615 samples") != nullptr);
  builder y;
  y.add("main;a", ~std::uint64_t(0)).add("main;b", 2);  // wrapped, the sum was 1
  const std::string sy = selfprof::detail::write_svg(y.p, svg_options{});
  CHECK(sy.find("all (1 samples") == std::string::npos);
  CHECK(sy.find("1844674407370955161600%") == std::string::npos);
}

TEST_CASE("svg: names and title are escaped and sanitized") {
  builder b;
  b.add(std::string("main;tmpl<int&, \"q\" 'r'>::f;caf\xC3\xA9;bad\xFF\x01name"), 10);
  b.p.frames[1].name = "tmpl<int&, \"q\" 'r'>::f;g";  // ';' stays a character of the name
  svg_options o;
  o.title = "<script>alert(1)</script> & \"t\"";
  o.subtitle = "sub & <b>";
  o.notes = "a --> b";
  o.name_type = "x\";alert(1);//</script>]]>";
  const std::string svg = selfprof::detail::write_svg(b.p, o);
  std::string why;
  REQUIRE_MESSAGE(well_formed(svg, why), why);
  CHECK(svg.find("&lt;script&gt;alert(1)&lt;/script&gt; &amp; &quot;t&quot;") != std::string::npos);
  CHECK(svg.find("<script>alert") == std::string::npos);
  CHECK(svg.find("sub &amp; &lt;b&gt;") != std::string::npos);
  CHECK(count_of(svg, "]]>") == 2);  // only the two CDATA sections close
  auto fs = parse_frames(svg);
  CHECK(find_frame(fs, "tmpl&lt;int&amp;, &quot;q&quot; 'r'&gt;::f;g (10 samples") != nullptr);
  CHECK(find_frame(fs, "caf\xC3\xA9 (10 samples") != nullptr);              // non-ASCII kept
  CHECK(find_frame(fs, "bad\xEF\xBF\xBD\xEF\xBF\xBDname (10") != nullptr);  // 0xFF and 0x01 replaced
}

TEST_CASE("svg: annotations are stripped from labels but colour frames; separators are grey") {
  builder b;
  std::uint32_t m = b.frame("main"), k = b.frame("do_syscall_64", frame_kind::kernel),
                j = b.frame("Interpreter::run", frame_kind::jit), i = b.frame("inl", frame_kind::inlined),
                dash = b.frame("-"), ddash = b.frame("--");
  b.p.stacks.push_back({{m, dash, k}, 10, 0, false});
  b.p.stacks.push_back({{m, j, i}, 10, 0, false});
  b.p.stacks.push_back({{m, ddash}, 10, 0, false});
  svg_options o;
  o.colors = selfprof::palette::java;
  auto fs = parse_frames(selfprof::detail::write_svg(b.p, o));
  const parsed_frame* kf = find_frame(fs, "do_syscall_64 (");
  REQUIRE(kf);
  CHECK(kf->text == "do_syscall_64");
  auto fill = kf->attr("fill");
  int r = 0, g = 0, bb = -1;
  REQUIRE(std::sscanf(fill.c_str(), "rgb(%d,%d,%d)", &r, &g, &bb) == 3);
  CHECK(r >= 190);  // orange
  CHECK(bb == 0);
  const parsed_frame* jf = find_frame(fs, "Interpreter::run (");
  REQUIRE(jf);
  REQUIRE(std::sscanf(jf->attr("fill").c_str(), "rgb(%d,%d,%d)", &r, &g, &bb) == 3);
  CHECK(g >= 200);  // green: _[j] wins over "::"
  const parsed_frame* inl = find_frame(fs, "inl (");
  REQUIRE(inl);
  REQUIRE(std::sscanf(inl->attr("fill").c_str(), "rgb(%d,%d,%d)", &r, &g, &bb) == 3);
  CHECK(g == bb);  // aqua
  CHECK(find_frame(fs, "- (")->attr("fill") == "rgb(200,200,200)");
  CHECK(find_frame(fs, "-- (")->attr("fill") == "rgb(160,160,160)");
}

TEST_CASE("svg: the same name has the same colour in every graph") {
  builder one;
  one.add("main;compute", 10);
  builder two;
  two.add("other;x;y;compute", 99).add("zzz", 1);
  auto f1 = parse_frames(selfprof::detail::write_svg(one.p, svg_options{}));
  auto f2 = parse_frames(selfprof::detail::write_svg(two.p, svg_options{}));
  CHECK(find_frame(f1, "compute (")->attr("fill") == find_frame(f2, "compute (")->attr("fill"));
}

TEST_CASE("svg: consistent palette map reuses and records colours") {
  selfprof::palette_map cp =
      selfprof::detail::parse_palette_map("main->rgb(1,2,3)\nbroken line\nx->rgb(9,9,9)\n");
  CHECK(cp.size() == 2);
  builder b;
  b.add("main;newfn", 10);
  svg_options o;
  o.consistent_palette = &cp;
  auto fs = parse_frames(selfprof::detail::write_svg(b.p, o));
  CHECK(find_frame(fs, "main (")->attr("fill") == "rgb(1,2,3)");
  REQUIRE(cp.count("newfn") == 1);
  CHECK(find_frame(fs, "newfn (")->attr("fill") == cp["newfn"]);
  CHECK(selfprof::detail::format_palette_map(cp) ==
        "main->rgb(1,2,3)\nnewfn->" + cp["newfn"] + "\nx->rgb(9,9,9)\n");
}

TEST_CASE("svg: narrow frames become one aggregate frame instead of vanishing") {
  builder b;
  b.add("main;big", 100000);
  for (int i = 0; i < 50; ++i) b.add("main;small" + std::to_string(i), 1);
  const std::string svg = selfprof::detail::write_svg(b.p, svg_options{});  // 0.1 px of 1180 px ~ 8.5 samples
  auto fs = parse_frames(svg);
  const parsed_frame* agg = find_frame(fs, "[50 elided frames] (50 samples");
  REQUIRE(agg);
  CHECK(agg->attr("fg:x") == "100000");
  CHECK(agg->attr("fg:w") == "50");
  CHECK(find_frame(fs, "small1 (") == nullptr);

  svg_options pct;
  REQUIRE(selfprof::parse_min_width("0.0009%", pct).is_ok());
  CHECK(pct.min_width_percent);
  auto all = parse_frames(selfprof::detail::write_svg(b.p, pct));  // 0.0009% of 100050 < 1 sample: all shown
  CHECK(all.size() == 53);
  CHECK_FALSE(selfprof::parse_min_width("1e3", pct).is_ok());
  CHECK_FALSE(selfprof::parse_min_width("", pct).is_ok());
}

TEST_CASE("svg: icicle, reverse and flame chart layouts") {
  svg_options o;
  o.inverted = true;
  const std::string ice = selfprof::detail::write_svg(simple_profile(), o);
  CHECK(ice.find(">Icicle Graph</text>") != std::string::npos);
  auto fi = parse_frames(ice);
  CHECK(fi[0].attr("y") == "36");  // root at the top: ypad1 = 3 * fontsize
  CHECK(find_frame(fi, "b (")->attr("y") == "84");

  svg_options r;
  r.reverse = true;
  auto fr = parse_frames(selfprof::detail::write_svg(simple_profile(), r));
  // Leaf-first merge (b;a;main, a;main, c;main): depth 1 (y 69) holds the leaves, main ends each column.
  CHECK(find_frame(fr, "b (70 samples")->attr("y") == "69");
  CHECK(find_frame(fr, "a (20 samples")->attr("y") == "69");
  CHECK(find_frame(fr, "main (70 samples")->attr("y") == "37");
  CHECK(find_frame(fr, "main (10 samples")->attr("y") == "53");  // main;c reversed: c;main

  builder t;
  t.add("A;x", 1).add("B", 1).add("A;y", 1);
  svg_options fc;
  fc.flamechart = true;
  const std::string chart = selfprof::detail::write_svg(t.p, fc);
  CHECK(chart.find(">Flame Chart</text>") != std::string::npos);
  auto ff = parse_frames(chart);
  CHECK(ff.size() == 6);  // all, A, B, A, x, y: the two A are not adjacent, so they stay apart
  CHECK(count_of(chart, "<title>A (1 samples") == 2);
  CHECK(find_frame(ff, "B (")->attr("fg:x") == "1");
}

TEST_CASE("svg: options reach the document") {
  svg_options o;
  o.width = 800;
  o.fluid = false;
  o.frame_height = 20;
  o.font = "monospace";
  o.subtitle = "sub";
  o.search_color = "#00ff00";
  o.bg_colors = "#123456";
  o.truncate_text_left = true;
  const std::string svg = selfprof::detail::write_svg(simple_profile(), o);
  CHECK(svg.find("width=\"800\"") != std::string::npos);
  CHECK(svg.find("var fluiddrawing = false;") != std::string::npos);
  CHECK(svg.find("var frameheight = 20;") != std::string::npos);
  CHECK(svg.find("var truncate_text_right = false;") != std::string::npos);
  CHECK(svg.find("font-family:monospace;") != std::string::npos);
  CHECK(svg.find("var searchcolor = \"#00ff00\";") != std::string::npos);
  CHECK(svg.find("stop-color=\"#123456\"") != std::string::npos);
  CHECK(svg.find("id=\"subtitle\"") != std::string::npos);
  CHECK(parse_frames(svg)[0].rect.find("height=\"19\"") != std::string::npos);

  svg_options nojs;
  nojs.javascript = false;
  const std::string s2 = selfprof::detail::write_svg(simple_profile(), nojs);
  CHECK(s2.find("<script") == std::string::npos);
  CHECK(s2.find("onload") == std::string::npos);
}

TEST_CASE("svg: footer shows the sampling metadata") {
  profile p = simple_profile();
  p.info.start_unix_ns = 1700000000ULL * 1000000000ULL;
  const std::string svg = selfprof::detail::write_svg(p, svg_options{});
  CHECK(
      svg.find(">cpu profile | 99 Hz | 1.50 s | 100 samples | 3 dropped | source: perf | started 2023-11-14 "
               "22:13:20 UTC | selfprof " SELFPROF_VERSION_STRING "</text>") != std::string::npos);
  svg_options off;
  off.footer = false;
  CHECK(selfprof::detail::write_svg(p, off).find("id=\"footer\"") == std::string::npos);
}

TEST_CASE("svg: an empty profile gives an error picture") {
  const std::string svg = selfprof::detail::write_svg(profile{}, svg_options{});
  CHECK(svg.find("ERROR: No stack counts found") != std::string::npos);
  std::string why;
  CHECK_MESSAGE(well_formed(svg, why), why);
}

TEST_CASE("svg: bad frame indices and zero counts do not crash") {
  builder b;
  b.add("main;a", 0);
  b.p.stacks.push_back({{0, 999999}, 5, 0, false});
  auto fs = parse_frames(selfprof::detail::write_svg(b.p, svg_options{}));
  CHECK(fs.size() == 2);
}

TEST_CASE("svg: thousands of unique stacks stay well formed and consistent") {
  builder b;
  std::uint64_t total = 0;
  for (int i = 0; i < 5000; ++i) {
    std::string st = "main;mod" + std::to_string(i % 7) + "::run<T&>;f" + std::to_string(i % 97) + ";leaf\"" +
                     std::to_string(i);
    std::uint64_t c = 1 + static_cast<std::uint64_t>((i * 7919) % 50);
    b.add(st, c);
    total += c;
  }
  svg_options o;
  o.min_width = 0;
  const std::string svg = selfprof::detail::write_svg(b.p, o);
  std::string why;
  REQUIRE_MESSAGE(well_formed(svg, why), why);
  auto fs = parse_frames(svg);
  CHECK(fs.size() == 1 + 1 + 7 + 679 + 5000);  // all, main, mod*, 679 distinct (mod, f) pairs, leaves
  CHECK(fs[0].attr("fg:w") == std::to_string(total));
  // Every child lies inside the root and widths are positive.
  for (const auto& f : fs) {
    auto x = std::stoull(f.attr("fg:x")), w = std::stoull(f.attr("fg:w"));
    CHECK(w > 0);
    CHECK(x + w <= total);
  }
}

TEST_CASE("palette: flamegraph.pl formulas") {
  using namespace selfprof::detail;
  CHECK(perl_namehash("a") == doctest::Approx(1 - (7.0 / 9) / 2));
  CHECK(perl_namehash("mod`a") == doctest::Approx(perl_namehash("a")));
  hash_values v{0.5, 0.5, 0.5};
  CHECK(rgb_string(hue_color(selfprof::palette::hot, v)) == "rgb(230,115,27)");
  CHECK(rgb_string(hue_color(selfprof::palette::io, v)) == "rgb(110,110,217)");
  CHECK(rgb_string(hue_color(selfprof::palette::orange, v)) == "rgb(222,122,0)");
  CHECK(resolve_hue(selfprof::palette::java, "java/util/Map.get") == selfprof::palette::green);
  CHECK(resolve_hue(selfprof::palette::java, "Ljava/lang/Thread.run") == selfprof::palette::green);
  CHECK(resolve_hue(selfprof::palette::java, "std::vector::push") == selfprof::palette::yellow);
  CHECK(resolve_hue(selfprof::palette::java, "start_thread") == selfprof::palette::red);
  CHECK(resolve_hue(selfprof::palette::js, "foo_[j]") == selfprof::palette::aqua);
  CHECK(resolve_hue(selfprof::palette::js, "/app/x.js:10_[j]") == selfprof::palette::green);
  CHECK(resolve_hue(selfprof::palette::perl, "main::run") == selfprof::palette::yellow);
  CHECK(resolve_hue(selfprof::palette::chain, "waker_[w]") == selfprof::palette::aqua);
  CHECK(resolve_hue(selfprof::palette::chain, "blocked") == selfprof::palette::blue);
  CHECK(resolve_hue(selfprof::palette::rust, "core::ptr::drop") == selfprof::palette::orange);
  CHECK(resolve_hue(selfprof::palette::python, "<built-in method>") == selfprof::palette::yellow);
  CHECK(rgb_string(diff_color(10, 10, false)) == "rgb(255,0,0)");
  CHECK(rgb_string(diff_color(-5, 10, false)) == "rgb(105,105,255)");
  CHECK(rgb_string(diff_color(-5, 10, true)) == "rgb(255,105,105)");
  CHECK(rgb_string(diff_color(0, 10, false)) == "rgb(255,255,255)");
  selfprof::palette p = selfprof::palette::hot;
  CHECK(parse_palette("chain", p));
  CHECK(p == selfprof::palette::chain);
  CHECK_FALSE(parse_palette("nope", p));
}

TEST_CASE("svg: chain palette marks waker frames after --") {
  builder b;
  b.add("blocked;schedule;--;waker;wake_up", 10);
  svg_options o;
  o.colors = selfprof::palette::chain;
  auto fs = parse_frames(selfprof::detail::write_svg(b.p, o));
  int r, g, bl;
  REQUIRE(std::sscanf(find_frame(fs, "wake_up (")->attr("fill").c_str(), "rgb(%d,%d,%d)", &r, &g, &bl) == 3);
  CHECK(g == bl);  // aqua waker
  REQUIRE(std::sscanf(find_frame(fs, "schedule (")->attr("fill").c_str(), "rgb(%d,%d,%d)", &r, &g, &bl) == 3);
  CHECK(r == g);  // blue blocked
  CHECK(bl >= 205);
}

TEST_CASE("svg text helpers") {
  using namespace selfprof::detail;
  CHECK(with_commas(0) == "0");
  CHECK(with_commas(999) == "999");
  CHECK(with_commas(1000) == "1,000");
  CHECK(with_commas(1234567) == "1,234,567");
  CHECK(truncate_label("abcdefghij", 6, false) == "abcd..");
  CHECK(truncate_label("abcdefghij", 6, true) == "..ghij");
  CHECK(truncate_label("abcdefghij", 2, false).empty());
  CHECK(truncate_label("\xC3\xA9\xC3\xA9\xC3\xA9\xC3\xA9\xC3\xA9", 4, false) == "\xC3\xA9\xC3\xA9..");
  CHECK(sanitize_utf8("\xED\xA0\x80x") ==
        "\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBDx");  // surrogate: each byte replaced
  CHECK(js_string("a\"</script>") == "\"a\\u0022\\u003c/script\\u003e\"");
}

TEST_CASE("svg golden files") {
  output_fixtures::check_golden("svg_basic.svg",
                                selfprof::detail::write_svg(simple_profile(), svg_options{}));
  svg_options o;
  o.javascript = false;
  o.inverted = true;
  o.colors = selfprof::palette::java;
  o.hash = selfprof::color_hash::perl_hash;
  o.title = "Icicle & <friends>";
  o.fluid = false;
  o.width = 600;
  builder b;
  b.add("java/lang/Thread.run;Foo::bar;do_sys_open_[k]", 30)
      .add("java/lang/Thread.run;Interp_[j]", 12)
      .add("-;--", 1);
  output_fixtures::check_golden("svg_icicle_java_nojs.svg", selfprof::detail::write_svg(b.p, o));
}
