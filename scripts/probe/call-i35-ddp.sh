# Device call for issue 35 (nvidia-h200-x2): 2-rank DDP (examples/ddp_straggler.py under torchrun)
# recorded by always-on with a window, and so a detach of CUPTI, every 0.5 s in each rank: every
# process must exit 0; each rank's detach outcomes.   OUT=... bash scripts/probe/call-i35-ddp.sh
set -u
export OUT=${OUT:-/tmp/gpufl-out}; mkdir -p "$OUT"
DDP_RECORD_FLAGS=--always-on GPUFL_WINDOW_PERIOD_MS=500 DDP_STEPS=${DDP_STEPS:-400} \
  bash scripts/gpu-check.sh ddp > "$OUT/ddp-all.log" 2>&1
grep -E "^exit|Error|error|fault|rank [01]" "$OUT/summary.txt" | cut -c1-300 | head -20
for f in $(find "$OUT/sessions" -name trace-0000.ndjson.zst); do
  echo "-- $(basename "$(dirname "$(dirname "$f")")")/$(basename "$(dirname "$f")")"
  .device-bin/gpufl dump "$(dirname "$f")" --type notice 2>/dev/null | grep -o '"message":"always-on[^"]*' | sed 's/ (so that[^)]*)//' | cut -c12-400
done
for n in ddp-straggle ddp-balanced; do echo "== $n"; head -25 "$OUT/ddp/$n-report.txt"; done
