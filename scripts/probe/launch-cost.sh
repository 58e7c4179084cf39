#!/usr/bin/env bash
# Probe (GPU machine): the clock's cost (clock-cost.sh), then the launching thread's cost per
# kernel launch in a C++ loop (launchcost.cu), bare and under each recording mode, REPS times
# interleaved (MODES, REPS; LC_ARGS: rounds and batch; LC_TOGGLE=1: in-process A/B, see
# launchcost.cu). Logs under $OUT.
set -u
OUT=${OUT:-/tmp/gpufl-out}; mkdir -p "$OUT"
BIN=$PWD/.device-bin; export PATH=$BIN:$PATH GPUFL_CAPTURE_LIB=$BIN/libgpufl_capture.so
[ "${CLOCK:-1}" = 1 ] && bash scripts/probe/clock-cost.sh
nvcc -O2 -o /tmp/launchcost scripts/probe/launchcost.cu -ldl || exit 1
K="GPUFL_ENABLE_SYNCHRONIZATION=0 gpufl record -q --no-stacks --api-records none"
LC_ARGS=${LC_ARGS:-}
one() { # mode, optionally +VAR=value+…: those variables set for the recorded process
  local IFS=+; set -- $1; IFS=' '
  local m=$1; shift
  ( [ $# -gt 0 ] && export "$@"; mode_cmd "$m" )
}
mode_cmd() {
  case $1 in
    bare|bare-again) /tmp/launchcost $LC_ARGS ;;
    subscribed) env GPUFL_ACTIVITY_KINDS=none GPUFL_TELEMETRY_MS=0 $K -o /tmp/lc -- /tmp/launchcost $LC_ARGS ;;
    kernels-discard) env GPUFL_ACTIVITY_KINDS=kernels GPUFL_DISCARD=1 GPUFL_TELEMETRY_MS=0 $K -o /tmp/lc -- /tmp/launchcost $LC_ARGS ;;
    kernels-only) env $K -o /tmp/lc -- /tmp/launchcost $LC_ARGS ;;
    no-sync) GPUFL_ENABLE_SYNCHRONIZATION=0 gpufl record -q -o /tmp/lc -- /tmp/launchcost $LC_ARGS ;;
    api-only) GPUFL_ENABLE_SYNCHRONIZATION=0 gpufl record -q --no-stacks -o /tmp/lc -- /tmp/launchcost $LC_ARGS ;;
    sync-only) env GPUFL_ACTIVITY_KINDS=none GPUFL_TELEMETRY_MS=0 gpufl record -q --no-stacks --api-records none -o /tmp/lc -- /tmp/launchcost $LC_ARGS ;;
    no-api) gpufl record -q --api-records none -o /tmp/lc -- /tmp/launchcost $LC_ARGS ;;
    default) gpufl record -q -o /tmp/lc -- /tmp/launchcost $LC_ARGS ;;
    runtime-sites) GPUFL_SITE_DOMAINS=runtime gpufl record -q -o /tmp/lc -- /tmp/launchcost $LC_ARGS ;;
    no-sites) GPUFL_SITE_STACKS=0 gpufl record -q -o /tmp/lc -- /tmp/launchcost $LC_ARGS ;;
    pinned) taskset -c ${PIN_CPU:-5} /tmp/launchcost $LC_ARGS ;;
    always-on) gpufl record -q --always-on -o /tmp/lc -- /tmp/launchcost $LC_ARGS ;;
    no-mem) gpufl record -q --no-mem-records -o /tmp/lc -- /tmp/launchcost $LC_ARGS ;;
    always-on-nowin) GPUFL_ALWAYS_ON_BUDGET=0 gpufl record -q --always-on -o /tmp/lc -- /tmp/launchcost $LC_ARGS ;;
    always-on-no-mem) gpufl record -q --always-on --no-mem-records -o /tmp/lc -- /tmp/launchcost $LC_ARGS ;;
  esac
}
for rep in $(seq ${REPS:-3}); do
  for m in ${MODES:-bare subscribed kernels-discard kernels-only no-sync no-api default always-on}; do
    echo "$m: $(one $m 2>&1 | grep -e 'launch ns' -e 'toggle' -e LC_)"
    # A recorded process's detaches (always-on: crate::detach), indented.
    f=$(find /tmp/lc -name trace-0000.ndjson.zst 2>/dev/null | head -1)
    [ -n "$f" ] && gpufl dump "$(dirname "$f")" --type notice 2>/dev/null | grep -o 'CUPTI detached[^"]*' | cut -c1-220 | sed 's/^/    /'
    rm -rf /tmp/lc
  done
done 2>&1 | tee "$OUT/launchcost.txt"
