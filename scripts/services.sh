#!/usr/bin/env bash
# Start the real services the server's tests run against (no GPU needed): PostgreSQL (Debian's
# `postgresql`, its first cluster) and an S3 API server (moto's, from PyPI). Installs them when
# missing and apt-get / pip can. Prints the variables the tests read:
#   GPUFL_TEST_PG_URL=postgres://gpufl:gpufl@127.0.0.1:PORT/gpufl
#   GPUFL_TEST_S3=s3://gpufl-test   with AWS_ENDPOINT_URL, AWS_ALLOW_HTTP, AWS_* credentials
# Usage: eval "$(bash scripts/services.sh)"
set -uo pipefail
log() { echo "services: $*" >&2; }
sudo=""; [ "$(id -u)" = 0 ] || sudo="sudo -n"
as_pg() { if [ "$(id -u)" = 0 ]; then runuser -u postgres -- "$@"; else sudo -n -u postgres "$@"; fi; }

if ! command -v pg_lsclusters >/dev/null 2>&1; then
  log "installing postgresql"
  { $sudo apt-get update -qq && DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends postgresql; } >/dev/null 2>&1 \
    || log "postgresql could not be installed"
fi
if command -v pg_lsclusters >/dev/null 2>&1; then
  read -r ver name port status _ < <(pg_lsclusters -h | head -1)
  if [ -z "${ver:-}" ]; then
    ver=$(ls /usr/lib/postgresql | sort -n | tail -1); name=main
    $sudo pg_createcluster "$ver" main >/dev/null 2>&1
    read -r ver name port status _ < <(pg_lsclusters -h | head -1)
  fi
  [ "$status" = online ] || $sudo pg_ctlcluster "$ver" "$name" start >/dev/null 2>&1 || log "postgresql did not start"
  for _ in $(seq 50); do as_pg psql -p "$port" -qAtc "select 1" >/dev/null 2>&1 && break; sleep 0.2; done
  as_pg psql -p "$port" -qc "DO \$\$ BEGIN IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = 'gpufl') THEN CREATE ROLE gpufl LOGIN SUPERUSER PASSWORD 'gpufl'; END IF; END \$\$;" >/dev/null 2>&1
  as_pg psql -p "$port" -qAtc "SELECT 1 FROM pg_database WHERE datname = 'gpufl'" 2>/dev/null | grep -q 1 \
    || as_pg createdb -p "$port" -O gpufl gpufl >/dev/null 2>&1
  if psql "postgres://gpufl:gpufl@127.0.0.1:$port/gpufl" -qAtc "select 1" >/dev/null 2>&1; then
    echo "export GPUFL_TEST_PG_URL=postgres://gpufl:gpufl@127.0.0.1:$port/gpufl"
  else
    log "postgresql is not reachable as gpufl@127.0.0.1:$port"
  fi
fi

S3_PORT=${GPUFL_TEST_S3_PORT:-5055}
if ! command -v moto_server >/dev/null 2>&1; then
  log "installing moto[server]"
  python3 -m pip install -q 'moto[server]' >/dev/null 2>&1 \
    || python3 -m pip install -q --user --break-system-packages 'moto[server]' >/dev/null 2>&1 \
    || log "moto could not be installed"
  export PATH="$PATH:$HOME/.local/bin"
  hash -r
fi
if command -v moto_server >/dev/null 2>&1; then
  if ! curl -s -o /dev/null "http://127.0.0.1:$S3_PORT/"; then
    nohup moto_server -H 127.0.0.1 -p "$S3_PORT" >/tmp/gpufl-moto.log 2>&1 &
    for _ in $(seq 100); do curl -s -o /dev/null "http://127.0.0.1:$S3_PORT/" && break; sleep 0.2; done
  fi
  curl -s -X PUT -o /dev/null "http://127.0.0.1:$S3_PORT/gpufl-test"
  if curl -s "http://127.0.0.1:$S3_PORT/" | grep -q gpufl-test; then
    echo "export GPUFL_TEST_S3=s3://gpufl-test AWS_ENDPOINT_URL=http://127.0.0.1:$S3_PORT AWS_ALLOW_HTTP=true AWS_ACCESS_KEY_ID=test AWS_SECRET_ACCESS_KEY=test AWS_REGION=us-east-1"
  else
    log "the S3 server did not answer on port $S3_PORT"
  fi
fi
