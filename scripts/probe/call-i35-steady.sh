# Device call for issue 35: always-on's steady-state cost on the C++ launch loop now that it
# detaches CUPTI after each window by default, against it attached (GPUFL_DETACH=0): LC_REPS
# interleaved rounds of bare / always-on / always-on attached / bare-again, one process each, the
# median ns per launch of each process's 0.5-s stretches after the first window
# (scripts/probe/lc_steady.py); then PyTorch loops detaching every 0.5 s (do they all exit 0?).
#   OUT=... bash scripts/probe/call-i35-steady.sh
set -u
export OUT=${OUT:-/tmp/gpufl-out}; mkdir -p "$OUT"
BIN=$PWD/.device-bin; export PATH=$BIN:$PATH GPUFL_CAPTURE_LIB=$BIN/libgpufl_capture.so
CLOCK=0 REPS=${LC_REPS:-8} LC_TIMELINE=0.5 LC_ARGS="${LC_ROUNDS:-600} 2000" \
  MODES="${LC_MODES:-bare always-on always-on+GPUFL_DETACH=0 bare-again}" bash scripts/probe/launch-cost.sh > /dev/null 2>&1
python3 scripts/probe/lc_steady.py "$OUT/launchcost.txt"
bad=0
for rep in $(seq 1 ${PT_REPS:-4}); do
  rm -rf /tmp/pt; PYTHONFAULTHANDLER=1 GPUFL_WINDOW_PERIOD_MS=500 timeout 120 gpufl record -q --always-on -o /tmp/pt -- python3 examples/pytorch_backward.py --steps ${PT_STEPS:-300} > $OUT/pt-$rep.txt 2>&1
  rc=$?; [ $rc -ne 0 ] && bad=$((bad+1)); echo "torch $rep exit $rc $(grep -i 'fatal\|corrupt\|gpufl: SIG\|Error' $OUT/pt-$rep.txt | head -1 | cut -c1-200)"
done
echo "torch detaching every 0.5 s: $bad of ${PT_REPS:-4} failed"
s=$(dirname "$(find /tmp/pt -name trace-0000.ndjson.zst | head -1)"); python3 scripts/probe/detach_check.py "$s" | tail -3
gpufl dump "$s" --type notice | grep -o 'always-on: [^"]*' | cut -c1-300
