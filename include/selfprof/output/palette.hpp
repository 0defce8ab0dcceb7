// Flame-graph colours: flamegraph.pl's hue formulas and multi palettes, stable name hashes, palette.map
// files.
// Context: any thread (pure functions; used by the SVG writers on the dump path).
#pragma once

#include <cstdint>
#include <cstdio>
#include <map>
#include <string>
#include <string_view>

namespace selfprof {

// Palettes of flamegraph.pl (`--colors`) plus inferno's python and rust.
enum class palette : std::uint8_t {
  hot,
  mem,
  io,
  red,
  green,
  blue,
  aqua,
  yellow,
  purple,
  orange,  // single hues
  java,
  js,
  perl,
  python,
  rust,
  wakeup,
  chain,  // pick a hue per frame
};

// How the per-name values v1..v3 in [0,1) are derived.
enum class color_hash : std::uint8_t {
  stable,     // FNV-1a of the name (default): the same name has the same colour in every graph
  perl_hash,  // flamegraph.pl --hash: weighted hash of the first characters (similar names, similar colours)
};

// Name -> "rgb(r,g,b)" mapping, the content of flamegraph.pl's palette.map (`--cp`).
using palette_map = std::map<std::string, std::string>;

namespace detail {

struct rgb {
  int r = 0, g = 0, b = 0;
};

inline std::string rgb_string(rgb c) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "rgb(%d,%d,%d)", c.r, c.g, c.b);
  return buf;
}

// Parses a palette name; false (and `out` untouched) when unknown.
inline bool parse_palette(std::string_view name, palette& out) {
  static const struct {
    const char* name;
    palette p;
  } table[] = {
      {"hot", palette::hot},       {"mem", palette::mem},       {"io", palette::io},
      {"red", palette::red},       {"green", palette::green},   {"blue", palette::blue},
      {"aqua", palette::aqua},     {"yellow", palette::yellow}, {"purple", palette::purple},
      {"orange", palette::orange}, {"java", palette::java},     {"js", palette::js},
      {"perl", palette::perl},     {"python", palette::python}, {"rust", palette::rust},
      {"wakeup", palette::wakeup}, {"chain", palette::chain},
  };
  for (const auto& e : table)
    if (name == e.name) {
      out = e.p;
      return true;
    }
  return false;
}

// flamegraph.pl's namehash: the module part up to the first backtick is dropped, then up to three
// characters are weighted 1, 0.7, 0.49 (mod 10, 11, 12). Works on bytes, as Perl does for ASCII.
inline double perl_namehash(std::string_view name) {
  auto tick = name.find('`');
  if (tick != std::string_view::npos && tick >= 1) name.remove_prefix(tick + 1);
  double vector = 0, weight = 1, max = 1;
  int mod = 10;
  for (unsigned char c : name) {
    int i = c % mod;
    vector += (static_cast<double>(i) / (mod - 1)) * weight;
    ++mod;
    max += weight;
    weight *= 0.70;
    if (mod > 12) break;
  }
  return 1 - vector / max;
}

inline std::uint64_t fnv1a64(std::string_view s) {
  std::uint64_t h = 0xcbf29ce484222325ULL;
  for (unsigned char c : s) {
    h ^= c;
    h *= 0x100000001b3ULL;
  }
  return h;
}

struct hash_values {
  double v1 = 0, v2 = 0, v3 = 0;
};

inline double unit_from_bits(std::uint64_t h) {
  return static_cast<double>(h >> 11) / 9007199254740992.0;  // top 53 bits / 2^53: [0,1)
}

inline hash_values name_values(std::string_view name, color_hash how) {
  hash_values v;
  if (how == color_hash::perl_hash) {
    v.v1 = perl_namehash(name);
    std::string rev(name.rbegin(), name.rend());
    v.v2 = v.v3 = perl_namehash(rev);
    return v;
  }
  // One value for all three, as flamegraph.pl's default (seeded rand) gives: the classic red-to-yellow look.
  v.v1 = v.v2 = v.v3 = unit_from_bits(fnv1a64(name) * 0x9e3779b97f4a7c15ULL);
  return v;
}

inline bool ends_with(std::string_view s, std::string_view suffix) {
  return s.size() >= suffix.size() && s.substr(s.size() - suffix.size()) == suffix;
}
inline bool contains(std::string_view s, std::string_view part) {
  return s.find(part) != std::string_view::npos;
}

// java palette rule `^L?(java|javax|jdk|net|org|com|io|sun)/`.
inline bool java_package_prefix(std::string_view n) {
  if (!n.empty() && n[0] == 'L') {
    std::string_view rest = n.substr(1);
    if (java_package_prefix(rest)) return true;
  }
  static const char* const pkgs[] = {"java/", "javax/", "jdk/", "net/", "org/", "com/", "io/", "sun/"};
  for (const char* p : pkgs)
    if (n.substr(0, std::char_traits<char>::length(p)) == p) return true;
  return false;
}

// The hue a multi palette gives a (still annotated) name, as flamegraph.pl and inferno decide it.
inline palette resolve_hue(palette p, std::string_view n) {
  // Wall profiles: where a thread waited is drawn in the io palette's blue amid the hot on-CPU frames.
  if (p == palette::hot && (n.rfind("[blocked", 0) == 0 || n == "[off-cpu]")) return palette::io;
  switch (p) {
    case palette::java:
      if (ends_with(n, "_[j]")) return palette::green;
      if (ends_with(n, "_[i]")) return palette::aqua;
      if (java_package_prefix(n)) return palette::green;
      if (contains(n, ":::")) return palette::green;
      if (contains(n, "::")) return palette::yellow;
      if (ends_with(n, "_[k]")) return palette::orange;
      return palette::red;
    case palette::perl:
      if (contains(n, "::")) return palette::yellow;
      if (contains(n, "Perl") || contains(n, ".pl")) return palette::green;
      if (ends_with(n, "_[k]")) return palette::orange;
      return palette::red;
    case palette::js: {
      if (ends_with(n, "_[j]")) return contains(n, "/") ? palette::green : palette::aqua;
      if (contains(n, "::")) return palette::yellow;
      auto slash = n.find('/');
      if (slash != std::string_view::npos && n.find(".js", slash + 1) != std::string_view::npos)
        return palette::green;
      if (contains(n, ":")) return palette::aqua;
      if (n == " ") return palette::green;
      if (contains(n, "_[k]")) return palette::orange;
      return palette::red;
    }
    case palette::python: {
      if (ends_with(n, "_[k]")) return palette::orange;
      if (contains(n, "site-packages")) return palette::aqua;
      if (contains(n, "<built-in") || contains(n, "<method") || contains(n, "<frozen"))
        return palette::yellow;
      auto py = n.find("python");
      if (py != std::string_view::npos && py + 6 < n.size() && n[py + 6] >= '0' && n[py + 6] <= '9')
        return palette::yellow;
      return palette::red;
    }
    case palette::rust: {
      if (ends_with(n, "_[k]")) return palette::orange;
      std::string_view s = n;
      if (!s.empty() && s[0] == '<') s.remove_prefix(1);
      if (s.rfind("core::", 0) == 0 || s.rfind("std::", 0) == 0 || s.rfind("alloc::", 0) == 0)
        return palette::orange;
      if (contains(n, "::")) return palette::aqua;
      return palette::yellow;
    }
    case palette::wakeup:
      return palette::aqua;
    case palette::chain:
      return contains(n, "_[w]") ? palette::aqua : palette::blue;
    default:
      return p;
  }
}

// flamegraph.pl's hue formulas (each term truncated to an integer).
inline rgb hue_color(palette hue, const hash_values& v) {
  auto t = [](double k, double x) { return static_cast<int>(k * x); };
  switch (hue) {
    case palette::hot:
      return {205 + t(50, v.v3), t(230, v.v1), t(55, v.v2)};
    case palette::mem:
      return {0, 190 + t(50, v.v2), t(210, v.v1)};
    case palette::io: {
      int r = 80 + t(60, v.v1);
      return {r, r, 190 + t(55, v.v2)};
    }
    case palette::red: {
      int x = 50 + t(80, v.v1);
      return {200 + t(55, v.v1), x, x};
    }
    case palette::green: {
      int x = 50 + t(60, v.v1);
      return {x, 200 + t(55, v.v1), x};
    }
    case palette::blue: {
      int x = 80 + t(60, v.v1);
      return {x, x, 205 + t(50, v.v1)};
    }
    case palette::yellow: {
      int x = 175 + t(55, v.v1);
      return {x, x, 50 + t(20, v.v1)};
    }
    case palette::purple: {
      int x = 190 + t(65, v.v1);
      return {x, 80 + t(60, v.v1), x};
    }
    case palette::aqua:
      return {50 + t(60, v.v1), 165 + t(55, v.v1), 165 + t(55, v.v1)};
    case palette::orange:
      return {190 + t(65, v.v1), 90 + t(65, v.v1), 0};
    default:
      return {0, 0, 0};
  }
}

// Colour of one frame. `annotated_name` keeps its `_[k]`-style suffix: palettes look at it.
// `-` and `--` separator frames are grey, as in flamegraph.pl.
inline rgb frame_color(palette p, color_hash how, std::string_view annotated_name) {
  if (annotated_name == "--") return {160, 160, 160};
  if (annotated_name == "-") return {200, 200, 200};
  return hue_color(resolve_hue(p, annotated_name), name_values(annotated_name, how));
}

// Differential colour (flamegraph.pl's color_scale): red grows, blue shrinks, white unchanged.
inline rgb diff_color(std::int64_t delta, std::int64_t max_delta, bool negate) {
  if (negate) delta = -delta;
  if (max_delta < 1) max_delta = 1;
  rgb c{255, 255, 255};
  if (delta > 0) {
    if (delta > max_delta) delta = max_delta;
    c.g = c.b = static_cast<int>(210 * (max_delta - delta) / max_delta);
  } else if (delta < 0) {
    if (-delta > max_delta) delta = -max_delta;
    c.r = c.g = static_cast<int>(210 * (max_delta + delta) / max_delta);
  }
  return c;
}

// Background gradient stops (#background) for `--bgcolors` or the palette's default.
struct background {
  std::string top, bottom;
};

// `name` is yellow, blue, green, grey, #rrggbb (flat), or empty for the palette's default.
// Returns false for anything else (the default is then used).
inline bool resolve_background(std::string_view name, palette p, background& out) {
  if (name.empty()) {
    if (p == palette::mem)
      name = "green";
    else if (p == palette::io || p == palette::wakeup || p == palette::chain)
      name = "blue";
    else if (p == palette::red || p == palette::green || p == palette::blue || p == palette::aqua ||
             p == palette::yellow || p == palette::purple || p == palette::orange)
      name = "grey";
    else
      name = "yellow";
  }
  if (name == "yellow")
    out = {"#eeeeee", "#eeeeb0"};
  else if (name == "blue")
    out = {"#eeeeee", "#e0e0ff"};
  else if (name == "green")
    out = {"#eef2ee", "#e0ffe0"};
  else if (name == "grey")
    out = {"#f8f8f8", "#e8e8e8"};
  else if (name.size() == 7 && name[0] == '#' &&
           name.find_first_not_of("0123456789abcdefABCDEF", 1) == std::string_view::npos)
    out = {std::string(name), std::string(name)};
  else {
    resolve_background("", p, out);
    return false;
  }
  return true;
}

inline bool is_hex_color(std::string_view s) {
  return s.size() == 7 && s[0] == '#' &&
         s.find_first_not_of("0123456789abcdefABCDEF", 1) == std::string_view::npos;
}

// Parses palette.map text (`name->rgb(r,g,b)` per line). Lines without `->` are skipped.
inline palette_map parse_palette_map(std::string_view text) {
  palette_map m;
  while (!text.empty()) {
    auto nl = text.find('\n');
    std::string_view line = text.substr(0, nl);
    text = nl == std::string_view::npos ? std::string_view() : text.substr(nl + 1);
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    auto arrow = line.find("->");
    if (arrow == std::string_view::npos) continue;
    m[std::string(line.substr(0, arrow))] = std::string(line.substr(arrow + 2));
  }
  return m;
}

// palette.map text, sorted by name (flamegraph.pl writes it the same way).
inline std::string format_palette_map(const palette_map& m) {
  std::string out;
  for (const auto& kv : m) {
    out += kv.first;
    out += "->";
    out += kv.second;
    out += '\n';
  }
  return out;
}

}  // namespace detail
}  // namespace selfprof
