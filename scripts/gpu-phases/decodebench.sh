# Phase decodebench (sourced by scripts/gpu-check.sh; needs no GPU): analysis throughput on the
# device machine's cores (issue 13). Runs .device-bin/decodebench (scripts/prepare-device-bin.sh
# builds it: the `decodebench` example of gpufl-analysis, no cargo needed here) on the `load`
# bench's synthetic session: decode + Model::load + analyze of DECODEBENCH_RECORDS (default
# 10,000,000) timed records on 1, 2, 4, 8 and 16 threads (DECODEBENCH_THREADS), DECODEBENCH_REPEAT
# runs each (default 3; the median is tabled), plus the sequential reader; peak heap per record
# from a counting allocator. One JSON line per run in $OUT/decodebench.jsonl; the log and the
# table (threads, seconds per phase, M records/s, speed-up over 1 thread, peak bytes per record)
# in $OUT/decodebench.txt and the summary; then `--scaling` (the machine alone: T threads each
# doing the same fixed work) in the same files. DECODEBENCH_FLOOR=1 adds `--floor` on the same
# session: zstd's own decompression of its blocks on one thread (checksum checked and ignored,
# with and without counting line ends), against the 2 s that 5 M records/s allows.
DB_BIN="$BIN/decodebench"
if [ ! -x "$DB_BIN" ]; then
  log "(d) decodebench: skipped, $DB_BIN missing (run scripts/prepare-device-bin.sh and carry .device-bin)"
else
  log "(d) decodebench: ${DECODEBENCH_RECORDS:-10000000} records, threads ${DECODEBENCH_THREADS:-1,2,4,8,16}, $(nproc) cores"
  "$DB_BIN" --records "${DECODEBENCH_RECORDS:-10000000}" --threads "${DECODEBENCH_THREADS:-1,2,4,8,16}" \
    --repeat "${DECODEBENCH_REPEAT:-3}" --sequential --save "${TMPDIR:-/tmp}/decodebench.zst" \
    >"$OUT/decodebench.jsonl" 2>"$OUT/decodebench.txt"
  echo "rc $?" >>"$OUT/decodebench.txt"
  if [ "${DECODEBENCH_FLOOR:-0}" = 1 ]; then
    "$DB_BIN" --floor --input "${TMPDIR:-/tmp}/decodebench.zst" --repeat "${DECODEBENCH_REPEAT:-3}" \
      >>"$OUT/decodebench.jsonl" 2>>"$OUT/decodebench.txt"
    sed -n '/^zstd floor/,/^| zstd + line/p' "$OUT/decodebench.txt" | tee -a "$OUT/summary.txt"
  fi
  rm -f "${TMPDIR:-/tmp}/decodebench.zst"
  # How the machine itself scales (independent fixed work per thread: compute, memory, one
  # sequential decoder per thread): separates the machine's limits from the reader's.
  "$DB_BIN" --scaling --threads "${DECODEBENCH_THREADS:-1,2,4,8,16}" \
    >>"$OUT/decodebench.jsonl" 2>>"$OUT/decodebench.txt"
  sed -n '/^machine scaling/,/^| decode | 16/p' "$OUT/decodebench.txt" | tee -a "$OUT/summary.txt"
  lscpu 2>/dev/null | grep -E "Model name|^CPU\(s\)|Thread|Socket|NUMA node\(s\)" >>"$OUT/decodebench.txt"
  # The table (and the lines around it) in the summary; the per-run lines stay in the file.
  sed -n '/^decode + Model::load/,$p' "$OUT/decodebench.txt" | tee -a "$OUT/summary.txt"
fi
