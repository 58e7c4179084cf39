# Phase trainerbench (sourced by scripts/gpu-check.sh): the cost of recording on a HuggingFace Trainer
# run (bench/trainer_bench.py), one process per mode, TRAINER_ROUNDS (default 8) interleaved rounds,
# the order of the modes reversed every other round; bare and bare-again are two unrecorded processes
# per round (the noise control). ~11 s a process: 8 rounds x 5 modes ~ 7.5 min.
log "(t) Trainer overhead: bench/trainer_bench.py, ${TRAINER_ROUNDS:-8} interleaved rounds"
TB="$S/trainerbench"; mkdir -p "$TB"
TBA="bench/trainer_bench.py --steps ${TRAINER_STEPS:-120} --warmup ${TRAINER_WARMUP:-20} --mode"
TMODES=${TRAINER_MODES:-"bare gpufl-default gpufl-always-on torch-profiler bare-again"}
run_trainer() {
  case $1 in
    bare|bare-again) $PY $TBA $1 ;;
    gpufl-default) gpufl record -q -o "$TB/default" -- $PY $TBA $1 ;;
    gpufl-always-on) gpufl record -q --always-on -o "$TB/always-on" -- $PY $TBA $1 ;;
    gpufl-no-sites) GPUFL_SITE_STACKS=0 gpufl record -q -o "$TB/nosites" -- $PY $TBA $1 ;;
    torch-profiler) $PY $TBA $1 --profiler ;;
  esac
}
for round in $(seq ${TRAINER_ROUNDS:-8}); do
  echo "{\"round\": $round}"
  order=$TMODES; [ $((round % 2)) = 0 ] && order=$(echo $TMODES | tr ' ' '\n' | tac | tr '\n' ' ')
  for m in $order; do run_trainer $m; done
  # Keep the last round's sessions for the notices below.
  [ "$round" -lt "${TRAINER_ROUNDS:-8}" ] && rm -rf "$TB"/*/
done 2>&1 | grep '^{' | tee -a "$OUT/trainerbench.jsonl"
$PY bench/summarize.py "$OUT/trainerbench.jsonl" | tee -a "$OUT/summary.txt"
for d in "$TB"/*/*/; do
  [ -d "$d" ] || continue
  echo "-- $d" | tee -a "$OUT/summary.txt"
  gpufl info "$d" 2>&1 | grep -E "kernels|syncs|bytes|windows|files" | head -5 | tee -a "$OUT/summary.txt"
  gpufl dump "$d" --type notice 2>/dev/null | grep -h -e "stack capture" -e "call-site" -e "budget" | tee -a "$OUT/summary.txt"
done
rm -rf "$TB"
