#!/usr/bin/env bash
# Builds bench/observer_effect.cpp and runs it in its three modes (none, thread, selfprof), each in a
# fresh process, interleaved, --runs times; prints per operation the median ns/op of each mode and the
# ratios against "none" measured in the same run. The "thread" column is glibc's and libstdc++'s
# single-thread fast paths lost to any second thread; "selfprof" adds the sampling itself. With
# --record BIN, a fourth mode: "none" run under `BIN record --follow-exec` (perf_event rings read by the
# recorder: no thread is added to the program).
# Usage: bench/observer_effect.sh [--runs 7] [--hz 99] [--scale 1] [--record path/to/selfprof]
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
runs=7 hz=99 scale=1 record=
while [ $# -gt 0 ]; do
  case "$1" in
    --record) record=$2; shift 2 ;;
    --runs) runs=$2; shift 2 ;;
    --hz) hz=$2; shift 2 ;;
    --scale) scale=$2; shift 2 ;;
    *) echo "usage: $0 [--runs N] [--hz HZ] [--scale N] [--record SELFPROF]" >&2; exit 2 ;;
  esac
done
out="$(mktemp -d /tmp/selfprof-observer.XXXXXX)"
"${CXX:-g++}" -std=c++17 -O2 -g -fno-omit-frame-pointer -Wall -Wextra -Wpedantic -Werror -I"$root/include" \
  "$root/bench/observer_effect.cpp" -o "$out/observer_effect" -pthread -ldl
echo "# $(uname -srm), $(nproc) CPUs, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), $(ldd --version | head -1)"
echo "# load average before: $(cut -d' ' -f1-3 /proc/loadavg); $runs runs per mode, selfprof at $hz Hz"
for ((r = 0; r < runs; ++r)); do
  for mode in none thread selfprof; do
    "$out/observer_effect" "$mode" "$hz" "$scale" | sed "s/^/$mode /" >> "$out/all.txt"
  done
  if [ -n "$record" ]; then
    "$record" record -q --follow-exec -F "$hz" -o "$out/recorded.folded" -- "$out/observer_effect" none "$hz" "$scale" |
      sed "s/^/recorded /" >> "$out/all.txt"
  fi
done
python3 - "$out/all.txt" <<'PY'
import statistics, sys
data = {}
for line in open(sys.argv[1]):
    mode, op, ns = line.split()
    data.setdefault(op, {}).setdefault(mode, []).append(float(ns))
rec = any("recorded" in modes for modes in data.values())
print("| operation | none ns/op | thread ns/op | selfprof ns/op | thread / none | selfprof / none |" +
      (" record --follow-exec ns/op | record / none |" if rec else ""))
print("|---|---|---|---|---|---|" + ("---|---|" if rec else ""))
for op, modes in data.items():
    m = {k: statistics.median(v) for k, v in modes.items()}
    row = (f"| {op} | {m['none']:.2f} | {m['thread']:.2f} | {m['selfprof']:.2f} | "
           f"{m['thread'] / m['none']:.2f}x | {m['selfprof'] / m['none']:.2f}x |")
    if rec:
        row += f" {m['recorded']:.2f} | {m['recorded'] / m['none']:.2f}x |"
    print(row)
PY
echo "# load average after: $(cut -d' ' -f1-3 /proc/loadavg); raw numbers in $out/all.txt"
