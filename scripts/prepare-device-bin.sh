#!/usr/bin/env bash
# Build release binaries here and put debug-stripped copies in .device-bin/ (git-ignored) for the
# device machine, which has no cargo: name .device-bin in the device tool's `carry`. Also the
# wheel (scripts/build-wheel.sh; phase `wheel` installs it there): it packs the same release
# build, so it costs seconds, not a second compile.
set -euo pipefail
# The workspace: the same features as the wheel's build, so that one is reused as it is.
cargo build --release --workspace
# The analysis throughput bench (phase decodebench), a standalone binary.
cargo build --release -p gpufl-analysis --example decodebench
mkdir -p .device-bin
objcopy --strip-debug target/release/gpufl .device-bin/gpufl
objcopy --strip-debug target/release/libgpufl_capture.so .device-bin/libgpufl_capture.so
objcopy --strip-debug target/release/examples/decodebench .device-bin/decodebench
rm -f .device-bin/gpufl-*.whl
bash scripts/build-wheel.sh >/dev/null && cp dist/gpufl-*.whl .device-bin/
ls -la .device-bin
