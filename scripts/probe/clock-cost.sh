#!/usr/bin/env bash
# Probe (GPU machine): what reading the clock costs there — the kernel's clocksource, the cost of
# clock_gettime (CLOCK_MONOTONIC, _RAW, REALTIME) against a plain system call, cuptiGetTimestamp,
# and the TSC flags. CUPTI stamps every API call and activity record it keeps; a clock that is a
# system call (a clocksource the vDSO cannot read) makes each stamp cost microseconds.
set -u
OUT=${OUT:-/tmp/gpufl-out}; mkdir -p "$OUT"
{
echo "clocksource: $(cat /sys/devices/system/clocksource/clocksource0/current_clocksource 2>&1)"
echo "available:   $(cat /sys/devices/system/clocksource/clocksource0/available_clocksource 2>&1)"
echo "tsc flags:   $(grep -m1 -o -w -e constant_tsc -e nonstop_tsc -e tsc_known_freq -e rdtscp /proc/cpuinfo | tr '\n' ' ')"
echo "kernel:      $(uname -r)"
dmesg 2>/dev/null | grep -i -e clocksource -e tsc | tail -8
CUPTI=$(python3 -c "import glob,os,nvidia.cuda_cupti as m; print((glob.glob(os.path.join(list(m.__path__)[0],'lib','libcupti.so*'))+[''])[0])" 2>/dev/null)
[ -n "$CUPTI" ] || CUPTI=$(ls /usr/local/cuda*/extras/CUPTI/lib64/libcupti.so* /usr/local/cuda*/targets/*/lib/libcupti.so* 2>/dev/null | head -1)
cc -O2 -o /tmp/clockcost scripts/probe/clockcost.c -ldl && /tmp/clockcost $CUPTI
} 2>&1 | tee "$OUT/clock.txt"
