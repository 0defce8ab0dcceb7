// Writes the synthetic profiles of tests/unit/output/fixtures.hpp as .pb.gz (gzipped pprof) and
// .folded files into a directory, for tests/output/pprof_check.sh to compare with `go tool pprof`.
// Usage: pprof_gen OUTDIR
#define DOCTEST_CONFIG_IMPLEMENT
#include "../unit/output/fixtures.hpp"

#include <cstdio>

#include "selfprof/output/folded.hpp"
#include "selfprof/output/gzip.hpp"
#include "selfprof/output/pprof.hpp"
#include "selfprof/output/sink.hpp"

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s OUTDIR\n", argv[0]);
    return 2;
  }
  const std::string dir = argv[1];
  struct named {
    const char* name;
    selfprof::profile p;
  } profiles[] = {{"basic", output_fixtures::basic_profile()}, {"many", output_fixtures::many_profile(5000)}};
  for (auto& [name, p] : profiles) {
    const std::string base = dir + "/" + name;
    const std::string raw = selfprof::detail::encode_pprof(p);
    const selfprof::status results[] = {
        selfprof::detail::write_file_atomic(base + ".folded", selfprof::write_folded(p)),
        selfprof::detail::write_file_atomic(base + ".pb.gz", selfprof::write_pprof(p)),
        selfprof::detail::write_file_atomic(base + ".stored.pb.gz", selfprof::detail::gzip_stored(raw)),
    };
    for (const auto& st : results)
      if (!st) {
        std::fprintf(stderr, "%s\n", st.message().c_str());
        return 1;
      }
  }
  return 0;
}
