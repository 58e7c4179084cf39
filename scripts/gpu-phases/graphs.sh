# Phase graphs (sourced by scripts/gpu-check.sh): CUDA graphs and torch.compile (issue 18).
#
# 1. Recordings, each under `gpufl record` into $S/<name>/, then info / syncs / notices / report
#    (text into summary.txt; `gpufl report --json` into $OUT/graphs/<name>-report.json), the first
#    5 kernel records, and a check of what the recorder wrote (below):
#    - graph_replay: examples/graph_replay.cu (nvcc -lineinfo), 40 replays of a 5-kernel graph with
#      a stream sync after each, beside 4 threads x 90 direct launches of `mix` (also a graph node);
#    - torch_cuda_graph: examples/torch_cuda_graph.py --steps 200 (torch.cuda.graph training step);
#    - torch_compile_graphs: examples/torch_compile_graphs.py --steps 100 (reduce-overhead);
#    - torch_compile_recompile: the same with --reshape-at 50 (a recompilation mid-run); for both,
#      a check of rule torch-compile at the compiled-call line (a recompilation only in the second).
#    Each session directory is copied to $OUT/testdata/ (to trim into testdata/sessions/).
# 2. Recorder checks (PASS/FAIL lines, from `gpufl dump`): graph kernels carry `graph: [g, n]`;
#    the correlation id of every graph kernel is that of a cudaGraphLaunch `api` record (CUPTI
#    gives a replayed kernel the graph launch's correlation id); graph-launch `callsite` records
#    exist, their stacks name the user's line (graph_replay.cu's `graph-launch` marker,
#    torch_cuda_graph.py's `graph-replay`, torch_compile_graphs.py's `compiled-call`), the join
#    kernel -> callsite by correlation id finds some graph kernels, and no driver cuGraphLaunch
#    callsite is written for a runtime cudaGraphLaunch (the runtime depth skips it).
#    graph_replay only: 5 x 40 graph kernels on 5 distinct nodes of one graph, 4 x 90 direct ones
#    without `graph`, and the graph-launch callsites' weights sum to the replays they stand for
#    (those after the last capture excepted).
# 3. Cost of recording a graph-heavy loop: examples/torch_cuda_graph.py --steps GRAPH_STEPS
#    (default 2000; one replay and one .item() per step) in modes bare / gpufl-default /
#    torch-profiler (its --profiler flag: the replay loop inside torch.profiler.profile(CPU, CUDA))
#    / bare-again, one process per mode, GRAPH_ROUNDS (default 6; 0 skips) interleaved rounds with
#    the order reversed every other round; each process prints {"mode", "wall_s", "wall_ms_all"}
#    for the replay loop only; bench/summarize.py gives the paired ratios ($OUT/graphs/bench.jsonl).
# ~4-5 minutes on the H100 machine (the bench: ~24 processes of ~6-8 s, torch import included).
GR="$OUT/graphs"; mkdir -p "$GR" "$OUT/testdata"
log "(graphs) CUDA graphs and torch.compile"
rm -f build/graph_replay
nvcc -g -O2 -lineinfo -o build/graph_replay examples/graph_replay.cu >"$GR/nvcc.txt" 2>&1 \
  || { log "compile FAILED: graph_replay"; tail -5 "$GR/nvcc.txt" | tee -a "$OUT/summary.txt"; }
graph_rec() { # name marker-file marker command...: record, report, dump, check, keep the session
  local name=$1 mfile=$2 marker=$3; shift 3
  local t0; t0=$(date +%s%N)
  rec "$name" "$@"
  echo "(graphs) $name: wall $(( ($(date +%s%N) - t0) / 1000000 )) ms (recording, report included)" | tee -a "$OUT/summary.txt"
  # `gpufl record` writes a run directory; the session is the largest one, the command's own
  # process's (torch.compile's compile workers write small ones of their own).
  local d; d=$(newest "$S/$name")
  [ -n "$d" ] || { log "(graphs) $name: no session"; return; }
  local own; own=$(du -s "$d"/*/ 2>/dev/null | sort -n | tail -1 | cut -f2)
  [ -n "$own" ] && d=${own%/}/
  gpufl report --json "$d" >"$GR/$name-report.json" 2>"$GR/$name-report.err"
  # The analysis's graphs and the generated kernels' sources (Inductor), from the JSON report.
  $PY - "$GR/$name-report.json" <<'PYEOF' 2>&1 | tee -a "$OUT/summary.txt"
import json, sys
s = json.load(open(sys.argv[1]))["sessions"][0]
for g in s.get("graphs", []):
    print("graphs:", {k: g.get(k) for k in ("graph", "replays", "nodes", "replay_median_ns", "gaps",
          "gap_idle_ns", "gaps_with_sync", "launch_call_median_ns")},
          "launch", (g.get("launch_location") or {}).get("file"), (g.get("launch_location") or {}).get("line"),
          "sync", (g.get("sync_location") or {}).get("file"), (g.get("sync_location") or {}).get("line"))
rows = s.get("kernels", {}).get("rows", [])
src = [r for r in rows if r.get("source")]
tri = [r for r in rows if r["name"].startswith("triton")]
print(f"kernel rows {len(rows)}, Triton {len(tri)}, with a source {len(src)}")
for r in src[:3]:
    print("  source:", r["name"], r["source"])
for g in s.get("graphs", []):
    print("graph", g["graph"], "captured at", (g.get("capture_location") or {}).get("file"),
          (g.get("capture_location") or {}).get("line"),
          "top:", [(o["name"][:40], (o.get("created_at") or {}).get("line")) for o in g.get("top", [])])
print("insights:", [(i["rule"], i["title"][:120]) for i in s.get("insights", [])][:8])
PYEOF
  gpufl dump "$d" --type kernel --limit 5 2>&1 | cut -c1-600 | tee -a "$OUT/summary.txt"
  # Graph nodes: created (with the capturing call's stack) and cloned (instantiation).
  echo "(graphs) $name: gnode records: $(gpufl dump "$d" --type gnode 2>/dev/null | grep -c '"stack"') created with a stack, $(gpufl dump "$d" --type gnode 2>/dev/null | grep -c '"from"') cloned" | tee -a "$OUT/summary.txt"
  gpufl dump "$d" --type gnode --limit 3 2>&1 | cut -c1-300 | tee -a "$OUT/summary.txt"
  cp -r "${d%/}" "$OUT/testdata/"
  local line; line=$(grep -n "gpufl-example: $marker" "examples/$mfile" | head -1 | cut -d: -f1)
  gpufl dump "$d" --type kernel,api,callsite >"$GR/$name-dump.ndjson" 2>/dev/null
  $PY scripts/gpu-phases/lib/graph_checks.py "$GR/$name-dump.ndjson" "$name" "$mfile" "$line" 2>&1 | tee -a "$OUT/summary.txt"
  rm -f "$GR/$name-dump.ndjson"
}
graph_rec graph_replay graph_replay.cu graph-launch build/graph_replay 40 90
graph_rec torch_cuda_graph torch_cuda_graph.py graph-replay $PY examples/torch_cuda_graph.py --steps 200
graph_rec torch_compile_graphs torch_compile_graphs.py compiled-call $PY examples/torch_compile_graphs.py --steps 100
# A recompilation mid-run (half-size batches from step 50): rule torch-compile at the call's line.
graph_rec torch_compile_recompile torch_compile_graphs.py compiled-call $PY examples/torch_compile_graphs.py --steps 100 --reshape-at 50
CC_LINE=$(grep -n "gpufl-example: compiled-call" examples/torch_compile_graphs.py | head -1 | cut -d: -f1)
for n in torch_compile_graphs torch_compile_recompile; do
  $PY - "$GR/$n-report.json" "$n" "$CC_LINE" <<'PYEOF' 2>&1 | tee -a "$OUT/summary.txt"
import json, sys
path, name, line = sys.argv[1], sys.argv[2], int(sys.argv[3])
s = json.load(open(path))["sessions"][0]
tc = [i for i in s.get("insights", []) if i["rule"] == "torch-compile"]
for i in tc:
    d = i.get("data", {})
    print(f"{name}: torch-compile: {i['severity']} {i['title']} (compilations {d.get('compilations')}, "
          f"recompilations {d.get('recompilations')}, episodes {[(e['start_ns'] // 1000000, e['span_ns'] // 1000000) for e in d.get('episodes', [])]} ms)")
at = [i for i in tc if i["location"].get("line") == line and i["location"]["file"].endswith("torch_compile_graphs.py")]
want = 1 if name == "torch_compile_recompile" else 0
ok = len(at) == 1 and (at[0]["data"]["recompilations"] >= 1) == (want == 1)
print(f"{name}: torch-compile at torch_compile_graphs.py:{line} with {'a' if want else 'no'} recompilation:", "PASS" if ok else "FAIL")
PYEOF
done

GB="$S/graphbench"; mkdir -p "$GB"
GMODES=${GRAPH_MODES:-"bare gpufl-default torch-profiler bare-again"}
run_graphbench() { # mode
  local m=$1 a="examples/torch_cuda_graph.py --steps ${GRAPH_STEPS:-2000} --mode $1"
  case $m in
    bare|bare-again) timeout 120 $PY $a ;;
    gpufl-default) timeout 120 gpufl record -q -o "$GB/default" -- $PY $a ;;
    torch-profiler) timeout 120 $PY $a --profiler ;;
  esac
}
if [ "${GRAPH_ROUNDS:-6}" -gt 0 ]; then
  log "(graphs) cost of a graph-heavy loop: torch_cuda_graph.py --steps ${GRAPH_STEPS:-2000}, ${GRAPH_ROUNDS:-6} interleaved rounds: $GMODES"
  t0=$(date +%s)
  for round in $(seq ${GRAPH_ROUNDS:-6}); do
    echo "{\"round\": $round}"
    order=$GMODES; [ $((round % 2)) = 0 ] && order=$(echo $GMODES | tr ' ' '\n' | tac | tr '\n' ' ')
    for m in $order; do
      run_graphbench $m; rc=$?
      [ $rc != 0 ] && echo "EXIT round $round mode $m status $rc"
    done
    [ "$round" -lt "${GRAPH_ROUNDS:-6}" ] && rm -rf "$GB"/*/
  done 2>&1 | tee -a "$GR/bench.log" | grep -e '^{"' -e '^EXIT' | tee -a "$GR/bench.jsonl"
  echo "(graphs) bench: $(( $(date +%s) - t0 )) s" | tee -a "$OUT/summary.txt"
  $PY bench/summarize.py "$GR/bench.jsonl" | tee -a "$OUT/summary.txt"
  for d in "$GB"/*/*/; do
    [ -d "$d" ] || continue
    gpufl info "$d" 2>&1 | grep -E "kernels|files" | head -3 | tee -a "$OUT/summary.txt"
    gpufl dump "$d" --type notice 2>/dev/null | grep -h -e "call-site" -e "budget" -e "dropped" | cut -c1-300 | tee -a "$OUT/summary.txt"
  done
fi
rm -rf "$GB"
