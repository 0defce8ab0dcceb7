// Command-line option parsing for the selfprof tool, in the style of Perl's Getopt::Long that the
// FlameGraph scripts use: `--name value`, `--name=value`, `-name`, unique prefixes, short letters.
// Context: setup only (the command-line tool).
#pragma once

#include <cstdlib>
#include <string>
#include <string_view>
#include <vector>

#include "selfprof/status.hpp"

namespace selfprof_cli {

struct option_spec {
  const char* name;  // long name without dashes ("title")
  char short_name;   // 0 when none
  bool takes_value;
};

struct parsed_option {
  std::string name;  // the spec's long name
  std::string value;
};

struct parsed_args {
  std::vector<parsed_option> options;  // in command-line order
  std::vector<std::string> positional;
  std::vector<std::string> rest;  // everything after `--` when stop_at_dashdash
  bool saw_dashdash = false;

  bool has(std::string_view name) const {
    for (const auto& o : options)
      if (o.name == name) return true;
    return false;
  }
  // The last value given for `name`, or `fallback`.
  std::string get(std::string_view name, const std::string& fallback = std::string()) const {
    for (auto it = options.rbegin(); it != options.rend(); ++it)
      if (it->name == name) return it->value;
    return fallback;
  }
};

// Parses argv[first..argc). Options may be mixed with positional arguments (except after `--`); a
// lone `-` is positional (stdin). With `stop_at_first_positional`, the first positional argument and
// all that follow are positional (for `record cmd args`).
inline selfprof::status parse_args(int argc, char** argv, int first, const std::vector<option_spec>& specs,
                                   parsed_args& out, bool stop_at_first_positional = false) {
  for (int i = first; i < argc; ++i) {
    std::string_view a = argv[i];
    if (a == "--") {
      out.saw_dashdash = true;
      for (++i; i < argc; ++i) out.rest.emplace_back(argv[i]);
      break;
    }
    if (a.size() < 2 || a[0] != '-') {
      out.positional.emplace_back(a);
      if (stop_at_first_positional) {
        for (++i; i < argc; ++i) out.positional.emplace_back(argv[i]);
        break;
      }
      continue;
    }
    std::string_view body = a.substr(a[1] == '-' ? 2 : 1);
    std::string_view value;
    bool has_value = false;
    const std::size_t eq = body.find('=');
    if (eq != std::string_view::npos) {
      value = body.substr(eq + 1);
      body = body.substr(0, eq);
      has_value = true;
    }
    const option_spec* hit = nullptr;
    // A single dash with one letter is a short option; otherwise a long name or a unique prefix.
    if (a[1] != '-' && body.size() == 1) {
      for (const auto& s : specs)
        if (s.short_name == body[0]) hit = &s;
    }
    if (!hit) {
      std::vector<const option_spec*> prefix;
      for (const auto& s : specs) {
        std::string_view n = s.name;
        if (n == body) {
          hit = &s;
          break;
        }
        if (!body.empty() && n.substr(0, body.size()) == body) prefix.push_back(&s);
      }
      if (!hit && prefix.size() == 1) hit = prefix[0];
      if (!hit && prefix.size() > 1) {
        std::string names;
        for (const auto* s : prefix) names += std::string(names.empty() ? "" : ", ") + "--" + s->name;
        return selfprof::status::error("option '" + std::string(a) + "' is ambiguous (" + names + ")");
      }
    }
    if (!hit) return selfprof::status::error("unknown option '" + std::string(a) + "' (see --help)");
    parsed_option po;
    po.name = hit->name;
    if (hit->takes_value) {
      if (!has_value) {
        if (i + 1 >= argc)
          return selfprof::status::error("option --" + std::string(hit->name) + " needs a value");
        value = argv[++i];
      }
      po.value = std::string(value);
    } else if (has_value) {
      return selfprof::status::error("option --" + std::string(hit->name) + " takes no value");
    }
    out.options.push_back(std::move(po));
  }
  return selfprof::status::ok();
}

// Parses a whole non-negative number with bounds; false when `text` is not one.
inline bool parse_uint_arg(const std::string& text, unsigned long long lo, unsigned long long hi,
                           unsigned long long& v) {
  if (text.empty() || text.find_first_not_of("0123456789") != std::string::npos || text.size() > 18)
    return false;
  v = std::strtoull(text.c_str(), nullptr, 10);
  return v >= lo && v <= hi;
}

inline bool parse_double_arg(const std::string& text, double lo, double hi, double& v) {
  if (text.empty()) return false;
  char* end = nullptr;
  v = std::strtod(text.c_str(), &end);
  return end && *end == '\0' && v >= lo && v <= hi;
}

}  // namespace selfprof_cli
