"""Summarize bench/launch_bound.py JSON lines, one table per metric (wall time, main-thread CPU
time, process CPU time): per mode the median and best, their ratio to the "bare" mode's, and the
paired ratio. A round starts at each {"round": N} marker line (or, without markers, at each "bare"
line); the paired ratio is, per round, the mode's median over that round's reference, and the
table shows the median of those ratios with their range and their mean with a 95 % interval
(mean ± 2 standard errors), which cancels the machine's drift between rounds. The reference is the
geometric mean of the round's "bare" and "bare-again" medians when the round has both (two bare
processes, one early and one late in the round, whose order alternates between rounds), else its
"bare" median; "bare-again" over "bare" alone is printed as the noise control. Mean steal time per
loop is shown when the VM reports any. For bench/trainer_bench.py the same table is given for the
median step of each process's steady window (robust to a few steps slowed by the host) beside its
total. Usage: python bench/summarize.py FILE.jsonl"""
import json
import signal
import statistics
import sys

# Piped into head: stop quietly when the reader goes.
signal.signal(signal.SIGPIPE, signal.SIG_DFL)

METRICS = [("train_ms", "whole train() (bench/trainer_bench.py)"),
           ("warmup_ms", "train() to the end of its warm-up steps (bench/trainer_bench.py)"),
           ("wall_ms_all", "wall time"),
           ("step_med_ms_all", "median step time (bench/trainer_bench.py)"),
           ("thread_cpu_ms_all", "main-thread CPU time"),
           ("process_cpu_ms_all", "process CPU time (all threads)")]

rows = []
for line in open(sys.argv[1]):
    try:
        rows.append(json.loads(line))
    except ValueError:
        pass  # not a result line, or one cut short by a timeout
markers = any("round" in r and "mode" not in r for r in rows)
# A line of a process that failed ({"mode", "error"} or {"mode", "exit_status"}) is no result.
rows = [r for r in rows if not ("mode" in r and ("error" in r or "exit_status" in r))]
results = [r for r in rows if "mode" in r]
for key, title in METRICS:
    if not all(key in r for r in results):
        continue
    modes, rounds = {}, []
    for r in rows:
        if "mode" not in r:
            if markers:
                rounds.append({})
            continue
        if (not markers and r["mode"] == "bare") or not rounds:
            rounds.append({})
        v = r[key] if isinstance(r[key], list) else [r[key]]
        rounds[-1].setdefault(r["mode"], []).extend(v)
        modes.setdefault(r["mode"], []).extend(v)
    if "bare" not in modes:
        continue

    def ref(rd):
        b = statistics.median(rd["bare"])
        if "bare-again" in rd:
            return (b * statistics.median(rd["bare-again"])) ** 0.5
        return b

    both = all("bare-again" in rd for rd in rounds if "bare" in rd)
    print(f"-- {title} (reference: {'geometric mean of bare and bare-again' if both else 'bare'})")
    base_med, base_best = statistics.median(modes["bare"]), min(modes["bare"])
    for mode, v in modes.items():
        med = statistics.median(v)
        if mode == "bare-again":
            paired = [statistics.median(rd[mode]) / statistics.median(rd["bare"])
                      for rd in rounds if mode in rd and "bare" in rd]
            label = "noise: bare-again/bare"
        else:
            paired = [statistics.median(rd[mode]) / ref(rd)
                      for rd in rounds if mode in rd and "bare" in rd]
            label = "paired"
        if not paired:
            continue
        mean = statistics.mean(paired)
        se = statistics.stdev(paired) / len(paired) ** 0.5 if len(paired) > 1 else float("nan")
        pr = (f"{label} {statistics.median(paired):.3f}x [{min(paired):.3f}-{max(paired):.3f}]"
              f" mean {mean:.3f}x ± {2 * se:.3f}")
        print(f"{mode:20s} median {med:8.1f} ms ({med / base_med:.3f}x)  "
              f"best {min(v):8.1f} ms ({min(v) / base_best:.3f}x)  n={len(v):3d}  {pr}")
steal = {}
for r in results:
    steal.setdefault(r["mode"], []).extend(r.get("steal_ms_all", []))
if any(any(v) for v in steal.values()):
    print("-- steal time per loop (ms, all CPUs): " + ", ".join(
        f"{m} {statistics.mean(v):.0f}" for m, v in steal.items() if v))
threads = {}
for r in results:
    for name, ms in r.get("thread_cpu_ms", {}).items():
        threads.setdefault(r["mode"], {}).setdefault(name, []).append(ms / len(r["wall_ms_all"]))
if threads:
    print("-- CPU time per loop by thread (ms, mean over processes)")
    for m, d in threads.items():
        print(f"{m:20s} " + ", ".join(f"{n} {statistics.mean(v):.1f}" for n, v in
                                       sorted(d.items(), key=lambda kv: -statistics.mean(kv[1]))))
