// The profile endpoint's server: one poll loop over every listening socket and connection (thread
// "selfprof-http"), and the responses that take work — a profile of the next N seconds, symbolized and
// rendered — made off that loop on a second thread ("selfprof-render"), so a slow render or a slow
// client never holds up another client. That thread starts at the first such request; with only the
// control socket open, so does the loop's (start_on_demand). Both are detail::worker threads.
// Context: setup only (start, stop, abandon_after_fork); the two server threads; counters(),
// lazy_listener() and start_on_demand() from any thread.
//
// Threads start when needed: a process nobody asks for a profile runs no server thread when only the
// control socket listens (a thread costs a short-lived process a noticeable share of its CPU); another
// thread (the dumper) watches lazy_listener() and calls start_on_demand() at the first connection. The
// threads run at nice 19, so serving takes only CPU the application leaves; signals are blocked in them.
//
// Listeners, all speaking the same protocol (serve/http.hpp), one request per connection:
//  - the endpoint (options::http, SELFPROF_HTTP): "HOST:PORT" with a numeric IPv4 address or
//    "localhost", "[IPV6]:PORT", or "unix:/path". Loopback unless told otherwise; a non-loopback address
//    needs a bearer token (start() refuses it without one). A unix socket is made 0600 and the peer's uid
//    is checked (SO_PEERCRED: ours or root).
//  - the control socket (options::control, on by default): the abstract unix socket "@selfprof-<pid>",
//    peer uid checked the same way; `selfprof dump PID` is an HTTP client of it. No signal is sent, so no
//    thread of the application sees EINTR because of a dump.
// Bounds: connections open at once (over it, a 503 and close), the head's size and the time to receive it
// (slowloris), the time a response may go without progress, the profiles in the making (503 past it).
// A bad endpoint address, or a non-loopback one without a token, fails start(); an address in use is a
// note (sampling goes on without the endpoint). Every descriptor is
// non-blocking, close-on-exec and above the application's range (detail/high_fd.hpp). Failures are
// counted, never raised: nothing here can stop or stall the application.
#pragma once

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <functional>
#include <memory>
#include <mutex>
#include <new>
#include <string>
#include <utility>
#include <vector>

#include "selfprof/detail/high_fd.hpp"
#include "selfprof/detail/worker.hpp"
#include "selfprof/serve/http.hpp"
#include "selfprof/signal/raw_syscall.hpp"
#include "selfprof/status.hpp"

namespace selfprof {
namespace detail {

using serve_clock = std::chrono::steady_clock;

constexpr int kServerNice = 19;  // the server threads' nice value: the lowest priority

// What a route answers: complete response bytes, or a job that makes them on the render thread once
// `due` has come (the bytes are then whatever the job returns).
struct http_answer {
  std::string bytes;
  std::function<std::string()> job;
  serve_clock::time_point due{};
};

// Answers a parsed, authorized request. Runs on the server thread: it must be quick (copies, no
// symbolizing or rendering; those go in the job).
using http_route = std::function<http_answer(const http_request&)>;

struct server_config {
  std::string http;   // the endpoint's address ("" none)
  std::string token;  // bearer token the endpoint asks for ("" none)
  bool control = true;
  double head_timeout_s = 10;  // from accept to the end of the request head
  double io_timeout_s = 30;    // the longest a response may go without a byte written
  std::size_t max_connections = 32;
  // Responses waiting for their time or their render at once; more get a 503. Each profile of the next
  // N seconds holds a copy of the stack table while it waits, so this bounds that memory.
  std::size_t max_jobs = 8;
  http_limits limits;
};

struct server_counters {
  std::uint64_t connections = 0;   // accepted
  std::uint64_t requests = 0;      // complete, authorized requests answered by a route
  std::uint64_t bad_requests = 0;  // answered 4xx/5xx by the parser (400, 405, 414, 431, 505)
  std::uint64_t unauthorized = 0;  // 401 (token) and 403 (peer uid)
  std::uint64_t refused = 0;       // over the connection limit: 503
  std::uint64_t timeouts = 0;      // dropped: head too slow, or no write progress
  std::uint64_t failures = 0;      // accept, write or render failures, and clients gone early
};

// A parsed listening address.
struct listen_address {
  int family = 0;  // AF_INET, AF_INET6, AF_UNIX
  sockaddr_storage addr{};
  socklen_t len = 0;
  bool loopback = false;
  std::string path;  // AF_UNIX
};

inline status parse_listen_address(const std::string& text, listen_address& out) {
  out = listen_address();
  auto bad = [&](const std::string& why) {
    return status::error("selfprof: SELFPROF_HTTP=\"" + text + "\": " + why);
  };
  if (text.rfind("unix:", 0) == 0) {
    const std::string path = text.substr(5);
    sockaddr_un un{};
    if (path.empty() || path[0] != '/') return bad("a unix socket needs an absolute path (unix:/path)");
    if (path.size() >= sizeof un.sun_path) return bad("the socket path is too long");
    un.sun_family = AF_UNIX;
    std::memcpy(un.sun_path, path.c_str(), path.size() + 1);
    std::memcpy(&out.addr, &un, sizeof un);
    out.len = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + path.size() + 1);
    out.family = AF_UNIX;
    out.path = path;
    out.loopback = true;
    return status::ok();
  }
  const std::size_t colon = text.rfind(':');
  if (colon == std::string::npos) return bad("expected HOST:PORT, [IPV6]:PORT or unix:/path");
  std::string host = text.substr(0, colon);
  const std::string port_text = text.substr(colon + 1);
  if (port_text.empty() || port_text.size() > 5 ||
      port_text.find_first_not_of("0123456789") != std::string::npos)
    return bad("the port must be a number from 0 to 65535");
  const unsigned long port = std::stoul(port_text);
  if (port > 65535) return bad("the port must be a number from 0 to 65535");
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') {
    host = host.substr(1, host.size() - 2);
    sockaddr_in6 a{};
    a.sin6_family = AF_INET6;
    a.sin6_port = htons(static_cast<std::uint16_t>(port));
    if (inet_pton(AF_INET6, host.c_str(), &a.sin6_addr) != 1) return bad("not a numeric IPv6 address");
    std::memcpy(&out.addr, &a, sizeof a);
    out.len = sizeof a;
    out.family = AF_INET6;
    out.loopback = IN6_IS_ADDR_LOOPBACK(&a.sin6_addr) ||
                   (IN6_IS_ADDR_V4MAPPED(&a.sin6_addr) && a.sin6_addr.s6_addr[12] == 127);
    return status::ok();
  }
  if (host == "localhost") host = "127.0.0.1";
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<std::uint16_t>(port));
  if (inet_pton(AF_INET, host.c_str(), &a.sin_addr) != 1)
    return bad("not a numeric IPv4 address (names are not resolved; IPv6 goes in brackets)");
  std::memcpy(&out.addr, &a, sizeof a);
  out.len = sizeof a;
  out.family = AF_INET;
  out.loopback = (ntohl(a.sin_addr.s_addr) >> 24) == 127;
  return status::ok();
}

// "127.0.0.1:6060", "[::1]:6060", "unix:/path", "@name" of a bound socket.
inline std::string describe_bound(int fd) {
  sockaddr_storage ss{};
  socklen_t len = sizeof ss;
  if (::getsockname(fd, reinterpret_cast<sockaddr*>(&ss), &len) != 0) return "?";
  char buf[INET6_ADDRSTRLEN] = {0};
  if (ss.ss_family == AF_INET) {
    const auto* a = reinterpret_cast<const sockaddr_in*>(&ss);
    inet_ntop(AF_INET, &a->sin_addr, buf, sizeof buf);
    return std::string(buf) + ":" + std::to_string(ntohs(a->sin_port));
  }
  if (ss.ss_family == AF_INET6) {
    const auto* a = reinterpret_cast<const sockaddr_in6*>(&ss);
    inet_ntop(AF_INET6, &a->sin6_addr, buf, sizeof buf);
    return "[" + std::string(buf) + "]:" + std::to_string(ntohs(a->sin6_port));
  }
  const auto* u = reinterpret_cast<const sockaddr_un*>(&ss);
  const std::size_t n = len > offsetof(sockaddr_un, sun_path) ? len - offsetof(sockaddr_un, sun_path) : 0;
  if (n > 0 && u->sun_path[0] == '\0') return "@" + std::string(u->sun_path + 1, n - 1);
  return "unix:" + std::string(u->sun_path, strnlen(u->sun_path, n));
}

// The control socket's abstract name for `pid` (without the leading NUL).
inline std::string control_socket_name(long pid) { return "selfprof-" + std::to_string(pid); }

// True when the peer of unix socket `fd` runs as our uid or as root.
inline bool peer_uid_allowed(int fd) {
  struct ucred cred {};
  socklen_t len = sizeof cred;
  if (::getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0) return false;
  return cred.uid == ::geteuid() || cred.uid == 0;
}

class http_server {
 public:
  http_server() = default;
  http_server(const http_server&) = delete;
  http_server& operator=(const http_server&) = delete;
  ~http_server() { stop(); }

  // Opens the listeners and starts the loop's thread. A bad endpoint address, or a non-loopback one without
  // a token, is an error; an endpoint address in use or a control socket that cannot be bound is only a
  // note (`notes`), the rest runs. `on_demand`: with the control socket alone, the thread is left to
  // start_on_demand().
  status start(const server_config& cfg, http_route route, std::vector<std::string>& notes,
               bool on_demand = false) {
    stop();
    cfg_ = cfg;
    route_ = std::move(route);
    {
      std::lock_guard<std::mutex> lock(mu_);
      jobs_.clear();
      done_.clear();
    }
    if (!cfg.http.empty()) {
      status st = open_endpoint(notes);
      if (!st) {
        close_listeners();
        return st;
      }
    }
    if (cfg.control) {
      const std::string name = control_socket_name(::getpid());
      sockaddr_un un{};
      un.sun_family = AF_UNIX;
      std::memcpy(un.sun_path + 1, name.data(), name.size());
      const socklen_t len = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + 1 + name.size());
      const int fd = listen_on(AF_UNIX, reinterpret_cast<const sockaddr*>(&un), len);
      if (fd < 0)
        notes.push_back("control socket @" + name + " not opened (" + std::strerror(errno) +
                        "): `selfprof dump` cannot reach this process");
      else {
        listeners_.push_back({fd, kind_control, false});
        control_ = "@" + name;
      }
    }
    if (listeners_.empty()) return status::ok();
    std::lock_guard<std::mutex> lazy(lazy_mu_);
    if (on_demand && listeners_.size() == 1 && listeners_[0].kind == kind_control) {
      lazy_fd_.store(listeners_[0].fd, std::memory_order_release);
      return status::ok();
    }
    status st = io_.start("selfprof-http", &http_server::io_main, this);
    if (!st) close_listeners();
    return st;
  }

  // The control socket while its loop's thread is not started (else -1): readable when a client
  // connects. The watcher then calls start_on_demand().
  int lazy_listener() const { return lazy_fd_.load(std::memory_order_acquire); }

  // Any thread: starts the loop's thread if start() left it to this and stop() has not come since. A
  // failure is counted; the watcher then stops watching (lazy_listener() is -1 either way).
  void start_on_demand() {
    std::lock_guard<std::mutex> lazy(lazy_mu_);
    if (lazy_fd_.load(std::memory_order_relaxed) < 0) return;  // started, stopped, or not on demand
    lazy_fd_.store(-1, std::memory_order_release);
    if (!io_.start("selfprof-http", &http_server::io_main, this)) ++n_.failures;
  }

  // Stops the threads and closes every socket; a client waiting for a profile sees its connection
  // closed.
  void stop() {
    {
      std::lock_guard<std::mutex> lazy(lazy_mu_);
      lazy_fd_.store(-1, std::memory_order_release);
    }
    io_.stop();
    render_.stop();
    for (auto& c : conns_) close_conn(c);
    conns_.clear();
    close_listeners();
    std::lock_guard<std::mutex> lock(mu_);
    jobs_.clear();
    done_.clear();
  }

  // A forked child: the threads are not there; its copies of the sockets are closed (a unix socket's
  // path belongs to the parent and stays).
  void abandon_after_fork() {
    io_.abandon_after_fork();
    render_.abandon_after_fork();
    new (&lazy_mu_) std::mutex();
    lazy_fd_.store(-1, std::memory_order_relaxed);
    for (auto& c : conns_)
      if (c.fd >= 0) ::close(c.fd);
    conns_.clear();
    for (auto& l : listeners_) ::close(l.fd);
    listeners_.clear();
    unix_path_.clear();
    new (&mu_) std::mutex();
    jobs_.clear();
    done_.clear();
  }

  bool running() const { return io_.running(); }
  // The server's threads now (the render thread once started).
  std::vector<pid_t> tids() const {
    std::vector<pid_t> t;
    for (pid_t id : {io_.tid(), render_.tid()})
      if (id != 0) t.push_back(id);
    return t;
  }
  const std::string& address() const { return address_; }  // the endpoint as bound ("" none)
  const std::string& control_name() const { return control_; }

  server_counters counters() const {
    server_counters c;
    c.connections = n_.connections.load();
    c.requests = n_.requests.load();
    c.bad_requests = n_.bad_requests.load();
    c.unauthorized = n_.unauthorized.load();
    c.refused = n_.refused.load();
    c.timeouts = n_.timeouts.load();
    c.failures = n_.failures.load();
    return c;
  }

 private:
  enum listener_kind { kind_tcp, kind_unix, kind_control };
  struct listener {
    int fd;
    listener_kind kind;
    bool token;  // ask for the bearer token
  };
  enum conn_state { reading, waiting, writing, draining };
  struct conn {
    int fd = -1;
    std::uint64_t id = 0;
    listener_kind kind = kind_tcp;
    bool token = false;
    conn_state state = reading;
    bool head_only = false;
    bool forbidden = false;  // a unix peer of another uid: answered 403 once its request is read
    std::string in, out;
    std::size_t sent = 0;
    serve_clock::time_point deadline{};
    std::shared_ptr<std::atomic<bool>> cancelled;
  };
  struct job {
    std::uint64_t conn = 0;
    serve_clock::time_point due{};
    std::function<std::string()> make;
    std::shared_ptr<std::atomic<bool>> cancelled;
  };
  struct finished {
    std::uint64_t conn = 0;
    std::string bytes;
  };
  struct atomic_counters {
    std::atomic<std::uint64_t> connections{0}, requests{0}, bad_requests{0}, unauthorized{0}, refused{0},
        timeouts{0}, failures{0};
  };

  static int listen_on(int family, const sockaddr* a, socklen_t len) {
    int fd = ::socket(family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0) return -1;
    fd = keep_fd_high(fd);
    if (family != AF_UNIX) {
      const int one = 1;
      ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
      if (family == AF_INET6) ::setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &one, sizeof one);
    }
    if (::bind(fd, a, len) != 0 || ::listen(fd, 64) != 0) {
      const int e = errno;
      ::close(fd);
      errno = e;
      return -1;
    }
    return fd;
  }

  status open_endpoint(std::vector<std::string>& notes) {
    listen_address la;
    status st = parse_listen_address(cfg_.http, la);
    if (!st) return st;
    if (!la.loopback && cfg_.token.empty())
      return status::error("selfprof: SELFPROF_HTTP=\"" + cfg_.http +
                           "\" is not a loopback address: refusing to serve profiles there without a "
                           "bearer token (set SELFPROF_HTTP_TOKEN_FILE, or bind 127.0.0.1 / [::1] / unix:)");
    if (la.family == AF_UNIX) {
      struct stat sb {};
      if (::lstat(la.path.c_str(), &sb) == 0) {
        if (!S_ISSOCK(sb.st_mode) || sb.st_uid != ::geteuid())
          return status::error("selfprof: SELFPROF_HTTP=\"" + cfg_.http +
                               "\": the path exists and is not a socket of ours; not replacing it");
        ::unlink(la.path.c_str());  // a socket left by an earlier run of ours
      }
    }
    const int fd = listen_on(la.family, reinterpret_cast<const sockaddr*>(&la.addr), la.len);
    if (fd < 0) {
      // The address is fine but taken (another instance, a child that exec'd with the same environment):
      // sampling goes on without the endpoint, and says so.
      const std::string why = "SELFPROF_HTTP=\"" + cfg_.http + "\": cannot listen (" + std::strerror(errno) +
                              "): no profile endpoint in this process";
      notes.push_back(why);
      std::fprintf(stderr, "selfprof: %s\n", why.c_str());
      return status::ok();
    }
    if (la.family == AF_UNIX) {
      // Bound with the umask's mode; 0600 before the first accept (and peers are checked by uid anyway).
      if (::chmod(la.path.c_str(), 0600) != 0) notes.push_back("cannot chmod 0600 " + la.path);
      unix_path_ = la.path;
    }
    listeners_.push_back({fd, la.family == AF_UNIX ? kind_unix : kind_tcp, !cfg_.token.empty()});
    address_ = describe_bound(fd);
    return status::ok();
  }

  void close_listeners() {
    for (auto& l : listeners_) ::close(l.fd);
    listeners_.clear();
    if (!unix_path_.empty()) ::unlink(unix_path_.c_str());
    unix_path_.clear();
    address_.clear();
    control_.clear();
  }

  void close_conn(conn& c) {
    if (c.cancelled) c.cancelled->store(true, std::memory_order_relaxed);
    if (c.fd >= 0) ::close(c.fd);
    c.fd = -1;
  }

  static serve_clock::duration secs(double s) {
    return std::chrono::duration_cast<serve_clock::duration>(std::chrono::duration<double>(s));
  }

  // Both threads yield to the application: a scrape must not take CPU the program wants (under full load
  // a render waits for the CPU share a nice-19 thread gets; the client's own timeout bounds that).
  static void io_main(void* self) {
    ::setpriority(PRIO_PROCESS, static_cast<id_t>(raw_gettid()), kServerNice);
    static_cast<http_server*>(self)->io_loop();
  }
  static void render_main(void* self) {
    ::setpriority(PRIO_PROCESS, static_cast<id_t>(raw_gettid()), kServerNice);
    static_cast<http_server*>(self)->render_loop();
  }

  void io_loop() {
    std::vector<pollfd> fds;
    for (;;) {
      fds.clear();
      fds.push_back({io_.wake_fd(), POLLIN, 0});
      for (auto& l : listeners_) fds.push_back({l.fd, POLLIN, 0});
      const std::size_t first_conn = fds.size();
      auto now = serve_clock::now();
      serve_clock::time_point next = now + std::chrono::seconds(60);
      for (auto& c : conns_) {
        short ev = c.state == reading || c.state == draining ? POLLIN
                   : c.state == writing                      ? POLLOUT
                                                             : POLLRDHUP;
        fds.push_back({c.fd, ev, 0});
        if (c.state != waiting) next = std::min(next, c.deadline);
      }
      const auto wait = std::chrono::duration_cast<std::chrono::milliseconds>(next - now).count() + 1;
      const int n = ::poll(fds.data(), fds.size(), static_cast<int>(std::max<long long>(0, wait)));
      if (io_.stopping()) return;
      if (n > 0 && (fds[0].revents & POLLIN)) {
        std::uint64_t v;
        ssize_t r = ::read(io_.wake_fd(), &v, sizeof v);
        (void)r;
      }
      take_finished();
      now = serve_clock::now();
      // Connections first (the vector changes when new ones are accepted).
      for (std::size_t i = 0; i < conns_.size() && first_conn + i < fds.size(); ++i) {
        conn& c = conns_[i];
        const short re = fds[first_conn + i].revents;
        if (c.fd < 0) continue;
        if (c.state == reading && (re & (POLLIN | POLLHUP | POLLERR)))
          read_some(c);
        else if (c.state == writing && (re & (POLLOUT | POLLHUP | POLLERR)))
          write_some(c);
        else if (c.state == draining && (re & (POLLIN | POLLHUP | POLLERR)))
          drain(c);  // the client's close ends the lingering at once, not at its deadline
        else if (c.state == waiting && (re & (POLLRDHUP | POLLHUP | POLLERR))) {
          ++n_.failures;  // the client left before its profile was ready
          close_conn(c);
        }
        if (c.fd >= 0 && c.state != waiting && now >= c.deadline) {
          if (c.state == reading && !c.in.empty() && c.in.size() < 16384) {
            // Tell a slow client why, best effort, then drop it.
            const std::string r = http_error_response(408, "the request head took too long");
            ssize_t w = ::send(c.fd, r.data(), r.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
            (void)w;
          }
          if (c.state != draining) ++n_.timeouts;
          close_conn(c);
        }
      }
      conns_.erase(std::remove_if(conns_.begin(), conns_.end(), [](const conn& c) { return c.fd < 0; }),
                   conns_.end());
      for (std::size_t i = 0; i < listeners_.size(); ++i)
        if (fds[1 + i].revents & POLLIN) accept_all(listeners_[i]);
    }
  }

  void accept_all(const listener& l) {
    for (int k = 0; k < 64; ++k) {
      int fd = ::accept4(l.fd, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
      if (fd < 0) {
        if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) ++n_.failures;
        return;
      }
      fd = move_fd_high(fd).fd;
      ++n_.connections;
      if (conns_.size() >= cfg_.max_connections) {
        ++n_.refused;
        const std::string r = http_error_response(503, "too many connections at once; try again");
        ssize_t w = ::send(fd, r.data(), r.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
        (void)w;
        ::close(fd);
        continue;
      }
      conn c;
      c.fd = fd;
      c.id = ++next_id_;
      c.kind = l.kind;
      c.token = l.token;
      c.deadline = serve_clock::now() + secs(cfg_.head_timeout_s);
      c.cancelled = std::make_shared<std::atomic<bool>>(false);
      c.forbidden = l.kind != kind_tcp && !peer_uid_allowed(fd);
      conns_.push_back(std::move(c));
    }
  }

  void respond(conn& c, std::string bytes) {
    if (c.head_only) {
      const std::size_t end = bytes.find("\r\n\r\n");
      if (end != std::string::npos) bytes.resize(end + 4);
    }
    c.out = std::move(bytes);
    c.sent = 0;
    c.state = writing;
    c.deadline = serve_clock::now() + secs(cfg_.io_timeout_s);
    write_some(c);
  }

  void read_some(conn& c) {
    char buf[4096];
    for (;;) {
      const ssize_t n = ::recv(c.fd, buf, sizeof buf, MSG_DONTWAIT);
      if (n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)) {
        close_conn(c);  // the client left before its request was complete
        return;
      }
      if (n < 0) break;
      c.in.append(buf, static_cast<std::size_t>(n));
      if (c.in.size() > cfg_.limits.max_head_bytes + 4) break;  // enough to judge
    }
    http_request req;
    const http_parse_result r = parse_http_request(c.in, req, cfg_.limits);
    if (r.state == http_parse::incomplete) return;
    c.in.clear();
    c.in.shrink_to_fit();
    if (c.forbidden) {
      ++n_.unauthorized;
      c.head_only = false;
      respond(c, http_error_response(403, "this socket serves only its owner's uid and root"));
      return;
    }
    if (r.state == http_parse::bad) {
      ++n_.bad_requests;
      c.head_only = false;
      respond(c, http_error_response(r.status, r.reason));
      return;
    }
    c.head_only = req.method == "HEAD";
    if (c.token && !token_ok(req)) {
      ++n_.unauthorized;
      respond(c, http_error_response(401, "a bearer token is required (Authorization: Bearer ...)"));
      return;
    }
    ++n_.requests;
    http_answer a;
    try {
      a = route_(req);
    } catch (...) {
      ++n_.failures;
      respond(c, http_error_response(500, "the request could not be answered (out of memory?)"));
      return;
    }
    if (!a.job) {
      if (a.bytes.size() > 9 && (a.bytes[9] == '4' || a.bytes[9] == '5')) ++n_.bad_requests;
      respond(c, std::move(a.bytes));
      return;
    }
    // The io thread is the only one that starts the render thread; stop() joins the io thread first.
    if (!render_.running() && !render_.start("selfprof-render", &http_server::render_main, this)) {
      ++n_.failures;
      respond(c, http_error_response(503, "the profile cannot be made now (no thread); try again later"));
      return;
    }
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (jobs_.size() < cfg_.max_jobs) {
        c.state = waiting;
        jobs_.push_back({c.id, a.due, std::move(a.job), c.cancelled});
        render_.wake();
        return;
      }
    }
    ++n_.refused;
    respond(c, http_error_response(503, "too many profiles in the making at once; try again later"));
  }

  bool token_ok(const http_request& req) const {
    if (!req.has_authorization) return false;
    const std::string& v = req.authorization;
    if (v.size() < 7 || !http_equal_ci(std::string_view(v).substr(0, 7), "bearer ")) return false;
    std::string_view given = std::string_view(v).substr(7);
    while (!given.empty() && given.front() == ' ') given.remove_prefix(1);
    return http_equal_constant_time(given, cfg_.token);
  }

  void write_some(conn& c) {
    while (c.sent < c.out.size()) {
      const ssize_t n =
          ::send(c.fd, c.out.data() + c.sent, c.out.size() - c.sent, MSG_NOSIGNAL | MSG_DONTWAIT);
      if (n < 0) {
        if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) return;
        ++n_.failures;
        close_conn(c);
        return;
      }
      c.sent += static_cast<std::size_t>(n);
      c.deadline = serve_clock::now() + secs(cfg_.io_timeout_s);
    }
    // A lingering close: what the client still sends (the rest of a refused request) is read and dropped
    // for a moment, so closing with unread bytes does not reset the connection before it read the answer.
    ::shutdown(c.fd, SHUT_WR);
    c.out.clear();
    c.out.shrink_to_fit();
    c.state = draining;
    c.sent = 0;
    c.deadline = serve_clock::now() + std::chrono::seconds(1);
    drain(c);
  }

  void drain(conn& c) {
    char buf[4096];
    for (;;) {
      const ssize_t n = ::recv(c.fd, buf, sizeof buf, MSG_DONTWAIT);
      if (n > 0 && (c.sent += static_cast<std::size_t>(n)) < 65536) continue;
      if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) return;
      close_conn(c);  // the client closed, an error, or too much
      return;
    }
  }

  void take_finished() {
    std::vector<finished> got;
    {
      std::lock_guard<std::mutex> lock(mu_);
      got.swap(done_);
    }
    for (auto& f : got)
      for (auto& c : conns_)
        if (c.id == f.conn && c.fd >= 0 && c.state == waiting) respond(c, std::move(f.bytes));
  }

  void render_loop() {
    for (;;) {
      job next;
      std::int64_t wait_ns = -1;
      {
        std::lock_guard<std::mutex> lock(mu_);
        jobs_.erase(std::remove_if(jobs_.begin(), jobs_.end(),
                                   [](const job& j) { return j.cancelled->load(std::memory_order_relaxed); }),
                    jobs_.end());
        auto it = std::min_element(jobs_.begin(), jobs_.end(),
                                   [](const job& a, const job& b) { return a.due < b.due; });
        const auto now = serve_clock::now();
        if (it != jobs_.end()) {
          if (it->due <= now) {
            next = std::move(*it);
            jobs_.erase(it);
          } else {
            wait_ns = std::chrono::duration_cast<std::chrono::nanoseconds>(it->due - now).count();
          }
        }
      }
      if (!next.make) {
        if (!render_.wait_ns(wait_ns)) return;
        continue;
      }
      std::string bytes;
      try {
        bytes = next.make();
      } catch (...) {
        ++n_.failures;
        bytes = http_error_response(500, "the profile could not be made (out of memory?)");
      }
      {
        std::lock_guard<std::mutex> lock(mu_);
        done_.push_back({next.conn, std::move(bytes)});
      }
      io_.wake();
      if (render_.stopping()) return;
    }
  }

  server_config cfg_;
  http_route route_;
  std::vector<listener> listeners_;
  std::string unix_path_, address_, control_;
  std::mutex lazy_mu_;            // start_on_demand() against stop()
  std::atomic<int> lazy_fd_{-1};  // -1 once stopped: no thread starts on demand after stop()
  std::vector<conn> conns_;       // the io thread's
  std::uint64_t next_id_ = 0;
  std::mutex mu_;  // jobs_ and done_
  std::vector<job> jobs_;
  std::vector<finished> done_;
  atomic_counters n_;
  worker io_, render_;
};

}  // namespace detail
}  // namespace selfprof
