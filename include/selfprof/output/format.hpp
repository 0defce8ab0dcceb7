// Output formats by file extension and the one dispatch from a profile to the bytes of any format, plus
// the render-and-write-atomically step a dump or the CLI performs for one path.
// Context: any thread except the signal handler (the collector thread on a dump, or the CLI).
//
// Extensions (matched case-insensitively at the end of the path's last component):
//   .folded .collapsed → folded stacks    .txt → top list    .pb.gz .pprof → gzipped pprof
//   .svg → flame graph (detail::write_svg of output/svg.hpp, written by the SVG part)
// Anything else is an error that names the path and lists the extensions.
#pragma once

#include <string>
#include <utility>

#include "selfprof/output/folded.hpp"
#include "selfprof/output/pprof.hpp"
#include "selfprof/output/sink.hpp"
#include "selfprof/output/svg.hpp"
#include "selfprof/output/top.hpp"
#include "selfprof/profile.hpp"
#include "selfprof/status.hpp"

namespace selfprof {

enum class output_format { folded, top, pprof, svg };

// Options of every writer, for render() to pick from.
struct output_options {
  folded_options folded;
  top_options top;
  pprof_options pprof;
  svg_options svg;
};

struct format_lookup {
  output_format format = output_format::folded;
  status result;  // an error naming the path when the extension is unknown
};

inline const char* format_name(output_format f) {
  switch (f) {
    case output_format::folded:
      return "folded";
    case output_format::top:
      return "top";
    case output_format::pprof:
      return "pprof";
    case output_format::svg:
      return "svg";
  }
  return "?";
}

namespace detail {
inline bool ends_with_ci(const std::string& s, const char* suffix) {
  const std::size_t n = std::char_traits<char>::length(suffix);
  if (s.size() < n) return false;
  for (std::size_t i = 0; i < n; ++i) {
    char c = s[s.size() - n + i];
    if (c >= 'A' && c <= 'Z') c = static_cast<char>(c - 'A' + 'a');
    if (c != suffix[i]) return false;
  }
  return true;
}
}  // namespace detail

// The format a path asks for by its extension.
inline format_lookup format_for_path(const std::string& path) {
  format_lookup r;
  const auto slash = path.find_last_of('/');
  const std::string name = slash == std::string::npos ? path : path.substr(slash + 1);
  struct entry {
    const char* ext;
    output_format format;
  };
  static const entry table[] = {{".folded", output_format::folded}, {".collapsed", output_format::folded},
                                {".txt", output_format::top},       {".pb.gz", output_format::pprof},
                                {".pprof", output_format::pprof},   {".svg", output_format::svg}};
  for (const auto& e : table) {
    if (name.size() > std::char_traits<char>::length(e.ext) && detail::ends_with_ci(name, e.ext)) {
      r.format = e.format;
      return r;
    }
  }
  std::string message = "selfprof: cannot write ";
  message += path;
  message += ": unknown output format (use .folded, .collapsed, .txt, .pb.gz, .pprof or .svg)";
  r.result = status::error(std::move(message));
  return r;
}

// The bytes of a profile in a format.
inline std::string render(const profile& p, output_format f, const output_options& opts = {}) {
  switch (f) {
    case output_format::folded:
      return write_folded(p, opts.folded);
    case output_format::top:
      return write_top(p, opts.top);
    case output_format::pprof:
      return write_pprof(p, opts.pprof);
    case output_format::svg:
      return detail::write_svg(p, opts.svg);
  }
  return {};
}

// Renders `p` in the format of `path`'s extension and writes it atomically (see sink.hpp). On failure
// nothing at `path` changes and the message names the path and the reason.
inline status write_profile_file(const profile& p, const std::string& path, const output_options& opts = {},
                                 const sink_options& sink = {}) {
  const format_lookup lookup = format_for_path(path);
  if (!lookup.result) return lookup.result;
  return detail::write_file_atomic(path, render(p, lookup.format, opts), sink);
}

}  // namespace selfprof
