#!/bin/bash
# A big program and many small ones under `selfprof record --follow-exec` and `perf record -g`, in one run
# (issue 19): a C++ compile (g++ execs cc1plus, a binary of tens of MB with a large .eh_frame, then as),
# and `as` on a small file run N times in one shell loop (as a build runs it). Rounds alternate alone,
# selfprof and perf. For each: the programs' CPU (user+system of the recorded command's children, from
# bash's `times`, so neither recorder's own CPU is in it), the excess against alone in the same round,
# and selfprof's own CPU split as `selfprof record -v` reports it (start, reading the rings and
# unwinding, naming, writing). perf record's own CPU is the whole run less the programs'.
# Usage: bench/big_program.sh SELFPROF_BINARY [ROUNDS] [N]   (499 Hz, as in the issue; HZ=... to change:
# a higher rate magnifies the per-sample cost the two recorders put on the programs)
set -u
bin=${1:?usage: big_program.sh SELFPROF_BINARY [ROUNDS] [N]}
bin=$(cd "$(dirname "$bin")" && pwd)/$(basename "$bin")
rounds=${2:-3}
n=${3:-100}
hz=${HZ:-499}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cd "$tmp"
cat > tu.cpp << 'EOF'
#include <algorithm>
#include <map>
#include <regex>
#include <sstream>
#include <string>
#include <vector>
template <int N> struct fib { static constexpr long v = fib<N - 1>::v + fib<N - 2>::v; };
template <> struct fib<1> { static constexpr long v = 1; };
template <> struct fib<0> { static constexpr long v = 0; };
template <class T> std::map<std::string, T> count_words(const std::vector<std::string>& in) {
  std::map<std::string, T> m;
  std::regex re("[a-z]+");
  for (auto& s : in)
    for (std::sregex_iterator it(s.begin(), s.end(), re), e; it != e; ++it) ++m[it->str()];
  return m;
}
int main() {
  std::vector<std::string> v{"a b c", "d e f"};
  auto a = count_words<int>(v); auto b = count_words<long>(v); auto c = count_words<double>(v);
  auto d = count_words<unsigned>(v); auto e = count_words<short>(v);
  std::vector<int> x(100);
  std::sort(x.begin(), x.end(), [](int p, int q) { return p > q; });
  std::stable_sort(x.begin(), x.end());
  std::ostringstream os;
  os << a.size() << b.size() << c.size() << d.size() << e.size() << fib<60>::v;
  return (int)os.str().size();
}
EOF
printf '.text\n.globl f\nf:\n  mov $1, %%eax\n  ret\n' > small.s
perf_ok=0
perf record -q -g -o probe.data -- true > /dev/null 2>&1 && perf_ok=1

# cpu WRAPPER... :: CMD: "programs_ms total_ms" for CMD run by bash (whose `times` gives its children's
# CPU) under WRAPPER; total is everything, the wrapper included.
cpu() {
  local w=()
  while [ "$1" != :: ]; do w+=("$1"); shift; done
  shift
  local t
  t=$( { TIMEFORMAT='%U %S'; time "${w[@]}" bash -c "$1; times" > times.out 2> wrap.err; } 2>&1 )
  awk -v t="$t" 'NR == 2 { gsub(/[ms]/, " "); split($0, a, " "); p = (a[1] * 60 + a[2] + a[3] * 60 + a[4]) * 1000 }
    END { split(t, b, " "); printf "%.0f %.0f", p, (b[1] + b[2]) * 1000 }' times.out
}
# split: selfprof's own CPU from its -v line.
split_of() { sed -n 's/.*own CPU: \(.*\)/\1/p' wrap.err | head -1; }

workloads=("g++ -O2 -c tu.cpp -o tu.o" "for ((i = 0; i < $n; i++)); do as small.s -o small.o; done")
names=("g++ -O2 -c (cc1plus, as)" "as x $n")
echo "# $(uname -srm), $(nproc) CPUs, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'); $rounds rounds at $hz Hz"
for k in 0 1; do
  for ((r = 1; r <= rounds; r++)); do
    read -r a_p a_t <<< "$(cpu env :: "${workloads[$k]}")"
    read -r s_p s_t <<< "$(cpu "$bin" record -v -q --follow-exec -F $hz -o sp.folded -- :: "${workloads[$k]}")"
    s_split=$(split_of)
    p_p= p_t=
    [ $perf_ok = 1 ] && read -r p_p p_t <<< "$(cpu perf record -q -g -F $hz -o perf.data -- :: "${workloads[$k]}")"
    awk -v name="${names[$k]}" -v r="$r" -v ap="$a_p" -v sp="$s_p" -v st="$s_t" -v pp="$p_p" -v pt="$p_t" -v own="$s_split" 'BEGIN {
      printf "%-26s round %d: programs alone %6.0f ms | under selfprof %6.0f ms (%+.1f%%), selfprof itself %.0f ms",
        name, r, ap, sp, (sp - ap) * 100 / ap, st - sp
      if (pp != "") printf " | under perf record -g %6.0f ms (%+.1f%%), perf itself %.0f ms", pp, (pp - ap) * 100 / ap, pt - pp
      printf "\n%-26s          selfprof: %s\n", "", own }'
  done
done
