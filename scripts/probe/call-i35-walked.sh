# Device call for issue 35: CUPTI alone with buffers read after a detach (detachloop cases 6, 7,
# against 0), then gpufl's detach stress and forked Trainer rounds (call-i35-crash.sh).
#   OUT=... bash scripts/probe/call-i35-walked.sh [Trainer rounds, default 5]
set -u
export OUT=${OUT:-/tmp/gpufl-out}; mkdir -p "$OUT"
CASES="6 7 0" PROBE_TIMEOUT=150 bash scripts/probe/call-i35-why.sh ${PROBE_REPS:-3} | grep -v "^gdb"
bash scripts/probe/call-i35-crash.sh ${1:-5}
