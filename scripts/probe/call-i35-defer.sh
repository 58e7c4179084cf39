# Device call for issue 35 (nvidia-h200): always-on with large libraries' symbols loaded past its
# start (the default) against loading them from the start (GPUFL_DEFER_SYMBOLS=0), on the short
# Trainer (forked rounds, whole train() and its warm-up), with bare and bare-again. CALL_LIMIT_S
# (default 540) ends the rounds early; those done are summarized.
#   OUT=... bash scripts/probe/call-i35-defer.sh [rounds]
set -u
export OUT=${OUT:-/tmp/gpufl-out}; mkdir -p "$OUT"
TRAINER_ROUNDS=0 TRAINER_FORK=${1:-24} \
  TRAINER_FORK_MODES=${FORK_MODES:-bare,gpufl-always-on,gpufl-always-on+GPUFL_DEFER_SYMBOLS=0,bare-again} \
  timeout ${CALL_LIMIT_S:-540} bash scripts/gpu-check.sh trainerbench > "$OUT/trainer.log" 2>&1
[ -s "$OUT/trainerfork.jsonl" ] || grep -h '^{"' "$OUT/trainer.log" > "$OUT/trainerfork.jsonl"
python3 bench/summarize.py "$OUT/trainerfork.jsonl" | grep -A6 "whole train\|warm-up steps\|median step" | cut -c1-220
grep -E "CUPTI detached|no detach|times" "$OUT/summary.txt" | head
python3 scripts/probe/warm_profile.py "$OUT/trainerfork.jsonl"
