# One device call for issue 35 (does always-on's cost stay after its windows close?):
#   OUT=... bash scripts/probe/call-i35-windows.sh [fork rounds, default 8]
# 1. phase nocupti; 2. the C++ launch loop's cost per launch over time (LC_TIMELINE), bare and under
# always-on with and without sampled windows (the first opens 2 s in); 3. forked Trainer rounds.
set -u
export OUT=${OUT:-/tmp/gpufl-out}
bash scripts/gpu-check.sh ${PHASES:-nocupti} > "$OUT/gpucheck.log" 2>&1
grep -E "PASS|FAIL" "$OUT/summary.txt" | cut -c1-300
CLOCK=0 REPS=${LC_REPS:-2} LC_TIMELINE=${LC_TIMELINE:-0.5} LC_ARGS="${LC_ROUNDS:-1000} 2000" \
  MODES="${LC_MODES:-bare always-on always-on-nowin subscribed}" bash scripts/probe/launch-cost.sh > /dev/null 2>&1
sed 's/LC_TIMELINE *//; s/ (n=[0-9]*)//' "$OUT/launchcost.txt"
TRAINER_ROUNDS=0 TRAINER_FORK=${1:-8} TRAINER_FORK_MODES=${FORK_MODES:-bare,gpufl-always-on,gpufl-always-on+GPUFL_ALWAYS_ON_BUDGET=0,bare-again} \
  bash scripts/gpu-check.sh trainerbench > "$OUT/trainer.log" 2>&1
grep -E "paired|noise|exit|Error|error" "$OUT/summary.txt" | cut -c1-300 | tail -40
