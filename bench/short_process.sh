#!/bin/bash
# What a short-lived process pays for selfprof (issue 20, issue 21 item 7): N runs of /usr/bin/true and of
# a ~10 ms process (awk summing numbers), alone, under the preload library (without an exit profile: the
# start-up and stop; with the raw exit dump `selfprof record --follow-exec --preload` uses; with a .folded
# exit profile, symbolized in the process), under `perf record -g` (when perf works), and N runs inside one
# `selfprof record --follow-exec` (inherited perf_event rings, nothing loaded). Then the script of
# tests/cli/src/pipelines.sh plain, under `selfprof record --follow-exec` (perf_event rings; the preload
# library; a profile per process, each way) and under `perf record -g`. Prints CPU (user+system of everything started), per
# process and the difference against alone. CPU, not wall time: the machine may be shared.
# Usage: bench/short_process.sh SELFPROF_BINARY [N] [ITERATIONS]  (the preload library next to the
# binary, or SELFPROF_PRELOAD). The rate is SELFPROF_HZ (499 unless set), as in issue 20.
set -u
bin=${1:?usage: short_process.sh SELFPROF_BINARY [N]}
n=${2:-100}
iterations=${3:-20}
export SELFPROF_HZ=${SELFPROF_HZ:-499}
here=$(cd "$(dirname "$0")" && pwd)
lib=${SELFPROF_PRELOAD:-$(cd "$(dirname "$bin")" && pwd)/libselfprof-preload.so}
[ -f "$lib" ] || { echo "no preload library at $lib"; exit 1; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
export TMPDIR=$tmp

# cpu_ms CMD...: CPU milliseconds used by CMD and its children (from bash's `times` of a subshell).
cpu_ms() {
  local t
  t=$( { TIMEFORMAT='%U %S'; time "$@" > /dev/null 2>&1; } 2>&1 )
  awk -v t="$t" 'BEGIN { split(t, a, " "); printf "%.0f", (a[1] + a[2]) * 1000 }'
}
loop() {  # loop WRAPPER... -- PROGRAM...: N runs of PROGRAM, each started through WRAPPER
  local w=()
  while [ "$1" != -- ]; do w+=("$1"); shift; done
  shift
  for ((i = 0; i < n; i++)); do "${w[@]}" "$@"; done
}
perf_ok=0
perf record -q -g -o "$tmp/probe.data" -- true > /dev/null 2>&1 && perf_ok=1

row() {  # row NAME PROGRAM...
  local name=$1
  shift
  local alone pre_nodump pre_raw pre_dump perf_ms=
  mkdir -m 700 "$tmp/raw"
  alone=$(cpu_ms loop env -- "$@")
  pre_nodump=$(cpu_ms loop env LD_PRELOAD="$lib" -- "$@")
  pre_raw=$(cpu_ms loop env LD_PRELOAD="$lib" SELFPROF_OUT="$tmp/raw/%p.selfprof-raw" -- "$@")
  pre_dump=$(cpu_ms loop env LD_PRELOAD="$lib" SELFPROF_OUT="$tmp/p-%p.folded" -- "$@")
  rm -rf "$tmp"/p-*.folded "$tmp/raw"
  [ $perf_ok = 1 ] && perf_ms=$(cpu_ms loop perf record -q -g -o "$tmp/perf.data" -- -- "$@")
  # N runs inside one recording, by the inherited perf_event rings (the way of `record --follow-exec`),
  # against the same loop alone; the recorder's own CPU is included.
  local many many_rec
  many=$(cpu_ms bash -c 'for ((i = 0; i < $0; i++)); do "$@"; done' "$n" "$@")
  many_rec=$(cpu_ms "$bin" record -q --follow-exec -o "$tmp/many.folded" -- bash -c 'for ((i = 0; i < $0; i++)); do "$@"; done' "$n" "$@")
  awk -v name="$name" -v n="$n" -v a="$alone" -v b="$pre_nodump" -v r="$pre_raw" -v c="$pre_dump" -v p="$perf_ms" \
      -v m="$many" -v mr="$many_rec" 'BEGIN {
    printf "%-16s alone %6.2f | preload: no dump %6.2f (+%.2f) | raw dump %6.2f (+%.2f) | .folded %6.2f (+%.2f)",
      name, a / n, b / n, (b - a) / n, r / n, (r - a) / n, c / n, (c - a) / n
    if (p != "") printf " | perf record -g %6.2f (+%.2f)", p / n, (p - a) / n
    printf " | in one recording: alone %6.2f, record --follow-exec %6.2f (+%.2f)", m / n, mr / n, (mr - m) / n
    printf "  ms CPU/process\n" }'
}
echo "CPU per process at $SELFPROF_HZ Hz, mean of $n runs (every run is started through env, as the preload rows are; perf record includes perf itself)"
row "/usr/bin/true" /usr/bin/true
row "awk, ~10 ms" awk 'BEGIN { for (i = 0; i < 400000; i++) s += i; print s }'

script=$here/../tests/cli/src/pipelines.sh
plain=$(cpu_ms bash "$script" "$iterations" 2000)
merged=$(cpu_ms "$bin" record -q --follow-exec -o "$tmp/all.folded" -- bash "$script" "$iterations" 2000)
merged_pre=$(cpu_ms "$bin" record -q --follow-exec --preload -o "$tmp/all2.folded" -- bash "$script" "$iterations" 2000)
mkdir "$tmp/per"
per=$(cpu_ms "$bin" record -q --follow-exec -o "$tmp/per/p-%p.folded" -- bash "$script" "$iterations" 2000)
procs=$(ls "$tmp/per" | wc -l)
mkdir "$tmp/per2"
per_pre=$(cpu_ms "$bin" record -q --follow-exec --preload -o "$tmp/per2/p-%p.folded" -- bash "$script" "$iterations" 2000)
perf_ms=
[ $perf_ok = 1 ] && perf_ms=$(cpu_ms perf record -q -g -F "$SELFPROF_HZ" -o "$tmp/perf.data" -- bash "$script" "$iterations" 2000)
awk -v it="$iterations" -v procs="$procs" -v a="$plain" -v m="$merged" -v mp="$merged_pre" -v q="$per" -v qp="$per_pre" -v p="$perf_ms" 'BEGIN {
  printf "pipelines.sh %d iterations (%d processes): plain %.2f s | record --follow-exec (perf_event rings) %.2f s (x%.2f) | the same --preload %.2f s (x%.2f) | a profile per process (%%p) %.2f s (x%.2f) | the same --preload %.2f s (x%.2f)",
    it, procs, a / 1000, m / 1000, m / a, mp / 1000, mp / a, q / 1000, q / a, qp / 1000, qp / a
  if (p != "") printf " | perf record -g %.2f s (x%.2f)", p / 1000, p / a
  printf "\n" }'
