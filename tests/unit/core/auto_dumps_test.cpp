// The automatic dumps: the dumper thread answers dump requests through the one dump path, answers a burst
// of requests that arrive while it writes with one dump, writes on its interval, and takes the exit dump
// of a process ending through _exit().
#include <doctest/doctest.h>

#include <dirent.h>
#include <poll.h>
#include <signal.h>
#include <stdlib.h>

#include <atomic>
#include <chrono>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <selfprof/core/auto_dumps.hpp>

namespace {

using namespace selfprof::detail;

// The parts of a session, without sampling: records are put into the ring by hand.
struct fake_session {
  std::vector<std::uint64_t> memory;
  sample_ring ring;
  sample_store store;
  thread_registry threads;
  session_info session;
  shared_symbolizer symbols;
  snapshot_maker maker{session_parts{&ring, &store, &threads, &session, &symbols}};

  explicit fake_session(const selfprof::options& o) {
    memory.assign(512 * sample_ring::stride_for(8) / 8, 0);
    ring.init(memory.data(), 512, 8);
    store_config sc;
    sc.max_depth = 8;
    store.begin(sc);
    threads.begin(nullptr, source_config{});
    maker.begin(o, handler_counts::now());
  }
  void put(std::uint64_t leaf, std::uint32_t weight) {
    std::uint64_t pos = 0;
    ring_slot* s = ring.claim(pos);
    REQUIRE(s != nullptr);
    s->header = sample_header{};
    s->header.tid = 7;
    s->header.depth = 2;
    s->header.weight = weight;
    s->pcs()[0] = leaf;
    s->pcs()[1] = 0x2000;
    sample_ring::publish(s, pos);
  }
};

std::string dumps_temp_dir() {
  char t[] = "/tmp/selfprof-autodumps-XXXXXX";
  REQUIRE(mkdtemp(t) != nullptr);
  return t;
}

std::size_t count_files(const std::string& dir) {
  std::size_t n = 0;
  if (DIR* d = opendir(dir.c_str())) {
    while (dirent* e = readdir(d))
      if (e->d_name[0] != '.') ++n;
    closedir(d);
  }
  return n;
}

void remove_dir(const std::string& dir) {
  const std::string cmd = "rm -rf '" + dir + "'";
  CHECK(std::system(cmd.c_str()) == 0);
}

}  // namespace

TEST_CASE("auto dumps: a burst of 50 requests is answered by one or two dumps holding every sample") {
  const std::string dir = dumps_temp_dir();
  selfprof::options o;
  o.dump_signal = 0;  // requests come from dump_signal_handler() called here, as the signal would
  o.out = dir + "/a-%n.folded";
  fake_session f(o);
  f.put(0x1000, 3);
  f.put(0x1100, 4);
  auto_dumps dumps(f.maker, [] {});
  REQUIRE(dumps.start(o, f.session));
  CHECK(dumps.tid() != 0);
  for (int i = 0; i < 50; ++i) dump_signal_handler(SIGUSR2, nullptr, nullptr);
  dumps.flush();
  const unsigned long written = dumps.written();
  CHECK(written >= 1);
  CHECK(written <= 2);
  CHECK(dumps.failed() == 0);
  CHECK(count_files(dir) == written);
  f.put(0x1200, 1);
  dump_signal_handler(SIGUSR2, nullptr, nullptr);
  dumps.flush();
  CHECK(dumps.written() == written + 1);
  dumps.stop();
  raw_snapshot r = f.maker.raw();
  CHECK(r.table.total() == 8);
  remove_dir(dir);
}

TEST_CASE("auto dumps: the interval writes without any request, and stop() ends it") {
  const std::string dir = dumps_temp_dir();
  selfprof::options o;
  o.dump_signal = 0;
  o.interval_s = 0.05;
  o.out = dir + "/i-%n.folded";
  fake_session f(o);
  f.put(0x1000, 1);
  auto_dumps dumps(f.maker, [] {});
  REQUIRE(dumps.start(o, f.session));
  for (int i = 0; i < 400 && dumps.written() < 3; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  dumps.stop();
  const unsigned long written = dumps.written();
  CHECK(written >= 3);
  std::this_thread::sleep_for(std::chrono::milliseconds(120));
  CHECK(dumps.written() == written);
  CHECK(count_files(dir) == written);
  remove_dir(dir);
}

TEST_CASE("auto dumps: a failed dump is counted and loses nothing") {
  selfprof::options o;
  o.dump_signal = 0;
  o.out = "/nonexistent-selfprof-dir/x-%n.folded";
  fake_session f(o);
  f.put(0x1000, 2);
  auto_dumps dumps(f.maker, [] {});
  REQUIRE(dumps.start(o, f.session));
  dump_signal_handler(SIGUSR2, nullptr, nullptr);
  dumps.flush();
  dumps.stop();
  CHECK(dumps.failed() == 1);
  CHECK(dumps.written() == 0);
  CHECK(f.maker.raw().table.total() == 2);
}

namespace {
std::atomic<int> g_exit_dumps{0};
std::mutex g_exit_lock;  // held by the "ending thread" to stand for a libc lock the dumper needs
}  // namespace

TEST_CASE("auto dumps: the exit dump is handed to the dumper thread, and given up when the dumper is stuck") {
  selfprof::options o;
  o.dump_signal = 0;
  o.out = "/nonexistent-selfprof-dir/exit.folded";  // an exit dump is wanted (the callback stands for it)
  fake_session f(o);
  {
    auto_dumps dumps(f.maker, [] { g_exit_dumps.fetch_add(1); });
    REQUIRE(dumps.start(o, f.session));
    CHECK(exit_dump_by_dumper());  // written by the dumper, and waited for
    CHECK(g_exit_dumps.load() == 1);
    dumps.stop();
    CHECK_FALSE(exit_dump_by_dumper());  // no dumper: nothing to hand over, returns at once
  }
  {
    // The dumper needs a lock the ending thread holds (as malloc's, when _exit() runs in a signal
    // handler that interrupted malloc): the wait gives up instead of hanging.
    auto_dumps dumps(f.maker, [] {
      std::lock_guard<std::mutex> lock(g_exit_lock);
      g_exit_dumps.fetch_add(1);
    });
    REQUIRE(dumps.start(o, f.session));
    {
      std::lock_guard<std::mutex> held(g_exit_lock);
      CHECK_FALSE(exit_dump_by_dumper(50));
      CHECK(g_exit_dumps.load() == 1);
    }
    dumps.stop();  // the dumper takes the lock now, writes, and ends
    CHECK(g_exit_dumps.load() == 2);
  }
}

namespace {
// Stands for the collector: waits for the watch fd to turn readable, then launches the dumper.
void watch_and_launch(auto_dumps& dumps, std::atomic<bool>& launched) {
  struct pollfd p {
    dumps.watch_fd(), POLLIN, 0
  };
  if (::poll(&p, 1, 10000) == 1) {
    CHECK(dumps.launch());
    launched.store(true);
  }
}
}  // namespace

TEST_CASE("auto dumps on demand: no thread until a request, which the watch fd announces") {
  const std::string dir = dumps_temp_dir();
  selfprof::options o;
  o.dump_signal = 0;
  o.out = dir + "/d-%n.folded";
  fake_session f(o);
  f.put(0x1000, 5);
  {
    auto_dumps dumps(f.maker, [] {});
    REQUIRE(dumps.start(o, f.session, true));
    CHECK(dumps.tid() == 0);
    REQUIRE(dumps.watch_fd() >= 0);
    struct pollfd p {
      dumps.watch_fd(), POLLIN, 0
    };
    CHECK(::poll(&p, 1, 0) == 0);  // nothing asked: nothing to watch for
    std::atomic<bool> launched{false};
    std::thread watcher([&] { watch_and_launch(dumps, launched); });
    dump_signal_handler(SIGUSR2, nullptr, nullptr);
    watcher.join();
    CHECK(launched.load());
    CHECK(dumps.tid() != 0);
    for (int i = 0; i < 400 && dumps.written() < 1; ++i)
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    CHECK(dumps.written() == 1);  // answered by the thread the request started
    dumps.stop();
  }
  {
    // Never launched: stop() answers a request that came after the watcher stopped watching.
    auto_dumps dumps(f.maker, [] {});
    REQUIRE(dumps.start(o, f.session, true));
    dump_signal_handler(SIGUSR2, nullptr, nullptr);
    CHECK(dumps.tid() == 0);
    dumps.stop();
    CHECK(dumps.written() == 1);
  }
  {
    // Nothing asked: the thread never starts, and stop() leaves nothing behind.
    auto_dumps dumps(f.maker, [] {});
    REQUIRE(dumps.start(o, f.session, true));
    dumps.stop();
    CHECK(dumps.tid() == 0);
    CHECK(dumps.written() == 0);
    CHECK(dumps.watch_fd() == -1);
  }
  CHECK(count_files(dir) == 2);
  remove_dir(dir);
}

TEST_CASE("auto dumps on demand: the exit dump starts the dumper through the watcher, or is given up") {
  selfprof::options o;
  o.dump_signal = 0;
  o.out = "/nonexistent-selfprof-dir/exit.folded";
  fake_session f(o);
  g_exit_dumps.store(0);
  {
    auto_dumps dumps(f.maker, [] { g_exit_dumps.fetch_add(1); });
    REQUIRE(dumps.start(o, f.session, true));
    std::atomic<bool> launched{false};
    std::thread watcher([&] { watch_and_launch(dumps, launched); });
    CHECK(exit_dump_by_dumper());
    watcher.join();
    CHECK(launched.load());
    CHECK(g_exit_dumps.load() == 1);
    dumps.stop();
  }
  {
    // No watcher: the wait gives up after the stall time instead of hanging.
    auto_dumps dumps(f.maker, [] { g_exit_dumps.fetch_add(1); });
    REQUIRE(dumps.start(o, f.session, true));
    CHECK_FALSE(exit_dump_by_dumper(50));
    CHECK(dumps.tid() == 0);
    dumps.stop(true);
  }
  {
    // No exit dump wanted (no output path): nothing is asked of anyone.
    selfprof::options none = o;
    none.out.clear();
    auto_dumps dumps(f.maker, [] { g_exit_dumps.fetch_add(1); });
    REQUIRE(dumps.start(none, f.session, true));
    CHECK_FALSE(exit_dump_by_dumper());
    CHECK(dumps.tid() == 0);
    dumps.stop();
  }
  CHECK(g_exit_dumps.load() == 1);
}
