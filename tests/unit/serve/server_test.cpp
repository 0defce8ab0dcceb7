// The server's address parsing and a route served over a loopback port and the control socket.
#include <doctest/doctest.h>

#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include <selfprof/serve/client.hpp>
#include <selfprof/serve/server.hpp>

using namespace selfprof::detail;

TEST_CASE("server: listen addresses, and which are loopback") {
  listen_address a;
  REQUIRE(parse_listen_address("127.0.0.1:6060", a));
  CHECK(a.family == AF_INET);
  CHECK(a.loopback);
  REQUIRE(parse_listen_address("localhost:0", a));
  CHECK(a.loopback);
  REQUIRE(parse_listen_address("0.0.0.0:80", a));
  CHECK(!a.loopback);
  REQUIRE(parse_listen_address("10.1.2.3:80", a));
  CHECK(!a.loopback);
  REQUIRE(parse_listen_address("[::1]:6060", a));
  CHECK(a.family == AF_INET6);
  CHECK(a.loopback);
  REQUIRE(parse_listen_address("[::]:6060", a));
  CHECK(!a.loopback);
  REQUIRE(parse_listen_address("unix:/run/x.sock", a));
  CHECK(a.family == AF_UNIX);
  CHECK(a.path == "/run/x.sock");
  for (const char* bad : {"", "6060", "127.0.0.1", "127.0.0.1:", "127.0.0.1:65536", "127.0.0.1:x",
                          "example.com:80", "[::1:80", "[zz]:80", "unix:", "unix:relative"}) {
    INFO(bad);
    const selfprof::status st = parse_listen_address(bad, a);
    CHECK(!st);
    CHECK(st.message().find("SELFPROF_HTTP") != std::string::npos);
  }
}

TEST_CASE("server: a route over TCP and the control socket, jobs made off the loop") {
  http_server s;
  server_config cfg;
  cfg.http = "127.0.0.1:0";
  std::vector<std::string> notes;
  REQUIRE(s.start(
      cfg,
      [](const http_request& r) {
        http_answer a;
        if (r.path == "/later") {
          a.job = [] { return http_response_head(200, "text/plain", 4) + "done"; };
          a.due = serve_clock::now() + std::chrono::milliseconds(50);
        } else {
          a.bytes = http_response_head(200, "text/plain", r.path.size()) + r.path;
        }
        return a;
      },
      notes));
  REQUIRE(s.running());
  CHECK(s.tids().size() == 1);  // the render thread waits for the first job
  listen_address la;
  REQUIRE(parse_listen_address(s.address(), la));
  http_reply r;
  REQUIRE(http_get(reinterpret_cast<const sockaddr*>(&la.addr), la.len, "/echo", 5, r));
  CHECK(r.status == 200);
  CHECK(r.body == "/echo");
  CHECK(s.tids().size() == 1);
  REQUIRE(http_get(reinterpret_cast<const sockaddr*>(&la.addr), la.len, "/later", 5, r));
  CHECK(r.body == "done");
  CHECK(s.tids().size() == 2);
  socklen_t len = 0;
  const sockaddr_un un = control_socket_address(::getpid(), len);
  REQUIRE(http_get(reinterpret_cast<const sockaddr*>(&un), len, "/ctl", 5, r));
  CHECK(r.body == "/ctl");
  CHECK(s.counters().requests == 3);
  s.stop();
  CHECK(!http_get(reinterpret_cast<const sockaddr*>(&la.addr), la.len, "/echo", 1, r));
}

TEST_CASE("server: responses are parsed strictly by the client") {
  http_reply r;
  CHECK(parse_http_reply("HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nab", r));
  CHECK(r.body == "ab");
  CHECK(!parse_http_reply("HTTP/1.1 200 OK\r\nContent-Length: 3\r\n\r\nab", r));  // cut short
  CHECK(!parse_http_reply("HTTP/1.1 200 OK\r\n", r));
  CHECK(!parse_http_reply("HTTP/1.1 2x0 OK\r\n\r\n", r));
  CHECK(parse_http_reply("HTTP/1.1 200 OK\r\nContent-Length: 3\r\n\r\n", r, true));
}

TEST_CASE("server: responses in the making are bounded; past the bound a 503") {
  http_server s;
  server_config cfg;
  cfg.http = "127.0.0.1:0";
  cfg.control = false;
  cfg.max_jobs = 3;
  std::vector<std::string> notes;
  REQUIRE(s.start(
      cfg,
      [](const http_request&) {
        http_answer a;
        a.job = [] { return http_response_head(200, "text/plain", 2) + "ok"; };
        a.due = serve_clock::now() + std::chrono::milliseconds(400);
        return a;
      },
      notes));
  listen_address la;
  REQUIRE(parse_listen_address(s.address(), la));
  std::vector<std::thread> clients;
  std::atomic<int> ok{0}, refused{0};
  for (int i = 0; i < 5; ++i)
    clients.emplace_back([&] {
      http_reply r;
      if (!http_get(reinterpret_cast<const sockaddr*>(&la.addr), la.len, "/x", 5, r)) return;
      ok += r.status == 200;
      refused += r.status == 503;
    });
  for (auto& t : clients) t.join();
  CHECK(ok == 3);
  CHECK(refused == 2);
  CHECK(s.counters().refused == 2);
}

TEST_CASE("server: a client that stops reading is dropped after the write timeout; others are served") {
  // Before the server: it is stopped first, even when a REQUIRE ends the test while its thread renders.
  const std::string big(32u << 20, 'x');  // far more than both socket buffers hold
  http_server s;
  server_config cfg;
  cfg.http = "127.0.0.1:0";
  cfg.control = false;
  cfg.io_timeout_s = 0.3;  // 30 s in production
  std::vector<std::string> notes;
  REQUIRE(s.start(
      cfg,
      [&](const http_request& r) {
        http_answer a;
        if (r.path == "/big")
          a.bytes = http_response_head(200, "text/plain", big.size()) + big;
        else
          a.bytes = http_response_head(200, "text/plain", 2) + "ok";
        return a;
      },
      notes));
  listen_address la;
  REQUIRE(parse_listen_address(s.address(), la));
  const int stuck = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  REQUIRE(stuck >= 0);
  const int small = 4096;
  ::setsockopt(stuck, SOL_SOCKET, SO_RCVBUF, &small, sizeof small);
  REQUIRE(::connect(stuck, reinterpret_cast<const sockaddr*>(&la.addr), la.len) == 0);
  const std::string req = "GET /big HTTP/1.1\r\nHost: x\r\n\r\n";
  REQUIRE(::send(stuck, req.data(), req.size(), MSG_NOSIGNAL) == static_cast<ssize_t>(req.size()));
  // While the stuck client reads nothing, another one is served. The server's threads run at nice 19:
  // on a machine busy with other tests they wait seconds for a CPU, hence the generous bounds.
  http_reply r;
  selfprof::status got_small = http_get(reinterpret_cast<const sockaddr*>(&la.addr), la.len, "/small", 30, r);
  INFO(got_small.message());
  REQUIRE(got_small);
  CHECK(r.body == "ok");
  for (int i = 0; i < 3000 && s.counters().timeouts == 0; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  CHECK(s.counters().timeouts == 1);
  // The server closed its side: reading on, the client gets a part of the body and then the end.
  std::size_t got = 0;
  char buf[65536];
  for (;;) {
    const ssize_t n = ::recv(stuck, buf, sizeof buf, 0);
    if (n <= 0) break;
    got += static_cast<std::size_t>(n);
  }
  CHECK(got > 0);
  CHECK(got < big.size());
  ::close(stuck);
  REQUIRE(http_get(reinterpret_cast<const sockaddr*>(&la.addr), la.len, "/small", 30, r));
  CHECK(r.body == "ok");
}

TEST_CASE("server: an endpoint address in use is a note, not an error; a bad one is an error") {
  http_server first, second;
  server_config cfg;
  cfg.http = "127.0.0.1:0";
  cfg.control = false;
  std::vector<std::string> notes;
  auto route = [](const http_request&) { return http_answer{}; };
  REQUIRE(first.start(cfg, route, notes));
  cfg.http = first.address();
  REQUIRE(second.start(cfg, route, notes));
  CHECK(second.address().empty());
  REQUIRE(notes.size() == 1);
  CHECK(notes[0].find("cannot listen") != std::string::npos);
  cfg.http = "0.0.0.0:0";
  const selfprof::status st = second.start(cfg, route, notes);
  CHECK(!st);
  CHECK(st.message().find("bearer token") != std::string::npos);
  cfg.token = "0123456789abcdef";
  CHECK(second.start(cfg, route, notes));
  CHECK(!second.address().empty());
}
