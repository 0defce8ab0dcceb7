// The observer effect of selfprof's threads on a single-threaded program: glibc and libstdc++ take
// cheaper paths while a process has one thread (malloc skips the arena lock, stdio skips its stream
// locks, shared_ptr counts without atomic instructions), and the first pthread_create() leaves those
// paths for good. This program times such operations on the main thread in one of three modes, each in
// a fresh process:
//   none      nothing else in the process
//   thread    one extra thread that only sleeps (the glibc effect alone, no sampling)
//   selfprof  selfprof started at --hz (its threads and its sampling)
// and prints one line per operation: "<op> <ns per operation>". bench/observer_effect.sh runs the modes
// interleaved and prints medians and ratios. Not a test: nothing here asserts on time.
#include <pthread.h>
#include <time.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>

#include <selfprof.hpp>

namespace {

std::int64_t thread_cpu_ns() {
  timespec ts;
  ::clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<std::int64_t>(ts.tv_sec) * 1000000000 + ts.tv_nsec;
}

volatile std::uint64_t g_sink;

template <class Op>
double ns_per_op(std::uint64_t n, Op op) {
  const std::int64_t t0 = thread_cpu_ns();
  for (std::uint64_t i = 0; i < n; ++i) op(i);
  return static_cast<double>(thread_cpu_ns() - t0) / static_cast<double>(n);
}

void* sleeper(void*) {
  for (;;) ::pause();
  return nullptr;
}

}  // namespace

int main(int argc, char** argv) {
  std::string mode = argc > 1 ? argv[1] : "none";
  double hz = argc > 2 ? std::atof(argv[2]) : 99;
  std::uint64_t scale = argc > 3 ? std::strtoull(argv[3], nullptr, 10) : 1;
  if (mode == "thread") {
    pthread_t t;
    if (::pthread_create(&t, nullptr, sleeper, nullptr) != 0) return 2;
    ::pthread_detach(t);
  } else if (mode == "selfprof") {
    selfprof::options o;
    o.hz = hz;
    o.out.clear();  // no profile written: only the effect on the program is measured
    if (!selfprof::start(o)) return 3;
  } else if (mode != "none") {
    std::fprintf(stderr, "usage: %s none|thread|selfprof [hz] [scale]\n", argv[0]);
    return 2;
  }
  const std::uint64_t n = 4000000 * scale;
  std::printf("malloc_free %.2f\n", ns_per_op(n, [](std::uint64_t i) {
                void* p = std::malloc(16 + (i & 63));
                g_sink = g_sink + reinterpret_cast<std::uintptr_t>(p);
                std::free(p);
              }));
  std::FILE* f = std::fopen("/dev/null", "w");
  std::printf("stdio_putc %.2f\n",
              ns_per_op(n, [f](std::uint64_t i) { std::fputc(static_cast<int>(i & 0x7f), f); }));
  std::fclose(f);
  auto shared = std::make_shared<std::uint64_t>(1);
  std::printf("shared_ptr_copy %.2f\n", ns_per_op(n, [&shared](std::uint64_t) {
                std::shared_ptr<std::uint64_t> copy = shared;
                g_sink = g_sink + *copy;
              }));
  std::mutex mu;
  std::printf("mutex_lock_unlock %.2f\n", ns_per_op(n, [&mu](std::uint64_t) {
                std::lock_guard<std::mutex> lock(mu);
                g_sink = g_sink + 1;
              }));
  if (mode == "selfprof") selfprof::stop();
  return 0;
}
