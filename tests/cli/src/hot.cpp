// record_test.sh target (C++): four std::threads burn CPU in hot_cpp_worker (so the preload library's
// pthread_create interposition is exercised), the main thread waits; prints a line, exits with argv[1].
#include <cstdio>
#include <cstdlib>
#include <thread>
#include <vector>

namespace {
volatile unsigned long sink;
}

__attribute__((noinline)) unsigned long hot_cpp_worker(unsigned long n) {
  unsigned long acc = 3;
  for (unsigned long i = 0; i < n; ++i) acc = (acc ^ i) * 0x9e3779b97f4a7c15ul;
  return acc;
}

int main(int argc, char** argv) {
  const int code = argc > 1 ? std::atoi(argv[1]) : 0;
  const unsigned long n = argc > 2 ? std::strtoul(argv[2], nullptr, 10) : 150000000ul;
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) threads.emplace_back([n] { sink = hot_cpp_worker(n); });
  for (auto& t : threads) t.join();
  std::printf("hot.cpp done %d\n", code);
  return code;
}
