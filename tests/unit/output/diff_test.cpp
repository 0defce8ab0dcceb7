// Tests of the differential writers: difffolded's `stack c1 c2` text (-n, -s) and the red/blue SVG.
#include <doctest/doctest.h>

#include <selfprof/output/diff.hpp>

#include <string>

#include "fixtures.hpp"

namespace {

using selfprof::diff_options;
using selfprof::profile;
using selfprof::svg_options;

profile folded(std::initializer_list<std::pair<const char*, std::uint64_t>> lines) {
  profile p;
  for (const auto& l : lines) {
    selfprof::stack s;
    std::string st = l.first;
    std::size_t start = 0;
    while (start <= st.size()) {
      auto semi = st.find(';', start);
      if (semi == std::string::npos) semi = st.size();
      selfprof::frame f;
      f.name = st.substr(start, semi - start);
      if (f.name.size() > 4 && f.name.compare(f.name.size() - 4, 4, "@krn") == 0) {
        f.name.resize(f.name.size() - 4);
        f.kind = selfprof::frame_kind::kernel;
      }
      p.frames.push_back(f);
      s.frames.push_back(static_cast<std::uint32_t>(p.frames.size() - 1));
      start = semi + 1;
    }
    s.count = l.second;
    p.stacks.push_back(s);
  }
  return p;
}

std::string title_of(const std::string& svg, const std::string& prefix) {
  auto p = svg.find("<title>" + prefix);
  if (p == std::string::npos) return "";
  p += 7;
  return svg.substr(p, svg.find("</title>", p) - p);
}

std::string fill_of(const std::string& svg, const std::string& prefix) {
  auto p = svg.find("<title>" + prefix);
  if (p == std::string::npos) return "";
  p = svg.find(" fill=\"", p) + 7;
  return svg.substr(p, svg.find('"', p) - p);
}

std::string fgw_of(const std::string& svg, const std::string& prefix) {
  auto p = svg.find("<title>" + prefix);
  if (p == std::string::npos) return "";
  p = svg.find(" fg:w=\"", p) + 7;
  return svg.substr(p, svg.find('"', p) - p);
}

const profile before_p = folded({{"main;a;b", 10}, {"main;c", 5}, {"main;a;b", 2}});
const profile after_p = folded({{"main;a;b", 20}, {"main;d", 1}, {"main;a", 3}});

}  // namespace

TEST_CASE("diff folded: every stack of either profile, sorted, 0 when absent") {
  CHECK(selfprof::detail::write_diff_folded(before_p, after_p, diff_options{}) ==
        "main;a 0 3\nmain;a;b 12 20\nmain;c 5 0\nmain;d 0 1\n");
}

TEST_CASE("diff folded: -n scales the baseline by total2/total1 with truncation") {
  diff_options o;
  o.normalize = true;
  // total1 = 17, total2 = 24: int(12*24/17) = 16, int(5*24/17) = 7
  CHECK(selfprof::detail::write_diff_folded(before_p, after_p, o) ==
        "main;a 0 3\nmain;a;b 16 20\nmain;c 7 0\nmain;d 0 1\n");
  // equal totals: untouched
  CHECK(selfprof::detail::write_diff_folded(before_p, before_p, o) == "main;a;b 12 12\nmain;c 5 5\n");
}

TEST_CASE("diff folded: -s merges stacks that differ only in hex numbers; names are folded safely") {
  profile b = folded({{"main;[libx.so+0x1a2b]", 4}, {"main;f;0xDEADbeef", 1}});
  profile a = folded({{"main;[libx.so+0x99]", 6}});
  diff_options o;
  o.strip_hex = true;
  CHECK(selfprof::detail::write_diff_folded(b, a, o) == "main;[libx.so+0x...] 4 6\nmain;f;0x... 1 0\n");
  CHECK(selfprof::detail::write_diff_folded(b, a, diff_options{}) ==
        "main;[libx.so+0x1a2b] 4 0\nmain;[libx.so+0x99] 0 6\nmain;f;0xDEADbeef 1 0\n");
  CHECK(selfprof::detail::strip_hex_numbers("0x 0xg 10x1f") == "0x 0xg 10x...");

  profile odd = folded({{"main;k@krn", 1}});
  odd.frames[0].name = "we;ird\nname";
  CHECK(selfprof::detail::write_diff_folded(odd, profile{}, diff_options{}) == "we:irdname;k_[k] 1 0\n");
}

TEST_CASE("diff svg: red grows, blue shrinks, by self change, with before and after counts") {
  const std::string svg = selfprof::detail::write_diff_svg(before_p, after_p, svg_options{}, diff_options{});
  // deltas: b +8, a +3 (self), c -5, d +1; max 8
  CHECK(fill_of(svg, "b (") == "rgb(255,0,0)");
  CHECK(fill_of(svg, "c (") == "rgb(78,78,255)");  // int(210 * 3 / 8) = 78
  CHECK(fill_of(svg, "main (") == "rgb(255,255,255)");
  CHECK(title_of(svg, "b (") ==
        "b (20 samples, 83.33%; +33.33%)\nbefore 12 (70.59%), after 20 (83.33%)\n"
        "self before 12, after 20");
  CHECK(title_of(svg, "c (") ==
        "c (0 samples, 0.00%; -20.83%)\nbefore 5 (29.41%), after 0 (0.00%)\n"
        "self before 5, after 0");
  CHECK(fgw_of(svg, "c (") == "5");  // baseline-only stack stays visible
  CHECK(svg.find(">Differential Flame Graph</text>") != std::string::npos);
  CHECK(svg.find("total_samples=\"29\"") !=
        std::string::npos);  // 20 + 3 + 5 + 1: larger of the two per stack
}

TEST_CASE("diff svg: negate, inclusive colouring and widths from the new profile") {
  diff_options o;
  o.negate = true;
  std::string svg = selfprof::detail::write_diff_svg(before_p, after_p, svg_options{}, o);
  CHECK(fill_of(svg, "b (") == "rgb(0,0,255)");
  CHECK(fill_of(svg, "c (") == "rgb(255,78,78)");
  CHECK(title_of(svg, "b (").rfind("b (20 samples, 83.33%; -33.33%)", 0) == 0);

  diff_options inc;
  inc.inclusive = true;
  svg = selfprof::detail::write_diff_svg(before_p, after_p, svg_options{}, inc);
  // inclusive deltas: main +7, a +11 (max), b +8, c -5
  CHECK(fill_of(svg, "a (") == "rgb(255,0,0)");
  CHECK(fill_of(svg, "main (") == "rgb(255,76,76)");  // int(210 * 4 / 11) = 76

  diff_options after_only;
  after_only.widths = selfprof::diff_width::after;
  svg = selfprof::detail::write_diff_svg(before_p, after_p, svg_options{}, after_only);
  CHECK(title_of(svg, "c (").empty());  // zero width in the new profile: not drawn, as flamegraph.pl
  CHECK(svg.find("total_samples=\"24\"") != std::string::npos);
}

TEST_CASE("diff svg: empty inputs give the error picture") {
  const std::string svg =
      selfprof::detail::write_diff_svg(profile{}, profile{}, svg_options{}, diff_options{});
  CHECK(svg.find("ERROR: No stack counts found") != std::string::npos);
}

TEST_CASE("diff golden files") {
  diff_options o;
  o.normalize = true;
  output_fixtures::check_golden("diff_basic.folded",
                                selfprof::detail::write_diff_folded(before_p, after_p, o));
  svg_options so;
  so.javascript = false;
  so.fluid = false;
  so.width = 600;
  output_fixtures::check_golden("diff_basic.svg",
                                selfprof::detail::write_diff_svg(before_p, after_p, so, diff_options{}));
}
