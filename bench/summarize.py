"""Summarize bench/launch_bound.py JSON lines: per mode, median and best wall time and their ratio
to the "bare" mode's. Usage: python bench/summarize.py FILE.jsonl"""
import json
import statistics
import sys

rows = [json.loads(line) for line in open(sys.argv[1]) if line.startswith("{")]
modes = {}
for r in rows:
    modes.setdefault(r["mode"], []).extend(r["wall_ms_all"])
base_med = statistics.median(modes["bare"])
base_best = min(modes["bare"])
for mode, v in modes.items():
    med = statistics.median(v)
    print(f"{mode:24s} median {med:8.1f} ms ({med / base_med:.3f}x)  "
          f"best {min(v):8.1f} ms ({min(v) / base_best:.3f}x)  n={len(v)}")
