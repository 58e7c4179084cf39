"""pytorch_oom.py - gpufl example: a list of CUDA tensors that grows until the GPU runs out.

Every step appends a new `--mib` MiB tensor (default 256) to a list that is never emptied (marker
`gpufl-example: grow`) and runs a small matmul, until the caching allocator's cudaMalloc fails and
PyTorch raises torch.cuda.OutOfMemoryError. Nothing catches it: the script dies with the
exception (exit 1), as a training run that keeps its losses with their graphs does. The session's
first finding (`out-of-memory`) names the failing line and the live memory by line: this line.
Fix: do not keep what a step no longer needs (here: the list).

With `--hold-gib G --warm-s S` it first allocates G GiB it keeps (marker `gpufl-example: hold`)
and runs S seconds of small synchronizing steps: under `gpufl record --always-on` with a small
`GPUFL_MAX_DISK_MB`, the files of that allocation are deleted before the crash, and the post-mortem
still names it (each rolling file starts with the allocations still live).

Run:    python examples/pytorch_oom.py [--mib 256] [--hold-gib 8 --warm-s 15]
        gpufl record -o DIR -- python examples/pytorch_oom.py
Prints: "pytorch_oom: step N allocated X MiB reserved Y MiB free Z MiB" every 20 steps, then
        PyTorch's OutOfMemoryError traceback; exit 1.
"""
import argparse
import time

import torch


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--mib", type=int, default=256)
    p.add_argument("--hold-gib", type=int, default=0,
                   help="first allocate this many GiB at the line marked `hold` and keep it")
    p.add_argument("--warm-s", type=float, default=0.0,
                   help="then run small synchronizing steps for this long before growing")
    args = p.parse_args()
    x = torch.randn(1024, 1024, device="cuda")
    if args.hold_gib:
        # A long-lived allocation, then a stretch of small steps each reading a result back (a
        # sync apiece): under `--always-on` with a small disk bound the files that hold this
        # allocation are deleted long before the crash.
        held = torch.empty(args.hold_gib << 30, dtype=torch.uint8, device="cuda")  # gpufl-example: hold
        end = time.monotonic() + args.warm_s
        while time.monotonic() < end:
            x = torch.tanh(x @ x)
            x.sum().item()
        print(f"pytorch_oom: held {held.numel() >> 30} GiB through {args.warm_s} s of steps", flush=True)
    keep = []
    step = 0
    while True:
        keep.append(torch.empty(args.mib << 20, dtype=torch.uint8, device="cuda"))  # gpufl-example: grow
        x = torch.tanh(x @ x)
        step += 1
        if step % 20 == 0:
            free, _ = torch.cuda.mem_get_info()
            print(
                f"pytorch_oom: step {step} allocated {torch.cuda.memory_allocated() >> 20} MiB "
                f"reserved {torch.cuda.memory_reserved() >> 20} MiB free {free >> 20} MiB",
                flush=True,
            )


if __name__ == "__main__":
    main()
