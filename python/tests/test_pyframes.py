"""End-to-end tests for crates/gpufl-capture/src/pyframes.rs.

Build first: ``cargo build -p gpufl-capture``. The library is taken from
``$GPUFL_CAPTURE_LIB`` or ``<repo>/target/debug/libgpufl_capture.so``.

ctypes releases the GIL around foreign calls, which is exactly the situation
the recorder is in during a CUDA callback: the Python stack must be read from
the interpreter's structures without holding (or taking) the GIL.
"""

import ctypes
import json
import os
import sys
import threading
import time
from pathlib import Path

import pytest

HERE = Path(__file__).resolve()
REPO_ROOT = HERE.parents[2]
SUPPORTED = {(3, 11), (3, 12)}


def _lib_path():
    from gpufl_test_paths import LIB
    return LIB


def _load():
    path = _lib_path()
    if not path.exists():
        pytest.fail(f"{path} not found: run `cargo build -p gpufl-capture` first "
                    "(or set GPUFL_CAPTURE_LIB)")
    lib = ctypes.CDLL(str(path))  # CDLL => the GIL is released during calls
    lib.gpufl_test_python_stack.argtypes = [ctypes.c_char_p, ctypes.c_size_t]
    lib.gpufl_test_python_stack.restype = ctypes.c_ssize_t
    lib.gpufl_test_python_capture_ns.argtypes = [ctypes.c_uint32]
    lib.gpufl_test_python_capture_ns.restype = ctypes.c_double
    return lib


LIB = None


@pytest.fixture(scope="module", autouse=True)
def lib():
    global LIB
    if sys.version_info[:2] not in SUPPORTED:
        pytest.skip(f"pyframes supports {sorted(SUPPORTED)}, not {sys.version_info[:2]}")
    LIB = _load()
    return LIB


def _source_lines():
    return HERE.read_text(encoding="utf-8").splitlines()


def line_of(marker):
    """1-based line number of the unique line ending in '# @<marker>'."""
    tag = f"# @{marker}"
    hits = [i + 1 for i, text in enumerate(_source_lines()) if text.rstrip().endswith(tag)]
    assert len(hits) == 1, (marker, hits)
    return hits[0]


def stack():
    """Python stack of the calling thread as seen by the recorder, innermost first."""
    buf = ctypes.create_string_buffer(1 << 16)
    n = LIB.gpufl_test_python_stack(buf, len(buf))  # @stack
    assert n >= 0, n
    return json.loads(buf.raw[:n].decode("utf-8"))


def frames_of_this_file(frames):
    return [f for f in frames if f["file"] == str(HERE)]


def assert_top(frames, expected):
    """expected: list of (function, marker) for the innermost frames below stack()."""
    want = [{"file": str(HERE), "function": "stack", "line": line_of("stack")}]
    want += [{"file": str(HERE), "function": fn, "line": line_of(m)} for fn, m in expected]
    assert frames[: len(want)] == want, json.dumps(frames[: len(want) + 2], indent=1)


# --- (1) nested call chain -------------------------------------------------

def outer():
    return middle()  # @outer


def middle():
    return inner()  # @middle


def inner():
    return stack()  # @inner


def test_nested_chain():
    frames = outer()  # @test_nested
    assert_top(frames, [("inner", "inner"), ("middle", "middle"), ("outer", "outer"),
                        ("test_nested_chain", "test_nested")])
    # The outermost frame is the interpreter's entry point, deeper than pytest.
    assert len(frames) > 5
    assert all(f["line"] > 0 and f["function"] for f in frames)


def test_buffer_too_small_reports_needed_size():
    n = LIB.gpufl_test_python_stack(ctypes.create_string_buffer(4), 4)
    assert n < -4
    buf = ctypes.create_string_buffer(-n)
    assert LIB.gpufl_test_python_stack(buf, -n) == -n - 1


# --- (2) qualified names ---------------------------------------------------

class Outer:
    def method(self):
        return stack()  # @method

    @staticmethod
    def static():
        return stack()  # @static

    class Nested:
        @classmethod
        def cls(cls):
            return stack()  # @cls


def test_method_qualnames():
    assert_top(Outer().method(), [("Outer.method", "method")])
    assert_top(Outer.static(), [("Outer.static", "static")])
    assert_top(Outer.Nested.cls(), [("Outer.Nested.cls", "cls")])


def test_closure_qualname():
    def local():
        return stack()  # @local

    assert_top(local(), [("test_closure_qualname.<locals>.local", "local")])


# --- (3) threads vs. a GIL-holding main thread -----------------------------

def thread_a(out):
    out.append(stack())  # @thread_a


def thread_b(out):
    out.append(stack())  # @thread_b


def thread_c(out):
    out.append(stack())  # @thread_c


def thread_d(out):
    out.append(stack())  # @thread_d


THREAD_FUNCS = [thread_a, thread_b, thread_c, thread_d]


def test_threads_with_gil_held_elsewhere():
    results = {f.__name__: [] for f in THREAD_FUNCS}
    start = threading.Barrier(len(THREAD_FUNCS) + 1)
    stop = threading.Event()
    errors = []

    def worker(fn):
        try:
            start.wait(timeout=10)
            while not stop.is_set() and len(results[fn.__name__]) < 200:
                fn(results[fn.__name__])
        except Exception as e:  # noqa: BLE001 - reported by the main thread
            errors.append(repr(e))

    threads = [threading.Thread(target=worker, args=(f,), daemon=True) for f in THREAD_FUNCS]
    for t in threads:
        t.start()
    start.wait(timeout=10)
    # Hold the GIL in pure-Python bytecode (only released at switch intervals)
    # while the workers are inside the recorder with the GIL released.
    deadline = time.monotonic() + 1.0
    x = 0
    while time.monotonic() < deadline:
        for i in range(1000):
            x += i
    stop.set()
    for t in threads:
        t.join(timeout=10)
    assert not any(t.is_alive() for t in threads), "capture hung"
    assert not errors, errors
    for fn in THREAD_FUNCS:
        got = results[fn.__name__]
        assert got, fn.__name__
        for frames in got:
            assert_top(frames, [(fn.__name__, fn.__name__)])
            names = {f["function"] for f in frames}
            assert names.isdisjoint({g.__name__ for g in THREAD_FUNCS if g is not fn})
            assert "test_threads_with_gil_held_elsewhere" not in names


# --- (4) generators, lambdas, exec, unusual names --------------------------

def gen():
    yield stack()  # @gen


async def coro():
    return stack()  # @coro


def test_generator():
    assert_top(next(gen()), [("gen", "gen")])
    assert_top(list(gen())[0], [("gen", "gen")])


def test_coroutine():
    c = coro()
    with pytest.raises(StopIteration) as stop:
        c.send(None)
    assert_top(stop.value.value, [("coro", "coro")])


lam = lambda: stack()  # noqa: E731  # @lambda


def test_lambda():
    assert_top(lam(), [("<lambda>", "lambda")])


def test_exec_synthetic_filename():
    ns = {"stack": stack}
    src = "\n\ndef synth():\n    return stack()\n\nresult = synth()\n"
    exec(compile(src, "<gpufl-synthetic>", "exec"), ns)
    f = ns["result"]
    assert f[1] == {"file": "<gpufl-synthetic>", "function": "synth", "line": 4}
    assert f[2] == {"file": "<gpufl-synthetic>", "function": "<module>", "line": 6}

    ns = {"stack": stack}
    exec("r = (lambda: stack())()", ns)
    assert ns["r"][1] == {"file": "<string>", "function": "<lambda>", "line": 1}
    assert ns["r"][2] == {"file": "<string>", "function": "<module>", "line": 1}


@pytest.mark.parametrize(
    "fname,func",
    [
        ("<latin1-é>", "fünc"),        # UCS1 (non-ASCII latin-1)
        ("<ucs2-函数>", "函数"),        # UCS2
        ("<ucs4-😀>", "\U00010330x"),  # UCS4 (Gothic letter ahsa)
    ],
)
def test_non_ascii_names(fname, func):
    ns = {"stack": stack}
    exec(compile(f"def {func}():\n    return stack()\n", fname, "exec"), ns)
    assert ns[func]()[1] == {"file": fname, "function": func, "line": 2}


def test_long_filename_is_capped():
    name = "<" + "x" * 10000 + ">"
    ns = {"stack": stack}
    exec(compile("r = stack()\n", name, "exec"), ns)
    assert ns["r"][1]["file"] == name[:4096]


def test_deep_recursion_is_capped_keeping_both_ends():
    """A stack deeper than the buffer (256 here) keeps its innermost frames and its outermost 16:
    the user's script that called into the deep framework stays in the capture."""
    def rec(n):
        return rec(n - 1) if n else stack()  # @rec

    full = outer_frames_now()  # @deep_full
    frames = rec(400)  # @deep_call
    name = "test_deep_recursion_is_capped_keeping_both_ends.<locals>.rec"
    assert len(frames) == 256
    assert frames[0]["function"] == "stack"
    assert all(f["function"] == name and f["line"] == line_of("rec") for f in frames[1:240])
    # The last 16 are the real stack's outermost 16, in order: rec's outermost calls, this test at
    # its call line, then pytest's frames down to the interpreter's entry point.
    assert full[1]["function"] == "outer_frames_now"
    callers = full[3:]  # below this test's own frame
    me = {"file": str(HERE), "function": "test_deep_recursion_is_capped_keeping_both_ends",
          "line": line_of("deep_call")}
    real = [{"file": str(HERE), "function": name, "line": line_of("rec")}] * 401 + [me] + callers
    assert frames[240:] == real[-16:], json.dumps(frames[240:], indent=1)


def outer_frames_now():
    return stack()  # @outer_now


def test_deep_merged_stack_keeps_the_callers_line():
    """Through the recorder's own capture (48 Python frames at most): a call 100 frames deep still
    names the line of the test that made it."""
    LIB.gpufl_test_capture_stack_json.argtypes = [ctypes.c_char_p, ctypes.c_size_t]
    LIB.gpufl_test_capture_stack_json.restype = ctypes.c_ssize_t

    def rec(n):
        return rec(n - 1) if n else merged_stack()

    # On a thread of its own: a few threading frames under `run` rather than pytest's 30 or so,
    # so that `run`'s line is within the outermost 16.
    out = []

    def run():
        out.append(rec(100))  # @deep_merged

    t = threading.Thread(target=run)
    t.start()
    t.join()
    lines = _py_lines(out[0])
    fn = "test_deep_merged_stack_keeps_the_callers_line"
    assert (f"{fn}.<locals>.run", line_of("deep_merged")) in lines, lines
    assert lines[0] == ("merged_stack", line_of("merged")), lines


def test_many_lines_in_one_function():
    """Line decoding across a long function with big line deltas."""
    src = ["def big(stack):", "    out = []"]
    expect = []
    for i in range(60):
        src += ["    # filler"] * (i * 7 % 23) + ["    out.append(stack())"]
        expect.append(len(src))
    src += ["    return out"]
    ns = {}
    exec(compile("\n".join(src) + "\n", "<big>", "exec"), ns)
    got = [frames[1]["line"] for frames in ns["big"](stack)]
    assert got == expect


def merged_stack():
    """The merged native + Python stack, through the same capture code as a sync callback."""
    buf = ctypes.create_string_buffer(1 << 18)
    n = LIB.gpufl_test_capture_stack_json(buf, len(buf))  # @merged
    assert n >= 0, n
    return json.loads(buf.raw[:n].decode("utf-8"))


def merged_caller():
    return merged_stack()  # @merged_caller


def test_merged_native_and_python_stack():
    LIB.gpufl_test_capture_stack_json.argtypes = [ctypes.c_char_p, ctypes.c_size_t]
    LIB.gpufl_test_capture_stack_json.restype = ctypes.c_ssize_t
    frames = merged_caller()  # @merged_test
    kinds = [f["kind"] for f in frames]
    # Native frames first (ctypes/libffi calling into the recorder), then Python frames, and the
    # interpreter's own C frames replaced by them.
    assert kinds[0] == "native", kinds
    first_py = kinds.index("python")
    assert all(k == "python" for k in kinds[first_py:]), kinds
    py = [f for f in frames if f["kind"] == "python"]
    want = [("merged_stack", "merged"), ("merged_caller", "merged_caller"),
            ("test_merged_native_and_python_stack", "merged_test")]
    got = [(f["function"], f["line"]) for f in py[:3]]
    assert got == [(fn, line_of(m)) for fn, m in want], json.dumps(frames, indent=1)
    assert all(f["file"] == str(HERE) for f in py[:3])
    natives = [f for f in frames if f["kind"] == "native"]
    assert not any("libpython" in (f.get("module") or "") for f in natives), "interpreter frames cut"
    assert not any("gpufl_capture" in (f.get("module") or "") for f in natives), "own frames cut"


def _py_lines(frames):
    return [(f["function"], f["line"]) for f in frames if f["kind"] == "python"]


def reuse_outer(which):
    if which == 0:
        return merged_stack()  # @reuse_a
    return merged_stack()  # @reuse_b


def test_merged_stacks_reuse_unchanged_outer_frames_but_not_changed_ones():
    """Captures on one thread reuse the ids of the outer Python frames unchanged since the last
    capture; a frame whose line changed, and every frame inside it, is looked up again."""
    LIB.gpufl_test_capture_stack_json.argtypes = [ctypes.c_char_p, ctypes.c_size_t]
    LIB.gpufl_test_capture_stack_json.restype = ctypes.c_ssize_t
    got = []
    for which in (0, 1, 0, 0, 1):
        got.append(_py_lines(reuse_outer(which))[:3])  # @reuse_loop
    fn = "test_merged_stacks_reuse_unchanged_outer_frames_but_not_changed_ones"
    for which, lines in zip((0, 1, 0, 0, 1), got):
        want = [("merged_stack", line_of("merged")),
                ("reuse_outer", line_of("reuse_b" if which else "reuse_a")),
                (fn, line_of("reuse_loop"))]
        assert lines == want, (which, lines)
    # A deeper chain, then a shallower one at the same outer frames, then deeper again.
    def deeper():
        return merged_stack()  # @reuse_deeper
    a = _py_lines(deeper())[:3]  # @reuse_d1
    b = _py_lines(merged_stack())[:2]  # @reuse_d2
    assert a == [("merged_stack", line_of("merged")), (f"{fn}.<locals>.deeper", line_of("reuse_deeper")),
                 (fn, line_of("reuse_d1"))], a
    assert b == [("merged_stack", line_of("merged")), (fn, line_of("reuse_d2"))], b


_DEFER_SCRIPT = r"""
import ctypes, json, sys
lib = ctypes.CDLL(sys.argv[1])
lib.gpufl_test_capture_stack_json.argtypes = [ctypes.c_char_p, ctypes.c_size_t]
lib.gpufl_test_capture_stack_json.restype = ctypes.c_ssize_t
def inner():
    buf = ctypes.create_string_buffer(1 << 18)
    n = lib.gpufl_test_capture_stack_json(buf, len(buf))
    return json.loads(buf.raw[:n].decode())
def outer():
    return [inner() for _ in range(3)]
print(json.dumps([[(f["function"], f["line"]) for f in s if f["kind"] == "python"] for s in outer()]))
"""


def test_deferred_and_inline_resolution_name_the_same_frames():
    """First sightings of Python frames are resolved on the writer side (fault-tolerant reads,
    identity re-checked) by default and inline with GPUFL_PY_DEFER=0: the same frames either way."""
    import subprocess
    out = {}
    for defer in ("1", "0"):
        env = dict(os.environ, GPUFL_PY_DEFER=defer)
        r = subprocess.run([sys.executable, "-c", _DEFER_SCRIPT, str(_lib_path())], env=env,
                           capture_output=True, text=True, timeout=60)
        assert r.returncode == 0, r.stderr
        out[defer] = json.loads(r.stdout)
    assert out["1"] == out["0"], out
    stacks = out["1"]
    assert len(stacks) == 3 and all(s == stacks[0] for s in stacks), stacks
    assert [f for f, _ in stacks[0][:2]] == ["inner", "outer.<locals>.<listcomp>"] or \
        [f for f, _ in stacks[0][:2]] == ["inner", "outer"], stacks[0]
