# Phase ddp (sourced by scripts/gpu-check.sh): a 2-rank DDP job over NCCL under gpufl record
# (issue 16, runs). examples/ddp_straggler.py with --straggle-ms 4 (rank 1 does 4 ms of host work
# before each step) and its balanced twin (--straggle-ms 0), each under
# `gpufl record -- torchrun --nproc_per_node=2`. Per run: the run directory (run.json, one session
# per process), each session's rank fields, the run report (text and JSON). Checks: the straggler
# run raises collective-wait naming rank 1 and the line of its host work (the stretch before
# `out = model(x)`); no communication kernel is called under-filled (or low-occupancy / launch-bound)
# in any session; the balanced run raises no collective-wait. Needs 2 GPUs. ~2 minutes.
# Files in $OUT/ddp/: <name>.log (the job's output), <name>-report.txt, <name>-report.json.
DDP="$OUT/ddp"; mkdir -p "$DDP"
NGPU=$(nvidia-smi -L 2>/dev/null | wc -l)
if [ "$NGPU" -lt 2 ]; then
  log "(ddp) skipped: $NGPU GPU(s), the DDP phase needs 2"
else
  $PY -c 'import torch, torch.distributed as d; print("torch", torch.__version__, "nccl", torch.cuda.nccl.version(), "gpus", torch.cuda.device_count())' 2>&1 | tail -1 | tee -a "$OUT/summary.txt"
  SCRIPT_LINE_STRAGGLE=$(grep -n "# gpufl-example: straggler" examples/ddp_straggler.py | head -1 | cut -d: -f1)
  SCRIPT_LINE_FORWARD=$(grep -nE "^ +out = model\(x\)" examples/ddp_straggler.py | head -1 | cut -d: -f1)
  echo "ddp_straggler.py: host work at line $SCRIPT_LINE_STRAGGLE, forward at line $SCRIPT_LINE_FORWARD" | tee -a "$OUT/summary.txt"
  ddp_run() { # name straggle_ms
    local name=$1 ms=$2
    log "(ddp) $name: gpufl record -o \$S/$name -- torchrun --nproc_per_node=2 examples/ddp_straggler.py --straggle-ms $ms --steps ${DDP_STEPS:-50}"
    local t0; t0=$(date +%s%N)
    # DDP_RECORD_FLAGS: more `gpufl record` flags, e.g. "--always-on" (with
    # GPUFL_WINDOW_PERIOD_MS=500: a detach of CUPTI every 0.5 s in each rank).
    gpufl record ${DDP_RECORD_FLAGS:-} -o "$S/$name" -- torchrun --nproc_per_node=2 examples/ddp_straggler.py \
      --straggle-ms "$ms" --steps "${DDP_STEPS:-50}" >"$DDP/$name.log" 2>&1
    echo "exit $? · wall $(( ($(date +%s%N) - t0) / 1000000 )) ms" | tee -a "$OUT/summary.txt"
    tail -4 "$DDP/$name.log" | tee -a "$OUT/summary.txt"
    local rd; rd=$(newest "$S/$name")
    [ -n "$rd" ] || { log "(ddp) $name: no run directory"; return; }
    echo "run directory: $rd" | tee -a "$OUT/summary.txt"
    ls "$rd" | tee -a "$OUT/summary.txt"
    cat "$rd/run.json" 2>&1 | tee -a "$OUT/summary.txt"
    for sd in "$rd"/*/; do
      gpufl dump "$sd" --type header 2>/dev/null | $PY -c '
import json, sys
for l in sys.stdin:
    h = json.loads(l)
    print(f"  {h[\"session_id\"]}: pid {h[\"pid\"]} ppid {h[\"ppid\"]} rank {h.get(\"rank\")} local_rank {h.get(\"local_rank\")} world_size {h.get(\"world_size\")} run_id {h.get(\"run_id\")}")
    break' | tee -a "$OUT/summary.txt"
    done
    gpufl report --color never "$rd" >"$DDP/$name-report.txt" 2>&1
    head -60 "$DDP/$name-report.txt" | tee -a "$OUT/summary.txt"
    gpufl report --json "$rd" >"$DDP/$name-report.json" 2>"$DDP/$name-report.err"
  }
  ddp_run ddp-straggle 4
  ddp_run ddp-balanced 0
  log "(ddp) checks"
  $PY - "$DDP" "$SCRIPT_LINE_STRAGGLE" "$SCRIPT_LINE_FORWARD" <<'PYEOF' 2>&1 | tee -a "$OUT/summary.txt"
import json, sys
ddp, straggle_line, forward_line = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
def load(name):
    try:
        return json.load(open(f"{ddp}/{name}-report.json"))
    except Exception as e:
        print(f"{name}: no JSON report ({e})")
        return None
def comm_flagged(j):
    out = []
    for s in j.get("sessions", []):
        for i in s.get("insights", []):
            if i["rule"] in ("under-filled-grid", "low-occupancy", "launch-bound") and "nccl" in i["title"].lower():
                out.append(f'{s["session"].rsplit("/", 1)[-1]}: {i["rule"]} {i["title"]}')
    return out
for name, want in (("ddp-straggle", True), ("ddp-balanced", False)):
    j = load(name)
    if j is None:
        continue
    run = j.get("run") or {}
    ranks = [(r.get("rank"), r.get("gpu", {}).get("index"), r.get("comm_kernels")) for r in run.get("ranks", [])]
    print(f"{name}: {run.get('processes')} processes, ranks (rank, gpu, comm kernels) {ranks}, "
          f"folded {run.get('without_cuda_work')}, clock {run.get('clock')}")
    cw = [i for i in run.get("insights", []) if i["rule"] == "collective-wait"]
    for i in cw:
        d = i.get("data", {})
        loc = i["location"]
        print(f"  collective-wait: {i['severity']} {i['title']}")
        print(f"    late rank {d.get('late_rank')}, median late {d.get('median_late_ns', 0)/1e6:.2f} ms, "
              f"wait share {d.get('wait_share', 0):.2f}, host gap {(d.get('host_gap_median_ns') or 0)/1e6:.2f} ms, "
              f"at {loc.get('file')}:{loc.get('line')} (before: {(d.get('gap_before') or {}).get('line')})")
    flagged = comm_flagged(j)
    for f in flagged:
        print("  communication kernel flagged:", f)
    if want:
        ok = (len(cw) == 1 and cw[0]["data"]["late_rank"] == 1
              and cw[0]["location"]["file"].endswith("ddp_straggler.py")
              and cw[0]["location"]["line"] == forward_line)
        # The host work (straggle_line) runs in the stretch that ends at the forward line.
        print(f"{name}: straggler named (rank 1, the stretch before line {forward_line}, which holds line {straggle_line}):", "PASS" if ok else "FAIL")
    else:
        print(f"{name}: no collective-wait:", "PASS" if not cw else "FAIL")
    print(f"{name}: no communication kernel in the kernel rules:", "PASS" if not flagged else "FAIL")
PYEOF
fi
