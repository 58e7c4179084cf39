# Phase diffpair (sourced by scripts/gpu-check.sh): a pair of sessions for `gpufl diff` with one
# known change. examples/pytorch_train_sync.py twice with the same arguments, the second with
# --extra-sync: one `loss.item()` per step (warmup included) at the line marked "planted extra sync",
# i.e. one more device-to-host copy and StreamSynchronize per step there, and nothing else.
# Sessions: $S/diffpair-base/ and $S/diffpair-new/ (one session each). Then `gpufl diff` both
# ways: $OUT/diffpair/{forward,reverse,self}.{txt,json} and their exit statuses in status.txt.
# ~1 minute. To keep them as testdata: testdata/sessions/diffpair_base-<pid>-<ts> and
# diffpair_new-<pid>-<ts> (the session directories renamed from pytorch_train_sync-<pid>-<ts>, so
# that tests looking for pytorch_train_sync-* still find the one they expect).
log "(diffpair) pytorch_train_sync.py twice, the second with --extra-sync (a planted .item() per step)"
DP="$OUT/diffpair"; mkdir -p "$DP"
DP_ARGS="--steps 50 --warmup 5"
gpufl record -o "$S/diffpair-base" -- $PY examples/pytorch_train_sync.py $DP_ARGS 2>&1 | tee "$DP/base.log"
gpufl record -o "$S/diffpair-new" -- $PY examples/pytorch_train_sync.py $DP_ARGS --extra-sync 2>&1 | tee "$DP/new.log"
DP_BASE=$(newest "$S/diffpair-base"); DP_NEW=$(newest "$S/diffpair-new")
report "$DP_BASE"; report "$DP_NEW"
DP_LINE=$(grep -n "planted extra sync" examples/pytorch_train_sync.py | cut -d: -f1)
echo "planted line: pytorch_train_sync.py:$DP_LINE" | tee -a "$OUT/summary.txt"
dpdiff() { # tag base new: text and JSON, with the exit status of each
  gpufl diff --fail-on-regression 5% "$2" "$3" >"$DP/$1.txt" 2>&1; echo "$1 text exit $?" | tee -a "$DP/status.txt"
  gpufl diff --json --fail-on-regression 5% "$2" "$3" >"$DP/$1.json" 2>"$DP/$1.err"; echo "$1 json exit $?" | tee -a "$DP/status.txt"
}
dpdiff forward "$DP_BASE" "$DP_NEW"
dpdiff reverse "$DP_NEW" "$DP_BASE"
dpdiff self "$DP_BASE" "$DP_BASE"
cat "$DP/forward.txt" | tee -a "$OUT/summary.txt"
cat "$DP/status.txt" >>"$OUT/summary.txt"
