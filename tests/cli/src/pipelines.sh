#!/bin/bash
# A shell script that starts many short processes: pipelines with early-exiting readers (head), sort,
# awk, grep, tr and command substitution over a generated text file (deterministic: an LCG in awk).
# Usage: pipelines.sh ITERATIONS LINES. Prints one line per iteration, then exits with status 3.
n=${1:-10}; lines=${2:-2000}
# With MASKS=1, what the programs it starts inherit: the signal mask and ignored signals, before and after
# a trap that claims SIGUSR2 and SIGURG (a shell saves its first mask and gives it to every child).
masks() { [ "${MASKS:-0}" = 1 ] && grep -E '^Sig(Blk|Ign)' /proc/self/status; }
masks
f=$(mktemp "${TMPDIR:-/tmp}/pipelines-XXXXXX")
trap 'rm -f "$f"' EXIT
trap 'echo usr2' USR2
trap 'echo urg' URG
awk -v lines="$lines" 'BEGIN { s = 7; for (i = 1; i <= lines; i++) { line = i; for (w = 0; w < 9; w++) {
  s = (s * 1103515245 + 12345) % 2147483648; len = 3 + int(s / 65536) % 8; word = "";
  for (c = 0; c < len; c++) { s = (s * 1103515245 + 12345) % 2147483648
    word = word substr("abcdefghijklmnopqrstuvwxyz_2", 1 + int(s / 65536) % 28, 1) }
  line = line " " word } print line } }' > "$f"
for i in $(seq "$n"); do
  l=$(( (i * 37) % lines + 1 )); k=$(( (i * 13) % 200 + 1 ))
  a=$(sed -n "${l}p" "$f" | awk '{ print $2, length($3) }' | tr a-z A-Z)
  b=$(grep -c "$(echo $i | tr 0-9 a-j)" "$f")
  c=$(awk '{ print substr($4, 1, 2) }' "$f" | sort | uniq -c | sort -rn | head -1)
  d=$(cut -d' ' -f6- "$f" | head -n "$k" | tr ' ' '\n' | sort -u | wc -l)
  e=$(yes "$i" | head -n 3 | tr '\n' ,)
  # Work of the shell's own (~25 ms), so the script itself has user-space samples even where kernel time
  # is not sampled (an unprivileged user's perf events are user-only).
  s=$i; for ((j = 0; j < 10000; j++)); do s=$(( (s * 31 + j) % 1000003 )); done
  echo "$i $a $b [$c] $d $e $s"
done
masks
echo "$(masks)" >&2
exit 3
