# Phase dashboard (sourced by scripts/gpu-check.sh): issue 15 on the GPU machine — programs users
# run (a PyTorch loop, a HuggingFace Trainer, Lightning, JAX) recorded with this build, served by
# `gpufl serve --local` on this machine, and the dashboard walked as a user clicks: the sessions
# list, each session, its first SYNCHRONIZATION chip (else its first chip), the line's first
# kernel link. Status, server time (Server-Timing) and size of each page are quoted; the HTML is
# kept under $OUT/dash-html.
DS="$S/dash"; mkdir -p "$DS" "$OUT/dash-html"
log "(d) record: pytorch_train_sync, hf_trainer, lightning_fit, jax_train"
gpufl record -q -o "$DS" -- $PY examples/pytorch_train_sync.py --steps 50 --warmup 5 2>&1 | tail -2
gpufl record -q -o "$DS" -- $PY examples/hf_trainer.py --steps 60 2>&1 | tail -2
gpufl record -q -o "$DS" -- $PY examples/lightning_fit.py --steps 80 2>&1 | tail -2
gpufl record -q -o "$DS" -- $PY examples/jax_train.py --steps 60 2>&1 | tail -2
gpufl info "$DS" 2>&1 | grep -v "^  " | tee -a "$OUT/summary.txt"
gpufl serve --data "$OUT/dash-data" --listen 127.0.0.1:0 --local "$DS" 2> "$OUT/dash-serve.log" &
DSP=$!
for _ in $(seq 100); do grep -q "listening on" "$OUT/dash-serve.log" && break; sleep 0.1; done
DURL=$(grep -o 'http://[0-9.:]*' "$OUT/dash-serve.log" | head -1)
log "(d) gpufl serve --local at $DURL: walking the dashboard"
$PY - "$DURL" "$OUT/dash-html" <<'PY' 2>&1 | tee -a "$OUT/summary.txt"
import html, json, re, sys, time, urllib.request
url, out = sys.argv[1], sys.argv[2]
def get(path):
    try:
        with urllib.request.urlopen(url + path, timeout=60) as r:
            return r.status, r.headers.get("Server-Timing", ""), r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.headers.get("Server-Timing", ""), e.read().decode()
t0 = time.time()
while True:
    s = json.loads(get("/api/v1/sessions")[2])["sessions"]
    if s and all(x["ingest"] in ("ready", "corrupt") for x in s) and len(s) >= 4:
        break
    if time.time() - t0 > 300:
        print("not all analysed:", [(x["id"], x["ingest"]) for x in s]); break
    time.sleep(1)
n = [0]
def page(label, path):
    st, timing, body = get(path)
    n[0] += 1
    open(f"{out}/{n[0]:02d}.html", "w").write(body)
    print(f"{st} {timing.replace('app;dur=', ''):>7} ms {len(body):>8,} B  {label}: {path[:110]}")
    return body
page("sessions list", "/sessions")
for x in s:
    sid = x["id"]
    print(f"-- {sid}: {x['kernels']:,} kernels, {x['syncs']:,} syncs, busy {x['gpu_busy_pct']:.1f}%, top: {x['top_insight'][:90]}")
    body = page("session", f"/sessions/{sid}")
    groups = re.findall(r'data-category="([^"]+)"', body)
    print("   insight groups:", ", ".join(html.unescape(g) for g in groups))
    sync = body.split('data-category="SYNCHRONIZATION"', 1)
    chips = re.findall(r'<a class="chip" href="([^"]+)"', sync[1] if len(sync) > 1 else body)
    if not chips:
        print("   no chip"); continue
    line = page("line (chip)", html.unescape(chips[0]))
    frames = len(re.findall(r'<li class="', line.split('id="line-stack"', 1)[-1].split("</section>", 1)[0]))
    src = "yes" if 'class="hit"' in line else "no"
    klinks = re.findall(r'<a class="kernel-link" href="([^"]+)"', line)
    print(f"   line page: {frames} stack frames, source text {src}, {len(klinks)} kernel links")
    if klinks:
        k = page("kernel", html.unescape(klinks[0]))
        print("   kernel page: config table", "yes" if 'id="kernel-config"' in k else "no")
if len(s) >= 2:
    page("compare", f"/compare?a={s[1]['id']}&b={s[0]['id']}")
PY
kill $DSP 2>/dev/null; wait $DSP 2>/dev/null
