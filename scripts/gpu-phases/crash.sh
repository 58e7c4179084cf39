# Phase crash (sourced by scripts/gpu-check.sh): crash safety on the GPU. examples/crash_train.py
# (a PyTorch loop, .item() each step) ended by abort / segfault / SIGTERM / SIGKILL at three points
# (CRASH_AT, seconds of training), under gpufl record; the same ends without gpufl for the exit
# status. Per run: exit status with and without gpufl, whether the session decodes, the run's last
# second against the last record on disk, kernels recorded. Then a DataLoader with 4 forked
# workers. ~3 minutes. CRASH_ENDS (default "abort segv term kill"; "none": the DataLoader part only).
CR="$S/crash"; mkdir -p "$CR"
ENDS=${CRASH_ENDS:-abort segv term kill}; [ "$ENDS" = none ] && ENDS=""
if [ -n "$ENDS" ]; then
log "(x) crash safety: examples/crash_train.py ended by $ENDS"
for end in $ENDS; do
  $PY examples/crash_train.py --end $end --at 1 >"$CR/bare-$end.out" 2>/dev/null; echo "bare $end $?" >>"$CR/status"
  for at in ${CRASH_AT:-1.5 4 8}; do
    gpufl record -q -o "$CR/$end-$at" -- $PY examples/crash_train.py --end $end --at $at \
      >"$CR/$end-$at.out" 2>"$CR/$end-$at.err"; echo "gpufl $end-$at $?" >>"$CR/status"
  done
done
$PY - "$CR" <<'PYEOF' 2>&1 | tee -a "$OUT/summary.txt"
import glob, os, re, subprocess, sys
cr = sys.argv[1]
status = dict(l.split()[1:] for l in open(f"{cr}/status"))
bare = {l.split()[1]: l.split()[2] for l in open(f"{cr}/status") if l.startswith("bare")}
print(f"{'run':12s} {'exit':>5s} {'bare':>5s} {'decodes':>7s} {'run s':>6s} {'span s':>7s} {'lost s':>6s} {'kernels':>8s} notice")
for out in sorted(glob.glob(f"{cr}/*-*.out")):
    name = os.path.basename(out)[:-4]
    if name.startswith("bare-"):
        continue
    end = name.split("-")[0]
    txt = open(out).read()
    st = re.search(r"START (\d+)", txt); en = re.search(r"END (\d+)", txt)
    # Session directories (inside the run directory gpufl record makes).
    sess = sorted(os.path.dirname(t) + "/" for t in glob.glob(f"{cr}/{name}/**/trace-0000*", recursive=True))
    info = subprocess.run(["gpufl", "info", sess[0]], capture_output=True, text=True) if sess else None
    ok = bool(info and info.returncode == 0)
    span = re.search(r"records span ([\d.]+) \.\. ([\d.]+)", info.stdout) if ok else None
    kern = re.search(r"(\d+) kernels", info.stdout) if ok else None
    notice = ""
    if sess:
        n = subprocess.run(["gpufl", "dump", sess[0], "--type", "notice"], capture_output=True, text=True).stdout
        m = re.search(r"received (SIG\w+)", n)
        notice = f"received {m.group(1)}" if m else ""
    run_s = (int(en.group(1)) - int(st.group(1))) / 1e9 if st and en else float("nan")
    lost = int(en.group(1)) / 1e9 - float(span.group(2)) if span and en else float("nan")
    span_s = float(span.group(2)) - int(st.group(1)) / 1e9 if span and st else float("nan")
    print(f"{name:12s} {status[name]:>5s} {bare[end]:>5s} {str(ok):>7s} {run_s:6.2f} {span_s:7.2f} {lost:6.2f} {kern.group(1) if kern else '-':>8s} {notice}")
PYEOF
grep -h "killed by" "$CR"/*.err | sort | uniq -c | tee -a "$OUT/summary.txt"
fi
log "(x2) DataLoader with 4 forked workers"
$PY examples/dataloader_workers.py > "$CR/dl-bare.out" 2>&1; b=$?
gpufl record -o "$CR/dl" -- $PY examples/dataloader_workers.py > "$CR/dl.out" 2>&1; r=$?
echo "exit bare $b, recorded $r; bare: $(grep dataloader: "$CR/dl-bare.out"); recorded: $(grep dataloader: "$CR/dl.out")" | tee -a "$OUT/summary.txt"
echo "sessions: $(find "$CR/dl" -name 'trace-0000*' | wc -l)" | tee -a "$OUT/summary.txt"
gpufl info "$CR"/dl 2>&1 | grep -E "command|kernels|span" | tee -a "$OUT/summary.txt"
grep -h "^gpufl" "$CR/dl.out" | tee -a "$OUT/summary.txt"
rm -rf "$CR"
