#!/usr/bin/env bash
# A long fuzzing run (docs/robustness.md): the fuzz test of gpufl-cli, built with optimizations, in
# chunks of CHUNK seconds for TOTAL seconds, each chunk from its own seed. An input over the heap or
# time cap aborts its chunk (the log names its seed) and the next chunk goes on.
#   bash scripts/fuzz-long.sh [TOTAL_SECS=3900] [CHUNK_SECS=600] [FIRST_SEED=from the clock]
set -uo pipefail
cd "$(dirname "$0")/.."
total=${1:-3900}
chunk=${2:-600}
seed=${3:-$(( $(date +%s) * 1000003 ))}
cargo test --release -p gpufl-cli --bin gpufl --no-run 2>&1 | tail -1
bin=$(cargo test --release -p gpufl-cli --bin gpufl --no-run --message-format=json 2>/dev/null \
  | sed -n 's/.*"executable":"\([^"]*\)".*/\1/p' | tail -1)
echo "fuzz-long: $(date -u +%FT%TZ) total ${total}s in chunks of ${chunk}s, first seed $seed, $bin"
start=$(date +%s)
n=0
while [ $(( $(date +%s) - start )) -lt "$total" ]; do
  left=$(( total - ($(date +%s) - start) ))
  secs=$(( left < chunk ? left : chunk ))
  s=$(( seed + n * 1000000000 ))
  echo "fuzz-long: chunk $n, seed $s, ${secs}s, $(date -u +%FT%TZ)"
  GPUFL_FUZZ_SECS=$secs GPUFL_FUZZ_SEED=$s "$bin" fuzz::fuzz --exact --nocapture 2>&1 \
    | grep -E "^fuzz|panicked|test result|FAILED|abort" | cut -c1-2000
  echo "fuzz-long: chunk $n exit ${PIPESTATUS[0]}"
  n=$((n + 1))
done
echo "fuzz-long: done $(date -u +%FT%TZ) after $(( $(date +%s) - start ))s, $n chunk(s)"
