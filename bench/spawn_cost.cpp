// What one started process pays for the preload library (issue 21 item 7): rounds of N posix_spawn()s of a
// program (default /usr/bin/true), one block per environment, the environments alternated within each
// round so that load on the machine hits them alike. The CPU of each block is the children's user+system
// time from getrusage(RUSAGE_CHILDREN), which counts every thread of each child (selfprof's included) and
// nothing of this loop. Prints each round's CPU per process, then the mean and the difference against
// the first environment.
//
// Usage: bench_spawn_cost ROUNDS N [PROGRAM] -- ENV... [-- ENV...]...
//   each "--" starts an environment: VAR=VALUE words added to this process's environment ("-" for none).
// Example (plain, the library, the library with the CPU-timer source; L=$PWD/libselfprof-preload.so):
//   bench_spawn_cost 15 100 /usr/bin/true -- - -- LD_PRELOAD=$L -- LD_PRELOAD=$L SELFPROF_SOURCE=itimer
#include <spawn.h>
#include <sys/resource.h>
#include <sys/wait.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

extern char** environ;

namespace {

double children_cpu_ms() {
  struct rusage ru {};
  getrusage(RUSAGE_CHILDREN, &ru);
  return (static_cast<double>(ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) * 1e6 +
          static_cast<double>(ru.ru_utime.tv_usec + ru.ru_stime.tv_usec)) /
         1e3;
}

int usage() {
  std::fprintf(stderr, "usage: bench_spawn_cost ROUNDS N [PROGRAM] -- ENV... [-- ENV...]...\n");
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 5) return usage();
  const int rounds = std::atoi(argv[1]);
  const int n = std::atoi(argv[2]);
  int at = 3;
  std::string program = "/usr/bin/true";
  if (std::strcmp(argv[at], "--") != 0) program = argv[at++];
  if (rounds < 1 || n < 1 || at >= argc || std::strcmp(argv[at], "--") != 0) return usage();

  std::vector<std::vector<char*>> envs;  // each: this environment plus the set's words, null-terminated
  std::vector<std::string> names;
  for (; at < argc; ++at) {
    if (std::strcmp(argv[at], "--") == 0) {
      envs.emplace_back();
      for (char** e = environ; *e; ++e) envs.back().push_back(*e);
      names.emplace_back();
      continue;
    }
    if (std::strcmp(argv[at], "-") == 0) continue;
    envs.back().push_back(argv[at]);
    names.back() += (names.back().empty() ? "" : " ") + std::string(argv[at]);
  }
  for (auto& e : envs) e.push_back(nullptr);

  char* child_argv[] = {const_cast<char*>(program.c_str()), nullptr};
  std::vector<double> sum(envs.size(), 0.0);
  for (int r = 0; r < rounds; ++r) {
    for (std::size_t s = 0; s < envs.size(); ++s) {
      const double before = children_cpu_ms();
      for (int i = 0; i < n; ++i) {
        pid_t pid = 0;
        if (posix_spawn(&pid, program.c_str(), nullptr, nullptr, child_argv, envs[s].data()) != 0) {
          std::perror(program.c_str());
          return 1;
        }
        int status = 0;
        waitpid(pid, &status, 0);
      }
      const double per = (children_cpu_ms() - before) / n;
      sum[s] += per;
      std::printf("%8.3f", per);
    }
    std::printf("\n");
  }
  std::printf("\nms of CPU per process, mean of %d rounds of %d runs of %s:\n", rounds, n, program.c_str());
  for (std::size_t s = 0; s < envs.size(); ++s) {
    const double mean = sum[s] / rounds;
    std::printf("%8.3f  %+7.3f  %s\n", mean, mean - sum[0] / rounds,
                names[s].empty() ? "(plain)" : names[s].c_str());
  }
  return 0;
}
