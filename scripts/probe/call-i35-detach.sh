# One device call for issue 35: always-on's detach after each window (phase detach), then forked
# Trainer rounds with and without it.   OUT=... bash scripts/probe/call-i35-detach.sh [rounds, default 8]
set -u
export OUT=${OUT:-/tmp/gpufl-out}
bash scripts/gpu-check.sh detach > "$OUT/gpucheck.log" 2>&1
sed -n '/(detach)/,$p' "$OUT/summary.txt" | cut -c1-700
TRAINER_ROUNDS=0 TRAINER_FORK=${1:-8} TRAINER_FORK_MODES=${FORK_MODES:-bare,gpufl-always-on+GPUFL_DETACH=1,gpufl-always-on,bare-again} \
  bash scripts/gpu-check.sh trainerbench > "$OUT/trainer.log" 2>&1
grep -E "paired|noise|exit|Error|error" "$OUT/summary.txt" | cut -c1-300 | tail -24
f=$(find "$OUT/sessions/trainerbench" -name trace-0000.ndjson.zst | head -1)
[ -n "$f" ] && gpufl dump "$(dirname "$f")" --type notice 2>&1 | grep -i "always-on\|CUPTI" | cut -c1-500
