"""lc_steady.py LAUNCHCOST.TXT [--from S] [--base bare] [--noise bare-again]: the launch loop's
steady-state cost per mode from scripts/probe/launch-cost.sh run with LC_TIMELINE (one process per
mode per round, modes interleaved). Each process's steady figure is the median ns per launch of its
timeline stretches from S seconds on (default 2.5: after always-on's first window); each round's
ratio is a mode's figure over the geometric mean of the base and noise processes of that round.
Prints per mode the median of the paired ratios with their range, and the noise control (base over
noise). A process that printed no timeline (it died) is counted as failed."""
import math
import re
import statistics
import sys

args = sys.argv[1:]
path = args[0]
opt = {k: args[args.index(k) + 1] for k in ("--from", "--base", "--noise") if k in args}
start = float(opt.get("--from", 2.5))
base, noise = opt.get("--base", "bare"), opt.get("--noise", "bare-again")

procs = []  # (mode, [ns of stretches from `start`])
for line in open(path, errors="replace"):
    m = re.match(r"^([A-Za-z][\w.+=,-]*): ?(.*)$", line)
    if m and not line.startswith("LC_TIMELINE") and not line.startswith("launch ns"):
        procs.append((m.group(1), []))
        line = m.group(2)
    t = re.search(r"LC_TIMELINE\s+([\d.]+) s: (\d+) ns", line)
    if t and procs and float(t.group(1)) >= start:
        procs[-1][1].append(int(t.group(2)))

rounds = []  # one dict mode -> steady ns per round
failed = {}
for mode, xs in procs:
    if not rounds or mode in rounds[-1]:
        rounds.append({})
    if xs:
        rounds[-1][mode] = statistics.median(xs)
    else:
        failed[mode] = failed.get(mode, 0) + 1

modes = list(dict.fromkeys(m for m, _ in procs))
print(f"{len(rounds)} rounds; steady state: stretches from {start} s on")
for mode in modes:
    ratios, figs = [], []
    for r in rounds:
        if mode in r:
            figs.append(r[mode])
        if mode in r and base in r and noise in r and mode != base:
            ref = math.sqrt(r[base] * r[noise]) if mode != noise else r[base]
            ratios.append(r[mode] / ref if mode != noise else r[base] / r[noise])
    line = f"{mode}: median {statistics.median(figs):.0f} ns/launch" if figs else f"{mode}: no figure"
    if ratios:
        what = "noise (base/noise)" if mode == noise else "paired ratio"
        line += f"; {what} {statistics.median(ratios):.3f} [{min(ratios):.3f}-{max(ratios):.3f}] (n={len(ratios)})"
    if failed.get(mode):
        line += f"; {failed[mode]} processes printed no timeline (died?)"
    print(line)
