#!/bin/bash
# Benchmark of the selfprof tool against the FlameGraph Perl scripts, in the same run on the same input:
#   selfprof collapse | selfprof flamegraph   vs   stackcollapse-perf.pl | flamegraph.pl
# The input is `perf script` text of at least 200,000 samples, recorded here (in /tmp) from a busy
# program at high frequency. Reports wall time and peak RSS (/usr/bin/time -v) of each stage.
# Usage: FLAMEGRAPH_DIR=/tmp/fg bench/cli_bench.sh path/to/selfprof   (needs perf, gcc, root or
#        perf_event_paranoid <= 1). FlameGraph is fetched for the benchmark only, never committed.
set -euo pipefail
bin=${1:?usage: cli_bench.sh path/to/selfprof}
fg=${FLAMEGRAPH_DIR:?set FLAMEGRAPH_DIR to a FlameGraph checkout}
here=$(cd "$(dirname "$0")/.." && pwd)
work=${BENCH_DIR:-/tmp/selfprof-cli-bench}
want=${BENCH_SAMPLES:-200000}
mkdir -p "$work"
cd "$work"
if [ ! -s bench.txt ] || [ "$(grep -c ' cpu-clock' bench.txt)" -lt "$want" ]; then
  gcc -O2 -g -fno-omit-frame-pointer -o workload "$here/tests/cli/fixtures/src/workload.c"
  : > bench.txt
  while [ "$(grep -c ' cpu-clock' bench.txt)" -lt "$want" ]; do
    perf record -q -F 20000 -g -o bench.data -- ./workload 3000000000 > /dev/null 2>&1
    perf script -i bench.data >> bench.txt
  done
fi
samples=$(grep -c ' cpu-clock' bench.txt)
echo "input: $(du -h bench.txt | cut -f1) of perf script text, $samples samples"

# run NAME CMD...: wall seconds and peak RSS (KiB) via /usr/bin/time -v
run() {
  local name=$1; shift
  /usr/bin/time -v -o "time-$name.txt" "$@"
  local wall rss
  wall=$(awk -F': ' '/Elapsed \(wall clock\)/ { n = split($2, p, ":"); s = 0; for (i = 1; i <= n; i++) s = s * 60 + p[i]; print s }' "time-$name.txt")
  rss=$(awk -F': ' '/Maximum resident set size/ { print $2 }' "time-$name.txt")
  echo "$name $wall $rss" >> results.txt
  printf '  %-26s %8.2f s %10s KiB peak RSS\n' "$name" "$wall" "$rss"
}
: > results.txt
echo "selfprof:"
run selfprof-collapse "$bin" collapse -q bench.txt -o sp.folded
run selfprof-flamegraph "$bin" flamegraph -q sp.folded -o sp.svg
echo "FlameGraph (perl):"
run perl-collapse sh -c "perl '$fg/stackcollapse-perf.pl' bench.txt > pl.folded"
run perl-flamegraph sh -c "perl '$fg/flamegraph.pl' pl.folded > pl.svg"
cmp -s sp.folded pl.folded && echo "folded output: identical to stackcollapse-perf.pl" ||
  { echo "folded output DIFFERS from stackcollapse-perf.pl"; exit 1; }
awk '
  /^selfprof/ { st += $2; if ($3 > sm) sm = $3 }
  /^perl/ { pt += $2; if ($3 > pm) pm = $3 }
  END {
    printf "end to end: selfprof %.2f s (peak %d KiB), perl %.2f s (peak %d KiB): %.1fx faster, %.1fx less memory\n",
           st, sm, pt, pm, (st > 0 ? pt / st : 0), (sm > 0 ? pm / sm : 0)
  }' results.txt
