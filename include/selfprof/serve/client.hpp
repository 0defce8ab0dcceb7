// A minimal HTTP/1.1 GET client for selfprof's own endpoint and control socket: `selfprof dump PID` and
// the tests use it. One request per connection; the response is read until the server closes.
// Context: any thread except the signal handler (the command-line tool, tests).
#pragma once

#include <arpa/inet.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstddef>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "selfprof/serve/http.hpp"
#include "selfprof/serve/server.hpp"
#include "selfprof/status.hpp"

namespace selfprof {
namespace detail {

struct http_reply {
  int status = 0;
  std::vector<std::pair<std::string, std::string>> fields;
  std::string body;

  const std::string* field(std::string_view name) const {
    for (const auto& f : fields)
      if (http_equal_ci(f.first, name)) return &f.second;
    return nullptr;
  }
};

// Parses a complete response (head and body, the connection closed after it). False when malformed.
inline bool parse_http_reply(std::string_view in, http_reply& out, bool head_only = false) {
  out = http_reply();
  std::size_t end = in.find("\r\n\r\n");
  if (end == std::string_view::npos) return false;
  std::string_view head = in.substr(0, end);
  std::string_view body = in.substr(end + 4);
  std::size_t eol = head.find("\r\n");
  const std::string_view status_line = head.substr(0, eol);
  if (status_line.size() < 12 || status_line.substr(0, 7) != "HTTP/1." || status_line[8] != ' ') return false;
  int code = 0;
  for (std::size_t i = 9; i < 12; ++i) {
    if (status_line[i] < '0' || status_line[i] > '9') return false;
    code = code * 10 + (status_line[i] - '0');
  }
  out.status = code;
  while (eol != std::string_view::npos) {
    const std::size_t start = eol + 2;
    eol = head.find("\r\n", start);
    const std::string_view f =
        head.substr(start, eol == std::string_view::npos ? std::string_view::npos : eol - start);
    const std::size_t colon = f.find(':');
    if (colon == std::string_view::npos) return false;
    std::string_view v = f.substr(colon + 1);
    while (!v.empty() && v.front() == ' ') v.remove_prefix(1);
    out.fields.emplace_back(std::string(f.substr(0, colon)), std::string(v));
  }
  if (const std::string* len = out.field("Content-Length")) {
    char* stop = nullptr;
    const unsigned long long n = std::strtoull(len->c_str(), &stop, 10);
    if (stop == len->c_str() || *stop != '\0') return false;
    if (!head_only && n != body.size()) return false;  // cut short
  }
  out.body = head_only ? std::string() : std::string(body);
  return true;
}

// The abstract address of process `pid`'s control socket.
inline sockaddr_un control_socket_address(long pid, socklen_t& len) {
  const std::string name = control_socket_name(pid);
  sockaddr_un un{};
  un.sun_family = AF_UNIX;
  std::memcpy(un.sun_path + 1, name.data(), name.size());
  len = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + 1 + name.size());
  return un;
}

// Sends `request` (the raw bytes of a request) to `addr` and reads the whole response, all within
// `timeout_s`. The raw response goes to `raw`. `expect_pid` (a unix socket): the listening process must
// be that one and run as our uid or root (SO_PEERCRED), so no other user's socket squatting on the name
// is believed.
inline status http_exchange(const sockaddr* addr, socklen_t len, const std::string& request, double timeout_s,
                            std::string& raw, long expect_pid = 0) {
  raw.clear();
  const auto deadline =
      std::chrono::steady_clock::now() + std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                                             std::chrono::duration<double>(timeout_s));
  const int fd = ::socket(addr->sa_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (fd < 0) return status::error(std::string("socket: ") + std::strerror(errno), errno);
  auto fail = [&](const char* what, int e) {
    ::close(fd);
    return status::error(std::string(what) + ": " + std::strerror(e), e);
  };
  auto wait_for = [&](short events) {
    const auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now())
            .count();
    if (left <= 0) return false;
    pollfd p{fd, events, 0};
    return ::poll(&p, 1, static_cast<int>(left)) > 0;
  };
  if (::connect(fd, addr, len) != 0) {
    if (errno != EINPROGRESS && errno != EAGAIN) return fail("connect", errno);
    if (!wait_for(POLLOUT)) return fail("connect", ETIMEDOUT);
    int err = 0;
    socklen_t el = sizeof err;
    ::getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &el);
    if (err != 0) return fail("connect", err);
  }
  if (expect_pid > 0) {
    struct ucred cred {};
    socklen_t cl = sizeof cred;
    if (::getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &cl) != 0) return fail("SO_PEERCRED", errno);
    if (cred.pid != expect_pid || (cred.uid != ::geteuid() && cred.uid != 0)) {
      ::close(fd);
      return status::error("the socket is held by process " + std::to_string(cred.pid) + " of uid " +
                           std::to_string(cred.uid) + ", not by process " + std::to_string(expect_pid) +
                           " of this user: not trusting it");
    }
  }
  std::size_t sent = 0;
  while (sent < request.size()) {
    const ssize_t n = ::send(fd, request.data() + sent, request.size() - sent, MSG_NOSIGNAL);
    if (n < 0) {
      if (errno == EINTR) continue;
      if (errno == EPIPE || errno == ECONNRESET) break;  // answered early (refused): read the answer
      if (errno != EAGAIN && errno != EWOULDBLOCK) return fail("send", errno);
      if (!wait_for(POLLOUT)) return fail("send", ETIMEDOUT);
      continue;
    }
    sent += static_cast<std::size_t>(n);
  }
  char buf[65536];
  for (;;) {
    const ssize_t n = ::recv(fd, buf, sizeof buf, 0);
    if (n > 0) {
      raw.append(buf, static_cast<std::size_t>(n));
      continue;
    }
    if (n == 0) break;
    if (errno == EINTR) continue;
    if (errno != EAGAIN && errno != EWOULDBLOCK) {
      if (!raw.empty() && errno == ECONNRESET) break;  // the server closed after answering early
      return fail("recv", errno);
    }
    if (!wait_for(POLLIN)) return fail("waiting for the response", ETIMEDOUT);
  }
  ::close(fd);
  return status::ok();
}

// GET `target` over `addr`, the response parsed into `reply`.
inline status http_get(const sockaddr* addr, socklen_t len, const std::string& target, double timeout_s,
                       http_reply& reply, const std::string& extra_fields = {}, long expect_pid = 0) {
  std::string raw;
  status st =
      http_exchange(addr, len, "GET " + target + " HTTP/1.1\r\nHost: selfprof\r\n" + extra_fields + "\r\n",
                    timeout_s, raw, expect_pid);
  if (!st) return st;
  if (!parse_http_reply(raw, reply)) return status::error("malformed or incomplete response");
  return status::ok();
}

}  // namespace detail
}  // namespace selfprof
