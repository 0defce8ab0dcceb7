// The sample ring: order, full-ring drops, many producers against one consumer without loss, and fresh
// pages mapped by the consumer ahead of the producers.
#include <doctest/doctest.h>
#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <thread>
#include <vector>

#include <selfprof/signal/ring.hpp>

using selfprof::detail::ring_slot;
using selfprof::detail::sample_ring;

namespace {
struct ring_fixture {
  std::vector<std::uint64_t> memory;
  sample_ring ring;
  ring_fixture(std::size_t capacity, std::size_t depth) {
    memory.assign(capacity * sample_ring::stride_for(depth) / 8, 0);
    ring.init(memory.data(), capacity, depth);
  }
  ring_fixture() = default;
  bool push(std::uint32_t tid, std::uint64_t value) {
    std::uint64_t pos;
    ring_slot* s = ring.claim(pos);
    if (!s) return false;
    s->header.tid = tid;
    s->header.depth = 1;
    s->pcs()[0] = value;
    sample_ring::publish(s, pos);
    return true;
  }
};
}  // namespace

TEST_CASE("ring: first in, first out; full drops; freed slots are reused") {
  ring_fixture f(4, 8);
  CHECK(f.ring.peek() == nullptr);
  for (std::uint64_t i = 0; i < 4; ++i) CHECK(f.push(1, i));
  CHECK_FALSE(f.push(1, 99));  // full
  for (std::uint64_t i = 0; i < 2; ++i) {
    ring_slot* s = f.ring.peek();
    REQUIRE(s != nullptr);
    CHECK(s->pcs()[0] == i);
    f.ring.release(s);
  }
  CHECK(f.push(1, 4));
  CHECK(f.push(1, 5));
  CHECK_FALSE(f.push(1, 6));
  for (std::uint64_t i = 2; i < 6; ++i) {
    ring_slot* s = f.ring.peek();
    REQUIRE(s != nullptr);
    CHECK(s->pcs()[0] == i);
    f.ring.release(s);
  }
  CHECK(f.ring.peek() == nullptr);
}

TEST_CASE("ring: four producers, one consumer: every record arrives once, or is counted as dropped") {
  ring_fixture f(64, 4);
  constexpr int kProducers = 4, kEach = 20000;
  std::atomic<long> dropped{0};
  std::atomic<int> done{0};
  std::vector<std::thread> producers;
  for (int p = 0; p < kProducers; ++p)
    producers.emplace_back([&, p] {
      for (int i = 0; i < kEach; ++i)
        if (!f.push(static_cast<std::uint32_t>(p), static_cast<std::uint64_t>(i))) dropped.fetch_add(1);
      done.fetch_add(1);
    });
  std::vector<std::vector<std::uint64_t>> got(kProducers);
  for (;;) {
    ring_slot* s = f.ring.peek();
    if (s) {
      got[s->header.tid].push_back(s->pcs()[0]);
      f.ring.release(s);
    } else if (done.load() == kProducers && f.ring.peek() == nullptr) {
      break;
    }
  }
  for (auto& t : producers) t.join();
  long received = 0;
  for (auto& g : got) {
    received += static_cast<long>(g.size());
    for (std::size_t i = 1; i < g.size(); ++i) CHECK(g[i] > g[i - 1]);  // per producer order kept
  }
  CHECK(received + dropped.load() == long(kProducers) * kEach);
}

// Fresh anonymous pages for a ring of `capacity` slots, and which of them the kernel has mapped.
struct fresh_ring_pages {
  static constexpr std::size_t depth = 127;
  const std::size_t capacity, stride = sample_ring::stride_for(depth);
  const std::size_t page = static_cast<std::size_t>(::sysconf(_SC_PAGESIZE));
  const std::size_t bytes = (capacity * stride + page - 1) / page * page;
  void* mem = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  explicit fresh_ring_pages(std::size_t slots) : capacity(slots) { REQUIRE(mem != MAP_FAILED); }
  ~fresh_ring_pages() { ::munmap(mem, bytes); }
  bool resident(std::size_t slot) const {  // the page holding the slot's first byte
    unsigned char v = 0;
    REQUIRE(::mincore(static_cast<unsigned char*>(mem) + slot * stride / page * page, page, &v) == 0);
    return (v & 1) != 0;
  }
};

TEST_CASE("ring: a fresh ring's pages are mapped by the consumer's writes, a quarter of the ring ahead") {
  // A page the producers read first would map the shared zero page, then be replaced at their write (a
  // copy-on-write fault that flushes the TLB of every CPU the process runs on). map_ahead() writes first.
  const std::size_t capacity = 64;
  fresh_ring_pages m(capacity);
  ring_fixture f;
  f.ring.init(m.mem, capacity, m.depth, true);  // fresh anonymous pages: nothing touched
  for (std::size_t i = 0; i < capacity; i += 4) CHECK_FALSE(m.resident(i));
  f.ring.map_ahead();
  for (std::size_t i = 0; i < capacity / 4; ++i) CHECK(m.resident(i));
  CHECK_FALSE(m.resident(capacity / 4 + 4));
  CHECK_FALSE(m.resident(capacity - 1));
  // Producers and the consumer work as before; the next map_ahead() follows the producers.
  for (std::uint64_t i = 0; i < 20; ++i) REQUIRE(f.push(1, 1000 + i));
  for (std::uint64_t i = 0; i < 20; ++i) {
    ring_slot* s = f.ring.peek();
    REQUIRE(s != nullptr);
    CHECK(s->pcs()[0] == 1000 + i);
    f.ring.release(s);
  }
  f.ring.map_ahead();
  for (std::size_t i = 20; i < 20 + capacity / 4; ++i) CHECK(m.resident(i));
  CHECK_FALSE(m.resident(capacity - 1));
  // A word a producer wrote is left as it is (the write is a locked no-op): published records stay.
  for (std::uint64_t i = 0; i < capacity - 4; ++i) REQUIRE(f.push(2, 2000 + i));
  f.ring.map_ahead();
  for (std::size_t i = 0; i < capacity; i += 4) CHECK(m.resident(i));
  for (std::uint64_t i = 0; i < capacity - 4; ++i) {
    ring_slot* s = f.ring.peek();
    REQUIRE(s != nullptr);
    CHECK(s->header.tid == 2);
    CHECK(s->pcs()[0] == 2000 + i);
    f.ring.release(s);
  }
  CHECK(f.ring.peek() == nullptr);
  f.ring.map_ahead();  // every slot mapped: nothing left to do, nothing past the end touched
}

TEST_CASE("ring: a source the collector reads maps ahead only what one read can write") {
  const std::size_t capacity = 256;
  fresh_ring_pages m(capacity);
  const std::size_t page = m.page, stride = m.stride;
  ring_fixture f;
  f.ring.init(m.mem, capacity, m.depth, true);
  f.ring.set_map_ahead(10);
  f.ring.map_ahead();
  for (std::size_t i = 0; i < 10; ++i) CHECK(m.resident(i));
  CHECK_FALSE(m.resident(10 + page / stride + 1));  // past the page holding slot 9
  CHECK_FALSE(m.resident(capacity / 4));            // a signal source's quarter
  for (std::uint64_t i = 0; i < 10; ++i) REQUIRE(f.push(1, i));
  f.ring.map_ahead();  // follows the producer: 10 more
  for (std::size_t i = 10; i < 20; ++i) CHECK(m.resident(i));
  CHECK_FALSE(m.resident(20 + page / stride + 1));
}
