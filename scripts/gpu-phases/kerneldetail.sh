# Phase kerneldetail (sourced by scripts/gpu-check.sh): groundwork for issue 19 (inside the kernel).
# 1. Builds examples/kernel_detail.cu (-lineinfo) and runs it bare (its checksum line).
# 2. The reference figures from Nsight Compute for each planted kernel and its clean twin, one
#    kernel launch each (`ncu --launch-count 1 -k NAME`): branch efficiency
#    (sm__sass_average_branch_targets_threads_uniform.pct), active threads per executed warp
#    instruction (smsp__thread_inst_executed_per_inst_executed.ratio), global load sectors and
#    requests (l1tex__t_sectors/requests_pipe_lsu_mem_global_op_ld.sum), shared-load bank
#    conflicts and wavefronts (l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_ld.sum,
#    l1tex__data_pipe_lsu_wavefronts_mem_shared_op_ld.sum); CSV in $OUT/kerneldetail/ncu.csv, a
#    table in the summary. The metric names ncu knows for this chip that match are listed first
#    (`ncu --query-metrics`), so that a renamed metric shows up in the log.
# 3. `gpufl record` of the example (all kernels, 20 iterations) with its report, the session copied
#    to $OUT/testdata/.
# ~1-2 minutes on the H100 machine.
KD="$OUT/kerneldetail"; mkdir -p "$KD" "$OUT/testdata"
log "(kd) kernel_detail: planted divergence, strided loads, bank conflicts and their clean twins"
rm -f build/kernel_detail
nvcc -g -O2 -lineinfo -o build/kernel_detail examples/kernel_detail.cu >"$KD/nvcc.txt" 2>&1 \
  || { log "compile FAILED: kernel_detail"; tail -5 "$KD/nvcc.txt" | tee -a "$OUT/summary.txt"; }
if [ -x build/kernel_detail ]; then
  build/kernel_detail 5 2>&1 | tee -a "$OUT/summary.txt"
  NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
  METRICS="sm__sass_average_branch_targets_threads_uniform.pct,smsp__thread_inst_executed_per_inst_executed.ratio,l1tex__t_sectors_pipe_lsu_mem_global_op_ld.sum,l1tex__t_requests_pipe_lsu_mem_global_op_ld.sum,l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_ld.sum,l1tex__data_pipe_lsu_wavefronts_mem_shared_op_ld.sum"
  [ -n "${KD_NO_NCU:-}" ] && NCU=""
  if [ -n "$NCU" ]; then
    echo "ncu: $NCU ($("$NCU" --version 2>&1 | tail -1))" | tee -a "$OUT/summary.txt"
    "$NCU" --query-metrics 2>/dev/null \
      | grep -E "branch_targets_threads_uniform|thread_inst_executed_per_inst_executed|t_sectors_pipe_lsu_mem_global_op_ld|t_requests_pipe_lsu_mem_global_op_ld|bank_conflicts_pipe_lsu_mem_shared_op_ld|wavefronts_mem_shared_op_ld" \
      | cut -c1-160 | head -20 >"$KD/query.txt"
    cat "$KD/query.txt" | tee -a "$OUT/summary.txt"
    : >"$KD/ncu.csv"
    for k in divergent uniform strided_load coalesced_load bank_conflict padded_shared; do
      timeout 120 "$NCU" --csv --launch-count 1 -k "$k" --metrics "$METRICS" build/kernel_detail 1 all \
        >"$KD/ncu-$k.csv" 2>"$KD/ncu-$k.err"
      echo "ncu $k: exit $?" | tee -a "$OUT/summary.txt"
      grep '^"' "$KD/ncu-$k.csv" >>"$KD/ncu.csv"
      tail -3 "$KD/ncu-$k.err" | tee -a "$OUT/summary.txt"
    done
    $PY - "$KD/ncu.csv" <<'PYEOF' 2>&1 | tee -a "$OUT/summary.txt"
import csv, sys
rows = [r for r in csv.reader(open(sys.argv[1])) if r]
head = next((r for r in rows if "Metric Name" in r), None)
if head is None:
    print("ncu: no metric rows"); sys.exit()
ki, mi, vi = head.index("Kernel Name"), head.index("Metric Name"), head.index("Metric Value")
vals = {}
for r in rows:
    if r is head or r == head or len(r) <= vi:
        continue
    try:
        vals.setdefault(r[ki].split("(")[0], {})[r[mi]] = float(r[vi].replace(",", ""))
    except ValueError:
        pass
print("| kernel | branch efficiency % | threads per warp instruction | global ld sectors / request | shared ld bank conflicts / wavefronts |")
print("|---|---|---|---|---|")
for k, m in vals.items():
    sec = m.get("l1tex__t_sectors_pipe_lsu_mem_global_op_ld.sum")
    req = m.get("l1tex__t_requests_pipe_lsu_mem_global_op_ld.sum")
    bc = m.get("l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_ld.sum")
    wf = m.get("l1tex__data_pipe_lsu_wavefronts_mem_shared_op_ld.sum")
    print(f"| {k} | {m.get('sm__sass_average_branch_targets_threads_uniform.pct')} | "
          f"{m.get('smsp__thread_inst_executed_per_inst_executed.ratio')} | "
          f"{(sec / req) if sec is not None and req else None} | {bc} / {wf} |")
PYEOF
  else
    log "(kd) ncu not found: no reference figures"
  fi
  rec kernel_detail build/kernel_detail 20 all
  d=$(newest "$S/kernel_detail"); own=$(du -s "$d"/*/ 2>/dev/null | sort -n | tail -1 | cut -f2)
  [ -n "$own" ] && cp -r "${own%/}" "$OUT/testdata/"
fi

# 4. gpufl's own kernel detail (issue 19): the six kernels by name, 2 launches sampled each (the
#    first for counters, the second for stall reasons; no gap, no budget: the program is short), then the default (top 5 by GPU time, default
#    sampling) on a longer run; kdetail records dumped, reports in the summary, sessions copied.
KDN=divergent,uniform,strided_load,coalesced_load,bank_conflict,padded_shared
# KD_VARIANTS="stalls-first ..." : quick diagnosis runs (one sample per kernel; stalls-first: that
# sample is for stall reasons, with no SASS-metrics sample before it).
if [ -x build/kernel_detail ] && [ -n "${KD_VARIANTS:-}" ]; then
  for v in ${KD_VARIANTS}; do
    log "(kd) variant $v"
    GPUFL_KD_STALLS_FIRST=$([ "$v" = stalls-first ] && echo 1 || echo 0) GPUFL_KERNEL_DETAIL_SAMPLES=1 GPUFL_KERNEL_DETAIL_GAP_MS=0 \
      GPUFL_KERNEL_DETAIL_BUDGET=1 timeout 60 gpufl record -q --kernel-detail="$KDN" -o "$S/kdv" -- build/kernel_detail 5 all
    d=$(newest "$S/kdv"); gpufl dump "$d" --type notice 2>&1 | grep -i "kernel detail" | cut -c1-1500 | tee -a "$OUT/summary.txt"
    echo "kdetail records: $(gpufl dump "$d" --type kdetail 2>/dev/null | wc -l), kstall records: $(gpufl dump "$d" --type kstall 2>/dev/null | wc -l)" | tee -a "$OUT/summary.txt"
  done
fi
if [ -x build/kernel_detail ]; then
  log "(kd) gpufl record --kernel-detail=$KDN (2 samples each, no gap, no budget)"
  GPUFL_KERNEL_DETAIL_SAMPLES=2 GPUFL_KERNEL_DETAIL_GAP_MS=0 GPUFL_KERNEL_DETAIL_BUDGET=1 \
    gpufl record --kernel-detail="$KDN" -o "$S/kd_named" -- build/kernel_detail 20 all 2>&1 | tee "$OUT/kd_named.log"
  d=$(newest "$S/kd_named")
  gpufl dump "$d" --type kdetail >"$KD/kdetail-dump.txt" 2>&1
  head -c 3000 "$KD/kdetail-dump.txt" | tee -a "$OUT/summary.txt"; echo | tee -a "$OUT/summary.txt"
  gpufl dump "$d" --type kstall >"$KD/kstall-dump.txt" 2>&1
  echo "kdetail records: $(grep -c kdetail "$KD/kdetail-dump.txt"), kstall records: $(grep -c kstall "$KD/kstall-dump.txt")" | tee -a "$OUT/summary.txt"
  head -c 3000 "$KD/kstall-dump.txt" | tee -a "$OUT/summary.txt"; echo | tee -a "$OUT/summary.txt"
  gpufl dump "$d" --type notice 2>&1 | tee -a "$OUT/summary.txt"
  report "$d"
  gpufl report --json "$d" >"$KD/kd_named-report.json" 2>&1
  own=$(du -s "$d"/*/ 2>/dev/null | sort -n | tail -1 | cut -f2)
  [ -n "$own" ] && cp -r "${own%/}" "$OUT/testdata/kd_named" || cp -r "$d" "$OUT/testdata/kd_named"
  log "(kd) gpufl record --kernel-detail (default: top 5, 3 samples 1 s apart, 5 % budget), 3000 iterations"
  gpufl record --kernel-detail -o "$S/kd_top" -- build/kernel_detail 3000 all 2>&1 | tee "$OUT/kd_top.log"
  d=$(newest "$S/kd_top")
  gpufl dump "$d" --type notice 2>&1 | tee -a "$OUT/summary.txt"
  gpufl dump "$d" --type kdetail 2>&1 | cut -c1-300 | tee -a "$OUT/summary.txt"
  report "$d"
  own=$(du -s "$d"/*/ 2>/dev/null | sort -n | tail -1 | cut -f2)
  [ -n "$own" ] && cp -r "${own%/}" "$OUT/testdata/kd_top" || cp -r "$d" "$OUT/testdata/kd_top"
fi
# 4b. A framework program: PyTorch's kernels have no line info (built without -lineinfo); the
#     recording must say so, and the program must run to its end unchanged.
if [ -n "${KD_TORCH-1}" ] && [ -f examples/pytorch_train_sync.py ]; then
  log "(kd) PyTorch training loop with --kernel-detail (default)"
  timeout 180 gpufl record --kernel-detail -o "$S/kd_torch" -- $PY examples/pytorch_train_sync.py --steps 300 --warmup 5 2>&1 | tail -5 | tee -a "$OUT/summary.txt"
  d=$(newest "$S/kd_torch")
  gpufl dump "$d" --type notice 2>&1 | grep -i 'kernel detail' | cut -c1-1200 | tee -a "$OUT/summary.txt"
  echo "kdetail records: $(gpufl dump "$d" --type kdetail 2>/dev/null | wc -l), kstall records: $(gpufl dump "$d" --type kstall 2>/dev/null | wc -l)" | tee -a "$OUT/summary.txt"
  gpufl dump "$d" --type kstall 2>&1 | cut -c1-600 | head -3 | tee -a "$OUT/summary.txt"
  report "$d" | head -60
fi
if [ -n "${KD_TRAINER-1}" ] && [ -f examples/hf_trainer.py ]; then
  log "(kd) HuggingFace Trainer with --kernel-detail (default)"
  timeout 240 gpufl record --kernel-detail -o "$S/kd_trainer" -- $PY examples/hf_trainer.py --steps 400 2>&1 | tail -4 | tee -a "$OUT/summary.txt"
  d=$(newest "$S/kd_trainer")
  gpufl dump "$d" --type notice 2>&1 | grep -i 'kernel detail' | cut -c1-1200 | tee -a "$OUT/summary.txt"
  echo "kdetail records: $(gpufl dump "$d" --type kdetail 2>/dev/null | wc -l), kstall records: $(gpufl dump "$d" --type kstall 2>/dev/null | wc -l)" | tee -a "$OUT/summary.txt"
  report "$d" | grep -E 'Stall|Warp|Uncoal|Bank|lineinfo|line info' | head -20
fi

# 5. Cost of --kernel-detail (issue 19): whole-process wall time, KD_ROUNDS interleaved rounds
#    (order reversed every other round), of a kernel-heavy loop (kernel_detail 1000 all: six
#    kernels of 11-350 us) and a launch-bound loop (launch_bound 20000: 1 us kernels), each bare,
#    recorded by default, recorded with --kernel-detail (default sampling); and ncu's replay of the
#    same metrics on kernel_detail 50 all against bare (ncu profiles every launch).
if [ -x build/kernel_detail ] && [ "${KD_ROUNDS:-4}" -gt 0 ]; then
  nvcc -g -O2 -lineinfo -o build/launch_bound examples/launch_bound.cu >/dev/null 2>&1
  ms() { local t0 t1; t0=$(date +%s%N); "$@" >/dev/null 2>&1; t1=$(date +%s%N); echo $(( (t1 - t0) / 1000000 )); }
  : >"$KD/cost.tsv"
  for r in $(seq 1 "${KD_ROUNDS:-4}"); do
    modes="bare gpufl kd ${KD_EXTRA_MODES:-}"; [ $((r % 2)) -eq 0 ] && modes="${KD_EXTRA_MODES:-} kd gpufl bare"
    for prog in heavy launch; do
      if [ $prog = heavy ]; then cmd="build/kernel_detail ${KD_HEAVY_N:-1000} all"; else cmd="build/launch_bound ${KD_LAUNCH_N:-20000}"; fi
      [ $prog = launch ] && [ ! -x build/launch_bound ] && continue
      for m in $modes; do
        case $m in
          bare) t=$(ms $cmd);;
          gpufl) t=$(ms gpufl record -q -o "$S/kdcost" -- $cmd);;
          kdns) t=$(GPUFL_KERNEL_DETAIL_STALLS=0 ms gpufl record -q --kernel-detail -o "$S/kdcost" -- $cmd)
              echo "$r $prog no stalls: $(gpufl dump "$(newest "$S/kdcost")" --type notice 2>/dev/null | grep -o 'kernel detail on.*' | cut -c1-900)" >>"$KD/cost-notices.txt";;
          kd) t=$(ms gpufl record -q --kernel-detail -o "$S/kdcost" -- $cmd)
              echo "$r $prog: $(gpufl dump "$(newest "$S/kdcost")" --type notice 2>/dev/null | grep -o 'kernel detail on.*' | cut -c1-900)" >>"$KD/cost-notices.txt";;
        esac
        printf '%s\t%s\t%s\t%s\n' "$r" "$prog" "$m" "$t" | tee -a "$KD/cost.tsv"
      done
    done
  done
  rm -rf "$S/kdcost"
  tail -8 "$KD/cost-notices.txt" | tee -a "$OUT/summary.txt"
  if [ -n "${NCU:-}" ]; then
    tb=$(ms build/kernel_detail 50 all)
    tn=$(ms "$NCU" --metrics "$METRICS" build/kernel_detail 50 all)
    printf 'ncu\theavy50\tbare\t%s\nncu\theavy50\tncu\t%s\n' "$tb" "$tn" | tee -a "$KD/cost.tsv"
  fi
  $PY - "$KD/cost.tsv" <<'PYEOF' 2>&1 | tee -a "$OUT/summary.txt"
import sys, statistics as st
rows = [l.split("\t") for l in open(sys.argv[1]).read().split("\n") if l.strip()]
t = {}
for r, prog, m, ms in rows:
    t.setdefault((prog, r), {})[m] = float(ms)
for prog in sorted({p for p, _ in t}):
    rs = [v for (p, _), v in t.items() if p == prog]
    for m in ("gpufl", "kd", "kdns", "ncu"):
        ratios = [v[m] / v["bare"] for v in rs if m in v and v.get("bare")]
        if ratios:
            print(f"cost {prog}: {m}/bare median {st.median(ratios):.3f}x range {min(ratios):.3f}-{max(ratios):.3f} (n={len(ratios)}); bare median {st.median([v['bare'] for v in rs]):.0f} ms")
PYEOF
fi
