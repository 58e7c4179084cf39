#!/usr/bin/env bash
# Probe (GPU machine): where the default recording's cost on the Trainer goes, and what the two
# fault-tolerant reads of the cross-thread path cost there. Run from the repository root with
# .device-bin carried; logs under $OUT.
#  1. one fault-tolerant read of k pieces, idle, through the pipe and through process_vm_readv;
#  2. a default-mode Trainer run per way (GPUFL_XTHREAD_READ=pipe|readv, GPUFL_DEBUG_COST=1):
#     the capture-cost notices;
#  3. the Trainer's in-process A/B per mode (PROBE_TOGGLE_MODES), one process each;
#  4. the DataLoader part of the crash phase (PROBE_DL=0 skips it).
set -u
OUT=${OUT:-/tmp/gpufl-out}; mkdir -p "$OUT"
BIN=$PWD/.device-bin; export PATH=$BIN:$PATH GPUFL_CAPTURE_LIB=$BIN/libgpufl_capture.so
for via in pipe readv; do
GPUFL_XTHREAD_READ=$via python3 - <<PY | tee -a "$OUT/readcost.txt"
import ctypes
L = ctypes.CDLL("$GPUFL_CAPTURE_LIB")
L.gpufl_test_readv_cost.restype = ctypes.c_double
L.gpufl_test_readv_cost.argtypes = [ctypes.c_uint32, ctypes.c_uint32]
print("$via: " + ", ".join(f"{k} pieces {L.gpufl_test_readv_cost(k, 20000):.0f} ns" for k in (1, 2, 4, 8, 32)))
PY
done
for via in ${PROBE_VIAS:-pipe readv}; do
  GPUFL_XTHREAD_READ=$via GPUFL_DEBUG_COST=1 gpufl record -q -o "$OUT/s-$via" -- python3 bench/trainer_bench.py \
    --mode gpufl-default --steps ${STEPS:-220} --warmup 20 > "$OUT/trainer-$via.log" 2>&1
  d=$(ls -d "$OUT"/s-$via/*/ | head -1)
  gpufl dump "$d" --type notice 2>&1 | grep -o '"message":"[^"]*' | cut -c12- > "$OUT/notices-$via.txt"
  echo "== $via: $(grep -o '"wall_ms_all[^]]*' "$OUT/trainer-$via.log" | head -c 80)" | tee -a "$OUT/summary.txt"
  grep -E "cross-thread|stack capture|call sites" "$OUT/notices-$via.txt" | cut -c1-600 | tee -a "$OUT/summary.txt"
  rm -rf "$OUT/s-$via"
done
if [ -n "${PROBE_TOGGLE_MODES-bare gpufl-default gpufl-no-api gpufl-no-sites gpufl-kernels-only}" ]; then
  TRAINER_ROUNDS=0 TRAINER_TOGGLE_PROCS=${PROBE_TOGGLE_PROCS:-1} TRAINER_TOGGLE_K=${PROBE_K:-10} \
    TRAINER_TOGGLE_CYCLES=${PROBE_C:-8} \
    TRAINER_TOGGLE_MODES="${PROBE_TOGGLE_MODES-bare gpufl-default gpufl-no-api gpufl-no-sites gpufl-kernels-only}" \
    bash scripts/gpu-check.sh trainerbench > "$OUT/toggle.log" 2>&1
fi
[ "${PROBE_DL:-1}" = 1 ] && CRASH_ENDS=none bash scripts/gpu-check.sh crash > "$OUT/dl.log" 2>&1
true
