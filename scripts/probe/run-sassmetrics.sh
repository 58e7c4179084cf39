#!/usr/bin/env bash
# Builds and runs scripts/probe/sassmetrics.cu on the device machine (issue 19 probe); output in $OUT/sass/.
set -u
OUT=${OUT:-/tmp/gpufl-out}; D="$OUT/sass"; mkdir -p "$D" build
CUPTI=""
for c in /usr/local/cuda/extras/CUPTI /usr/local/cuda; do
  [ -f "$c/include/cupti_sass_metrics.h" ] && { CUPTI=$c; break; }
done
[ -z "$CUPTI" ] && CUPTI=$(dirname "$(dirname "$(find / -name cupti_sass_metrics.h 2>/dev/null | head -1)")")
echo "CUPTI: $CUPTI" | tee "$D/log.txt"
LIBDIR=$(dirname "$(find "$CUPTI" /usr/local/cuda/ -name 'libcupti.so*' 2>/dev/null | head -1)")
echo "libcupti dir: $LIBDIR" | tee -a "$D/log.txt"
nvcc -O2 -lineinfo -I"$CUPTI/include" -I/usr/local/cuda/include -o build/sassmetrics scripts/probe/sassmetrics.cu \
  -L"$LIBDIR" -lcupti -lcuda -Xlinker -rpath -Xlinker "$LIBDIR" >>"$D/log.txt" 2>&1 || { echo "build failed"; tail -20 "$D/log.txt"; exit 1; }
timeout 300 build/sassmetrics "$D" "$@" >"$D/run.txt" 2>&1; echo "exit $?" >>"$D/run.txt"
nvcc -O2 -lineinfo -arch=sm_90 -cubin -o "$D/kernel_detail.sm_90.cubin" examples/kernel_detail.cu >>"$D/log.txt" 2>&1
ls -la "$D" >>"$D/log.txt"
