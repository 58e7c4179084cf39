# Phase floor (sourced by scripts/gpu-check.sh): what merely loading gpufl costs a process, mode
# by mode, on the launch-bound loop (bench/launch_bound.py, one process per mode, FLOOR_ROUNDS
# interleaved rounds, default 8; order reversed every other round; bare and bare-again are the
# noise control):
#   gpufl-no-cupti   recorder loaded by `gpufl record`, CUPTI not found (GPUFL_CUPTI_LIB points
#                    nowhere): it says so once and stays out of the way
#   gpufl-subscribed CUPTI subscribed, nothing collected (no activity kind, callback, API record,
#                    stack or telemetry)
#   gpufl-default, gpufl-always-on
log "(floor) cost of a loaded recorder, process per mode, ${FLOOR_ROUNDS:-8} rounds (launch-bound loop)"
FL="$S/floor"; LBF="bench/launch_bound.py --steps 200 --repeat 4 --mode"
FMODES=${FLOOR_MODES:-"bare gpufl-no-cupti gpufl-subscribed gpufl-default gpufl-always-on bare-again"}
run_floor() {
  case $1 in
    bare|bare-again) $PY $LBF $1 ;;
    gpufl-no-cupti) GPUFL_CUPTI_LIB=/nonexistent/libcupti.so gpufl record -q -o "$FL" -- $PY $LBF $1 ;;
    gpufl-subscribed) env GPUFL_ACTIVITY_KINDS=none GPUFL_TELEMETRY_MS=0 GPUFL_ENABLE_SYNCHRONIZATION=0 \
      gpufl record -q --no-stacks --api-records none -o "$FL" -- $PY $LBF $1 ;;
    gpufl-default) gpufl record -q -o "$FL" -- $PY $LBF $1 ;;
    gpufl-always-on) gpufl record -q --always-on -o "$FL" -- $PY $LBF $1 ;;
  esac
}
for round in $(seq ${FLOOR_ROUNDS:-8}); do
  echo "{\"round\": $round}"
  order=$FMODES; [ $((round % 2)) = 0 ] && order=$(echo $FMODES | tr ' ' '\n' | tac | tr '\n' ' ')
  for m in $order; do run_floor $m; done
  rm -rf "$FL"
done 2>&1 | grep '^{"' | tee -a "$OUT/floor.jsonl"
$PY bench/summarize.py "$OUT/floor.jsonl" | tee -a "$OUT/summary.txt"
