#!/usr/bin/env bash
# Everything that needs a GPU, in one run on the device machine (H100, CUDA 13, PyTorch, no cargo).
# Binaries come prebuilt in .device-bin/ (scripts/prepare-device-bin.sh). Logs and sessions go to $OUT.
#   usage: bash scripts/gpu-check.sh [phase...]   phases: record api identity kill bench split streams
#   telemetry toggle kernels scopes nvtx frameworks pyoffsets, and those of scripts/gpu-phases/*.sh
#   (default: record api identity kill bench)
set -u
OUT=${OUT:-/tmp/gpufl-out}; mkdir -p "$OUT"
ROOT=$(pwd); BIN="$ROOT/.device-bin"; export PATH="$BIN:$PATH"; export GPUFL_CAPTURE_LIB="$BIN/libgpufl_capture.so"
PY=python3; S="$OUT/sessions"; mkdir -p "$S" build
PHASES=${*:-record api identity kill bench}
has() { case " $PHASES " in *" $1 "*) return 0;; esac; return 1; }
log() { echo "== $*" | tee -a "$OUT/summary.txt"; }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$OUT/gpu.txt"
export PYTHONUNBUFFERED=1

nvcc -g -O2 -lineinfo -o build/stream_sync_loop examples/stream_sync_loop.cu 2>&1 | tail -3
nvcc -g -O2 -lineinfo -o build/two_stream_overlap examples/two_stream_overlap.cu 2>&1 | tail -3
nvcc -g -O2 -lineinfo -I crates/gpufl-capture/include -o build/cpp_api examples/cpp_api.cu \
  -L "$BIN" -lgpufl_capture -Xlinker -rpath -Xlinker "$BIN" 2>&1 | tail -3

show() { # dir label
  local d=$1
  gpufl info "$d" 2>&1 | tee -a "$OUT/summary.txt"
  gpufl dump "$d" --type sync --limit 2 2>&1 | cut -c1-1500 | tee -a "$OUT/summary.txt"
  gpufl dump "$d" --type notice 2>&1 | tee -a "$OUT/summary.txt"
  report "$d"
}
newest() { ls -dt "$1"/*/ 2>/dev/null | head -1; }
report() { gpufl report --color never "$1" 2>&1 | tee -a "$OUT/summary.txt"; }
TAG="(m)"
rec() { # name command...: record, then info / syncs / notices / report
  local name=$1; shift
  case $1 in build/*) [ -x "$1" ] || { log "$TAG $name: skipped, $1 not built"; return; };; esac
  log "$TAG $name: $*"
  gpufl record -o "$S/$name" -- "$@" 2>&1 | tee "$OUT/$name.log"
  show "$(newest "$S/$name")"
}

if has record; then
  log "(a) PyTorch training loop"
  gpufl record -o "$S/a" -- $PY examples/pytorch_train_sync.py --steps 50 --warmup 5 2>&1 | tee "$OUT/a.log"
  show "$(newest "$S/a")"
  log "(a') torch.profiler count of the same run"
  $PY bench/torch_profiler_count.py --steps 50 --warmup 5 2>&1 | tail -2 | tee -a "$OUT/summary.txt"
  log "(a2) PyTorch training loop, GPU-heavy steps (the planted sync blocks most of each step)"
  gpufl record -o "$S/a2" -- $PY examples/pytorch_train_sync_heavy.py --steps 50 --warmup 5 2>&1 | tee "$OUT/a2.log"
  show "$(newest "$S/a2")"
  log "(b) stream_sync_loop"
  gpufl record -o "$S/b" -- build/stream_sync_loop 200 2>&1 | tee "$OUT/b.log"
  show "$(newest "$S/b")"
  log "(c) two_stream_overlap"
  # Two repeats: each repeat ends with one device sync (needed to check its result); three would
  # make that per-repeat sync an "in-loop sync" by the seed's rule (>= 3 syncs from one line).
  gpufl record -o "$S/c" -- build/two_stream_overlap 2 2>&1 | tee "$OUT/c.log"
  show "$(newest "$S/c")"
fi
if has streams; then
  log "(m) streams seed: one planted stream/transfer pitfall per example"
  SX="default_stream_barrier pageable_async_copy blocking_copy device_wide_sync copy_compute_pipeline ping_pong gpu_idle_launch launch_bound"
  for n in $SX; do
    rm -f "build/$n"
    nvcc -g -O2 -lineinfo -o "build/$n" "examples/$n.cu" >"$OUT/nvcc-$n.txt" 2>&1 || { log "compile FAILED: $n"; tail -5 "$OUT/nvcc-$n.txt" | tee -a "$OUT/summary.txt"; }
    rm -f "$OUT/nvcc-$n.txt"
  done
  rec default_stream_barrier build/default_stream_barrier 20
  rec pageable_async_copy build/pageable_async_copy 20
  rec blocking_copy build/blocking_copy 20
  rec device_wide_sync build/device_wide_sync 20
  rec copy_compute_pipeline build/copy_compute_pipeline 1 3
  rec ping_pong build/ping_pong
  rec gpu_idle_launch build/gpu_idle_launch 500
  rec launch_bound build/launch_bound 5000
  rec two_stream_overlap build/two_stream_overlap 2
  for p in item cpu pageable; do rec "pytorch_transfers_$p" $PY examples/pytorch_transfers.py --pattern $p --steps 30; done
  log "(m) pipeline prediction check: copy_compute_pipeline with 1, 2, 4 streams, 5 repeats, no gpufl"
  if [ -x build/copy_compute_pipeline ]; then
    for ns in 1 2 4; do build/copy_compute_pipeline $ns 5 2>&1 | tee -a "$OUT/summary.txt"; done
  fi
fi
if has scopes; then
  # Named scopes + NVTX ranges (examples/pytorch_scopes.py): the syncs of `loss.item()` must roll
  # up under train_step > forward, and the sync insights must say "in scope train_step > forward".
  export PYTHONPATH="$ROOT/python${PYTHONPATH:+:$PYTHONPATH}"
  $PY -c 'import gpufl; print("gpufl package:", gpufl.__file__, "lib:", gpufl.library_path())' 2>&1 | tee -a "$OUT/summary.txt"
  ssum() { # dir: scope records by (source, name)
    gpufl dump "$1" --type scope 2>/dev/null | $PY -c '
import collections, json, sys
r = [json.loads(l) for l in sys.stdin if l.strip()]
c = collections.Counter((x["source"], x["name"], x["depth"]) for x in r if not x.get("end"))
print(f"scope records: {len(r)}; opened (source, name, depth): {sorted(c.items())}")'
  }
  log "(s1) pytorch_scopes.py under gpufl record"
  gpufl record -o "$S/s1" -- $PY examples/pytorch_scopes.py --steps 30 2>&1 | tee "$OUT/s1.log"
  d=$(newest "$S/s1"); ssum "$d" | tee -a "$OUT/summary.txt"
  gpufl dump "$d" --type notice 2>&1 | tee -a "$OUT/summary.txt"; report "$d"
  log "(s2) pytorch_scopes.py in-process (gpufl.init, no gpufl record)"
  GPUFL_LOG_PATH="$S/s2" $PY examples/pytorch_scopes.py --steps 30 --in-process 2>&1 | tee "$OUT/s2.log"
  d=$(newest "$S/s2"); ssum "$d" | tee -a "$OUT/summary.txt"
  gpufl dump "$d" --type notice 2>&1 | tee -a "$OUT/summary.txt"; report "$d"
fi
if has nvtx; then
  # Issue 11: NVTX registered strings resolve to their text; start/end ranges are recorded
  # (examples/nvtx_ranges.cu: registered push/pop names, a range ended on another thread).
  nvcc -g -O2 -lineinfo -o build/nvtx_ranges examples/nvtx_ranges.cu -ldl 2>&1 | tail -3 | tee -a "$OUT/summary.txt"
  rec nvtx_ranges build/nvtx_ranges 20
  d=$(newest "$S/nvtx_ranges")
  gpufl dump "$d" --type scope --limit 6 2>&1 | tee -a "$OUT/summary.txt"
  gpufl dump "$d" --type range --limit 3 2>&1 | tee -a "$OUT/summary.txt"
  echo "registered placeholders: $(gpufl dump "$d" --type scope 2>/dev/null | grep -c '<registered>')" | tee -a "$OUT/summary.txt"
fi
if has telemetry; then
  # NVML telemetry: one sample per GPU every 100 ms. matmul_loop.py: ~5 s of back-to-back bf16
  # matmuls (NVML utilization should be near 100 %), then 1 s of 20 ms host sleeps before small
  # matmuls (low-utilization at its marked line).
  tsum() { # dir: what the telemetry records say (samples, period, utilization, power, clocks, throttle)
    gpufl dump "$1" --type telemetry 2>/dev/null | $PY -c '
import json, sys
r = [json.loads(l) for l in sys.stdin if l.strip()]
if not r:
    print("telemetry: NO samples"); sys.exit()
ts = sorted(x["ts"] for x in r if x["dev"] == r[0]["dev"])
per = sorted(b - a for a, b in zip(ts, ts[1:]))
u = sorted(x["gpu_util"] for x in r if "gpu_util" in x)
pw = [x["power_mw"] / 1000 for x in r if "power_mw" in x]
sm = [x["sm_mhz"] for x in r if "sm_mhz" in x]
th = 0
for x in r:
    th |= x.get("throttle", 0)
top = sum(1 for v in u if v >= 90)
devs = sorted({x["dev"] for x in r})
print(f"telemetry: {len(r)} samples, GPUs {devs}, median period "
      f"{per[len(per)//2]/1e6 if per else 0:.1f} ms; gpu_util max {max(u) if u else None} %, "
      f"{top} samples >= 90 % ({100*top/max(len(u),1):.0f} %); power max {max(pw) if pw else None} W; "
      f"SM {min(sm) if sm else None}-{max(sm) if sm else None} MHz; throttle bits seen {th:#x}; "
      f"fields of the first sample: {sorted(r[0])}")'
  }
  trec() { # name args...: record matmul_loop.py, then info, 5 samples, notices, report, summary
    local name=$1; shift
    log "(t) telemetry $name: $*"
    gpufl record -o "$S/$name" "$@" 2>&1 | tee "$OUT/$name.log"
    local d; d=$(newest "$S/$name")
    [ -n "$d" ] || { log "(t) $name: no session"; return; }
    gpufl info "$d" 2>&1 | tee -a "$OUT/summary.txt"
    gpufl dump "$d" --type telemetry --limit 5 2>&1 | tee -a "$OUT/summary.txt"
    gpufl dump "$d" --type notice 2>&1 | tee -a "$OUT/summary.txt"
    report "$d"
    gpufl report --json "$d" >"$OUT/$name-report.json" 2>&1
    tsum "$d" | tee -a "$OUT/summary.txt"
  }
  trec telemetry -- $PY examples/matmul_loop.py --seconds 5
  trec telemetry-fill -- $PY examples/matmul_loop.py --seconds 2 --fill-memory 0.93
  trec telemetry-20ms --telemetry-ms 20 -- $PY examples/matmul_loop.py --seconds 2
  log "(t) telemetry off (GPUFL_TELEMETRY_MS=0): expect no telemetry records"
  GPUFL_TELEMETRY_MS=0 gpufl record -o "$S/telemetry-off" -- $PY examples/matmul_loop.py --seconds 1 2>&1 | tee "$OUT/telemetry-off.log"
  d=$(newest "$S/telemetry-off"); [ -n "$d" ] && echo "telemetry records with telemetry off: $(gpufl dump "$d" --type telemetry | wc -l)" | tee -a "$OUT/summary.txt"
fi
if has kernels; then
  TAG="(n)"
  log "(n) kernels: gpufl's occupancy against the CUDA runtime's, and one planted kernel pitfall per rule"
  for n in kernel_pitfalls occupancy_check; do
    rm -f "build/$n"
    nvcc -g -O2 -lineinfo -arch=sm_90 -o "build/$n" "examples/$n.cu" >"$OUT/nvcc-$n.txt" 2>&1 || { log "compile FAILED: $n"; tail -5 "$OUT/nvcc-$n.txt" | tee -a "$OUT/summary.txt"; }
    rm -f "$OUT/nvcc-$n.txt"
    # Registers, spill stores / loads and stack frame of each kernel, as ptxas reports them.
    nvcc -g -O2 -lineinfo -arch=sm_90 --resource-usage -c -o /dev/null "examples/$n.cu" >"$OUT/resource-usage-$n.txt" 2>&1
  done
  log "(n) nvcc --resource-usage of kernel_pitfalls.cu"
  grep -E "Function properties|stack frame|Used [0-9]+ registers" "$OUT/resource-usage-kernel_pitfalls.txt" | tee -a "$OUT/summary.txt"
  # What the binary itself declares per function: LOCAL (local arrays) is what CUDA's function
  # attributes and CUPTI's localMemoryPerThread report; spills to the ABI stack count as STACK.
  [ -x build/kernel_pitfalls ] && cuobjdump -res-usage build/kernel_pitfalls 2>&1 | grep -E "Function|REG:" | tee -a "$OUT/summary.txt"
  # The sm_90 cubin itself, for a parser test fixture (crates/gpufl-capture/src/cubin.rs), and its
  # .nv.info attributes (EIATTR_FRAME_SIZE / EIATTR_MAX_STACK_SIZE per function) as cuobjdump reads them.
  if [ -x build/kernel_pitfalls ]; then
    (cd "$OUT" && cuobjdump -xelf all "$ROOT/build/kernel_pitfalls" >/dev/null 2>&1 && ls *.cubin 2>/dev/null | sed 's/^/extracted cubin: /') | tee -a "$OUT/summary.txt"
    cuobjdump -elf build/kernel_pitfalls 2>&1 | grep -E -A3 "EIATTR_(FRAME_SIZE|MAX_STACK_SIZE|MIN_STACK_SIZE)" >"$OUT/nvinfo-stack-kernel_pitfalls.txt"
  fi
  if [ -x build/occupancy_check ]; then
    log "(n) occupancy_check: cudaOccupancyMaxActiveBlocksPerMultiprocessor per (kernel, block, dynamic smem) -> occupancy_h100.jsonl"
    build/occupancy_check >"$OUT/occupancy_h100.jsonl" 2>"$OUT/occupancy_check.log"
    echo "exit $?: $(wc -l <"$OUT/occupancy_h100.jsonl") lines; $(tail -1 "$OUT/occupancy_h100.jsonl")" | tee -a "$OUT/summary.txt"
    head -1 "$OUT/occupancy_h100.jsonl" | tee -a "$OUT/summary.txt"
    grep -c '"error"' "$OUT/occupancy_h100.jsonl" | sed 's/^/lines with an error: /' | tee -a "$OUT/summary.txt"
    log "(n) occupancy_check launch, recorded: each configuration once, with the carveout the driver chose (smem_executed)"
    gpufl record -o "$S/occupancy_check" -- build/occupancy_check launch >"$OUT/occupancy_launch.jsonl" 2>"$OUT/occupancy_launch.log"
    d=$(newest "$S/occupancy_check")
    gpufl info "$d" 2>&1 | tee -a "$OUT/summary.txt"
    gpufl dump "$d" --type kernel >"$OUT/occupancy_kernels.ndjson" 2>&1
    echo "kernel records: $(wc -l <"$OUT/occupancy_kernels.ndjson"); distinct (block, regs, smem_static, smem_dynamic, smem_executed):" | tee -a "$OUT/summary.txt"
    $PY - "$OUT/occupancy_kernels.ndjson" <<'PYEOF' 2>&1 | tee -a "$OUT/summary.txt"
import json, sys, collections
seen = collections.Counter()
for line in open(sys.argv[1]):
    try:
        k = json.loads(line)
    except ValueError:
        continue
    seen[(k["block"][0], k["regs"], k["smem_static"], k["smem_dynamic"], k.get("smem_executed"))] += 1
for key in sorted(seen, key=lambda x: (x[2] + x[3], x[0], x[1])):
    print("  block %4d regs %3d smem %6d+%6d -> executed carveout %s" % (key[0], key[1], key[2], key[3], key[4]))
PYEOF
  fi
  rec kernel_pitfalls build/kernel_pitfalls 20
  d=$(newest "$S/kernel_pitfalls")
  if [ -n "$d" ]; then
    gpufl dump "$d" --type kernel --limit 3 2>&1 | tee -a "$OUT/summary.txt"
    # The stack frames gpufl read from the module's cubin (function records), to set beside
    # cuobjdump -res-usage's STACK above and ptxas' "bytes stack frame".
    log "(n) function records (cubin stack frames) beside cuobjdump -res-usage"
    gpufl dump "$d" --type function 2>&1 | tee -a "$OUT/summary.txt"
    gpufl dump "$d" --type notice 2>&1 | grep -i cubin | tee -a "$OUT/summary.txt"
    gpufl report --json "$d" >"$OUT/kernel_pitfalls_report.json" 2>&1
    log "(n) registers and local memory: gpufl's kernel records against nvcc --resource-usage"
    $PY - "$OUT/kernel_pitfalls_report.json" "$OUT/resource-usage-kernel_pitfalls.txt" <<'PYEOF' 2>&1 | tee -a "$OUT/summary.txt"
import json, re, sys
rows = json.load(open(sys.argv[1]))["sessions"][0].get("kernels", {}).get("rows", [])
text = open(sys.argv[2]).read()
nvcc = {}
# ptxas: "Function properties for _Z10regs_heavyPKfPfi" / "N bytes stack frame, S bytes spill stores, L bytes spill loads" / "Used R registers"
for m in re.finditer(r"Function properties for (\S+)\s+(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads.*?Used (\d+) registers", text, re.S):
    nvcc[m.group(1)] = tuple(int(m.group(i)) for i in (2, 3, 4, 5))
for name in ("regs_heavy", "spills", "small_grid"):
    r = next((r for r in rows if r["name"].startswith(name + "(")), None)
    n = next((v for k, v in nvcc.items() if name in k), None)
    if r is None or n is None:
        print("  %s: missing (gpufl row %s, nvcc %s)" % (name, r is not None, n is not None))
        continue
    # ptxas' stack frame is CUPTI's local memory on older toolkits, the cubin's frame on CUDA 13.
    same = r["launch"]["regs"] == n[3] and n[0] in (r["launch"]["local_mem"], r.get("stack_frame") or 0)
    occ = r.get("occupancy") or {}
    print("  %-10s nvcc: %3d registers, %4d B stack frame (%d B spill stores, %d B loads) | gpufl: %3d registers, %4d B local, %s B stack frame, occupancy %.1f%% (%s), %d blocks x %d threads, %.1f%% of GPU busy  %s"
          % (name, n[3], n[0], n[1], n[2], r["launch"]["regs"], r["launch"]["local_mem"], r.get("stack_frame"), 100 * occ.get("occupancy", 0), ",".join(occ.get("limited_by", [])), r["blocks"], r["threads_per_block"], 100 * r["busy_share"], "same" if same else "DIFFERENT"))
ins = json.load(open(sys.argv[1]))["sessions"][0]["insights"]
for rule in ("low-occupancy", "register-spill", "under-filled-grid"):
    hits = [i for i in ins if i["rule"] == rule]
    print("  %-18s %s" % (rule, "; ".join("%s %s" % (i["severity"], i["title"]) for i in hits) or "NOT RAISED"))
PYEOF
  fi
fi
if has pyoffsets; then
  # The CPython struct offsets pyframes.rs relies on, from the device interpreter's own headers.
  inc=$($PY -c 'import sysconfig; print(sysconfig.get_paths()["include"])')
  log "(p) CPython offsets from $inc"
  gcc -I"$inc" -o build/pyoffsets scripts/probe/pyoffsets.c 2>&1 | tail -3 | tee -a "$OUT/summary.txt"
  [ -x build/pyoffsets ] && build/pyoffsets | tee -a "$OUT/summary.txt"
fi
if has frameworks; then
  # Issue 11: attribution through real frameworks (JAX/XLA worker threads, PyTorch's autograd
  # thread, HuggingFace Trainer and Lightning loops). Each report must name the user's line (JAX,
  # backward) or the library line with the user's call site (Trainer, Lightning).
  $PY -c 'import jax, torch, transformers, accelerate; print("jax", jax.__version__, "torch", torch.__version__, "transformers", transformers.__version__, "accelerate", accelerate.__version__)' 2>&1 | tail -1 | tee -a "$OUT/summary.txt"
  $PY -c 'import lightning; print("lightning", lightning.__version__)' 2>&1 | tail -1 | tee -a "$OUT/summary.txt"
  $PY -c 'import pytorch_lightning; print("pytorch_lightning", pytorch_lightning.__version__)' 2>&1 | tail -1 | tee -a "$OUT/summary.txt"
  fw() { # name command...
    local name=$1; shift
    log "(f) $name: $*"
    local t0; t0=$(date +%s%N)
    gpufl record -o "$S/$name" -- "$@" > "$OUT/$name.log" 2>&1; echo "exit $?" >> "$OUT/$name.log"
    tail -3 "$OUT/$name.log" | tee -a "$OUT/summary.txt"
    echo "wall $(( ($(date +%s%N) - t0) / 1000000 )) ms" | tee -a "$OUT/summary.txt"
    local d; d=$(newest "$S/$name")
    gpufl info "$d" 2>&1 | tee -a "$OUT/summary.txt"
    gpufl dump "$d" --type notice 2>&1 | tee -a "$OUT/summary.txt"
    gpufl dump "$d" --type sync --limit 2 2>&1 | cut -c1-3000 | tee -a "$OUT/summary.txt"
    report "$d"
    gpufl report --json "$d" > "$OUT/fw-$name.json" 2>/dev/null
  }
  fw jax_train $PY examples/jax_train.py --steps ${FW_JAX_STEPS:-100}
  fw pytorch_backward $PY examples/pytorch_backward.py --steps ${FW_BWD_STEPS:-30}
  fw hf_trainer $PY examples/hf_trainer.py --steps ${FW_HF_STEPS:-120}
  fw lightning_fit $PY examples/lightning_fit.py --steps ${FW_PL_STEPS:-150}
  if [ "${FW_SMALL:-1}" = 1 ]; then
    # Short runs of the same programs, small enough to commit under testdata/sessions.
    fw small_jax_train $PY examples/jax_train.py --steps 20 --warmup 2
    fw small_pytorch_backward $PY examples/pytorch_backward.py --steps 8 --warmup 2
    fw small_hf_trainer $PY examples/hf_trainer.py --steps 20
    fw small_lightning_fit $PY examples/lightning_fit.py --steps 30
  fi
  (cd "$OUT" && tar -czf fw-json.tgz fw-*.json && rm -f fw-*.json)
fi
if has api; then
  log "(d) C++ API (gpufl::init/shutdown, no injection)"
  (cd "$S" && mkdir -p d && cd d && "$ROOT/build/cpp_api" 20) 2>&1 | tee "$OUT/d.log"
  show "$(newest "$S/d/gpufl-sessions")"
  log "(e) CUPTI missing"
  GPUFL_CUPTI_LIB=/nonexistent/libcupti.so gpufl record -o "$S/e" -- build/stream_sync_loop 5 2>&1 | tail -4 | tee -a "$OUT/summary.txt"
  log "(f) another profiler holds CUPTI"
  $PY - <<'PYEOF' 2>&1 | tail -5 | tee -a "$OUT/summary.txt"
import ctypes, os, torch
from torch.profiler import profile, ProfilerActivity
x = torch.randn(1024, 1024, device="cuda")
with profile(activities=[ProfilerActivity.CUDA]):
    lib = ctypes.CDLL(os.environ["GPUFL_CAPTURE_LIB"])
    rc = lib.gpufl_init(None)
    y = x @ x; torch.cuda.synchronize()
print("gpufl_init under torch.profiler returned", rc, "; program result", float(y.sum()) != 0)
PYEOF
fi
if has child; then
  log "(j) child processes are recorded too (one session each)"
  gpufl record -o "$S/j" -- $PY -c "import subprocess, sys; [subprocess.run(['build/stream_sync_loop', '20'], check=True) for _ in range(2)]" 2>&1 | tee -a "$OUT/summary.txt"
fi
if has benchpair; then
  log "(k) bare vs gpufl record, ${PAIR_ROUNDS:-8} interleaved pairs, pinned to CPUs 8-15"
  for round in $(seq ${PAIR_ROUNDS:-8}); do
    taskset -c 8-15 $PY bench/launch_bound.py --mode bare --repeat 4
    taskset -c 8-15 gpufl record -q -o "$S/pair" -- $PY bench/launch_bound.py --mode gpufl-full --repeat 4
  done 2>&1 | grep '^{' | tee -a "$OUT/pair.jsonl"
  $PY bench/summarize.py "$OUT/pair.jsonl" | tee -a "$OUT/summary.txt"
fi
if has split; then
  log "(l) where the recorder's cost goes: CPU time per thread, ${SPLIT_ROUNDS:-4} interleaved rounds"
  K="GPUFL_ENABLE_SYNCHRONIZATION=0"; R="gpufl record -q --no-stacks --api-records none -o $S/split --"
  LB="bench/launch_bound.py --steps 200 --repeat ${SPLIT_REPEAT:-6} --mode"
  for round in $(seq ${SPLIT_ROUNDS:-4}); do
    rm -rf $S/split
    $PY $LB bare
    env $K GPUFL_DISCARD=${SPLIT_DISCARD:-1} $R $PY $LB k-discard-${SPLIT_DISCARD:-1}
    env $K $R $PY $LB gpufl-kernels-only
    gpufl record -q -o $S/split -- $PY $LB gpufl-full
    $PY $LB bare-again
  done 2>&1 | grep '^{' | tee -a "$OUT/split.jsonl"
  $PY bench/summarize.py "$OUT/split.jsonl" | tee -a "$OUT/summary.txt"
  for d in $S/split/*/; do gpufl info "$d" 2>&1 | grep -E "command|kernels|warning" | tee -a "$OUT/summary.txt"; done
  rm -rf $S/split
fi
if has toggle; then
  log "(m) in-process A/B: recording on vs paused in one process (bench/launch_bound.py --toggle)"
  T="$S/toggle"; LB="bench/launch_bound.py --steps ${TOGGLE_STEPS:-100} --toggle ${TOGGLE_CYCLES:-12} --mode"
  KO="GPUFL_ENABLE_SYNCHRONIZATION=0"; KR="gpufl record -q --no-stacks --api-records none --no-host-samples --hostcall-us 0 -o $T --"
  MODES=${TOGGLE_MODES:-"bare gpufl-full gpufl-no-sites gpufl-kernels-only cupti-kernels-discard"}
  run_toggle() {
    case $1 in
      bare) $PY $LB bare ;;
      gpufl-full) gpufl record -q -o $T -- $PY $LB $1 ;;
      gpufl-no-host) gpufl record -q --no-host-samples --hostcall-us 0 -o $T -- $PY $LB $1 ;;
      gpufl-no-mem) gpufl record -q --no-mem-records -o $T -- $PY $LB $1 ;;
      always-on-no-host) gpufl record -q --always-on --no-host-samples --hostcall-us 0 -o $T -- $PY $LB $1 ;;
      gpufl-always-on) gpufl record -q --always-on -o $T -- $PY $LB $1 ;;
      always-on-no-sites) GPUFL_SITE_STACKS=0 gpufl record -q --always-on -o $T -- $PY $LB $1 ;;
      always-on-runtime-sites) GPUFL_SITE_DOMAINS=runtime gpufl record -q --always-on -o $T -- $PY $LB $1 ;;
      torch-profiler) $PY $LB torch-profiler ;;
      gpufl-no-sites) GPUFL_SITE_STACKS=0 gpufl record -q -o $T -- $PY $LB $1 ;;
      gpufl-no-api) gpufl record -q --api-records none -o $T -- $PY $LB $1 ;;
      gpufl-api-cb) GPUFL_API_FROM=callbacks gpufl record -q -o $T -- $PY $LB $1 ;;
      gpufl-api-runtime) GPUFL_API_DOMAINS=runtime gpufl record -q -o $T -- $PY $LB $1 ;;
      gpufl-api-discard) GPUFL_API_DISCARD=1 gpufl record -q -o $T -- $PY $LB $1 ;;
      gpufl-kernels-only) env $KO $KR $PY $LB $1 ;;
      kernels-shared-buffers) env $KO GPUFL_PER_THREAD_BUFFERS=0 $KR $PY $LB $1 ;;
      kernels-kind-only) env $KO GPUFL_ACTIVITY_KINDS=kernels $KR $PY $LB $1 ;;
      cupti-kernels-discard) env $KO GPUFL_ACTIVITY_KINDS=kernels GPUFL_DISCARD=1 $KR $PY $LB $1 ;;
      hwtrace-kernels-discard) env $KO GPUFL_HW_TRACE=1 GPUFL_ACTIVITY_KINDS=kernels GPUFL_DISCARD=1 $KR $PY $LB $1 ;;
      shared-buffers-kernels-discard) env $KO GPUFL_PER_THREAD_BUFFERS=0 GPUFL_ACTIVITY_KINDS=kernels GPUFL_DISCARD=1 $KR $PY $LB $1 ;;
      hwtrace-kernels-only) env $KO GPUFL_HW_TRACE=1 $KR $PY $LB $1 ;;
      sites-runtime-only) GPUFL_SITE_DOMAINS=runtime gpufl record -q -o $T -- $PY $LB $1 ;;
      cupti-kernels-discard-tid-default) env $KO GPUFL_THREAD_ID_TYPE=default GPUFL_ACTIVITY_KINDS=kernels GPUFL_DISCARD=1 $KR $PY $LB $1 ;;
      cupti-nothing) env $KO GPUFL_ACTIVITY_KINDS=none GPUFL_TELEMETRY_MS=0 $KR $PY $LB $1 ;;
      cupti-memcpy-discard) env $KO GPUFL_ACTIVITY_KINDS=memcpy GPUFL_DISCARD=1 $KR $PY $LB $1 ;;
      sites-copies-only) GPUFL_SITE_KINDS=copy gpufl record -q -o $T -- $PY $LB $1 ;;
    esac
  }
  for round in $(seq ${TOGGLE_ROUNDS:-2}); do
    order=$MODES; [ $((round % 2)) = 0 ] && order=$(echo $MODES | tr ' ' '\n' | tac | tr '\n' ' ')
    for m in $order; do run_toggle $m; done
  done 2>&1 | grep '^{' | tee -a "$OUT/toggle.jsonl"
  $PY bench/summarize_toggle.py "$OUT/toggle.jsonl" | tee -a "$OUT/summary.txt"
  for d in $T/*/; do gpufl dump "$d" --type notice 2>/dev/null | grep -i "hardware\|HWTrace" | head -1; done | sort | uniq -c | tee -a "$OUT/summary.txt"
  d=$(ls -dt $T/*/ | tail -1)
  gpufl dump "$d" --type capture --limit 4 2>&1 | tee -a "$OUT/summary.txt"
  for d in $T/*/; do gpufl dump "$d" --type notice 2>/dev/null | grep -h -e "stack capture" -e "budget" | cut -c1-300; done | tail -4 | tee -a "$OUT/summary.txt"
  gpufl report --color never "$d" 2>&1 | grep -E "GPU [0-9]|paused" | tee -a "$OUT/summary.txt"
  rm -rf $T
fi
if has identity; then
  log "(g) output identity with and without gpufl record"
  for cmd in "build/stream_sync_loop 50" "$PY examples/pytorch_train_sync.py --steps 10 --warmup 2"; do
    $cmd >"$OUT/id.o1" 2>"$OUT/id.e1"; r1=$?
    gpufl record -q -o "$S/id" -- $cmd >"$OUT/id.o2" 2>"$OUT/id.e2"; r2=$?
    if cmp -s "$OUT/id.o1" "$OUT/id.o2" && cmp -s "$OUT/id.e1" "$OUT/id.e2" && [ $r1 = $r2 ]; then
      echo "identical stdout, stderr, exit code ($r1): $cmd" | tee -a "$OUT/summary.txt"
    else echo "DIFFERENT ($r1 vs $r2): $cmd" | tee -a "$OUT/summary.txt"; diff "$OUT/id.e1" "$OUT/id.e2" | head; fi
  done
fi
if has kill; then
  log "(h) SIGKILL mid-run"
  gpufl record -o "$S/k" -- $PY examples/pytorch_train_sync.py --steps 100000 --warmup 0 >"$OUT/k.log" 2>&1 &
  sleep 12
  pid=$(pgrep -f "pytorch_train_sync.py --steps 100000" | head -1)
  kill -9 "$pid"; killed_at=$(date +%s.%N); wait
  echo "killed pid $pid at $killed_at (Unix s)" | tee -a "$OUT/summary.txt"
  gpufl info "$(newest "$S/k")" 2>&1 | tee -a "$OUT/summary.txt"
fi
if has bench; then
  log "(i) overhead on the launch-bound loop (bench/launch_bound.py, interleaved rounds)"
  B="$S/bench"; mkdir -p "$B"
  R=${BENCH_ROUNDS:-8}; LB="bench/launch_bound.py --steps ${BENCH_STEPS:-200} --repeat ${BENCH_REPEAT:-8} --mode"
  # One process per mode per round; the order of the modes is reversed every other round so that
  # drift within a round cancels (bare runs first in odd rounds, last in even ones).
  # Modes: BENCH_MODES (default below); torch.profiler every BENCH_PROFILER_EVERY-th round.
  MODES=${BENCH_MODES:-"bare gpufl-full gpufl-no-sites gpufl-no-api gpufl-kernels-only bare-again"}
  run_mode() {
    case $1 in
      bare|bare-again) $PY $LB $1 ;;
      gpufl-full) gpufl record -q -o "$B/full" -- $PY $LB $1 ;;
      gpufl-no-sites) GPUFL_SITE_STACKS=0 gpufl record -q -o "$B/nosites" -- $PY $LB $1 ;;
      gpufl-no-api) gpufl record -q --api-records none -o "$B/noapi" -- $PY $LB $1 ;;
      gpufl-api-cb) GPUFL_API_FROM=callbacks gpufl record -q -o "$B/apicb" -- $PY $LB $1 ;;
      gpufl-no-telemetry) GPUFL_TELEMETRY_MS=0 gpufl record -q -o "$B/notel" -- $PY $LB $1 ;;
      gpufl-kernels-only) GPUFL_ENABLE_SYNCHRONIZATION=0 gpufl record -q --no-stacks --api-records none -o "$B/kern" -- $PY $LB $1 ;;
      torch-profiler) $PY $LB torch-profiler --profiler ;;
    esac
  }
  for round in $(seq $R); do
    echo "{\"round\": $round}"
    order=$MODES; [ $((round % 2)) = 0 ] && order=$(echo $MODES | tr ' ' '\n' | tac | tr '\n' ' ')
    for m in $order; do run_mode $m; done
    if [ "${BENCH_PROFILER:-1}" = 1 ] && [ $((round % ${BENCH_PROFILER_EVERY:-3})) = 1 ]; then run_mode torch-profiler; fi
    [ "$round" -lt "$R" ] && rm -rf "$B/full" "$B/kern" "$B/nosites" "$B/noapi" "$B/notel"
  done 2>&1 | grep '^{' | tee -a "$OUT/bench.jsonl"
  $PY bench/summarize.py "$OUT/bench.jsonl" | tee -a "$OUT/summary.txt"
  for d in "$B"/*/*/; do gpufl dump "$d" --type notice 2>/dev/null | grep -h -e "stack capture" -e "telemetry:" ; done | tee -a "$OUT/summary.txt"
  for m in full nosites noapi kern; do [ -d "$B/$m" ] || continue; f=$(ls "$B"/$m/*/*/trace-0000.ndjson.zst | head -1)
    gpufl info "$(dirname "$f")" | grep -E "kernels|api records" | tee -a "$OUT/summary.txt"
    k=$(gpufl info "$(dirname "$f")" | grep -o '[0-9]* kernels' | head -1 | cut -d' ' -f1)
    b=$(stat -c %s "$f")
    echo "bytes on disk ($m): $b for $k kernels = $(( b / (k > 0 ? k : 1) )) bytes per kernel record (all records included)" | tee -a "$OUT/summary.txt"; done
fi
# Phases kept in their own files: scripts/gpu-phases/<phase>.sh, sourced when named (same helpers).
for f in scripts/gpu-phases/*.sh; do [ -e "$f" ] || continue; p=$(basename "$f" .sh); if has "$p"; then . "$f"; fi; done
rm -rf "$S/bench" "$S/k"; tar -C "$OUT" -czf "$OUT/sessions.tgz" sessions 2>/dev/null && rm -rf "$S"
cat "$OUT"/*.log > "$OUT/logs.txt" 2>/dev/null; rm -f "$OUT"/*.log "$OUT"/id.* "$OUT/gpu.txt"
log "done"
