"""pytorch_backward.py - gpufl example: a PyTorch loop whose backward pass dominates.

A deep stack of small layers (24 x [Linear(1024, 1024), GELU], batch 256) trained with SGD;
`loss.backward()` (marker `gpufl-example: backward`) launches about two thirds of the
kernels and GPU time. PyTorch runs the backward pass on its autograd engine's C++ device
thread, which runs no Python: its launches carry no Python frame of their own. gpufl
should attribute them to the `loss.backward()` line, inferred via the thread blocked in
it. The loss is read with `.item()` every step (marker `gpufl-example: item`): the
in-loop sync. With 48 small layers each step is launch-heavy, so the GPU also idles
between kernels while the host launches.

Run:    python examples/pytorch_backward.py [--steps 40] [--warmup 5]
        gpufl record -o DIR -- python examples/pytorch_backward.py --steps 40
Prints: one line "pytorch_backward: steps=N final loss X.XXXXXX" (no timings). Exit 0.
"""
import argparse

import torch
import torch.nn as nn

WIDTH, DEPTH, BATCH, LR, SEED = 1024, 24, 256, 1e-3, 0


def build():
    torch.manual_seed(SEED)
    layers = []
    for _ in range(DEPTH):
        layers += [nn.Linear(WIDTH, WIDTH), nn.GELU()]
    model = nn.Sequential(*layers).to("cuda")
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    x = torch.randn(BATCH, WIDTH, device="cuda")
    target = torch.randn(BATCH, WIDTH, device="cuda").mul_(0.1)
    return model, opt, x, target


def main(steps, warmup):
    model, opt, x, target = build()
    loss_value = 0.0
    for _ in range(warmup + steps):
        opt.zero_grad(set_to_none=True)
        loss = (model(x) - target).square().mean()
        loss.backward()  # gpufl-example: backward
        opt.step()
        loss_value = loss.item()  # gpufl-example: item
    return loss_value


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--warmup", type=int, default=5)
    args = ap.parse_args()
    final = main(args.steps, args.warmup)
    print(f"pytorch_backward: steps={args.steps} final loss {final:.6f}")
