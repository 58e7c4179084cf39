#!/usr/bin/env bash
# Probe (GPU machine): the Trainer bench under `gpufl record` (default mode) N times, each exit
# status and the tail of its output kept; a failed run's session kept under $OUT/failed-N.
set -u
OUT=${OUT:-/tmp/gpufl-out}; mkdir -p "$OUT"
BIN=$PWD/.device-bin; export PATH=$BIN:$PATH GPUFL_CAPTURE_LIB=$BIN/libgpufl_capture.so
for i in $(seq ${N:-8}); do
  rm -rf /tmp/tr; gpufl record -q -o /tmp/tr -- python3 bench/trainer_bench.py --mode gpufl-default \
    --steps 220 --warmup 20 > /tmp/tr.log 2>&1
  rc=$?
  echo "run $i exit $rc $(grep -c '"mode"' /tmp/tr.log) json line(s)" | tee -a "$OUT/repeat.txt"
  if [ $rc != 0 ] || ! grep -q '"mode"' /tmp/tr.log; then
    tail -30 /tmp/tr.log > "$OUT/failed-$i.log"; cp -r /tmp/tr "$OUT/failed-$i"
  fi
done
