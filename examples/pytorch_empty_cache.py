"""pytorch_empty_cache.py - gpufl example: torch.cuda.empty_cache() every step.

An MLP training step (4 x Linear(4096, 4096) + ReLU, batch 2048, MSE, SGD; ~15 ms of GPU work on
an H100, so the queue is deep when the step ends) on one fixed
batch, `--steps` steps (default 100), then `torch.cuda.empty_cache()` at the end of every step
(marker `gpufl-example: blocking-call`). empty_cache hands the caching allocator's free blocks
back to CUDA with cudaFree, which waits for the device to finish the step's work first; the next
step then gets its activations back from cudaMalloc. The GPU idles while the host is inside the
allocator, and the step's only synchronization is inside empty_cache: no `.item()` or
`synchronize()` in the loop (the loss is read once at the end).
Fix: do not call empty_cache in the training loop (PyTorch's allocator reuses its cached blocks;
call it, if at all, between phases).

Run:    python examples/pytorch_empty_cache.py [--steps 100]
        gpufl record -o DIR -- python examples/pytorch_empty_cache.py --steps 100
Prints: "pytorch_empty_cache: steps=N final loss X.XXXXXX" (no timings). Exit 0.
"""
import argparse

import torch
import torch.nn as nn
import torch.nn.functional as F

# Activations of 32 MiB: each one is a segment of its own in PyTorch's allocator, which
# empty_cache releases (cudaFree) at every step.
WIDTH, DEPTH, BATCH, LR, SEED = 4096, 4, 2048, 1e-3, 0


def main(steps):
    torch.manual_seed(SEED)
    dev = torch.device("cuda")
    layers = []
    for _ in range(DEPTH):
        layers += [nn.Linear(WIDTH, WIDTH), nn.ReLU()]
    model = nn.Sequential(*layers).to(dev)
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    x = torch.randn(BATCH, WIDTH, device=dev)
    y = torch.randn(BATCH, WIDTH, device=dev) * 0.1
    loss = None
    for _ in range(steps):
        opt.zero_grad(set_to_none=True)
        loss = F.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        torch.cuda.empty_cache()  # gpufl-example: blocking-call
    return loss.item()


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=100)
    a = ap.parse_args()
    final = main(a.steps)
    print(f"pytorch_empty_cache: steps={a.steps} final loss {final:.6f}")
