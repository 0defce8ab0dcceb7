// A minimal program using an installed or embedded selfprof, built by tests/packaging/run.sh.
// Context: setup only (a test program).
#include <selfprof.hpp>

#include <sys/stat.h>

#include <cstdio>
#include <cstring>
#include <string>

#ifndef SELFPROF_EXPECTED_VERSION
#error "build with -DSELFPROF_EXPECTED_VERSION=\"x.y.z\""
#endif

namespace {

volatile unsigned long sink_;

void spin() {
  for (unsigned long i = 0; i < 20000000UL; ++i) sink_ = sink_ + i;
}

}  // namespace

int main() {
  if (std::strcmp(SELFPROF_VERSION_STRING, SELFPROF_EXPECTED_VERSION) != 0) {
    std::fprintf(stderr, "header version %s, package version %s\n", SELFPROF_VERSION_STRING,
                 SELFPROF_EXPECTED_VERSION);
    return 1;
  }
  selfprof::profile p;
  p.threads.push_back(selfprof::thread_info{42, "worker"});
  if (p.thread_name(42) != "worker" || !p.thread_name(7).empty()) return 1;
  selfprof::status failed = selfprof::status::error("consumer: expected failure");
  if (failed || failed.message().empty() || !selfprof::status::ok()) return 1;

#if defined(SELFPROF_START) && defined(SELFPROF_STOP)
  // The real thing: sample this process, write a folded profile, stop.
  const std::string path = "consumer.folded";
  std::remove(path.c_str());
  SELFPROF_START();
  spin();
  (void)selfprof::dump(path.c_str());
  SELFPROF_STOP();
  struct stat st;
  if (::stat(path.c_str(), &st) != 0) {
    std::fprintf(stderr, "selfprof::dump did not write %s\n", path.c_str());
    return 1;
  }
#else
  spin();
#endif
  std::printf("consumer: selfprof %s, SELFPROF_HAS_LIBDW=%d SELFPROF_HAS_ZLIB=%d\n", SELFPROF_VERSION_STRING,
              SELFPROF_HAS_LIBDW, SELFPROF_HAS_ZLIB);
  return 0;
}
