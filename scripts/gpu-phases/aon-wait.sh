# Phase aon-wait (sourced by scripts/gpu-check.sh): wait for the long always-on run that phase aon
# started with AON_LONG_BG=1 (in this call or an earlier one on the same machine) and report it.
. scripts/gpu-phases/lib/aon-long.sh
aon_long_wait
