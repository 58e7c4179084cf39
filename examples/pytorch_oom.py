"""pytorch_oom.py - gpufl example: a list of CUDA tensors that grows until the GPU runs out.

Every step appends a new `--mib` MiB tensor (default 256) to a list that is never emptied (marker
`gpufl-example: grow`) and runs a small matmul, until the caching allocator's cudaMalloc fails and
PyTorch raises torch.cuda.OutOfMemoryError. Nothing catches it: the script dies with the
exception (exit 1), as a training run that keeps its losses with their graphs does. The session's
first finding (`out-of-memory`) names the failing line and the live memory by line: this line.
Fix: do not keep what a step no longer needs (here: the list).

Run:    python examples/pytorch_oom.py [--mib 256]
        gpufl record -o DIR -- python examples/pytorch_oom.py
Prints: "pytorch_oom: step N allocated X MiB reserved Y MiB free Z MiB" every 20 steps, then
        PyTorch's OutOfMemoryError traceback; exit 1.
"""
import argparse

import torch


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--mib", type=int, default=256)
    args = p.parse_args()
    x = torch.randn(1024, 1024, device="cuda")
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
