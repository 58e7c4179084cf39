"""Summarize the in-process A/B lines of bench/launch_bound.py --toggle (one JSON line per process).

Per mode, over every cycle of every process of that mode:
  on/off2   the loop recorded over the second paused loop of the same cycle: the recording's cost
            with the process, GPU state and memory layout held fixed;
  off1/off2 the first paused loop (the writer still decodes the records the pause flushed) over
            the second: the part of the cost that spills past the recorded loop;
  estimate  on/off2 + (off1/off2 - 1): what recording costs when it never pauses.
Each with its median and mean ± 2 standard errors (n = cycles). Then the low quantiles of the
pooled loops, recorded over paused (min, p10, p25): the host's interruptions only ever add time,
so the fastest loops of each kind show the work added with the least noise. For
bench/trainer_bench.py --toggle, on/off2 is also given from each segment's median step (robust
to a few steps slowed by the host). The mode recorded
without gpufl (switching does nothing there) is the method's own bias.
Usage: python bench/summarize_toggle.py FILE.jsonl"""
import json
import statistics
import sys


def stats(v):
    if not v:
        return "n=0"
    m = statistics.fmean(v)
    se = statistics.stdev(v) / len(v) ** 0.5 if len(v) > 1 else float("nan")
    return f"{statistics.median(v):.3f}x  (mean {m:.3f} ± {2 * se:.3f}, n={len(v)})"


modes, med = {}, {}
for line in open(sys.argv[1]):
    try:
        r = json.loads(line)
    except ValueError:
        continue
    if not r.get("toggle"):
        continue
    if "on_med_ms" in r:
        d = med.setdefault(r["mode"], [])
        d += [on / o2 for on, o2 in zip(r["on_med_ms"], r["off2_med_ms"])]
    d = modes.setdefault(r["mode"], {"on": [], "spill": [], "est": [], "paused": set(), "off2": [],
                                     "on_ms": [], "off_ms": []})
    d["on_ms"] += r["on_ms"]
    d["off_ms"] += r["off1_ms"] + r["off2_ms"]
    for on, o1, o2 in zip(r["on_ms"], r["off1_ms"], r["off2_ms"]):
        d["on"].append(on / o2)
        d["spill"].append(o1 / o2)
        d["est"].append(on / o2 + o1 / o2 - 1)
        d["off2"].append(o2)
    d["paused"].add(r.get("paused_by_gpufl"))

print("-- in-process A/B (bench/launch_bound.py --toggle): ratios per cycle")
for mode, d in modes.items():
    how = "recording switched" if True in d["paused"] else "no switching (not recorded)"
    print(f"{mode:<22} on/off2 {stats(d['on'])}   off1/off2 {stats(d['spill'])}   "
          f"estimate {stats(d['est'])}   off2 median {statistics.median(d['off2']):.1f} ms  [{how}]")


if med:
    print("-- the same with each segment's median step (bench/trainer_bench.py --toggle): on/off2")
    for mode, v in med.items():
        print(f"{mode:<22} on/off2 {stats(v)}")


def q(v, p):
    v = sorted(v)
    return v[int(p * (len(v) - 1))]


print("-- low quantiles of the pooled loops, recorded / paused (paused = off1 and off2 loops)")
for mode, d in modes.items():
    on, off = d["on_ms"], d["off_ms"]
    print(f"{mode:<22} min {min(on) / min(off):.3f}x  p10 {q(on, .1) / q(off, .1):.3f}x  "
          f"p25 {q(on, .25) / q(off, .25):.3f}x  median {statistics.median(on) / statistics.median(off):.3f}x  "
          f"(min {min(off):.1f} ms paused, n={len(on)}+{len(off)})")
