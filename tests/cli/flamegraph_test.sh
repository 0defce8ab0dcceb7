#!/bin/bash
# Round trips through the selfprof tool: perf script -> collapse -> flamegraph, checking that every
# frame of the folded input is in the SVG; folded dialects; diff, top, pprof; error handling; --help.
# Usage: flamegraph_test.sh [SELFPROF_BINARY]   (or SELFPROF_BIN=...). Exit 0 pass, 77 skip, else fail.
set -u
bin=${1:-${SELFPROF_BIN:-}}
[ -n "$bin" ] && [ -x "$bin" ] || { echo "SKIP: selfprof binary not given"; exit 77; }
here=$(cd "$(dirname "$0")" && pwd)
fx=$here/fixtures
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cd "$tmp"
fails=0
ok() { echo "ok   $1"; }
bad() { echo "FAIL $1"; fails=$((fails + 1)); }

# Every distinct frame name of the folded input appears in the SVG's tooltips (minwidth 0 keeps all).
"$bin" collapse -q --all "$fx/perf-user-kernel.txt" > uk.folded
"$bin" flamegraph --minwidth=0 --title="round trip" uk.folded > uk.svg || bad "flamegraph exit status"
missing=0
while IFS= read -r frame; do
  name=${frame%_\[[kji]\]}
  esc=$(printf '%s' "$name" | sed -e 's/&/\&amp;/g' -e 's/</\&lt;/g' -e 's/>/\&gt;/g')
  grep -qF "<title>$esc (" uk.svg || { missing=$((missing + 1)); [ $missing -le 3 ] && echo "  missing: $name"; }
done < <(sed 's/ [0-9]*$//' uk.folded | tr ';' '\n' | sort -u)
[ $missing -eq 0 ] && ok "all frames of the folded input are in the SVG" || bad "$missing frame(s) missing from the SVG"
grep -q "round trip" uk.svg && ok "title" || bad "title"
grep -q "hot_compute" uk.svg && ok "hot function present" || bad "hot function"
tail -c 10 uk.svg | grep -q "</svg>" && ok "complete SVG" || bad "SVG not complete"

# JIT frames and inline chains: `;` made ':' by collapse, `_[j]`/`_[i]` stripped from labels.
"$bin" collapse -q --all "$fx/perf-jit.txt" | "$bin" flamegraph --colors=java > jit.svg
grep -q "LJitDemo:::hotLoop (" jit.svg && ok "jit frame" || bad "jit frame"
grep -q "<title>leaf (" jit.svg && ok "inline chain frame" || bad "inline chain frame"

# Folded dialects: thread roots, annotations, comments, blank lines, CRLF, tabs, fractions, diff lines.
printf '# comment\n\n[main tid=7];a;b_[k] 3\r\n[main tid=7];a;c\t2\nx;y 1.5\n' > d.folded
"$bin" flamegraph -q d.folded > d.svg && grep -q "<title>b (" d.svg && grep -q "main tid=7" d.svg &&
  ok "dialects" || bad "dialects"
printf 'a;b 10 4\na;c 5 9\n' > diff3.folded
"$bin" flamegraph diff3.folded > diff3.svg && grep -q "rgb(255," diff3.svg && grep -q "rgb([0-9]*,[0-9]*,255)" diff3.svg &&
  ok "differential input red and blue" || bad "differential input"

# Malformed lines: named with file and line, counted, fatal with --strict; empty input exits 2.
printf 'a;b 1\nnot folded\na;c 2\n' > m.folded
"$bin" flamegraph m.folded > /dev/null 2> err; rc=$?
[ $rc -eq 0 ] && grep -q "m.folded:2:" err && grep -q "ignored 1 line" err && ok "malformed line reported" ||
  bad "malformed line report (rc $rc): $(cat err)"
"$bin" flamegraph --strict m.folded > /dev/null 2>&1 && bad "--strict accepted a malformed line" || ok "--strict"
: > empty.folded
"$bin" flamegraph empty.folded > e.svg 2> /dev/null; [ $? -eq 2 ] && grep -q "ERROR" e.svg && ok "empty input: error SVG, exit 2" ||
  bad "empty input"

# Counts whose sum passes 2^64, split over two files (issue 15 item 13): totals saturate, never wrap.
printf 'a;b 9223372036854775808\n' > big1.folded
printf 'a;c 9223372036854775808\n' > big2.folded
"$bin" flamegraph big1.folded big2.folded > big.svg 2> big.err; rc=$?
[ $rc -eq 0 ] && grep -q "all (18,446,744,073,709,551,615 samples, 100%)" big.svg && ! grep -q "no stack counts" big.err &&
  ok "two files summing past 2^64: saturated total" || bad "two files summing past 2^64: exit $rc, $(cat big.err)"

# Options: unique prefixes, fixed width, inverted, bad values rejected with exit 2.
"$bin" flamegraph --color=java --width=800 --inverted uk.folded > o.svg && grep -q 'width="800"' o.svg &&
  grep -q "Icicle Graph" o.svg && ok "options" || bad "options"
"$bin" flamegraph --colors=nope uk.folded > /dev/null 2>&1; [ $? -eq 2 ] && ok "bad palette exit 2" || bad "bad palette"
"$bin" flamegraph --minwidth=abc uk.folded > /dev/null 2>&1; [ $? -eq 2 ] && ok "bad minwidth exit 2" || bad "bad minwidth"

# --cp writes palette.map and reuses it.
"$bin" flamegraph --cp uk.folded > cp.svg && [ -s palette.map ] && grep -q "hot_compute->rgb(" palette.map &&
  ok "--cp palette.map" || bad "--cp"

# diff, top, pprof
printf 'a;b 10\na;c 5\n' > b1; printf 'a;b 4\na;c 9\n' > b2
[ "$("$bin" diff --folded b1 b2)" = $'a;b 10 4\na;c 5 9' ] && ok "diff --folded" || bad "diff --folded"
[ "$("$bin" diff --folded -n b1 b2 | head -1)" = "a;b 8 4" ] && ok "diff -n" || bad "diff -n"
"$bin" diff b1 b2 > diff.svg && grep -q "<title>c (" diff.svg && ok "diff svg" || bad "diff svg"
"$bin" top b2 | grep -qE "69\.23%.* c$" && ok "top" || bad "top"
"$bin" pprof b2 -o p.pb.gz && [ "$(head -c 2 p.pb.gz | od -An -tx1 | tr -d ' ')" = "1f8b" ] && ok "pprof gzip" || bad "pprof"

# --help for every command
for c in collapse flamegraph diff top pprof record; do
  "$bin" "$c" --help | grep -q "usage: selfprof $c" && ok "$c --help" || bad "$c --help"
done
"$bin" --help | grep -q "commands:" && ok "selfprof --help" || bad "selfprof --help"
"$bin" nonsense > /dev/null 2>&1; [ $? -eq 2 ] && ok "unknown command exit 2" || bad "unknown command"

[ $fails -eq 0 ] && echo "PASS" || echo "$fails failure(s)"
[ $fails -eq 0 ]
