# Device call for issue 35: does always-on's detach (crate::detach) abort processes? Stress under
# windows every 500 ms (a detach after each), and forked Trainer rounds with Python's faulthandler.
set -u
export OUT=${OUT:-/tmp/gpufl-out}; mkdir -p "$OUT"
BIN=$PWD/.device-bin; export PATH=$BIN:$PATH GPUFL_CAPTURE_LIB=$BIN/libgpufl_capture.so
mkdir -p build; nvcc -O2 -o build/launchcost scripts/probe/launchcost.cu -ldl 2>&1 | tail -3
sess() { dirname "$(find "$1" -name trace-0000.ndjson.zst | head -1)"; }
for rep in 1 2 3 4; do
  GPUFL_DETACH=1 GPUFL_WINDOW_PERIOD_MS=500 gpufl record -q --always-on -o /tmp/st-$rep -- build/launchcost 800 2000 > $OUT/st-$rep.txt 2>&1; echo "launchcost $rep exit $?"; grep -i "corrupt\|abort\|signal" $OUT/st-$rep.txt | head -3
done
python3 scripts/probe/detach_check.py "$(sess /tmp/st-1)" | tail -5
for rep in 1 2 3; do
  PYTHONFAULTHANDLER=1 GPUFL_DETACH=1 GPUFL_WINDOW_PERIOD_MS=500 gpufl record -q --always-on -o /tmp/tb-$rep -- python3 examples/pytorch_backward.py --steps 300 > $OUT/tb-$rep.txt 2>&1; echo "torch $rep exit $?"; grep -i "fatal\|corrupt\|gpufl: SIG" $OUT/tb-$rep.txt | head -3
done
python3 scripts/probe/detach_check.py "$(sess /tmp/tb-1)" | tail -5
PYTHONFAULTHANDLER=1 timeout 150 python3 bench/trainer_bench.py --fork ${1:-5} --fork-modes gpufl-always-on+GPUFL_DETACH=1,gpufl-always-on+GPUFL_DETACH=1 --gpufl-lib $GPUFL_CAPTURE_LIB --fork-out /tmp/tf > $OUT/tf.jsonl 2> $OUT/tf.err
grep -c '"train_ms"' $OUT/tf.jsonl; grep exit_status $OUT/tf.jsonl
grep -i "fatal\|corrupt\|gpufl: SIG" $OUT/tf.err | head -10
for f in $(find /tmp/tf -name trace-0000.ndjson.zst | head -3); do gpufl dump $(dirname $f) --type notice | grep -o 'always-on: [^"]*' | cut -c1-300; done
