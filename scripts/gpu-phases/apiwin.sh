# Phase apiwin (sourced by scripts/gpu-check.sh): API records inside always-on full-detail windows
# (gpufl.capture_window), with the window's API collection as it is and with GPUFL_WINDOW_API=kinds
# (runtime/driver API kinds on, other functions off); and in the default mode, API records in each
# recorded loop of a pause/resume toggle (are they back after a resume?).
log "(apiwin) API records in always-on detail windows, and after resume in the default mode"
AW="$S/apiwin"; mkdir -p "$AW"
cat > "$AW/apiwin.py" <<'PYEOF'
import sys, time
import torch
sys.path.insert(0, "python")
import gpufl
x = torch.randn(1024, 1024, device="cuda")
def run(sec):
    t = time.time()
    while time.time() - t < sec:
        y = x @ x
        float(y[0, 0])
run(3)
print("capture_window:", gpufl.capture_window(1.0))
run(2.5)
PYEOF
for v in default kinds; do
  GPUFL_WINDOW_API=$v gpufl record -q --always-on -o "$AW/$v" -- $PY "$AW/apiwin.py" 2>&1 | tail -2
  d=$(newest "$AW/$v")
  gpufl dump "$d" --type window,api,kernel > "$AW/$v.ndjson" 2>/dev/null
  $PY - "$AW/$v.ndjson" "$v" <<'PYEOF' 2>&1 | tee -a "$OUT/summary.txt"
import json, sys, collections
rs = [json.loads(l) for l in open(sys.argv[1])]
wins = [r for r in rs if r["t"] == "window"]
apis = [r for r in rs if r["t"] == "api"]
kern = [r for r in rs if r["t"] == "kernel"]
for w in wins:
    ins = [a for a in apis if w["start"] <= a["start"] <= w["end"]]
    k = sum(1 for r in kern if w["start"] <= r["start"] <= w["end"])
    names = collections.Counter(a.get("name") for a in ins).most_common(4)
    print(f"apiwin[{sys.argv[2]}] window {w['reason']} {(w['end']-w['start'])/1e9:.2f} s: {k} kernels, {len(ins)} api records {names}")
print(f"apiwin[{sys.argv[2]}] api records in session: {len(apis)}; windows {len(wins)}")
PYEOF
done
gpufl record -q -o "$AW/toggle" -- $PY bench/launch_bound.py --steps 20 --warmup 5 --toggle 3 --mode gpufl-full >/dev/null 2>&1
d=$(newest "$AW/toggle")
gpufl dump "$d" --type capture,api,kernel > "$AW/toggle.ndjson" 2>/dev/null
$PY - "$AW/toggle.ndjson" <<'PYEOF' 2>&1 | tee -a "$OUT/summary.txt"
import json, sys
rs = [json.loads(l) for l in open(sys.argv[1])]
caps = sorted((r["ts"], r["recording"]) for r in rs if r["t"] == "capture")
apis = sorted(r["start"] for r in rs if r["t"] == "api")
kern = sorted(r["start"] for r in rs if r["t"] == "kernel")
edges = [0] + [t for t, _ in caps] + [1 << 64]
for a, b in zip(edges, edges[1:]):
    na = sum(1 for t in apis if a <= t < b); nk = sum(1 for t in kern if a <= t < b)
    print(f"apiwin[toggle] segment {a}..{b}: {nk} kernels, {na} api records")
PYEOF
rm -rf "$AW"/*/
