#!/usr/bin/env bash
# Builds and runs scripts/probe/pcstartstop.cu on the device machine (issue 19 probe).
set -u
OUT=${OUT:-/tmp/gpufl-out}; mkdir -p "$OUT" build
CUPTI=/usr/local/cuda
[ -f "$CUPTI/include/cupti_sass_metrics.h" ] || CUPTI=/usr/local/cuda/extras/CUPTI
LIBDIR=$(dirname "$(find "$CUPTI" /usr/local/cuda/ -name 'libcupti.so*' 2>/dev/null | head -1)")
nvcc -O2 -lineinfo -I"$CUPTI/include" -o build/pcstartstop scripts/probe/pcstartstop.cu \
  -L"$LIBDIR" -lcupti -lcuda -Xlinker -rpath -Xlinker "$LIBDIR" >"$OUT/pcstartstop-build.txt" 2>&1 \
  || { echo "build failed"; tail -20 "$OUT/pcstartstop-build.txt"; exit 1; }
timeout 250 build/pcstartstop "$@" 2>&1 | tee "$OUT/pcstartstop.txt"
