# Phase hostgaps (sourced by scripts/gpu-check.sh): what the host was doing while the GPU waited
# (issue 35): `hostcall` records (CUDA calls that held their thread ≥ 20 µs, with their stack) and
# the host sampler's `hsample` records, on one GPU, for the programs of the issue's acceptance:
#   (a) malloc_free_loop: examples/malloc_free_loop.cu, cudaMalloc + kernel + cudaFree x 300;
#   (b) pytorch_empty_cache: examples/pytorch_empty_cache.py, torch.cuda.empty_cache() per step;
#   (c) pytorch_numpy_prep: examples/pytorch_numpy_prep.py, ~5 ms of NumPy per step on the main
#       thread before feeding the GPU;
#   (f) jax_recompile: examples/jax_recompile.py, a jit step recompiled at each new batch shape;
#   (g) hf_generate: examples/hf_generate.py, HuggingFace generate() on a small random GPT-2.
# Each under `gpufl record` into $S/hostgaps-<name>/ (rec: info, 2 syncs, the notices — the host
# sampler's and the hostcalls' closing notices among them — and `gpufl report`), then
# `gpufl dump --type hostcall --limit 5`, `gpufl dump --type hsample --limit 5`, and the checks of
# scripts/gpu-phases/lib/hostgaps_checks.py (summary of the records, PASS/FAIL of what each program
# plants); `gpufl report --json` into $S/hostgaps-json/ (in sessions.tgz).
# Knobs: HG_HZ (host samples per second, default: the recorder's), HG_PY_STEPS (default 100).
# ~2-3 minutes on the H100 machine (torch, jax and transformers imports dominate).
HG="$S/hostgaps-json"; mkdir -p "$HG" build
log "(hostgaps) host time: hostcall and hsample records"
rm -f build/malloc_free_loop
nvcc -g -O2 -lineinfo -o build/malloc_free_loop examples/malloc_free_loop.cu >"$HG/nvcc.txt" 2>&1 \
  || { log "compile FAILED: malloc_free_loop"; tail -5 "$HG/nvcc.txt" | tee -a "$OUT/summary.txt"; }
HG_OPTS=""; [ -n "${HG_HZ:-}" ] && HG_OPTS="--host-samples $HG_HZ"
hg_line() { grep -n "gpufl-example: $2\$" "examples/$1" | head -1 | cut -d: -f1; }
hg() { # name marker-file marker check command...: record, show, dump, check
  local name=$1 mfile=$2 marker=$3 check=$4; shift 4
  local t0; t0=$(date +%s%N)
  log "(hostgaps) $name: $*"
  gpufl record $HG_OPTS -o "$S/hostgaps-$name" -- "$@" > "$OUT/hostgaps-$name.log" 2>&1
  echo "exit $? · wall $(( ($(date +%s%N) - t0) / 1000000 )) ms" | tee -a "$OUT/summary.txt"
  tail -3 "$OUT/hostgaps-$name.log" | tee -a "$OUT/summary.txt"
  local d; d=$(newest "$S/hostgaps-$name")
  [ -n "$d" ] || { log "(hostgaps) $name: no run directory"; return; }
  show "$d"
  gpufl dump "$d" --type hostcall --limit 5 2>&1 | cut -c1-1500 | tee -a "$OUT/summary.txt"
  gpufl dump "$d" --type hsample --limit 5 2>&1 | cut -c1-1500 | tee -a "$OUT/summary.txt"
  gpufl report --json "$d" > "$HG/$name-report.json" 2>"$HG/$name-report.err"
  local line; line=$(hg_line "$mfile" "$marker")
  echo "(hostgaps) $name: marker $marker at examples/$mfile:$line" | tee -a "$OUT/summary.txt"
  gpufl dump "$d" --type header,hostcall,hsample 2>/dev/null \
    | $PY scripts/gpu-phases/lib/hostgaps_checks.py "$name" "$mfile" "$line" "$check" "${HG_FRAG:-}" 2>&1 \
    | tee -a "$OUT/summary.txt"
  # The report's insights naming the marked line (what the analysis makes of the records).
  $PY - "$HG/$name-report.json" "$mfile" "$line" <<'PYEOF' 2>&1 | tee -a "$OUT/summary.txt"
import json, sys
path, mfile, line = sys.argv[1], sys.argv[2], int(sys.argv[3] or 0)
try:
    j = json.load(open(path))
except Exception as e:
    print(f"no JSON report ({e})"); sys.exit()
for s in j.get("sessions", []):
    ins = s.get("insights", [])
    print(f"{s.get('session', '?').rsplit('/', 1)[-1]}: {len(ins)} insights:",
          [(i["rule"], i["severity"], (i.get("location") or {}).get("file", "").rsplit("/", 1)[-1],
            (i.get("location") or {}).get("line")) for i in ins][:8])
    for i in ins:
        loc = i.get("location") or {}
        if loc.get("file", "").endswith(mfile) and loc.get("line") == line:
            print(f"  at the marked line: {i['rule']} {i['severity']} {i['title'][:200]}")
PYEOF
}
hg malloc_free_loop malloc_free_loop.cu blocking-call blocking-call build/malloc_free_loop 300
hg pytorch_empty_cache pytorch_empty_cache.py blocking-call blocking-call $PY examples/pytorch_empty_cache.py --steps ${HG_PY_STEPS:-100}
hg pytorch_numpy_prep pytorch_numpy_prep.py host-prep host-line $PY examples/pytorch_numpy_prep.py --steps ${HG_PY_STEPS:-100}
hg jax_recompile jax_recompile.py recompile compile $PY examples/jax_recompile.py --steps 60
HG_FRAG=transformers/ hg hf_generate hf_generate.py generate frames-in $PY examples/hf_generate.py
# Host samples off and hostcalls off: the header says so, no record of either kind.
log "(hostgaps) malloc_free_loop with --no-host-samples --hostcall-us 0"
gpufl record --no-host-samples --hostcall-us 0 -o "$S/hostgaps-off" -- build/malloc_free_loop 50 > "$OUT/hostgaps-off.log" 2>&1
d=$(newest "$S/hostgaps-off")
[ -n "$d" ] && gpufl dump "$d" --type header,hostcall,hsample 2>/dev/null | $PY -c '
import collections, json, sys
r = [json.loads(l) for l in sys.stdin if l.strip()]
c = collections.Counter(x["t"] for x in r)
o = [x.get("options", {}) for x in r if x["t"] == "header"]
ok = c["hostcall"] == 0 and c["hsample"] == 0 and all(x.get("host_samples_hz") == 0 and x.get("hostcall_us") == 0 for x in o)
print(f"hostgaps-off: records {dict(c)}, options {o}: no host records and the header says 0:", "PASS" if ok else "FAIL")' | tee -a "$OUT/summary.txt"
