#!/usr/bin/env bash
# The dashboard's screenshots (docs/screenshots/*.png, linked from the README): the browser tests
# of crates/gpufl-server/tests/dashboard.rs (and the run page's, tests/runs.rs) drive Chromium (Debian's chromium + chromium-driver, which
# .ci/run installs) over the bundled sessions and save a PNG of each page here.
set -euo pipefail
cd "$(dirname "$0")/.."
out="${1:-docs/screenshots}"
mkdir -p "$out"
GPUFL_REQUIRE_BROWSER=1 GPUFL_SCREENSHOTS="$out" \
  cargo test -p gpufl-server --test dashboard -- browser_ --test-threads 1
GPUFL_REQUIRE_BROWSER=1 GPUFL_SCREENSHOTS="$out" \
  cargo test -p gpufl-server --test runs
ls -l "$out"/*.png
