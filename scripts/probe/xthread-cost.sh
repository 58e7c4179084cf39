#!/usr/bin/env bash
# Probe (GPU machine): what a cross-thread capture costs there. The cost of one process_vm_readv
# by iovec count, the steady-state cross-thread capture with reuse off, and a Trainer run with
# GPUFL_DEBUG_COST=1 (slow captures' breakdown and the cross-thread counters). Logs under $OUT.
set -u
OUT=${OUT:-/tmp/gpufl-out}; mkdir -p "$OUT"
BIN=$PWD/.device-bin; export PATH=$BIN:$PATH GPUFL_CAPTURE_LIB=$BIN/libgpufl_capture.so
python3 - <<PY | tee "$OUT/readv.txt"
import ctypes
L = ctypes.CDLL("$GPUFL_CAPTURE_LIB")
L.gpufl_test_readv_cost.restype = ctypes.c_double
L.gpufl_test_readv_cost.argtypes = [ctypes.c_uint32, ctypes.c_uint32]
for k in (1, 2, 4, 8, 16, 32):
    print(f"process_vm_readv, {k} iovecs of 72 bytes: {L.gpufl_test_readv_cost(k, 20000):.0f} ns")
PY
GPUFL_XTHREAD_REUSE_US=0 python3 -m pytest -q -s python/tests/test_cross_thread.py -k steady 2>&1 | grep -E "cross-thread|passed|failed" | tee -a "$OUT/readv.txt"
GPUFL_DEBUG_COST=1 gpufl record -q -o "$OUT/s" -- python3 bench/trainer_bench.py --mode gpufl-default \
  --steps ${STEPS:-220} --warmup 20 > "$OUT/trainer.log" 2>&1
d=$(ls -d "$OUT"/s/*/ | head -1)
gpufl dump "$d" --type notice 2>&1 | grep -o '"message":"[^"]*' | cut -c12- > "$OUT/notices.txt"
grep -E "cross-thread|stack capture|call sites" "$OUT/notices.txt"
grep -c "other thread" "$OUT/notices.txt"
