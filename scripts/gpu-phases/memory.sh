# Phase memory (sourced by scripts/gpu-check.sh): `mem` records (issue 38): allocations, frees and
# failed allocations with their call-site stacks, and the memory findings, on one GPU:
#   (a) pytorch_oom: examples/pytorch_oom.py, CUDA tensors kept in a list until
#       torch.cuda.OutOfMemoryError (the script dies of it): the first finding should be
#       `out-of-memory` at the marked line `grow`, with the live bytes by line (that line);
#   (b) leak_loop: examples/leak_loop.cu, cudaMalloc of 8 MiB x 200 never freed: `memory-leak` at
#       the marked line `leak`, +8 MiB per allocation;
#   (c) mempool_async (examples/mempool_async.cu, cudaMallocAsync/cudaFreeAsync on the default
#       pool) and pytorch_expandable (examples/pytorch_expandable.py under
#       PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True): the analysis's memory over time
#       (`memory-peak`'s series) against NVML (`nvidia-smi --query-gpu=memory.used` every 100 ms;
#       the baseline the context's, sampled in the pause after the program's `baseline_unix_ms`)
#       and against the program's own cudaMemGetInfo deltas: peaks within 5 %;
#   (d) hf_trainer: examples/hf_trainer.py --steps 20: `memory-peak`'s holders by line and its
#       live bytes by what they are for (weights, optimizer state, activations each named).
# Each under `gpufl record` into $S/memory-<name>/: info, `gpufl dump --type mem --limit 8`,
# `gpufl report`, and `gpufl report --json` into $S/memory-json/ (in sessions.tgz), then the
# checks below (PASS/FAIL lines in summary.txt).
# ~2-3 minutes on the H100 machine (the OOM run fills 80 GB in 256 MiB steps; torch and
# transformers imports dominate the rest).
MM="$S/memory-json"; mkdir -p "$MM" build
log "(memory) mem records: the out-of-memory post-mortem, leaks, peaks"
for f in leak_loop mempool_async; do
  rm -f "build/$f"
  nvcc -g -O2 -lineinfo -o "build/$f" "examples/$f.cu" >"$MM/nvcc-$f.txt" 2>&1 \
    || { log "compile FAILED: $f"; tail -5 "$MM/nvcc-$f.txt" | tee -a "$OUT/summary.txt"; }
done
mm_line() { grep -n "gpufl-example: $2\$" "examples/$1" | head -1 | cut -d: -f1; }
mm() { # name marker-file marker command...: record (with nvidia-smi sampling), show, dump, report, check
  local name=$1 mfile=$2 marker=$3; shift 3
  local t0 smi; t0=$(date +%s%N)
  log "(memory) $name: $*"
  nvidia-smi --query-gpu=timestamp,index,memory.used --format=csv,noheader,nounits -lms 100 \
    > "$MM/$name-smi.csv" 2>/dev/null &
  smi=$!
  gpufl record -o "$S/memory-$name" -- "$@" > "$OUT/memory-$name.log" 2>&1
  echo "exit $? · wall $(( ($(date +%s%N) - t0) / 1000000 )) ms" | tee -a "$OUT/summary.txt"
  kill "$smi" 2>/dev/null; wait "$smi" 2>/dev/null
  grep -E "^(pytorch_oom|leak_loop|mempool_async|pytorch_expandable|hf_trainer):|OutOfMemoryError" \
    "$OUT/memory-$name.log" | tail -6 | tee -a "$OUT/summary.txt"
  local d; d=$(newest "$S/memory-$name")
  [ -n "$d" ] || { log "(memory) $name: no run directory"; return; }
  show "$d"
  gpufl dump "$d" --type mem --limit 8 2>&1 | cut -c1-600 | tee -a "$OUT/summary.txt"
  gpufl report "$d" 2>&1 | head -60 | tee -a "$OUT/summary.txt"
  gpufl report --json "$d" > "$MM/$name-report.json" 2>"$MM/$name-report.err"
  local line; line=$(mm_line "$mfile" "$marker")
  echo "(memory) $name: marker $marker at examples/$mfile:$line" | tee -a "$OUT/summary.txt"
  $PY - "$name" "$MM/$name-report.json" "$mfile" "${line:-0}" "$MM/$name-smi.csv" "$OUT/memory-$name.log" \
    <<'PYEOF' 2>&1 | tee -a "$OUT/summary.txt"
import json, re, sys
name, path, mfile, line, smi, log = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), sys.argv[5], sys.argv[6]
try:
    j = json.load(open(path))
except Exception as e:
    print(f"{name}: no JSON report ({e}): FAIL"); sys.exit()
ins = [i for s in j.get("sessions", []) for i in s.get("insights", [])]
def at(i):
    loc = i.get("location") or {}
    return f"{loc.get('file', '?').rsplit('/', 1)[-1]}:{loc.get('line')}"
def marked(i):
    loc = i.get("location") or {}
    return loc.get("file", "").endswith(mfile) and loc.get("line") == line
print(f"{name}: {len(ins)} insights:", [(i["rule"], i["severity"], at(i)) for i in ins][:8])
mem = [i for i in ins if i["rule"] in ("out-of-memory", "memory-leak", "memory-peak")]
for i in mem:
    print(f"  {i['rule']} {i['severity']} at {at(i)}: {i['title'][:160]}")
    print(f"    {i['detail'][:600]}")
def verdict(ok, what):
    print(f"{name}: {what}:", "PASS" if ok else "FAIL")
if name == "pytorch_oom":
    first = ins[0] if ins else {}
    d = first.get("data") or {}
    verdict(first.get("rule") == "out-of-memory" and marked(first),
            f"first finding out-of-memory at {mfile}:{line} (got {first.get('rule')} at {at(first) if first else '-'})")
    h = d.get("holders") or []
    verdict(bool(h) and h[0].get("location", "").endswith(f"{mfile}:{line}"),
            f"top holder at the failure is the growing line (holders {[(x['location'], x['bytes'] >> 20) for x in h]})")
elif name == "leak_loop":
    lk = [i for i in ins if i["rule"] == "memory-leak" and marked(i)]
    d = (lk[0].get("data") or {}) if lk else {}
    verdict(bool(lk) and d.get("growth_per_alloc") == 8 << 20 and d.get("allocs") == 200,
            f"memory-leak at {mfile}:{line}, 8 MiB per allocation x 200 (got {d})")
else:
    pk = [i for i in ins if i["rule"] == "memory-peak"]
    d = (pk[0].get("data") or {}) if pk else {}
    peak = d.get("peak_bytes", 0) / (1 << 20)
    series = d.get("series") or []
    print(f"  analysis memory over time (s, MiB): {[(round(t / 1e9, 2), b >> 20) for t, b in series][:40]}")
    # NVML (nvidia-smi, every 100 ms, GPU 0): the device's used memory. Its baseline is the
    # context's: the samples in the 400 ms pause after the program read its own baseline
    # (`baseline_unix_ms`), when the context exists and nothing is allocated yet.
    import datetime
    samples = []
    for l in open(smi) if __import__("os").path.exists(smi) else []:
        f = [x.strip() for x in l.split(",")]
        try:
            t = datetime.datetime.strptime(f[0], "%Y/%m/%d %H:%M:%S.%f").timestamp() * 1000
            if f[1] == "0":
                samples.append((t, int(f[2])))
        except (ValueError, IndexError):
            pass
    print(f"  nvidia-smi memory.used (MiB, every 100 ms): {[u for _, u in samples][:80]}")
    b = re.findall(r"baseline_unix_ms=(\d+)", open(log).read())
    if b and samples:
        t0 = int(b[-1])
        base = sorted(u for t, u in samples if t0 + 50 <= t <= t0 + 350)
        if base:
            base_mib = base[len(base) // 2]
            after = [u for t, u in samples if t >= t0]
            smi_delta = max(after) - base_mib
            verdict(smi_delta > 0 and abs(peak - smi_delta) <= 0.05 * smi_delta,
                    f"analysis peak {peak:.0f} MiB vs NVML used max {max(after)} - context baseline {base_mib} = {smi_delta} MiB (within 5 %)")
        else:
            print(f"{name}: no NVML sample in the baseline pause")
    m = re.findall(r"peak_used_delta[= ](\d+) MiB", open(log).read())
    if m:
        own = int(m[-1])
        verdict(own > 0 and abs(peak - own) <= 0.05 * own,
                f"analysis peak {peak:.0f} MiB vs the program's cudaMemGetInfo delta {own} MiB (within 5 %)")
    if name == "hf_trainer":
        verdict(bool(d.get("holders")), f"memory-peak holders: {[(x['location'], x['bytes'] >> 20) for x in d.get('holders') or []]}")
        roles = {r["role"]: r["bytes"] >> 20 for r in d.get("roles") or []}
        verdict(all(roles.get(k, 0) > 0 for k in ("weights", "optimizer_state", "activations")),
                f"memory-peak by what it is for (MiB): {roles}: weights, optimizer state and activations each named")
PYEOF
}
mm pytorch_oom pytorch_oom.py grow $PY examples/pytorch_oom.py
mm leak_loop leak_loop.cu leak build/leak_loop 200
mm mempool_async mempool_async.cu pool-alloc build/mempool_async 16
mm pytorch_expandable pytorch_expandable.py expand env PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True $PY examples/pytorch_expandable.py
mm hf_trainer hf_trainer.py logging_steps $PY examples/hf_trainer.py --steps 20
# (e) Always-on within a 2 MB disk bound: 8 GiB held from the start, 15 s of synchronizing steps
# (the early files are deleted), then the growth until out of memory. The post-mortem should
# still name the held allocation (each rolling file starts with the allocations still live).
log "(memory) always-on OOM after rotation: pytorch_oom.py --hold-gib 8 --warm-s 15, GPUFL_MAX_DISK_MB=2"
GPUFL_MAX_DISK_MB=2 gpufl record --always-on -o "$S/memory-aon" -- $PY examples/pytorch_oom.py --hold-gib 8 --warm-s 15 \
  > "$OUT/memory-aon.log" 2>&1
echo "exit $?" | tee -a "$OUT/summary.txt"
d=$(newest "$S/memory-aon")
if [ -n "$d" ]; then
  ls "$d" | tee -a "$OUT/summary.txt"
  gpufl report "$d" 2>&1 | head -30 | tee -a "$OUT/summary.txt"
  gpufl report --json "$d" > "$MM/aon-report.json" 2>"$MM/aon-report.err"
  $PY - "$MM/aon-report.json" "$d" "$(mm_line pytorch_oom.py grow)" "$(mm_line pytorch_oom.py hold)" <<'PYEOF' 2>&1 | tee -a "$OUT/summary.txt"
import json, os, sys
j = json.load(open(sys.argv[1])); d = sys.argv[2]; grow, hold = int(sys.argv[3]), int(sys.argv[4])
ins = [i for s in j.get("sessions", []) for i in s.get("insights", [])]
first = ins[0] if ins else {}
loc = first.get("location") or {}
h = [(x["location"], x["bytes"] >> 20) for x in (first.get("data") or {}).get("holders") or []]
deleted = not os.path.exists(os.path.join(d, "trace-0000.ndjson.zst"))
ok = (first.get("rule") == "out-of-memory" and loc.get("line") == grow
      and any(l.endswith(f"pytorch_oom.py:{hold}") and mib >= 8 << 10 for l, mib in h) and deleted)
print(f"always-on OOM after rotation: first {first.get('rule')} at line {loc.get('line')} (grow {grow}); "
      f"holders {h[:4]}; held line {hold}; first file deleted {deleted}:", "PASS" if ok else "FAIL")
PYEOF
fi
# (f) The exporter's per-process allocated bytes: a PyTorch job holding 3 GiB (and its step's
# buffers) under `gpufl record`, feeding `gpufl exporter`; /metrics' gpufl_process_memory_allocated_bytes
# against torch.cuda.memory_reserved() printed by the job at the same moment (within 5 %).
log "(memory) exporter: gpufl_process_memory_allocated_bytes vs torch.cuda.memory_reserved()"
MX="$S/memory-exporter"; mkdir -p "$MX"
gpufl exporter --listen 127.0.0.1:9402 --socket "$MX/exporter.sock" 2>"$MX/exporter.err" &
MX_PID=$!
sleep 2
cat >"$MX/hold.py" <<'PYEOF'
import sys, time
import torch
held = torch.empty(3 << 30, dtype=torch.uint8, device="cuda")
x = torch.randn(4096, 4096, device="cuda")
end = time.time() + float(sys.argv[1])
while time.time() < end:
    y = torch.relu(x @ x)
    y.sum().item()
    if int(time.time() * 2) % 2 == 0:
        print(f"hold: t={time.time():.3f} reserved={torch.cuda.memory_reserved()}", flush=True)
    time.sleep(0.05)
PYEOF
GPUFL_EXPORTER_SOCKET="$MX/exporter.sock" gpufl record -o "$MX" -- $PY "$MX/hold.py" 12 >"$MX/job.log" 2>&1 &
MX_JOB=$!
sleep 9
$PY -c "import urllib.request,time;p=urllib.request.urlopen('http://127.0.0.1:9402/metrics').read().decode();print(f'scraped t={time.time():.3f}');print(p)" >"$MX/metrics.txt"
wait $MX_JOB; kill $MX_PID 2>/dev/null; wait $MX_PID 2>/dev/null
$PY - "$MX/metrics.txt" "$MX/job.log" <<'PYEOF' 2>&1 | tee -a "$OUT/summary.txt"
import re, sys
page = open(sys.argv[1]).read(); log = open(sys.argv[2]).read()
t = float(re.search(r"scraped t=([\d.]+)", page).group(1))
got = [float(v) for v in re.findall(r'^gpufl_process_memory_allocated_bytes\{[^}]*\} (\S+)$', page, re.M)]
peak = [float(v) for v in re.findall(r'^gpufl_process_memory_allocated_peak_bytes\{[^}]*\} (\S+)$', page, re.M)]
res = [(float(a), int(b)) for a, b in re.findall(r"hold: t=([\d.]+) reserved=(\d+)", log)]
near = min(res, key=lambda r: abs(r[0] - t)) if res else (0, 0)
print("/metrics:", [l for l in page.splitlines() if l.startswith("gpufl_process_memory")])
ok = len(got) == 1 and near[1] > 0 and abs(got[0] - near[1]) <= 0.05 * near[1]
print(f"exporter allocated bytes {got} vs torch reserved {near[1]} (at {near[0] - t:+.2f} s; peak {peak}): within 5 %:",
      "PASS" if ok else "FAIL")
PYEOF
# Off: --no-mem-records leaves no mem record and the header says so.
log "(memory) leak_loop with --no-mem-records"
gpufl record --no-mem-records -o "$S/memory-off" -- build/leak_loop 20 > "$OUT/memory-off.log" 2>&1
d=$(newest "$S/memory-off")
[ -n "$d" ] && gpufl dump "$d" --type header,mem 2>/dev/null | $PY -c '
import collections, json, sys
r = [json.loads(l) for l in sys.stdin if l.strip()]
c = collections.Counter(x["t"] for x in r)
o = [x.get("options", {}) for x in r if x["t"] == "header"]
ok = c["mem"] == 0 and all(x.get("mem_records") is False for x in o)
print(f"memory-off: records {dict(c)}: no mem record and the header says mem_records false:", "PASS" if ok else "FAIL")' | tee -a "$OUT/summary.txt"
