#!/usr/bin/env python3
"""Builds single_include/selfprof.hpp from include/selfprof.hpp.

Each of our own headers (#include "..." or <selfprof/...>) is inlined once, at its first include, so
every header lands after the headers it depends on; `#pragma once` inside is dropped, system includes
are kept as written. --check compares instead of writing and exits 1 when the checked-in file is stale.
--shim DIR writes, for the CMake option SELFPROF_TEST_SINGLE_INCLUDE, one stub per header of include/selfprof/
so that tests including an internal header get the single header instead (a header the single header
does not hold gets its own text, with its includes pointed at the stubs). Python 3 standard library only.
"""
import argparse
import os
import re
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
INCLUDE = os.path.join(ROOT, "include")
UMBRELLA = os.path.join(INCLUDE, "selfprof.hpp")
OUTPUT = os.path.join(ROOT, "single_include", "selfprof.hpp")
COMMAND = "python3 scripts/amalgamate.py"
INCLUDE_RE = re.compile(r'^\s*#\s*include\s*([<"])([^>"]+)[>"]')
PRAGMA_ONCE_RE = re.compile(r"^\s*#\s*pragma\s+once\b")


def version():
    with open(os.path.join(INCLUDE, "selfprof", "version.hpp"), encoding="utf-8") as f:
        m = re.search(r'#define\s+SELFPROF_VERSION_STRING\s+"([^"]+)"', f.read())
    return m.group(1) if m else "unknown"


def resolve(kind, name, from_dir):
    """Path of one of our headers named by an include, or None for a system header."""
    candidates = []
    if kind == '"':
        candidates.append(os.path.join(from_dir, name))
    if name == "selfprof.hpp" or name.startswith("selfprof/") or kind == '"':
        candidates.append(os.path.join(INCLUDE, name))
    for c in candidates:
        c = os.path.normpath(c)
        if os.path.isfile(c) and c.startswith(INCLUDE + os.sep):
            return c
    if kind == '"':
        sys.exit(f"amalgamate: cannot find \"{name}\" included from {os.path.relpath(from_dir, ROOT)}")
    return None


def amalgamate():
    done, out = set(), []

    def inline(path, top):
        done.add(path)
        rel = os.path.relpath(path, INCLUDE)
        if not top:
            out.append(f"// ---- begin {rel} ----\n")
        with open(path, encoding="utf-8") as f:
            for n, line in enumerate(f, 1):
                if PRAGMA_ONCE_RE.match(line):
                    continue
                m = INCLUDE_RE.match(line)
                target = m and resolve(m.group(1), m.group(2), os.path.dirname(path))
                if target:
                    if target not in done:
                        inline(target, False)
                    continue
                out.append(line if line.endswith("\n") else line + "\n")
        if not top:
            out.append(f"// ---- end {rel} ----\n")

    inline(UMBRELLA, True)
    banner = (
        f"// selfprof {version()}: the whole library in one header, generated from include/ by\n"
        f"// scripts/amalgamate.py. Do not edit; change include/ and run `{COMMAND}`.\n"
        "// Context: see the Context: line of each section below.\n"
        "#pragma once\n"
    )
    return banner + "".join(out), done


def write_if_changed(path, text):
    try:
        with open(path, encoding="utf-8") as f:
            if f.read() == text:
                return
    except OSError:
        pass
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        f.write(text)


def write_shims(shim_dir, used, every):
    for path in sorted(every):
        rel = os.path.relpath(path, INCLUDE)
        if rel == "selfprof.hpp":
            continue
        if path in used:
            text = "// Stub: the single header holds this header.\n#include <selfprof.hpp>\n"
        else:
            lines = ["// Stub: not in the single header; its own text, includes pointed at the stubs.\n",
                     "#pragma once\n", "#include <selfprof.hpp>\n"]
            with open(path, encoding="utf-8") as f:
                for line in f:
                    if PRAGMA_ONCE_RE.match(line):
                        continue
                    m = INCLUDE_RE.match(line)
                    target = m and resolve(m.group(1), m.group(2), os.path.dirname(path))
                    if target:
                        if target not in used:
                            lines.append(f"#include <{os.path.relpath(target, INCLUDE)}>\n")
                        continue
                    lines.append(line if line.endswith("\n") else line + "\n")
            text = "".join(lines)
        write_if_changed(os.path.join(shim_dir, rel), text)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if the checked-in file is stale")
    parser.add_argument("--output", default=OUTPUT, help="where to write (default: %(default)s)")
    parser.add_argument("--shim", metavar="DIR", help="write the SELFPROF_TEST_SINGLE_INCLUDE stubs into DIR")
    args = parser.parse_args()
    if not os.path.isfile(UMBRELLA):
        sys.exit(f"amalgamate: {UMBRELLA} does not exist")
    text, used = amalgamate()
    every = {os.path.normpath(os.path.join(d, f)) for d, _, fs in os.walk(INCLUDE) for f in fs
             if f.endswith((".hpp", ".h"))}
    unreachable = sorted(os.path.relpath(p, INCLUDE) for p in every - used)
    if unreachable:
        print(f"amalgamate: note: {len(unreachable)} header(s) not reachable from include/selfprof.hpp, so not "
              f"in the single header: {', '.join(unreachable)}", file=sys.stderr)
    if args.shim:
        write_shims(args.shim, used, every)
        return 0
    if args.check:
        try:
            with open(args.output, encoding="utf-8") as f:
                current = f.read()
        except OSError:
            current = None
        if current != text:
            print(f"{os.path.relpath(args.output, ROOT)} is stale or missing; regenerate it with:\n"
                  f"  {COMMAND}", file=sys.stderr)
            return 1
        print(f"{os.path.relpath(args.output, ROOT)} is up to date ({len(used)} headers)")
        return 0
    os.makedirs(os.path.dirname(args.output), exist_ok=True)
    with open(args.output, "w", encoding="utf-8") as f:
        f.write(text)
    print(f"wrote {os.path.relpath(args.output, ROOT)} ({len(used)} headers, {text.count(chr(10))} lines)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
