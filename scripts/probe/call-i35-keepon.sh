# Device call for issue 35: with call-site (and other API) callbacks never switched off while
# CUPTI is attached in a detaching session (collection::switch_callback), do detaching processes
# still die? CUPTI alone (detachloop case 13: launch callbacks on with each window, removed by the
# detach; case 12, switched off too, as control), gpufl's C++ launch loop and PyTorch loops
# detaching every 0.5 s, then the launch loop's cost per launch over time, bare / always-on /
# always-on kept attached.   OUT=... bash scripts/probe/call-i35-keepon.sh
set -u
export OUT=${OUT:-/tmp/gpufl-out}; mkdir -p "$OUT" build
BIN=$PWD/.device-bin; export PATH=$BIN:$PATH GPUFL_CAPTURE_LIB=$BIN/libgpufl_capture.so
PROBE_TIMEOUT=200 bash scripts/probe/run-probe.sh detachloop ${DL_CASES:-13 13 12} --reps ${DL_REPS:-3} | grep -v "^  cupti"
VARIANTS="GPUFL_DETACH_SETTLE_MS=1" REPS=${LC_REPS:-10} bash scripts/probe/call-i35-settle.sh 2>&1 | grep -v "line 1[01]:"
bash scripts/probe/torch-detach-loops.sh
CLOCK=0 REPS=${TL_REPS:-1} LC_TIMELINE=0.5 LC_ARGS="${TL_ROUNDS:-1000} 2000" \
  MODES="bare always-on always-on+GPUFL_DETACH=0" bash scripts/probe/launch-cost.sh > /dev/null 2>&1
sed 's/LC_TIMELINE *//; s/ (n=[0-9]*)//; s/ ns$//; s/ s: /:/' "$OUT/launchcost.txt" | awk '/^[a-z]/{printf "\n%s", $0; next} {printf " %s", $0} END{print ""}' | cut -c1-900
