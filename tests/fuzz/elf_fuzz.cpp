// libFuzzer target for the ELF reader and symbol table: any input must parse to a value or an error,
// never crash or read out of bounds.
// Build: clang++ -std=c++17 -g -O1 -fsanitize=fuzzer,address,undefined -Iinclude tests/fuzz/elf_fuzz.cpp -o
// elf_fuzz Run:   ./elf_fuzz -max_total_time=60 [corpus_dir]  (seed the corpus with a few .so files)
#include <cstddef>
#include <cstdint>
#include <string>

#include "selfprof/symbols/elf.hpp"
#include "selfprof/symbols/symbol_table.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace selfprof::detail;
  elf_image image;
  if (!image.parse(byte_view{data, size}, "fuzz")) return 0;
  symbol_table table;
  if (const elf_section* s = image.find_section_type(SHT_SYMTAB)) table.add_symbols(image, *s);
  if (const elf_section* s = image.find_section_type(SHT_DYNSYM)) table.add_symbols(image, *s);
  table.add_plt(image);
  table.finish();
  symbol_table::hit hit;
  for (std::uint64_t a = 0; a < 0x4000; a += 0x40)
    if (table.lookup(a, hit)) (void)table.name(hit.index);
  (void)image.build_id();
  std::string link;
  std::uint32_t crc = 0;
  (void)image.debuglink(link, crc);
  for (const elf_section& s : image.sections()) (void)image.section_bytes(s);
  (void)image.load_bias(0x7f0000000000ull, 0x1000);
  return 0;
}
