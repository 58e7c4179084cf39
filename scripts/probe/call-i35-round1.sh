set -u
export OUT=${OUT:-/tmp/gpufl-out}
nvidia-smi -L
GDB_LINES=170 bash scripts/probe/call-i35-gdb.sh 5 2>&1 | head -420
echo "##### next"
PROBE_REPS=2 REPS=5 bash scripts/probe/call-i35-next.sh 2>&1 | tail -40
