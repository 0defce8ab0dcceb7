// `selfprof record --follow-exec` without the preload library: like perf record, the recorder opens
// perf_event sampling events on the command before it execs, inherited by every thread and process it
// starts, and reads their rings itself. Nothing is loaded into the programs, so a process that lives a
// few milliseconds pays only the kernel's sampling, and a program that execs, forks, takes SIGPROF or
// exits with _exit is never touched.
//
// Events, per CPU on the stopped child (the kernel refuses mmap of an inherited event opened on every CPU
// at once), all `inherit` (threads and fork children carry copies that write into the same ring): a dummy
// event that owns the ring and reports exec (COMM), fork (FORK) and executable mappings (MMAP2), and a
// task-clock event that samples, both `enable_on_exec`; beside that one, its disabled twin that also asks
// for the kernel's user call chain, enabled in its stead once stacks show they need it (the user chain
// switch, sources/perf_ring.hpp). The side-band records come from the dummy so that the switch loses
// none. A sample holds TID, TIME (CLOCK_MONOTONIC), the kernel's chain, the user bp/sp/ip and 8 KiB of
// user stack, unwound here with the CFI rows of the files the process mapped (file_unwind.hpp) and,
// where the copy ends, continued on the process's live stack (read with process_vm_readv while it still
// holds the sampled frames) or with the kernel's user chain, as the in-process ring does.
// A file's rows are parsed when a sample first reaches its code (the sample is then unwound again), so
// what is never sampled is never parsed.
//
// Order: each CPU's ring is in time order, the rings together are not. A sample must meet the mappings
// of its process as they were when it was taken, so records wait until every ring has been read past
// their time: after each read, records older than the previous read's start are applied in time order.
//
// One "image" is one program run by one process: a fork starts an image with its parent's mappings and
// name, an exec ends the old image and starts a new one. Each image with samples becomes one raw_process
// (raw_merge.hpp), named by the merger at the end exactly as the preload library's raw dumps are.
// Context: setup only (the command-line tool's recording loop).
#pragma once

#include <fcntl.h>
#include <linux/perf_event.h>
#include <poll.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include <selfprof/detail/process.hpp>
#include <selfprof/detail/stack_table.hpp>
#include <selfprof/detail/sys.hpp>
#include <selfprof/signal/clock.hpp>
#include <selfprof/sources/perf_ring.hpp>
#include <selfprof/status.hpp>
#include <selfprof/symbols/perf_map.hpp>
#include <selfprof/symbols/proc_maps.hpp>

#include "file_unwind.hpp"
#include "raw_merge.hpp"

namespace selfprof_cli {

// The stack copy of another process: its code is not in our memory, so no code bytes are read at the
// interrupted pc (the leaf's prologue heuristics of the in-process walk are off).
struct foreign_stack : selfprof::detail::stack_copy {
  static constexpr bool kInterruptedPc = false;
  static constexpr bool kMayLackFp = false;
};

struct perf_record_options {
  double hz = 99;
  std::size_t max_depth = 128;  // frames per stack, kernel and user
  bool user_only = false;       // do not try kernel time first
};

// What the recording met, for the profile's notes.
struct perf_record_counts {
  std::uint64_t samples = 0, stored = 0, lost = 0, throttled = 0, corrupt = 0, spliced = 0, truncated = 0;
  std::uint64_t continued = 0;    // samples whose walk went on past the copy, on the live stack
  std::uint64_t chain_cut = 0;    // samples cut where the kernel's user chain (not asked for yet) would go on
  bool user_chain = false;        // the sampling events ask for that chain now
  bool chain_given_back = false;  // it was asked for, then continued few stacks and was given up
  std::uint64_t no_room = 0;      // stacks a full table could not take
  std::uint64_t unknown = 0;      // samples of a process whose start was never seen (maps read late)
  std::uint64_t records = 0, images = 0, forks = 0, execs = 0, mappings = 0;
};

class perf_recorder {
  using cursor = selfprof::detail::ring_cursor;
  static constexpr std::uint64_t kQuickReads = 20;

 public:
  perf_recorder() = default;
  perf_recorder(const perf_recorder&) = delete;
  perf_recorder& operator=(const perf_recorder&) = delete;
  ~perf_recorder() { close(); }

  // Opens the events on `pid`, a child stopped before its exec: they start counting at the exec.
  // Kernel time where allowed, else user-only. On failure nothing stays open.
  selfprof::status open(pid_t pid, const perf_record_options& o) {
    close();
    opts_ = o;
    page_ = static_cast<std::size_t>(::sysconf(_SC_PAGESIZE));
    const long conf = ::sysconf(_SC_NPROCESSORS_CONF);
    const int cpus = conf > 0 ? static_cast<int>(conf) : 1;
    selfprof::status st = selfprof::status::ok();
    for (int user = o.user_only ? 1 : 0; user <= 1; ++user) {
      user_only_ = user == 1;
      st = open_cpus(pid, cpus);
      if (st || (st.code() != EACCES && st.code() != EPERM)) break;
      close();
    }
    if (!st) {
      close();
      return st;
    }
    start_unix_ns_ = selfprof::detail::clock_ns(CLOCK_REALTIME);
    new_image(pid, "", nullptr);  // the child as forked: its exec starts the image that is sampled
    return st;
  }

  bool user_only() const { return user_only_; }
  std::size_t rings() const { return rings_.size(); }

  // How long the recording loop waits between reads: 50 ms, but 10 ms for the first kQuickReads reads
  // while no user chain is asked for, so that stacks that outgrow the copy get it after a few samples
  // (a sample is unwound one read after the read that found it).
  int read_period_ms() const {
    return !chain_.on() && !chain_.given_back() && round_ < kQuickReads ? 10 : 50;
  }

  // Waits up to `timeout_ms` for a ring to pass its wake-up mark, then reads every ring.
  void wait_and_read(int timeout_ms) {
    std::vector<pollfd> fds;
    for (const ring& r : rings_) fds.push_back(pollfd{r.fd, POLLIN, 0});
    if (!fds.empty()) ::poll(fds.data(), fds.size(), timeout_ms);
    read(false);
  }

  // Reads every ring; applies the records every ring has been read past (all of them when `all`).
  void read(bool all) {
    read_records(all);
    const auto a = chain_.due();
    if (a != selfprof::detail::chain_switch::action::none)
      hand_over(a == selfprof::detail::chain_switch::action::ask);
  }

  // Stops the events and releases the rings (what was read stays).
  void close() {
    for (ring& r : rings_) {
      for (int fd : {r.sampler, r.chain_sampler, r.fd})
        if (fd >= 0) ::ioctl(fd, PERF_EVENT_IOC_DISABLE, 0);
      if (r.base) ::munmap(r.base, r.map_bytes);
      for (int fd : {r.sampler, r.chain_sampler, r.fd})
        if (fd >= 0) ::close(fd);
    }
    rings_.clear();
  }

  perf_record_counts counts() const {
    perf_record_counts c = counts_;
    c.user_chain = chain_.on();
    c.chain_given_back = chain_.given_back();
    c.chain_cut = chain_.cut();
    return c;
  }
  const std::vector<std::string>& unwind_notes() const { return unwind_.notes(); }
  std::size_t unwind_files() const { return unwind_.files(); }

  // The images with samples (`with_empty`: every image, in the order they began), as the merger reads
  // them; the recorder keeps nothing of them.
  std::vector<raw_process> take(bool with_empty = false) {
    const std::uint64_t end_ns = selfprof::detail::clock_ns(CLOCK_REALTIME);
    std::vector<raw_process> out;
    for (auto& im : images_) {
      if (im->table.total() == 0 && !with_empty) continue;
      raw_process p;
      p.file = "process " + std::to_string(im->pid) + " (" + im->comm + ")";
      p.pid = static_cast<std::uint32_t>(im->pid);
      p.comm = im->comm;
      if (im->jit) name_jit_frames(*im, p.names);
      p.maps = std::move(im->maps);
      p.raw.table = std::move(im->table);
      p.raw.thread_names = std::move(im->threads);
      selfprof::profile_info& i = p.raw.info;
      i.mode = selfprof::profile_mode::cpu;
      i.unit = "samples";
      i.hz = opts_.hz;
      i.period_ns = static_cast<std::uint64_t>(1e9 / opts_.hz);
      i.source =
          user_only_ ? "perf_event rings, user only (selfprof record)" : "perf_event rings (selfprof record)";
      i.kernel_time = !user_only_;
      i.start_unix_ns = start_unix_ns_;
      i.duration_s = static_cast<double>(end_ns - start_unix_ns_) / 1e9;
      out.push_back(std::move(p));
    }
    images_.clear();
    current_.clear();
    return out;
  }

 private:
  // Each CPU's sampler hands over to its user-chain twin (`to_chain`; with the copies every thread and
  // process inherited), or the twin hands back: one is disabled before the other is enabled, so that no
  // tick is sampled twice.
  void hand_over(bool to_chain) {
    for (ring& r : rings_) {
      ::ioctl(to_chain ? r.sampler : r.chain_sampler, PERF_EVENT_IOC_DISABLE, 0);
      ::ioctl(to_chain ? r.chain_sampler : r.sampler, PERF_EVENT_IOC_ENABLE, 0);
    }
    chain_.handed_over(monotonic_ns());
  }

  void read_records(bool all) {
    ++round_;
    const std::uint64_t now = monotonic_ns();
    for (ring& r : rings_) read_ring(r);
    std::stable_sort(pending_.begin(), pending_.end(),
                     [](const pending& a, const pending& b) { return a.time < b.time; });
    std::size_t done = 0;
    for (; done < pending_.size(); ++done) {
      if (!all && pending_[done].time >= watermark_) break;
      apply(bytes_.data() + pending_[done].at, pending_[done].size);
    }
    pending_.erase(pending_.begin(), pending_.begin() + static_cast<std::ptrdiff_t>(done));
    // The records left for the next round move to the front of the other buffer (capacity kept).
    spare_.clear();
    for (pending& p : pending_) {
      const std::size_t at = spare_.size();
      spare_.insert(spare_.end(), bytes_.begin() + static_cast<std::ptrdiff_t>(p.at),
                    bytes_.begin() + static_cast<std::ptrdiff_t>(p.at + p.size));
      p.at = at;
    }
    bytes_.swap(spare_);
    watermark_ = now;
  }

  struct ring {
    int fd = -1;                           // the side-band event, owner of the ring
    int sampler = -1, chain_sampler = -1;  // the sampling event and its user-chain twin
    void* base = nullptr;
    std::size_t map_bytes = 0, data_bytes = 0;
  };
  struct pending {  // a record copied out of a ring: bytes_[at, at + size)
    std::uint64_t time;
    std::size_t at, size;
  };
  struct image {
    pid_t pid = 0;
    std::string comm;
    std::vector<raw_map> maps;  // executable mappings, sorted by start, not overlapping
    std::vector<selfprof::detail::unwind_module> modules;
    selfprof::detail::unwind_table_set set{nullptr, 0};
    bool dirty = true;                                   // maps changed since `set` was built
    std::vector<selfprof::detail::maps_entry> unparsed;  // mappings of files not parsed yet
    selfprof::detail::stack_table table;
    std::unordered_map<std::uint32_t, std::string> threads;
    // /tmp/perf-PID.map of a JIT, read while sampling (once per read of the rings, when a sample is in
    // code outside every file): a sample is named by the line current at its time (addresses are reused).
    std::unique_ptr<selfprof::detail::perf_map> jit;
    std::uint64_t jit_read_round = 0;
  };

  static std::uint64_t monotonic_ns() {
    struct timespec ts {};
    ::clock_gettime(CLOCK_MONOTONIC, &ts);
    return static_cast<std::uint64_t>(ts.tv_sec) * 1000000000u + static_cast<std::uint64_t>(ts.tv_nsec);
  }

  enum class event_role { side_band, sampler, chain_sampler };

  int open_event(pid_t pid, int cpu, event_role role) {
    struct perf_event_attr attr;
    std::memset(&attr, 0, sizeof attr);
    attr.size = sizeof attr;
    attr.type = PERF_TYPE_SOFTWARE;
    attr.exclude_kernel = user_only_ ? 1 : 0;
    attr.exclude_hv = 1;
    attr.disabled = 1;
    attr.inherit = 1;
    // Every record ends with TID and TIME (sample_id_all); a sample has them second and third.
    attr.sample_id_all = 1;
    if (role == event_role::side_band) {
      attr.config = PERF_COUNT_SW_DUMMY;
      attr.sample_type = PERF_SAMPLE_TID | PERF_SAMPLE_TIME;
      attr.enable_on_exec = 1;
      attr.task = 1;
      attr.comm = 1;
      attr.comm_exec = 1;
      attr.mmap = 1;
      attr.mmap2 = 1;
    } else {
      attr.config = PERF_COUNT_SW_TASK_CLOCK;
      attr.sample_period = static_cast<std::uint64_t>(1e9 / opts_.hz);
      attr.sample_type = PERF_SAMPLE_IP | PERF_SAMPLE_TID | PERF_SAMPLE_TIME | PERF_SAMPLE_CALLCHAIN |
                         PERF_SAMPLE_REGS_USER | PERF_SAMPLE_STACK_USER;
      attr.sample_regs_user = (1ull << selfprof::detail::kRegBp) | (1ull << selfprof::detail::kRegSp) |
                              (1ull << selfprof::detail::kRegIp);
      attr.sample_stack_user = selfprof::detail::kStackCopyBytes;
      attr.sample_max_stack = static_cast<std::uint16_t>(std::min<std::size_t>(opts_.max_depth, 127));
      attr.exclude_callchain_kernel = user_only_ ? 1 : 0;
      attr.exclude_callchain_user = role == event_role::sampler ? 1 : 0;
      // The twin stays disabled until switch_to_chain(). The sampler's enable_on_exec is spent at the
      // child's exec (the kernel clears the flag then), so a later exec never enables it again.
      attr.enable_on_exec = role == event_role::sampler ? 1 : 0;
    }
    attr.use_clockid = 1;
    attr.clockid = CLOCK_MONOTONIC;
    // Neither watermark nor wakeup_events: the kernel wakes the poller when a ring is half full. Each
    // wake-up is an interrupt on the sampled program's CPU; with 8 KiB stack copies a 64 KiB mark cost
    // the programs about as much as the samples themselves (docs/measurements.md, issue 19).
    const long fd = selfprof::detail::sys().perf_event_open(&attr, pid, cpu, -1, PERF_FLAG_FD_CLOEXEC);
    return fd < 0 ? -1 : static_cast<int>(fd);
  }

  selfprof::status open_cpus(pid_t pid, int cpus) {
    for (int c = 0; c < cpus; ++c) {
      const int fd = open_event(pid, c, event_role::side_band);
      if (fd < 0) {
        const int e = errno;
        if (e == ENODEV || (e == EINVAL && c > 0)) continue;  // an offline CPU
        return selfprof::status::error(
            std::string("perf_event_open(task-clock, inherited") +
                (user_only_ ? ", user only" : ", with kernel time") + "): " + std::strerror(e) +
                (e == EACCES || e == EPERM ? " (kernel.perf_event_paranoid or seccomp forbids it)" : ""),
            e);
      }
      ring r;
      r.fd = fd;
      rings_.push_back(r);
      int err = 0;
      for (unsigned pages = selfprof::detail::kRingPagesMax; pages >= selfprof::detail::kRingPagesMin;
           pages /= 2) {
        const std::size_t bytes = (pages + 1) * page_;
        void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
        if (p != MAP_FAILED) {
          rings_.back().base = p;
          rings_.back().map_bytes = bytes;
          rings_.back().data_bytes = pages * page_;
          break;
        }
        err = errno;
        if (err != EPERM && err != ENOMEM) break;
      }
      if (rings_.back().base == nullptr)
        return selfprof::status::error(
            std::string("perf ring: mmap of CPU ") + std::to_string(c) + "'s ring failed: " +
                std::strerror(err) + (err == EPERM ? " (locked memory: perf_event_mlock_kb used up)" : ""),
            err);
      for (event_role role : {event_role::sampler, event_role::chain_sampler}) {
        const int s = open_event(pid, c, role);
        if (s < 0 || ::ioctl(s, PERF_EVENT_IOC_SET_OUTPUT, fd) != 0) {
          const int e = errno;
          if (s >= 0) ::close(s);
          return selfprof::status::error(std::string("perf_event_open(task-clock, inherited") +
                                             (user_only_ ? ", user only" : ", with kernel time") +
                                             (s < 0 ? "): " : ") into the ring: ") + std::strerror(e),
                                         e);
        }
        (role == event_role::sampler ? rings_.back().sampler : rings_.back().chain_sampler) = s;
      }
    }
    if (rings_.empty()) return selfprof::status::error("perf ring: no online CPU accepted an event", ENODEV);
    return selfprof::status::ok();
  }

  // Copies the ring's new records into `pending_`, each with its time.
  void read_ring(ring& r) {
    auto* meta = static_cast<perf_event_mmap_page*>(r.base);
    const unsigned char* data = static_cast<const unsigned char*>(r.base) + page_;
    const std::uint64_t size = r.data_bytes;
    const std::uint64_t head = __atomic_load_n(&meta->data_head, __ATOMIC_ACQUIRE);
    std::uint64_t tail = meta->data_tail;
    if (head - tail > size) {
      ++counts_.corrupt;
      tail = head;
    }
    while (tail < head) {
      perf_event_header h;
      if (head - tail < sizeof h) {
        ++counts_.corrupt;
        break;
      }
      selfprof::detail::ring_copy_out(data, size, tail, &h, sizeof h);
      if (h.size < sizeof h + 8 || h.size > head - tail || h.size % 8 != 0) {
        ++counts_.corrupt;
        break;
      }
      pending p{0, bytes_.size(), h.size};
      bytes_.resize(p.at + p.size);
      unsigned char* rec = bytes_.data() + p.at;
      selfprof::detail::ring_copy_out(data, size, tail, rec, h.size);
      // Every record ends with its time (sample_id_all with TID and TIME); a sample has it third.
      if (h.type == PERF_RECORD_SAMPLE && h.size >= sizeof h + 24)
        std::memcpy(&p.time, rec + sizeof h + 16, 8);
      else
        std::memcpy(&p.time, rec + h.size - 8, 8);
      pending_.push_back(p);
      ++counts_.records;
      tail += h.size;
    }
    __atomic_store_n(&meta->data_tail, head, __ATOMIC_RELEASE);
  }

  void apply(const unsigned char* rec, std::size_t rec_size) {
    perf_event_header h;
    std::memcpy(&h, rec, sizeof h);
    cursor c{rec + sizeof h, rec_size - sizeof h};
    switch (h.type) {
      case PERF_RECORD_SAMPLE:
        return on_sample(c);
      case PERF_RECORD_MMAP2:
        return on_mmap2(c);
      case PERF_RECORD_COMM:
        return on_comm(c, (h.misc & PERF_RECORD_MISC_COMM_EXEC) != 0);
      case PERF_RECORD_FORK:
        return on_fork(c);
      case PERF_RECORD_LOST: {
        std::uint64_t id = 0, lost = 0;
        if (c.u64(id) && c.u64(lost)) counts_.lost += lost;
        return;
      }
      case PERF_RECORD_THROTTLE:
        ++counts_.throttled;
        return;
      default:
        return;
    }
  }

  image& new_image(pid_t pid, const std::string& comm, const image* from) {
    auto im = std::make_unique<image>();
    im->pid = pid;
    im->comm = comm;
    if (from) {
      im->maps = from->maps;
      if (im->comm.empty()) im->comm = from->comm;
    }
    images_.push_back(std::move(im));
    ++counts_.images;
    current_[pid] = images_.back().get();
    return *images_.back();
  }

  // The image `pid` runs now; for a process whose start was not seen, one made from its /proc maps.
  image& image_of(pid_t pid) {
    auto it = current_.find(pid);
    if (it != current_.end()) return *it->second;
    ++counts_.unknown;
    image& im = new_image(pid, "", nullptr);
    std::string comm = selfprof::detail::read_small_file("/proc/" + std::to_string(pid) + "/comm");
    while (!comm.empty() && comm.back() == '\n') comm.pop_back();
    im.comm = comm;
    const std::string text =
        selfprof::detail::read_small_file("/proc/" + std::to_string(pid) + "/maps", ~std::size_t(0));
    std::size_t at = 0;
    while (at < text.size()) {
      std::size_t nl = text.find('\n', at);
      if (nl == std::string::npos) nl = text.size();
      selfprof::detail::maps_entry e;
      if (selfprof::detail::parse_maps_line(std::string_view(text).substr(at, nl - at), e) && e.executable)
        add_map(im, e);
      at = nl + 1;
    }
    return im;
  }

  void on_comm(cursor& c, bool exec) {
    std::uint32_t pid = 0, tid = 0;
    std::string comm;
    if (!c.u32(pid) || !c.u32(tid) || !c.text(comm)) {
      ++counts_.corrupt;
      return;
    }
    if (exec) {
      ++counts_.execs;
      new_image(static_cast<pid_t>(pid), comm, nullptr);
      return;
    }
    image& im = image_of(static_cast<pid_t>(pid));
    if (pid == tid) im.comm = comm;
    im.threads[tid] = comm;
  }

  void on_fork(cursor& c) {
    std::uint32_t pid = 0, ppid = 0, tid = 0, ptid = 0;
    if (!c.u32(pid) || !c.u32(ppid) || !c.u32(tid) || !c.u32(ptid)) {
      ++counts_.corrupt;
      return;
    }
    if (pid == ppid) return;  // a new thread of the same process
    ++counts_.forks;
    auto it = current_.find(static_cast<pid_t>(ppid));
    new_image(static_cast<pid_t>(pid), "", it == current_.end() ? nullptr : it->second);
  }

  void on_mmap2(cursor& c) {
    std::uint32_t pid = 0, tid = 0, maj = 0, min = 0, prot = 0, flags = 0;
    std::uint64_t addr = 0, len = 0, pgoff = 0, ino = 0, gen = 0;
    std::string path;
    if (!c.u32(pid) || !c.u32(tid) || !c.u64(addr) || !c.u64(len) || !c.u64(pgoff) || !c.u32(maj) ||
        !c.u32(min) || !c.u64(ino) || !c.u64(gen) || !c.u32(prot) || !c.u32(flags) || !c.text(path)) {
      ++counts_.corrupt;
      return;
    }
    if (!(prot & PROT_EXEC) || len == 0) return;
    ++counts_.mappings;
    selfprof::detail::maps_entry e;
    e.start = addr;
    e.end = addr + len;
    e.offset = pgoff;
    e.dev_major = maj;
    e.dev_minor = min;
    e.inode = ino;
    e.readable = (prot & PROT_READ) != 0;
    e.executable = true;
    const std::string deleted = " (deleted)";
    if (path.size() > deleted.size() &&
        path.compare(path.size() - deleted.size(), deleted.size(), deleted) == 0) {
      e.deleted = true;
      path.resize(path.size() - deleted.size());
    }
    e.path = path;
    add_map(image_of(static_cast<pid_t>(pid)), e);
  }

  // A new mapping replaces whatever it overlaps (the kernel reports no munmap).
  void add_map(image& im, const selfprof::detail::maps_entry& e) {
    std::vector<raw_map> kept;
    kept.reserve(im.maps.size() + 2);
    for (const raw_map& m : im.maps) {
      if (m.e.end <= e.start || m.e.start >= e.end) {
        kept.push_back(m);
        continue;
      }
      if (m.e.start < e.start) {  // the part below
        raw_map lo = m;
        lo.e.end = e.start;
        kept.push_back(lo);
      }
      if (m.e.end > e.end) {  // the part above
        raw_map hi = m;
        hi.e.offset += e.end - m.e.start;
        hi.e.start = e.end;
        kept.push_back(hi);
      }
    }
    raw_map n;
    n.e = e;
    // The file's identity now, when it is still the file mapped: the merger names it only if unchanged.
    // Looked up once per read of the rings: the processes started meanwhile map the same libraries.
    if (!e.path.empty() && e.path[0] == '/' && !e.deleted) {
      file_seen& f = seen_[e.path];
      if (f.round != round_ || f.inode != e.inode || f.dev_major != e.dev_major ||
          f.dev_minor != e.dev_minor) {
        struct stat sb {};
        f = file_seen{};
        f.round = round_;
        f.inode = e.inode;
        f.dev_major = e.dev_major;
        f.dev_minor = e.dev_minor;
        f.same = ::stat(e.path.c_str(), &sb) == 0 && static_cast<std::uint64_t>(sb.st_ino) == e.inode &&
                 major(sb.st_dev) == e.dev_major && minor(sb.st_dev) == e.dev_minor;
        if (f.same) {
          f.size = static_cast<std::uint64_t>(sb.st_size);
          f.mtime_ns = static_cast<std::uint64_t>(sb.st_mtim.tv_sec) * 1000000000u +
                       static_cast<std::uint64_t>(sb.st_mtim.tv_nsec);
        }
      }
      n.identity = f.same;
      n.size = f.size;
      n.mtime_ns = f.mtime_ns;
    }
    kept.push_back(n);
    std::sort(kept.begin(), kept.end(),
              [](const raw_map& a, const raw_map& b) { return a.e.start < b.e.start; });
    im.maps = std::move(kept);
    im.dirty = true;
  }

  // The process's unwind set from its mappings: rows for every file mapping that has them.
  // Files are parsed only once a sample reaches their code (a 35 MB compiler's rows are not built
  // for a process that never runs in it): mappings of files not parsed yet are listed in `unparsed`.
  void build_set(image& im) {
    im.modules.clear();
    im.unparsed.clear();
    for (const raw_map& m : im.maps) {
      if (!m.identity) continue;  // not the file mapped, or not a file: frame pointers there
      if (!unwind_.parsed(m.e.path, m.e.inode)) {
        im.unparsed.push_back(m.e);
        continue;
      }
      selfprof::detail::unwind_module u{};
      if (!unwind_.module_for(m.e.path, m.e.inode, m.e.start, m.e.end, m.e.offset, u)) continue;
      if (u.start < m.e.start || u.end > m.e.end) continue;  // cannot be: module_for clips to the mapping
      if (!im.modules.empty() && u.start < im.modules.back().end) continue;
      im.modules.push_back(u);
    }
    im.set = selfprof::detail::unwind_table_set{im.modules.data(), im.modules.size()};
    im.dirty = false;
  }

  // Parses the file of the first unparsed mapping one of `pcs` lies in; true when one was parsed (the
  // set is rebuilt, and the sample is to be unwound again).
  bool parse_reached(image& im, const std::uint64_t* pcs, std::size_t n) {
    for (std::size_t k = 0; k < n; ++k)
      for (const selfprof::detail::maps_entry& e : im.unparsed)
        if (pcs[k] >= e.start && pcs[k] < e.end) {
          unwind_.file(e.path, e.inode);
          build_set(im);
          return true;
        }
    return false;
  }

  void on_sample(cursor& c) {
    selfprof::detail::ring_sample smp;
    if (!selfprof::detail::parse_ring_sample(c, !user_only_, smp, user_chain_, kernel_chain_)) {
      ++counts_.corrupt;
      return;
    }
    const auto pid = static_cast<pid_t>(smp.pid());
    const std::uint32_t tid = smp.tid();
    live_pid_ = pid;
    const std::uint64_t continued = live_.continued;
    const std::uint64_t time = smp.time;
    ++counts_.samples;
    image& im = image_of(pid);
    if (im.dirty) build_set(im);
    pcs_.resize(opts_.max_depth);
    std::size_t kernel = std::min(kernel_chain_.size(), opts_.max_depth / 2);
    std::copy(kernel_chain_.begin(), kernel_chain_.begin() + static_cast<std::ptrdiff_t>(kernel),
              pcs_.begin());
    bool truncated = kernel < kernel_chain_.size(), cut = false, spliced = false;
    selfprof::detail::copy_end end;
    std::size_t depth = kernel;
    if (smp.abi != PERF_SAMPLE_REGS_ABI_NONE) {
      std::size_t user = 0;
      do
        user = selfprof::detail::unwind_sample<foreign_stack>(
            im.set.count ? &im.set : nullptr, smp.uip, smp.sp, smp.bp, smp.stack,
            static_cast<std::size_t>(smp.dyn), user_chain_.data(), user_chain_.size(), pcs_.data() + kernel,
            opts_.max_depth - kernel, cut, spliced, &live_, &end);
      while (!im.unparsed.empty() && parse_reached(im, pcs_.data() + kernel, user));
      depth += user;
    }
    if (depth == 0) pcs_[depth++] = smp.ip;  // a kernel-only sample without a chain: its pc
    for (std::size_t k = kernel; k < depth; ++k)
      if (maybe_jit(im, pcs_[k])) tag_jit(im, pcs_[k], time);
    truncated = truncated || cut;
    if (spliced) ++counts_.spliced;
    if (live_.continued != continued) ++counts_.continued;
    if (truncated) ++counts_.truncated;
    chain_.note(end, spliced, time);
    if (im.table.add(tid, truncated ? selfprof::detail::sample_truncated : 0, pcs_.data(), depth, 1))
      ++counts_.stored;
    else
      ++counts_.no_room;
  }

  // May `pc` be JIT code: anonymous executable memory, a memfd, or outside every mapping known?
  static bool maybe_jit(const image& im, std::uint64_t pc) {
    auto it = std::upper_bound(im.maps.begin(), im.maps.end(), pc,
                               [](std::uint64_t v, const raw_map& m) { return v < m.e.start; });
    if (it == im.maps.begin() || pc >= std::prev(it)->e.end) return true;
    const std::string& path = std::prev(it)->e.path;
    return path.empty() || path == "//anon" || path.compare(0, 7, "/memfd:") == 0;
  }

  void tag_jit(image& im, std::uint64_t& pc, std::uint64_t time) {
    if (!im.jit)
      im.jit = std::make_unique<selfprof::detail::perf_map>(selfprof::detail::perf_map::default_path(im.pid));
    if (im.jit_read_round != round_) {  // the lines written since the last read of the rings
      im.jit->reload_if_changed();
      im.jit_read_round = round_;
    }
    im.jit->tag(pc, time);
  }

  // The names of the perf-map lines the image's samples were tagged with, by lookup address.
  static void name_jit_frames(const image& im, std::unordered_map<std::uint64_t, std::string>& names) {
    selfprof::detail::perf_map::hit hit;
    for (const auto& e : im.table.entries()) {
      const std::uint64_t* pcs = im.table.pcs(e);
      for (std::size_t k = 0; k < e.depth; ++k) {
        if (!selfprof::detail::is_perf_map_tagged(pcs[k])) continue;
        const std::uint64_t lookup = k == 0 ? pcs[k] : pcs[k] - 1;
        if (names.count(lookup) == 0 && im.jit->name_tagged(lookup, hit))
          names[lookup] = std::string(hit.name);
      }
    }
  }

  perf_record_options opts_;
  bool user_only_ = false;
  std::size_t page_ = 4096;
  std::uint64_t start_unix_ns_ = 0;
  std::uint64_t watermark_ = 0;  // records older than this are in every ring read so far
  std::uint64_t round_ = 0;      // reads of the rings so far
  std::vector<ring> rings_;
  std::vector<pending> pending_;
  struct file_seen {  // what stat() said of a mapped file's path in read round `round`
    std::uint64_t round = 0, inode = 0, size = 0, mtime_ns = 0;
    std::uint32_t dev_major = 0, dev_minor = 0;
    bool same = false;  // the path still names the file mapped
  };
  std::unordered_map<std::string, file_seen> seen_;
  std::vector<unsigned char> bytes_, spare_;  // the pending records' bytes, one buffer for a whole read
  std::vector<std::unique_ptr<image>> images_;
  std::unordered_map<pid_t, image*> current_;
  file_unwind_cache unwind_;
  std::vector<std::uint64_t> user_chain_, kernel_chain_, pcs_;
  selfprof::detail::chain_switch chain_;  // which of each CPU's two samplers samples
  perf_record_counts counts_;
  // The sampled process's stack as it is now, where a walk ran off its copy (the recorder is the
  // programs' ancestor, so ptrace's access check lets it read them; a process gone reads nothing).
  pid_t live_pid_ = 0;
  selfprof::detail::live_stack_reader live_{
      [](void* ctx, std::uintptr_t addr, void* out, std::size_t len) -> std::size_t {
        const long got = selfprof::detail::read_process_memory(*static_cast<pid_t*>(ctx), out, addr, len);
        return got > 0 ? static_cast<std::size_t>(got) : 0;
      },
      &live_pid_,
      {},
      0};
};

}  // namespace selfprof_cli
