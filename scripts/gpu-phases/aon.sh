# Phase aon (sourced by scripts/gpu-check.sh): always-on mode on the GPU.
# 1. Trigger: examples/crash_train.py (a PyTorch loop, .item() each step) for 12 s under
#    `gpufl record --always-on`; after 5 s `gpufl trigger PID --seconds 2`. Checks: a `trigger`
#    window in the session; every launch API call inside it (up to 5 ms before its end) has its
#    kernel record (same correlation id); kernels outside windows: none.
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
gpufl dump "$d" --type window,kernel,api > "$AO/trig.ndjson" 2>"$AO/trig.dump.err"
$PY - "$AO/trig.ndjson" <<'PYEOF' 2>&1 | tee -a "$OUT/summary.txt"
import json, sys
wins, kern, launches = [], {}, []
for line in open(sys.argv[1]):
    r = json.loads(line)
    if r["t"] == "window":
        wins.append(r)
    elif r["t"] == "kernel":
        kern[r["corr"]] = r
    elif r["t"] == "api" and "Launch" in r.get("name", ""):
        launches.append(r)
print(f"windows: {len(wins)} ({', '.join(sorted(set(w['reason'] for w in wins)))}); kernels {len(kern)}; launch API records {len(launches)}")
trig = [w for w in wins if w["reason"] == "trigger"]
for w in trig:
    span = (w["end"] - w["start"]) / 1e9
    inside = [a for a in launches if w["start"] <= a["start"] <= w["end"] - 5_000_000]
    missing = [a for a in inside if a["corr"] not in kern]
    kin = sum(1 for k in kern.values() if w["start"] <= k["start"] <= w["end"])
    print(f"trigger window {span:.3f} s: {len(inside)} launch calls, {len(inside) - len(missing)} with their kernel, "
          f"{len(missing)} missing; {kin} kernels started inside")
    print("TRIGGER OK" if inside and not missing else "TRIGGER FAILED")
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
