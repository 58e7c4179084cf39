# Phase hostgaps_ddp (sourced by scripts/gpu-check.sh; 2 GPUs): the straggler's host line from
# its host samples (issue 35, acceptance (d) and (e)). examples/ddp_straggler.py under
# `gpufl record -- torchrun --nproc_per_node=2`:
#   (d) ddp-host: --mode host --straggle-ms 20 (rank 1 spends ~20 ms of host work per step on the
#       line marked `straggler`, which makes no CUDA call);
#   (e) ddp-gpu: --mode gpu (rank 1 runs 16 extra chained matmuls per step, launched on the line
#       marked `extra-gpu-work`).
# Per run: the run report (text into summary.txt, JSON into $S/hostgaps-ddp-json/), the
# collective-wait insight (late rank, location, data), and per rank session the hostcall / hsample
# summary of scripts/gpu-phases/lib/hostgaps_checks.py: rank 1's samples on a CPU at the
# straggler line (d), rank 1's launch call sites at the extra work's line (e).
# Knobs: DDP_STEPS (default 50). ~2 minutes.
HGD="$S/hostgaps-ddp-json"; mkdir -p "$HGD"
NGPU=$(nvidia-smi -L 2>/dev/null | wc -l)
if [ "$NGPU" -lt 2 ]; then
  log "(hostgaps_ddp) skipped: $NGPU GPU(s), the phase needs 2"
else
  L_HOST=$(grep -n "# gpufl-example: host-work\$" examples/ddp_straggler.py | head -1 | cut -d: -f1)
  L_GPU=$(grep -n "# gpufl-example: extra-gpu-work\$" examples/ddp_straggler.py | head -1 | cut -d: -f1)
  echo "ddp_straggler.py: host work at line $L_HOST, extra GPU work at line $L_GPU" | tee -a "$OUT/summary.txt"
  hgd_run() { # name line check args...
    local name=$1 line=$2 check=$3; shift 3
    log "(hostgaps_ddp) $name: gpufl record -- torchrun --nproc_per_node=2 examples/ddp_straggler.py $* --steps ${DDP_STEPS:-50}"
    local t0; t0=$(date +%s%N)
    gpufl record -o "$S/hostgaps-$name" -- torchrun --nproc_per_node=2 examples/ddp_straggler.py \
      "$@" --steps "${DDP_STEPS:-50}" > "$OUT/hostgaps-$name.log" 2>&1
    echo "exit $? · wall $(( ($(date +%s%N) - t0) / 1000000 )) ms" | tee -a "$OUT/summary.txt"
    tail -4 "$OUT/hostgaps-$name.log" | tee -a "$OUT/summary.txt"
    local rd; rd=$(newest "$S/hostgaps-$name")
    [ -n "$rd" ] || { log "(hostgaps_ddp) $name: no run directory"; return; }
    gpufl info "$rd" 2>&1 | head -20 | tee -a "$OUT/summary.txt"
    gpufl report --color never "$rd" 2>&1 | head -80 | tee -a "$OUT/summary.txt"
    gpufl report --json "$rd" > "$HGD/$name-report.json" 2>"$HGD/$name-report.err"
    for sd in "$rd"/*/; do
      local rank; rank=$(gpufl dump "$sd" --type header 2>/dev/null | $PY -c 'import json,sys; print(json.loads(sys.stdin.readline()).get("rank"))' 2>/dev/null)
      [ "$rank" = "None" ] && continue
      gpufl dump "$sd" --type notice 2>/dev/null | grep -e "host samples" -e "hostcalls" | cut -c1-400 | tee -a "$OUT/summary.txt"
      local c=none; [ "$rank" = 1 ] && c=$check
      gpufl dump "$sd" --type header,hostcall,hsample,callsite 2>/dev/null \
        | $PY scripts/gpu-phases/lib/hostgaps_checks.py "$name-rank$rank" ddp_straggler.py "$line" "$c" 2>&1 \
        | tee -a "$OUT/summary.txt"
    done
    $PY - "$HGD/$name-report.json" "$name" "$line" <<'PYEOF' 2>&1 | tee -a "$OUT/summary.txt"
import json, sys
path, name, line = sys.argv[1], sys.argv[2], int(sys.argv[3] or 0)
try:
    j = json.load(open(path))
except Exception as e:
    print(f"{name}: no JSON report ({e})"); sys.exit()
run = j.get("run") or {}
cw = [i for i in run.get("insights", []) if i["rule"] == "collective-wait"]
for i in cw:
    d, loc = i.get("data", {}), i.get("location") or {}
    print(f"{name}: collective-wait {i['severity']} {i['title'][:200]}")
    print(f"    late rank {d.get('late_rank')}, median late {(d.get('median_late_ns') or 0) / 1e6:.2f} ms, "
          f"at {loc.get('file')}:{loc.get('line')}; data keys {sorted(d)}")
ok = any(i.get("data", {}).get("late_rank") == 1 for i in cw)
print(f"{name}: collective-wait names rank 1:", "PASS" if ok else "FAIL")
at = any((i.get("location") or {}).get("file", "").endswith("ddp_straggler.py")
         and (i.get("location") or {}).get("line") == line for i in cw)
print(f"{name}: collective-wait at ddp_straggler.py:{line} (the analysis's part of issue 35):", "PASS" if at else "FAIL")
PYEOF
  }
  hgd_run ddp-host "$L_HOST" host-line --mode host --straggle-ms 20
  hgd_run ddp-gpu "$L_GPU" launch-line --mode gpu
fi
