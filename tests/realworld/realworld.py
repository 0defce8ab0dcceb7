#!/usr/bin/env python3
"""Profiles unmodified programs from Debian (python3, node with --perf-basic-prof, sqlite3, xz, perl, a
g++ compile, a shell pipeline, a two-thread zstd) with `selfprof record --follow-exec` (perf_event rings
read by the recorder: nothing is loaded into the program) and, as root, under `perf record --call-graph
dwarf` in the same run, so that both profiles see one execution and only how each samples, unwinds and
names differs. --preload records through the preload library instead.

Per program it checks that the exit status, stdout and stderr are those of the program run alone, and
against perf (499 Hz, about 3 s of CPU each):
  unnamed    share of samples whose leaf has no name ([unknown], [module], [module+0x..])
             <= perf's share + 1 point
  top15      how many of perf's 15 largest self functions (those with >= 0.5% of samples) are among
             selfprof's 15 (or within 0.5 points of its 15th): all but 2 at most
  maxdiff    the largest self-share difference among perf's top 15: <= 2 points
  entry      share of stacks whose outermost frame is a thread entry (_start, main, clone3,
             start_thread, ...; in a stripped program, its unnamed _start outside __libc_start_main):
             >= perf's share - 1 point
Shares from ~1500 samples a side carry sampling noise (a 43% share's difference between two samplings
has a standard error of 1.6 points): each share threshold is widened by two standard errors of the
difference it tests, and when a comparison fails, a second run's samples are pooled with the first's
and judged again. A systematic difference (a module left unnamed, stacks cut short) stays. The table also gives selfprof's
samples as a share of perf's CPU time (its sample periods) times the rate.
Kernel frames (_[k]) are removed from both profiles first, so the leaf is the user function that
entered the kernel. Names are normalized: annotations, argument lists and return types, '+0x..'
offsets, symbol versions, clone suffixes; [mod+0x..] -> [mod].
Without root or perf only the first checks run.

Usage: realworld.py SELFPROF_BINARY [--only NAME,...] [--keep DIR] [--hz N] [--markdown] [--preload]
Exit status: 0 all passed, 1 a check failed, 77 nothing could run.
"""
import argparse
import glob
import math
import os
import re
import shutil
import subprocess
import sys
import tempfile

TOP_FLOOR = 0.5  # percent of samples
RANK_SLACK = 0.5  # points
ENTRY = {"_start", "main", "clone", "clone3", "start_thread", "__libc_start_main",
         "__libc_start_call_main", "_dl_start_user", "_dl_start"}

JS = r"""
'use strict';
function work(n) {
  let s = '', total = 0;
  const words = [];
  for (let i = 0; i < n; i++) {
    const w = (i * 7919 % 100003).toString() + 'Ab' + String.fromCharCode(65 + i % 26);
    words.push(w.toLowerCase());
    s += w.length;
  }
  for (let r = 0; r < 6; r++) {
    const copy = words.slice();
    copy.sort((a, b) => a < b ? -1 : a > b ? 1 : 0);
    const m = new Map();
    for (const w of copy) m.set(w.slice(0, 3), (m.get(w.slice(0, 3)) || 0) + 1);
    total += m.size + JSON.stringify(copy.slice(0, 2000)).length;
  }
  return total + s.length;
}
console.log(work(400000));
"""

PYTHON = r"""
import json, re, random
random.seed(7)
rows = [{"k": i, "v": str(i * 7), "l": [random.random() for _ in range(5)]} for i in range(60000)]
total = 0
for r in range(6):
    s = json.dumps(rows)
    total += len(json.loads(s))
    total += len(re.findall(r'"v": "(\d+)7"', s))
    total += len(sorted(rows, key=lambda x: x["l"][r % 5]))
print(total)
"""

SQL = """
CREATE TABLE t(id INTEGER PRIMARY KEY, a INTEGER, b TEXT);
WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c WHERE x < 1500000)
INSERT INTO t SELECT x, (x * 7919) % 10007, printf('%08x', (x * 2654435761) % 4294967296) || x FROM c;
CREATE INDEX t_a ON t(a);
CREATE INDEX t_b ON t(b);
SELECT a % 97, count(*), sum(length(b)) FROM t GROUP BY a % 97 ORDER BY 1 LIMIT 3;
SELECT count(*) FROM t AS x JOIN t AS y ON x.a = y.id WHERE y.b LIKE '%F%';
SELECT count(DISTINCT substr(b, 1, 4)) FROM t;
"""

PERL = r"""
my %h; my $s = 0;
for my $i (1 .. 2000000) {
  my $w = join('', map { chr(97 + ($i * $_) % 26) } 1 .. 8);
  $h{$w}++;
  $s += () = $w =~ /[aeiou]/g;
}
my @k = sort { $h{$b} <=> $h{$a} || $a cmp $b } keys %h;
print scalar(@k), " $s $k[0]\n";
"""

CPP = r"""
#include <algorithm>
#include <map>
#include <regex>
#include <string>
#include <vector>
template <int N> struct fib { static constexpr long v = fib<N - 1>::v + fib<N - 2>::v; };
template <> struct fib<0> { static constexpr long v = 0; };
template <> struct fib<1> { static constexpr long v = 1; };
std::map<std::string, std::vector<int>> table;
long use(const std::string& s) {
  std::regex re("([a-z]+)-([0-9]+)");
  std::smatch m;
  long n = fib<40>::v;
  if (std::regex_search(s, m, re)) table[m[1]].push_back(std::stoi(m[2]));
  for (auto& [k, v] : table) { std::sort(v.begin(), v.end()); n += static_cast<long>(v.size()); }
  return n;
}
"""


def make_inputs(d):
    """Writes the corpus's inputs into d; deterministic, so outputs can be compared byte for byte."""
    with open(os.path.join(d, "work.js"), "w") as f:
        f.write(JS)
    with open(os.path.join(d, "work.py"), "w") as f:
        f.write(PYTHON)
    with open(os.path.join(d, "work.sql"), "w") as f:
        f.write(SQL)
    with open(os.path.join(d, "work.pl"), "w") as f:
        f.write(PERL)
    with open(os.path.join(d, "tu.cpp"), "w") as f:
        f.write(CPP)
    # Text that compresses like real text: words from a fixed generator.
    state = 12345
    words = []
    for _ in range(2000000):
        state = (state * 1103515245 + 12345) & 0x7FFFFFFF
        words.append("w%d" % (state % 5000) if state % 3 else "x%d" % (state % 50))
    lines = "".join(" ".join(words[i:i + 12]) + "\n" for i in range(0, len(words), 12))
    with open(os.path.join(d, "text"), "w") as f:
        f.write(lines)
    with open(os.path.join(d, "text4"), "w") as f:
        f.write(lines[:4000000])


def corpus(d):
    """name, argv, follow_exec, required programs. Each runs for about 2-4 s of CPU here."""
    text = os.path.join(d, "text")
    return [
        ("python3", ["/usr/bin/python3", os.path.join(d, "work.py")], False, ["/usr/bin/python3"]),
        ("node", ["node", "--perf-basic-prof", os.path.join(d, "work.js")], False, ["node"]),
        ("sqlite3", ["sqlite3", ":memory:", ".read " + os.path.join(d, "work.sql")], False, ["sqlite3"]),
        ("xz", ["xz", "-T1", "-6", "-c", text + "4"], False, ["xz"]),
        ("perl", ["perl", os.path.join(d, "work.pl")], False, ["perl"]),
        ("g++", ["g++", "-std=c++17", "-O2", "-c", "-o", "/dev/null", os.path.join(d, "tu.cpp")],
         True, ["g++"]),
        ("pipeline", ["/bin/sh", "-c", "sort " + text + " | uniq -c | sort -rn | head -1; "
                      "gzip -9 -c " + text + " | gzip -dc | md5sum"], True, ["sort", "gzip", "md5sum"]),
        ("zstd -T2", ["zstd", "-q", "-T2", "-13", "-B1048576", "-c", text], False, ["zstd"]),
    ]


def run(argv, cwd):
    """Runs argv; returns (status, stdout, stderr). A hang is a failure, not a stuck CI."""
    try:
        p = subprocess.run(argv, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=300)
    except subprocess.TimeoutExpired:
        return 124, b"", b"timed out after 300 s: " + " ".join(argv).encode()
    return p.returncode, p.stdout, p.stderr


def is_kernel(frame):
    return frame.endswith("_[k]")


def normalize(frame):
    """One spelling for the same function in both profiles."""
    for suffix in ("_[k]", "_[j]", "_[i]", "_[w]"):
        if frame.endswith(suffix):
            frame = frame[: -len(suffix)]
    m = re.match(r"^\[(.+?)\+0x[0-9a-f]+\]$", frame)  # selfprof's [module+0xoffset]
    if m:
        return "[" + os.path.basename(m.group(1)) + "]"
    frame = re.sub(r"\+0x[0-9a-f]+$", "", frame)
    frame = re.sub(r"@@?[A-Z][A-Za-z0-9_.]*$", "", frame)  # perf's symbol versions: memcpy@@GLIBC_2.14
    if not frame.startswith("["):
        # Drop an argument list and what follows it (const, [clone .cold]); keep operator().
        depth = 0
        for i, c in enumerate(frame):
            if c == "(" and depth == 0 and i > 0 and not frame[:i].endswith("operator"):
                frame = frame[:i]
                break
            if c == "<":
                depth += 1
            elif c == ">" and depth > 0:
                depth -= 1
        frame = re.sub(r"\.(cold|part\.\d+|isra\.\d+|constprop\.\d+|lto_priv\.\d+)$", "", frame)
        frame = drop_return_type(frame)
    return frame


def drop_return_type(name):
    """A demangled template function carries its return type ('int ns::f<int>'); perf shows none."""
    if "::" not in name and "<" not in name:
        return name
    depth, cut = 0, -1
    for i, c in enumerate(name):
        if c == "<":
            depth += 1
        elif c == ">" and depth > 0:
            depth -= 1
        elif c == " " and depth == 0:
            if name[:i].endswith("operator"):  # operator new, operator delete[]
                break
            cut = i
            if name.startswith("operator", i + 1):
                break
    return name[cut + 1:] if cut >= 0 else name


def unnamed(frame):
    return frame == "" or frame.startswith("[") or frame.startswith("0x")


def read_folded(path, drop_root, skip_root=None):
    """[(frames, count)] with kernel frames removed and, when drop_root, the process-name root;
    stacks rooted at skip_root (the recorder, in perf's profile of the joint run) are left out."""
    stacks = []
    total = 0
    with open(path, errors="replace") as f:
        for line in f:
            line = line.rstrip("\n")
            stack, _, count = line.rpartition(" ")
            if not stack or not count.isdigit():
                continue
            frames = stack.split(";")
            if skip_root is not None and frames[0] == skip_root:
                continue
            if drop_root:
                frames = frames[1:]
            total += int(count)
            frames = [normalize(x) for x in frames if not is_kernel(x)]
            if frames:
                stacks.append((frames, int(count)))
    return stacks, total


def summarize(stacks):
    total = sum(c for _, c in stacks)
    self_share = {}
    unnamed_n = entry_n = 0
    for frames, c in stacks:
        leaf = frames[-1]
        if unnamed(leaf):
            leaf = "[unnamed]"
            unnamed_n += c
        self_share[leaf] = self_share.get(leaf, 0) + c
        # The outermost frame, or the one inside it when that is a stripped program's _start (unnamed,
        # directly outside __libc_start_main).
        if frames[0] in ENTRY or (len(frames) > 1 and frames[1] in ENTRY and unnamed(frames[0])):
            entry_n += c
    total = max(total, 1)
    return {
        "samples": total,
        "self": {k: 100.0 * v / total for k, v in self_share.items()},
        "unnamed": 100.0 * unnamed_n / total,
        "entry": 100.0 * entry_n / total,
    }


def top(share, n=15):
    return [k for k, _ in sorted(share.items(), key=lambda kv: (-kv[1], kv[0]))[:n]]


def compare(sp, pf):
    """Of perf's top 15 self functions with at least TOP_FLOOR% (a function with a handful of samples
    is in a top 15 by chance): how many are in selfprof's top 15, which are not, and the largest
    self-share difference among all of perf's top 15. A flat profile has many functions of nearly one
    share around the 15th place, where the order is sampling noise: one within RANK_SLACK points of
    selfprof's 15th share counts as in its top 15."""
    ours = top(sp["self"])
    theirs = top(pf["self"])
    fifteenth = sp["self"][ours[-1]] if len(ours) == 15 else 0.0
    considered = [k for k in theirs if pf["self"][k] >= TOP_FLOOR]
    missing = [k for k in considered
               if k not in ours and sp["self"].get(k, 0.0) < fifteenth - RANK_SLACK]
    diffs = [(abs(pf["self"].get(k, 0.0) - sp["self"].get(k, 0.0)), k) for k in theirs]
    maxdiff, maxname = max(diffs) if diffs else (0.0, "")
    return len(considered) - len(missing), len(considered), missing, maxdiff, maxname


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("selfprof")
    ap.add_argument("--only", default="")
    ap.add_argument("--keep", default="")
    ap.add_argument("--hz", type=int, default=499)
    ap.add_argument("--markdown", action="store_true")
    ap.add_argument("--preload", action="store_true",
                    help="record through the preload library (the default without --follow-exec)")
    args = ap.parse_args()
    selfprof = os.path.abspath(args.selfprof)
    if not os.access(selfprof, os.X_OK):
        print("SKIP: no selfprof binary at " + selfprof)
        return 77
    with_perf = os.geteuid() == 0 and shutil.which("perf") is not None
    work = args.keep or tempfile.mkdtemp(prefix="selfprof-realworld-")
    os.makedirs(work, exist_ok=True)
    make_inputs(work)
    only = set(x for x in args.only.split(",") if x)
    # node --perf-basic-prof writes /tmp/perf-PID.map for both profilers to read; the ones made by this
    # run are removed at the end.
    maps_before = set(glob.glob("/tmp/perf-*.map"))
    rows, fails, ran = [], [], 0
    for name, argv, follow, needs in corpus(work):
        if only and name not in only:
            continue
        missing = [n for n in needs if shutil.which(n) is None]
        if missing:
            print("skip %-9s (not installed: %s)" % (name, " ".join(missing)))
            continue
        ran += 1
        tag = re.sub(r"[^a-z0-9]+", "_", name.lower()).strip("_")
        base = run(argv, work)
        # The recorder's way (--follow-exec: nothing loaded into the program, process names as roots)
        # unless --preload; a program that execs others is followed either way.
        rec_args = (["--follow-exec"] if follow or not args.preload else []) + (
            ["--preload"] if args.preload and follow else [])
        got, sp_stacks, pf_stacks = joint_run(selfprof, args.hz, rec_args, with_perf, argv, work, tag, bool(args.keep))
        problems = []
        if got[0] != base[0]:
            problems.append("exit status %d, alone %d" % (got[0], base[0]))
        if got[1] != base[1]:
            problems.append("stdout differs")
        if got[2] != base[2]:
            problems.append("stderr differs: " + got[2].decode(errors="replace")[-300:].strip())
        if sp_stacks is None:
            problems.append("no profile written")
            fails.append((name, problems))
            print("FAIL %-9s %s" % (name, "; ".join(problems)))
            continue
        row = {"name": name, "sp": summarize(sp_stacks[0])}
        if with_perf:
            checks = check_against_perf(sp_stacks, pf_stacks, args.hz, row, name)
            if checks:
                # Noise beyond two standard errors happens in one comparison of twenty: a second run's
                # samples are pooled with the first's and judged once more. A real difference stays.
                again = joint_run(selfprof, args.hz, rec_args, with_perf, argv, work, tag + "_2",
                                  bool(args.keep))
                if again[1] is not None and again[2] is not None:
                    sp_stacks = (sp_stacks[0] + again[1][0], sp_stacks[1] + again[1][1])
                    pf_stacks = (pf_stacks[0] + again[2][0], pf_stacks[1] + again[2][1])
                    row = {"name": name + " (2 runs)", "sp": summarize(sp_stacks[0])}
                    checks = check_against_perf(sp_stacks, pf_stacks, args.hz, row, name)
            problems += checks
        rows.append(row)
        if problems:
            fails.append((name, problems))
        print("%s %-9s %s" % ("FAIL" if problems else "ok  ", name, "; ".join(problems) or describe(row)))
        sys.stdout.flush()
    if args.markdown:
        print_table(rows, args.hz)
    if not args.keep:
        shutil.rmtree(work, ignore_errors=True)
        for path in set(glob.glob("/tmp/perf-*.map")) - maps_before:
            try:
                os.unlink(path)
            except OSError:
                pass
    if ran == 0:
        print("SKIP: none of the corpus programs is installed")
        return 77
    print("%d programs, %d failed%s" % (ran, len(fails), "" if with_perf else
                                       " (perf comparison skipped: needs root and perf)"))
    return 1 if fails else 0


def joint_run(selfprof, hz, rec_args, with_perf, argv, work, tag, keep):
    """Runs argv under selfprof record and, with_perf, both under perf record --call-graph dwarf (one
    run: both profiles see the same execution, a JIT's tiers and a collector's timing alike, and only
    how each samples, unwinds and names differs). Returns (status, stdout, stderr), selfprof's
    (stacks, total) or None when it wrote no profile, and perf's (stacks, total) or None."""
    sp_out = os.path.join(work, tag + ".selfprof.folded")
    if os.path.exists(sp_out):
        os.unlink(sp_out)
    rec = [selfprof, "record", "-q", "-F", str(hz), "-o", sp_out] + rec_args
    data = os.path.join(work, tag + ".perf.data")
    outer = ["perf", "record", "-q", "-F", str(hz), "--call-graph", "dwarf", "-o", data, "--"]
    got = run((outer if with_perf else []) + rec + ["--"] + argv, work)
    # --follow-exec gives each process's name as the root frame.
    sp = read_folded(sp_out, drop_root="--follow-exec" in rec_args) if os.path.exists(sp_out) else None
    pf = None
    if with_perf:
        pf_out = os.path.join(work, tag + ".perf.folded")
        script = subprocess.run(["perf", "script", "--no-inline", "-i", data], cwd=work,
                                stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, timeout=600)
        with open(pf_out, "wb") as f:
            f.write(subprocess.run([selfprof, "collapse", "-q", "--kernel"], input=script.stdout,
                                   stdout=subprocess.PIPE, timeout=300).stdout)
        if not keep:
            os.unlink(data)
        pf = read_folded(pf_out, drop_root=True, skip_root="selfprof")
    return got, sp, pf


def noise(p1, n1, p2, n2):
    """Two standard errors, in points, of the difference between shares p1 and p2 (percent) drawn
    from n1 and n2 samples: what two samplings of one execution differ by in 95% of cases."""
    a, b = p1 / 100.0, p2 / 100.0
    return 200.0 * math.sqrt(a * (1 - a) / max(n1, 1) + b * (1 - b) / max(n2, 1))


def check_against_perf(sp_stacks, pf_stacks, hz, row, name):
    """The thresholds of the module comment, each widened by the sampling noise of the two shares it
    compares (noise()); fills row for the table, returns the problems."""
    sp, pf = row["sp"], summarize(pf_stacks[0])
    overlap, considered, missing_top, maxdiff, maxname = compare(sp, pf)
    # perf's counts are sample periods: nanoseconds of CPU time. Samples selfprof should have taken:
    expected = pf_stacks[1] / 1e9 * hz
    n_sp, n_pf = sp["samples"], pf["samples"] / 1e9 * hz
    row.update(pf=pf, overlap=overlap, considered=considered, maxdiff=maxdiff, maxname=maxname,
               delivered=100.0 * sp_stacks[1] / max(expected, 1.0))
    problems = []
    allowed = 1.0 + noise(sp["unnamed"], n_sp, pf["unnamed"], n_pf)
    if sp["unnamed"] > pf["unnamed"] + allowed:
        problems.append("unnamed %.1f%% > perf's %.1f%% + %.1f (1 point + noise)" % (
            sp["unnamed"], pf["unnamed"], allowed))
    if len(missing_top) > 2:
        problems.append("%d of perf's top %d (missing: %s)" % (overlap, considered, ", ".join(missing_top)))
    for fn in top(pf["self"]):
        a, b = sp["self"].get(fn, 0.0), pf["self"][fn]
        allowed = 2.0 + noise(a, n_sp, b, n_pf)
        if abs(a - b) > allowed:
            problems.append("self of %s differs by %.2f points > %.2f (2 points + noise): selfprof %.2f%%, "
                            "perf %.2f%%" % (fn, abs(a - b), allowed, a, b))
    allowed = 1.0 + noise(sp["entry"], n_sp, pf["entry"], n_pf)
    if sp["entry"] < pf["entry"] - allowed:
        problems.append("stacks reaching the entry %.1f%% < perf's %.1f%% - %.1f (1 point + noise)" % (
            sp["entry"], pf["entry"], allowed))
    return problems


def describe(row):
    sp = row["sp"]
    if "pf" not in row:
        return "%d samples, unnamed %.1f%%, entry %.1f%%" % (sp["samples"], sp["unnamed"], sp["entry"])
    pf = row["pf"]
    return ("unnamed %.1f%% (perf %.1f%%), top 15: %d of %d, max self diff %.2f (%s), entry %.1f%% "
            "(perf %.1f%%), samples %.1f%% of perf's CPU time x rate" % (
                sp["unnamed"], pf["unnamed"], row["overlap"], row["considered"], row["maxdiff"],
                row["maxname"], sp["entry"], pf["entry"], row["delivered"]))


def print_table(rows, hz):
    print("\n| program (%d Hz) | unnamed leaves: selfprof / perf dwarf | perf's top 15 (>= 0.5%%) in selfprof's | largest self difference | stacks reaching the entry: selfprof / perf dwarf | samples delivered |" % hz)
    print("| --- | --- | --- | --- | --- | --- |")
    for r in rows:
        sp = r["sp"]
        if "pf" in r:
            pf = r["pf"]
            print("| %s | %.1f%% / %.1f%% | %d of %d | %.2f points (%s) | %.1f%% / %.1f%% | %.1f%% |" % (
                r["name"], sp["unnamed"], pf["unnamed"], r["overlap"], r["considered"], r["maxdiff"],
                r["maxname"],
                sp["entry"], pf["entry"], r["delivered"]))
        else:
            print("| %s | %.1f%% / - | - | - | %.1f%% / - | - |" % (r["name"], sp["unnamed"], sp["entry"]))


if __name__ == "__main__":
    sys.exit(main())
