#!/usr/bin/env bash
# The server's soak (issue 36; figures in docs/robustness.md, "The team server under hostile
# uploads"): for SECS seconds (default 600), on PostgreSQL + S3 (scripts/services.sh, which
# exports GPUFL_TEST_PG_URL, GPUFL_TEST_S3 and the AWS_* variables), `gpufl serve` (release build)
# under an address-space limit (`prlimit --as`, default 3072 MiB; `--ingest-memory-mb` 1024,
# `--rate-limit 2000` so that the readers sharing one key are not the ones limited)
# takes at once
#   - two uploaders of copies of the bundled sessions under fresh ids (one in three sent twice),
#   - two readers (the API's list, a session, its insights and kernels, its dashboard page, a
#     raw file),
#   - one hostile client, in turn: 127-frame stacks naming two 512 KiB strings, 4,096 files of
#     highly compressible kernel records, a session of 600,000 kernels, bytes that are no trace;
#     after each, 200 idle sockets, 300 requests with an unknown key, a 50,000-character search,
#     a date past 2262, a NUL in a parameter, a cross-site login.
# Then it waits until every session is in a final state and checks: the server never stopped,
# no session lost or stuck, every hostile session final with its reason. It prints the figures.
# Usage: source /tmp/services.env (or scripts/services.sh's exports); bash bench/server_soak.sh [SECS] [AS_MB]
set -euo pipefail
cd "$(dirname "$0")/.."
: "${GPUFL_TEST_PG_URL:?PostgreSQL: run scripts/services.sh and export what it prints}"
: "${GPUFL_TEST_S3:?S3: run scripts/services.sh and export what it prints}"
export GPUFL_SOAK_SECS=${1:-600} GPUFL_SOAK_AS_MB=${2:-3072} GPUFL_SOAK_INGEST_MB=${GPUFL_SOAK_INGEST_MB:-1024}
cargo test --release -p gpufl-cli --test server soak -- --ignored --nocapture --test-threads 1
