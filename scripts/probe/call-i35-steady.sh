# Device call for issue 35: always-on's steady-state cost on the C++ launch loop now that it
# detaches CUPTI after each window by default, against it attached (GPUFL_DETACH=0): LC_REPS
# interleaved rounds of bare / always-on / always-on attached / bare-again, one process each, the
# median ns per launch of each process's 0.5-s stretches after the first window
# (scripts/probe/lc_steady.py); then PyTorch loops detaching every 0.5 s (do they all exit 0?).
#   OUT=... bash scripts/probe/call-i35-steady.sh
set -u
export OUT=${OUT:-/tmp/gpufl-out}; mkdir -p "$OUT"
BIN=$PWD/.device-bin; export PATH=$BIN:$PATH GPUFL_CAPTURE_LIB=$BIN/libgpufl_capture.so
CLOCK=0 REPS=${LC_REPS:-8} LC_TIMELINE=0.5 LC_ARGS="${LC_ROUNDS:-600} 2000" \
  MODES="${LC_MODES:-bare always-on always-on+GPUFL_DETACH=0 bare-again}" bash scripts/probe/launch-cost.sh > /dev/null 2>&1
python3 scripts/probe/lc_steady.py "$OUT/launchcost.txt"
bash scripts/probe/torch-detach-loops.sh
