"""Tests of the Python package (python/gpufl): init / scope / shutdown in a subprocess, then the
session decoded with the `gpufl` CLI. No GPU needed: without CUPTI the recorder writes a
scopes-only session.

Build first: ``cargo build -p gpufl-capture -p gpufl-cli`` (or install the wheel and set
GPUFL_TEST_INSTALLED=1: gpufl_test_paths.py).
"""

import json
import os
import subprocess
import sys
import textwrap
import shutil
from pathlib import Path

import pytest

from gpufl_test_paths import CLI, INSTALLED, LIB, PACKAGE_DIR, package_copy_without_library, \
    with_package

pytestmark = pytest.mark.skipif(
    not (LIB.exists() and CLI.exists()),
    reason="build first: cargo build -p gpufl-capture -p gpufl-cli",
)


def run_script(tmp_path, body, lib=LIB, pythonpath=None):
    env = with_package(dict(os.environ))
    if pythonpath is not None:
        env["PYTHONPATH"] = str(pythonpath) + os.pathsep + env.get("PYTHONPATH", "")
    env.pop("CUDA_INJECTION64_PATH", None)
    if lib is None:
        env.pop("GPUFL_CAPTURE_LIB", None)
        env["PATH"] = "/usr/bin:/bin"
    else:
        env["GPUFL_CAPTURE_LIB"] = str(lib)
    env["GPUFL_LOG_PATH"] = str(tmp_path / "sessions")
    script = tmp_path / "prog.py"
    script.write_text(textwrap.dedent(body))
    return subprocess.run(
        [sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=60
    )


def dump(session_root, kind):
    out = subprocess.run(
        [str(CLI), "dump", str(session_root), "--type", kind],
        capture_output=True, text=True, check=True,
    ).stdout
    return [json.loads(line) for line in out.splitlines() if line.startswith("{")]


def test_context_manager_and_decorator_nest(tmp_path):
    r = run_script(tmp_path, """
        import threading, gpufl
        gpufl.init(app_name="pytest")
        @gpufl.scope("step")
        def step():
            with gpufl.scope("forward"):
                with gpufl.scope("loss"):
                    pass
            with gpufl.scope("backward"):
                pass
        for _ in range(2):
            step()
        t = threading.Thread(target=step)
        t.start(); t.join()
        print("DIR", gpufl.session_dir())
        gpufl.shutdown()
    """)
    assert r.returncode == 0, r.stderr
    assert "DIR " + str(tmp_path / "sessions") in r.stdout
    recs = dump(tmp_path / "sessions", "scope")
    main_tid = recs[0]["tid"]
    main = [(x["name"], x["depth"], x.get("end", False)) for x in recs if x["tid"] == main_tid]
    one = [
        ("step", 0, False), ("forward", 1, False), ("loss", 2, False), ("loss", 2, True),
        ("forward", 1, True), ("backward", 1, False), ("backward", 1, True), ("step", 0, True),
    ]
    assert main == one * 2
    other = [x for x in recs if x["tid"] != main_tid]
    assert [(x["name"], x["depth"]) for x in other][:2] == [("step", 0), ("forward", 1)]
    assert all(x["source"] == "api" for x in recs)
    ts = [x["ts"] for x in recs if x["tid"] == main_tid]
    assert ts == sorted(ts)


def test_unbalanced_pop_warns_and_exception_closes_scope(tmp_path):
    r = run_script(tmp_path, """
        import ctypes, gpufl
        gpufl.init()
        lib = ctypes.CDLL(gpufl.library_path())
        lib.gpufl_scope_pop()          # nothing open: a warning, not a crash
        try:
            with gpufl.scope("fails"):
                raise ValueError("x")
        except ValueError:
            pass
        gpufl.shutdown()
        gpufl.shutdown()               # twice is fine
    """)
    assert r.returncode == 0, r.stderr
    recs = dump(tmp_path / "sessions", "scope")
    assert [(x["name"], x.get("end", False)) for x in recs] == [("fails", False), ("fails", True)]
    notices = dump(tmp_path / "sessions", "notice")
    assert any("pop(s) without an open scope" in n["message"] for n in notices)
    report = subprocess.run(
        [str(CLI), "report", str(tmp_path / "sessions")], capture_output=True, text=True
    )
    assert report.returncode == 0
    assert "fails" in report.stdout


def test_without_library_calls_are_noops(tmp_path):
    # The package's Python files alone (an installed wheel bundles a library: left out here).
    bare = package_copy_without_library(tmp_path / "bare")
    r = run_script(tmp_path, """
        import gpufl
        assert gpufl.init() == -1
        with gpufl.scope("x"):
            pass
        @gpufl.scope("y")
        def f():
            return 42
        assert f() == 42
        assert gpufl.session_dir() is None
        assert not gpufl.pause()
        gpufl.shutdown()
        print("fine")
    """, lib=None, pythonpath=bare)
    assert r.returncode == 0, r.stderr
    assert "fine" in r.stdout
    assert r.stderr.count("capture library not found") == 1


def test_capture_window_is_refused_outside_always_on(tmp_path):
    r = run_script(tmp_path, """
        import gpufl
        gpufl.init(app_name="pytest")
        print("WINDOW", gpufl.capture_window(1.0))
        gpufl.shutdown()
    """)
    assert r.returncode == 0, r.stderr
    assert "WINDOW False" in r.stdout


def test_stacks_are_recorded_by_default(tmp_path):
    r = run_script(tmp_path, """
        import gpufl
        gpufl.init(app_name="default")
        gpufl.shutdown()
    """)
    assert r.returncode == 0, r.stderr
    (header,) = dump(tmp_path / "sessions", "header")
    assert header["options"]["enable_stack_trace"] is True
    assert header["options"]["enable_synchronization"] is True
    (tmp_path / "off").mkdir()
    r = run_script(tmp_path / "off", """
        import gpufl
        gpufl.init(app_name="off", enable_stack_trace=False)
        gpufl.shutdown()
    """)
    assert r.returncode == 0, r.stderr
    (header,) = dump(tmp_path / "off" / "sessions", "header")
    assert header["options"]["enable_stack_trace"] is False


def test_the_bundled_library_is_found_with_no_environment(tmp_path):
    """The wheel's layout: libgpufl_capture.so inside the package; no GPUFL_CAPTURE_LIB, no
    `gpufl` on PATH."""
    if INSTALLED:
        pythonpath, expect = None, PACKAGE_DIR / "libgpufl_capture.so"
    else:
        pythonpath = package_copy_without_library(tmp_path / "pkg")
        expect = pythonpath / "gpufl" / "libgpufl_capture.so"
        shutil.copyfile(LIB, expect)
    r = run_script(tmp_path, """
        import gpufl
        rc = gpufl.init(app_name="bundled")
        print("LIB", gpufl.library_path())
        print("RC", rc)
        with gpufl.scope("s"):
            pass
        gpufl.shutdown()
    """, lib=None, pythonpath=pythonpath)
    assert r.returncode == 0, r.stderr
    assert "capture library not found" not in r.stderr
    assert f"LIB {os.path.realpath(expect)}" in r.stdout.replace(
        str(tmp_path), os.path.realpath(tmp_path))
    assert ("RC 0" in r.stdout) or ("RC 2" in r.stdout), r.stdout
    recs = dump(tmp_path / "sessions", "scope")
    assert [(x["name"], x.get("end", False)) for x in recs] == [("s", False), ("s", True)]


def test_python_m_gpufl_runs_the_command(tmp_path):
    env = with_package(dict(os.environ))
    if not INSTALLED:
        env["PATH"] = str(CLI.parent) + os.pathsep + env.get("PATH", "")
    (tmp_path / "none").mkdir()
    r = subprocess.run([sys.executable, "-m", "gpufl", "report", str(tmp_path / "none")],
                       env=env, capture_output=True, text=True, timeout=60)
    # The command ran (it says the directory holds no session) and its status came back.
    assert r.returncode != 0
    assert "not a gpufl session directory" in r.stderr, r.stderr
    r = subprocess.run([sys.executable, "-m", "gpufl", "--version"], env=env,
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("gpufl "), r.stdout
