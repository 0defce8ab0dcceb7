// Dump path templates: %p pid, %t unix time, %n dump number, %f rank of a worst game frame, %% a percent
// sign; comma-separated lists; a tag before a path's extension for companion files.
// Context: any thread except the signal handler.
#pragma once

#include <unistd.h>

#include <atomic>
#include <cstdint>
#include <ctime>
#include <string>
#include <vector>

namespace selfprof {
namespace detail {

// Where dumps go when SELFPROF_OUT is not set: the working directory, one SVG per dump.
constexpr const char* kDefaultDumpTemplate = "selfprof-%p-%n.svg";

// The values a template's fields take in one dump: every file of a dump gets the same number and time.
struct path_fields {
  long long pid = 0;  // %p; 0: this process (selfprof record names its children's profiles)
  unsigned long number = 0;
  long long unix_time = 0;
  std::string rank;  // %f: empty when the dump has no ranks
};

inline path_fields fields_now(unsigned long number) {
  path_fields f;
  f.number = number;
  f.unix_time = static_cast<long long>(std::time(nullptr));
  return f;
}

inline std::string expand_path_template(const std::string& tmpl, const path_fields& f) {
  std::string out;
  for (std::size_t i = 0; i < tmpl.size(); ++i) {
    if (tmpl[i] != '%' || i + 1 == tmpl.size()) {
      out += tmpl[i];
      continue;
    }
    const char c = tmpl[++i];
    if (c == 'p')
      out += std::to_string(f.pid != 0 ? f.pid : static_cast<long long>(::getpid()));
    else if (c == 't')
      out += std::to_string(f.unix_time);
    else if (c == 'n')
      out += std::to_string(f.number);
    else if (c == 'f' && !f.rank.empty())
      out += f.rank;
    else if (c == '%')
      out += '%';
    else {
      out += '%';
      out += c;
    }
  }
  return out;
}

inline std::vector<std::string> split_paths(const std::string& list) {
  std::vector<std::string> out;
  std::size_t start = 0;
  while (start <= list.size()) {
    std::size_t comma = list.find(',', start);
    std::string part = list.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
    if (!part.empty()) out.push_back(part);
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  return out;
}

// `path` with `tag` inserted before its extension (".pb.gz" counts as one): "cpu.svg" -> "cpu-slow.svg".
inline std::string insert_before_extension(const std::string& path, const std::string& tag) {
  std::size_t slash = path.find_last_of('/');
  std::size_t base = slash == std::string::npos ? 0 : slash + 1;
  std::size_t dot = path.size();
  if (path.size() > base + 6 && path.compare(path.size() - 6, 6, ".pb.gz") == 0)
    dot = path.size() - 6;
  else if (path.find('.', base + 1) != std::string::npos)
    dot = path.find_last_of('.');
  return path.substr(0, dot) + tag + path.substr(dot);
}

// The number of the next dump of this process (1, 2, ...), whatever triggered it.
inline unsigned long next_dump_number() {
  static std::atomic<unsigned long> n{0};
  return n.fetch_add(1) + 1;
}

}  // namespace detail
}  // namespace selfprof
