#!/usr/bin/env bash
# Browser test of the interactive flame-graph SVG: builds make_svg, renders the demo profile and drives
# it in headless Chromium (Debian's chromium + npm playwright-core; a browser is never downloaded).
# Exits 77 (skipped) when chromium, node or playwright-core cannot be had.
# Env: CHROMIUM (default /usr/bin/chromium), CXX (default g++), SHOT=path.png to keep a screenshot.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../.." && pwd)"
CHROMIUM="${CHROMIUM:-/usr/bin/chromium}"
command -v node >/dev/null 2>&1 || { echo "SKIP: node not found"; exit 77; }
[ -x "$CHROMIUM" ] || { echo "SKIP: $CHROMIUM not found (apt-get install -y chromium)"; exit 77; }
cd "$here"
if [ ! -d node_modules/playwright-core ]; then
  command -v npm >/dev/null 2>&1 || { echo "SKIP: npm not found"; exit 77; }
  PLAYWRIGHT_SKIP_BROWSER_DOWNLOAD=1 npm ci --no-audit --no-fund --silent ||
    { echo "SKIP: npm ci could not install playwright-core"; exit 77; }
fi
mkdir -p out
"${CXX:-g++}" -std=c++17 -Wall -Wextra -Wpedantic -Werror -I"$root/include" make_svg.cpp -o out/make_svg
out/make_svg out/demo.svg
SVG=out/demo.svg CHROMIUM="$CHROMIUM" SHOT="${SHOT:-}" node --test svg_test.mjs
