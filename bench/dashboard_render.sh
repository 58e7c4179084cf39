#!/usr/bin/env bash
# Dashboard render time and page size on a session of ~1 M kernels (release build, no GPU):
#   1. the synthetic session of the decode benchmark (crates/gpufl-analysis/benches/common: per
#      100 records 95 kernels of 20 names on 2 streams, 3 syncs with stacks, 2 copies), R records
#      (default 1,052,632 = 1,000,000 kernels), written as one session directory;
#   2. `gpufl serve --local` loads it (the upload protocol) and analyses it (ingest time printed);
#   3. each page — the sessions list, the session, its top insight's line, its top kernel — is
#      fetched N times (default 20) one after another; the server's own time to the rendered page
#      (its `Server-Timing: app;dur=` header: queries + rendering) and the HTML size are reported
#      as median / max.
# Usage: bash bench/dashboard_render.sh [R] [N]
set -euo pipefail
cd "$(dirname "$0")/.."
R=${1:-1052632}; N=${2:-20}
cargo build --release -q -p gpufl-cli
cargo build --release -q -p gpufl-analysis --example decodebench
G=target/release/gpufl
T=$(mktemp -d /tmp/gpufl-dash-XXXX); trap 'kill $(jobs -p) 2>/dev/null; rm -rf "$T"' EXIT
ID=bench-1-20261122T000000Z
mkdir -p "$T/src/$ID"
target/release/examples/decodebench --records "$R" --threads 1 --repeat 1 \
  --save "$T/src/$ID/trace-0000.ndjson.zst" >/dev/null 2>&1
echo "session: $R records, $(du -b "$T/src/$ID/trace-0000.ndjson.zst" | cut -f1) bytes of zstd"
t0=$(date +%s.%N)
$G serve --data "$T/data" --listen 127.0.0.1:0 --rate-limit 0 --local "$T/src" 2>"$T/serve.log" &
SP=$!
for _ in $(seq 100); do grep -q "listening on" "$T/serve.log" 2>/dev/null && break; sleep 0.1; done
URL=$(grep -o 'http://[0-9.:]*' "$T/serve.log" | head -1)
python3 - "$URL" "$ID" "$N" "$t0" "$SP" <<'PY'
import json, statistics, sys, time, urllib.parse, urllib.request
url, sid, n, t0, pid = sys.argv[1], sys.argv[2], int(sys.argv[3]), float(sys.argv[4]), sys.argv[5]
def get(path):
    with urllib.request.urlopen(url + path, timeout=120) as r:
        return r.status, dict(r.headers), r.read()
deadline = time.time() + 900
while True:
    try:
        s = json.loads(get(f"/api/v1/sessions/{sid}")[2])
        if s.get("ingest") in ("ready", "corrupt"):
            break
    except Exception:
        pass
    if time.time() > deadline:
        sys.exit("the session was not analysed within 15 minutes")
    time.sleep(0.5)
print(f"loaded and analysed in {time.time() - t0:.1f} s: {s['kernels']:,} kernels, "
      f"{s['syncs']:,} syncs, ingest {s['ingest']}")
ins = json.loads(get(f"/api/v1/sessions/{sid}/insights")[2])["insights"]
ker = json.loads(get(f"/api/v1/sessions/{sid}/kernels")[2])["kernels"]
pages = [("sessions list", "/sessions"), ("session", f"/sessions/{sid}")]
loc = next((i["location"] for i in ins if i.get("location", {}).get("line")), None)
if loc:
    q = urllib.parse.urlencode({"file": loc["file"], "line": loc["line"]})
    pages.append(("line detail", f"/sessions/{sid}/line?{q}"))
if ker:
    q = urllib.parse.urlencode({"name": ker[0]["name"], "device": ker[0]["device"]})
    pages.append(("kernel detail", f"/sessions/{sid}/kernel?{q}"))
print(f"{'page':<15} {'server ms median':>17} {'max':>8} {'HTML bytes':>11}")
for name, path in pages:
    ms, size = [], 0
    for _ in range(n):
        st, h, body = get(path)
        assert st == 200, (path, st)
        timing = {k.lower(): v for k, v in h.items()}.get("server-timing", "")
        ms.append(float(timing.split("dur=")[1]))
        size = len(body)
    print(f"{name:<15} {statistics.median(ms):>17.2f} {max(ms):>8.2f} {size:>11,}")
rss = [l for l in open(f"/proc/{pid}/status") if l.startswith("VmHWM")]
print("server peak RSS:", rss[0].split(":")[1].strip() if rss else "?")
PY
