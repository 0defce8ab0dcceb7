// Torture: a dump signal that arrives while the exit dump is written must not kill the process (the
// signal's default action is to terminate): selfprof keeps it taken until the last profile is written,
// and the exit status stays the program's own (issue 15, item 3).
// ctest-labels: no_tsan
// Not under TSan: it defers asynchronous signals, and kills children that start threads after fork.
#include <doctest/doctest.h>

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <thread>

#include "../integration/workload.hpp"

TEST_CASE("torture: a SIGUSR2 every 2 ms while the program exits: status 0, profile written") {
  wl::apply_test_environment();
  int died = 0, missing = 0;
  for (int run = 0; run < 10; ++run) {
    wl::temp_dir dir("selfprof-late-signal");
    const std::string out = dir.path + "/exit.folded";
    int started[2];
    REQUIRE(pipe(started) == 0);
    std::fflush(nullptr);
    const pid_t child = fork();
    REQUIRE(child >= 0);
    if (child == 0) {
      close(started[0]);
      setenv("SELFPROF_OUT", out.c_str(), 1);
      setenv("SELFPROF_HZ", "250", 1);
      if (!SELFPROF_START()) _exit(3);
      const char go = 1;
      if (write(started[1], &go, 1) != 1) _exit(4);  // selfprof owns SIGUSR2 from here on
      wl::run_rounds(100000000LL);
      std::exit(7);  // the exit dump runs in atexit; the status must stay 7
    }
    close(started[1]);
    char go = 0;
    REQUIRE(read(started[0], &go, 1) == 1);
    close(started[0]);
    std::atomic<bool> done{false};
    std::thread sender([&] {
      while (!done) {
        kill(child, SIGUSR2);
        std::this_thread::sleep_for(std::chrono::milliseconds(2));
      }
    });
    int status = 0;
    REQUIRE(waitpid(child, &status, 0) == child);
    done = true;
    sender.join();
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 7) ++died;
    if (selfprof::detail::read_small_file(out).empty()) ++missing;
  }
  CHECK(died == 0);
  CHECK(missing == 0);
}
