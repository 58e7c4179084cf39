# Phase nocupti (sourced by scripts/gpu-check.sh): the program must run as it would without gpufl
# when capture cannot start. `gpufl record` with CUPTI not found (GPUFL_CUPTI_LIB points nowhere)
# around a PyTorch one-liner and a CUDA C++ loop: each must compute its result (a disabled recorder
# once asked the driver for its devices from inside the program's cuInit, which then failed:
# "CUDA driver initialization failed"); the session's header says why capture is off.
log "(nocupti) capture disabled: the program still runs"
NC="$S/nocupti"; mkdir -p "$NC"
P='import torch; x = torch.ones(4, device="cuda"); print("nocupti: sum", (x * 2).sum().item())'
GPUFL_CUPTI_LIB=/nonexistent/libcupti.so gpufl record -o "$NC/py" -- $PY -c "$P" > "$OUT/nocupti-py.log" 2>&1
echo "exit $?" >> "$OUT/nocupti-py.log"
grep -q "nocupti: sum 8.0" "$OUT/nocupti-py.log" && r=PASS || r=FAIL
echo "nocupti: PyTorch under a disabled recorder computes its result: $r" | tee -a "$OUT/summary.txt"
tail -3 "$OUT/nocupti-py.log" | tee -a "$OUT/summary.txt"
GPUFL_CUPTI_LIB=/nonexistent/libcupti.so gpufl record -o "$NC/cpp" -- build/stream_sync_loop 5 > "$OUT/nocupti-cpp.log" 2>&1
rc=$?
[ $rc = 0 ] && r=PASS || r=FAIL
echo "nocupti: stream_sync_loop under a disabled recorder exits 0 (got $rc): $r" | tee -a "$OUT/summary.txt"
d=$(newest "$NC/py"); d=$(ls -d "$d"*/ 2>/dev/null | head -1)
[ -n "$d" ] && gpufl info "$d" 2>&1 | grep -i -m2 "disabled\|capture" | tee -a "$OUT/summary.txt"
