"""Recorder checks of the hostgaps phases (scripts/gpu-phases/hostgaps.sh, hostgaps_ddp.sh):
what the `hostcall` and `hsample` records of one run say, and PASS/FAIL lines, over a
`gpufl dump --type header,hostcall,hsample` of the run on stdin.

usage: gpufl dump RUN --type header,hostcall,hsample[,callsite] | hostgaps_checks.py NAME FILE LINE CHECK [FRAGMENT]

CHECK (what the program plants; FILE:LINE its marked line):
  blocking-call  a hostcall of cudaFree / cuMemFree whose stack holds FILE:LINE, and host samples
                 in state `cuda` naming such a call
  host-line      the samples of the thread that runs FILE's Python code, on a CPU in FILE's code
                 (the program's own work, not its imports): more at FILE:LINE (the innermost
                 frame of FILE) than at any other line of FILE
  compile        samples in state `cpu` whose stack holds FILE:LINE (the jit call that compiles)
  frames-in      samples under FILE:LINE whose stacks hold frames of FRAGMENT (a path fragment,
                 default `transformers/`): at least half of them
  launch-line    launch call sites (`callsite` records, dumped with the others) at FILE:LINE
  none           only the summary
"""
import collections
import json
import sys

name, mfile, line, check = sys.argv[1], sys.argv[2], int(sys.argv[3] or 0), sys.argv[4]
headers, calls, samples, sites = [], [], [], []
for l in sys.stdin:
    try:
        r = json.loads(l)
    except ValueError:
        continue
    {"header": headers, "hostcall": calls, "hsample": samples,
     "callsite": sites}.get(r.get("t"), []).append(r)


def say(what, ok):
    print(f"{name}: {what}:", "PASS" if ok else "FAIL")


def at(stack, file, line):
    return any(f"{file}:{line})" in f for f in stack or [])


def user_line(stack, file):
    """The innermost frame of `file` in a stack: "file:line", or None."""
    for f in stack or []:
        if f"{file}:" in f:
            return f.rsplit("(", 1)[-1].rstrip(")").rsplit("/", 1)[-1]
    return None


opts = [h.get("options", {}) for h in headers]
print(f"{name}: {len(headers)} session(s); options host_samples_hz "
      f"{[o.get('host_samples_hz') for o in opts]}, hostcall_us {[o.get('hostcall_us') for o in opts]}")
by_name = collections.defaultdict(list)
for c in calls:
    by_name[c["name"]].append(c["end"] - c["start"])
print(f"{name}: {len(calls)} hostcall records; by function (count, total ms, median µs, max ms):")
for fn, ds in sorted(by_name.items(), key=lambda kv: -sum(kv[1]))[:12]:
    ds = sorted(ds)
    print(f"    {fn}: {len(ds)}, {sum(ds) / 1e6:.1f} ms, {ds[len(ds) // 2] / 1e3:.0f} µs, "
          f"{ds[-1] / 1e6:.2f} ms; with stack {sum(1 for c in calls if c['name'] == fn and c.get('stack'))}")
sized = [c for c in calls if c.get("bytes") is not None]
if sized:
    print(f"{name}: hostcalls with bytes: {len(sized)}, e.g. {sized[0]['name']} {sized[0]['bytes']} B")
tids = collections.Counter(s["tid"] for s in samples)
periods = collections.Counter(s["period_ns"] for s in samples)
print(f"{name}: {len(samples)} hsample records of {len(tids)} thread(s); periods (ns) {dict(periods)}")
for tid, n in tids.most_common(6):
    mine = [s for s in samples if s["tid"] == tid]
    st = collections.Counter(s["state"] for s in mine)
    lines = collections.Counter(user_line(s.get("stack"), mfile) for s in mine)
    callsn = collections.Counter(s.get("call") for s in mine if s.get("call"))
    print(f"    tid {tid}: {n} samples, states {dict(st)}, calls {dict(callsn.most_common(4))}, "
          f"lines of {mfile} {dict(lines.most_common(4))}")
ex = next((s for s in samples if s.get("stack")), None)
if ex:
    print(f"{name}: a sample's stack: {json.dumps(ex['stack'][:8])[:900]}")

if check == "blocking-call":
    frees = [c for c in calls if c["name"].startswith(("cudaFree", "cuMemFree"))]
    here = [c for c in frees if at(c.get("stack"), mfile, line)]
    say(f"hostcalls of cudaFree/cuMemFree recorded ({len(frees)})", len(frees) > 0)
    say(f"their stacks hold {mfile}:{line} ({len(here)} of {len(frees)})",
        len(here) > 0 and len(here) * 2 >= len(frees))
    in_free = [s for s in samples if s["state"] == "cuda" and str(s.get("call", "")).startswith(("cudaFree", "cuMemFree"))]
    say(f"host samples in state cuda inside cudaFree/cuMemFree ({len(in_free)})", len(in_free) > 0)
elif check == "host-line":
    main = [s for s in samples if user_line(s.get("stack"), mfile)]
    tid = collections.Counter(s["tid"] for s in main).most_common(1)
    mine = [s for s in main if tid and s["tid"] == tid[0][0] and s["state"] == "cpu"]
    hit = [s for s in mine if at(s.get("stack"), mfile, line)
           and user_line(s.get("stack"), mfile) == f"{mfile.rsplit('/', 1)[-1]}:{line}"]
    top = collections.Counter(user_line(s.get("stack"), mfile) for s in mine).most_common(1)
    say(f"on-CPU samples of the Python thread in {mfile} at line {line} ({len(hit)} of {len(mine)}; "
        f"most at {top[0][0] if top else None})",
        bool(hit) and top[0][1] == len(hit))
elif check == "compile":
    hit = [s for s in samples if s["state"] == "cpu" and at(s.get("stack"), mfile, line)]
    say(f"samples on a CPU under {mfile}:{line} (compilation in the jit call: {len(hit)})", len(hit) >= 5)
elif check == "frames-in":
    frag = (sys.argv[5] if len(sys.argv) > 5 else "") or "transformers/"
    under = [s for s in samples if at(s.get("stack"), mfile, line)]
    deep = [s for s in under if any(frag in f for f in s.get("stack") or [])]
    say(f"samples under {mfile}:{line} ({len(under)}), with frames of {frag} ({len(deep)})",
        len(deep) > 0 and len(deep) * 2 >= len(under))
elif check == "launch-line":
    here = [c for c in sites if at(c.get("stack"), mfile, line)]
    apis = collections.Counter(c.get("api") for c in here)
    say(f"launch call sites at {mfile}:{line} ({len(here)}: {dict(apis)})", len(here) > 0)
    under = [s for s in samples if at(s.get("stack"), mfile, line)]
    print(f"{name}: host samples under {mfile}:{line}: {len(under)}, states "
          f"{dict(collections.Counter(s['state'] for s in under))}")
say("hsample records written", len(samples) > 0)
