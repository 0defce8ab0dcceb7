#!/bin/bash
# `selfprof record` end to end: a C program, a multi-threaded C++ program and /bin/sh running a busy
# loop are profiled through the preload library; the hot function must show up, the exit status and
# stdout must be unchanged; exec'd children are profiled only with --follow-exec; errors are clear;
# and it works for an unprivileged user.
# Usage: record_test.sh [SELFPROF_BINARY]  (or SELFPROF_BIN=...; the preload library must be next to
# it, in ../lib/selfprof/, or given by SELFPROF_PRELOAD). Exit 0 pass, 77 skip, else fail.
set -u
bin=${1:-${SELFPROF_BIN:-}}
[ -n "$bin" ] && [ -x "$bin" ] || { echo "SKIP: selfprof binary not given"; exit 77; }
bin=$(cd "$(dirname "$bin")" && pwd)/$(basename "$bin")
here=$(cd "$(dirname "$0")" && pwd)
cc=${CC:-cc}; cxx=${CXX:-c++}
command -v "$cc" > /dev/null && command -v "$cxx" > /dev/null || { echo "SKIP: no C/C++ compiler"; exit 77; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cd "$tmp"
fails=0
ok() { echo "ok   $1"; }
bad() { echo "FAIL $1"; fails=$((fails + 1)); }
"$cc" -O2 -fno-omit-frame-pointer -o hot_c "$here/src/hot.c" || { echo "SKIP: cannot compile hot.c"; exit 77; }
"$cxx" -O2 -fno-omit-frame-pointer -pthread -o hot_cpp "$here/src/hot.cpp" || { echo "SKIP: cannot compile hot.cpp"; exit 77; }
if ! "$bin" record -q -o probe.folded -- true 2> err; then
  grep -q "cannot find libselfprof-preload.so" err && { echo "SKIP: $(cat err)"; exit 77; }
fi

# The sum of counts of the folded lines containing $2 in file $1.
count_of() { awk -v pat="$2" 'index($0, pat) { n += $NF } END { print n + 0 }' "$1"; }

# C: exit status and stdout pass through; the hot function dominates.
./hot_c 3 > plain.out
"$bin" record -q -F 199 -o c-%p.folded -- ./hot_c 3 > rec.out; rc=$?
[ $rc -eq 3 ] && ok "C: exit status 3 passed through" || bad "C: exit status $rc, want 3"
cmp -s plain.out rec.out && ok "C: stdout unchanged" || bad "C: stdout changed"
f=$(ls c-*.folded 2> /dev/null | head -1)
if [ -n "$f" ]; then
  hot=$(count_of "$f" hot_c_function); all=$(count_of "$f" "")
  [ "$hot" -gt 0 ] && [ $((hot * 2)) -gt "$all" ] && ok "C: hot_c_function has $hot of $all samples" ||
    bad "C: hot_c_function has $hot of $all samples"
else
  bad "C: no profile written"
fi

# C++ with four threads: every thread armed (pthread_create interposed), the worker dominates.
./hot_cpp 5 > plain.out
"$bin" record -q -F 199 -o cpp.folded -- ./hot_cpp 5 > rec.out; rc=$?
[ $rc -eq 5 ] && ok "C++: exit status 5 passed through" || bad "C++: exit status $rc, want 5"
cmp -s plain.out rec.out && ok "C++: stdout unchanged" || bad "C++: stdout changed"
if [ -f cpp.folded ]; then
  hot=$(count_of cpp.folded hot_cpp_worker); all=$(count_of cpp.folded "")
  [ "$hot" -gt 0 ] && [ $((hot * 2)) -gt "$all" ] && ok "C++: hot_cpp_worker has $hot of $all samples" ||
    bad "C++: hot_cpp_worker has $hot of $all samples"
else
  bad "C++: no profile written"
fi

# The path the child wrote is named with %p expanded and %% taken as a literal %; one with a field the
# child chose itself (%n, %t) is not named.
"$bin" record -o 'pct100%%-%p.folded' -- ./hot_c 0 > /dev/null 2> pct.err
named=$(sed -n 's/^selfprof record: profile written to //p' pct.err)
[ -n "$named" ] && [ -f "$named" ] && case "$(basename "$named")" in pct100%-[0-9]*.folded) true ;; *) false ;; esac &&
  ok "the profile's path is named: $(basename "$named")" || bad "named path: '$named' ($(cat pct.err))"
"$bin" record -o 'num-%n.folded' -- ./hot_c 0 > /dev/null 2> num.err
[ -f num-1.folded ] && ! grep -q "written to" num.err && ok "a path with %n is written, not named" ||
  bad "%n path: $(ls num-* 2> /dev/null) $(cat num.err)"

# SVG output (the default format) of the C program.
"$bin" record -q -o c.svg -- ./hot_c 0 > /dev/null
grep -q "hot_c_function" c.svg 2> /dev/null && ok "SVG output names the hot function" || bad "SVG output"

# /bin/sh running a busy loop; dash leaves with _exit(), which the library interposes.
script='i=0; while [ $i -lt 200000 ]; do i=$((i+1)); done; echo loop done; exit 4'
/bin/sh -c "$script" > plain.out
"$bin" record -q -o sh.folded -- /bin/sh -c "$script" > rec.out; rc=$?
[ $rc -eq 4 ] && ok "sh: exit status 4 passed through" || bad "sh: exit status $rc, want 4"
cmp -s plain.out rec.out && ok "sh: stdout unchanged" || bad "sh: stdout changed"
[ -f sh.folded ] && [ "$(count_of sh.folded "")" -gt 0 ] && ok "sh: busy loop sampled ($(count_of sh.folded "") samples)" ||
  bad "sh: no samples"

# exec'd children: not profiled by default, profiled with --follow-exec.
mkdir def fol
"$bin" record -q -o def/p-%p.folded -- /bin/sh -c './hot_c 0 100000000 > /dev/null; true'
"$bin" record -q --follow-exec -o fol/p-%p.folded -- /bin/sh -c './hot_c 0 100000000 > /dev/null; true'
nd=$(ls def | wc -l); nf=$(ls fol | wc -l)
[ "$nd" -eq 1 ] && ok "default: the exec'd child is not profiled" || bad "default: $nd profiles, want 1"
[ "$nf" -eq 2 ] && grep -q hot_c_function fol/*.folded && ok "--follow-exec: the exec'd child is profiled" ||
  bad "--follow-exec: $nf profiles, want 2 with hot_c_function"

# A wrapper that execs the real program (pyenv's python3 shim; issue 15): no profile, and record says
# what the program exec'd and that --follow-exec follows it.
printf '#!/bin/sh\nexec ./hot_c 0 1000 > /dev/null\n' > shim && chmod +x shim
"$bin" record -o shim.folded -- ./shim 2> shim.err
if [ ! -f shim.folded ] && grep -q "exec'd ./hot_c" shim.err && grep -q -- "--follow-exec" shim.err; then
  ok "a shim that execs: record names what it exec'd and suggests --follow-exec"
else
  bad "shim that execs: $(cat shim.err)"
fi
"$bin" record -o shim2.folded --follow-exec -- ./shim 2> shim.err
[ -f shim2.folded ] && ! grep -q "exec'd" shim.err && ok "the shim with --follow-exec: profile written" ||
  bad "the shim with --follow-exec: $(cat shim.err)"

# kill -USR2 asks for a dump and never cuts the program's sleep short (issue 15 item 6): the preload routes
# the dump signal to its dumper thread. perl's sleep returns the seconds slept, less when interrupted.
"$bin" record -q -o usr2-%n.folded -- perl -e 'print sleep(3), "\n"' > usr2.out &
rec=$!
kid=
# The child, once its collector thread runs: start() has taken the signal by then (before, SIGUSR2 would
# kill it); the dumper thread itself starts at the first request.
for i in $(seq 50); do
  # The kernel's list of the recorder's children: a scan of every /proc/PID/stat forks once per process
  # and, on a busy machine, outlasted the 3 s sleep.
  read -r kid _ < /proc/"$rec"/task/"$rec"/children 2> /dev/null
  [ -n "$kid" ] && grep -qx selfprof /proc/"$kid"/task/*/comm 2> /dev/null && break
  kid=
  sleep 0.05
done
for i in 1 2 3; do [ -n "$kid" ] && kill -USR2 "$kid"; sleep 0.3; done
wait $rec
n=$(ls usr2-*.folded 2> /dev/null | wc -l)
[ "$(cat usr2.out)" = 3 ] && [ "$n" -ge 2 ] && ok "kill -USR2 x3 during sleep(3): slept 3 s, $n profiles" ||
  bad "kill -USR2 during sleep(3): slept '$(cat usr2.out)' s, $n profiles"

# exec while sampling (issue 21 item 1, issue 15 item 4): a tick pending at execve used to kill the new
# image (status 155, SIGPROF's default action), every time with perf_event and with the itimer. The
# preload stops sampling before the exec; the exec'd program prints and exits normally.
exec_fails=0
for i in $(seq 20); do
  out=$("$bin" record -q -F 499 -o ex-%p.folded -- /bin/sh -c './hot_c 0 20000000 > /dev/null; exec echo after-exec'); rc=$?
  [ "$out" = after-exec ] && [ $rc -eq 0 ] || exec_fails=$((exec_fails + 1))
done
[ $exec_fails -eq 0 ] && ok "exec after work at 499 Hz: 20 of 20 new images ran" || bad "exec at 499 Hz: $exec_fails of 20 died"
exec_fails=0
for i in $(seq 5); do
  out=$(SELFPROF_SOURCE=itimer "$bin" record -q -o ex-%p.folded -- /bin/sh -c './hot_c 0 20000000 > /dev/null; exec echo after-exec'); rc=$?
  [ "$out" = after-exec ] && [ $rc -eq 0 ] || exec_fails=$((exec_fails + 1))
done
[ $exec_fails -eq 0 ] && ok "exec after work with the itimer: 5 of 5 new images ran" || bad "exec with the itimer: $exec_fails of 5 died"
out=$("$bin" record -q --follow-exec -F 499 -o ex-%p.folded -- /bin/sh -c './hot_c 0 20000000 > /dev/null; exec /bin/sh -c "./hot_c 0 20000000 > /dev/null; exec echo chain"'); rc=$?
[ "$out" = chain ] && [ $rc -eq 0 ] && ok "--follow-exec: a chain of execs runs to its end" || bad "--follow-exec exec chain: rc $rc, output '$out'"

# selfprof's own threads are never sampled (issue 21 item 8): with a root per thread, no root names one.
SELFPROF_THREAD_ROOTS=1 "$bin" record -q -F 499 --interval=0.05 -o own-%p.folded -- ./hot_cpp 0 > /dev/null
if [ -n "$(ls own-*.folded 2> /dev/null)" ] && grep -q hot_cpp_worker own-*.folded; then
  grep -q '^\[selfprof' own-*.folded && bad "selfprof's own threads appear in the profile" ||
    ok "selfprof's own threads (collector, dumper) are not in the profile"
else
  bad "thread-root profile missing"
fi

# A program that claims the sampling signal later (issue 21 item 2: GNU sort handles SIGPROF and re-raises
# it; here a shell traps SIGURG, selfprof's default): the preload moves sampling to another signal
# before the program's handler is installed, so the handler never runs. The busy loop is bash's own (its
# children are not profiled without --follow-exec): its samples come after the move.
out=$("$bin" record -q -F 199 -o trap-%p.folded -- bash -c 'trap "exit 9" URG PROF; i=0; while [ $i -lt 300000 ]; do i=$((i+1)); done; echo done'); rc=$?
[ "$out" = done ] && [ $rc -eq 0 ] && [ "$(cat trap-*.folded 2> /dev/null | count_of /dev/stdin "")" -gt 0 ] &&
  ok "a trap on the sampling signal: never triggered, sampling goes on" || bad "trap on the sampling signal: rc $rc, output '$out'"

# A daemon whose SIGTERM handler calls _exit(0), killed while it mallocs (issue 15 item 1: the _exit
# hook used to dump inside the handler and deadlock on the malloc lock the interrupted code held). Every
# run must end promptly with status 0; the profile is written by the dumper thread when it can be.
cat > term_daemon.c << 'EOF'
#include <signal.h>
#include <stdlib.h>
#include <unistd.h>
static void on_term(int sig) { (void)sig; _exit(0); }
int main(void) {
  struct sigaction sa = {0};
  sa.sa_handler = on_term;
  sigaction(SIGTERM, &sa, 0);
  volatile unsigned long sink = 0;
  for (;;) {
    void* p[64];
    for (int i = 0; i < 64; ++i) p[i] = malloc(2048 + 64 * i); /* past the tcache: the arena lock */
    for (int i = 0; i < 64; ++i) { sink += (unsigned long)p[i]; free(p[i]); }
  }
}
EOF
hung=0 status_bad=0 written=0
if "$cc" -O2 -fno-omit-frame-pointer -o term_daemon term_daemon.c; then
  for i in 1 2 3 4 5 6 7 8; do
    "$bin" record -q -F 499 -o "term-$i.folded" -- ./term_daemon > /dev/null 2>&1 &
    rec=$!
    sleep 0.3
    kill -TERM "$(pgrep -P "$rec" | head -1)" 2> /dev/null
    for _ in $(seq 50); do kill -0 "$rec" 2> /dev/null || break; sleep 0.1; done
    if kill -0 "$rec" 2> /dev/null; then
      hung=$((hung + 1)); pkill -KILL -P "$rec"; kill -KILL "$rec" 2> /dev/null
    fi
    wait "$rec"; rc=$?
    [ $rc -eq 0 ] || status_bad=$((status_bad + 1))
    [ -s "term-$i.folded" ] && written=$((written + 1))
  done
  [ $hung -eq 0 ] && [ $status_bad -eq 0 ] && [ $written -gt 0 ] &&
    ok "SIGTERM -> _exit(0) during malloc, 8 runs: none hung, status 0, $written profiles written" ||
    bad "SIGTERM -> _exit(0): $hung hung, $status_bad with another status, $written profiles written"
else
  bad "cannot compile term_daemon.c"
fi

# What the library costs every process it is loaded into (issues 20 and 21): it needs neither libstdc++.so
# nor libgcc_s (linked in, kept local), libdw or zlib (loaded by dlopen at their first use) nor, built by
# g++, libm (clang calls libm's ceil where libstdc++'s hash tables size their buckets; g++ inlines it),
# and exports only the functions it interposes. Inline frames still come from libdw where the library was built to load it (its image
# names libdw.so.1), in a program built to inline its hot loop.
lib=${SELFPROF_PRELOAD:-$(dirname "$bin")/libselfprof-preload.so}
[ -f "$lib" ] || lib=$(dirname "$bin")/../lib/selfprof/libselfprof-preload.so
if command -v readelf > /dev/null && command -v nm > /dev/null && [ -f "$lib" ]; then
  needed=$(readelf -d "$lib" | sed -n 's/.*Shared library: \[\(.*\)\]/\1/p' | tr '\n' ' ')
  readelf -p .comment "$lib" 2> /dev/null | grep -q clang && needed=${needed/libm.so.6 /}
  case " $needed" in
    *" libstdc++"* | *" libgcc_s"* | *" libdw"* | *" libelf"* | *" libz."* | *" libm."*) bad "preload needs: $needed" ;;
    *) ok "preload needs only: $needed" ;;
  esac
  extra=$(nm -D --defined-only "$lib" | awk '{print $NF}' |
    grep -vxE 'pthread_create|_exit|_Exit|exec(ve|v|vp|vpe|l|lp|le|veat)|fexecve|posix_spawnp?|sigaction|signal|bsd_signal|GLIBC_.*|SELFPROF.*')
  [ -z "$extra" ] && ok "preload exports only what it interposes" || bad "preload also exports: $(echo $extra | head -c 300)"
else
  echo "skip preload link checks (no readelf/nm)"
fi
# A .pb.gz the library writes is still deflate-compressed where it was built with zlib (loaded by
# dlopen): the first deflate block after the 10-byte gzip header is not a stored one (BTYPE 0), and the
# stream reads back whole.
if [ -f "$lib" ] && grep -q "libz\.so\.1" "$lib"; then
  "$bin" record -q -o c.pb.gz -- ./hot_c 0 > /dev/null
  btype=$(od -An -tu1 -j10 -N1 c.pb.gz 2> /dev/null | tr -d ' ')
  if [ -n "$btype" ] && [ $(((btype >> 1) & 3)) -ne 0 ] && gzip -t c.pb.gz 2> /dev/null; then
    ok "pprof from the library is deflate-compressed (zlib by dlopen), $(wc -c < c.pb.gz) bytes"
  else
    bad "pprof from the library: first block type byte '${btype}', gzip -t: $(gzip -t c.pb.gz 2>&1 | head -c 200)"
  fi
else
  echo "skip compressed pprof (the library was built without zlib)"
fi
if [ -f "$lib" ] && grep -q "libdw\.so\.1" "$lib"; then
  cat > inl.c << 'SRC'
#include <stdio.h>
static inline __attribute__((always_inline)) double inlined_hot(double x) {
  for (int i = 0; i < 2000; i++) x = x * 1.0000001 + 0.5;
  return x;
}
__attribute__((noinline)) double outer_fn(double x) { return inlined_hot(x); }
int main(void) {
  double s = 0;
  for (long i = 0; i < 200000; i++) s += outer_fn((double)i);
  printf("%d\n", s > 0);
  return 0;
}
SRC
  "$cc" -O2 -g -fno-omit-frame-pointer -o inl inl.c
  "$bin" record -q -o inl.folded -- ./inl > /dev/null
  grep -q "outer_fn;inlined_hot_\[i\]" inl.folded 2> /dev/null && ok "inline frames from libdw loaded by dlopen" ||
    bad "no inline frame: $(head -3 inl.folded 2> /dev/null)"
else
  echo "skip inline frames (the library was built without libdw)"
fi

# A frame larger than the sampled stack copy (8 KiB), in code without frame pointers: the walk goes on
# over the live stack while the thread is still in that frame, so the leaf's stacks reach _start, both in
# the program (the ring source of the preload library; the signal source walks the live stack anyway) and
# in the recorder (--follow-exec). Samples read after main returned (the last ones, read at exit) stop at
# the big frame instead: never a wrong caller, such as exit() where main was.
cat > nofp.c << 'SRC'
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
__attribute__((noinline)) unsigned long nofp_leaf(unsigned long n) {
  volatile unsigned long buf[8] = {0};
  for (unsigned long i = 0; i < n; ++i) buf[i & 7] = buf[(i + 3) & 7] * 6364136223846793005ul + i;
  return buf[1];
}
__attribute__((noinline)) unsigned long nofp_mid(unsigned long n) { return nofp_leaf(n) + 1; }
__attribute__((noinline)) unsigned long nofp_top(unsigned long n) { return nofp_mid(n) * 3; }
__attribute__((noinline)) unsigned long big_frame(unsigned long n) {
  volatile char scratch[24576];
  for (unsigned long i = 0; i < sizeof scratch; i += 64) scratch[i] = (char)i;
  return nofp_leaf(n) + (unsigned long)scratch[640];
}
int main(int argc, char** argv) {
  unsigned long n = argc > 1 ? strtoul(argv[1], 0, 10) : 100000000ul;
  printf("%lu\n", (argc > 2 && strcmp(argv[2], "big") == 0 ? big_frame(n) : nofp_top(n)) & 1);
  return 0;
}
SRC
"$cc" -O2 -fomit-frame-pointer -o nofp nofp.c
for way in preload follow-exec; do
  flags=(-F 499); [ $way = follow-exec ] && flags+=(--follow-exec)
  "$bin" record -q "${flags[@]}" -o bf-$way.folded -- ./nofp 1000000000 big > /dev/null
  leaf=$(count_of bf-$way.folded "nofp_leaf")
  full=$(grep -E '^(nofp;)?_start;__libc_start_main;__libc_start_call_main;main;big_frame;nofp_leaf( |;)' \
    bf-$way.folded | awk '{ n += $NF } END { print n + 0 }')
  # A stack the copy and the live stack could not finish (the thread had left the frame) is marked.
  # In a recording of several processes it sits below the process's root, so each process is one tower.
  cut=$(grep -E '^(nofp;)?\[truncated\];big_frame;nofp_leaf( |;)' bf-$way.folded | awk '{ n += $NF } END { print n + 0 }')
  [ "$leaf" -gt 100 ] && [ $((full * 100)) -ge $((leaf * 60)) ] && [ $((full + cut)) -eq "$leaf" ] &&
    ok "$way: a 24 KiB frame without frame pointers: $full of $leaf leaf samples reach _start, $cut stop at it, marked [truncated]" ||
    bad "$way: a 24 KiB frame: $full of $leaf leaf samples reach _start, $cut stop at it: $(grep nofp_leaf bf-$way.folded | cut -c1-160)"
done

# A frame-pointer recursion deeper than the 8 KiB stack copy (41 frames of 512 bytes), left and re-entered
# with other bytes in its frames every 0.2 ms: the live stack cannot finish a cut stack, the kernel's user
# chain can (its stacks end at __libc_start_call_main, whose caller keeps no frame pointer). Both ways
# start without that chain and ask for it after a few such stacks: those few are marked [truncated],
# every later one reaches main.
cat > deepfp.c <<'SRC'
#include <stdio.h>
#include <stdlib.h>
__attribute__((noinline)) unsigned long fp_leaf(unsigned long n) {
  volatile unsigned long x = 1;
  for (unsigned long i = 0; i < n; ++i) x = x * 6364136223846793005ul + i;
  return x;
}
/* A leaf that keeps a number in rbp, with CFI rows: the kernel's frame-pointer chain continues nothing. */
unsigned long rbp_leaf(unsigned long n);
__asm__(".text\n.globl rbp_leaf\n.type rbp_leaf, @function\nrbp_leaf:\n.cfi_startproc\npush %rbp\n"
        ".cfi_def_cfa_offset 16\n.cfi_offset %rbp, -16\nmov $0x1235, %rbp\nmov %rdi, %rax\n1: dec %rax\n"
        "jnz 1b\npop %rbp\n.cfi_def_cfa_offset 8\nret\n.cfi_endproc\n.size rbp_leaf, .-rbp_leaf\n");
static int use_rbp_leaf;
__attribute__((noinline)) unsigned long big_deep(int d, unsigned long n, unsigned salt) {
  volatile unsigned char pad[512];
  for (unsigned i = 0; i < sizeof pad; i += 8) pad[i] = (unsigned char)(salt + i);
  unsigned long r = d == 0 ? (use_rbp_leaf ? rbp_leaf(n * 4) : fp_leaf(n)) : big_deep(d - 1, n, salt);
  __asm__ volatile("" ::: "memory");
  return r + pad[salt % sizeof pad];
}
int main(int argc, char** argv) {
  unsigned long rounds = argc > 1 ? strtoul(argv[1], 0, 10) : 2000, acc = 0;
  use_rbp_leaf = argc > 2;
  for (unsigned long k = 0; k < rounds; ++k) acc += big_deep(40, 200000, (unsigned)k);
  printf("%lu\n", acc & 1);
  return 0;
}
SRC
"$cc" -O2 -fno-omit-frame-pointer -o deepfp deepfp.c
for way in preload follow-exec; do
  flags=(-F 499); [ $way = follow-exec ] && flags+=(--follow-exec)
  SELFPROF_VERBOSE=1 "$bin" record -v -q "${flags[@]}" -o dfp-$way.folded -- ./deepfp 4000 > /dev/null 2> dfp-$way.err
  leaf=$(count_of dfp-$way.folded "fp_leaf")
  full=$(grep -E '^(deepfp;)?(_start;__libc_start_main;)?__libc_start_call_main;main;(big_deep;){41}fp_leaf( |;)' dfp-$way.folded |
    awk '{ n += $NF } END { print n + 0 }')
  cut=$(grep -E '^(deepfp;)?\[truncated\];(big_deep;)+fp_leaf( |;)' dfp-$way.folded | awk '{ n += $NF } END { print n + 0 }')
  # Sampled by perf_event rings (the recorder, or the library's ring source), the chain comes after at
  # least 3 cut stacks; a signal source walks the live stack and cuts none.
  # The rest are marked, but for a rare one continued on a live stack that had re-entered the recursion
  # (its bytes at the copy's end are the same every round): that one shows another depth.
  want_cut=0
  grep -qE "asked for after|selfprof: source ring" dfp-$way.err && want_cut=3
  [ "$leaf" -gt 200 ] && [ $((full * 100)) -ge $((leaf * 85)) ] && [ "$cut" -ge $want_cut ] &&
    [ $((full + cut)) -le "$leaf" ] && [ $((leaf - full - cut)) -le $((leaf / 50)) ] &&
    ok "$way: a frame-pointer recursion deeper than the copy: $full of $leaf leaf samples reach main, $cut cut before the user chain" ||
    bad "$way: a recursion deeper than the copy: $full of $leaf reach main, $cut marked: $(sort -t' ' -k2 -rn dfp-$way.folded | head -3 | cut -c1-200)"
done
# The same recursion over a leaf whose rbp is not a frame pointer: the chain, once asked for, continues
# none of those stacks and is given up (the recorder says so with -v); the samples go on at the rate.
# Where perf_event is refused, the preload library's signal source walks the live stack instead.
"$bin" record -v -q --follow-exec -F 499 -o dfr.folded -- ./deepfp 4000 rbp > /dev/null 2> dfr.err
leaf=$(count_of dfr.folded "rbp_leaf")
if grep -q "recording through the preload library" dfr.err || [ -n "${SELFPROF_TEST_NO_PERF:-}" ]; then
  [ "$leaf" -gt 200 ] && ok "follow-exec without perf_event: the rbp leaf recorded ($leaf samples)" ||
    bad "follow-exec without perf_event: $leaf rbp_leaf samples: $(head -c 300 dfr.err)"
else
  grep -q "asked for after [0-9]* cut stacks, given up" dfr.err && [ "$leaf" -gt 200 ] &&
    ok "follow-exec: the user chain given up where it continues nothing ($leaf leaf samples)" ||
    bad "follow-exec: user chain not given up: $(grep 'samples (' dfr.err | cut -c1-200); $leaf leaf samples"
fi

# --follow-exec with one profile (issues 20, 21): sampled by perf_event events every process inherits,
# read by the recorder, nothing loaded into the programs; the preload library where perf_event is refused
# (here: SELFPROF_TEST_NO_PERF=1). A program without frame pointers is unwound from its file's CFI: the
# stacks of its leaf reach main through two callers. A fork that does not exec is a process of its own.
# The shell loops for CPU of its own: each process's task clock starts at zero, so a shell that only
# forks and waits may never reach a 2 ms tick.
"$bin" record -v -q --follow-exec -F 499 -o fx.folded -- /bin/sh -c 'echo "[$LD_PRELOAD]"; ./nofp 300000000; i=0; while [ $i -lt 30000 ]; do i=$((i+1)); done; (./hot_c 0 100000000 > /dev/null; true); exec ./hot_c 0 100000000' 2> fx.err > fx.out
rc=$?
if grep -q "perf_event rings" fx.err; then
  [ $rc -eq 0 ] && [ "$(head -1 fx.out)" = "[]" ] && ok "--follow-exec by perf_event: status 0, nothing in LD_PRELOAD" ||
    bad "--follow-exec by perf_event: rc $rc, LD_PRELOAD '$(head -1 fx.out)'"
  leaf=$(count_of fx.folded "nofp_leaf")
  full=$(count_of fx.folded "nofp;_start;__libc_start_main;__libc_start_call_main;main;nofp_top;nofp_mid;nofp_leaf")
  [ "$leaf" -gt 40 ] && [ $((full * 100)) -ge $((leaf * 95)) ] &&
    ok "no frame pointers: $full of $leaf leaf samples unwound to _start from the file's CFI" ||
    bad "no frame pointers: $full of $leaf leaf samples reach _start: $(grep nofp_leaf fx.folded | sort -k2 -rn | head -2)"
  roots=$(cut -d';' -f1 fx.folded | sort -u | tr '\n' ' ')
  [ "$(count_of fx.folded "sh;")" -gt 0 ] && [ "$(grep -c '^hot_c;.*hot_c_function' fx.folded)" -ge 1 ] &&
    [ "$(count_of fx.folded "hot_c;")" -gt 30 ] && ok "fork without exec and exec: roots $roots" ||
    bad "fork and exec roots: $roots"
  "$bin" record -q --follow-exec --pid-roots -F 499 -o fxp.folded -- /bin/sh -c '(./hot_c 0 50000000 > /dev/null; true); exec ./hot_c 0 50000000' > /dev/null
  [ "$(grep -o '^hot_c \[[0-9]*\]' fxp.folded | sort -u | wc -l)" -eq 2 ] && ok "--pid-roots: the fork and the exec are two processes" ||
    bad "--pid-roots: $(cut -d';' -f1 fxp.folded | sort -u | tr '\n' ' ')"
  # A profile per process (%p) by perf_event too, written at the end: nothing loaded into the programs;
  # the script's pid holds its two images (sh, then the exec'd hot_c) under their names; the forked
  # hot_c has a profile of its own, unrooted, or rooted by name when a tick also caught its sh image
  # between fork and exec; and /usr/bin/true, which may get no sample, still gets its file.
  mkdir fpp
  "$bin" record -q --follow-exec -F 499 -o 'fpp/p-%p.folded' -- /bin/sh -c 'echo "[$LD_PRELOAD] $$"; ./hot_c 0 60000000 > /dev/null; /usr/bin/true; i=0; while [ $i -lt 30000 ]; do i=$((i+1)); done; exec ./hot_c 0 60000000' > fpp.out
  rc=$?
  n_pp=$(ls fpp | wc -l)
  script_pid=$(head -1 fpp.out | cut -d' ' -f2)
  script=fpp/p-$script_pid.folded
  both=0
  [ -f "$script" ] && grep -q '^sh;' "$script" && grep -q '^hot_c;.*hot_c_function' "$script" && both=1
  # The forked hot_c: its hot function all under _start, its only other roots sh (before its exec), the
  # loader's entry, _dl_start_user (a tick in ld.so running the libraries' initializers), and a tick inside
  # execve itself, after the old image's memory was gone: kernel frames over an unknown user pc, marked
  # [truncated] (nothing of the user stack could be copied). A tick on _start's first instructions is
  # _start alone.
  own=0
  for f in fpp/*.folded; do
    [ "$f" = "$script" ] && continue
    hot=$(count_of "$f" "hot_c_function")
    under_start=$(grep -E '^(hot_c;)?_start;.*hot_c_function' "$f" | awk '{ n += $NF } END { print n + 0 }')
    other=$(grep -vE '^(hot_c;|sh;|_start[; ]|_dl_start_user;|\[truncated\];.*execve)' "$f" | awk 'NF { n += $NF } END { print n + 0 }')
    [ "$hot" -gt 20 ] && [ "$under_start" -eq "$hot" ] && [ "$other" -eq 0 ] && own=$((own + 1))
  done
  [ $rc -eq 0 ] && [ "$(head -1 fpp.out)" = "[] $script_pid" ] && [ "$n_pp" -eq 3 ] && [ "$own" -eq 1 ] && [ "$both" -eq 1 ] &&
    ok "--follow-exec with %p by perf_event: $n_pp profiles, the forked hot_c's own, the exec under its name" ||
    bad "--follow-exec with %p: rc $rc, '$(head -1 fpp.out)', $n_pp files ($own forked hot_c, $both with sh and hot_c): $(head -3 fpp/*.folded | cut -c1-100)"
  # JIT code named from /tmp/perf-PID.map by the line current when each sample was taken: the same
  # address runs as jit_first, then (a second line for it) as jit_second.
  cat > jit.c << 'SRC'
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>
static const unsigned char loop[] = {0x48, 0x89, 0xf9, 0x48, 0xff, 0xc9, 0x75, 0xfb, 0xc3}; /* rcx=rdi; dec; jnz; ret */
int main(void) {
  unsigned char* code = mmap(0, 4096, PROT_READ | PROT_WRITE | PROT_EXEC, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (code == MAP_FAILED) return 1;
  memcpy(code, loop, sizeof loop);
  char path[64];
  snprintf(path, sizeof path, "/tmp/perf-%d.map", (int)getpid());
  const char* names[2] = {"jit_first", "jit_second"};
  for (int i = 0; i < 2; ++i) {
    FILE* f = fopen(path, "a");
    if (!f) return 2;
    fprintf(f, "%lx %zx %s\n", (unsigned long)code, sizeof loop, names[i]);
    fclose(f);
    usleep(200000); /* the recorder reads the rings (and the map) at least every 50 ms */
    ((void (*)(unsigned long))code)(600000000ul);
  }
  printf("%d\n", (int)getpid());
  return 0;
}
SRC
  if "$cc" -O2 -o jit jit.c; then
    "$bin" record -q --follow-exec -F 499 -o fxj.folded -- ./jit > jit.out
    rm -f "/tmp/perf-$(cat jit.out).map"
    j1=$(count_of fxj.folded "jit_first"); j2=$(count_of fxj.folded "jit_second")
    [ "$j1" -gt 20 ] && [ "$j2" -gt 20 ] && ok "JIT code named by the perf map line of its time: $j1 jit_first, $j2 jit_second" ||
      bad "JIT names by time: $j1 jit_first, $j2 jit_second: $(head -3 fxj.folded)"
  else
    bad "cannot compile jit.c"
  fi
  SELFPROF_TEST_NO_PERF=1 "$bin" record --follow-exec -F 499 -o fxn.folded -- ./hot_c 0 50000000 > /dev/null 2> fxn.err
  grep -q "recording through the preload library" fxn.err && grep -q "hot_c_function" fxn.folded &&
    ok "perf_event refused: the preload library records instead, and says so" || bad "perf_event refused: $(cat fxn.err)"
  SELFPROF_PRELOAD=/nonexistent/lib.so "$bin" record -q --follow-exec -F 499 -o fxl.folded -- ./hot_c 0 50000000 > /dev/null
  grep -q "hot_c_function" fxl.folded && ok "--follow-exec by perf_event needs no preload library" || bad "no preload library: no profile"
  # The raw-dump directory is made only for the preload way, and handed to the programs.
  mkdir -m 700 tmpdir_perf tmpdir_preload
  TMPDIR=$PWD/tmpdir_perf "$bin" record -q --follow-exec -o fxd.folded -- /bin/sh -c 'ls "$TMPDIR"' > perf_ls.out
  SELFPROF_TEST_NO_PERF=1 TMPDIR=$PWD/tmpdir_preload "$bin" record -q --follow-exec -o fxd2.folded -- /bin/sh -c 'ls "$TMPDIR"; echo "$SELFPROF_OUT"' > preload_ls.out
  [ ! -s perf_ls.out ] && grep -q '^selfprof-merge-' preload_ls.out && grep -q "tmpdir_preload/selfprof-merge-.*/%p" preload_ls.out &&
    [ -z "$(ls -A tmpdir_perf)$(ls -A tmpdir_preload)" ] && ok "raw-dump directory: none on the perf way, one on the preload way, removed after" ||
    bad "raw-dump directory: perf way saw '$(cat perf_ls.out)', preload way '$(cat preload_ls.out)', left '$(ls -A tmpdir_perf tmpdir_preload)'"
elif grep -q "recording through the preload library" fx.err || [ -n "${SELFPROF_TEST_NO_PERF:-}" ]; then
  grep -q "nofp_leaf" fx.folded && ok "--follow-exec without perf_event: the preload library recorded" ||
    bad "--follow-exec without perf_event: $(cat fx.err)"
else
  bad "--follow-exec: neither perf_event nor the preload library: $(cat fx.err)"
fi

# Errors: missing command (127, like a shell), missing library, bad option.
"$bin" record -q -- ./does-not-exist 2> err; rc=$?
[ $rc -eq 127 ] && grep -q "does-not-exist" err && ok "missing command: 127 and named" || bad "missing command: rc $rc"
SELFPROF_PRELOAD=/nonexistent/lib.so "$bin" record -- true 2> err; rc=$?
[ $rc -ne 0 ] && grep -q "/nonexistent/lib.so" err && ok "missing library named" || bad "missing library: rc $rc"
"$bin" record -F abc -- true 2> /dev/null; [ $? -eq 2 ] && ok "bad -F: exit 2" || bad "bad -F"
# A preload path LD_PRELOAD cannot carry (it splits at ':' and ' '): refused, named, nothing run.
mkdir -p "odd dir" && : > "odd dir/libselfprof-preload.so"
SELFPROF_PRELOAD="$PWD/odd dir/libselfprof-preload.so" "$bin" record -- sh -c 'echo ran' > out 2> err; rc=$?
[ $rc -eq 2 ] && grep -q "odd dir" err && ! grep -q ran out && ok "preload path with a space: refused and named" ||
  bad "preload path with a space: rc $rc"

# Unprivileged user (when running as root and setpriv is available).
if [ "$(id -u)" -eq 0 ] && command -v setpriv > /dev/null && id nobody > /dev/null 2>&1; then
  mkdir -p user && chown nobody user && chmod 755 "$tmp"
  lib=$(dirname "$bin")/libselfprof-preload.so
  [ -f "$lib" ] || lib=$(dirname "$bin")/../lib/selfprof/libselfprof-preload.so
  (cd user && setpriv --reuid=nobody --regid="$(id -g nobody)" --clear-groups \
     env SELFPROF_PRELOAD="${SELFPROF_PRELOAD:-$lib}" "$bin" record -q -o u.folded -- ../hot_c 6 > /dev/null)
  rc=$?
  [ $rc -eq 6 ] && grep -q hot_c_function user/u.folded 2> /dev/null && ok "unprivileged user" ||
    bad "unprivileged user: rc $rc"
else
  echo "skip unprivileged user (not root or no setpriv)"
fi

[ $fails -eq 0 ] && echo "PASS" || echo "$fails failure(s)"
[ $fails -eq 0 ]
