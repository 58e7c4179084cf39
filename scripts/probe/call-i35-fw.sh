# Device call for issue 35 (nvidia-h200): the frameworks under always-on's detach default (phase
# detach, part 4: JAX, Lightning, generate(), torch.compile, CUDA graphs, CuPy, Triton; windows
# every 0.5 s, each must exit 0), then forked Trainer rounds with always-on timed by
# GPUFL_DEBUG_COST=1 (the callbacks' time on the program's threads, the stack captures' cost) and
# every notice of those children.       OUT=... bash scripts/probe/call-i35-fw.sh [fork rounds]
set -u
export OUT=${OUT:-/tmp/gpufl-out}; mkdir -p "$OUT"
DETACH_PARTS=4 bash scripts/gpu-check.sh detach > "$OUT/detach.log" 2>&1
grep -E "exit|PASS|FAIL|Error" "$OUT/summary.txt" | cut -c1-300
for f in "$OUT"/detach-fw-*.txt; do echo "-- $f"; grep -iE "error|fault|abort|corrupt" "$f" | head -3; done
[ "${1:-3}" -gt 0 ] || exit 0
: > "$OUT/summary.txt"
TRAINER_ROUNDS=0 TRAINER_FORK=${1:-3} TRAINER_FORK_MODES=${FORK_MODES:-bare,gpufl-always-on+GPUFL_DEBUG_COST=1,bare-again} \
  TRAINER_FORK_NOTICES=${FORK_NOTICES:-.} TRAINER_FORK_NOTICES_MODE=1 \
  bash scripts/gpu-check.sh trainerbench > "$OUT/trainer.log" 2>&1
cut -c1-700 "$OUT/summary.txt" | grep -v '^== ' | tail -60
