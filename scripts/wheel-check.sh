#!/usr/bin/env bash
# The wheel as a user gets it (CI runs this after scripts/test.sh): build it
# (scripts/build-wheel.sh; GPUFL_WHEEL_PROFILE=dev packs the debug build CI already has), install
# it into a fresh venv, then from that venv: `gpufl report testdata/sessions`, `python -m gpufl`,
# and the Python tests against the installed package (GPUFL_TEST_INSTALLED=1: its bundled
# library and command, no PYTHONPATH, no GPUFL_CAPTURE_LIB). The venv sees the interpreter's own
# site-packages for pytest only (--system-site-packages); gpufl comes from the wheel.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
bash scripts/build-wheel.sh
V=target/wheel-venv
rm -rf "$V"
$PY -m venv --system-site-packages "$V"
"$V/bin/python" -m pip install -q --no-index --no-deps dist/gpufl-*.whl
clean() { env -u GPUFL_CAPTURE_LIB -u CUDA_INJECTION64_PATH -u PYTHONPATH PATH="$PWD/$V/bin:/usr/bin:/bin" "$@"; }
echo "== wheel: $(clean sh -c 'command -v gpufl') $(clean gpufl --version)"
clean "$V/bin/python" -c 'import gpufl, sys; p = gpufl.library_path(); print("== wheel: library", p); sys.exit(p is None)'
clean gpufl report testdata/sessions >target/wheel-report.txt
echo "== wheel: gpufl report testdata/sessions: $(wc -l <target/wheel-report.txt) lines, $(grep -c 'HIGH' target/wheel-report.txt) HIGH insights"
clean "$V/bin/python" -m gpufl info testdata/sessions >/dev/null
echo "== Python tests against the installed wheel ($("$V/bin/python" --version))"
clean env GPUFL_TEST_INSTALLED=1 "$V/bin/python" -m pytest -q -p no:cacheprovider python/tests
