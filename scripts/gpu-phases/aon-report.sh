# Phase aon-report (helper C2): the report of a real always-on session. Sourced by
# scripts/gpu-check.sh (helpers $OUT $S $PY log report newest). About 1 minute on an H100.
# Needs the always-on recorder (GPUFL_MODE=always-on, helper C1's branch) in .device-bin/; on a
# recorder without it the session is a default one and the phase says so.
# Proves: the report of an always-on PyTorch loop prints the "always-on: GPU activity observed in
# N windows …" line under its headline, marks each insight exact / estimated, labels the kernel
# table windows-only, and still finds the planted in-loop sync (exact, STEPS+5 syncs: they are
# recorded outside windows too) at pytorch_train_sync.py's train_step line.
log "(aon-report) always-on PyTorch loop: exact sync insights, GPU insights estimated from windows"
STEPS=${AONR_STEPS:-1000}  # long enough (a few s) for several sampled windows
GPUFL_MODE=always-on gpufl record -o "$S/aonr" -- $PY examples/pytorch_train_sync.py --steps "$STEPS" --warmup 5 \
  > "$OUT/aonr.log" 2>&1
d=$(newest "$S/aonr")
if [ -z "$d" ]; then
  log "(aon-report) FAILED: no session recorded"; tail -20 "$OUT/aonr.log" | tee -a "$OUT/summary.txt"
else
  gpufl info "$d" 2>&1 | tee -a "$OUT/summary.txt"
  gpufl dump "$d" --type window --limit 5 2>&1 | tee -a "$OUT/summary.txt"
  gpufl report --color never "$d" > "$OUT/aonr.txt" 2>&1
  head -c 12000 "$OUT/aonr.txt" | tee -a "$OUT/summary.txt"
  grep -q '^  always-on: GPU activity observed in' "$OUT/aonr.txt" \
    && log "(aon-report) ok: always-on line present" \
    || log "(aon-report) NO always-on line (recorder without always-on mode, or no window header?)"
  c=$(grep -c 'estimated from windows covering\|exact: from records kept' "$OUT/aonr.txt")
  log "(aon-report) insights marked exact/estimated: $c"
  grep -q 'windows only)' "$OUT/aonr.txt" && log "(aon-report) ok: kernel table labelled windows-only"
  n=$((STEPS + 5))
  grep -q "In-loop sync × $n " "$OUT/aonr.txt" \
    && log "(aon-report) ok: planted in-loop sync found with all $n syncs (exact)" \
    || log "(aon-report) planted in-loop sync NOT found as × $n (see the report above)"
  gpufl report --json "$d" 2>/dev/null | $PY -c '
import json,sys
s=json.load(sys.stdin)["sessions"][0]; sm=s.get("sampling")
print("sampling:", None if sm is None else {k: sm[k] for k in ("windows","sampled","triggered","observed_ns","span_ns","coverage","files")})
for i in s["insights"][:8]: print(" ", i["rule"], i.get("basis",{}).get("kind"), i["impact_ns"], i["title"][:90])
for c in (sm or {}).get("calls_per_line", [])[:5]: print("  calls", c["calls"], c["captures"], c["api"], c["location"]["file"].split("/")[-1], c["location"].get("line"))
' 2>&1 | tee -a "$OUT/summary.txt"
  rm -f "$OUT/aonr.txt"
fi
