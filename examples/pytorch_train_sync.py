"""pytorch_train_sync.py - gpufl example (a): torch.cuda.synchronize() in a training loop.

A small MLP (6 x Linear(1024, 1024) + ReLU, then Linear(1024, 10)), batch 256,
SGD, one fixed batch of random data generated on the GPU, fixed seed.
train_step() ends with torch.cuda.synchronize() (a cudaDeviceSynchronize) on
its own line, marked "gpufl-example: in-loop sync": the planted in-loop sync
that gpufl should attribute to this file, line and function.

Run:    python examples/pytorch_train_sync.py [--steps 50] [--warmup 5]
        gpufl record -o DIR -- python examples/pytorch_train_sync.py --steps 50
Prints: one line "final loss X.XXXXXX" (loss of the last step); exit 0.
        No timings are printed, so stdout is the same with and without a recorder.
Import: main(steps, warmup, after_warmup=None, width, batch) runs build+warmup+steps,
        returns the final loss as a float (bench/torch_profiler_count.py uses it).
"""
import argparse

import torch
import torch.nn as nn
import torch.nn.functional as F

WIDTH, HIDDEN_LAYERS, CLASSES, BATCH, LR, SEED = 1024, 6, 10, 256, 0.01, 0


def build(device="cuda", width=WIDTH, batch=BATCH):
    """Model (weights initialised on CPU from the seed), optimizer, fixed batch."""
    torch.manual_seed(SEED)
    layers = []
    for _ in range(HIDDEN_LAYERS):
        layers += [nn.Linear(width, width), nn.ReLU()]
    layers.append(nn.Linear(width, CLASSES))
    model = nn.Sequential(*layers).to(device)
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    gen = torch.Generator(device=device).manual_seed(SEED)
    x = torch.randn(batch, width, device=device, generator=gen)
    y = torch.randint(0, CLASSES, (batch,), device=device, generator=gen)
    return model, opt, x, y


def train_step(model, opt, x, y, extra_sync=False):
    opt.zero_grad(set_to_none=True)
    loss = F.cross_entropy(model(x), y)
    loss.backward()
    opt.step()
    torch.cuda.synchronize()  # gpufl-example: in-loop sync
    return extra_item(loss) if extra_sync else loss


def main(steps=50, warmup=5, after_warmup=None, width=WIDTH, batch=BATCH, extra_sync=False):
    """Build, run `warmup` then `steps` train steps; return the last loss.

    after_warmup, if given, is called once between warmup and the measured steps
    (the GPU is idle then: every train_step ends with a synchronize)."""
    if steps < 1 or warmup < 0:
        raise ValueError("need steps >= 1 and warmup >= 0")
    model, opt, x, y = build(width=width, batch=batch)
    for _ in range(warmup):
        train_step(model, opt, x, y, extra_sync)
    if after_warmup is not None:
        after_warmup()
    loss = None
    for _ in range(steps):
        loss = train_step(model, opt, x, y, extra_sync)
    return loss.item()


def extra_item(loss):
    """--extra-sync (off by default): one more host read per step, the planted change of the
    `gpufl diff` pair (scripts/gpu-phases/diffpair.sh): a device-to-host copy and a stream sync."""
    loss.item()  # gpufl-example: planted extra sync (--extra-sync)
    return loss


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=50)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--extra-sync", action="store_true",
                    help="read the loss on the host every step (one more sync per step)")
    args = ap.parse_args()
    print(f"final loss {main(args.steps, args.warmup, extra_sync=args.extra_sync):.6f}")
