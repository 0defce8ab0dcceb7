#!/usr/bin/env python3
"""Checks the header rules of include/: every header opens with a comment whose first lines carry a
`Context:` line and has `#pragma once`; files under include/selfprof/signal/ include only what is safe
in a signal handler; each part includes only the parts before it in the pipeline (MAY_INCLUDE below,
the table of docs/architecture.md), and only in the form "selfprof/<folder>/<file>.hpp"; unit tests
mirror the headers. Prints each violation as file:line: message and exits 1 if there is any.
"""
import os
import re
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
INCLUDE = os.path.join(ROOT, "include")
SIGNAL_DIR = os.path.join(INCLUDE, "selfprof", "signal")
# What signal-handler code may include: async-signal-safe system headers, our own signal/ headers, and
# config.hpp (macros only, includes nothing). errno.h/cerrno are allowed because the handler must save
# and restore errno (errno is per-thread and async-signal-safe to read and write). sys/stat.h is there
# for struct stat: the handler fstat()s /proc/self/task with a raw syscall (fstat is on POSIX's list).
SIGNAL_ALLOWED_SYSTEM = {"atomic", "csignal", "cstdint", "cstddef", "ucontext.h", "unistd.h",
                         "sys/syscall.h", "sys/stat.h", "signal.h", "time.h", "errno.h", "cerrno"}
SIGNAL_ALLOWED_OWN = {os.path.join(INCLUDE, "selfprof", "config.hpp")}
CONTEXT_WITHIN = 8  # lines of the opening comment searched for "Context:"

# The parts of the pipeline, in order: a folder of include/selfprof/, or a group of top-level headers.
TOP_LEVEL = {"config.hpp": "values", "version.hpp": "values", "status.hpp": "values", "options.hpp": "values", "modes.hpp": "values",
             "profile.hpp": "values", "stats.hpp": "values", "frames.hpp": "api", "jit.hpp": "api",
             "profiler.hpp": "api"}
VALUES = {"values"}
MAY_INCLUDE = {
    "signal": {"signal"} | VALUES,  # config.hpp only (the allow-list below is stricter)
    "values": VALUES,
    "detail": {"signal"} | VALUES,
    "jit": {"detail", "signal"} | VALUES,
    "output": {"detail"} | VALUES,
    "symbols": {"jit", "detail", "signal"} | VALUES,
    "unwind": {"detail", "signal"} | VALUES,
    "sources": {"detail", "signal"} | VALUES,
    "wall": {"unwind", "detail", "signal"} | VALUES,
    "game": {"detail", "signal"} | VALUES,
    "collect": {"game", "wall", "sources", "unwind", "symbols", "jit", "detail", "signal"} | VALUES,
    "dump": {"collect", "game", "wall", "symbols", "output", "jit", "detail", "signal"} | VALUES,
    "serve": {"dump", "collect", "game", "wall", "symbols", "output", "jit", "detail", "signal"} | VALUES,
    "core": {"serve", "dump", "collect", "game", "wall", "sources", "unwind", "symbols", "output", "jit", "detail",
             "signal"} | VALUES,
    "api": {"api", "core", "serve", "dump", "collect", "game", "wall", "sources", "unwind", "symbols", "output", "jit",
            "detail", "signal"} | VALUES,
}
INCLUDE_RE = re.compile(r'^\s*#\s*include\s*([<"])([^>"]+)[>"]')


def part_of(path):
    """The pipeline part a header of include/ belongs to, or None for the umbrella."""
    rel = os.path.relpath(path, os.path.join(INCLUDE, "selfprof"))
    if rel.startswith(".."):
        return None
    if os.sep in rel:
        return rel.split(os.sep)[0]
    return TOP_LEVEL.get(rel, "unknown:" + rel)


def check_direction(path, lines, problems):
    rel = os.path.relpath(path, ROOT)
    part = part_of(path)
    if part is None:
        return
    if part not in MAY_INCLUDE:
        problems.append(f"{rel}:1: part '{part}' is not in scripts/check_headers.py's MAY_INCLUDE (and "
                        "docs/architecture.md): say where it sits in the pipeline")
        return
    for n, line in enumerate(lines, 1):
        m = INCLUDE_RE.match(line)
        if not m:
            continue
        kind, name = m.groups()
        if kind == '"' and not name.startswith("selfprof/"):
            problems.append(f'{rel}:{n}: include selfprof headers as "selfprof/<folder>/<file>.hpp", not "{name}"')
            continue
        if not name.startswith("selfprof/"):
            continue
        target = os.path.join(INCLUDE, name)
        if not os.path.isfile(target):
            problems.append(f"{rel}:{n}: includes {name}, which does not exist")
            continue
        to = part_of(target)
        if to != part and to not in MAY_INCLUDE[part]:
            problems.append(f"{rel}:{n}: {part}/ may not include {to}/ ({name}): the pipeline goes one way "
                            "(docs/architecture.md)")


def check(path, problems):
    rel = os.path.relpath(path, ROOT)
    with open(path, encoding="utf-8") as f:
        lines = f.read().splitlines()
    if not lines or not lines[0].startswith("//"):
        problems.append(f"{rel}:1: must open with a comment: one sentence on what it holds, then Context:")
    head = []
    for line in lines[:CONTEXT_WITHIN]:
        if not line.startswith("//"):
            break
        head.append(line)
    if not any(re.match(r"//\s*Context:\s*\S", line) for line in head):
        problems.append(f"{rel}:1: no `// Context: ...` line in the opening comment (signal handler, "
                        "collector thread, any thread or setup only)")
    if not any(re.match(r"\s*#\s*pragma\s+once\b", line) for line in lines):
        problems.append(f"{rel}:1: missing #pragma once")
    check_direction(path, lines, problems)
    if os.path.commonpath([path, SIGNAL_DIR]) != SIGNAL_DIR:
        return
    for n, line in enumerate(lines, 1):
        m = INCLUDE_RE.match(line)
        if not m:
            continue
        kind, name = m.groups()
        if kind == "<" and name in SIGNAL_ALLOWED_SYSTEM:
            continue
        own = [os.path.normpath(os.path.join(os.path.dirname(path), name)),
               os.path.normpath(os.path.join(INCLUDE, name))]
        if any(o in SIGNAL_ALLOWED_OWN or os.path.commonpath([o, SIGNAL_DIR]) == SIGNAL_DIR and os.path.isfile(o)
               for o in own):
            continue
        shown = f"<{name}>" if kind == "<" else f'"{name}"'
        allowed = ", ".join(f"<{a}>" for a in sorted(SIGNAL_ALLOWED_SYSTEM))
        problems.append(f"{rel}:{n}: signal-handler header includes {shown}; allowed: {allowed}, "
                        "signal/ headers, config.hpp")


def check_test_mirror(problems):
    """tests/unit/<folder>/<header>_test.cpp tests include/selfprof/<folder>/<header>.hpp (tests/unit/tools/
    the tool's tools/selfprof/<header>.hpp): a newcomer finds a header's tests by its name."""
    unit = os.path.join(ROOT, "tests", "unit")
    for d, _, fs in os.walk(unit):
        for f in fs:
            if not f.endswith("_test.cpp"):
                continue
            rel = os.path.relpath(os.path.join(d, f), unit)[: -len("_test.cpp")] + ".hpp"
            if rel.startswith("tools" + os.sep):
                header = os.path.join(ROOT, "tools", "selfprof", rel[len("tools") + 1:])
            else:
                header = os.path.join(INCLUDE, "selfprof", rel)
            if not os.path.isfile(header):
                problems.append(f"{os.path.relpath(os.path.join(d, f), ROOT)}:1: no header "
                                f"{os.path.relpath(header, ROOT)} for this test: unit tests mirror the headers")


def main():
    problems = []
    check_test_mirror(problems)
    headers = sorted(os.path.join(d, f) for d, _, fs in os.walk(INCLUDE) for f in fs
                     if f.endswith((".hpp", ".h")))
    for path in headers:
        check(path, problems)
    for p in problems:
        print(p)
    print(f"check_headers: {len(headers)} headers, {len(problems)} problem(s)")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
