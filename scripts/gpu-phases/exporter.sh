# Phase exporter (sourced by scripts/gpu-check.sh): `gpufl exporter` on the GPU machine.
#  1. its device values against nvidia-smi (utilization, memory used, temperature, power, SM clock),
#     idle and under load, per GPU (matched by UUID);
#  2. a PyTorch job with a planted `.item()` loop under `gpufl record`, feeding the exporter: a
#     /metrics excerpt of its process metrics, which must name the planted line;
#  3. the exporter's cost: CPU per scrape and per second idle (bench/exporter_cost.py).
# Files in $OUT/exporter/: metrics-*.txt, smi-*.csv, compare.txt, excerpt.txt, cost.json. ~2 minutes.
log "(x) gpufl exporter: device metrics vs nvidia-smi, a PyTorch .item() loop's line, cost"
EX="$OUT/exporter"; mkdir -p "$EX"
EXPORT_SOCK="$EX/exporter.sock"
gpufl exporter --listen 127.0.0.1:9401 --socket "$EXPORT_SOCK" 2>"$EX/exporter.err" &
EXPORTER_PID=$!
sleep 2
head -1 "$EX/exporter.err" | tee -a "$OUT/summary.txt"

snap() { # tag: one /metrics page and one nvidia-smi line per GPU, taken back to back
  $PY -c "import urllib.request;print(urllib.request.urlopen('http://127.0.0.1:9401/metrics').read().decode())" >"$EX/metrics-$1.txt"
  nvidia-smi --query-gpu=uuid,utilization.gpu,memory.used,temperature.gpu,power.draw,clocks.sm \
    --format=csv,noheader,nounits >"$EX/smi-$1.csv"
}
compare() { # tags...: exporter vs nvidia-smi per GPU and metric
  $PY - "$EX" "$@" <<'PYEOF' 2>&1 | tee -a "$EX/compare.txt" "$OUT/summary.txt"
import re, sys
ex, tags = sys.argv[1], sys.argv[2:]
names = [("DCGM_FI_DEV_GPU_UTIL", "util %"), ("DCGM_FI_DEV_FB_USED", "mem MiB"),
         ("DCGM_FI_DEV_GPU_TEMP", "temp C"), ("DCGM_FI_DEV_POWER_USAGE", "power W"),
         ("DCGM_FI_DEV_SM_CLOCK", "SM MHz")]
print(f"{'snapshot':10s} {'GPU':14s} " + " ".join(f"{l:>17s}" for _, l in names) + "   (exporter / nvidia-smi)")
for tag in tags:
    page = open(f"{ex}/metrics-{tag}.txt").read()
    for line in open(f"{ex}/smi-{tag}.csv"):
        f = [x.strip() for x in line.split(",")]
        uuid, smi = f[0], f[1:]
        cells = []
        for (name, _), s in zip(names, smi):
            m = re.search(rf'^{name}{{[^}}]*UUID="{re.escape(uuid)}"[^}}]*}} (\S+)$', page, re.M)
            cells.append(f"{(m.group(1) if m else '-'):>8s} / {s:>6s}")
        print(f"{tag:10s} {uuid[:14]:14s} " + " ".join(f"{c:>17s}" for c in cells))
PYEOF
}
snap idle1; sleep 1; snap idle2

cat >"$EX/item_loop.py" <<'PYEOF'
"""A training-like loop whose .item() each step makes the host wait for the GPU (planted)."""
import sys, time
import torch

x = torch.randn(4096, 4096, device="cuda")
w = torch.randn(4096, 4096, device="cuda")
end = time.time() + float(sys.argv[1])
steps = 0
while time.time() < end:
    y = torch.relu(x @ w) @ w
    loss = y.mean().item()  # gpufl-exporter: planted .item()
    steps += 1
print("steps", steps)
PYEOF
ITEM_LINE=$(grep -n "planted .item()" "$EX/item_loop.py" | cut -d: -f1)
GPUFL_EXPORTER_SOCKET="$EXPORT_SOCK" gpufl record -o "$S/exporter" -- $PY "$EX/item_loop.py" 30 >"$EX/job.log" 2>&1 &
JOB=$!
sleep 15
snap load1; sleep 2; snap load2
compare idle1 idle2 load1 load2
$PY - "$EX" "$ITEM_LINE" <<'PYEOF' 2>&1 | tee "$EX/excerpt.txt" | tee -a "$OUT/summary.txt"
import re, sys
ex, line = sys.argv[1], sys.argv[2]
page = open(f"{ex}/metrics-load2.txt").read()
keep = [l for l in page.splitlines() if l.startswith(("gpufl_process_", "gpufl_exporter_device"))]
print("/metrics excerpt (process metrics of the recorded job):")
print("\n".join(keep))
want = f'line="item_loop.py:{line}"'
top = [l for l in keep if l.startswith("gpufl_process_top_sync_seconds")]
print(f"top sync line names the planted .item() (item_loop.py:{line}):", "yes" if any(want in l for l in top) else "NO")
PYEOF
wait $JOB; cat "$EX/job.log" | tail -3 | tee -a "$OUT/summary.txt"
kill $EXPORTER_PID 2>/dev/null; wait $EXPORTER_PID 2>/dev/null
log "(x) exporter cost on this machine (its NVML read at every scrape)"
$PY bench/exporter_cost.py --gpufl "$(command -v gpufl)" --procs 50 --idle 20 --scrapes 500 \
  --json "$EX/cost.json" 2>&1 | tee -a "$OUT/summary.txt"
