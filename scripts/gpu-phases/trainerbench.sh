# Phase trainerbench (sourced by scripts/gpu-check.sh): the cost of recording on a HuggingFace Trainer
# run (bench/trainer_bench.py).
# Modes: bare, bare-again, gpufl-default, gpufl-always-on, torch-profiler, gpufl-no-sites,
# gpufl-no-api (no API records), gpufl-api-runtime (API records of the runtime's functions only),
# gpufl-api-discard (API records collected by CUPTI, dropped by the writer unwritten),
# gpufl-api-cb (launch api records made by the call-site callbacks, GPUFL_API_FROM=callbacks),
# gpufl-kernels-only, gpufl-subscribed (CUPTI subscribed, nothing collected, no telemetry),
# gpufl-no-telemetry, gpufl-no-mem (no mem records, issue 38), gpufl-no-host-samples (the host sampler off), gpufl-no-host-time (host sampler
# and hostcall records off: the recorder before issue 35), gpufl-always-on-no-host (likewise in
# always-on), gpufl-no-sync (no synchronization callbacks), cupti-kernels-discard
# (CUPTI's concurrent-kernel records only, returned unread: the floor of any recorder that collects
# every kernel through CUPTI).
# 1. One process per mode, TRAINER_ROUNDS (default 8; 0 skips) interleaved rounds, the order of the
#    modes reversed every other round; bare and bare-again are two unrecorded processes per round
#    (the noise control). ~20 s a process on the H100 machine (imports dominate).
#    TRAINER_DEADLINE_S (seconds since the phase began; default none): no round starts that the
#    last round's length says would end after it (a call's time limit cuts no process short).
# 2. In-process A/B (TRAINER_TOGGLE_PROCS processes per mode, default 0): recording on / paused /
#    paused in cycles of TRAINER_TOGGLE_K steps inside one recorded process (bench/summarize_toggle.py).
# 3. Forked rounds (TRAINER_FORK rounds, default 0; TRAINER_FORK_MODES, comma-separated): see below.
TB="$S/trainerbench"; mkdir -p "$TB"
TBA="bench/trainer_bench.py --steps ${TRAINER_STEPS:-120} --warmup ${TRAINER_WARMUP:-20} --mode"
TMODES=${TRAINER_MODES:-"bare gpufl-default gpufl-always-on torch-profiler bare-again"}
KOPTS="GPUFL_ENABLE_SYNCHRONIZATION=0 gpufl record -q --no-stacks --api-records none --no-host-samples --hostcall-us 0"
run_trainer() { # mode args...
  local m=$1; shift
  case $m in
    bare|bare-again) $PY bench/trainer_bench.py --mode $m "$@" ;;
    gpufl-default) gpufl record -q -o "$TB/default" -- $PY bench/trainer_bench.py --mode $m "$@" ;;
    gpufl-always-on) gpufl record -q --always-on -o "$TB/always-on" -- $PY bench/trainer_bench.py --mode $m "$@" ;;
    gpufl-no-api) gpufl record -q --api-records none -o "$TB/noapi" -- $PY bench/trainer_bench.py --mode $m "$@" ;;
    gpufl-api-runtime) GPUFL_API_DOMAINS=runtime gpufl record -q -o "$TB/apirt" -- $PY bench/trainer_bench.py --mode $m "$@" ;;
    gpufl-api-cb) GPUFL_API_FROM=callbacks gpufl record -q -o "$TB/apicb" -- $PY bench/trainer_bench.py --mode $m "$@" ;;
    gpufl-api-discard) GPUFL_API_DISCARD=1 gpufl record -q -o "$TB/apidis" -- $PY bench/trainer_bench.py --mode $m "$@" ;;
    gpufl-no-sync) GPUFL_ENABLE_SYNCHRONIZATION=0 gpufl record -q -o "$TB/nosync" -- $PY bench/trainer_bench.py --mode $m "$@" ;;
    gpufl-no-sites) GPUFL_SITE_STACKS=0 gpufl record -q -o "$TB/nosites" -- $PY bench/trainer_bench.py --mode $m "$@" ;;
    gpufl-kernels-only) env $KOPTS -o "$TB/kern" -- $PY bench/trainer_bench.py --mode $m "$@" ;;
    cupti-kernels-discard) env GPUFL_ACTIVITY_KINDS=kernels GPUFL_DISCARD=1 GPUFL_TELEMETRY_MS=0 $KOPTS -o "$TB/kdis" -- $PY bench/trainer_bench.py --mode $m "$@" ;;
    gpufl-subscribed) env GPUFL_ACTIVITY_KINDS=none GPUFL_TELEMETRY_MS=0 $KOPTS -o "$TB/sub" -- $PY bench/trainer_bench.py --mode $m "$@" ;;
    gpufl-no-telemetry) GPUFL_TELEMETRY_MS=0 gpufl record -q -o "$TB/notel" -- $PY bench/trainer_bench.py --mode $m "$@" ;;
    gpufl-no-host-samples) gpufl record -q --no-host-samples -o "$TB/nohs" -- $PY bench/trainer_bench.py --mode $m "$@" ;;
    gpufl-no-host-time) gpufl record -q --no-host-samples --hostcall-us 0 -o "$TB/nohost" -- $PY bench/trainer_bench.py --mode $m "$@" ;;
    gpufl-no-mem) gpufl record -q --no-mem-records -o "$TB/nomem" -- $PY bench/trainer_bench.py --mode $m "$@" ;;
    gpufl-always-on-no-host) gpufl record -q --always-on --no-host-samples --hostcall-us 0 -o "$TB/aon-nohost" -- $PY bench/trainer_bench.py --mode $m "$@" ;;
    torch-profiler) $PY bench/trainer_bench.py --mode $m "$@" --profiler ;;
  esac
}
if [ "${TRAINER_ROUNDS:-8}" -gt 0 ]; then
  log "(t) Trainer overhead: bench/trainer_bench.py, ${TRAINER_ROUNDS:-8} interleaved rounds: $TMODES"
  tb_begin=$SECONDS; tb_last=0
  for round in $(seq ${TRAINER_ROUNDS:-8}); do
    if [ -n "${TRAINER_DEADLINE_S:-}" ] && [ $((SECONDS - tb_begin + tb_last)) -gt "$TRAINER_DEADLINE_S" ]; then
      echo "STOP before round $round: $((SECONDS - tb_begin)) s gone, a round takes $tb_last s, deadline $TRAINER_DEADLINE_S s"
      break
    fi
    tb_round=$SECONDS
    # The sessions of the round before (the last round's stay for the notices below).
    rm -rf "$TB"/*/
    echo "{\"round\": $round}"
    order=$TMODES; [ $((round % 2)) = 0 ] && order=$(echo $TMODES | tr ' ' '\n' | tac | tr '\n' ' ')
    for m in $order; do
      tb_p=$SECONDS
      run_trainer $m --steps ${TRAINER_STEPS:-120} --warmup ${TRAINER_WARMUP:-20}; rc=$?
      echo "PROC round $round mode $m $((SECONDS - tb_p)) s"
      # A process that failed: its status, and its session kept for a look.
      if [ $rc != 0 ]; then
        echo "EXIT round $round mode $m status $rc"
        # Flat copies (the device tool does not bring back deep folders), with the notices.
        for f in "$TB"/*/*/trace-*.ndjson.zst; do
          [ -e "$f" ] || continue
          cp "$f" "$OUT/failed-$round-$m-$(basename "$(dirname "$f")")-$(basename "$f")"
          gpufl dump "$(dirname "$f")" --type notice 2>&1 | cut -c1-600
        done
      fi
    done
    tb_last=$((SECONDS - tb_round))
  done 2>&1 | tee -a "$OUT/trainerbench.log" | grep '^{"' | tee -a "$OUT/trainerbench.jsonl"
  $PY bench/summarize.py "$OUT/trainerbench.jsonl" | tee -a "$OUT/summary.txt"
fi
if [ "${TRAINER_TOGGLE_PROCS:-0}" -gt 0 ]; then
  K=${TRAINER_TOGGLE_K:-10}; C=${TRAINER_TOGGLE_CYCLES:-10}
  TT=${TRAINER_TOGGLE_MODES:-"bare gpufl-default gpufl-always-on gpufl-kernels-only"}
  log "(t2) Trainer in-process A/B: $TRAINER_TOGGLE_PROCS process(es) per mode, $C cycles of 3 x $K steps: $TT"
  for p in $(seq $TRAINER_TOGGLE_PROCS); do
    order=$TT; [ $((p % 2)) = 0 ] && order=$(echo $TT | tr ' ' '\n' | tac | tr '\n' ' ')
    for m in $order; do run_trainer $m --steps $((20 + 3 * K * C)) --warmup 20 --toggle $K; done
  done 2>&1 | grep '^{"' | tee -a "$OUT/trainertoggle.jsonl"
  $PY bench/summarize_toggle.py "$OUT/trainertoggle.jsonl" | tee -a "$OUT/summary.txt"
fi
if [ "${TRAINER_FORK:-0}" -gt 0 ]; then
  # 3. Forked rounds (bench/trainer_bench.py --fork): the imports once, then TRAINER_FORK
  #    interleaved rounds of TRAINER_FORK_MODES, each mode a fresh process forked before CUDA starts
  #    (~6 s a process instead of ~20): more rounds per device minute for the whole train().
  FM=${TRAINER_FORK_MODES:-"bare,gpufl-always-on,bare-again"}
  log "(t3) Trainer, forked rounds: $TRAINER_FORK rounds of $FM"
  $PY bench/trainer_bench.py --fork "$TRAINER_FORK" --fork-modes "$FM" --gpufl-lib "$GPUFL_CAPTURE_LIB" \
    --fork-out "$TB/fork" --steps ${TRAINER_STEPS:-120} --warmup ${TRAINER_WARMUP:-20} 2>"$OUT/trainerfork.err" \
    | grep '^{"' | tee -a "$OUT/trainerfork.jsonl" | cut -c1-200
  tail -5 "$OUT/trainerfork.err" | tee -a "$OUT/summary.txt"
  $PY bench/summarize.py "$OUT/trainerfork.jsonl" | tee -a "$OUT/summary.txt"
  ls "$TB/fork" | head -3 | tee -a "$OUT/summary.txt"
  d=$(ls -d "$TB"/fork/*always-on*/*/ 2>/dev/null | tail -1)
  [ -n "$d" ] && gpufl info "$d" 2>&1 | head -8 | tee -a "$OUT/summary.txt"
  # Always-on children: what their detaches did (crate::detach), counted by clause.
  for f in $(find "$TB/fork" -path '*always-on*' -name trace-0000.ndjson.zst 2>/dev/null); do
    gpufl dump "$(dirname "$f")" --type notice 2>/dev/null | grep -o 'CUPTI detached after [0-9]* windows\|[0-9]* times [a-z][^;"]*' || echo "no detach"
  done | sort | uniq -c | tee -a "$OUT/summary.txt"
  # TRAINER_FORK_NOTICES (a grep pattern, e.g. 'callback time\|stack capture'): those notices of
  # three always-on children (of the mode at place TRAINER_FORK_NOTICES_MODE in the list, from 0).
  if [ -n "${TRAINER_FORK_NOTICES:-}" ]; then
    for f in $(find "$TB/fork" -path "*always-on-${TRAINER_FORK_NOTICES_MODE:-*}/*" -name trace-0000.ndjson.zst 2>/dev/null | head -3); do
      echo "-- $(basename "$(dirname "$(dirname "$f")")")"
      gpufl dump "$(dirname "$f")" --type notice 2>/dev/null | grep -o "\"message\":\"\(${TRAINER_FORK_NOTICES}\)[^\"]*" | cut -c12-500
    done | tee -a "$OUT/summary.txt"
  fi
  rm -rf "$TB/fork"
fi
for d in "$TB"/*/*/; do
  [ -d "$d" ] || continue
  echo "-- $d" | tee -a "$OUT/summary.txt"
  gpufl info "$d" 2>&1 | grep -E "kernels|syncs|windows|files" | head -5 | tee -a "$OUT/summary.txt"
  gpufl dump "$d" --type notice 2>/dev/null | grep -h -e "stack capture" -e "call-site" -e "budget" -e "\"debug\"" | cut -c1-400 | tee -a "$OUT/summary.txt"
done
# The last round's sessions stay (in sessions.tgz).
