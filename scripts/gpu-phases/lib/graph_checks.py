"""Recorder checks of the graphs phase (scripts/gpu-phases/graphs.sh): PASS/FAIL lines over a
`gpufl dump --type kernel,api,callsite` of one session.

usage: graph_checks.py DUMP.ndjson NAME MARKER_FILE MARKER_LINE
"""
import collections, json, sys
dump, name, mfile, line = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4] or 0)
kernels, apis, sites = [], [], []
for l in open(dump):
    try:
        r = json.loads(l)
    except ValueError:
        continue
    {"kernel": kernels, "api": apis, "callsite": sites}.get(r.get("t"), []).append(r)
def check(what, ok):
    print(f"{name}: {what}:", "PASS" if ok else "FAIL")
graph_k = [k for k in kernels if k.get("graph")]
direct_k = [k for k in kernels if not k.get("graph")]
launch_corr = {a["corr"] for a in apis if "GraphLaunch" in str(a.get("name"))}
gsites = [s for s in sites if "GraphLaunch" in str(s.get("api"))]
site_corr = {s["corr"] for s in gsites}
graphs = collections.Counter(k["graph"][0] for k in graph_k)
nodes = {tuple(k["graph"]) for k in graph_k}
names = collections.Counter(k["name"] for k in graph_k)
print(f"{name}: kernels {len(kernels)} ({len(graph_k)} in graphs, {len(direct_k)} not); "
      f"graphs {dict(graphs)}; nodes {len(nodes)}; graph-launch api records {len(launch_corr)}; "
      f"graph-launch callsites {len(gsites)} (apis {sorted(set(s['api'] for s in gsites))}, "
      f"weights {sum(s.get('weight') or 1 for s in gsites)})")
print(f"{name}: graph kernels by name: {dict(names.most_common(8))}")
triton = [k for k in kernels if k["name"].startswith("triton")]
if triton:
    print(f"{name}: Triton kernels {len(triton)}, in graphs {sum(1 for k in triton if k.get('graph'))}")
at_line = [s for s in gsites if any(f"{mfile}:{line})" in f for f in s.get("stack", []))]
if gsites and len(at_line) < len(gsites):
    print(f"{name}: a graph-launch callsite stack not at {mfile}:{line}:", json.dumps(gsites[0]["stack"])[:1500])
check("graph kernels recorded with graph: [g, n]", len(graph_k) > 0)
check("every graph kernel has a graph launch's correlation id",
      bool(graph_k) and all(k["corr"] in launch_corr for k in graph_k))
# The C++ example launches its graph from one line only; the Python ones may also replay elsewhere
# (torch_compile_graphs.py's final check against eager).
every = name == "graph_replay"
check(f"graph-launch callsites at {mfile}:{line} ({'all' if every else 'some'}: {len(at_line)} of {len(gsites)})",
      bool(at_line) and (not every or len(at_line) == len(gsites)))
check("graph kernels joined to a graph-launch callsite by correlation id",
      any(k["corr"] in site_corr for k in graph_k))
check("no driver cuGraphLaunch callsite (nested in cudaGraphLaunch)",
      not any(str(s.get("api")).startswith("cuGraphLaunch") for s in gsites))
if name == "graph_replay":
    replays, direct = 40, 4 * 90
    check(f"{5 * replays} graph kernels on 5 nodes of one graph",
          len(graph_k) == 5 * replays and len(nodes) == 5 and len(graphs) == 1)
    check(f"{direct} direct kernels (mix) without graph",
          len(direct_k) == direct and all(k["name"] == "mix" or "mix" in k["name"] for k in direct_k))
    # Captured at replays 0-4, 8, 16, 32 (schedule): weights 1,1,1,1,1,4,8,16 = 33.
    w = sum(s.get("weight") or 1 for s in gsites)
    check(f"graph-launch callsite weights sum to the replays up to the last capture (33 of {replays})",
          w == 33)
