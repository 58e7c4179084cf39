"""detach_check.py SESSION [--syncs N] [--ranges N]: what an always-on session recorded across
CUPTI's detaches (crate::detach): its windows, the kernels inside each (and their correlation ids,
which must keep rising across a detach), the syncs and NVTX ranges (against the N the program made),
and the end notice. Prints one line per fact; exit 1 when a check fails."""
import json
import subprocess
import sys

args = sys.argv[1:]
d = args[0]
want = {k: int(args[args.index(k) + 1]) for k in ("--syncs", "--ranges") if k in args}
out = subprocess.run(["gpufl", "dump", d, "--type", "window,kernel,sync,notice,range,scope"],
                     capture_output=True, text=True).stdout
recs = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
wins = [r for r in recs if r["t"] == "window"]
kern = sorted((r for r in recs if r["t"] == "kernel"), key=lambda r: r["start"])
ok = True
print(f"windows {len(wins)}, kernels {len(kern)}")
prev_max = -1
for i, w in enumerate(sorted(wins, key=lambda w: w["start"])):
    inside = [k for k in kern if w["start"] <= k["start"] <= w["end"]]
    corr = [k["corr"] for k in inside]
    lo, hi = (min(corr), max(corr)) if corr else (None, None)
    rising = lo is None or lo > prev_max
    ok &= rising
    if i < 4 or not rising:
        print(f"  window {i + 1} ({w['reason']}, {(w['end'] - w['start']) / 1e6:.0f} ms): {len(inside)} kernels, corr {lo}..{hi}{'' if rising else '  NOT RISING'}")
    if hi is not None:
        prev_max = hi
outside = sum(1 for k in kern if not any(w["start"] <= k["start"] <= w["end"] for w in wins))
print(f"kernels outside windows: {outside}")
syncs = sum(1 for r in recs if r["t"] == "sync")
ranges = sum(1 for r in recs if r["t"] in ("range", "scope"))
print(f"syncs {syncs}" + (f" of {want['--syncs']} made" if "--syncs" in want else ""))
if "--syncs" in want:
    ok &= syncs >= want["--syncs"] * 0.99
if "--ranges" in want:
    print(f"ranges+scopes {ranges} (program: {want['--ranges']} steps)")
for r in recs:
    if r["t"] == "notice" and ("always-on" in r["message"] or "CUPTI" in r["message"]):
        print("notice:", r["message"][:400])
det = any(r["t"] == "notice" and "CUPTI detached after" in r["message"] for r in recs)
print("detached:", det)
print("CHECK", "PASS" if ok else "FAIL")
sys.exit(0 if ok else 1)
