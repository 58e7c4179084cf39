#!/usr/bin/env bash
# scripts/probe/pcstartstop.cu on the device machine (issue 19 probe): see run-probe.sh.
exec bash "$(dirname "$0")/run-probe.sh" pcstartstop "$@"
