#!/bin/bash
# `selfprof dump PID` and the profile endpoint end to end, on a program run under `selfprof record`
# whose main thread sleeps in sleep(5) (again, until the dumps are done) while another thread burns CPU:
#  - dumps over the control socket arrive (every format, the next N seconds and since start), the hot
#    function leads, and sleep() still returns only after its full 5 s (no signal reached the program);
#  - `go tool pprof -top http://127.0.0.1:PORT/debug/pprof/profile?seconds=2` (SELFPROF_HTTP) reads the
#    endpoint unchanged: the hot function leads, and the total is within 10% of the CPU time the busy
#    thread used in those 2 s: 2 s on an idle machine; on a loaded one less, so it is read from /proc
#    around the request (at least 90% of its rate times 2 s, at most 110% of all it used); and where it
#    had a CPU nearly all the time, 2 s x 99 Hz within 10% (skipped without go);
#  - errors: no such process, a process that is not profiled; as root, another uid is refused.
# Usage: dump_test.sh [SELFPROF_BINARY]. Exit 0 pass, 77 skip, else fail.
set -u
bin=${1:-${SELFPROF_BIN:-}}
[ -n "$bin" ] && [ -x "$bin" ] || { echo "SKIP: selfprof binary not given"; exit 77; }
bin=$(cd "$(dirname "$bin")" && pwd)/$(basename "$bin")
here=$(cd "$(dirname "$0")" && pwd)
cc=${CC:-cc}
command -v "$cc" > /dev/null || { echo "SKIP: no C compiler"; exit 77; }
tmp=$(mktemp -d)
chmod 755 "$tmp"
pids=()
trap 'for p in "${pids[@]}"; do kill "$p" 2>/dev/null; done; rm -rf "$tmp"' EXIT
cd "$tmp"
fails=0
ok() { echo "ok   $1"; }
bad() { echo "FAIL $1"; fails=$((fails + 1)); }
"$cc" -O2 -fno-omit-frame-pointer -pthread -o sleeper "$here/src/sleeper.c" || { echo "SKIP: cannot compile sleeper.c"; exit 77; }
if ! "$bin" record -q -o probe.folded -- true 2> err; then
  grep -q "cannot find libselfprof-preload.so" err && { echo "SKIP: $(cat err)"; exit 77; }
fi
count_of() { awk -v pat="$2" 'index($0, pat) { n += $NF } END { print n + 0 }' "$1"; }

# Waits for "ready" in file $1; prints the pid of the program (the child of `selfprof record`).
wait_ready() {
  for _ in $(seq 100); do grep -q ready "$1" 2> /dev/null && return 0; sleep 0.05; done
  return 1
}

# go tool pprof against the endpoint (section 3): waits for the program, asks for 2 s, measures the CPU
# time the program used meanwhile.
go_probe() {
  wait_ready go.out || return
  addr=$(sed -n 's|.*serving profiles at http://\([^/]*\)/debug/pprof/.*|\1|p' go.err | head -1)
  echo "$addr" > go.addr
  [ -n "$addr" ] || return
  cpu_of() { awk '{ print $14 + $15 }' "/proc/$1/stat"; }
  gopid=$(pgrep -P "$1" -x sleeper || echo "$1")
  t0=$(date +%s.%N); c0=$(cpu_of "$gopid")
  go tool pprof -top "http://$addr/debug/pprof/profile?seconds=2" > go.top 2>&1
  t1=$(date +%s.%N); c1=$(cpu_of "$gopid")
  # The window is inside [t0, t1]: it used at most c1 - c0, and about (c1 - c0) * 2 / (t1 - t0).
  awk -v c0="$c0" -v c1="$c1" -v t0="$t0" -v t1="$t1" -v hz="$(getconf CLK_TCK)" \
    'BEGIN { printf "%.3f %.3f", (c1 - c0) / hz / (t1 - t0) * 2, (c1 - c0) / hz }' > go.want
}
# 1. The control socket: dumps while the main thread sleeps.
# The program sleeps 5 s at a time until the dumps are done (dumps are slow on a loaded machine).
"$bin" record -q -F 199 -o exit.folded -- ./sleeper 5 "$tmp/dumps-done" > sleeper.out 2> sleeper.err &
rec=$!
pids+=("$rec")
wait_ready sleeper.out || bad "the program did not start"
pid=$(pgrep -P "$rec" -x sleeper || echo "$rec")
sleep 0.5
"$bin" dump "$pid" -o now.folded && ok "dump since start" || bad "dump since start"
[ -f now.folded ] && [ "$(stat -c %a now.folded)" = 600 ] && ok "written 0600" || bad "dump file mode"
"$bin" dump "$pid" --seconds 1 -o next.folded && ok "dump --seconds 1" || bad "dump --seconds 1"
if [ -f next.folded ]; then
  hot=$(count_of next.folded spin_hot_function); all=$(count_of next.folded "")
  # One busy thread at 199 Hz for one second: at most about 199 samples (fewer on a loaded machine).
  [ "$hot" -gt 0 ] && [ $((hot * 10)) -ge $((all * 8)) ] && [ "$all" -ge 20 ] && [ "$all" -le 240 ] &&
    ok "next second: spin_hot_function has $hot of $all samples" ||
    bad "next second: spin_hot_function has $hot of $all samples"
fi
"$bin" dump "$pid" --format pprof -o cpu.pb.gz && [ "$(head -c 2 cpu.pb.gz | od -An -tx1 | tr -d ' ')" = 1f8b ] &&
  ok "pprof format (gzip)" || bad "pprof format"
"$bin" dump "$pid" -o fg.svg && grep -q spin_hot_function fg.svg && ok "SVG" || bad "SVG"
"$bin" dump "$pid" --format top > top.txt && grep -q spin_hot_function top.txt && ok "top to stdout" || bad "top to stdout"
# Another uid is refused (needs root to switch uid).
if [ "$(id -u)" = 0 ] && command -v setpriv > /dev/null; then
  cp "$bin" "$tmp/selfprof-copy" && chmod 755 "$tmp/selfprof-copy"
  setpriv --reuid=65534 --regid=65534 --clear-groups "$tmp/selfprof-copy" dump "$pid" > /dev/null 2> err; rc=$?
  [ $rc -ne 0 ] && grep -q 403 err && ok "another uid is refused: $(cat err)" || bad "another uid: rc $rc $(cat err)"
else
  echo "skip another uid is refused: needs root and setpriv to switch uid"
fi
touch "$tmp/dumps-done"
wait "$rec"; rc=$?
[ $rc -eq 0 ] && ok "sleep(5) slept its full time during the dumps: $(tail -1 sleeper.out)" ||
  bad "sleep cut short (status $rc): $(tail -1 sleeper.out)"

# 2. Errors.
"$bin" dump 999999 2> err; rc=$?
[ $rc -eq 1 ] && grep -q "no control socket" err && ok "no such process: $(cat err)" || bad "no such process: rc $rc $(cat err)"
sleep 3 & plain=$!
pids+=("$plain")
"$bin" dump "$plain" 2> err; rc=$?
[ $rc -eq 1 ] && ok "a process that is not profiled: $(cat err)" || bad "not profiled: rc $rc"
kill "$plain" 2> /dev/null
"$bin" dump 1x 2> err; rc=$?
[ $rc -eq 2 ] && ok "a bad pid is a usage error" || bad "bad pid: rc $rc"

# 3. go tool pprof against the endpoint, alone (its CPU measure is fairer on a quiet machine).
have_go=0
if command -v go > /dev/null; then
  have_go=1
  export GOCACHE=$tmp/gocache HOME=$tmp PPROF_TMPDIR=$tmp PPROF_BINARY_PATH=$tmp/none
  SELFPROF_HTTP=127.0.0.1:0 SELFPROF_VERBOSE=1 "$bin" record -q -F 99 -o go-exit.folded -- ./sleeper 1 "$tmp/go-done" > go.out 2> go.err &
  gorec=$!
  pids+=("$gorec")
  go_probe "$gorec"
  touch "$tmp/go-done"
fi

if [ $have_go = 1 ]; then
  wait "$gorec"
  if [ ! -s go.addr ]; then
    bad "no endpoint address in the verbose output: $(cat go.err)"
  else
    first=$(awk '/flat%/ { getline; print $NF; exit }' go.top)
    total=$(sed -n 's/.*Total samples = \([0-9.]*\)\(m\?s\).*/\1 \2/p' go.top)
    read -r want most < go.want
    [ "$first" = spin_hot_function ] && ok "go tool pprof: $first leads" || { bad "go tool pprof: '$first' leads"; cat go.top; }
    if echo "$total" | awk -v w="$want" -v m="$most" '{ v = $2 == "ms" ? $1 / 1000 : $1; exit !(v >= 0.9 * w && v <= 1.1 * m) }'; then
      ok "go tool pprof: total $total for 2 s at 99 Hz; the program used about ${want} s of CPU in 2 s (at most $most)"
    else
      bad "go tool pprof: total '$total'; the program used about ${want} s of CPU in 2 s (at most $most)"; cat go.top
    fi
    # Where the busy thread had its CPU nearly all the time, the total is the requested seconds x rate
    # (198 samples of 1/99 s: 2 s) within 10%.
    if awk -v w="$want" 'BEGIN { exit !(w >= 1.8) }'; then
      if echo "$total" | awk '{ v = $2 == "ms" ? $1 / 1000 : $1; exit !(v >= 1.8 && v <= 2.2) }'; then
        ok "go tool pprof: total $total is 2 s x 99 Hz within 10%"
      else
        bad "go tool pprof: total '$total', not 2 s x 99 Hz within 10%"
      fi
    fi
  fi
else
  echo "skip go tool pprof: go not found (apt-get install golang-go)"
fi

[ $fails -eq 0 ] && echo "PASS" || echo "$fails FAILED"
[ $fails -eq 0 ]
