"""Crash safety without a GPU: scopes-only sessions (the recorder writes scope records when CUPTI is
absent) of programs that abort, segfault, get SIGTERM / SIGINT / SIGKILL, or fork.

Each case runs the same program with the recorder and without it (no library: the gpufl calls do
nothing) and checks that the exit status is the same, that the session decodes, and that it holds
the program's scopes up to the crash.

Build first: ``cargo build -p gpufl-capture -p gpufl-cli``.
"""

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from gpufl_test_paths import CLI, LIB, package_copy_without_library, with_package

pytestmark = pytest.mark.skipif(
    not (LIB.exists() and CLI.exists()),
    reason="build first: cargo build -p gpufl-capture -p gpufl-cli",
)

# Opens a scope every 5 ms for `seconds`, printing the wall clock (ns, the trace clock of a
# scopes-only session) of the last one, then ends as `how` says.
PROGRAM = """
import ctypes, os, signal, sys, time, gpufl
# Python's own SIGINT handler even when the test runs with SIGINT ignored (a shell's background
# job inherits it ignored, and Python then installs none).
signal.signal(signal.SIGINT, signal.default_int_handler)
gpufl.init(app_name="crash")
how, seconds = sys.argv[1], float(sys.argv[2])
end = time.time() + seconds
i = 0
while time.time() < end:
    with gpufl.scope(f"s{i}"):
        pass
    i += 1
    time.sleep(0.005)
print("LAST", time.time_ns(), i, flush=True)
if how == "abort":
    os.abort()
elif how == "segv":
    ctypes.string_at(0)
elif how == "term":
    os.kill(os.getpid(), signal.SIGTERM)
    time.sleep(5)
elif how == "int":
    try:
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(5)
    except KeyboardInterrupt:
        print("INTERRUPTED", flush=True)
    with gpufl.scope("after-interrupt"):
        pass
elif how == "sleep":
    time.sleep(30)
gpufl.shutdown()
"""


def env_for(tmp_path, recorded):
    env = with_package(dict(os.environ))
    env.pop("CUDA_INJECTION64_PATH", None)
    env["GPUFL_LOG_PATH"] = str(tmp_path / "sessions")
    env["GPUFL_QUIET"] = "1"
    if recorded:
        env["GPUFL_CAPTURE_LIB"] = str(LIB)
    else:
        env.pop("GPUFL_CAPTURE_LIB", None)
        env["PATH"] = "/usr/bin:/bin"
        # The package's Python files alone: an installed wheel's bundled library left out.
        bare = package_copy_without_library(tmp_path / "bare-package")
        env["PYTHONPATH"] = str(bare) + os.pathsep + env.get("PYTHONPATH", "")
    return env


def run(tmp_path, body, args, recorded=True, timeout=60):
    script = tmp_path / "prog.py"
    script.write_text(textwrap.dedent(body))
    return subprocess.run(
        [sys.executable, str(script), *args], env=env_for(tmp_path, recorded),
        capture_output=True, text=True, timeout=timeout,
    )


def dump(root, kind):
    out = subprocess.run(
        [str(CLI), "dump", str(root), "--type", kind], capture_output=True, text=True, timeout=60,
    )
    assert out.returncode == 0, out.stderr
    return [json.loads(line) for line in out.stdout.splitlines() if line.startswith("{")]


def last_line(stdout, tag):
    return [line.split() for line in stdout.splitlines() if line.startswith(tag)][-1]


@pytest.mark.parametrize("how,sig", [
    ("abort", signal.SIGABRT), ("segv", signal.SIGSEGV), ("term", signal.SIGTERM),
])
def test_fatal_signal_keeps_the_session_and_the_exit_status(tmp_path, how, sig):
    (tmp_path / "bare").mkdir()
    bare = run(tmp_path / "bare", PROGRAM, [how, "1.0"], recorded=False)
    assert bare.returncode == -sig, bare.stderr
    t0 = time.monotonic()
    r = run(tmp_path, PROGRAM, [how, "1.0"])
    took = time.monotonic() - t0
    assert r.returncode == -sig, (r.returncode, r.stderr)
    assert took < 20, took
    _, last_ns, n = last_line(r.stdout, "LAST")
    scopes = dump(tmp_path / "sessions", "scope")
    opened = [s for s in scopes if not s.get("end")]
    # Every scope the program opened and closed before the signal is in the session.
    assert len(opened) == int(n), (len(opened), n)
    assert int(last_ns) - max(s["ts"] for s in scopes) < 1_000_000_000
    notices = [x["message"] for x in dump(tmp_path / "sessions", "notice")]
    assert any(f"received {sig.name}" in m for m in notices), notices
    assert not dump(tmp_path / "sessions", "end"), "a crashed session has no end record"
    if sig == signal.SIGSEGV:
        # A hardware fault is located: on stderr from the handler (thread, pc, its mapping),
        # in the notice by the writer (module and offset).
        line = [x for x in r.stderr.splitlines() if x.startswith("gpufl: SIGSEGV on thread")]
        assert line and " at pc 0x" in line[0] and " address 0x0" in line[0], r.stderr
        assert " in /" in line[0], line[0]
        assert any("pc 0x" in m and "address 0x0" in m for m in notices), notices
    else:
        assert "at pc 0x" not in r.stderr, r.stderr


def test_sigint_handled_by_python_continues_and_ends_cleanly(tmp_path):
    r = run(tmp_path, PROGRAM, ["int", "0.3"])
    assert r.returncode == 0, r.stderr
    assert "INTERRUPTED" in r.stdout
    names = [s["name"] for s in dump(tmp_path / "sessions", "scope")]
    assert "after-interrupt" in names
    notices = [x["message"] for x in dump(tmp_path / "sessions", "notice")]
    assert any("received SIGINT" in m for m in notices), notices
    assert len(dump(tmp_path / "sessions", "end")) == 1


def test_blocks_reach_the_disk_while_running_and_sigkill_loses_under_a_second(tmp_path):
    script = tmp_path / "prog.py"
    script.write_text(textwrap.dedent(PROGRAM))
    p = subprocess.Popen([sys.executable, str(script), "sleep", "3.0"],
                         env=env_for(tmp_path, True), stdout=subprocess.PIPE, text=True)
    try:
        time.sleep(2.0)
        now = time.time_ns()
        scopes = dump(tmp_path / "sessions", "scope")
        assert scopes, "nothing on disk after 2 s of steady scopes"
        # Written by a live process: the newest record on disk is under a second old.
        assert now - max(s["ts"] for s in scopes) < 1_000_000_000
        time.sleep(1.3)  # the loop has ended; the program sleeps
        p.send_signal(signal.SIGKILL)
        p.wait(timeout=10)
    finally:
        if p.poll() is None:
            p.kill()
    _, last_ns, n = last_line(p.stdout.read(), "LAST")
    scopes = dump(tmp_path / "sessions", "scope")
    assert len([s for s in scopes if not s.get("end")]) == int(n)


FORK = """
import os, sys, time, multiprocessing, gpufl
gpufl.init(app_name="parent")
with gpufl.scope("parent-before"):
    pass
t = time.monotonic()
pid = os.fork()
if pid == 0:
    with gpufl.scope("child"):
        pass
    if sys.argv[1] == "abort":
        os.abort()
    sys.exit(3)  # runs the atexit handlers in the child
_, status = os.waitpid(pid, 0)
print("CHILD", os.waitstatus_to_exitcode(status), round(time.monotonic() - t, 3), flush=True)

def work(x):
    with gpufl.scope("mp-child"):
        return x * 2

ctx = multiprocessing.get_context("fork")
with ctx.Pool(4) as pool:
    print("POOL", sum(pool.map(work, range(100))), flush=True)
with gpufl.scope("parent-after"):
    pass
gpufl.shutdown()
"""


@pytest.mark.parametrize("child_end,code", [("exit", 3), ("abort", -signal.SIGABRT)])
def test_fork_children_leave_the_parents_session_alone(tmp_path, child_end, code):
    r = run(tmp_path, FORK, [child_end])
    assert r.returncode == 0, r.stderr
    _, child_code, child_secs = last_line(r.stdout, "CHILD")
    assert int(child_code) == code
    assert float(child_secs) < 1.0, "a forked child must not wait for the parent's writer"
    assert last_line(r.stdout, "POOL")[1] == str(sum(x * 2 for x in range(100)))
    sessions = [d for d in (tmp_path / "sessions").iterdir() if d.is_dir()]
    assert len(sessions) == 1, sessions
    names = {s["name"] for s in dump(sessions[0], "scope")}
    assert names == {"parent-before", "parent-after"}, names
    assert len(dump(sessions[0], "end")) == 1
