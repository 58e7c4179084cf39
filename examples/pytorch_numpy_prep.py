"""pytorch_numpy_prep.py - gpufl example: NumPy preprocessing on the main thread starves the GPU.

Each of `--steps` steps (default 100) first prepares its batch on the host with NumPy in
`prepare_batch()` — about `--prep-ms` milliseconds (default 5) of jittering, sorting and clipping
a 256 x 1024 array, on the line marked `gpufl-example: host-prep` — then copies it to the
GPU and runs a small training step (3 x Linear(1024, 1024) + ReLU, batch 256, MSE, SGD; well under
a millisecond of GPU work). No synchronization in the loop (the loss is read once at the end), yet
the GPU is busy only a small part of each step: it waits for the host to prepare the next batch.
The amount of NumPy work per step is calibrated once at start to take about `--prep-ms`.
Fix: prepare batches in DataLoader workers (or another thread / process) so that preparation
overlaps the GPU's work, or move the preprocessing to the GPU.

Run:    python examples/pytorch_numpy_prep.py [--steps 100] [--prep-ms 5]
        gpufl record -o DIR -- python examples/pytorch_numpy_prep.py --steps 100
Prints: "pytorch_numpy_prep: steps=N rounds=R final loss X.XXXXXX" (R: NumPy rounds per step, from
the calibration; no timings). Exit 0.
"""
import argparse
import time

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

WIDTH, DEPTH, BATCH, LR, SEED = 1024, 3, 256, 1e-3, 0


def prepare_batch(rng, raw, rounds):
    """Host preprocessing, NumPy only: `rounds` times jitter, sort each row and clip (all of it on
    one line, so that the host's time has one line to go to)."""
    out = raw
    for _ in range(rounds):
        out = np.clip(np.sort(out + rng.standard_normal(out.shape, dtype=np.float32) * 0.01, axis=1), -3.0, 3.0)  # gpufl-example: host-prep
    return out


def calibrate(rng, raw, prep_ms):
    """NumPy rounds per step so that preparing a batch takes about `prep_ms`."""
    prepare_batch(rng, raw, 1)
    t = time.perf_counter()
    prepare_batch(rng, raw, 5)
    one = (time.perf_counter() - t) / 5
    return max(1, round(prep_ms / 1e3 / max(one, 1e-6)))


def main(steps, prep_ms):
    torch.manual_seed(SEED)
    rng = np.random.default_rng(SEED)
    dev = torch.device("cuda")
    layers = []
    for _ in range(DEPTH):
        layers += [nn.Linear(WIDTH, WIDTH), nn.ReLU()]
    model = nn.Sequential(*layers).to(dev)
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    raw = rng.standard_normal((BATCH, WIDTH), dtype=np.float32)
    y = torch.randn(BATCH, WIDTH, device=dev) * 0.1
    rounds = calibrate(rng, raw, prep_ms)
    loss = None
    for _ in range(steps):
        batch = prepare_batch(rng, raw, rounds)
        x = torch.from_numpy(batch).to(dev, non_blocking=True)
        opt.zero_grad(set_to_none=True)
        loss = F.mse_loss(model(x), y)
        loss.backward()
        opt.step()
    return rounds, loss.item()


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--prep-ms", type=float, default=5.0)
    a = ap.parse_args()
    rounds, final = main(a.steps, a.prep_ms)
    print(f"pytorch_numpy_prep: steps={a.steps} rounds={rounds} final loss {final:.6f}")
