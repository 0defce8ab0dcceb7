#!/usr/bin/env bash
# Fails (exit 1) when a tracked C/C++ source is not formatted per .clang-format, listing each file and
# the command that fixes them. single_include/ is generated and not checked. CLANG_FORMAT overrides the
# binary (default clang-format; the style is pinned to clang-format 14, Debian 12).
set -euo pipefail
cd "$(dirname "$0")/.."
clang_format=${CLANG_FORMAT:-clang-format}
if ! command -v "$clang_format" >/dev/null; then
  echo "check_format: $clang_format not found (Debian: apt-get install clang-format)" >&2
  exit 1
fi
pattern='\.(h|hpp|c|cc|cpp)$'
# Tracked files when the tree has them, else every source in the source folders.
mapfile -t files < <(git ls-files 2>/dev/null | grep -E "$pattern" | grep -v '^single_include/' || true)
if [ ${#files[@]} -eq 0 ]; then
  mapfile -t files < <(find include tests examples tools bench -name node_modules -prune -o -type f -print 2>/dev/null | grep -E "$pattern" | sort)
fi
bad=()
for f in "${files[@]}"; do
  [ -f "$f" ] || continue
  if ! "$clang_format" --style=file --dry-run --Werror "$f" >/dev/null 2>&1; then
    bad+=("$f")
  fi
done
if [ ${#bad[@]} -gt 0 ]; then
  printf 'not formatted: %s\n' "${bad[@]}"
  echo "fix with: $clang_format -i --style=file ${bad[*]}"
  exit 1
fi
echo "check_format: ${#files[@]} files formatted"
