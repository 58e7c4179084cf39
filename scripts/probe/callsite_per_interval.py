"""Call-site records per recorded interval of a paused/resumed session (bench/launch_bound.py
--toggle N under gpufl record): whether call-site sampling goes on after each pause.
Usage: python3 scripts/probe/callsite_per_interval.py SESSION_DIR GPUFL_BINARY"""
import json, subprocess, sys
d = sys.argv[1]; gpufl = sys.argv[2]
def dump(t):
    out = subprocess.run([gpufl, "dump", d, "--type", t], capture_output=True, text=True).stdout
    for l in out.splitlines():
        try: yield json.loads(l)
        except ValueError: pass
caps = [(r["ts"], r["recording"]) for r in dump("capture")]
cs = sorted(r["ts"] for r in dump("callsite"))
# intervals where recording is on
iv = []; start = None
for ts, rec in sorted(caps):
    if rec and start is None: start = ts
    elif not rec and start is not None: iv.append((start, ts)); start = None
counts = [sum(1 for t in cs if a <= t < b) for a, b in iv]
print("callsite records", len(cs), "on-intervals", len(iv), "per interval", counts)
