# Phase dcgmparity (sourced by scripts/gpu-check.sh): the exporter's dcgm-exporter metrics (issue 39:
# memory temperature, encoder/decoder utilization, remapped rows, PCIe throughput, NVLink
# bandwidth, XID; and the earlier ones) against nvidia-smi on this machine, idle and under a
# PyTorch load (matmuls and host<->device copies on every GPU): one table, PASS/FAIL per metric
# and GPU (matched by UUID), each pair read back to back. nvidia-smi sources: --query-gpu (one
# field at a time, so a field this driver lacks says N/A instead of failing the rest), `dmon -s t`
# for PCIe (MB/s), `nvlink -gt d` for the NVLink data counters (KiB; a rate over the same interval
# as the exporter's). XID: no nvidia-smi query; the exporter's last XID is shown beside the
# kernel log's (dmesg, when readable). Files in $OUT/dcgmparity/: metrics-*.txt, smi-*.json,
# parity.txt. ~1 minute.
log "(dp) dcgm-exporter parity: the exporter's device metrics against nvidia-smi"
DP="$OUT/dcgmparity"; mkdir -p "$DP"
gpufl exporter --listen 127.0.0.1:9402 --socket "$DP/exporter.sock" 2>"$DP/exporter.err" &
DPX=$!
sleep 2
head -1 "$DP/exporter.err" | tee -a "$OUT/summary.txt"
cat >"$DP/load.py" <<'PYEOF'
"""Matmuls and host<->device copies on every GPU for argv[1] seconds (PCIe and SM load)."""
import sys, time
import torch

devs = [torch.device(f"cuda:{i}") for i in range(torch.cuda.device_count())]
a = [torch.randn(4096, 4096, device=d) for d in devs]
host = torch.randn(64 << 20, pin_memory=True)  # 256 MB pinned
dev = [torch.empty_like(host, device=d) for d in devs]
end = time.time() + float(sys.argv[1])
while time.time() < end:
    for i, d in enumerate(devs):
        a[i] = torch.tanh(a[i] @ a[i])
        dev[i].copy_(host, non_blocking=True)
        host.copy_(dev[i], non_blocking=True)
    for d in devs:
        torch.cuda.synchronize(d)
PYEOF
$PY - "$DP" <<'PYEOF' 2>&1 | tee "$DP/parity.txt" | tee -a "$OUT/summary.txt"
import json, re, subprocess, sys, time, urllib.request

out = sys.argv[1]
URL = "http://127.0.0.1:9402/metrics"


def scrape(tag):
    page = urllib.request.urlopen(URL, timeout=30).read().decode()
    open(f"{out}/metrics-{tag}.txt", "w").write(page)
    return page


def value(page, name, uuid):
    m = re.search(rf'^{name}{{([^}}]*UUID="{re.escape(uuid)}"[^}}]*)}} (\S+)$', page, re.M)
    return (float(m.group(2)), m.group(1)) if m else (None, None)


def smi(*args):
    r = subprocess.run(["nvidia-smi", *args], capture_output=True, text=True, timeout=60)
    return r.stdout if r.returncode == 0 else ""


FIELDS = {  # exporter metric: (nvidia-smi --query-gpu field, tolerance (abs, rel), scale to exporter's unit)
    "DCGM_FI_DEV_GPU_TEMP": ("temperature.gpu", (2, 0), 1),
    "DCGM_FI_DEV_MEMORY_TEMP": ("temperature.memory", (2, 0), 1),
    "DCGM_FI_DEV_GPU_UTIL": ("utilization.gpu", (10, 0), 1),
    "DCGM_FI_DEV_ENC_UTIL": ("utilization.encoder", (5, 0), 1),
    "DCGM_FI_DEV_DEC_UTIL": ("utilization.decoder", (5, 0), 1),
    "DCGM_FI_DEV_FB_USED": ("memory.used", (4, 0.01), 1),
    "DCGM_FI_DEV_POWER_USAGE": ("power.draw", (5, 0.05), 1),
    "DCGM_FI_DEV_SM_CLOCK": ("clocks.sm", (30, 0.02), 1),
    "DCGM_FI_DEV_MEM_CLOCK": ("clocks.mem", (30, 0.02), 1),
    "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS": ("remapped_rows.correctable", (0, 0), 1),
    "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS": ("remapped_rows.uncorrectable", (0, 0), 1),
    "DCGM_FI_DEV_ROW_REMAP_PENDING": ("remapped_rows.pending", (0, 0), 1),
    "DCGM_FI_DEV_ROW_REMAP_FAILURE": ("remapped_rows.failure", (0, 0), 1),
}


def query(uuids):
    """{uuid: {field: number or None}}, one field per call."""
    res = {u: {} for u in uuids}
    for _, (field, _, _) in FIELDS.items():
        text = smi(f"--query-gpu=uuid,{field}", "--format=csv,noheader,nounits")
        for line in text.splitlines():
            u, _, v = line.partition(",")
            v = v.strip().lower()
            if v in ("yes", "no"):
                v = "1" if v == "yes" else "0"
            try:
                res.setdefault(u.strip(), {})[field] = float(v)
            except ValueError:
                res.setdefault(u.strip(), {})[field] = None
    return res


def nvlink_kib():
    """{gpu index: total data KiB (tx + rx, all links)} from `nvidia-smi nvlink -gt d`."""
    text, res, gpu = smi("nvlink", "-gt", "d"), {}, None
    for line in text.splitlines():
        m = re.match(r"GPU (\d+):", line)
        if m:
            gpu = int(m.group(1)); res[gpu] = 0
        m = re.search(r"Data (?:Tx|Rx):\s*(\d+)\s*KiB", line)
        if m and gpu is not None:
            res[gpu] += int(m.group(1))
    return res


def dmon_pcie(seconds):
    """{gpu index: (rx MB/s, tx MB/s)} averaged over `seconds` one-second dmon samples."""
    text = smi("dmon", "-s", "t", "-c", str(seconds))
    cols, acc = None, {}
    for line in text.splitlines():
        if line.startswith("#") and "rxpci" in line:
            cols = line[1:].split()
            continue
        if line.startswith("#") or not cols:
            continue
        f = dict(zip(cols, line.split()))
        try:
            acc.setdefault(int(f["gpu"]), []).append((float(f["rxpci"]), float(f["txpci"])))
        except (KeyError, ValueError):
            pass
    return {g: tuple(sum(x[i] for x in v) / len(v) for i in (0, 1)) for g, v in acc.items()}


def ok(a, b, tol):
    return a is not None and b is not None and abs(a - b) <= tol[0] + tol[1] * max(abs(a), abs(b))


uuids = [l.strip() for l in smi("--query-gpu=uuid", "--format=csv,noheader").splitlines() if l.strip()]
index = {u: i for i, u in enumerate(uuids)}
rows, fails = [], 0


def row(tag, uuid, name, ex, ref, verdict):
    global fails
    fails += verdict == "FAIL"
    fmt = lambda v: "-" if v is None else (f"{v:.6g}" if isinstance(v, float) else str(v))
    rows.append(f"{tag:6s} GPU{index.get(uuid, '?')} {name:42s} {fmt(ex):>14s} {fmt(ref):>14s}  {verdict}")


def snapshot(tag):
    page = scrape(tag)
    ref = query(uuids)
    json.dump(ref, open(f"{out}/smi-{tag}.json", "w"), indent=1)
    for u in uuids:
        for name, (field, tol, scale) in FIELDS.items():
            ex, _ = value(page, name, u)
            r = ref.get(u, {}).get(field)
            r = None if r is None else r * scale
            if ex is None and r is None:
                verdict = "n/a (neither)"
            elif ex is None or r is None:
                verdict = "FAIL" if r is not None else "n/a (nvidia-smi)"
            else:
                verdict = "PASS" if ok(ex, r, tol) else "FAIL"
            row(tag, u, name, ex, r, verdict)
        ex, labels = value(page, "DCGM_FI_DEV_XID_ERRORS", u)
        row(tag, u, "DCGM_FI_DEV_XID_ERRORS", ex, labels and re.search(r'err_code="[^"]*"', labels).group(0),
            "PASS" if ex is not None else "FAIL")
    return page


def rates(tag, seconds):
    """PCIe and NVLink rates over the same interval: scrape, dmon for `seconds`, scrape."""
    nv0, t0 = nvlink_kib(), time.time()
    scrape(tag + "-a")
    pcie = dmon_pcie(seconds)
    page = scrape(tag + "-b")
    nv1, t1 = nvlink_kib(), time.time()
    for u in uuids:
        i = index[u]
        for name, k in (("DCGM_FI_PROF_PCIE_RX_BYTES", 0), ("DCGM_FI_PROF_PCIE_TX_BYTES", 1)):
            ex, _ = value(page, name, u)
            r = pcie.get(i, (None, None))[k]
            r = None if r is None else r * 1e6  # dmon's MB/s
            verdict = "PASS" if ok(ex, r, (100e6, 0.25)) else ("n/a (nvidia-smi)" if r is None else "FAIL")
            row(tag, u, name, ex, r, verdict)
        ex, _ = value(page, "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL", u)
        r = None
        if i in nv0 and i in nv1:
            r = (nv1[i] - nv0[i]) / (t1 - t0) / 1000.0
        verdict = "PASS" if ok(ex, r, (1000, 0.25)) else ("n/a (no NVLink)" if r is None and ex is None else "FAIL")
        row(tag, u, "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL", ex, r, verdict)


snapshot("idle")
rates("idle", 3)
load = subprocess.Popen([sys.executable, f"{out}/load.py", "25"])
time.sleep(8)
snapshot("load")
rates("load", 5)
load.wait()
dmesg = subprocess.run(["sh", "-c", "dmesg 2>/dev/null | grep -i 'NVRM: Xid' | tail -3"],
                       capture_output=True, text=True).stdout.strip()
print(f"{'when':6s} {'GPU':4s} {'metric':42s} {'exporter':>14s} {'nvidia-smi':>14s}  verdict")
print("\n".join(rows))
print("kernel log XIDs (last 3):", dmesg or "none (or dmesg not readable)")
print(f"dcgm parity: {fails} FAIL of {len(rows)} comparisons")
PYEOF
kill $DPX 2>/dev/null; wait $DPX 2>/dev/null
