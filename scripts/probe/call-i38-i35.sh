# One device call (issue 38's memory checks, then a few forked Trainer rounds for issue 35):
#   OUT=... bash scripts/probe/call-i38-i35.sh [fork rounds, default 3]
set -u
export OUT=${OUT:-/tmp/gpufl-out}
TRAINER_ROUNDS=0 TRAINER_FORK=${1:-3} TRAINER_FORK_MODES=${FORK_MODES:-bare,gpufl-always-on,bare-again} \
  bash scripts/gpu-check.sh ${PHASES:-memory trainerbench} > "$OUT/gpucheck.log" 2>&1
grep -E "PASS|FAIL|paired|noise|exit|Error|error" "$OUT/summary.txt" | cut -c1-400 | tail -60
