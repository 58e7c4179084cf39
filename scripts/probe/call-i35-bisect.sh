# Device call for issue 35: which part of gpufl makes its detach crash a launch loop? CUPTI alone
# asking stream ids (detachloop cases 8, 9 against 0), then gpufl's launch loop under always-on
# detaching every 0.5 s with one part off at a time.  OUT=... bash scripts/probe/call-i35-bisect.sh
set -u
export OUT=${OUT:-/tmp/gpufl-out}; mkdir -p "$OUT"
BIN=$PWD/.device-bin; export PATH=$BIN:$PATH GPUFL_CAPTURE_LIB=$BIN/libgpufl_capture.so
CASES="8 9 0" PROBE_TIMEOUT=150 bash scripts/probe/call-i35-why.sh ${PROBE_REPS:-3} | grep -v "^gdb"
nvcc -O2 -o build/launchcost scripts/probe/launchcost.cu -ldl 2>&1 | tail -3
for v in base GPUFL_PER_THREAD_BUFFERS=0 GPUFL_ACTIVITY_KINDS=kernels GPUFL_HOST_SAMPLES=0 GPUFL_SITE_STACKS=0; do
  bad=0
  for rep in $(seq 1 ${REPS:-3}); do
    rm -rf /tmp/bs; env ${v/base/BISECT=base} GPUFL_DETACH=1 GPUFL_WINDOW_PERIOD_MS=500 timeout 60 gpufl record -q --always-on -o /tmp/bs -- build/launchcost 400 2000 > /tmp/bs.txt 2>&1
    rc=$?; [ $rc -ne 0 ] && bad=$((bad+1)) && grep -v experimental /tmp/bs.txt | head -2 | cut -c1-200 | sed "s/^/    /"
  done
  echo "variant $v: $bad of ${REPS:-3} failed"
done
