# Device call for issue 35: is it the call-site callbacks' switching with each window, or their
# stack walks, that makes a detach crash? CUPTI alone switching the launch callbacks with each
# window (detachloop case 12, against 0), then gpufl's launch loop detaching every 0.5 s with the
# call-site callbacks switched but almost no walk (GPUFL_SITE_BUDGET=0.0001), and with launch
# callbacks left out (GPUFL_SITE_KINDS=copy).   OUT=... bash scripts/probe/call-i35-next.sh
set -u
export OUT=${OUT:-/tmp/gpufl-out}; mkdir -p "$OUT"
CASES="12 0" PROBE_TIMEOUT=150 bash scripts/probe/call-i35-why.sh ${PROBE_REPS:-3} | grep -v "^gdb"
VARIANTS="GPUFL_SITE_BUDGET=0.0001 GPUFL_SITE_KINDS=copy" REPS=${REPS:-6} bash scripts/probe/call-i35-settle.sh 2>&1 | grep -v "line 1[01]:"
