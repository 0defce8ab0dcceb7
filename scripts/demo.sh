#!/usr/bin/env bash
# Builds and runs the demo (examples/demo): a program that profiles itself, prints where its time went
# and writes its profile. Prints the path of every profile the demo wrote. On a fresh Debian 12 machine
# run as root, it first installs the compiler and build tools it needs (SELFPROF_SKIP_APT=1 skips that).
set -euo pipefail
cd "$(dirname "$0")/.."
root_dir=$(pwd)
build_dir=${SELFPROF_DEMO_BUILD:-$root_dir/build/demo}
out_dir=$build_dir/out

if [ "${SELFPROF_SKIP_APT:-0}" != 1 ] && ! { command -v cmake && command -v ninja && command -v g++; } >/dev/null; then
  if [ "$(id -u)" -eq 0 ]; then
    DEBIAN_FRONTEND=noninteractive apt-get update
    DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends g++ cmake ninja-build pkg-config \
      libdw-dev zlib1g-dev
  else
    echo "demo.sh: needs g++, cmake and ninja (Debian: apt-get install g++ cmake ninja-build)" >&2
    exit 2
  fi
fi

cmake -S "$root_dir" -B "$build_dir" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DSELFPROF_BUILD_TESTS=OFF \
  -DSELFPROF_BUILD_TOOLS=OFF >/dev/null
cmake --build "$build_dir" --target example_demo
mkdir -p "$out_dir"
rm -f "$out_dir"/*
echo
(cd "$out_dir" && "$build_dir/example_demo" "$@")
echo
written=$(find "$out_dir" -maxdepth 1 -type f | sort)
if [ -z "$written" ]; then
  echo "demo.sh: the demo wrote no file in $out_dir" >&2
  exit 1
fi
echo "profile written to:"
printf '  %s\n' $written
if command -v flamegraph.pl >/dev/null && ls "$out_dir"/*.folded >/dev/null 2>&1; then
  for f in "$out_dir"/*.folded; do flamegraph.pl "$f" >"${f%.folded}.flamegraph.svg"; done
  echo "flamegraph.pl rendered: $(ls "$out_dir"/*.flamegraph.svg)"
fi
