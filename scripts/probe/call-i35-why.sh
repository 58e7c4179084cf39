# Device call for issue 35: why does always-on's detach corrupt the heap? CUPTI alone
# (scripts/probe/detachloop.cu, cases 0-5) and, where gdb is there, a native backtrace of a gpufl
# launch loop that aborts.   OUT=... bash scripts/probe/call-i35-why.sh [reps, default 3]
set -u
export OUT=${OUT:-/tmp/gpufl-out}; mkdir -p "$OUT"
BIN=$PWD/.device-bin
echo "gdb: $(command -v gdb || echo none)"
PROBE_TIMEOUT=${PROBE_TIMEOUT:-300} bash scripts/probe/run-probe.sh detachloop ${CASES:-0 1 2 3 4 5} --reps ${1:-3} | grep -v "^  cupti"
if command -v gdb >/dev/null; then
  mkdir -p build; nvcc -O2 -o build/launchcost scripts/probe/launchcost.cu -ldl 2>&1 | tail -3
  for i in 1 2 3 4 5; do
    rm -rf /tmp/gdbrun; mkdir -p /tmp/gdbrun
    CUDA_INJECTION64_PATH=$BIN/libgpufl_capture.so GPUFL_LOG_PATH=/tmp/gdbrun GPUFL_MODE=always-on GPUFL_DETACH=1 \
      GPUFL_WINDOW_PERIOD_MS=500 GPUFL_QUIET=1 timeout 60 gdb -q -batch -ex "set pagination off" \
      -ex "handle SIGUSR1 SIGUSR2 SIGPIPE nostop noprint" -ex run -ex "bt 40" -ex "info threads" \
      -ex "thread apply all bt 12" --args build/launchcost 600 2000 > $OUT/gdb-$i.txt 2>&1
    if grep -q "received signal" $OUT/gdb-$i.txt; then echo "gdb run $i: crashed"; grep -A40 "received signal" $OUT/gdb-$i.txt | head -60; break; fi
    echo "gdb run $i: no crash"
  done
fi
