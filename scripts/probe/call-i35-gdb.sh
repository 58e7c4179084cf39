# Device call for issue 35: where does a detaching gpufl launch loop die? cuda-gdb (the device
# machine's only debugger; it debugs host code too) run over the always-on launch loop detaching
# every 0.5 s, until GDB_CRASHES crashes are caught: the faulting thread's stack, every thread's,
# the instructions at the fault and the loaded libraries' bases.
#   OUT=... bash scripts/probe/call-i35-gdb.sh [tries, default 6]
set -u
export OUT=${OUT:-/tmp/gpufl-out}; mkdir -p "$OUT" build
BIN=$PWD/.device-bin
GDB=$(command -v cuda-gdb || echo /usr/local/cuda/bin/cuda-gdb)
echo "cuda-gdb: $GDB $($GDB --version 2>/dev/null | head -1)"
nvcc -O2 -g -o build/launchcost scripts/probe/launchcost.cu -ldl 2>&1 | tail -3
GDBCMDS=(-ex "set pagination off" -ex "set print thread-events off"
  -ex "handle SIGUSR1 SIGUSR2 SIGPIPE SIG34 SIG35 SIG36 nostop noprint pass")
AFTER=(-ex "echo ==CRASH==\n" -ex "bt 40" -ex "x/8i \$pc-16" -ex "info registers rip rsp rax rbx rcx rdx rdi rsi"
  -ex "info threads" -ex "thread apply all bt 16" -ex "info sharedlibrary")
caught=0
for i in $(seq 1 ${1:-6}); do
  rm -rf /tmp/gdbrun; mkdir -p /tmp/gdbrun
  export CUDA_INJECTION64_PATH=$BIN/libgpufl_capture.so GPUFL_LOG_PATH=/tmp/gdbrun GPUFL_MODE=always-on \
    GPUFL_DETACH=1 GPUFL_WINDOW_PERIOD_MS=500 GPUFL_QUIET=1
  if [ $((i % 2)) = 1 ]; then how=run
    timeout 60 "$GDB" -q -batch "${GDBCMDS[@]}" -ex "set cuda break_on_launch none" -ex run "${AFTER[@]}" \
      --args build/launchcost 800 2000 > "$OUT/gdb-$i.txt" 2>&1
  else how=attach
    build/launchcost 800 2000 > /tmp/gdbrun/out.txt 2>&1 & pid=$!
    sleep 1.5
    timeout 60 "$GDB" -q -batch -p $pid "${GDBCMDS[@]}" -ex continue "${AFTER[@]}" > "$OUT/gdb-$i.txt" 2>&1
    kill -9 $pid 2>/dev/null; wait $pid 2>/dev/null
  fi
  unset CUDA_INJECTION64_PATH
  if grep -q "received signal SIG[SA]" "$OUT/gdb-$i.txt"; then
    caught=$((caught+1)); echo "=== gdb $how $i: crashed"
    grep -A400 "received signal" "$OUT/gdb-$i.txt" | grep -v "^\(0x\|From\|Yes\|No \)" | grep -v "^ *$" | head -${GDB_LINES:-150} | cut -c1-220
    grep -E "libcupti|libcuda\.so|libgpufl|libc\.so" "$OUT/gdb-$i.txt" | grep "^0x" | head -6
    [ $caught -ge ${GDB_CRASHES:-2} ] && break
  else
    echo "=== gdb $how $i: no crash ($(grep -c . "$OUT/gdb-$i.txt") lines; last: $(grep -v '^\s*$' "$OUT/gdb-$i.txt" | tail -1 | cut -c1-150))"
  fi
done
