# One device call for issue 35: what stays on after an always-on window closes?
#   OUT=... bash scripts/probe/call-i35-linger.sh
# 1. scripts/probe/kernlinger.cu (CUPTI alone, cases 0-9, twice); 2. the C++ launch loop's cost
# per launch over time under always-on variants (LC_MODES).
set -u
export OUT=${OUT:-/tmp/gpufl-out}
for rep in 1 2; do bash scripts/probe/run-probe.sh kernlinger ${KL_CASES:-} 2>&1 | grep -v "^ *$"; done
CLOCK=0 REPS=${LC_REPS:-1} LC_TIMELINE=${LC_TIMELINE:-0.5} LC_ARGS="${LC_ROUNDS:-800} 2000" \
  MODES="${LC_MODES:-always-on always-on+GPUFL_SITE_STACKS=0 always-on+GPUFL_ACTIVITY_KINDS=none always-on+GPUFL_ACTIVITY_KINDS=kernels+GPUFL_SITE_STACKS=0 always-on+GPUFL_HW_TRACE=1 always-on+GPUFL_PER_THREAD_BUFFERS=0}" \
  bash scripts/probe/launch-cost.sh > /dev/null 2>&1
sed 's/LC_TIMELINE *//; s/ (n=[0-9]*)//; s/ ns$//; s/ s: /:/' "$OUT/launchcost.txt" | awk '/^[a-z]/{printf "\n%s", $0; next} {printf " %s", $0} END{print ""}'
