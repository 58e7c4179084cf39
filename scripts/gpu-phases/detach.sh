# Phase detach (sourced by scripts/gpu-check.sh): always-on (GPUFL_DETACH=0: kept attached)
# detaches CUPTI after each window (crate::detach), so that kernel tracing costs the launching
# thread nothing between windows.
# 1. The C++ launch loop's ns per launch over time (launchcost.cu, LC_TIMELINE=1): one window 4 s
#    in (the budget puts the next ~40 s later), detaching (the default), kept attached, bare.
# 2. Safety: the launch loop and a PyTorch loop with its autograd thread under windows every
#    500 ms (a detach each), every process must exit 0; the session's windows, kernels and
#    correlation ids across the detaches (scripts/probe/detach_check.py).
# 3. stream_sync_loop (one sync an iteration) and nvtx_ranges, windows every 1 s: the syncs and
#    ranges recorded across the detaches.
# 4. Frameworks (JAX, Lightning, generate(), torch.compile, CUDA graphs, CuPy, Triton), windows
#    every 500 ms: every process must exit 0 (below).
# DETACH_PARTS="4" (default "1 2 3 4") runs some of them.
log "(detach) always-on: CUPTI detached after each window"
DT="$S/detach"; mkdir -p "$DT"
dpart() { case " ${DETACH_PARTS:-1 2 3 4} " in *" $1 "*) return 0;; esac; return 1; }
sess() { dirname "$(find "$1" -name trace-0000.ndjson.zst | head -1)"; }
nvcc -O2 -o build/launchcost scripts/probe/launchcost.cu -ldl 2>&1 | tail -3
nvcc -g -O2 -lineinfo -o build/nvtx_ranges examples/nvtx_ranges.cu -ldl 2>&1 | tail -3
LCR=${DETACH_LC_ROUNDS:-1300}
if dpart 1; then
for rep in 1 2; do
  for m in detach nodetach bare; do
    case $m in
      bare) LC_TIMELINE=1 build/launchcost $LCR 2000 > "$OUT/detach-lc-$m.txt" 2>&1 ;;
      detach) LC_TIMELINE=1 gpufl record -q --always-on -o "$DT/lc-$m-$rep" -- build/launchcost $LCR 2000 > "$OUT/detach-lc-$m.txt" 2>&1 ;;
      nodetach) LC_TIMELINE=1 GPUFL_DETACH=0 gpufl record -q --always-on -o "$DT/lc-$m-$rep" -- build/launchcost $LCR 2000 > "$OUT/detach-lc-$m.txt" 2>&1 ;;
    esac
    echo "$m (exit $?): $(sed 's/LC_TIMELINE *//; s/ (n=[0-9]*)//; s/ ns$//; s/ s: /:/' "$OUT/detach-lc-$m.txt" | tr '\n' ' ')" | cut -c1-600 | tee -a "$OUT/summary.txt"
  done
done
f=$(sess "$DT/lc-detach-1"); gpufl dump "$f" --type notice | grep -o '"message":"always-on[^"]*' | tee -a "$OUT/summary.txt"
fi
if dpart 2; then
log "(detach) safety: windows every 500 ms"
fails=0
for rep in 1 2 3 4 5 6; do
  GPUFL_WINDOW_PERIOD_MS=500 gpufl record -q --always-on -o "$DT/stress-$rep" -- build/launchcost 1000 2000 > "$OUT/detach-stress-$rep.txt" 2>&1
  rc=$?; [ $rc = 0 ] || { fails=$((fails + 1)); echo "stress $rep: exit $rc"; tail -3 "$OUT/detach-stress-$rep.txt"; }
done
for rep in 1 2; do
  GPUFL_WINDOW_PERIOD_MS=500 gpufl record -q --always-on -o "$DT/torch-$rep" -- $PY examples/pytorch_backward.py --steps 400 > "$OUT/detach-torch-$rep.txt" 2>&1
  rc=$?; [ $rc = 0 ] || { fails=$((fails + 1)); echo "torch $rep: exit $rc"; tail -3 "$OUT/detach-torch-$rep.txt"; }
done
echo "detach safety: $fails of 8 processes failed: $([ $fails = 0 ] && echo PASS || echo FAIL)" | tee -a "$OUT/summary.txt"
$PY scripts/probe/detach_check.py "$(sess "$DT/stress-1")" 2>&1 | tail -8 | tee -a "$OUT/summary.txt"
$PY scripts/probe/detach_check.py "$(sess "$DT/torch-1")" 2>&1 | tail -8 | tee -a "$OUT/summary.txt"
gpufl report --color never "$(sess "$DT/torch-1")" 2>&1 | head -14 | tee -a "$OUT/summary.txt"
fi
if dpart 3; then
log "(detach) stream_sync_loop 60000 and nvtx_ranges 20000 under always-on, windows every 1 s"
GPUFL_WINDOW_PERIOD_MS=1000 gpufl record -q --always-on -o "$DT/ssl" -- build/stream_sync_loop 60000 2>&1 | tail -1 | tee -a "$OUT/summary.txt"
$PY scripts/probe/detach_check.py "$(sess "$DT/ssl")" --syncs 60000 2>&1 | tail -6 | tee -a "$OUT/summary.txt"
GPUFL_WINDOW_PERIOD_MS=1000 gpufl record -q --always-on -o "$DT/nvtx" -- build/nvtx_ranges 20000 2>&1 | tail -1 | tee -a "$OUT/summary.txt"
$PY scripts/probe/detach_check.py "$(sess "$DT/nvtx")" --ranges 20000 2>&1 | tail -6 | tee -a "$OUT/summary.txt"
gpufl report --color never "$(sess "$DT/nvtx")" 2>&1 | grep -A5 "^  scopes" | tee -a "$OUT/summary.txt"
fi
# 4. Frameworks under always-on with a window (and so a detach) every 500 ms: each must exit 0 and
#    detach; JAX/XLA, Lightning, generate(), torch.compile, CUDA graphs, and CuPy and Triton loops
#    written here. DETACH_FW="name …" picks some (default all).
if dpart 4; then
log "(detach) frameworks, windows every 500 ms"
cat > "$DT/cupy_loop.py" <<'PYEOF'
import time, cupy as cp
x = cp.random.rand(1 << 20, dtype=cp.float32)
t0 = time.time()
while time.time() - t0 < 6:
    for _ in range(50):
        x = cp.sin(x) * 0.5 + 0.25
    cp.cuda.Stream.null.synchronize()
print("cupy ok", float(x.sum()) > 0)
PYEOF
cat > "$DT/triton_loop.py" <<'PYEOF'
import time, torch, triton, triton.language as tl
@triton.jit
def axpy(x, y, n, BLOCK: tl.constexpr):
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = i < n
    tl.store(y + i, tl.load(x + i, mask=m) * 2.0 + tl.load(y + i, mask=m), mask=m)
n = 1 << 20
x, y = torch.rand(n, device="cuda"), torch.zeros(n, device="cuda")
t0 = time.time()
while time.time() - t0 < 6:
    for _ in range(50):
        axpy[(triton.cdiv(n, 1024),)](x, y, n, BLOCK=1024)
    torch.cuda.synchronize()
print("triton ok", float(y.sum()) > 0)
PYEOF
fwfails=0; fwn=0
for name in ${DETACH_FW:-jax_train lightning_fit hf_generate torch_compile_graphs torch_cuda_graph cupy_loop triton_loop}; do
  case $name in
    jax_train) cmd="$PY examples/jax_train.py --steps 300" ;;
    lightning_fit) cmd="$PY examples/lightning_fit.py --steps 300" ;;
    hf_generate) cmd="$PY examples/hf_generate.py --rounds 6" ;;
    torch_compile_graphs) cmd="$PY examples/torch_compile_graphs.py --steps 300" ;;
    torch_cuda_graph) cmd="$PY examples/torch_cuda_graph.py --steps 2000" ;;
    cupy_loop|triton_loop) cmd="$PY $DT/$name.py" ;;
    *) echo "DETACH_FW: unknown $name"; continue ;;
  esac
  fwn=$((fwn + 1))
  PYTHONFAULTHANDLER=1 GPUFL_WINDOW_PERIOD_MS=500 timeout 300 gpufl record -q --always-on -o "$DT/fw-$name" -- $cmd > "$OUT/detach-fw-$name.txt" 2>&1
  rc=$?; [ $rc = 0 ] || { fwfails=$((fwfails + 1)); tail -3 "$OUT/detach-fw-$name.txt"; }
  d=$(sess "$DT/fw-$name")
  echo "$name: exit $rc; $( [ -d "$d" ] && gpufl dump "$d" --type notice 2>/dev/null | grep -o 'CUPTI detached after [0-9]* windows[^"]*' | sed 's/ (so that[^)]*)//' | cut -c1-200)" | tee -a "$OUT/summary.txt"
done
echo "detach frameworks: $fwfails of $fwn processes failed: $([ $fwfails = 0 ] && echo PASS || echo FAIL)" | tee -a "$OUT/summary.txt"
fi
