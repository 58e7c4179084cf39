#!/usr/bin/env bash
# Builds scripts/probe/NAME.cu against CUPTI and the driver and runs it on the device machine
# (issue 19 probes; not part of gpufl). usage: bash scripts/probe/run-probe.sh NAME [args...]
# Output: the terminal and $OUT/NAME.txt; the build log in $OUT/NAME-build.txt.
set -u
NAME=$1; shift
OUT=${OUT:-/tmp/gpufl-out}; mkdir -p "$OUT" build
CUPTI=/usr/local/cuda
[ -f "$CUPTI/include/cupti_sass_metrics.h" ] || CUPTI=/usr/local/cuda/extras/CUPTI
LIBDIR=$(dirname "$(find "$CUPTI" /usr/local/cuda/ -name 'libcupti.so*' 2>/dev/null | head -1)")
nvcc -O2 -lineinfo -I"$CUPTI/include" -o "build/$NAME" "scripts/probe/$NAME.cu" \
  -L"$LIBDIR" -lcupti -lcuda -Xlinker -rpath -Xlinker "$LIBDIR" >"$OUT/$NAME-build.txt" 2>&1 \
  || { echo "build failed"; tail -20 "$OUT/$NAME-build.txt"; exit 1; }
timeout "${PROBE_TIMEOUT:-250}" "build/$NAME" "$@" 2>&1 | tee "$OUT/$NAME.txt"
