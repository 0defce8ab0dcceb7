#!/bin/bash
# `selfprof collapse` against the folded output the real stackcollapse-perf.pl produced for perf script
# text recorded on a real machine (fixtures/, re-made by fixtures/record.sh): byte equality for every
# option, gzip input, malformed-line reporting and --strict.
# Usage: collapse_test.sh [SELFPROF_BINARY]   (or SELFPROF_BIN=...). Exit 0 pass, 77 skip, else fail.
set -u
bin=${1:-${SELFPROF_BIN:-}}
[ -n "$bin" ] && [ -x "$bin" ] || { echo "SKIP: selfprof binary not given"; exit 77; }
here=$(cd "$(dirname "$0")" && pwd)
fx=$here/fixtures
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fails=0
check() {  # name expected actual
  if cmp -s "$2" "$3"; then echo "ok   $1"; else echo "FAIL $1"; diff "$2" "$3" | head -5; fails=$((fails + 1)); fi
}
for f in "$fx"/perf-*.txt; do
  name=$(basename "$f" .txt)
  for opt in none pid tid kernel jit all addrs; do
    flag="--$opt"; [ "$opt" = none ] && flag=
    "$bin" collapse -q $flag "$f" > "$tmp/out" || { echo "FAIL $name $opt: exit $?"; fails=$((fails + 1)); }
    check "$name $opt" "$fx/expected/$name-$opt.folded" "$tmp/out"
  done
done
"$bin" collapse -q --event-filter=task-clock "$fx/perf-multi-event.txt" > "$tmp/out"
check "multi-event --event-filter=task-clock" "$fx/expected/perf-multi-event-event-filter.folded" "$tmp/out"

# stdin, and several inputs read one after the other
"$bin" collapse -q --all < "$fx/perf-user-kernel.txt" > "$tmp/out"
check "stdin" "$fx/expected/perf-user-kernel-all.folded" "$tmp/out"
"$bin" collapse -q - < "$fx/perf-jit.txt" > "$tmp/out"
check "stdin as -" "$fx/expected/perf-jit-none.folded" "$tmp/out"

# First-event filtering is reported on stderr.
"$bin" collapse "$fx/perf-multi-event.txt" 2> "$tmp/err" > /dev/null
grep -q "filtered out other types, first task-clock" "$tmp/err" && echo "ok   event filter warning" ||
  { echo "FAIL event filter warning: $(cat "$tmp/err")"; fails=$((fails + 1)); }

# gzip input: decompressed with zlib, or a clear error when built without it.
gzip -c "$fx/perf-user-kernel.txt" > "$tmp/in.gz"
if "$bin" collapse -q --kernel "$tmp/in.gz" > "$tmp/out" 2> "$tmp/err"; then
  check "gzip input" "$fx/expected/perf-user-kernel-kernel.folded" "$tmp/out"
elif grep -q "built without zlib" "$tmp/err"; then
  echo "ok   gzip input refused clearly (no zlib)"
else
  echo "FAIL gzip input: $(cat "$tmp/err")"; fails=$((fails + 1))
fi

# Malformed lines (perf script -F+srcline "file:line" lines): skipped like Perl, reported with file and
# line number, fatal with --strict.
"$bin" collapse "$fx/perf-srcline.txt" > /dev/null 2> "$tmp/err"
first=$(grep -n -m1 -E '^  [^ ].*:[0-9?]+$' "$fx/perf-srcline.txt" | cut -d: -f1)
grep -q "perf-srcline.txt:$first: unrecognized line" "$tmp/err" && echo "ok   malformed line named with file:line" ||
  { echo "FAIL malformed report (want line $first): $(head -2 "$tmp/err")"; fails=$((fails + 1)); }
grep -q "unrecognized line(s) skipped in all" "$tmp/err" && echo "ok   malformed lines counted" ||
  { echo "FAIL malformed count"; fails=$((fails + 1)); }
if "$bin" collapse --strict "$fx/perf-srcline.txt" > /dev/null 2>&1; then
  echo "FAIL --strict accepted malformed lines"; fails=$((fails + 1))
else
  echo "ok   --strict"
fi
"$bin" collapse -q /nonexistent/file > /dev/null 2> "$tmp/err" && { echo "FAIL missing file accepted"; fails=$((fails + 1)); }
grep -q "/nonexistent/file" "$tmp/err" && echo "ok   missing file named" || { echo "FAIL missing file message"; fails=$((fails + 1)); }
"$bin" collapse --bogus < /dev/null > /dev/null 2>&1; [ $? -eq 2 ] && echo "ok   usage error exit 2" ||
  { echo "FAIL usage error status"; fails=$((fails + 1)); }
"$bin" collapse --help | grep -q "stackcollapse-perf.pl" && echo "ok   --help" || { echo "FAIL --help"; fails=$((fails + 1)); }

[ $fails -eq 0 ] && echo "PASS" || echo "$fails failure(s)"
[ $fails -eq 0 ]
