#!/usr/bin/env bash
# Where the recorder's cost per kernel launch goes, on a plain CUDA C++ launch loop
# (examples/launch_bound.cu: tiny kernels back to back on one stream, no Python, so the host cost
# per launch is measured with little noise). One process per mode, modes interleaved, ROUNDS rounds;
# prints one JSON line per process ({"mode": M, "us_per_launch": X}) and a table of medians.
# Runs on the device machine: bash bench/launch_split.sh [launches=20000] [rounds=7]
set -u
N=${1:-20000}; ROUNDS=${2:-7}
OUT=${OUT:-/tmp/gpufl-out}; S=$(mktemp -d); BIN=build/launch_bound
K="GPUFL_ENABLE_SYNCHRONIZATION=0"; KO="--no-stacks --api-records none"
mode() { # name: run the loop once in that configuration
  case $1 in
    bare) $BIN $N ;;
    subscribed-no-kinds) env $K GPUFL_ACTIVITY_KINDS=none gpufl record -q $KO -o $S -- $BIN $N ;;
    kernels-discard) env $K GPUFL_DISCARD=1 gpufl record -q $KO -o $S -- $BIN $N ;;
    kernels-iterate) env $K GPUFL_DISCARD=iterate gpufl record -q $KO -o $S -- $BIN $N ;;
    kernels-decode) env $K GPUFL_DISCARD=decode gpufl record -q $KO -o $S -- $BIN $N ;;
    kernels-only) env $K gpufl record -q $KO -o $S -- $BIN $N ;;
    kernels-kind-only) env $K GPUFL_ACTIVITY_KINDS=kernels gpufl record -q $KO -o $S -- $BIN $N ;;
    kernels-shared-buffers) env $K GPUFL_PER_THREAD_BUFFERS=0 gpufl record -q $KO -o $S -- $BIN $N ;;
    no-api) gpufl record -q --api-records none -o $S -- $BIN $N ;;
    no-sites) GPUFL_SITE_STACKS=0 gpufl record -q -o $S -- $BIN $N ;;
    full) gpufl record -q -o $S -- $BIN $N ;;
  esac
}
MODES=${SPLIT_MODES:-"bare subscribed-no-kinds kernels-discard kernels-iterate kernels-decode kernels-kind-only kernels-only kernels-shared-buffers no-api no-sites full"}
for r in $(seq $ROUNDS); do
  for m in $MODES; do
    GPUFL_EXAMPLE_TIMING=1 mode $m 2>&1 >/dev/null | grep '^{' | sed "s/^{/{\"mode\": \"$m\", \"round\": $r, /"
    rm -rf "$S"/*
  done
done | tee "$OUT/launch_split.jsonl"
python3 - "$OUT/launch_split.jsonl" <<'PY'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.startswith("{")]
by = {}
for r in rows:
    by.setdefault(r["mode"], {})[r["round"]] = r["us_per_launch"]
base = by.get("bare", {})
print(f"{'mode':24s} {'µs/launch (median)':>18s} {'min':>7s} {'paired ratio to bare (median [range])':>40s}")
for m, v in by.items():
    vals = list(v.values())
    pr = [v[k] / base[k] for k in v if k in base]
    print(f"{m:24s} {statistics.median(vals):18.3f} {min(vals):7.3f}   "
          f"{statistics.median(pr):.3f}x [{min(pr):.3f}-{max(pr):.3f}]" if pr else m)
PY
rm -rf "$S"
