"""crash_train.py - gpufl example: a PyTorch training loop that ends badly, for crash-safety checks.

A small MLP trained on random data, reading the loss with `.item()` every step, for `--at`
seconds; then it ends as `--end` says: `abort` (os.abort(): SIGABRT), `segv` (a segfault:
ctypes.string_at(0)), `term` (SIGTERM to itself, default action), `kill` (SIGKILL to itself),
`none` (a normal exit). Prints "START <unix ns>" when the loop starts and "END <unix ns>
steps=N" just before the end, so a checker can compare the run with what the session holds.

Run:    python examples/crash_train.py --end abort --at 4
        gpufl record -o DIR -- python examples/crash_train.py --end segv --at 4
"""
import argparse
import ctypes
import os
import signal
import time

import torch


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--end", choices=["abort", "segv", "term", "kill", "none"], default="none")
    ap.add_argument("--at", type=float, default=4.0, help="seconds of training before the end")
    a = ap.parse_args()
    torch.manual_seed(0)
    model = torch.nn.Sequential(*[m for _ in range(4) for m in (torch.nn.Linear(512, 512),
                                                                torch.nn.ReLU())]).cuda()
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    x = torch.randn(256, 512, device="cuda")
    y = torch.randn(256, 512, device="cuda")
    torch.cuda.synchronize()
    print("START", time.time_ns(), flush=True)
    t_end = time.monotonic() + a.at
    steps = 0
    while time.monotonic() < t_end:
        opt.zero_grad(set_to_none=True)
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        loss.item()  # a sync each step
        steps += 1
    print("END", time.time_ns(), f"steps={steps}", flush=True)
    if a.end == "abort":
        os.abort()
    elif a.end == "segv":
        ctypes.string_at(0)
    elif a.end == "term":
        os.kill(os.getpid(), signal.SIGTERM)
    elif a.end == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    time.sleep(1)


if __name__ == "__main__":
    main()
