"""The host sampler (crates/gpufl-capture/src/hostsampler.rs), no GPU needed.

`gpufl_test_host_samples(hz, ms, …)` runs the recorder's sampler thread for `ms` milliseconds over
this process and returns its samples as JSON: every Python thread with frames (its stack read
without the GIL through the cross-thread reader) and every thread marked as having made a CUDA
call (`gpufl_test_callmark`, as the recorder's callbacks mark them), each with its state. The
calling thread waits inside the ctypes call with the GIL released, as a thread blocked in a CUDA
call would.

Build first: ``cargo build -p gpufl-capture``.
"""

import collections
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
LIB_PATH = Path(os.environ.get("GPUFL_CAPTURE_LIB",
                               REPO_ROOT / "target" / "debug" / "libgpufl_capture.so"))
RUNTIME, CUDA_MALLOC = 2, 20  # CUPTI's runtime domain, cudaMalloc's callback id


def _load():
    if not LIB_PATH.exists():
        pytest.fail(f"{LIB_PATH} not found: run `cargo build -p gpufl-capture` first")
    lib = ctypes.CDLL(str(LIB_PATH))  # CDLL: the GIL is released during the call
    lib.gpufl_test_host_samples.argtypes = [ctypes.c_uint32, ctypes.c_uint32,
                                            ctypes.c_char_p, ctypes.c_size_t]
    lib.gpufl_test_host_samples.restype = ctypes.c_ssize_t
    lib.gpufl_test_callmark.argtypes = [ctypes.c_int, ctypes.c_uint32, ctypes.c_uint32]
    lib.gpufl_test_callmark.restype = ctypes.c_int
    return lib


LIB = _load() if LIB_PATH.exists() else None

supported = pytest.mark.skipif(sys.version_info[:2] not in SUPPORTED,
                               reason=f"pyframes supports {sorted(SUPPORTED)}")


def line_of(marker):
    tag = f"# @{marker}"
    lines = HERE.read_text(encoding="utf-8").splitlines()
    hits = [i + 1 for i, t in enumerate(lines) if t.rstrip().endswith(tag)]
    assert len(hits) == 1, (marker, hits)
    return hits[0]


def sample(hz, ms):
    buf = ctypes.create_string_buffer(1 << 24)
    n = LIB.gpufl_test_host_samples(hz, ms, buf, len(buf))  # @sampling
    assert n >= 0, n
    return json.loads(buf.raw[:n].decode("utf-8"))


def busy(stop, counter):
    while not stop.is_set():  # @busy_loop
        counter[0] += 1  # @busy_body


def sleeper(stop):
    while not stop.is_set():
        time.sleep(0.005)  # @sleep


def parked(stop):
    stop.wait()  # @parked


def in_cuda_call(stop, marked):
    # Marked as inside cudaMalloc (as the recorder's entry callback marks a thread), then waiting.
    marked.append(LIB.gpufl_test_callmark(1, RUNTIME, CUDA_MALLOC))
    while not stop.is_set():
        time.sleep(0.002)  # @cuda_wait
    LIB.gpufl_test_callmark(0, RUNTIME, CUDA_MALLOC)


def own_frames(s):
    """(function, line) of the sample's frames in this file, innermost first."""
    return [(f["function"], f["line"]) for f in s["frames"] if f["file"] == str(HERE)]


@supported
def test_states_and_lines_of_busy_sleeping_parked_and_cuda_threads():
    stop = threading.Event()
    counter, marked = [0], []
    threads = {
        "busy": threading.Thread(target=busy, args=(stop, counter), daemon=True),
        "sleeper": threading.Thread(target=sleeper, args=(stop,), daemon=True),
        "parked": threading.Thread(target=parked, args=(stop,), daemon=True),
        "cuda": threading.Thread(target=in_cuda_call, args=(stop, marked), daemon=True),
    }
    for t in threads.values():
        t.start()
    try:
        time.sleep(0.05)
        got = sample(100, 800)
    finally:
        stop.set()
        for t in threads.values():
            t.join()
    assert marked == [1], marked
    by_tid = collections.defaultdict(list)
    for s in got["samples"]:
        by_tid[s["tid"]].append(s)
    tid = {name: t.native_id for name, t in threads.items()}
    tid["main"] = threading.get_native_id()
    # Every thread sampled about once per round (100/s for 0.8 s), each sample standing for 10 ms.
    assert got["rounds"] >= 40, got["rounds"]
    for name, t in tid.items():
        n = len(by_tid[t])
        assert n >= got["rounds"] * 0.8, (name, n, got["rounds"])
        assert all(s["period_ns"] == 10_000_000 for s in by_tid[t])

    def share(name, states, lines=None):
        ss = by_tid[tid[name]]
        ok = [s for s in ss if s["state"] in states.split("|")
              and (lines is None or (own_frames(s) and own_frames(s)[0][1] in lines))]
        return len(ok) / len(ss)

    states = {name: collections.Counter(s["state"] for s in by_tid[t]) for name, t in tid.items()}
    # On a CPU at the busy loop's lines (two threads share one GIL: some samples wait for it).
    assert share("busy", "cpu", {line_of("busy_loop"), line_of("busy_body")}) >= 0.5, states
    # Sleeping at the sleep line, or, woken, waiting there for the GIL the busy thread holds.
    assert share("sleeper", "sleep|lock", {line_of("sleep")}) >= 0.8, states
    assert share("sleeper", "sleep", {line_of("sleep")}) >= 0.1, states
    # Parked in threading's Event.wait: idle, with its stack down to the line that waits.
    assert share("parked", "idle") >= 0.9, states
    assert ("parked", line_of("parked")) in own_frames(by_tid[tid["parked"]][0])
    # Inside a CUDA call (the marker), named, at the line of the Python frames.
    assert share("cuda", "cuda") == 1.0, states
    assert all(s["call"] == [RUNTIME, CUDA_MALLOC] for s in by_tid[tid["cuda"]])
    assert ("in_cuda_call", line_of("cuda_wait")) in own_frames(by_tid[tid["cuda"]][0])
    # The main thread waits inside the ctypes call: its stack names the call's line.
    main = by_tid[tid["main"]]
    assert all(("sample", line_of("sampling")) in own_frames(s) for s in main), own_frames(main[0])
    assert counter[0] > 0


@supported
def test_the_sampler_stays_cheap():
    stop = threading.Event()
    threads = [threading.Thread(target=parked, args=(stop,), daemon=True) for _ in range(8)]
    threads.append(threading.Thread(target=busy, args=(stop, [0]), daemon=True))
    for t in threads:
        t.start()
    try:
        got = sample(100, 1000)
    finally:
        stop.set()
        for t in threads:
            t.join()
    share = got["cpu_ns"] / max(got["wall_ns"], 1)
    per_sample_us = got["cpu_ns"] / max(len(got["samples"]), 1) / 1e3
    # 10 Python threads at 100/s: ~1000 samples a second. A sample costs a few µs (one copy of the
    # thread's stack head when unchanged, a few when walked, one pread of /proc); the bounds are
    # loose for loaded CI machines and unoptimized test builds.
    limit = 15 if "release" in str(LIB_PATH) else 150
    assert per_sample_us < limit, f"{per_sample_us:.1f} µs a sample, {share:.2%} of a core"
