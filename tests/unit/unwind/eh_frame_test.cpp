// The .eh_frame reader: hand-made CIE/FDE byte sequences (every instruction the walker models, PLT
// expressions, outermost frames, malformed and truncated records), a mutation loop that must never crash,
// and the tables of real modules (this test binary, libc) checked row by row against `readelf -wF`.
#include <doctest/doctest.h>

#include <link.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <map>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include <selfprof/unwind/eh_frame.hpp>
#include <selfprof/unwind/tables.hpp>

using selfprof::detail::eh_frame_hdr_info;
using selfprof::detail::eh_frame_input;
using selfprof::detail::eh_frame_table;
using selfprof::detail::g_unwind_tables;
using selfprof::detail::row_cfa_plt;
using selfprof::detail::row_cfa_rbp;
using selfprof::detail::row_cfa_rsp;
using selfprof::detail::row_no_info;
using selfprof::detail::row_outermost;
using selfprof::detail::row_unknown;
using selfprof::detail::unwind_module;
using selfprof::detail::unwind_row;
using selfprof::detail::unwind_table_set;

namespace {

// Builds .eh_frame bytes: one CIE ("zR", pc-relative sdata4 pointers) and FDEs using it.
struct eh_builder {
  static constexpr std::uintptr_t kAddress = 0x10000000;  // where the bytes pretend to live
  std::vector<std::uint8_t> b;

  void u8(unsigned v) { b.push_back(static_cast<std::uint8_t>(v)); }
  void u32(std::uint32_t v) {
    for (int i = 0; i < 4; ++i) u8((v >> (8 * i)) & 0xff);
  }
  void uleb(std::uint64_t v) {
    do {
      std::uint8_t byte = v & 0x7f;
      v >>= 7;
      u8(v ? byte | 0x80 : byte);
    } while (v);
  }
  void sleb(std::int64_t v) {
    bool more = true;
    while (more) {
      std::uint8_t byte = v & 0x7f;
      v >>= 7;
      more = !((v == 0 && !(byte & 0x40)) || (v == -1 && (byte & 0x40)));
      u8(more ? byte | 0x80 : byte);
    }
  }
  void patch_len(std::size_t at) {
    std::uint32_t len = static_cast<std::uint32_t>(b.size() - at - 4);
    std::memcpy(&b[at], &len, 4);
  }
  // CIE: code_align 1, data_align -8, ra 16, CFA = rsp+8, ra at CFA-8 (what GCC emits on x86-64).
  std::size_t cie(const char* aug = "zR", unsigned fde_enc = 0x1b) {
    std::size_t at = b.size();
    u32(0);
    u32(0);  // CIE id
    u8(1);   // version
    for (const char* p = aug; *p; ++p) u8(static_cast<unsigned char>(*p));
    u8(0);
    uleb(1);
    sleb(-8);
    u8(16);
    if (aug[0] == 'z') {
      uleb(1);
      u8(fde_enc);
    }
    u8(0x0c), uleb(7), uleb(8);  // def_cfa rsp 8
    u8(0x90), uleb(1);           // offset r16 (ra) at cfa-8
    while ((b.size() - at) % 8) u8(0);
    patch_len(at);
    return at;
  }
  // FDE for [begin, begin+range) with the given CFA program.
  void fde(std::size_t cie_at, std::uintptr_t begin, std::uint32_t range,
           const std::vector<std::uint8_t>& program) {
    std::size_t at = b.size();
    u32(0);
    u32(static_cast<std::uint32_t>(b.size() - cie_at));
    std::uintptr_t field = kAddress + b.size();
    u32(static_cast<std::uint32_t>(begin - field));
    u32(range);
    uleb(0);  // augmentation data length
    b.insert(b.end(), program.begin(), program.end());
    while ((b.size() - at) % 8) u8(0);
    patch_len(at);
  }
  void end() { u32(0); }
  eh_frame_input input() const { return eh_frame_input{b.data(), b.size(), kAddress}; }
};

// Looks up rows of one parsed table through a one-module set, as the handler does.
// A table as the handler reads it, with its block index (unwind_module::index).
struct one_module {
  std::vector<std::uint32_t> index;
  unwind_module m;
  unwind_table_set set;
  explicit one_module(const eh_frame_table& t) : m{t.start, t.end, t.rows.data(), t.rows.size(), nullptr, 0} {
    if (!t.rows.empty())
      selfprof::detail::build_row_index(t.rows.data(), t.rows.size(), t.end - t.start, index);
    m.index = index.empty() ? nullptr : index.data();
    m.index_count = index.size();
    set = unwind_table_set{&m, 1};
  }
  const unwind_row* at(std::uintptr_t pc) const { return find_unwind_row(&set, pc); }
};

// Every table promise: rows strictly increasing, the last one ends the module, offsets in range.
void check_table_shape(const eh_frame_table& t) {
  if (t.rows.empty()) return;
  bool sorted = true, kinds = true;
  for (std::size_t i = 1; i < t.rows.size(); ++i) sorted = sorted && t.rows[i - 1].pc < t.rows[i].pc;
  for (const unwind_row& r : t.rows) kinds = kinds && r.kind <= row_no_info;
  REQUIRE(sorted);
  REQUIRE(kinds);
  REQUIRE(t.rows.back().kind == row_no_info);
  REQUIRE(t.rows.back().pc == t.end - t.start);
}

const std::uintptr_t kFn = 0x20000000;

}  // namespace

TEST_CASE("eh_frame: a GCC-style prologue/epilogue becomes rows the walker follows") {
  eh_builder e;
  std::size_t c = e.cie();
  e.fde(c, kFn, 0x40,
        {0x41, 0x0e, 16,    // advance 1; def_cfa_offset 16      (after push %rbp)
         0x86, 2,           // offset rbp at cfa-16
         0x43, 0x0d, 6,     // advance 3; def_cfa_register rbp   (after mov %rsp,%rbp)
         0x0a,              // remember_state
         0x70, 0x0c, 7, 8,  // advance 0x30; def_cfa rsp 8        (after leave)
         0x41, 0x0b});      // advance 1; restore_state
  e.end();
  eh_frame_table t = parse_eh_frame(e.input());
  CHECK(t.error == "");
  CHECK(t.fdes == 1);
  CHECK(t.cies == 1);
  REQUIRE(t.start == kFn);
  REQUIRE(t.end == kFn + 0x40);
  check_table_shape(t);
  one_module m(t);
  const unwind_row* r = m.at(kFn);
  REQUIRE(r);
  CHECK(r->kind == row_cfa_rsp);
  CHECK(r->cfa_off == 8);
  CHECK(r->fp_off == 0);
  r = m.at(kFn + 1);
  REQUIRE(r);
  CHECK(r->kind == row_cfa_rsp);
  CHECK(r->cfa_off == 16);
  CHECK(r->fp_off == -16);
  r = m.at(kFn + 0x10);
  REQUIRE(r);
  CHECK(r->kind == row_cfa_rbp);
  CHECK(r->cfa_off == 16);
  CHECK(r->fp_off == -16);
  r = m.at(kFn + 0x34);  // after leave: CFA = rsp+8, rbp rule still "saved" until the state is restored
  REQUIRE(r);
  CHECK(r->kind == row_cfa_rsp);
  CHECK(r->cfa_off == 8);
  r = m.at(kFn + 0x35);  // restore_state: back to the rbp-based rule
  REQUIRE(r);
  CHECK(r->kind == row_cfa_rbp);
  CHECK(m.at(kFn + 0x40) == nullptr);  // past the FDE
  CHECK(m.at(kFn - 1) == nullptr);
}

TEST_CASE("eh_frame: gaps between FDEs have no rows, adjacent FDEs keep their own rules") {
  eh_builder e;
  std::size_t c = e.cie();
  e.fde(c, kFn + 0x100, 0x10, {0x44, 0x0e, 32});  // second in address order, listed first
  e.fde(c, kFn, 0x20, {});
  e.fde(c, kFn + 0x20, 0x10, {0x41, 0x0e, 24});  // adjacent to the first
  e.end();
  eh_frame_table t = parse_eh_frame(e.input());
  CHECK(t.fdes == 3);
  check_table_shape(t);
  one_module m(t);
  REQUIRE(m.at(kFn + 0x1f));
  CHECK(m.at(kFn + 0x1f)->cfa_off == 8);
  REQUIRE(m.at(kFn + 0x21));
  CHECK(m.at(kFn + 0x21)->cfa_off == 24);
  CHECK(m.at(kFn + 0x30) == nullptr);
  CHECK(m.at(kFn + 0xff) == nullptr);
  REQUIRE(m.at(kFn + 0x104));
  CHECK(m.at(kFn + 0x104)->cfa_off == 32);
  CHECK(m.at(kFn + 0x110) == nullptr);
}

TEST_CASE("eh_frame: PLT expressions, outermost frames, unknown rules and the advance forms") {
  eh_builder e;
  std::size_t c = e.cie();
  // binutils' lazy PLT: CFA = rsp + 8 + ((rip & 15) >= 11 ? 8 : 0), after 6 bytes of rsp+16.
  e.fde(
      c, kFn, 0x30,
      {0x0e, 16, 0x46, 0x0e, 24, 0x4a, 0x0f, 11, 0x77, 8, 0x80, 0, 0x3f, 0x1a, 0x3b, 0x2a, 0x33, 0x24, 0x22});
  // _start / clone: the return address is undefined.
  e.fde(c, kFn + 0x40, 0x10, {0x07, 16});
  // CFA in another register (r10), then back; an advance_loc2 and advance_loc4; val_offset on rbp.
  e.fde(c, kFn + 0x60, 0x400,
        {0x0c, 10, 0, 0x03, 0x00, 0x01, 0x0c, 7, 8, 0x04, 0x00, 0x01, 0, 0, 0x14, 6, 2});
  // rbp saved with offset_extended_sf; the GNU args-size note is skipped.
  e.fde(c, kFn + 0x500, 0x20, {0x2e, 16, 0x11, 6, 0x7e, 0x41, 0x12, 6, 2});
  e.end();
  eh_frame_table t = parse_eh_frame(e.input());
  CHECK(t.error == "");
  check_table_shape(t);
  one_module m(t);
  REQUIRE(m.at(kFn + 0x10));
  const unwind_row* plt = m.at(kFn + 0x10);
  CHECK(plt->kind == row_cfa_plt);
  CHECK(plt->cfa_off == 8);
  CHECK(plt->plt_threshold == 11);
  REQUIRE(m.at(kFn + 0x41));
  CHECK(m.at(kFn + 0x41)->kind == row_outermost);
  REQUIRE(m.at(kFn + 0x60));
  CHECK(m.at(kFn + 0x60)->kind == row_unknown);  // CFA based on r10
  REQUIRE(m.at(kFn + 0x160));
  CHECK(m.at(kFn + 0x160)->kind == row_cfa_rsp);
  REQUIRE(m.at(kFn + 0x260));
  // val_offset on rbp: the caller's rbp cannot be recovered, so the row is not used (one FP step); taking
  // the current rbp for the caller's would send the rest of the walk through a wrong frame.
  CHECK(m.at(kFn + 0x260)->kind == row_unknown);
  REQUIRE(m.at(kFn + 0x500));
  CHECK(m.at(kFn + 0x500)->fp_off == 16);  // offset_extended_sf: -2 * -8
  REQUIRE(m.at(kFn + 0x501));
  CHECK(m.at(kFn + 0x501)->kind == row_cfa_rbp);
  CHECK(m.at(kFn + 0x501)->cfa_off == -16);  // def_cfa_sf: 2 * -8
}

TEST_CASE("eh_frame: malformed records are skipped and named, the good ones kept") {
  SUBCASE("unknown opcode: rows before it hold, the rest is unknown") {
    eh_builder e;
    std::size_t c = e.cie();
    e.fde(c, kFn, 0x20, {0x41, 0x0e, 16, 0x42, 0x3f, 0x0e, 24});
    e.end();
    eh_frame_table t = parse_eh_frame(e.input());
    CHECK(t.skipped == 1);
    CHECK(t.error.find("malformed CFA instructions") != std::string::npos);
    one_module m(t);
    REQUIRE(m.at(kFn + 1));
    CHECK(m.at(kFn + 1)->cfa_off == 16);
    REQUIRE(m.at(kFn + 5));
    CHECK(m.at(kFn + 5)->kind == row_unknown);
  }
  SUBCASE("an FDE pointing at a non-CIE, a record running past the end") {
    eh_builder e;
    std::size_t c = e.cie();
    e.fde(c, kFn, 0x20, {});
    std::size_t bad = e.b.size();
    e.fde(c, kFn + 0x40, 0x20, {});
    std::uint32_t wrong = static_cast<std::uint32_t>(bad + 4 - 24);  // points into the first FDE
    std::memcpy(&e.b[bad + 4], &wrong, 4);
    std::size_t tail = e.b.size();
    e.fde(c, kFn + 0x80, 0x20, {});
    std::uint32_t huge = 0x7fffffff;
    std::memcpy(&e.b[tail], &huge, 4);
    eh_frame_table t = parse_eh_frame(e.input());
    CHECK(t.fdes == 1);
    CHECK(t.skipped == 2);
    CHECK(t.error.find("offset 0x") != std::string::npos);
    check_table_shape(t);
  }
  SUBCASE("unknown augmentation and unsupported version") {
    eh_builder e;
    std::size_t c = e.cie("xy");
    e.fde(c, kFn, 0x20, {});
    std::size_t c2 = e.cie();
    e.b[c2 + 8] = 9;  // version
    e.fde(c2, kFn + 0x40, 0x20, {});
    e.end();
    eh_frame_table t = parse_eh_frame(e.input());
    CHECK(t.fdes == 0);
    CHECK(t.rows.empty());
    CHECK(t.skipped >= 2);
  }
  SUBCASE("every truncation of a valid buffer parses without reading past it") {
    eh_builder e;
    std::size_t c = e.cie("zPLR");  // no personality/LSDA bytes: malformed on purpose, must be rejected
    (void)c;
    std::size_t c2 = e.cie();
    e.fde(c2, kFn, 0x40, {0x41, 0x0e, 16, 0x86, 2, 0x43, 0x0d, 6, 0x0a, 0x70, 0x0c, 7, 8, 0x41, 0x0b});
    e.fde(c2, kFn + 0x40, 0x40, {0x0f, 11, 0x77, 8, 0x80, 0, 0x3f, 0x1a, 0x3b, 0x2a, 0x33, 0x24, 0x22});
    for (std::size_t n = 0; n <= e.b.size(); ++n) {
      std::vector<std::uint8_t> cut(e.b.begin(), e.b.begin() + static_cast<std::ptrdiff_t>(n));
      eh_frame_table t = parse_eh_frame(eh_frame_input{cut.data(), cut.size(), eh_builder::kAddress});
      check_table_shape(t);
    }
  }
}

namespace {
// The .eh_frame bytes of a loaded module (found through its eh_frame_hdr), copied out of memory.
struct module_frames {
  std::string name;
  std::uintptr_t bias = 0, address = 0;
  std::vector<std::uint8_t> bytes;
};

std::string self_exe() {
  char buf[4096];
  ssize_t n = readlink("/proc/self/exe", buf, sizeof buf - 1);
  return n > 0 ? std::string(buf, static_cast<std::size_t>(n)) : std::string();
}

std::vector<module_frames> loaded_eh_frames() {
  std::vector<module_frames> out;
  dl_iterate_phdr(
      [](dl_phdr_info* info, std::size_t, void* data) -> int {
        auto& list = *static_cast<std::vector<module_frames>*>(data);
        for (int i = 0; i < info->dlpi_phnum; ++i) {
          const ElfW(Phdr)& p = info->dlpi_phdr[i];
          if (p.p_type != PT_GNU_EH_FRAME) continue;
          std::uintptr_t hdr = info->dlpi_addr + p.p_vaddr;
          eh_frame_hdr_info hi;
          if (!parse_eh_frame_hdr(eh_frame_input{reinterpret_cast<const std::uint8_t*>(hdr), p.p_memsz, hdr},
                                  hi))
            continue;
          // Size: up to the end of the segment holding it.
          for (int k = 0; k < info->dlpi_phnum; ++k) {
            const ElfW(Phdr)& l = info->dlpi_phdr[k];
            std::uintptr_t lo = info->dlpi_addr + l.p_vaddr, end = lo + l.p_filesz;
            if (l.p_type != PT_LOAD || hi.eh_frame < lo || hi.eh_frame >= end) continue;
            module_frames m;
            m.name = info->dlpi_name && *info->dlpi_name ? info->dlpi_name : self_exe();
            m.bias = info->dlpi_addr;
            m.address = hi.eh_frame;
            const std::uint8_t* from = reinterpret_cast<const std::uint8_t*>(hi.eh_frame);
            m.bytes.assign(from, from + (end - hi.eh_frame));
            list.push_back(std::move(m));
          }
        }
        return 0;
      },
      &out);
  return out;
}

std::string run(const std::string& cmd) {
  std::string out;
  if (FILE* f = popen(cmd.c_str(), "r")) {
    char buf[65536];
    std::size_t n;
    while ((n = fread(buf, 1, sizeof buf, f)) > 0) out.append(buf, n);
    pclose(f);
  }
  return out;
}
}  // namespace

TEST_CASE("eh_frame: the tables of this binary and libc agree with readelf -wF row by row") {
  if (run("command -v readelf").empty()) {
    MESSAGE("readelf not installed: skipped");
    return;
  }
  REQUIRE(selfprof::build_unwind_tables());
  const unwind_table_set* set = g_unwind_tables.load();
  REQUIRE(set != nullptr);
  int checked_modules = 0;
  for (const module_frames& mod : loaded_eh_frames()) {
    bool is_libc = mod.name.find("libc.so") != std::string::npos;
    bool is_exe = mod.name == self_exe();
    if (!is_libc && !is_exe) continue;
    ++checked_modules;
    std::istringstream lines(run("readelf -wF '" + mod.name + "' 2>/dev/null"));
    std::string line;
    std::vector<std::string> columns;
    std::size_t rows = 0, same = 0, exp_rows = 0, mismatches = 0;
    bool in_eh = false, in_fde = false;
    while (std::getline(lines, line)) {
      if (line.find("Contents of the") != std::string::npos)
        in_eh = line.find(".eh_frame section") != std::string::npos;
      if (!in_eh) continue;
      if (line.find(" CIE") != std::string::npos) in_fde = false;  // a CIE's initial rows have no address
      if (line.find(" FDE ") != std::string::npos) in_fde = true;
      if (!in_fde) continue;
      std::istringstream words(line);
      std::vector<std::string> w;
      for (std::string x; words >> x;) w.push_back(x);
      if (w.empty()) continue;
      if (w[0] == "LOC") {
        columns = w;
        continue;
      }
      if (w.size() != columns.size() || w[0].size() != 16 ||
          w[0].find_first_not_of("0123456789abcdef") != std::string::npos)
        continue;
      std::map<std::string, std::string> col;
      for (std::size_t i = 1; i < w.size(); ++i) col[columns[i]] = w[i];
      std::uintptr_t pc = std::stoull(w[0], nullptr, 16) + mod.bias;
      const unwind_row* r = find_unwind_row(set, pc);
      ++rows;
      std::string cfa = col["CFA"], ra = col["ra"], rbp = col.count("rbp") ? col["rbp"] : "u";
      if (ra == "u") {
        bool ok = r && r->kind == row_outermost;
        if (!ok && ++mismatches <= 5)
          MESSAGE(mod.name << ": readelf " << line << " / ours kind " << (r ? int(r->kind) : -1));
        continue;
      }
      if (cfa == "exp" || ra != "c-8" || (rbp != "u" && rbp.rfind("c-", 0) != 0)) {
        ++exp_rows;  // expressions: PLT rows or row_unknown
        bool ok = r && (r->kind == row_cfa_plt || r->kind == row_unknown);
        if (!ok && ++mismatches <= 5)
          MESSAGE(mod.name << ": readelf " << line << " / ours kind " << (r ? int(r->kind) : -1));
        continue;
      }
      bool ok = r != nullptr;
      if (ok && cfa.rfind("rsp+", 0) == 0)
        ok = r->kind == row_cfa_rsp && r->cfa_off == std::stoi(cfa.substr(4));
      else if (ok && cfa.rfind("rbp+", 0) == 0)
        ok = r->kind == row_cfa_rbp && r->cfa_off == std::stoi(cfa.substr(4));
      else if (ok)
        ok = r->kind == row_unknown;
      if (ok && rbp != "u") ok = r->kind == row_unknown || r->fp_off == -std::stoi(rbp.substr(2));
      if (ok && rbp == "u") ok = r->kind == row_unknown || r->fp_off == 0;
      if (ok)
        ++same;
      else if (++mismatches <= 5)
        MESSAGE(mod.name << ": readelf " << line << " / ours kind " << (r ? int(r->kind) : -1) << " cfa "
                         << (r ? r->cfa_off : 0) << " fp " << (r ? r->fp_off : 0));
    }
    MESSAGE(mod.name << ": " << rows << " readelf rows, " << same << " identical, " << exp_rows
                     << " expressions");
    CHECK(rows > 100);
    CHECK(mismatches == 0);
  }
  CHECK(checked_modules == 2);
  selfprof::release_unwind_tables();
  CHECK(g_unwind_tables.load() == nullptr);
}

TEST_CASE("eh_frame: mutated copies of real and hand-made tables never crash the reader") {
  std::vector<std::vector<std::uint8_t>> seeds;
  std::vector<std::uintptr_t> addresses;
  for (const module_frames& mod : loaded_eh_frames()) {
    if (mod.name.find("libc.so") == std::string::npos && mod.name != self_exe()) continue;
    eh_frame_table t = parse_eh_frame(eh_frame_input{mod.bytes.data(), mod.bytes.size(), mod.address});
    CHECK(t.fdes > 10);
    check_table_shape(t);
    std::size_t n = std::min<std::size_t>(mod.bytes.size(), 6000);  // the first few hundred records
    seeds.emplace_back(mod.bytes.begin(), mod.bytes.begin() + static_cast<std::ptrdiff_t>(n));
    addresses.push_back(mod.address);
  }
  eh_builder e;
  std::size_t c = e.cie();
  e.fde(c, kFn, 0x40, {0x41, 0x0e, 16, 0x86, 2, 0x43, 0x0d, 6, 0x0a, 0x70, 0x0c, 7, 8, 0x41, 0x0b});
  e.end();
  seeds.push_back(e.b);
  addresses.push_back(eh_builder::kAddress);
  REQUIRE(seeds.size() >= 2);
  std::mt19937 rng(12345);
  std::size_t tables_with_rows = 0;
  for (int round = 0; round < 3000; ++round) {
    std::size_t s = static_cast<std::size_t>(round) % seeds.size();
    std::vector<std::uint8_t> m = seeds[s];
    int edits = 1 + static_cast<int>(rng() % 8);
    for (int k = 0; k < edits && !m.empty(); ++k) {
      std::size_t at = rng() % m.size();
      switch (rng() % 4) {
        case 0:
          m[at] = static_cast<std::uint8_t>(rng());
          break;
        case 1:
          m[at] ^= static_cast<std::uint8_t>(1u << (rng() % 8));
          break;
        case 2:
          m[at] = (rng() & 1) ? 0xff : 0x00;
          break;
        default:
          m.resize(at);
          break;
      }
    }
    eh_frame_table t = parse_eh_frame(eh_frame_input{m.data(), m.size(), addresses[s]});
    check_table_shape(t);
    if (!t.rows.empty()) ++tables_with_rows;
    one_module mod(t);
    for (int q = 0; q < 8; ++q) mod.at(t.start + rng() % (t.end - t.start + 16));  // lookups stay in bounds
  }
  CHECK(tables_with_rows > 100);  // most mutations leave most records intact
}

TEST_CASE("eh_frame_hdr: the header of a real module leads to its .eh_frame") {
  std::vector<module_frames> mods = loaded_eh_frames();
  REQUIRE(!mods.empty());
  // A header with an unknown version or a truncated one is refused.
  std::uint8_t bad[4] = {2, 0x1b, 0x03, 0x3b};
  eh_frame_hdr_info hi;
  CHECK_FALSE(parse_eh_frame_hdr(eh_frame_input{bad, sizeof bad, 0x1000}, hi));
  std::uint8_t short_hdr[6] = {1, 0x1b, 0x03, 0x3b, 0x10, 0};
  CHECK_FALSE(parse_eh_frame_hdr(eh_frame_input{short_hdr, sizeof short_hdr, 0x1000}, hi));
  std::uint8_t good[12] = {1, 0x1b, 0xff, 0xff, 0x10, 0, 0, 0};
  REQUIRE(parse_eh_frame_hdr(eh_frame_input{good, 8, 0x1000}, hi));
  CHECK(hi.eh_frame == 0x1000 + 4 + 0x10);
  CHECK(hi.fde_count == 0);
}

TEST_CASE("row index: every pc of the published modules finds the row a full binary search finds") {
  REQUIRE(selfprof::build_unwind_tables());
  const unwind_table_set* set = g_unwind_tables.load();
  REQUIRE(set != nullptr);
  std::size_t pcs = 0, indexed = 0, differ = 0;
  std::size_t hint = ~std::size_t{0};
  for (std::size_t i = 0; i < set->count; ++i) {
    const unwind_module& with = set->modules[i];
    if (with.index != nullptr) ++indexed;
    unwind_module without = with;
    without.index = nullptr;
    without.index_count = 0;
    const unwind_table_set plain{&without, 1};
    for (std::uintptr_t pc = with.start; pc < with.end + 16; pc += 3) {  // and past the end
      ++pcs;
      if (find_unwind_row(set, pc, &hint) != find_unwind_row(&plain, pc) &&
          !(pc >= with.end && find_unwind_row(&plain, pc) == nullptr))
        ++differ;
    }
  }
  MESSAGE(pcs << " pcs in " << set->count << " modules (" << indexed << " indexed)");
  CHECK(indexed == set->count);
  CHECK(pcs > 100000);
  CHECK(differ == 0);
}
