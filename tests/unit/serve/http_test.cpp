// The request parser: what it accepts, and the status code and reason of everything it refuses.
#include <doctest/doctest.h>

#include <string>

#include <selfprof/serve/http.hpp>

using namespace selfprof::detail;

namespace {
http_parse_result parse(const std::string& in, http_request& r) { return parse_http_request(in, r); }
int refused(const std::string& in) {
  http_request r;
  const http_parse_result p = parse(in, r);
  return p.state == http_parse::bad ? p.status : 0;
}
}  // namespace

TEST_CASE("http: a GET with a query and an Authorization field") {
  http_request r;
  const http_parse_result p = parse(
      "GET /debug/pprof/profile?seconds=10&x=a%20b+c&flag HTTP/1.1\r\nHost: h\r\nAuthorization:  Bearer t0k "
      "\r\n\r\n",
      r);
  REQUIRE(p.state == http_parse::done);
  CHECK(r.method == "GET");
  CHECK(r.path == "/debug/pprof/profile");
  REQUIRE(r.query.size() == 3);
  CHECK(*r.param("seconds") == "10");
  CHECK(*r.param("x") == "a b c");
  CHECK(r.param("flag")->empty());
  CHECK(r.param("none") == nullptr);
  CHECK(r.has_authorization);
  CHECK(r.authorization == "Bearer t0k");
}

TEST_CASE("http: HEAD, HTTP/1.0 and bare LF line ends are accepted") {
  http_request r;
  CHECK(parse("HEAD / HTTP/1.0\n\n", r).state == http_parse::done);
  CHECK(r.method == "HEAD");
  CHECK(r.path == "/");
  CHECK(parse("GET /a%2Fb HTTP/1.1\r\n\r\n", r).state == http_parse::done);
  CHECK(r.path == "/a/b");
}

TEST_CASE("http: incomplete until the empty line; a bad method is refused as soon as the line is there") {
  http_request r;
  CHECK(parse("", r).state == http_parse::incomplete);
  CHECK(parse("GET / HT", r).state == http_parse::incomplete);
  CHECK(parse("GET / HTTP/1.1\r\nHost: x\r\n", r).state == http_parse::incomplete);
  CHECK(refused("POST / HTTP/1.1\r\n") == 405);
}

TEST_CASE("http: everything refused gets its status") {
  CHECK(refused("POST / HTTP/1.1\r\n\r\n") == 405);
  CHECK(refused("PUT / HTTP/1.1\r\n\r\n") == 405);
  CHECK(refused("BREW / HTTP/1.1\r\n\r\n") == 405);
  CHECK(refused("GET / HTTP/2.0\r\n\r\n") == 505);
  CHECK(refused("GET / HTTP/1.x\r\n\r\n") == 400);
  CHECK(refused("GET /  HTTP/1.1\r\n\r\n") == 400);
  CHECK(refused("GET http://x/ HTTP/1.1\r\n\r\n") == 400);
  CHECK(refused("GET / HTTP/1.1 extra\r\n\r\n") == 400);
  CHECK(refused(" GET / HTTP/1.1\r\n\r\n") == 400);
  CHECK(refused("G(T / HTTP/1.1\r\n\r\n") == 400);
  CHECK(refused("GET /%zz HTTP/1.1\r\n\r\n") == 400);
  CHECK(refused("GET /%00 HTTP/1.1\r\n\r\n") == 400);
  CHECK(refused("GET /a% HTTP/1.1\r\n\r\n") == 400);
  CHECK(refused("GET /?a=%4 HTTP/1.1\r\n\r\n") == 400);
  CHECK(refused("GET /\x01 HTTP/1.1\r\n\r\n") == 400);
  CHECK(refused("GET / HTTP/1.1\r\nNo colon\r\n\r\n") == 400);
  CHECK(refused("GET / HTTP/1.1\r\n: empty name\r\n\r\n") == 400);
  CHECK(refused("GET / HTTP/1.1\r\nA: b\r\n folded\r\n\r\n") == 400);
  CHECK(refused("GET / HTTP/1.1\r\nA: b\x01\r\n\r\n") == 400);
  CHECK(refused("GET / HTTP/1.1\r\nAuthorization: a\r\nAuthorization: b\r\n\r\n") == 400);
  CHECK(refused("GET /" + std::string(3000, 'a') + " HTTP/1.1\r\n\r\n") == 414);
  CHECK(refused("GET /" + std::string(3000, 'a')) == 414);  // before the line ends
  CHECK(refused("GET / HTTP/1.1\r\nX: " + std::string(9000, 'x') + "\r\n\r\n") == 431);
  CHECK(refused("GET / HTTP/1.1\r\nX: " + std::string(9000, 'x')) == 431);  // before the head ends
  std::string many = "GET / HTTP/1.1\r\n";
  for (int i = 0; i < 70; ++i) many += "F" + std::to_string(i) + ": v\r\n";
  CHECK(refused(many + "\r\n") == 431);
  std::string params = "GET /?";
  for (int i = 0; i < 40; ++i) params += "p=1&";
  CHECK(refused(params + " HTTP/1.1\r\n\r\n") == 400);
}

TEST_CASE("http: response heads and the constant-time compare") {
  const std::string h = http_response_head(200, "image/svg+xml", 12, "X-A: b\r\n");
  CHECK(h.rfind("HTTP/1.1 200 OK\r\n", 0) == 0);
  CHECK(h.find("Content-Type: image/svg+xml\r\n") != std::string::npos);
  CHECK(h.find("Content-Length: 12\r\n") != std::string::npos);
  CHECK(h.find("X-A: b\r\n") != std::string::npos);
  CHECK(h.substr(h.size() - 4) == "\r\n\r\n");
  CHECK(http_response_head(405, "text/plain", 0).find("Allow: GET, HEAD\r\n") != std::string::npos);
  const std::string e = http_error_response(404, "no such page");
  CHECK(e.find("\r\n\r\nselfprof: no such page\n") != std::string::npos);
  CHECK(http_error_response(404, "x", true).find("selfprof: x") == std::string::npos);
  CHECK(http_equal_constant_time("secret-token", "secret-token"));
  CHECK(!http_equal_constant_time("secret-tokem", "secret-token"));
  CHECK(!http_equal_constant_time("secret", "secret-token"));
  CHECK(!http_equal_constant_time("secret-token-and-more", "secret-token"));
  CHECK(!http_equal_constant_time("", ""));
}
