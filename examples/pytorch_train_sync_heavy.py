"""pytorch_train_sync_heavy.py - example (a) with GPU-heavy steps.

The same training loop as pytorch_train_sync.py (the planted sync stays at its line in
train_step()), with 4096-wide layers and batch 2048: ~25 ms of fp32 matrix products per step on an
H100, so the in-loop torch.cuda.synchronize() blocks the host for most of every step.

Run:    gpufl record -o DIR -- python examples/pytorch_train_sync_heavy.py [--steps 50] [--warmup 5]
Prints: "final loss X.XXXXXX".
"""
import argparse

import pytorch_train_sync as pts

if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=50)
    ap.add_argument("--warmup", type=int, default=5)
    args = ap.parse_args()
    print(f"final loss {pts.main(args.steps, args.warmup, width=4096, batch=2048):.6f}")
