#!/usr/bin/env python3
"""Build testdata/kdetail/kernel_detail-probe/: a session of examples/kernel_detail.cu with
`kdetail` records made from CUPTI's own SASS-metrics counts (issue 19).

Not a gpufl recording of the counters: the recorder's kernel-detail path is experimental
(docs/kernel-detail.md). The session is gpufl's recording of `build/kernel_detail 20 all`
(testdata/kdetail/base-trace.ndjson.zst, H100, device run 7 of 2026-11-26: kernel records,
stacks, launch sites), to which this script adds one `kdetail` record per kernel built the way
the recorder builds them (crates/gpufl-capture/src/kernel_detail.rs `Counts::of_pc`) from the
per-PC counts the probe scripts/probe/sassmetrics.cu read for one launch of each kernel
(testdata/kdetail/probe-pcs.tsv), lines as CUPTI mapped them. Usage: python3 scripts/kdetail-session.py
"""
import collections, json, os, subprocess, sys

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
TD = os.path.join(ROOT, "testdata", "kdetail")
KEYS = ["inst", "thread_inst", "branch_uniform", "branch_divergent", "gld_inst", "gld_sectors",
        "gld_sectors_ideal", "gst_inst", "gst_sectors", "gst_sectors_ideal", "shared_inst",
        "shared_wavefronts", "shared_wavefronts_ideal"]


def of_pc(v):
    """One PC's counts as the recorder writes them (v: the 12 metrics in probe-pcs.tsv order)."""
    c = dict(inst=v[0], thread_inst=v[1], branch_uniform=v[2], branch_divergent=v[3],
             gld_inst=v[4], gst_inst=v[5], shared_inst=v[8] + v[9], shared_wavefronts=v[10],
             shared_wavefronts_ideal=v[11], gld_sectors=0, gld_sectors_ideal=0, gst_sectors=0,
             gst_sectors_ideal=0)
    if v[4] > 0:
        c.update(gld_sectors=v[6], gld_sectors_ideal=v[7])
    elif v[5] > 0:
        c.update(gst_sectors=v[6], gst_sectors_ideal=v[7])
    return c


def main():
    kern = collections.defaultdict(lambda: (collections.Counter(), collections.defaultdict(collections.Counter)))
    for l in open(os.path.join(TD, "probe-pcs.tsv")):
        if l.startswith("#") or l.startswith("function\t"):
            continue
        f = l.rstrip("\n").split("\t")
        c = of_pc([int(x) for x in f[3:15]])
        tot, lines = kern[f[0]]
        tot.update(c)
        lines[int(f[2])].update(c)
    base = subprocess.run(["zstd", "-dc", os.path.join(TD, "base-trace.ndjson.zst")],
                          capture_output=True, text=True, check=True).stdout.splitlines()
    strs, first = {}, {}
    for l in base:
        r = json.loads(l)
        if r["t"] == "str":
            strs[r["s"]] = r["id"]
        elif r["t"] == "kernel":
            first.setdefault(r["name"], (r["start"], r["end"]))
    plain = {"_Z9divergentPKfPf": "divergent", "_Z7uniformPKfPf": "uniform",
             "_Z12strided_loadPKfPf": "strided_load", "_Z14coalesced_loadPKfPf": "coalesced_load",
             "_Z13bank_conflictPKfPf": "bank_conflict", "_Z13padded_sharedPKfPf": "padded_shared"}
    src = strs["/work/main/examples/kernel_detail.cu"]
    recs = []
    for fn, (tot, lines) in sorted(kern.items()):
        name = strs[plain[fn] + "(float const*, float*)"]
        s, e = first[name]
        recs.append(json.dumps({
            "t": "kdetail", "name": name, "dev": 0, "start": s, "end": e, "launches": 1,
            "lineinfo": True, "totals": {k: tot[k] for k in KEYS},
            "lines": [{"file": src, "line": n, "m": {k: c[k] for k in KEYS if c[k]}}
                      for n, c in sorted(lines.items())]}, separators=(",", ":")))
    out_dir = os.path.join(TD, "kernel_detail-probe")
    os.makedirs(out_dir, exist_ok=True)
    out = []
    for l in base:
        if '"t":"end"' in l:
            out.extend(recs)
        out.append(l)
    path = os.path.join(out_dir, "trace-0000.ndjson")
    with open(path, "w") as f:
        f.write("\n".join(out) + "\n")
    subprocess.run(["zstd", "-q", "-f", "--rm", path, "-o", path + ".zst"], check=True)
    print(f"{len(recs)} kdetail records -> {path}.zst", file=sys.stderr)


if __name__ == "__main__":
    main()
