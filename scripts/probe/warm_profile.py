"""Where in train() a recorded mode loses time (bench/trainer_bench.py --fork output): per mode,
the median over rounds of (mode − reference) in ms — reference the geometric mean of the round's
bare and bare-again (for bare-again: bare) — for setup (before train()), each of the first warm-up
steps, the rest of the warm-up, the steady steps in fifths, and the whole train().
Usage: python scripts/probe/warm_profile.py trainerfork.jsonl"""
import json
import statistics as st
import sys

rounds = []
for line in open(sys.argv[1]):
    if not line.startswith("{"):
        continue
    r = json.loads(line)
    if "mode" not in r:
        rounds.append({})
    elif "step_ms" in r and rounds:
        rounds[-1][r["mode"]] = r


def parts(r):
    w = r.get("warm_step_ms", [])
    s = r["step_ms"]
    out = [("setup", r["setup_ms"])]
    out += [(f"w{i + 1}", v) for i, v in enumerate(w[:4])]
    out.append(("w5+", sum(w[4:])))
    n = len(s)
    for k in range(5):
        out.append((f"s{k + 1}/5", sum(s[k * n // 5:(k + 1) * n // 5])))
    out.append(("train", r["train_ms"]))
    return out


modes = []
for rd in rounds:
    for m in rd:
        if m not in modes and m != "bare":
            modes.append(m)
names = [n for n, _ in parts(next(iter(rounds[0].values())))] if rounds and rounds[0] else []
print("ms over the reference (median over rounds) · " + " ".join(f"{n:>7s}" for n in names))
ref_row = []
for m in modes:
    diffs = {n: [] for n in names}
    for rd in rounds:
        if m not in rd or "bare" not in rd:
            continue
        mine = dict(parts(rd[m]))
        b = dict(parts(rd["bare"]))
        if m != "bare-again" and "bare-again" in rd:
            a = dict(parts(rd["bare-again"]))
            ref = {n: (b[n] * a[n]) ** 0.5 for n in names}
        else:
            ref = b
        for n in names:
            diffs[n].append(mine[n] - ref[n])
    if not diffs[names[0]]:
        continue
    label = m if len(m) <= 40 else m[:37] + "..."
    print(f"{label:40s} ({len(diffs[names[0]]):2d}) " + " ".join(f"{st.median(diffs[n]):7.1f}" for n in names))
b = [dict(parts(rd["bare"])) for rd in rounds if "bare" in rd]
print(f"{'bare, ms (median)':40s}      " + " ".join(f"{st.median(x[n] for x in b):7.1f}" for n in names))
