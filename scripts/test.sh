#!/usr/bin/env bash
# Runs every test of selfprof, the way CI does (.ci/run): installs what is needed on Debian 12 (as
# root), then builds and runs the whole suite in each configuration below, and ends with one line
# "N passed, N failed" (test programs / CTest tests run). Exits non-zero on any failure.
#
# Stages (SELFPROF_TEST_STAGES="gcc clang ..." runs a subset, in this order). The CMake stages are the
# presets of CMakePresets.json (configure, build and test preset of the same name; trees in build/<name>):
#   gcc           g++ -O2 -g, compiled mode (the library compiled once for tests, examples, the tool and
#                 the benchmarks), libdw and zlib; unit, integration, packaging and lint tests
#   clang         clang++ against single_include/ (header-only), with the other side of every optional
#                 library (libdw and zlib off), the tool built; unit, integration, torture and tool tests
#                 with perf_event_open failing (SELFPROF_TEST_NO_PERF=1: the signal sources' fallback)
#   asan          g++ -O1 -g -fsanitize=address,undefined, compiled mode (unit tests -O0); no_asan left out
#   tsan          g++ -O1 -g -fsanitize=thread, compiled mode (unit tests -O0); no_tsan left out
#                 (tests labelled slow run in the gcc stage only)
#   meson         meson setup -Dcompiled=true, everything built; unit + smoke tests (the tool is left to
#                 the CMake stages)
#   realworld     unmodified programs from Debian (python3, node, sqlite3, xz, perl, g++, a pipeline, zstd)
#                 under the gcc build's `selfprof record` and, as root, perf record --call-graph dwarf in
#                 the same run: names, top functions, complete stacks and output compared
#                 (tests/realworld/realworld.py)
#   unprivileged  the gcc build's integration and torture tests as a throwaway system user (setpriv)
#   fuzz          libFuzzer targets (ELF reader, perf-script and folded parsers, HTTP requests), 10 s each (SELFPROF_FUZZ_SECONDS)
# Environment: SELFPROF_SKIP_APT=1 skips apt-get; SELFPROF_JOBS (default 2) parallel jobs;
# SELFPROF_TEST_USER (default selfprof-test).
set -uo pipefail
cd "$(dirname "$0")/.."
root_dir=$(pwd)
build_root=$root_dir/build  # the presets' binaryDir is build/<preset>
jobs=${SELFPROF_JOBS:-2}
# Not in the default list (each is covered by one above; run them by name): single (g++ against
# single_include/, the smoke tests) and no_perf (the gcc build's tests with SELFPROF_TEST_NO_PERF=1).
stages=${SELFPROF_TEST_STAGES:-gcc realworld clang asan tsan meson unprivileged fuzz}
test_user=${SELFPROF_TEST_USER:-selfprof-test}
packages=(g++ clang clang-format cmake ninja-build meson pkg-config doctest-dev python3 libdw-dev
  zlib1g-dev linux-perf util-linux passwd binutils git golang-go chromium libclang-rt-14-dev
  sqlite3 xz-utils zstd nodejs perl)

passed=0
failed=0
failures=()

note() { printf '\n==== %s\n' "$*"; }
count() {  # <passed> <failed> <what>
  passed=$((passed + $1))
  failed=$((failed + $2))
  if [ "$2" -gt 0 ]; then failures+=("$3: $2 failed"); fi
}

install_packages() {
  if [ "${SELFPROF_SKIP_APT:-0}" = 1 ]; then return 0; fi
  local missing=()
  for p in "${packages[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
  done
  if [ ${#missing[@]} -eq 0 ]; then
    echo "test.sh: all packages installed (${packages[*]})"
    return 0
  fi
  if [ "$(id -u)" -ne 0 ]; then
    echo "test.sh: missing packages ${missing[*]}; run as root or install them (SELFPROF_SKIP_APT=1 skips this)" >&2
    exit 2
  fi
  note "apt-get install ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update && apt-get install -y --no-install-recommends "${packages[@]}" || {
    echo "test.sh: apt-get failed" >&2
    exit 2
  }
}

# build <preset>: configure and build build/<preset> with the CMake preset; a failure counts as one.
build() {
  note "build $1 (CMakePresets.json)"
  if cmake --preset "$1" && cmake --build --preset "$1" -j "$jobs" -- -k 0; then
    return 0
  fi
  count 0 1 "build $1"
  return 1
}

# run_ctest <test preset>: run CTest with the preset and count from its summary line.
run_ctest() {
  local log
  note "ctest --preset $1"
  log=$(mktemp)
  ctest --preset "$1" -j "$jobs" 2>&1 | tee "$log"
  local line total bad
  line=$(grep -E 'tests passed, [0-9]+ tests? failed out of [0-9]+' "$log" | tail -n1)
  rm -f "$log"
  if [ -z "$line" ]; then
    echo "test.sh: no CTest summary for preset $1 (no tests found?)"
    count 0 1 "ctest $1"
    return
  fi
  bad=$(sed -E 's/.* ([0-9]+) tests? failed out of ([0-9]+).*/\1/' <<<"$line")
  total=$(sed -E 's/.* ([0-9]+) tests? failed out of ([0-9]+).*/\2/' <<<"$line")
  count $((total - bad)) "$bad" "ctest $1"
}

stage_gcc() { build gcc && run_ctest gcc; }
stage_clang() { build clang && run_ctest clang; }
stage_single() { build single && run_ctest single; }
stage_asan() { build asan && run_ctest asan; }
stage_tsan() { build tsan && run_ctest tsan; }
stage_meson() {
  local dir=$build_root/meson log
  note "meson $dir"
  # The tool is built and tested by the CMake stages; here the library in the compiled mode (the clang
  # stage builds header-only) and the smoke tests (-Dtools=false and the unit tests left to
  # CMake save two minutes of CI).
  if [ -f "$dir/meson-private/coredata.dat" ]; then
    meson setup --reconfigure "$dir" "$root_dir" --buildtype=debugoptimized -Dtools=false -Dcompiled=true
  else
    rm -rf "$dir"
    meson setup "$dir" "$root_dir" --buildtype=debugoptimized -Dtools=false -Dcompiled=true
  fi || { count 0 1 "meson setup"; return; }
  meson compile -C "$dir" -j "$jobs" selfprof_smoke_tests integration_handler_safety ||
    count 0 1 "meson compile"
  log=$(mktemp)
  # The meson build is proven by building the library and the smoke tests and running them; the other
  # tests are the same code the CMake stages build and run.
  meson test -C "$dir" --no-rebuild --print-errorlogs --num-processes "$jobs" --suite smoke 2>&1 | tee "$log"
  local ok bad
  ok=$(awk '/^Ok:/ {s += $2} /^Expected Fail:/ {s += $3} END {print s + 0}' "$log")
  bad=$(awk '/^(Fail|Timeout):/ {s += $2} /^Unexpected Pass:/ {s += $3} END {print s + 0}' "$log")
  rm -f "$log"
  count "$ok" "$bad" "meson test"
}

# The gcc build's test binaries (with whatever they keep next to them) copied where the user can read
# them; each integration test file run as that user, in a process of its own, as CTest runs it
# (tests/CMakeLists.txt: the shared executable with --source-file, or the file's own executable).
stage_unprivileged() {
  local src=$build_root/gcc/tests tmp uid gid as_user=()
  if [ ! -x "$src/selfprof_integration_tests" ]; then
    echo "test.sh: no integration tests in $src (stage gcc not run?)"
    count 0 1 "unprivileged: no binaries"
    return
  fi
  tmp=$(mktemp -d /tmp/selfprof-unpriv.XXXXXX)
  (cd "$src" && tar --exclude=CMakeFiles --exclude=packaging --exclude=Testing --exclude='*.cmake' -cf - .) |
    tar -xf - -C "$tmp"
  if [ "$(id -u)" -eq 0 ]; then
    id -u "$test_user" >/dev/null 2>&1 ||
      useradd --system --no-create-home --shell /usr/sbin/nologin "$test_user" || {
      count 0 1 "useradd $test_user"
      return
    }
    uid=$(id -u "$test_user")
    gid=$(id -g "$test_user")
    chown -R "$uid:$gid" "$tmp"
    chmod 755 "$tmp"
    as_user=(setpriv --reuid="$uid" --regid="$gid" --clear-groups)
    if [ "$("${as_user[@]}" id -u)" != "$uid" ]; then
      count 0 1 "unprivileged: setpriv did not switch to $test_user"
      return
    fi
  fi
  note "unprivileged: integration tests as ${test_user} (uid ${uid:-$(id -u)}) in $tmp"
  local f name cmd ok=0 bad=0
  local kind
  for f in "$root_dir"/tests/integration/*_test.cpp "$root_dir"/tests/torture/*_test.cpp; do
    name=$(basename "$f" _test.cpp)
    kind=$(basename "$(dirname "$f")")
    grep -q '^//[ ]*ctest-labels:.*\bslow\b' "$f" && continue  # left to the gcc stage
    if grep -q '^//[ ]*integration-binary:[ ]*own' "$f"; then
      cmd=("$tmp/${kind}_$name")
    else
      cmd=("$tmp/selfprof_integration_tests" "--source-file=*/$kind/${name}_test.cpp")
    fi
    echo "-- $kind/$name"
    if (cd "$tmp" && "${as_user[@]}" env HOME="$tmp" TMPDIR="$tmp" "${cmd[@]}"); then
      ok=$((ok + 1))
    else
      bad=$((bad + 1))
      echo "FAILED (unprivileged): $name"
    fi
  done
  rm -rf "$tmp"
  count "$ok" "$bad" "unprivileged"
}
# libFuzzer targets (clang), each for a bounded time on a seed corpus: the ELF reader, the perf-script
# and folded parsers, the endpoint's HTTP request parser. A crash or a sanitizer report fails the stage.
stage_fuzz() {
  local dir=$build_root/fuzz seconds=${SELFPROF_FUZZ_SECONDS:-10} t ok=0 bad=0
  note "fuzz: each target for ${seconds} s"
  rm -rf "$dir" && mkdir -p "$dir/corpus-elf" "$dir/corpus-text"
  cp /usr/lib/x86_64-linux-gnu/libm.so.6 /bin/true "$dir/corpus-elf/" 2>/dev/null || true
  cp "$root_dir"/tests/cli/fixtures/perf-*.txt "$root_dir"/tests/golden/*.folded "$dir/corpus-text/" 2>/dev/null || true
  mkdir -p "$dir/corpus-http"
  printf 'GET /debug/pprof/profile?seconds=30 HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer abc\r\n\r\n' >"$dir/corpus-http/get"
  printf 'HEAD /debug/selfprof/folded?since=start&view=offcpu HTTP/1.0\n\n' >"$dir/corpus-http/head"
  printf 'HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nab' >"$dir/corpus-http/reply"
  for t in elf_fuzz cli_perf_script_fuzz cli_folded_fuzz http_request_fuzz; do
    local corpus=$dir/corpus-text
    [ "$t" = elf_fuzz ] && corpus=$dir/corpus-elf
    [ "$t" = http_request_fuzz ] && corpus=$dir/corpus-http
    if ! clang++ -std=c++17 -g -O1 -fsanitize=fuzzer,address,undefined -I"$root_dir/include" \
      -I"$root_dir/tools/selfprof" "$root_dir/tests/fuzz/$t.cpp" -o "$dir/$t"; then
      bad=$((bad + 1)); echo "FAILED: building $t"; continue
    fi
    mkdir -p "$dir/work-$t" && cp "$corpus"/* "$dir/work-$t/" 2>/dev/null || true
    if (cd "$dir" && "./$t" -max_total_time="$seconds" -rss_limit_mb=2048 "work-$t" >"$t.log" 2>&1); then
      ok=$((ok + 1)); echo "$t: $(grep -Eo 'Done [0-9]+ runs' "$dir/$t.log" | tail -1)"
    else
      bad=$((bad + 1)); echo "FAILED: $t"; tail -30 "$dir/$t.log"
    fi
  done
  count "$ok" "$bad" "fuzz"
}
stage_realworld() {
  local rc=0
  note "realworld: unmodified programs under selfprof record and perf record --call-graph dwarf"
  if [ ! -x "$build_root/gcc/selfprof" ]; then
    echo "test.sh: no $build_root/gcc/selfprof (stage gcc not run?)"
    count 0 1 "realworld: no selfprof binary"
    return
  fi
  python3 "$root_dir/tests/realworld/realworld.py" "$build_root/gcc/selfprof" --markdown || rc=$?
  case $rc in
    0) count 1 0 "realworld" ;;
    77) echo "test.sh: realworld skipped" ;;
    *) count 0 1 "realworld" ;;
  esac
}
stage_no_perf() { run_ctest no_perf; }

install_packages
mkdir -p "$build_root"
start=$SECONDS
for s in $stages; do
  if ! declare -F "stage_$s" >/dev/null; then
    echo "test.sh: unknown stage '$s'" >&2
    count 0 1 "stage $s"
    continue
  fi
  t0=$SECONDS
  "stage_$s"
  echo "test.sh: stage $s took $((SECONDS - t0)) s"
done
note "summary ($((SECONDS - start)) s)"
for f in "${failures[@]}"; do echo "FAILED: $f"; done
echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
