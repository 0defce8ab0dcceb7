// The HTTP/1.1 request parser and response heads of selfprof's profile endpoint (serve/server.hpp): GET
// and HEAD only, every size bounded, every malformed input answered with a status code and a reason.
// Context: any thread except the signal handler (the server thread; a pure function of its input).
//
// Why a parser of our own rather than a library: the endpoint serves a handful of fixed GET paths to
// pprof clients and scrapers, one request per connection. An HTTP library would be a dependency of every
// program that embeds the profiler (selfprof needs only the C++ library and Linux) and brings far more
// surface than this needs (bodies, chunking, keep-alive, TLS); this parser is small enough to read whole
// and is fuzzed on its own (tests/fuzz/http_request_fuzz.cpp).
//
// What it accepts: "METHOD SP origin-form SP HTTP/1.x" (CRLF or bare LF line ends), header fields
// "name: value". Rejected: a request line longer than `max_request_line` (414), a head longer than
// `max_head_bytes` or with more than `max_fields` fields (431), a method other than GET and HEAD (405; an
// unknown one too), an HTTP version other than 1.0 and 1.1 (505), a target that is not "/..." with
// printable characters, a bad percent escape or an escaped NUL, obsolete line folding, control characters
// in a value, two Authorization fields (400). A body is never read: every response closes the connection.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace selfprof {
namespace detail {

struct http_limits {
  std::size_t max_request_line = 2048;
  std::size_t max_head_bytes = 8192;  // request line and fields, up to the empty line
  std::size_t max_fields = 64;
};

struct http_request {
  std::string method;                                      // "GET" or "HEAD"
  std::string path;                                        // percent-decoded, starts with '/'
  std::vector<std::pair<std::string, std::string>> query;  // decoded, in order
  std::string authorization;                               // the Authorization field's value, if any
  bool has_authorization = false;

  // The value of query parameter `name` (the first one), or nullptr.
  const std::string* param(std::string_view name) const {
    for (const auto& kv : query)
      if (kv.first == name) return &kv.second;
    return nullptr;
  }
};

enum class http_parse { incomplete, done, bad };

struct http_parse_result {
  http_parse state = http_parse::incomplete;
  int status = 0;      // bad: the status code to answer with
  std::string reason;  // bad: what was wrong, for the response body
};

inline bool http_token_char(char c) {
  if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9')) return true;
  switch (c) {
    case '!':
    case '#':
    case '$':
    case '%':
    case '&':
    case '\'':
    case '*':
    case '+':
    case '-':
    case '.':
    case '^':
    case '_':
    case '`':
    case '|':
    case '~':
      return true;
    default:
      return false;
  }
}

inline int http_hex(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

// Percent-decodes `in` (and '+' as a space when `plus`). False on a bad escape or an escaped NUL.
inline bool http_decode(std::string_view in, bool plus, std::string& out) {
  out.clear();
  for (std::size_t i = 0; i < in.size(); ++i) {
    const char c = in[i];
    if (c == '%') {
      if (i + 2 >= in.size()) return false;
      const int hi = http_hex(in[i + 1]), lo = http_hex(in[i + 2]);
      if (hi < 0 || lo < 0 || (hi == 0 && lo == 0)) return false;
      out += static_cast<char>(hi * 16 + lo);
      i += 2;
    } else if (c == '+' && plus) {
      out += ' ';
    } else {
      out += c;
    }
  }
  return true;
}

inline bool http_equal_ci(std::string_view a, std::string_view b) {
  if (a.size() != b.size()) return false;
  for (std::size_t i = 0; i < a.size(); ++i) {
    char x = a[i], y = b[i];
    if (x >= 'A' && x <= 'Z') x = static_cast<char>(x - 'A' + 'a');
    if (y >= 'A' && y <= 'Z') y = static_cast<char>(y - 'A' + 'a');
    if (x != y) return false;
  }
  return true;
}

inline http_parse_result http_bad(int status, std::string reason) {
  http_parse_result r;
  r.state = http_parse::bad;
  r.status = status;
  r.reason = std::move(reason);
  return r;
}

// Parses the request target (origin form) into path and query.
inline http_parse_result http_parse_target(std::string_view target, http_request& out) {
  if (target.empty() || target[0] != '/') return http_bad(400, "the request target must start with '/'");
  for (char c : target)
    if (static_cast<unsigned char>(c) <= 0x20 || static_cast<unsigned char>(c) >= 0x7f)
      return http_bad(400, "the request target has a character that is not printable ASCII");
  const std::size_t q = target.find('?');
  std::string_view path = target.substr(0, q);
  const std::size_t hash = path.find('#');
  if (hash != std::string_view::npos) path = path.substr(0, hash);
  if (!http_decode(path, false, out.path)) return http_bad(400, "bad percent escape in the request path");
  if (q == std::string_view::npos) return {http_parse::done, 0, {}};
  std::string_view query = target.substr(q + 1);
  const std::size_t qhash = query.find('#');
  if (qhash != std::string_view::npos) query = query.substr(0, qhash);
  while (!query.empty()) {
    const std::size_t amp = query.find('&');
    const std::string_view item = query.substr(0, amp);
    query = amp == std::string_view::npos ? std::string_view() : query.substr(amp + 1);
    if (item.empty()) continue;
    const std::size_t eq = item.find('=');
    std::string k, v;
    if (!http_decode(item.substr(0, eq), true, k) ||
        (eq != std::string_view::npos && !http_decode(item.substr(eq + 1), true, v)))
      return http_bad(400, "bad percent escape in the query string");
    if (out.query.size() >= 32) return http_bad(400, "more than 32 query parameters");
    out.query.emplace_back(std::move(k), std::move(v));
  }
  return {http_parse::done, 0, {}};
}

// Parses the head of a request from the bytes received so far. `incomplete` until the empty line that
// ends the head arrives (or a limit is passed, which is `bad`).
inline http_parse_result parse_http_request(std::string_view in, http_request& out,
                                            const http_limits& lim = {}) {
  out = http_request();
  // The end of the head: the first empty line.
  std::size_t head_end = std::string_view::npos, body = 0;
  for (std::size_t i = 0; i < in.size(); ++i) {
    if (in[i] != '\n') continue;
    if (i + 1 < in.size() && in[i + 1] == '\n') {
      head_end = i + 1;
      body = i + 2;
      break;
    }
    if (i + 2 < in.size() && in[i + 1] == '\r' && in[i + 2] == '\n') {
      head_end = i + 1;
      body = i + 3;
      break;
    }
  }
  (void)body;
  const std::size_t line_end = in.find('\n');
  if (line_end == std::string_view::npos ? in.size() > lim.max_request_line : line_end > lim.max_request_line)
    return http_bad(414,
                    "the request line is longer than " + std::to_string(lim.max_request_line) + " bytes");
  if (head_end == std::string_view::npos ? in.size() > lim.max_head_bytes : head_end > lim.max_head_bytes)
    return http_bad(431, "the request head is longer than " + std::to_string(lim.max_head_bytes) + " bytes");
  if (line_end == std::string_view::npos) return {};
  // The request line, checked as soon as it is complete (a bad method is refused without the fields).
  std::string_view line = in.substr(0, line_end);
  if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
  const std::size_t sp1 = line.find(' ');
  if (sp1 == std::string_view::npos || sp1 == 0) return http_bad(400, "malformed request line");
  const std::string_view method = line.substr(0, sp1);
  for (char c : method)
    if (!http_token_char(c)) return http_bad(400, "malformed request method");
  if (method != "GET" && method != "HEAD") return http_bad(405, "only GET and HEAD are served");
  const std::size_t sp2 = line.find(' ', sp1 + 1);
  if (sp2 == std::string_view::npos || line.find(' ', sp2 + 1) != std::string_view::npos)
    return http_bad(400, "malformed request line (expected: METHOD TARGET HTTP/1.1)");
  const std::string_view version = line.substr(sp2 + 1);
  if (version.size() != 8 || version.substr(0, 5) != "HTTP/" || version[6] != '.' || version[5] < '0' ||
      version[5] > '9' || version[7] < '0' || version[7] > '9')
    return http_bad(400, "malformed HTTP version");
  if (version != "HTTP/1.1" && version != "HTTP/1.0")
    return http_bad(505, "only HTTP/1.0 and 1.1 are served");
  if (head_end == std::string_view::npos) return {};
  out.method = std::string(method);
  http_parse_result t = http_parse_target(line.substr(sp1 + 1, sp2 - sp1 - 1), out);
  if (t.state == http_parse::bad) return t;
  // The fields.
  std::size_t pos = line_end + 1, fields = 0;
  while (pos < head_end) {
    std::size_t eol = in.find('\n', pos);
    std::string_view f = in.substr(pos, eol - pos);
    pos = eol + 1;
    if (!f.empty() && f.back() == '\r') f.remove_suffix(1);
    if (f.empty()) break;
    if (++fields > lim.max_fields)
      return http_bad(431, "more than " + std::to_string(lim.max_fields) + " header fields");
    if (f[0] == ' ' || f[0] == '\t') return http_bad(400, "obsolete line folding in a header field");
    const std::size_t colon = f.find(':');
    if (colon == std::string_view::npos || colon == 0) return http_bad(400, "malformed header field");
    const std::string_view name = f.substr(0, colon);
    for (char c : name)
      if (!http_token_char(c)) return http_bad(400, "malformed header field name");
    std::string_view value = f.substr(colon + 1);
    while (!value.empty() && (value.front() == ' ' || value.front() == '\t')) value.remove_prefix(1);
    while (!value.empty() && (value.back() == ' ' || value.back() == '\t')) value.remove_suffix(1);
    for (char c : value)
      if ((static_cast<unsigned char>(c) < 0x20 && c != '\t') || c == 0x7f)
        return http_bad(400, "control character in a header field value");
    if (http_equal_ci(name, "authorization")) {
      if (out.has_authorization) return http_bad(400, "more than one Authorization field");
      out.has_authorization = true;
      out.authorization = std::string(value);
    }
  }
  return {http_parse::done, 0, {}};
}

inline const char* http_reason(int status) {
  switch (status) {
    case 200:
      return "OK";
    case 400:
      return "Bad Request";
    case 401:
      return "Unauthorized";
    case 403:
      return "Forbidden";
    case 404:
      return "Not Found";
    case 405:
      return "Method Not Allowed";
    case 408:
      return "Request Timeout";
    case 414:
      return "URI Too Long";
    case 431:
      return "Request Header Fields Too Large";
    case 500:
      return "Internal Server Error";
    case 503:
      return "Service Unavailable";
    case 505:
      return "HTTP Version Not Supported";
    default:
      return "Error";
  }
}

// A response head: status line, the content type and length, `extra` fields (each ending in CRLF), and
// "Connection: close" (one request per connection).
inline std::string http_response_head(int status, std::string_view content_type, std::size_t length,
                                      std::string_view extra = {}) {
  std::string h = "HTTP/1.1 " + std::to_string(status) + " " + http_reason(status) + "\r\n";
  h += "Content-Type: ";
  h += content_type;
  h += "\r\nContent-Length: " + std::to_string(length) + "\r\n";
  h += "X-Content-Type-Options: nosniff\r\nCache-Control: no-store\r\n";
  if (status == 405) h += "Allow: GET, HEAD\r\n";
  if (status == 401) h += "WWW-Authenticate: Bearer realm=\"selfprof\"\r\n";
  h += extra;
  h += "Connection: close\r\n\r\n";
  return h;
}

// A complete plain-text error response ("selfprof: <reason>\n").
inline std::string http_error_response(int status, std::string_view reason, bool head_only = false) {
  std::string body = "selfprof: ";
  body += reason;
  body += '\n';
  std::string r = http_response_head(status, "text/plain; charset=utf-8", body.size());
  if (!head_only) r += body;
  return r;
}

// Compares a presented secret with the expected one in time that depends only on the presented one's
// length, so the time to refuse reveals nothing about how much of a guess was right.
inline bool http_equal_constant_time(std::string_view given, std::string_view expected) {
  unsigned char diff = given.size() == expected.size() ? 0 : 1;
  for (std::size_t i = 0; i < given.size(); ++i) {
    const unsigned char e = expected.empty() ? 0 : static_cast<unsigned char>(expected[i % expected.size()]);
    diff = static_cast<unsigned char>(diff | (static_cast<unsigned char>(given[i]) ^ e));
  }
  return diff == 0 && !expected.empty();
}

}  // namespace detail
}  // namespace selfprof
