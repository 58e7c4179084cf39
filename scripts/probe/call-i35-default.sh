# Device call for issue 35, with always-on detaching CUPTI after its windows by default: the C++
# launch loop's steady state after its first window (from LC_FROM s, default 5: the window opens 4 s
# in) over LC_REPS rounds of bare / always-on / bare-again, each always-on
# process's detaches printed, then forked Trainer rounds (whole train(), 120 steps) with the
# always-on children's detach outcomes.   OUT=... bash scripts/probe/call-i35-default.sh [rounds]
set -u
export OUT=${OUT:-/tmp/gpufl-out}; mkdir -p "$OUT"
BIN=$PWD/.device-bin; export PATH=$BIN:$PATH GPUFL_CAPTURE_LIB=$BIN/libgpufl_capture.so
CLOCK=0 REPS=${LC_REPS:-6} LC_TIMELINE=0.5 LC_ARGS="${LC_ROUNDS:-600} 2000" \
  MODES="${LC_MODES:-bare always-on bare-again}" bash scripts/probe/launch-cost.sh > /dev/null 2>&1
python3 scripts/probe/lc_steady.py "$OUT/launchcost.txt" --from ${LC_FROM:-5.0}
grep "^    CUPTI" "$OUT/launchcost.txt" | sed 's/ (so that[^)]*)//' | cut -c1-200
TRAINER_ROUNDS=0 TRAINER_FORK=${1:-8} TRAINER_FORK_MODES=${FORK_MODES:-bare,gpufl-always-on,bare-again} \
  bash scripts/gpu-check.sh trainerbench > "$OUT/trainer.log" 2>&1
grep -E "paired|noise|exit|Error|error|CUPTI detached|times|no detach" "$OUT/summary.txt" | cut -c1-300 | tail -30
