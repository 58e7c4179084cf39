"""launch_bound.py - launch-bound PyTorch loop for measuring recorder overhead.

8 x (Linear(1024, 1024) + ReLU), batch 256, MSE loss, SGD, with
torch.cuda.synchronize() at the end of every step: many small kernels and one
host sync per step, so per-launch / per-sync recorder costs show up in wall time.

What is timed (time.perf_counter): from just after a torch.cuda.synchronize()
to just after the synchronize that ends the last of --steps steps. Warmup
(--warmup steps, once, before any timed loop), model/data setup and, with
--profiler, the profiler's start (entering the `with`) and its stop/parse
(leaving the `with`) are NOT included; the latter is reported separately as
"profiler_exit_ms". Nothing is exported, so "export_ms" is always 0.

Run:    python bench/launch_bound.py --mode baseline [--steps 500] [--warmup 20] [--repeat 5]
        gpufl record -o DIR -- python bench/launch_bound.py --mode gpufl --repeat 5
        python bench/launch_bound.py --mode torch-profiler --profiler --repeat 5
In-process A/B:  gpufl record -o DIR -- python bench/launch_bound.py --mode M --toggle 12
        (--mode torch-profiler, not recorded: each recorded loop runs inside torch.profiler,
        whose start and stop stay outside the timed loop)
        runs 12 cycles of three timed loops each: recording ON, then paused (OFF1), then paused
        again (OFF2), switching with gpufl_pause()/gpufl_resume() between loops (not timed).
        ON/OFF2 is the recording's cost with the process, GPU and memory layout held fixed;
        OFF1/OFF2 is what spills into the loop after recording (the writer still decoding the
        ON loop's records, which the pause flushed). Without gpufl the same loops run with no
        switching: the method's own bias. Prints {"mode", "toggle": true, "on_ms", "off1_ms",
        "off2_ms" (per cycle), "paused_by_gpufl", "steps"}.
Prints: one JSON line {"mode", "wall_ms" (best of --repeat), "wall_ms_median",
        "wall_ms_all", "thread_cpu_ms_all" (the main thread's CPU time per loop),
        "process_cpu_ms_all" (all threads'), "steal_ms_all" (time the hypervisor took from
        this VM's CPUs during each loop, summed over CPUs, from /proc/stat), "thread_cpu_ms"
        (CPU time per thread name over all timed loops, from /proc/self/task/*/schedstat), "steps", "warmup", "repeat", "us_per_step" (from best),
        "profiler", "profiler_exit_ms", "export_ms"}.
"""
import argparse
import json
import os
import statistics
import threading
import time
import warnings

import torch
import torch.nn as nn
import torch.nn.functional as F

# Recent torch (seen on 2.11) warns once per profiler that events are not kept across cycles.
warnings.filterwarnings("ignore", message="Warning: Profiler clears events")


def build(seed=0, device="cuda"):
    torch.manual_seed(seed)
    layers = []
    for _ in range(8):
        layers += [nn.Linear(1024, 1024), nn.ReLU()]
    model = nn.Sequential(*layers).to(device)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    x = torch.randn(256, 1024, device=device)
    y = torch.randn(256, 1024, device=device)
    return model, opt, x, y


def step(model, opt, x, y):
    opt.zero_grad(set_to_none=True)
    loss = F.mse_loss(model(x), y)
    loss.backward()
    opt.step()
    torch.cuda.synchronize()


def steal_ticks():
    """Time stolen from this VM by its hypervisor, all CPUs (USER_HZ ticks), or 0 if unknown."""
    try:
        with open("/proc/stat") as f:
            fields = f.readline().split()
        return int(fields[8]) if fields[0] == "cpu" and len(fields) > 8 else 0
    except (OSError, ValueError):
        return 0


def thread_cpu_ns():
    """{tid: (name, ns on CPU)} for every thread of this process, from /proc (schedstat)."""
    out = {}
    try:
        tids = os.listdir("/proc/self/task")
    except OSError:
        return out
    for tid in tids:
        try:
            with open(f"/proc/self/task/{tid}/comm") as f:
                name = f.read().strip()
            with open(f"/proc/self/task/{tid}/schedstat") as f:
                ns = int(f.read().split()[0])
        except (OSError, ValueError, IndexError):
            continue
        out[tid] = (name, ns)
    return out


def threads_delta(before, after, main_tid):
    """CPU ms per thread name over an interval; the main thread is "main"."""
    by_name = {}
    for tid, (name, ns) in after.items():
        key = "main" if int(tid) == main_tid else name
        by_name[key] = by_name.get(key, 0.0) + (ns - before.get(tid, (name, 0))[1]) / 1e6
    return {k: round(v, 1) for k, v in sorted(by_name.items(), key=lambda kv: -kv[1]) if v >= 0.5}


def timed_loop(model, opt, x, y, steps):
    """Wall, main-thread CPU and whole-process CPU milliseconds of `steps` steps, and the
    hypervisor's steal time over all CPUs meanwhile."""
    torch.cuda.synchronize()
    s0, p0, c0, t0 = steal_ticks(), time.process_time(), time.thread_time(), time.perf_counter()
    for _ in range(steps):
        step(model, opt, x, y)
    torch.cuda.synchronize()
    t1, c1, p1, s1 = time.perf_counter(), time.thread_time(), time.process_time(), steal_ticks()
    tick_ms = 1e3 / os.sysconf("SC_CLK_TCK")
    return (t1 - t0) * 1e3, (c1 - c0) * 1e3, (p1 - p0) * 1e3, (s1 - s0) * tick_ms


def gpufl_lib():
    """The gpufl capture library when this process is recorded, else None."""
    import ctypes
    path = os.environ.get("CUDA_INJECTION64_PATH") or os.environ.get("GPUFL_CAPTURE_LIB")
    if not path or "gpufl" not in os.path.basename(path):
        return None
    try:
        lib = ctypes.CDLL(path)
        return lib if hasattr(lib, "gpufl_pause") else None
    except OSError:
        return None


def toggled(model, opt, x, y, steps, cycles, mode):
    """`cycles` x (ON, OFF1, OFF2) timed loops, switching recording between loops."""
    lib = gpufl_lib()
    paused = False

    def switch(on):
        nonlocal paused
        if lib is not None:
            rc = lib.gpufl_resume() if on else lib.gpufl_pause()
            paused = paused or (not on and rc == 0)

    on_ms, off1_ms, off2_ms = [], [], []
    for _ in range(cycles):
        switch(True)
        if mode == "torch-profiler":
            # The recorded loop inside torch.profiler (CPU + CUDA); its start and its stop (which
            # parses the events, synchronously) stay outside the timed loop.
            from torch.profiler import ProfilerActivity, profile
            with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]):
                on_ms.append(timed_loop(model, opt, x, y, steps)[0])
        else:
            on_ms.append(timed_loop(model, opt, x, y, steps)[0])
        switch(False)
        off1_ms.append(timed_loop(model, opt, x, y, steps)[0])
        off2_ms.append(timed_loop(model, opt, x, y, steps)[0])
    switch(True)
    r = lambda v: [round(w, 3) for w in v]
    print(json.dumps({"mode": mode, "toggle": True, "on_ms": r(on_ms), "off1_ms": r(off1_ms),
                      "off2_ms": r(off2_ms), "paused_by_gpufl": paused, "steps": steps}))


def main():
    ap = argparse.ArgumentParser(description="launch-bound PyTorch loop")
    ap.add_argument("--mode", default="baseline", help="label copied into the JSON")
    ap.add_argument("--steps", type=int, default=500)
    ap.add_argument("--warmup", type=int, default=20)
    ap.add_argument("--repeat", type=int, default=1)
    ap.add_argument("--toggle", type=int, default=0, metavar="CYCLES",
                    help="in-process A/B: CYCLES x (recording on, paused, paused) loops")
    ap.add_argument("--profiler", action="store_true",
                    help="run each timed loop inside torch.profiler.profile(CPU, CUDA)")
    args = ap.parse_args()
    if args.steps < 1 or args.warmup < 0 or args.repeat < 1:
        ap.error("need --steps >= 1, --warmup >= 0, --repeat >= 1")

    model, opt, x, y = build()
    for _ in range(args.warmup):
        step(model, opt, x, y)
    if args.toggle:
        toggled(model, opt, x, y, args.steps, args.toggle, args.mode)
        return

    walls, cpus, procs, steals, exits = [], [], [], [], []
    threads_before = thread_cpu_ns()
    for _ in range(args.repeat):
        if args.profiler:
            from torch.profiler import ProfilerActivity, profile
            with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]):
                ms, cpu, proc, steal = timed_loop(model, opt, x, y, args.steps)
                t_exit = time.perf_counter()
            exits.append((time.perf_counter() - t_exit) * 1e3)
        else:
            ms, cpu, proc, steal = timed_loop(model, opt, x, y, args.steps)
        walls.append(ms)
        cpus.append(cpu)
        procs.append(proc)
        steals.append(steal)

    threads = threads_delta(threads_before, thread_cpu_ns(), threading.get_native_id())
    best = min(walls)
    print(json.dumps({
        "mode": args.mode,
        "wall_ms": round(best, 3),
        "wall_ms_median": round(statistics.median(walls), 3),
        "wall_ms_all": [round(w, 3) for w in walls],
        "thread_cpu_ms_all": [round(c, 3) for c in cpus],
        "process_cpu_ms_all": [round(c, 3) for c in procs],
        "steal_ms_all": [round(c, 1) for c in steals],
        "thread_cpu_ms": threads,
        "steps": args.steps,
        "warmup": args.warmup,
        "repeat": args.repeat,
        "us_per_step": round(best * 1e3 / args.steps, 2),
        "profiler": args.profiler,
        "profiler_exit_ms": round(statistics.median(exits), 3) if exits else 0.0,
        "export_ms": 0.0,
    }))


if __name__ == "__main__":
    main()
