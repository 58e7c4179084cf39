#!/usr/bin/env bash
# The test suite (what CI runs): Rust tests of every crate, then the Python tests (Python-frame
# extraction, cross-thread attribution, the python/ package; no GPU needed) on every CPython the
# machine has among 3.11, 3.12 and 3.13 (3.13 checks that an unsupported interpreter is left alone).
set -euo pipefail
cd "$(dirname "$0")/.."
# PostgreSQL and an S3 API server for the server's tests (skipped without them unless
# GPUFL_REQUIRE_SERVICES=1): started when missing, idempotent.
if [ -z "${GPUFL_TEST_PG_URL:-}" ] || [ -z "${GPUFL_TEST_S3:-}" ]; then
  eval "$(bash scripts/services.sh)" || true
fi
cargo build --workspace
cargo test --workspace
pythons=()
for v in 3.11 3.12 3.13; do
  for p in "${PYENV_ROOT:-$HOME/.pyenv}"/versions/"$v".*/bin/python"$v" "/usr/bin/python$v"; do
    if [ -x "$p" ] && "$p" -m pytest --version >/dev/null 2>&1; then pythons+=("$p"); break; fi
  done
done
[ ${#pythons[@]} -gt 0 ] || pythons=(python3)
for p in "${pythons[@]}"; do
  echo "== Python tests on $("$p" --version 2>&1) ($p)"
  "$p" -m pytest -q python/tests
done
