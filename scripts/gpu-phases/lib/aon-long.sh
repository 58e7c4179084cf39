# The long always-on run of phases aon / aon-wait (sourced). Files under /tmp/gpufl-aon, binaries
# copied there, so a run started in one device call outlives that call's $OUT and working tree.
AL=/tmp/gpufl-aon
aon_long_start() {
  log "(aon) long run: ${AON_LONG_S:-600} s under --always-on, GPUFL_MAX_DISK_MB=${AON_DISK_MB:-4}"
  rm -rf "$AL"; mkdir -p "$AL/bin"; cp "$BIN"/gpufl "$BIN"/libgpufl_capture.so "$AL/bin/"
  echo "${AON_DISK_MB:-4}" > "$AL/bound_mb"
  setsid bash -c "GPUFL_CAPTURE_LIB=$AL/bin/libgpufl_capture.so GPUFL_MAX_DISK_MB=${AON_DISK_MB:-4} \
      $AL/bin/gpufl record -q --always-on -o $AL/long -- $PY $ROOT/examples/crash_train.py --end none \
      --at ${AON_LONG_S:-600} >$AL/long.out 2>$AL/long.err; echo \"exit \$?\" > $AL/long.exit" \
      </dev/null >/dev/null 2>&1 &
  setsid bash -c "while [ ! -f $AL/long.exit ]; do d=\$(ls -dt $AL/long/*/ 2>/dev/null | head -1); \
      [ -n \"\$d\" ] && echo \$(date +%s) \$(du -sb \$d | cut -f1) >> $AL/du.log; sleep 5; done" \
      </dev/null >/dev/null 2>&1 &
  date +%s > "$AL/started"
}
aon_long_wait() {
  [ -f "$AL/started" ] || { log "(aon-wait) no long run was started on this machine"; return; }
  log "(aon) waiting for the long always-on run (started $(( $(date +%s) - $(cat "$AL/started") )) s ago)"
  while [ ! -f "$AL/long.exit" ] && pgrep -f "$AL/bin/gpufl record" >/dev/null; do sleep 5; done
  sleep 6
  local d; d=$(ls -dt "$AL"/long/*/ 2>/dev/null | head -1)
  echo "long run: $(cat "$AL/long.exit" 2>/dev/null || echo 'no exit status: killed?'); wall $(( $(date +%s) - $(cat "$AL/started") )) s; bound $(cat "$AL/bound_mb") MB" | tee -a "$OUT/summary.txt"
  sort -n -k2 "$AL/du.log" | tail -1 | awk '{printf "largest session size seen: %.2f MB\n", $2/1048576}' | tee -a "$OUT/summary.txt"
  echo "size samples: $(wc -l < "$AL/du.log") (first $(head -1 "$AL/du.log"), last $(tail -1 "$AL/du.log"))" | tee -a "$OUT/summary.txt"
  ls -la "$d" "$d"/*/ | tee -a "$OUT/summary.txt"
  tail -2 "$AL/long.out" | tee -a "$OUT/summary.txt"; tail -5 "$AL/long.err" | tee -a "$OUT/summary.txt"
  gpufl info "$d" 2>&1 | tee -a "$OUT/summary.txt"
  gpufl report --color never "$d" 2>&1 | head -40 | tee -a "$OUT/summary.txt"
}
