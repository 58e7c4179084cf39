#!/usr/bin/env bash
# scripts/probe/sasscallback.cu on the device machine (issue 19 probe): see run-probe.sh.
PROBE_TIMEOUT=${PROBE_TIMEOUT:-200} exec bash "$(dirname "$0")/run-probe.sh" sasscallback "$@"
