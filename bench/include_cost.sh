#!/usr/bin/env bash
# Include cost of selfprof (issue #14): what including the library costs a user's translation unit.
#
# Prints one table: for each of five small translation units, the median wall time, CPU time (user+sys)
# and peak RSS of its compile (3 runs, the units alternated so that load on the machine hits them all
# alike), the ratio of the wall time to the baseline unit's (and of the CPU time, steadier when other
# jobs share the machine), the issue's target for the ratio, and pass/fail on the wall ratio. The units:
#   baseline          <string> <vector> <thread> <mutex> <atomic> <functional> and an empty main, -c
#   header-only -c    main.cpp: #include <selfprof.hpp> + int main() { SELFPROF_START(); }, full compile
#   header-only syn   the same main.cpp, -fsyntax-only
#   compiled syn      the same main.cpp with -DSELFPROF_COMPILED_LIB=1, -fsyntax-only ("n/a" while the
#                     compiled mode does not compile)
#   frames.hpp        the baseline includes + <selfprof/frames.hpp>, calling SELFPROF_FRAME(), -c
# Flags: -std=c++17 -O2 -I include. Why: every user pays this on every build that touches the file that
# includes selfprof; the ratios (not the seconds) are what the issue's targets are written in, so that
# they hold on a faster or slower machine.
#
# Usage: bench/include_cost.sh [repeats]      (CXX=clang++ bench/include_cost.sh to use clang;
#        INCLUDE_DIR=/some/copy/include bench/include_cost.sh to measure another copy of the headers)
# Exit status 0 even when a row fails its target (it is a measurement); 1 when a required unit does
# not compile.
set -euo pipefail

root="$(cd "$(dirname "$0")/.." && pwd)"
cxx="${CXX:-g++}"
repeats="${1:-3}"
work="$(mktemp -d /tmp/selfprof-include-cost.XXXXXX)"
trap 'rm -rf "$work"' EXIT

if [ ! -x /usr/bin/time ]; then
  echo "include_cost.sh: needs /usr/bin/time (GNU time) for the peak RSS" >&2
  exit 1
fi

base_includes='#include <atomic>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>'

printf '%s\nint main() { return 0; }\n' "$base_includes" > "$work/baseline.cpp"
printf '#include <selfprof.hpp>\nint main() { SELFPROF_START(); }\n' > "$work/main.cpp"
printf '%s\n#include <selfprof/frames.hpp>\nint main() { SELFPROF_FRAME(); }\n' "$base_includes" \
  > "$work/frames.cpp"

include_dir="${INCLUDE_DIR:-$root/include}"
flags=(-std=c++17 -O2 -I "$include_dir")

# Rows: name | source | extra flags | target ratio ("-" for the baseline) | required (1) or optional (0)
rows=(
  "baseline|baseline.cpp|-c|-|1"
  "header-only -c|main.cpp|-c|10|1"
  "header-only -fsyntax-only|main.cpp|-fsyntax-only|3|1"
  "compiled -fsyntax-only|main.cpp|-DSELFPROF_COMPILED_LIB=1 -fsyntax-only|1.3|0"
  "frames.hpp -c|frames.cpp|-c|1.1|1"
)

# One compile; appends "seconds kilobytes" to the row's result file, or "fail".
measure() {
  local i="$1" src="$2" extra="$3"
  local -a extra_args
  read -r -a extra_args <<< "$extra"
  if /usr/bin/time -f '%e %M %U %S' -o "$work/time.$i" \
    "$cxx" "${flags[@]}" "${extra_args[@]}" "$work/$src" -o "$work/out.$i.o" 2> "$work/err.$i"; then
    cat "$work/time.$i" >> "$work/result.$i"
  else
    echo fail >> "$work/result.$i"
  fi
}

echo "compiler: $("$cxx" --version | head -n 1); flags: -std=c++17 -O2 -I $include_dir; $repeats runs each, alternated"
echo "load average before: $(cut -d' ' -f1-3 /proc/loadavg)"
for ((r = 0; r < repeats; ++r)); do
  for i in "${!rows[@]}"; do
    IFS='|' read -r _ src extra _ _ <<< "${rows[$i]}"
    measure "$i" "$src" "$extra"
  done
done
echo "load average after:  $(cut -d' ' -f1-3 /proc/loadavg)"

# Median of the numbers on stdin (one a line).
median() { sort -g | awk '{ v[NR] = $1 } END { if (NR % 2) print v[(NR + 1) / 2]; else print (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }

status=0
base_s=""
base_cpu=""
row() { printf '| %-26s | %7s | %7s | %7s | %7s | %9s | %6s | %-6s |\n' "$@"; }
echo
row unit "wall s" "CPU s" "RSS MB" ratio "CPU ratio" target result
echo "|----------------------------|---------|---------|---------|---------|-----------|--------|--------|"
for i in "${!rows[@]}"; do
  IFS='|' read -r name _ _ target required <<< "${rows[$i]}"
  if grep -q fail "$work/result.$i"; then
    row "$name" n/a n/a n/a n/a n/a "${target}x" "$([ "$required" = 1 ] && echo ERROR || echo n/a)"
    if [ "$required" = 1 ]; then
      status=1
      echo "--- $name does not compile:" >&2
      head -n 20 "$work/err.$i" >&2
    fi
    continue
  fi
  s=$(awk '{ print $1 }' "$work/result.$i" | median)
  cpu=$(awk '{ print $3 + $4 }' "$work/result.$i" | median)
  mb=$(awk '{ printf "%.0f\n", $2 / 1024 }' "$work/result.$i" | median)
  if [ -z "$base_s" ]; then
    base_s="$s"
    base_cpu="$cpu"
    row "$name" "$s" "$cpu" "$mb" 1.00x 1.00x - -
    continue
  fi
  ratio=$(awk -v a="$s" -v b="$base_s" 'BEGIN { printf "%.2f", (b > 0 ? a / b : 0) }')
  cpu_ratio=$(awk -v a="$cpu" -v b="$base_cpu" 'BEGIN { printf "%.2f", (b > 0 ? a / b : 0) }')
  verdict=$(awk -v r="$ratio" -v t="$target" 'BEGIN { print (r <= t ? "pass" : "FAIL") }')
  row "$name" "$s" "$cpu" "$mb" "${ratio}x" "${cpu_ratio}x" "${target}x" "$verdict"
done
exit "$status"
