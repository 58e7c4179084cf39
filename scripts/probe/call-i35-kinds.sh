# Device call for issue 35: do the activity kinds gpufl adds (memcpy/memset/overhead in windows,
# memory activity all the time) make a detach crash? CUPTI alone (detachloop cases 10, 11), then
# gpufl's launch loop under always-on detaching every 0.5 s with and without mem records.
set -u
export OUT=${OUT:-/tmp/gpufl-out}; mkdir -p "$OUT"
BIN=$PWD/.device-bin; export PATH=$BIN:$PATH GPUFL_CAPTURE_LIB=$BIN/libgpufl_capture.so
CASES="11 10" PROBE_TIMEOUT=150 bash scripts/probe/call-i35-why.sh ${PROBE_REPS:-3} | grep -v "^gdb"
mkdir -p build; nvcc -O2 -o build/launchcost scripts/probe/launchcost.cu -ldl 2>&1 | tail -3
for v in GPUFL_MEM_RECORDS=0 BISECT=base; do
  bad=0
  for rep in $(seq 1 ${REPS:-4}); do
    rm -rf /tmp/bs; env $v GPUFL_DETACH=1 GPUFL_WINDOW_PERIOD_MS=500 timeout 60 gpufl record -q --always-on -o /tmp/bs -- build/launchcost 800 2000 > /tmp/bs.txt 2>&1
    rc=$?; [ $rc -ne 0 ] && bad=$((bad+1)) && grep -v experimental /tmp/bs.txt | head -2 | cut -c1-200 | sed "s/^/    /"
  done
  echo "variant $v: $bad of ${REPS:-4} failed"
done
