"""ddp_straggler.py - gpufl example: a DDP job over NCCL with one late rank (a straggler).

A small MLP (6 x Linear(2048, 2048) + ReLU, then Linear(2048, 10)), batch 256, SGD, one fixed
batch per rank, in DistributedDataParallel (NCCL). Each step: forward, backward (DDP all-reduces
the gradients with NCCL), optimizer step, loss.item(). Rank --straggler (default 1) is late:
--mode host (default): with --straggle-ms MS it first spends MS ms of host work in busy_host_work()
(a busy loop, no CUDA call, line "gpufl-example: host-work") called on "gpufl-example: straggler"; 0 is the
balanced twin. --mode gpu: after each step it runs --extra-matmuls N (default 16) chained
2048 x 2048 matmuls launched in extra_gpu_work() (line marked "gpufl-example: extra-gpu-work"),
so its next all-reduce starts that much later. The other rank waits for it in the all-reduce.

Run:    torchrun --nproc_per_node=2 examples/ddp_straggler.py [--steps 50] [--warmup 5]
             [--mode host|gpu] [--straggle-ms 4] [--extra-matmuls 16] [--straggler 1]
        gpufl record -o DIR -- torchrun --nproc_per_node=2 examples/ddp_straggler.py --straggle-ms 4
Prints: rank 0 prints "final loss X.XXXXXX" and "straggler RANK MS ms" (gpu mode: "straggler
        RANK N extra matmuls"); exit 0.
Should: `gpufl report DIR/run-*` raise collective-wait naming the straggler rank, ~MS ms late per
        step, and where its time goes (host mode: the host work before `out = model(x)`; gpu mode:
        the extra work's launch line and kernels); no NCCL kernel under-filled; none with 0 ms.
"""
import argparse
import os
import time

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

WIDTH, HIDDEN_LAYERS, CLASSES, BATCH, LR, SEED = 2048, 6, 10, 256, 0.01, 0


def busy_host_work(ms):
    """Host work that makes no CUDA call: a busy loop of `ms` milliseconds."""
    end = time.perf_counter() + ms / 1e3
    n = 0
    while time.perf_counter() < end:  # gpufl-example: host-work
        n += 1
    return n


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=50)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--straggle-ms", type=float, default=4.0)
    add_straggler_args(ap)
    args = ap.parse_args()

    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    torch.cuda.set_device(local_rank)
    dev = torch.device("cuda", local_rank)
    dist.init_process_group("nccl", device_id=dev)
    rank = dist.get_rank()

    torch.manual_seed(SEED)
    layers = []
    for _ in range(HIDDEN_LAYERS):
        layers += [nn.Linear(WIDTH, WIDTH), nn.ReLU()]
    layers.append(nn.Linear(WIDTH, CLASSES))
    model = DDP(nn.Sequential(*layers).to(dev), device_ids=[local_rank])
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    gen = torch.Generator(device=dev).manual_seed(SEED + rank)
    x = torch.randn(BATCH, WIDTH, device=dev, generator=gen)
    y = torch.randint(0, CLASSES, (BATCH,), device=dev, generator=gen)
    late = rank == args.straggler and args.mode == "host" and args.straggle_ms > 0

    for step in range(args.warmup + args.steps):
        if late:
            busy_host_work(args.straggle_ms)  # gpufl-example: straggler
        opt.zero_grad(set_to_none=True)
        out = model(x)
        loss = F.cross_entropy(out, y)
        loss.backward()
        opt.step()
        loss_value = loss.item()
        if rank == args.straggler and args.mode == "gpu" and args.extra_matmuls > 0:
            extra_gpu_work(args.extra_matmuls, dev)
    if rank == 0:
        print(f"final loss {loss_value:.6f}")
        if args.mode == "gpu":
            print(f"straggler {args.straggler} {args.extra_matmuls} extra matmuls")
        else:
            print(f"straggler {args.straggler if args.straggle_ms > 0 else 'none'} {args.straggle_ms:g} ms")
    dist.barrier()
    dist.destroy_process_group()


def add_straggler_args(ap):
    """Who is late and how (after main(), which keeps the line numbers of earlier recordings)."""
    ap.add_argument("--straggler", type=int, default=1)
    ap.add_argument("--mode", choices=("host", "gpu"), default="host")
    ap.add_argument("--extra-matmuls", type=int, default=16)


_EXTRA = {}


def extra_gpu_work(n, dev):
    """GPU work the other ranks do not do: `n` chained matmuls, launched without waiting."""
    a = _EXTRA.get(dev)
    if a is None:
        a = torch.randn(WIDTH, WIDTH, device=dev) / WIDTH ** 0.5
    for _ in range(n):
        a = torch.tanh(a @ a)  # gpufl-example: extra-gpu-work
    _EXTRA[dev] = a


if __name__ == "__main__":
    main()
