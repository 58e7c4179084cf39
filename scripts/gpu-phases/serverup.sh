# Phase serverup (sourced by scripts/gpu-check.sh): issue 14 on the GPU machine — a `gpufl serve`
# on this machine (embedded default), the seed's C++ snippet (build/cpp_api: init with
# backend_url/api_key, workload, shutdown, gpufl::uploadLogs) and a Python training script
# (examples/pytorch_train_upload.py: gpufl.upload() after shutdown) record and upload to it; what
# the API answers is quoted.
SV="$OUT/srv"; rm -rf "$SV"; mkdir -p "$SV"
KEYS=$(gpufl admin --data "$SV" create-project gpu-machine 2>/dev/null)
UPK=$(echo "$KEYS" | awk '/^upload/{print $3}'); RDK=$(echo "$KEYS" | awk '/^read/{print $3}')
gpufl serve --data "$SV" --listen 127.0.0.1:0 2> "$OUT/serve.log" &
SVP=$!
for _ in $(seq 100); do grep -q "listening on" "$OUT/serve.log" && break; sleep 0.1; done
URL=$(grep -o 'http://[0-9.:]*' "$OUT/serve.log" | head -1)
log "(u) gpufl serve at $URL; C++: build/cpp_api 20 with backend_url/api_key, uploadLogs after shutdown"
mkdir -p "$S/upc"
(cd "$S/upc" && GPUFL_SERVER=$URL GPUFL_API_KEY=$UPK "$ROOT/build/cpp_api" 20) 2>&1 | tee -a "$OUT/summary.txt"
log "(u) Python: examples/pytorch_train_upload.py --steps 50, gpufl.upload() after shutdown"
GPUFL_SERVER=$URL GPUFL_API_KEY=$UPK PYTHONPATH=python $PY examples/pytorch_train_upload.py --steps 50 \
  --log-path "$S/upp" 2>&1 | tail -6 | tee -a "$OUT/summary.txt"
api() { curl -s -H "Authorization: Bearer $RDK" "$URL$1"; }
for _ in $(seq 120); do
  api "/api/v1/sessions" | $PY -c 'import json,sys; s=json.load(sys.stdin)["sessions"]; sys.exit(0 if s and all(x["ingest"] in ("ready","corrupt") for x in s) else 1)' && break
  sleep 0.5
done
log "(u) GET /api/v1/sessions"
api "/api/v1/sessions" | $PY -m json.tool | tee -a "$OUT/summary.txt"
for id in $(api "/api/v1/sessions" | $PY -c 'import json,sys; print(" ".join(x["id"] for x in json.load(sys.stdin)["sessions"]))'); do
  log "(u) GET /api/v1/sessions/$id/insights (first 3: severity, category, title)"
  api "/api/v1/sessions/$id/insights" | $PY -c '
import json,sys
for i in json.load(sys.stdin)["insights"][:3]:
    loc=i["location"]; print(i["severity"], i["category"], "|", i["title"], "|", loc["file"], loc.get("line"))' | tee -a "$OUT/summary.txt"
done
kill $SVP 2>/dev/null; wait $SVP 2>/dev/null
