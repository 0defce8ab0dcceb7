#!/usr/bin/env bash
# Folded -> SVG render benchmark: selfprof vs flamegraph.pl on the same 100,000 unique stacks, same run.
# flamegraph.pl is not part of this repo: point FLAMEGRAPH_PL at a copy outside it (e.g. in /tmp).
# Usage: FLAMEGRAPH_PL=/tmp/fg/flamegraph.pl bench/svg_bench.sh [stacks]
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
out="$(mktemp -d /tmp/selfprof-svg-bench.XXXXXX)"
stacks="${1:-100000}"
"${CXX:-g++}" -std=c++17 -O2 -DNDEBUG -I"$root/include" "$root/bench/svg_bench.cpp" -o "$out/svg_bench"
"$out/svg_bench" "$out" "$stacks" | tee "$out/selfprof.txt"
ours=$(sed -n 's/.*total_s=\([0-9.]*\).*/\1/p' "$out/selfprof.txt")
if [ -n "${FLAMEGRAPH_PL:-}" ] && [ -f "$FLAMEGRAPH_PL" ]; then
  best=""
  for _ in 1 2 3; do
    t0=$(date +%s.%N)
    perl "$FLAMEGRAPH_PL" "$out/bench.folded" > "$out/perl.svg" 2> "$out/perl.err"
    t1=$(date +%s.%N)
    t=$(echo "$t1 - $t0" | bc -l)
    if [ -z "$best" ] || [ "$(echo "$t < $best" | bc -l)" = 1 ]; then best=$t; fi
  done
  printf 'flamegraph.pl_s=%.4f perl_svg_bytes=%s perl_frames=%s\n' "$best" "$(stat -c %s "$out/perl.svg")" \
    "$(grep -c '<title>' "$out/perl.svg" || true)"
  printf 'speedup=%.1fx (selfprof parse+render in process vs flamegraph.pl process)\n' "$(echo "$best / $ours" | bc -l)"
  printf 'size_ratio=%.3f (selfprof.svg / perl.svg)\n' \
    "$(echo "$(stat -c %s "$out/selfprof.svg") / $(stat -c %s "$out/perl.svg")" | bc -l)"
else
  echo "flamegraph.pl not run: set FLAMEGRAPH_PL to a local copy of it"
fi
echo "outputs in $out"
