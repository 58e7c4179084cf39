#!/usr/bin/env bash
# The test suite (what CI runs): Rust tests of every crate, then the Python tests of the capture
# library's Python-frame extraction (no GPU needed).
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --workspace
cargo test --workspace
python3 -m pytest -q python/tests
