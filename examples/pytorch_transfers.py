"""pytorch_transfers.py - gpufl example: a host<->device transfer pitfall in a PyTorch loop.

A small model step per training step: two bias-free Linear(2048, 2048) layers
with a tanh between them on a 2048 x 2048 batch, mean-squared loss, backward,
SGD (a few 2048 x 2048 matmuls). --pattern plants one of three pitfalls, on a
line marked with a gpufl-example comment naming the pattern:
  item:     loss.item() every step: a device-to-host copy of 4 bytes plus a
            stream sync; the host waits for the whole step each step.
  cpu:      y.cpu() of the 16 MiB output every step: a blocking device-to-host
            copy into pageable memory.
  pageable: the batch comes from a NON-pinned CPU tensor (16 MiB) every step via
            .to("cuda", non_blocking=True): from pageable memory the copy is
            staged by the driver and is not asynchronous at all.
Fixes: keep the loss on the GPU and read it every K steps; copy to a pinned
buffer with non_blocking=True and sync only where it is read; pin the host
batch (pin_memory()) once.

Run:    python examples/pytorch_transfers.py --pattern item|cpu|pageable [--steps 30]
        gpufl record -o DIR -- python examples/pytorch_transfers.py --pattern item --steps 30
Prints: one line "pytorch_transfers: pattern=P steps=N final loss X.XXXXXX checksum Y.YYYY"
        (checksum: of the host copies for --pattern cpu, else 0.0000); no timings, so
        stdout is the same with and without a recorder. Exit 0.
"""
import argparse

import torch
import torch.nn as nn

SIZE, LR, SEED = 2048, 0.05, 0


def build():
    """Model (weights initialised on the CPU from the seed), optimizer, host batch."""
    torch.manual_seed(SEED)
    model = nn.Sequential(
        nn.Linear(SIZE, SIZE, bias=False), nn.Tanh(), nn.Linear(SIZE, SIZE, bias=False)
    ).to("cuda")
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    x_host = torch.randn(SIZE, SIZE)  # 16 MiB, pageable (not pinned)
    target = torch.randn(SIZE, SIZE).mul_(0.1).to("cuda")
    return model, opt, x_host, target


def train_step(model, opt, x, target):
    opt.zero_grad(set_to_none=True)
    y = model(x)
    loss = (y - target).square().mean()
    loss.backward()
    opt.step()
    return y.detach(), loss.detach()


def main(pattern, steps):
    if steps < 1:
        raise ValueError("need steps >= 1")
    model, opt, x_host, target = build()
    x_gpu = x_host.to("cuda")  # uploaded once (item, cpu)
    loss = None
    loss_value = 0.0
    checksum = 0.0
    for _ in range(steps):
        if pattern == "pageable":
            x_gpu = x_host.to("cuda", non_blocking=True)  # gpufl-example: pageable
        y, loss = train_step(model, opt, x_gpu, target)
        if pattern == "item":
            loss_value = loss.item()  # gpufl-example: item
        elif pattern == "cpu":
            out_host = y.cpu()  # gpufl-example: cpu
            checksum += float(out_host[0, :16].sum())
    if pattern != "item":
        loss_value = float(loss)  # one read after the loop
    return loss_value, checksum


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pattern", choices=["item", "cpu", "pageable"], required=True)
    ap.add_argument("--steps", type=int, default=30)
    args = ap.parse_args()
    final, checksum = main(args.pattern, args.steps)
    print(f"pytorch_transfers: pattern={args.pattern} steps={args.steps} "
          f"final loss {final:.6f} checksum {checksum:.4f}")
