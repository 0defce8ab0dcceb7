#!/usr/bin/env bash
# Reads selfprof's pprof output back with an independent decoder (`go tool pprof`, Debian golang-go)
# and checks its totals against the folded output of the same profiles:
#  - the decoder accepts the zlib-compressed and the stored-block gzip files alike;
#  - the "samples" total equals the sum of the folded counts, per-function flat (self) and cum (total,
#    counted once per stack) equal what the folded lines give, and cpu = samples × period per sample.
# Exit 0 pass, 1 fail, 77 skip (no `go` or no C++ compiler). Run from anywhere:
#   bash tests/output/pprof_check.sh
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
command -v go >/dev/null 2>&1 || { echo "SKIP: go not found (apt-get install golang-go)"; exit 77; }
cxx=${CXX:-c++}
command -v "$cxx" >/dev/null 2>&1 || { echo "SKIP: no C++ compiler ($cxx)"; exit 77; }

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
export GOCACHE=${GOCACHE:-$tmp/gocache} HOME=${HOME:-$tmp} PPROF_TMPDIR=$tmp PPROF_BINARY_PATH=$tmp/none

zlib=()
if echo '#include <zlib.h>' | "$cxx" -E -x c++ - >/dev/null 2>&1; then zlib=(-DSELFPROF_HAS_ZLIB=1 -lz); fi
"$cxx" -std=c++17 -O1 -I"$root/include" "$here/pprof_gen.cpp" "${zlib[@]}" -o "$tmp/pprof_gen"
mkdir -p "$tmp/out"
"$tmp/pprof_gen" "$tmp/out"

fail=0
check() {  # check NAME: compare $tmp/out/NAME.{pb.gz,stored.pb.gz} against NAME.folded
  local name=$1 folded="$tmp/out/$1.folded"
  local want
  want=$(awk '{ s += $NF } END { print s }' "$folded")
  for pb in "$tmp/out/$name.pb.gz" "$tmp/out/$name.stored.pb.gz"; do
    local top got
    top=$(go tool pprof -top -sample_index=samples -nodecount=1000000 "$pb" 2>&1) || {
      echo "FAIL $pb: go tool pprof refused it:"; echo "$top"; fail=1; continue; }
    got=$(echo "$top" | sed -n 's/^Showing nodes accounting for \([0-9]*\), 100% of \([0-9]*\) total$/\2/p')
    if [ "$got" != "$want" ]; then echo "FAIL $pb: pprof total '$got', folded total $want"; fail=1; fi
    # Every sample's cpu value is its count times the period.
    go tool pprof -raw "$pb" 2>/dev/null | awk -v pb="$pb" '
      /^Period:/ { period = $2 }
      /^ +[0-9]+ +[0-9]+:/ { n += $1; v = $2; sub(":", "", v); if (v != $1 * period) bad++ }
      END { if (bad || n == 0) { print "FAIL " pb ": " bad " samples with cpu != count*period"; exit 1 } }' ||
      fail=1
    echo "ok   $(basename "$pb"): total $got samples"
  done
}

# Per-function flat and cum of a profile whose names are plain (no ';', no annotations):
# pprof's -top against the folded lines (cum counts a function once per stack, as `perf report`).
check_functions() {
  local name=$1 folded="$tmp/out/$1.folded"
  awk '{ count = $NF; sub(/ [0-9]+$/, ""); n = split($0, f, ";");
         flat[f[n]] += count; delete seen;
         for (i = 1; i <= n; i++) if (!(f[i] in seen)) { seen[f[i]] = 1; cum[f[i]] += count } }
       END { for (k in cum) printf "%s %d %d\n", k, flat[k], cum[k] }' "$folded" | sort >"$tmp/want.txt"
  go tool pprof -top -sample_index=samples -nodecount=1000000 "$tmp/out/$name.pb.gz" 2>/dev/null |
    awk 'found { printf "%s %d %d\n", $6, $1, $4 } /^ *flat  flat%/ { found = 1 }' | sort >"$tmp/got.txt"
  if diff -u "$tmp/want.txt" "$tmp/got.txt" >"$tmp/diff.txt"; then
    echo "ok   $name: flat and cum of $(wc -l <"$tmp/want.txt") functions match the folded output"
  else
    echo "FAIL $name: per-function totals differ (folded vs pprof):"; head -20 "$tmp/diff.txt"; fail=1
  fi
}

check basic
check many
check_functions many
exit $fail
