#!/usr/bin/env bash
# Build release binaries here and put debug-stripped copies in .device-bin/ (git-ignored) for the
# device machine, which has no cargo: name .device-bin in the device tool's `carry`.
set -euo pipefail
cargo build --release -p gpufl-cli -p gpufl-capture
# The analysis throughput bench (phase decodebench), a standalone binary.
cargo build --release -p gpufl-analysis --example decodebench
mkdir -p .device-bin
objcopy --strip-debug target/release/gpufl .device-bin/gpufl
objcopy --strip-debug target/release/libgpufl_capture.so .device-bin/libgpufl_capture.so
objcopy --strip-debug target/release/examples/decodebench .device-bin/decodebench
ls -la .device-bin
