# Device call for issue 35 (nvidia-h200): where always-on's cost on the short Trainer falls —
# forked rounds (whole train(), and train()'s start to the end of its 20 warm-up steps, where
# start-up costs fall) of bare, always-on, always-on without the module-loaded callback, always-on
# with synchronizations only, CUPTI subscribed with nothing collected, bare-again (WARM_SET=1);
# WARM_SET=2: always-on and synchronizations only, each with and without native symbolization on
# the writer thread (GPUFL_SYMBOLIZE=0), and synchronizations without stacks.
#   OUT=... bash scripts/probe/call-i35-warm.sh [rounds]
set -u
export OUT=${OUT:-/tmp/gpufl-out}; mkdir -p "$OUT"
SYNCS_ONLY=GPUFL_ALWAYS_ON_BUDGET=0+GPUFL_HOST_SAMPLES=0+GPUFL_HOSTCALL_US=0+GPUFL_MEM_RECORDS=0+GPUFL_TELEMETRY_MS=0+GPUFL_MODULE_FRAMES=0
NOTHING=GPUFL_ACTIVITY_KINDS=none+GPUFL_TELEMETRY_MS=0+GPUFL_ENABLE_SYNCHRONIZATION=0+GPUFL_ENABLE_STACK_TRACE=0+GPUFL_API_RECORDS=none+GPUFL_HOST_SAMPLES=0+GPUFL_HOSTCALL_US=0+GPUFL_MEM_RECORDS=0+GPUFL_MODULE_FRAMES=0
case ${WARM_SET:-1} in
  1) FM=bare,gpufl-always-on,gpufl-always-on+GPUFL_MODULE_FRAMES=0,gpufl-always-on+$SYNCS_ONLY,gpufl-default+$NOTHING,bare-again ;;
  # Native symbolization on the writer thread, and stacks at all.
  2) FM=bare,gpufl-always-on,gpufl-always-on+GPUFL_SYMBOLIZE=0,gpufl-always-on+$SYNCS_ONLY,gpufl-always-on+$SYNCS_ONLY+GPUFL_SYMBOLIZE=0,gpufl-always-on+$SYNCS_ONLY+GPUFL_ENABLE_STACK_TRACE=0,bare-again ;;
esac
FM=${FORK_MODES:-$FM}
TRAINER_ROUNDS=0 TRAINER_FORK=${1:-12} TRAINER_FORK_MODES=$FM bash scripts/gpu-check.sh trainerbench > "$OUT/trainer.log" 2>&1
grep -v '^== \|^--' "$OUT/summary.txt" | cut -c1-400 | head -80
python3 scripts/probe/warm_profile.py "$OUT/trainerfork.jsonl"
