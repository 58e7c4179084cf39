# Phase aon (sourced by scripts/gpu-check.sh): always-on mode on the GPU.
# 1. Trigger: examples/crash_train.py (a PyTorch loop, .item() each step) for 12 s under
#    `gpufl record --always-on`; 3 s into the loop `gpufl trigger PID --seconds 2`. Checks: a
#    `trigger` window in the session; every sampled launch call site inside it (up to 5 ms before
#    its end) has its kernel record (same correlation id); every step inside it (kernels between
#    two consecutive syncs) holds the same number of kernels; kernels outside windows.
# 2. Long run: AON_LONG_S seconds (default 600) of the same loop under --always-on with
#    GPUFL_MAX_DISK_MB=AON_DISK_MB (default 4); the session directory's size sampled every 5 s
#    (largest seen against the bound), files kept, whether it decodes, the report's head.
#    With AON_LONG_BG=1 the long run is started in the background (its binaries copied to /tmp, its
#    files under /tmp/gpufl-aon) and phase aon-wait collects it, in this call or a later one on the
#    same machine, so other phases can run meanwhile.
AO="$S/aon"; mkdir -p "$AO"
. scripts/gpu-phases/lib/aon-long.sh
[ "${AON_LONG_S:-600}" -gt 0 ] && [ "${AON_LONG_BG:-0}" = 1 ] && aon_long_start
log "(aon) trigger window: crash_train.py 12 s under --always-on, gpufl trigger PID --seconds 2 3 s into the loop"
gpufl record -q --always-on -o "$AO/trig" -- $PY examples/crash_train.py --end none --at 12 \
  >"$AO/trig.out" 2>"$AO/trig.err" &
RPID=$!
# The loop starts when the child prints START (after CUDA and the model are set up).
CPID=""
for i in $(seq 120); do
  grep -q '^START' "$AO/trig.out" 2>/dev/null && CPID=$(pgrep -f "examples/crash_train.py --end none --at 12" |
    while read p; do grep -q libgpufl_capture /proc/$p/maps 2>/dev/null && echo $p; done | head -1)
  [ -n "$CPID" ] && break; sleep 0.5
done
sleep 3
echo "recorded child pid: ${CPID:-none}" | tee -a "$OUT/summary.txt"
[ -n "$CPID" ] && gpufl trigger "$CPID" --seconds 2 2>&1 | tee -a "$OUT/summary.txt"
wait $RPID; echo "gpufl record exit $?" | tee -a "$OUT/summary.txt"
d=$(newest "$AO/trig")
gpufl info "$d" 2>&1 | tee -a "$OUT/summary.txt"
gpufl dump "$d" --type window,kernel,callsite,sync > "$AO/trig.ndjson" 2>"$AO/trig.dump.err"
$PY - "$AO/trig.ndjson" <<'PYEOF' 2>&1 | tee -a "$OUT/summary.txt"
import collections, json, sys
wins, kern, sites, syncs = [], {}, [], []
for line in open(sys.argv[1]):
    r = json.loads(line)
    {"window": wins.append, "callsite": sites.append, "sync": syncs.append}.get(r["t"], lambda r: None)(r)
    if r["t"] == "kernel":
        kern[r["corr"]] = r
print(f"windows: {len(wins)} ({', '.join(sorted(set(w['reason'] for w in wins)))}); kernels {len(kern)}")
trig = [w for w in wins if w["reason"] == "trigger"]
for w in trig:
    inw = lambda t: w["start"] <= t <= w["end"]
    # Every sampled launch call site inside (up to 5 ms before the end) has its kernel.
    launches = [c for c in sites if "Launch" in c.get("api", "") and w["start"] <= c["ts"] <= w["end"] - 5_000_000]
    missing = [c for c in launches if c["corr"] not in kern]
    # Kernels between consecutive syncs (one training step each): all steps alike when none is lost.
    ks = sorted(k["corr"] for k in kern.values() if inw(k["start"]))
    ss = sorted(s["corr"] for s in syncs if inw(s["start"]))
    per = collections.Counter(sum(1 for c in ks if a < c < b) for a, b in zip(ss, ss[1:]))
    print(f"trigger window {(w['end'] - w['start']) / 1e9:.3f} s: {len(ks)} kernels; {len(launches)} sampled launch "
          f"call sites, {len(missing)} without their kernel; kernels per step between syncs: {per.most_common(4)}")
    print("TRIGGER OK" if ks and not missing and len(per) == 1 else "TRIGGER FAILED")
if not trig:
    print("TRIGGER FAILED: no trigger window")
outside = [k for k in kern.values() if not any(w["start"] <= k["start"] <= w["end"] for w in wins)]
print(f"kernels outside every window: {len(outside)}")
PYEOF
rm -f "$AO/trig.ndjson"

if [ "${AON_LONG_S:-600}" -gt 0 ] && [ "${AON_LONG_BG:-0}" != 1 ]; then
  aon_long_start
  aon_long_wait
fi
