# PyTorch loops (examples/pytorch_backward.py, with its autograd thread) under always-on with a
# window, and so a detach of CUPTI, every 0.5 s: PT_REPS processes (default 4), each must exit 0;
# then the last session's windows, kernels and correlation ids across the detaches
# (detach_check.py) and its always-on notice. Run: bash scripts/probe/torch-detach-loops.sh
set -u
OUT=${OUT:-/tmp/gpufl-out}; mkdir -p "$OUT"
bad=0
for rep in $(seq 1 ${PT_REPS:-4}); do
  rm -rf /tmp/pt; PYTHONFAULTHANDLER=1 GPUFL_WINDOW_PERIOD_MS=500 timeout 120 gpufl record -q --always-on -o /tmp/pt -- python3 examples/pytorch_backward.py --steps ${PT_STEPS:-300} > $OUT/pt-$rep.txt 2>&1
  rc=$?; [ $rc -ne 0 ] && bad=$((bad+1)); echo "torch $rep exit $rc $(grep -i 'fatal\|corrupt\|gpufl: SIG\|Error' $OUT/pt-$rep.txt | head -1 | cut -c1-200)"
done
echo "torch detaching every 0.5 s: $bad of ${PT_REPS:-4} failed"
s=$(dirname "$(find /tmp/pt -name trace-0000.ndjson.zst | head -1)"); python3 scripts/probe/detach_check.py "$s" | tail -3
gpufl dump "$s" --type notice | grep -o 'always-on: [^"]*' | cut -c1-300
