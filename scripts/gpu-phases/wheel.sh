# Phase wheel (sourced by scripts/gpu-check.sh): the gpufl wheel as a PyTorch user gets it (issue 39).
# The wheel comes prebuilt in .device-bin/ (scripts/prepare-device-bin.sh builds it). It is
# installed into a fresh venv that sees this machine's PyTorch (--system-site-packages), and
# everything below runs from that venv with no GPUFL_CAPTURE_LIB and without .device-bin on PATH:
#  1. `gpufl record -- python examples/pytorch_train_sync.py` (the venv's command), then
#     `python -m gpufl report`: the report must name the planted sync's source line;
#  2. the README's Python snippet (gpufl.init with its defaults, scopes; no `gpufl record`): its
#     session must hold syncs with source lines (stacks are on by default) and its scopes.
# Files in $OUT/wheel/: install.txt, record.txt, report-record.txt, snippet.py, report-snippet.txt.
log "(w) the gpufl wheel in a fresh venv with the machine's PyTorch"
W="$OUT/wheel"; mkdir -p "$W"
WHL=$(ls "$BIN"/gpufl-*.whl 2>/dev/null | head -1)
if [ -z "$WHL" ]; then
  log "(w) skipped: no gpufl-*.whl in .device-bin (scripts/prepare-device-bin.sh builds it)"
else
  V="$W/venv"; rm -rf "$V"
  $PY -m venv --system-site-packages "$V" >"$W/install.txt" 2>&1 || $PY -m venv --system-site-packages --without-pip "$V" >>"$W/install.txt" 2>&1
  # When the machine's python3 is itself a venv (/opt/torch/.venv), --system-site-packages sees
  # only the base interpreter's packages: a .pth file adds that venv's own, where PyTorch is.
  PARENT_SITE=$($PY -c 'import site; print(site.getsitepackages()[0])')
  VSITE=$("$V/bin/python" -c 'import site; print(site.getsitepackages()[0])')
  [ -d "$PARENT_SITE" ] && [ "$PARENT_SITE" != "$VSITE" ] && echo "$PARENT_SITE" > "$VSITE/_machine_site.pth"
  "$V/bin/python" -m pip install --no-index --no-deps "$WHL" >>"$W/install.txt" 2>&1
  tail -2 "$W/install.txt" | tee -a "$OUT/summary.txt"
  # The venv alone: no .device-bin on PATH, no GPUFL_CAPTURE_LIB.
  venv() { env -u GPUFL_CAPTURE_LIB -u CUDA_INJECTION64_PATH PATH="$V/bin:/usr/local/bin:/usr/bin:/bin" "$@"; }
  venv sh -c 'command -v gpufl; gpufl --version' 2>&1 | tee -a "$OUT/summary.txt"
  venv "$V/bin/python" -c 'import gpufl; print("library:", gpufl.library_path())' 2>&1 | tee -a "$OUT/summary.txt"
  SYNC_LINE=$(grep -n "gpufl-example: in-loop sync" examples/pytorch_train_sync.py | head -1 | cut -d: -f1)

  log "(w1) gpufl record -- python examples/pytorch_train_sync.py, from the venv"
  venv gpufl record -o "$W/s-record" -- "$V/bin/python" examples/pytorch_train_sync.py --steps 30 --warmup 3 >"$W/record.txt" 2>&1
  tail -3 "$W/record.txt" | tee -a "$OUT/summary.txt"
  venv "$V/bin/python" -m gpufl report --color never "$(ls -dt "$W"/s-record/*/ | head -1)" >"$W/report-record.txt" 2>&1
  n=$(grep -c "pytorch_train_sync.py:[0-9]" "$W/report-record.txt")
  log "(w1) report lines naming pytorch_train_sync.py:N: $n (planted line $SYNC_LINE: $(grep -c "pytorch_train_sync.py:$SYNC_LINE" "$W/report-record.txt")) -> $([ "$n" -gt 0 ] && echo PASS || echo FAIL)"
  grep -m3 "pytorch_train_sync.py:[0-9]" "$W/report-record.txt" | cut -c1-200 | tee -a "$OUT/summary.txt"

  log "(w2) the README's Python snippet (gpufl.init defaults), from the venv"
  cat >"$W/snippet.py" <<'PYEOF'
import torch
import gpufl

model = torch.nn.Sequential(torch.nn.Linear(1024, 1024), torch.nn.ReLU(), torch.nn.Linear(1024, 1)).cuda()
x = torch.randn(256, 1024, device="cuda")
opt = torch.optim.SGD(model.parameters(), lr=1e-3)

gpufl.init(app_name="train")   # not needed under `gpufl record`


@gpufl.scope("step")
def step():
    with gpufl.scope("forward"):
        loss = model(x).square().mean()
    loss.backward()
    opt.step()
    opt.zero_grad()
    return loss.item()   # snippet: planted sync


for _ in range(40):
    step()
gpufl.shutdown()
PYEOF
  SNIP_LINE=$(grep -n "snippet: planted sync" "$W/snippet.py" | cut -d: -f1)
  (cd "$W" && venv env GPUFL_LOG_PATH="$W/s-snippet" "$V/bin/python" snippet.py >"$W/snippet.txt" 2>&1)
  tail -2 "$W/snippet.txt" | tee -a "$OUT/summary.txt"
  venv gpufl report --color never "$W/s-snippet" >"$W/report-snippet.txt" 2>&1
  n=$(grep -c "snippet.py:[0-9]" "$W/report-snippet.txt")
  s=$(venv gpufl dump "$W/s-snippet" --type sync --limit 50 2>/dev/null | grep -c "snippet.py")
  sc=$(grep -c -E "step|forward" "$W/report-snippet.txt")
  log "(w2) report lines naming snippet.py:N: $n (planted line $SNIP_LINE: $(grep -c "snippet.py:$SNIP_LINE" "$W/report-snippet.txt")); sync records with snippet.py in their stack: $s; scope lines: $sc -> $([ "$n" -gt 0 ] && [ "$s" -gt 0 ] && echo PASS || echo FAIL)"
  grep -m3 "snippet.py:[0-9]" "$W/report-snippet.txt" | cut -c1-200 | tee -a "$OUT/summary.txt"
  rm -rf "$V"
fi
