"""gpufl.upload() against a real server: `gpufl admin create-project` and `gpufl serve` (SQLite in
a temporary directory), then Python programs that upload a copy of a bundled session with
gpufl.upload(); the server's read API answers it with `gpufl info`'s kernel count. A wrong key
returns 1 (one session failed), no configuration raises gpufl.UploadError, and init()'s
backend_url / api_key / log_path are upload()'s defaults. No GPU needed.

Build first: ``cargo build -p gpufl-capture -p gpufl-cli``.
"""

import json
import os
import re
import shutil
import subprocess
import sys
import textwrap
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from gpufl_test_paths import CLI, LIB, REPO_ROOT, with_package
SESSION = "cpp_api-639-20261122T061858Z"

pytestmark = pytest.mark.skipif(
    not (LIB.exists() and CLI.exists()),
    reason="build first: cargo build -p gpufl-capture -p gpufl-cli",
)


@pytest.fixture
def server(tmp_path):
    """(url, upload key, read key) of a fresh server."""
    data = tmp_path / "data"
    out = subprocess.run([str(CLI), "admin", "--data", str(data), "create-project", "team"],
                         capture_output=True, text=True, check=True).stdout
    keys = dict(re.findall(r"^(upload|read) key (\S+)", out, re.M))
    proc = subprocess.Popen([str(CLI), "serve", "--data", str(data), "--listen", "127.0.0.1:0",
                             "--rate-limit", "0"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        url = None
        deadline = time.monotonic() + 30
        while url is None:
            line = proc.stderr.readline()
            if not line:
                pytest.fail("gpufl serve ended before listening")
            m = re.search(r"listening on (http://\S+)", line)
            if m:
                url = m.group(1)
            assert time.monotonic() < deadline
        # Keep draining its stderr so the server never blocks on a full pipe.
        threading.Thread(target=lambda: proc.stderr.read(), daemon=True).start()
        yield url, keys["upload"], keys["read"]
    finally:
        proc.kill()
        proc.wait()


def get(url, key, path):
    req = urllib.request.Request(url + path, headers={"Authorization": f"Bearer {key}"})
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status, json.loads(r.read() or b"null")
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"null")


def wait_ready(url, key, sid):
    deadline = time.monotonic() + 30
    while True:
        st, v = get(url, key, f"/api/v1/sessions/{sid}")
        if st == 200 and v["ingest"] in ("ready", "corrupt"):
            return v
        assert time.monotonic() < deadline, (st, v)
        time.sleep(0.1)


def info_kernels(d):
    out = subprocess.run([str(CLI), "info", str(d)], capture_output=True, text=True,
                         check=True).stdout
    m = re.search(r"(\d+) kernels\b", out)
    assert m, out
    return int(m.group(1))


def run_script(tmp_path, body, **env_extra):
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("GPUFL_") and k != "CUDA_INJECTION64_PATH"}
    with_package(env)
    env["GPUFL_CAPTURE_LIB"] = str(LIB)
    env.update(env_extra)
    script = tmp_path / "prog.py"
    script.write_text(textwrap.dedent(body))
    r = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 0, r.stderr
    return r


def test_upload_stores_the_session_and_reports_failures(tmp_path, server):
    url, up, rd = server
    logs = tmp_path / "logs"
    src = REPO_ROOT / "testdata/sessions" / SESSION
    shutil.copytree(src, logs / SESSION)

    def upload(key):
        return run_script(tmp_path, f"""
            import gpufl
            print("rc", gpufl.upload({str(logs)!r}, server={url!r}, api_key={key!r}))
        """)

    # A wrong key: one session failed, nothing stored.
    r = upload("gfl_up_wrong")
    assert "rc 1" in r.stdout, (r.stdout, r.stderr)
    assert f"gpufl: upload of {SESSION} failed:" in r.stderr and "unknown_key" in r.stderr
    assert get(url, rd, f"/api/v1/sessions/{SESSION}")[0] == 404

    r = upload(up)
    assert "rc 0" in r.stdout, r.stderr
    assert f"gpufl: uploaded {SESSION} (new, 1 file," in r.stderr
    v = wait_ready(url, rd, SESSION)
    assert v["ingest"] == "ready", v
    kernels = info_kernels(src)
    assert kernels > 0 and v["kernels"] == kernels, v

    # Nothing configured: UploadError with the code; a directory without sessions likewise.
    r = run_script(tmp_path, f"""
        import gpufl
        for kw in ({{}}, {{"path": {str(tmp_path / "data")!r} + "/nope", "server": {url!r},
                          "api_key": "k"}}):
            try:
                gpufl.upload(**kw)
            except gpufl.UploadError as e:
                print("raised", e.code, e)
    """)
    lines = [x for x in r.stdout.splitlines() if x.startswith("raised")]
    assert len(lines) == 2, r.stdout
    assert lines[0].startswith("raised -1 gpufl.upload: no server or no key"), lines
    assert lines[1].startswith("raised -3 gpufl.upload: no gpufl session"), lines

    # init()'s backend_url / api_key / log_path are upload()'s defaults: this process's own
    # session (scopes only, no GPU here) goes up beside the copy, stored already.
    r = run_script(tmp_path, f"""
        import gpufl
        gpufl.init(app_name="py_upload", log_path={str(logs)!r}, backend_url={url!r},
                   api_key={up!r})
        with gpufl.scope("work"):
            pass
        gpufl.shutdown()
        print("rc", gpufl.upload())
    """)
    assert "rc 0" in r.stdout, r.stderr
    assert f"uploaded {SESSION} (unchanged" in r.stderr, r.stderr
    own = [p.name for p in logs.iterdir() if p.name.startswith("py_upload-")]
    assert len(own) == 1, own
    assert f"uploaded {own[0]} (new" in r.stderr, r.stderr
    assert wait_ready(url, rd, own[0])["ingest"] == "ready"
