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
