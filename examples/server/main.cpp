// A small HTTP-like server on loopback with a hot path, profiled in production by SIGUSR2.
//
//   ./example_server [--port N] [--threads N] [--load SECONDS] [--seconds N]
//
// It answers "GET /quote?n=<items>" with a price computed by a deliberately slow routine. With
// --load it also starts clients that keep it busy (so the README walk-through needs nothing else).
// `kill -USR2 <pid>` writes selfprof-<pid>-<n>.svg (or SELFPROF_OUT) while it keeps serving.
#include <selfprof.hpp>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

namespace server {

std::atomic<bool> stopping{false};
std::atomic<unsigned long> served{0};

// The hot path: a price from a slow series expansion, as a legacy pricing library might do it.
__attribute__((noinline)) double price_series(int items) {
  double price = 0;
  for (int i = 1; i < 400000 + items; ++i) price += std::sin(i * 0.001) / (1.0 + i % 97);
  return price;
}

__attribute__((noinline)) std::string format_response(double price) {
  char body[128];
  int n = std::snprintf(body, sizeof body, "{\"price\": %.4f}\n", price);
  return "HTTP/1.0 200 OK\r\nContent-Length: " + std::to_string(n) + "\r\n\r\n" + body;
}

__attribute__((noinline)) int parse_items(const char* request) {
  const char* q = std::strstr(request, "n=");
  return q ? std::atoi(q + 2) : 1;
}

__attribute__((noinline)) void handle(int fd) {
  char buf[1024];
  ssize_t got = ::read(fd, buf, sizeof buf - 1);
  if (got > 0) {
    buf[got] = 0;
    std::string reply = format_response(price_series(parse_items(buf)));
    ssize_t w = ::write(fd, reply.data(), reply.size());
    (void)w;
    served.fetch_add(1);
  }
  ::close(fd);
}

void serve(int listener) {
  while (!stopping) {
    int fd = ::accept(listener, nullptr, nullptr);
    if (fd < 0) continue;
    handle(fd);
  }
}

void client(int port) {
  while (!stopping) {
    int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(static_cast<uint16_t>(port));
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0) {
      const char req[] = "GET /quote?n=250 HTTP/1.0\r\n\r\n";
      ssize_t w = ::write(fd, req, sizeof req - 1);
      (void)w;
      char buf[256];
      while (::read(fd, buf, sizeof buf) > 0) {
      }
    }
    ::close(fd);
  }
}

}  // namespace server

int main(int argc, char** argv) {
  int port = 0, threads = 2;
  double load = 0, seconds = 0;
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string a = argv[i];
    if (a == "--port")
      port = std::atoi(argv[i + 1]);
    else if (a == "--threads")
      threads = std::atoi(argv[i + 1]);
    else if (a == "--load")
      load = std::atof(argv[i + 1]);
    else if (a == "--seconds")
      seconds = std::atof(argv[i + 1]);
  }
  if (!SELFPROF_START()) return 1;

  int listener = ::socket(AF_INET, SOCK_STREAM, 0);
  int one = 1;
  ::setsockopt(listener, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);  // loopback only
  if (::bind(listener, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0 || ::listen(listener, 64) != 0) {
    std::perror("bind/listen");
    return 1;
  }
  socklen_t len = sizeof addr;
  ::getsockname(listener, reinterpret_cast<sockaddr*>(&addr), &len);
  port = ntohs(addr.sin_port);
  std::printf("serving on 127.0.0.1:%d, pid %d; kill -USR2 %d writes a flame graph\n", port, getpid(),
              getpid());
  std::fflush(stdout);

  std::vector<std::thread> pool;
  for (int i = 0; i < threads; ++i) pool.emplace_back(server::serve, listener);
  std::vector<std::thread> clients;
  if (load > 0)
    for (int i = 0; i < 2; ++i) clients.emplace_back(server::client, port);

  auto start = std::chrono::steady_clock::now();
  double limit = seconds > 0 ? seconds : (load > 0 ? load : 0);
  while (limit == 0 ||
         std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() < limit)
    std::this_thread::sleep_for(std::chrono::milliseconds(100));

  server::stopping = true;
  for (auto& c : clients) c.join();
  ::shutdown(listener, SHUT_RDWR);
  for (int i = 0; i < threads; ++i) {  // wake blocked accept() calls
    int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    ::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr);
    ::close(fd);
  }
  ::close(listener);
  for (auto& t : pool) t.join();
  std::printf("served %lu requests\n", server::served.load());
  return 0;
}
