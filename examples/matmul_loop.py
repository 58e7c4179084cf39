"""matmul_loop.py - gpufl example: GPU telemetry during a large matmul loop, then a host-bound tail.

Phase 1 (~SECONDS s): large square matmuls (bf16 by default, fp32 with --dtype fp32) queued back to
back with no synchronization in the loop, so the GPU is busy all the time: NVML's utilization
should read near 100 %, with power near the board's limit (often with the software power cap
among the clock-throttle reasons). The loop line is marked "gpufl-example: telemetry".

Phase 2 (~TAIL s): the host sleeps 20 ms before each small matmul, so the GPU idles: gpufl's
`low-utilization` (and `gpu-idle`) should name the line marked "gpufl-example: low-utilization",
and NVML's utilization should read low there.

--fill-memory F first allocates (and keeps) device memory until F of the GPU's memory is in use,
for `memory-pressure` (which fires above 90 %).

Run:    python examples/matmul_loop.py [--seconds 5] [--tail 1] [--size 8192] [--dtype bf16|fp32]
                                       [--fill-memory 0.93]
        gpufl record -o DIR -- python examples/matmul_loop.py --seconds 5
Prints: one line "matmul_loop: dtype=D size=N iters=I tail=T fill=F checksum_ok"; exit 0. The
        iteration count comes from a timed calibration, so it varies from run to run.
"""
import argparse
import time

import torch


def calibrate(a, b, out, reps=10):
    """Seconds per matmul, measured after a warm-up."""
    for _ in range(3):
        torch.matmul(a, b, out=out)
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(reps):
        torch.matmul(a, b, out=out)
    torch.cuda.synchronize()
    return (time.perf_counter() - t) / reps


def fill_memory(fraction):
    """Allocate device memory until `fraction` of it is in use; return the tensor (keep it alive)."""
    if fraction <= 0:
        return None
    free, total = torch.cuda.mem_get_info()
    want = int(fraction * total) - (total - free)
    if want <= 0:
        return None
    return torch.empty(want, dtype=torch.uint8, device="cuda")


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--seconds", type=float, default=5.0)
    p.add_argument("--tail", type=float, default=1.0)
    p.add_argument("--size", type=int, default=8192)
    p.add_argument("--dtype", choices=["bf16", "fp32"], default="bf16")
    p.add_argument("--fill-memory", type=float, default=0.0)
    args = p.parse_args()
    dtype = torch.bfloat16 if args.dtype == "bf16" else torch.float32
    torch.manual_seed(0)
    n = args.size
    a = torch.randn(n, n, device="cuda", dtype=dtype) / n**0.5
    b = torch.randn(n, n, device="cuda", dtype=dtype) / n**0.5
    out = torch.empty(n, n, device="cuda", dtype=dtype)
    ballast = fill_memory(args.fill_memory)
    iters = max(1, int(args.seconds / calibrate(a, b, out)))
    for _ in range(iters):
        torch.matmul(a, b, out=out)  # gpufl-example: telemetry
    torch.cuda.synchronize()
    ok = bool(torch.isfinite(out).all())
    small_a, small_b = a[:1024, :1024], b[:1024, :1024]
    tail_steps = int(args.tail / 0.02)
    for _ in range(tail_steps):
        time.sleep(0.02)  # host work: the GPU waits
        small = torch.matmul(small_a, small_b)  # gpufl-example: low-utilization
    torch.cuda.synchronize()
    ok = ok and (tail_steps == 0 or bool(torch.isfinite(small).all()))
    del ballast
    print(
        f"matmul_loop: dtype={args.dtype} size={n} iters={iters} tail={tail_steps} "
        f"fill={args.fill_memory} {'checksum_ok' if ok else 'checksum_BAD'}"
    )
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
