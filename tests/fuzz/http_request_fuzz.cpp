// libFuzzer target for the endpoint's request parser (serve/http.hpp) and the client's response parser:
// any input parses to a request, "incomplete" or a refusal with a 4xx/5xx status, never a crash.
// Build: clang++ -std=c++17 -g -O1 -fsanitize=fuzzer,address,undefined -Iinclude
// tests/fuzz/http_request_fuzz.cpp Run:   ./http_request_fuzz -max_total_time=60
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string_view>

#include "selfprof/serve/client.hpp"
#include "selfprof/serve/http.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace selfprof::detail;
  const std::string_view in(reinterpret_cast<const char*>(data), size);
  http_request r;
  const http_parse_result p = parse_http_request(in, r);
  if (p.state == http_parse::bad && (p.status < 400 || p.status > 599 || p.reason.empty())) std::abort();
  if (p.state == http_parse::done) {
    if (r.method != "GET" && r.method != "HEAD") std::abort();
    if (r.path.empty() || r.path[0] != '/') std::abort();
    (void)r.param("seconds");
  }
  http_reply reply;
  (void)parse_http_reply(in, reply);
  (void)http_equal_constant_time(in, "0123456789abcdef");
  return 0;
}
