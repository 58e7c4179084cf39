"""exporter_cost.py - the cost of `gpufl exporter`: CPU per scrape and CPU per second idle.

Starts `gpufl exporter` (its own port and feed socket), then measures its CPU time from
/proc/PID/stat (utime+stime, clock ticks: counts threads that have exited, as the per-connection
HTTP threads have; the live threads' schedstat, which misses them, is kept in the JSON only):
  idle      no recorder feeding, no scrape, for --idle seconds
  fed idle  --procs forked sender processes, each sending a status datagram once a second (as a
            recorder does), no scrape, for --idle seconds
  scrape    --scrapes scrapes of /metrics back to back (with the fed processes), CPU per scrape
Without NVML (a CPU machine) the scrape has no device reads; on a GPU machine it reads each GPU.

Run:    python3 bench/exporter_cost.py --gpufl target/release/gpufl [--procs 50] [--idle 20]
Prints: one line per measurement, then a markdown table row per measurement.
"""
import argparse
import json
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request


def cpu_ns(pid):
    """Run time of all threads of pid (ns), and utime+stime (s) from /proc/PID/stat."""
    total = 0
    for t in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{t}/schedstat") as f:
                total += int(f.read().split()[0])
        except OSError:
            pass
    with open(f"/proc/{pid}/stat") as f:
        rest = f.read().rsplit(")", 1)[1].split()
    ticks = int(rest[11]) + int(rest[12])
    return total, ticks / os.sysconf("SC_CLK_TCK")


def status(seq, i):
    return json.dumps({
        "v": 1, "pid": os.getpid(), "app": f"bench{i}", "job": "", "session": f"bench-{i}",
        "status": "recording", "seq": seq, "uptime_s": float(seq), "sync_s": 0.5 * seq,
        "syncs": 10 * seq, "scopes": 0,
        "gpus": [{"dev": 0, "uuid": "GPU-bench", "busy_s": 0.3 * seq, "kernels": 1000 * seq,
                  "copies": seq, "sync_s": 0.5 * seq, "syncs": 10 * seq}],
        "top": [{"line": f"train.py:{40 + k}", "sync_s": 0.1 * seq, "syncs": seq} for k in range(3)],
    }).encode()


def sender(sock_path, i):
    s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    seq = 0
    while True:
        try:
            s.sendto(status(seq, i), sock_path)
        except OSError:
            pass
        seq += 1
        time.sleep(1.0)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gpufl", default="target/release/gpufl")
    ap.add_argument("--procs", type=int, default=50)
    ap.add_argument("--idle", type=float, default=20.0)
    ap.add_argument("--scrapes", type=int, default=500)
    ap.add_argument("--json", help="write the figures here")
    a = ap.parse_args()
    tmp = tempfile.mkdtemp(prefix="gpufl-exp-bench-")
    sock = os.path.join(tmp, "exporter.sock")
    exp = subprocess.Popen([a.gpufl, "exporter", "--listen", "127.0.0.1:0", "--socket", sock],
                           stderr=subprocess.PIPE, text=True)
    first = exp.stderr.readline()
    port = int(re.search(r"127\.0\.0\.1:(\d+)", first).group(1))
    print(first.strip())
    url = f"http://127.0.0.1:{port}/metrics"
    res = {}
    kids = []
    try:
        time.sleep(1.0)
        c0, s0 = cpu_ns(exp.pid)
        time.sleep(a.idle)
        c1, s1 = cpu_ns(exp.pid)
        res["idle_us_per_s"] = (s1 - s0) * 1e6 / a.idle
        res["idle_live_threads_us_per_s"] = (c1 - c0) / 1e3 / a.idle
        print(f"idle: {res['idle_us_per_s']:.1f} us CPU per second ({(s1 - s0) * 1e3:.0f} ms in {a.idle:.0f} s)")
        for i in range(a.procs):
            pid = os.fork()
            if pid == 0:
                signal.signal(signal.SIGTERM, signal.SIG_DFL)
                try:
                    sender(sock, i)
                finally:
                    os._exit(0)
            kids.append(pid)
        time.sleep(2.5)
        body = urllib.request.urlopen(url).read()
        procs = re.search(rb"gpufl_exporter_processes\{[^}]*\} (\d+)", body)
        res["procs_seen"] = int(procs.group(1)) if procs else 0
        c0, s0 = cpu_ns(exp.pid)
        time.sleep(a.idle)
        c1, s1 = cpu_ns(exp.pid)
        res["fed_us_per_s"] = (s1 - s0) * 1e6 / a.idle
        res["fed_live_threads_us_per_s"] = (c1 - c0) / 1e3 / a.idle
        print(f"fed by {res['procs_seen']} processes, no scrape: {res['fed_us_per_s']:.0f} us CPU per second "
              f"({(s1 - s0) * 1e3:.0f} ms in {a.idle:.0f} s)")
        c0, s0 = cpu_ns(exp.pid)
        t0 = time.perf_counter()
        size = 0
        for _ in range(a.scrapes):
            size = len(urllib.request.urlopen(url).read())
        wall = time.perf_counter() - t0
        c1, s1 = cpu_ns(exp.pid)
        res["scrape_us"] = (s1 - s0) * 1e6 / a.scrapes
        res["scrape_live_threads_us"] = (c1 - c0) / 1e3 / a.scrapes
        res["scrape_wall_ms"] = wall * 1e3 / a.scrapes
        res["page_bytes"] = size
        print(f"scrape ({a.scrapes}x, {size} bytes, {res['procs_seen']} processes): {res['scrape_us']:.0f} us CPU each "
              f"({(s1 - s0) * 1e3:.0f} ms in all), {res['scrape_wall_ms']:.2f} ms wall each")
        with open(f"/proc/{exp.pid}/status") as f:
            rss = re.search(r"VmRSS:\s+(\d+) kB", f.read())
        res["rss_kb"] = int(rss.group(1)) if rss else 0
        print(f"| idle | {res['idle_us_per_s']:.1f} µs/s | fed by {res['procs_seen']} | "
              f"{res['fed_us_per_s']:.1f} µs/s | scrape | {res['scrape_us']:.0f} µs | {size} B | RSS {res['rss_kb']} kB |")
        if a.json:
            with open(a.json, "w") as f:
                json.dump(res, f, indent=1)
    finally:
        for k in kids:
            try:
                os.kill(k, signal.SIGTERM)
                os.waitpid(k, 0)
            except OSError:
                pass
        exp.terminate()
        exp.wait()


if __name__ == "__main__":
    sys.exit(main())
