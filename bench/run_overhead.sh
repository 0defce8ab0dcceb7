#!/usr/bin/env bash
# Builds and runs the overhead benchmarks and prints their tables (markdown): first the cost of one
# sample (bench/sample_cost.cpp), then selfprof's CPU overhead against the unprofiled workload, the bare
# tick source and `perf record -g` (bench/overhead.cpp, which takes the handler's cost from the first).
# Usage: bench/run_overhead.sh [bench_overhead options: --cpu-s 4 --repeats 3 --no-perf-record --verbose]
# About 5 minutes on an idle 2-core VM with the defaults; run it on an otherwise idle machine (the load
# average is printed before and after, because other processes make every ratio noisier).
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
out="$(mktemp -d /tmp/selfprof-overhead.XXXXXX)"
cxx="${CXX:-g++}"
flags=(-std=c++17 -O2 -g -fno-omit-frame-pointer -Wall -Wextra -Wpedantic -Werror -I"$root/include")
"$cxx" "${flags[@]}" "$root/bench/sample_cost.cpp" -o "$out/bench_sample_cost" -pthread -ldl
"$cxx" "${flags[@]}" "$root/bench/overhead.cpp" -o "$out/bench_overhead" -pthread -ldl

echo "# $(uname -srm), $(nproc) CPUs, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), $("$cxx" --version | head -1)"
echo "# user $(id -un), kernel.perf_event_paranoid=$(cat /proc/sys/kernel/perf_event_paranoid), load average before: $(cut -d' ' -f1-3 /proc/loadavg)"
echo
echo "## Cost of one sample"
"$out/bench_sample_cost" | tee "$out/sample_cost.txt"
# The handler's cost inside a signal at depth 64 (the workload's stacks are 4 to ~50 frames deep).
handler_ns="$(awk -F"|" '$2 == " 64 " { gsub(/ /, "", $9); print $9 }' "$out/sample_cost.txt")"
echo
echo "## Overhead (handler cost taken as ${handler_ns:-1000} ns per sample)"
"$out/bench_overhead" --handler-ns "${handler_ns:-1000}" "$@" | tee "$out/overhead.txt"
echo
echo "# load average after: $(cut -d' ' -f1-3 /proc/loadavg); outputs in $out"
