# Device call for issue 35: does always-on's detach (crate::detach) abort processes? Stress under
# windows every 500 ms (a detach after each): C++ launch loops and PyTorch loops, then forked
# Trainer rounds (bare, detaching, attached, bare again) with Python's faulthandler.
#   OUT=... LC_REPS=8 TB_REPS=4 bash scripts/probe/call-i35-crash.sh [Trainer rounds, default 5]
set -u
export OUT=${OUT:-/tmp/gpufl-out}; mkdir -p "$OUT"
BIN=$PWD/.device-bin; export PATH=$BIN:$PATH GPUFL_CAPTURE_LIB=$BIN/libgpufl_capture.so
mkdir -p build; nvcc -O2 -o build/launchcost scripts/probe/launchcost.cu -ldl 2>&1 | tail -3
sess() { dirname "$(find "$1" -name trace-0000.ndjson.zst | head -1)"; }
bad=0; n=0
for rep in $(seq 1 "${LC_REPS:-8}"); do
  GPUFL_DETACH=1 GPUFL_WINDOW_PERIOD_MS=500 timeout 60 gpufl record -q --always-on -o /tmp/st-$rep -- build/launchcost 800 2000 > $OUT/st-$rep.txt 2>&1
  rc=$?; n=$((n+1)); [ $rc -ne 0 ] && bad=$((bad+1))
  echo "launchcost $rep exit $rc $(grep -i 'corrupt\|abort\|SIG' $OUT/st-$rep.txt | head -1 | cut -c1-200)"
done
python3 scripts/probe/detach_check.py "$(sess /tmp/st-1)" | tail -4
gpufl dump "$(sess /tmp/st-1)" --type notice | grep -o 'CUPTI detached[^"]*' | cut -c1-300
for rep in $(seq 1 "${TB_REPS:-4}"); do
  PYTHONFAULTHANDLER=1 GPUFL_DETACH=1 GPUFL_WINDOW_PERIOD_MS=500 timeout 90 gpufl record -q --always-on -o /tmp/tb-$rep -- python3 examples/pytorch_backward.py --steps 300 > $OUT/tb-$rep.txt 2>&1
  rc=$?; n=$((n+1)); [ $rc -ne 0 ] && bad=$((bad+1))
  echo "torch $rep exit $rc $(grep -i 'fatal\|corrupt\|gpufl: SIG' $OUT/tb-$rep.txt | head -1 | cut -c1-200)"
done
python3 scripts/probe/detach_check.py "$(sess /tmp/tb-1)" | tail -4
gpufl dump "$(sess /tmp/tb-1)" --type notice | grep -o 'CUPTI detached[^"]*' | cut -c1-300
echo "stressed processes: $bad of $n failed"
PYTHONFAULTHANDLER=1 timeout ${TF_TIMEOUT:-300} python3 bench/trainer_bench.py --fork ${1:-5} --fork-modes ${FORK_MODES:-bare,gpufl-always-on+GPUFL_DETACH=1,gpufl-always-on,bare-again} --gpufl-lib $GPUFL_CAPTURE_LIB --fork-out /tmp/tf > $OUT/tf.jsonl 2> $OUT/tf.err
echo "trainer children: $(grep -c '"train_ms"' $OUT/tf.jsonl)"; grep exit_status $OUT/tf.jsonl | cut -c1-200
grep -i "fatal\|corrupt\|gpufl: SIG" $OUT/tf.err | head -10
python3 bench/summarize.py $OUT/tf.jsonl | head -12
for f in $(find /tmp/tf -name trace-0000.ndjson.zst | head -2); do gpufl dump $(dirname $f) --type notice | grep -o 'always-on: [^"]*' | cut -c1-400; done
