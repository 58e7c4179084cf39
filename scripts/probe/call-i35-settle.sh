# Device call for issue 35: does attaching CUPTI again soon after a detach make it crash? (CUPTI
# alone, attaching 200 ms after each detach, never crashed: scripts/probe/detachloop.cu.) gpufl's
# launch loop under always-on detaching every 0.5 s with GPUFL_DETACH_SETTLE_MS 200 and 1, or
# VARIANTS (space-separated; a variant sets several variables joined by +).
set -u
export OUT=${OUT:-/tmp/gpufl-out}; mkdir -p "$OUT"
BIN=$PWD/.device-bin; export PATH=$BIN:$PATH GPUFL_CAPTURE_LIB=$BIN/libgpufl_capture.so
mkdir -p build; nvcc -O2 -o build/launchcost scripts/probe/launchcost.cu -ldl 2>&1 | tail -3
for v in ${VARIANTS:-GPUFL_DETACH_SETTLE_MS=200 GPUFL_DETACH_SETTLE_MS=1}; do
  bad=0; n=0
  for rep in $(seq 1 ${REPS:-5}); do
    rm -rf /tmp/bs; env ${v//+/ } GPUFL_DETACH=1 GPUFL_WINDOW_PERIOD_MS=500 timeout 60 gpufl record -q --always-on -o /tmp/bs -- build/launchcost 800 2000 > /tmp/bs.txt 2>&1
    rc=$?; n=$((n+1)); [ $rc -ne 0 ] && bad=$((bad+1)) && grep -v experimental /tmp/bs.txt | head -2 | cut -c1-200 | sed "s/^/    /"
    [ $rep = 1 ] && gpufl dump "$(dirname "$(find /tmp/bs -name trace-0000.ndjson.zst | head -1)")" --type notice 2>/dev/null | grep -o 'CUPTI detached[^"]*' | cut -c1-250
  done
  echo "variant $v: $bad of $n failed"
done
