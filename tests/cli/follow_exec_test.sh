#!/bin/bash
# Profiling never changes what a program, or any program it executes, prints or returns (issue 20): a
# bash script that starts hundreds of short processes (pipelines with early-exiting head, sort, awk,
# grep, command substitution; src/pipelines.sh) runs plain, then under `selfprof record` without and
# with --follow-exec, three times each; stdout, stderr and the exit status must be the same bytes. Without
# --follow-exec the programs it starts are not profiled, so the signal mask and ignored signals they
# inherit are compared too (MASKS=1); a profiled program's own mask holds selfprof's dump signal.
# As root and, when root with setpriv, as an unprivileged user; once without perf_event.
# Usage: follow_exec_test.sh [SELFPROF_BINARY] (or SELFPROF_BIN=...). Exit 0 pass, 77 skip, else fail.
set -u
bin=${1:-${SELFPROF_BIN:-}}
[ -n "$bin" ] && [ -x "$bin" ] || { echo "SKIP: selfprof binary not given"; exit 77; }
bin=$(cd "$(dirname "$bin")" && pwd)/$(basename "$bin")
here=$(cd "$(dirname "$0")" && pwd)
command -v bash > /dev/null || { echo "SKIP: no bash"; exit 77; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
chmod 755 "$tmp"
cp "$here/src/pipelines.sh" "$tmp/pipelines.sh" && chmod 755 "$tmp/pipelines.sh"
cd "$tmp"
if ! "$bin" record -q -o probe.folded -- true 2> err; then
  grep -q "cannot find libselfprof-preload.so" err && { echo "SKIP: $(cat err)"; exit 77; }
fi
lib=${SELFPROF_PRELOAD:-$(dirname "$bin")/libselfprof-preload.so}
[ -f "$lib" ] || lib=$(dirname "$bin")/../lib/selfprof/libselfprof-preload.so
fails=0
ok() { echo "ok   $1"; }
bad() { echo "FAIL $1"; fails=$((fails + 1)); }
iterations=2 lines=1500

# run WHO DIR [ENV...] -- CMD...: runs CMD in DIR as root or as nobody; stdout, stderr, status to DIR.
run() {
  local who=$1 dir=$2
  shift 2
  local envs=()
  while [ "$1" != -- ]; do envs+=("$1"); shift; done
  shift
  if [ "$who" = nobody ]; then
    (cd "$dir" && setpriv --reuid=65534 --regid=65534 --clear-groups env TMPDIR="$PWD" SELFPROF_PRELOAD="$lib" "${envs[@]}" "$@" > out 2> err; echo $? > rc)
  else
    (cd "$dir" && env TMPDIR="$PWD" "${envs[@]}" "$@" > out 2> err; echo $? > rc)
  fi
}
sum_of() { awk '{ n += $NF } END { print n + 0 }' "$1"; }
same() { cmp -s "$1/out" "$2/out" && cmp -s "$1/err" "$2/err" && cmp -s "$1/rc" "$2/rc"; }
differences() { { diff "$1/out" "$2/out"; diff "$1/err" "$2/err"; diff "$1/rc" "$2/rc"; } | head -5; }

# check WHO RUNS PER_PROCESS ENV...: plain, then RUNS runs of each way of recording (PER_PROCESS runs of
# the profile-per-process way), compared with plain.
check() {
  local who=$1 runs=$2 per_process=$3
  shift 3
  local tag="$who${1:+ $*}"
  local way r d
  for way in plain plain-masks; do
    mkdir -p "$tag/$way"
    [ $way = plain ] && masks=0 || masks=1
    [ "$who" = nobody ] && chown -R 65534:65534 "$tag"
    run "$who" "$tag/$way" MASKS=$masks "$@" -- ./../../pipelines.sh $iterations $lines
    [ "$(cat "$tag/$way/rc")" = 3 ] && [ "$(wc -l < "$tag/$way/out")" -eq $((iterations + 4 * masks)) ] ||
      { bad "$tag: the plain run did not work ($(cat "$tag/$way/rc"), $(head -2 "$tag/$way/err"))"; return; }
  done
  for way in default merged per-process; do
    local flags=() base=plain-masks masks=1 out='p/p-%p.folded' n=$runs
    [ $way != default ] && flags=(--follow-exec) base=plain masks=0
    [ $way = merged ] && out=p/all.folded
    [ $way = per-process ] && n=$per_process  # a profile per process: the costly way, once as root
    for r in $(seq "$n"); do
      d="$tag/$way-$r"
      mkdir -p "$d/p"
      [ "$who" = nobody ] && chown -R 65534:65534 "$d"
      run "$who" "$d" MASKS=$masks "$@" -- "$bin" record -q "${flags[@]}" -F 499 -o "$out" -- ./../../pipelines.sh $iterations $lines
      if same "$tag/$base" "$d"; then
        ok "$tag, $way, run $r: stdout, stderr and status unchanged ($(ls "$d/p" | wc -l) profiles)"
      else
        bad "$tag, $way, run $r: output changed: $(differences "$tag/$base" "$d")"
      fi
    done
  done
  # Without --follow-exec only the script is profiled, with it every program it executes too: one
  # profile per process with %p, else one for the recording whose roots are the programs' names.
  local nd nf roots
  nd=$(ls "$tag/default-1/p" | wc -l)
  [ "$nd" -eq 1 ] && ok "$tag: $nd profile without --follow-exec" || bad "$tag: $nd profiles without --follow-exec (want the script's only)"
  if [ "$per_process" -gt 0 ]; then
    nf=$(ls "$tag/per-process-1/p" | wc -l)
    [ "$nf" -gt $((iterations * 15)) ] && ok "$tag: $nf profiles with --follow-exec and %p" ||
      bad "$tag: $nf profiles with --follow-exec and %p (want one per program)"
  fi
  for r in $(seq "$runs"); do
    d="$tag/merged-$r/p"
    # The script and at least one program it ran: most of them use less CPU than one tick (each
    # process's clock starts at zero), so which ones a run samples is chance.
    roots=$(cut -d';' -f1 "$d/all.folded" 2> /dev/null | sort -u | tr '\n' ' ')
    [ "$(ls "$d")" = all.folded ] && [ "$(sum_of "$d/all.folded")" -gt 0 ] && [[ " $roots" == *" pipelines.sh "* ]] &&
      [ "$(echo $roots | wc -w)" -ge 2 ] && ok "$tag, merged, run $r: one profile, roots: $roots" ||
      bad "$tag, merged, run $r: $(ls "$d" | head -3 | tr '\n' ' '), roots: $roots"
  done
}

check root 3 1
check root 1 0 SELFPROF_TEST_NO_PERF=1
if [ "$(id -u)" -eq 0 ] && command -v setpriv > /dev/null; then
  check nobody 3 0
else
  echo "skip unprivileged user (not root or no setpriv)"
fi

# As root, kernel frames are sampled, and the recorder names them from /proc/kallsyms: only the symbols
# of the kernel addresses recorded are kept (kernel_symbols::prepare), named as the whole table names them.
if [ "$(id -u)" -eq 0 ] && [ "$(head -c 16 /proc/kallsyms)" != 0000000000000000 ]; then
  if "$bin" record -q --follow-exec -F 999 -o kernel.folded -- dd if=/dev/zero of=/dev/null bs=512 count=400000 2> /dev/null; then
    kernel=$(grep -o '[^;]*_\[k\]' kernel.folded | wc -l)
    unnamed=$(grep -o '\[kernel\]_\[k\]' kernel.folded | wc -l)
    if [ "$kernel" -gt 0 ] && [ $((unnamed * 20)) -le "$kernel" ]; then
      ok "root: $kernel kernel frames in the stacks, $unnamed not named"
    else
      bad "root: $kernel kernel frames, $unnamed not named: $(grep -m3 '_\[k\]' kernel.folded | cut -c1-200)"
    fi
  else
    bad "root: record of dd failed"
  fi
else
  echo "skip kernel frames (not root, or kallsyms hides addresses)"
fi

[ $fails -eq 0 ] && echo "PASS" || echo "$fails failure(s)"
[ $fails -eq 0 ]
