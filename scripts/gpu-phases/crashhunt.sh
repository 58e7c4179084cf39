# Phase crashhunt (sourced by scripts/gpu-check.sh): run the default recording of the Trainer
# benchmark (bench/trainer_bench.py) CRASH_RUNS times (default 20) and keep what a failed run
# leaves: its exit status, its stderr (the recorder's fault line `gpufl: SIGSEGV on thread … at pc
# … in MODULE+0x…`, Python's faulthandler traceback of every thread) and its session's notices.
# CRASH_ENV: extra environment for the recorded process (e.g. GPUFL_XTHREAD_DIRECT=0).
CH="$S/crashhunt"; mkdir -p "$CH"
log "(c) crash hunt: ${CRASH_RUNS:-20} default Trainer runs, ${TRAINER_STEPS:-220} steps ${CRASH_ENV:-}"
fails=0
for i in $(seq ${CRASH_RUNS:-20}); do
  rm -rf "$CH"/*
  env PYTHONFAULTHANDLER=1 ${CRASH_ENV:-} gpufl record -q -o "$CH" -- $PY bench/trainer_bench.py \
    --mode gpufl-default --steps ${TRAINER_STEPS:-220} --warmup 20 > "$OUT/crash-$i.out" 2> "$OUT/crash-$i.err"
  rc=$?
  if [ $rc != 0 ]; then
    fails=$((fails + 1))
    echo "FAIL run $i status $rc" | tee -a "$OUT/summary.txt"
    grep -a -E "gpufl: SIG|Fatal Python|Segmentation|Thread 0x|File \"" "$OUT/crash-$i.err" | head -60 | tee -a "$OUT/summary.txt"
    for d in "$CH"/*/; do
      gpufl dump "$d" --type notice 2>&1 | cut -c1-600 | tee -a "$OUT/summary.txt"
      gpufl info "$d" 2>&1 | tail -4 | tee -a "$OUT/summary.txt"
      cp "$d"/trace-0000.ndjson.zst "$OUT/crash-$i-trace.zst" 2>/dev/null
    done
  else
    rm -f "$OUT/crash-$i.err" "$OUT/crash-$i.out"
  fi
done
log "crash hunt: $fails of ${CRASH_RUNS:-20} runs failed"
