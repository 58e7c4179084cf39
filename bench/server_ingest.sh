#!/usr/bin/env bash
# Ingest throughput and memory of `gpufl serve` (embedded default: SQLite + a local directory,
# or the stores named by BENCH_DB / BENCH_STORE), release build, no GPU:
#   1. N copies of the bundled sessions (N=1000 by default; each under its own session id) are
#      uploaded to an instance that does not ingest (`--ingest-workers 0`): upload time;
#   2. an instance with W ingest workers (default 2) analyses the backlog: sessions/s and records/s
#      (records: the NDJSON records of the copies, counted with `gpufl dump`), its peak RSS;
#   3. with the N sessions stored: the peak RSS of a fresh instance answering the session list
#      (1,000 a page) and every session's detail.
# Usage: bash bench/server_ingest.sh [N] [W]
set -euo pipefail
cd "$(dirname "$0")/.."
N=${1:-1000}; W=${2:-2}
G=target/release/gpufl
[ -x $G ] || cargo build --release -p gpufl-cli
T=$(mktemp -d /tmp/gpufl-bench-XXXX); trap 'kill $(jobs -p) 2>/dev/null; rm -rf "$T"' EXIT
DATA=$T/data; mkdir -p $T/src
DBA=(); [ -n "${BENCH_DB:-}" ] && DBA=(--db "$BENCH_DB")
STA=(); [ -n "${BENCH_STORE:-}" ] && STA=(--store "$BENCH_STORE")
mapfile -t SRC < <(find testdata -name 'trace-*.ndjson.zst' -printf '%h\n' | sort -u)
recs=0; bytes=0
for i in $(seq 0 $((N - 1))); do
  s=${SRC[$((i % ${#SRC[@]}))]}; d=$T/src/$(basename "$s")-b$i; mkdir -p "$d"; cp "$s"/trace-*.ndjson.zst "$d"/
done
declare -A per
for s in "${SRC[@]}"; do per[$s]=$($G dump "$s" 2>/dev/null | wc -l); done
for i in $(seq 0 $((N - 1))); do s=${SRC[$((i % ${#SRC[@]}))]}; recs=$((recs + per[$s])); done
bytes=$(du -sb $T/src | cut -f1)
KEYS=$($G admin --data $DATA "${DBA[@]}" create-project bench 2>/dev/null)
UP=$(echo "$KEYS" | awk '/^upload/{print $3}'); RD=$(echo "$KEYS" | awk '/^read/{print $3}')
start_server() { # workers logfile
  $G serve --data $DATA "${DBA[@]}" "${STA[@]}" --listen 127.0.0.1:0 --rate-limit 0 --ingest-workers "$1" 2>"$2" &
  SP=$!
  for _ in $(seq 100); do grep -q "listening on" "$2" 2>/dev/null && break; sleep 0.1; done
  URL=$(grep -o 'http://[0-9.:]*' "$2" | head -1)
}
hwm() { awk '/VmHWM/{print $2}' /proc/$1/status; }
start_server 0 $T/s0.log
t0=$(date +%s.%N)
ls -d $T/src/* | xargs -P 4 -n 50 $G upload --server "$URL" --api-key "$UP" >/dev/null
t1=$(date +%s.%N)
kill $SP; wait $SP 2>/dev/null || true
echo "uploaded $N sessions ($bytes bytes, $recs records) in $(echo "$t1 - $t0" | bc) s (4 clients)"
start_server "$W" $T/s1.log
t0=$(date +%s.%N)
while :; do
  n=$(curl -s -H "Authorization: Bearer $RD" "$URL/api/v1/sessions?limit=1000" | grep -o '"ingest":"ready"' | wc -l)
  [ "$n" -ge "$N" ] && break
  sleep 0.2
done
t1=$(date +%s.%N)
el=$(echo "$t1 - $t0" | bc)
echo "ingested $N sessions in $el s with $W workers: $(echo "$N / $el" | bc -l | cut -c1-6) sessions/s, $(echo "$recs / $el" | bc -l | cut -c1-9) records/s; server peak RSS $(hwm $SP) KiB"
kill $SP; wait $SP 2>/dev/null || true
start_server 0 $T/s2.log
for o in 0 1000; do curl -s -o /dev/null -H "Authorization: Bearer $RD" "$URL/api/v1/sessions?limit=1000&offset=$o"; done
t0=$(date +%s.%N)
for d in $(ls $T/src | head -$N); do curl -s -o /dev/null -H "Authorization: Bearer $RD" "$URL/api/v1/sessions/$d"; done
t1=$(date +%s.%N)
echo "with $N sessions stored: list + $N details in $(echo "$t1 - $t0" | bc) s; server peak RSS $(hwm $SP) KiB; database $(du -sb $DATA/gpufl.db 2>/dev/null | cut -f1) bytes, store $(du -sb $DATA/store 2>/dev/null | cut -f1) bytes"
