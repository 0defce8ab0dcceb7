// Torture: fault signals are never taken for sampling or dumps, so the program still dies of its own
// faults instead of looping in a handler (issue 15, item 5).
// ctest-labels: no_tsan no_asan
// Not under the sanitizers: they take SIGSEGV themselves.
#include <doctest/doctest.h>

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <thread>

#include "../integration/workload.hpp"

namespace {
volatile int* volatile g_null = nullptr;
}

TEST_CASE(
    "torture: SELFPROF_SIGNAL=11 and SELFPROF_SAMPLE_SIGNAL=SIGSEGV are refused; a null dereference kills") {
  wl::apply_test_environment();
  for (const char* value : {"11", "SIGSEGV", "SEGV", "7"}) {
    INFO(value);
    int pipe_fds[2];
    REQUIRE(pipe(pipe_fds) == 0);
    std::fflush(nullptr);
    const pid_t child = fork();
    REQUIRE(child >= 0);
    if (child == 0) {
      dup2(pipe_fds[1], 2);  // stderr: the warnings
      setenv("SELFPROF_SIGNAL", value, 1);
      setenv("SELFPROF_SAMPLE_SIGNAL", value, 1);
      if (!SELFPROF_START()) _exit(3);
      const selfprof::stats st = selfprof::get_stats();
      if (st.dump_signal == SIGSEGV || st.sample_signal == SIGSEGV || st.dump_signal == SIGBUS ||
          st.sample_signal == SIGBUS)
        _exit(4);
      wl::run_rounds(20000000LL);
      *g_null = 1;  // the program's own fault
      _exit(5);
    }
    close(pipe_fds[1]);
    int status = 0;
    pid_t w = 0;
    for (int i = 0; i < 1000 && (w = waitpid(child, &status, WNOHANG)) == 0; ++i)
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    if (w == 0) {  // an endless loop: the hang this guards against
      kill(child, SIGKILL);
      waitpid(child, &status, 0);
      FAIL("the child did not die of its fault within 10 s");
    }
    std::string err;
    char buf[512];
    for (ssize_t n; (n = read(pipe_fds[0], buf, sizeof buf)) > 0;)
      err.append(buf, static_cast<std::size_t>(n));
    close(pipe_fds[0]);
    CHECK(WIFSIGNALED(status));
    CHECK(WTERMSIG(status) == SIGSEGV);
    CHECK(err.find("SELFPROF_SIGNAL") != std::string::npos);
    CHECK(err.find("SELFPROF_SAMPLE_SIGNAL") != std::string::npos);
  }
}
