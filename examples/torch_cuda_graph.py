"""torch_cuda_graph.py - gpufl example: a training step captured with torch.cuda.graph, replayed.

A small MLP (3 x Linear(WIDTH, WIDTH) + ReLU, then Linear(WIDTH, 10)), MSE against a fixed random
linear teacher, SGD. After a few warmup steps on a side stream (as torch.cuda.graphs requires),
one whole training step (forward, backward, optimizer step) is captured into a
torch.cuda.CUDAGraph with `torch.cuda.graph(...)` in capture(); then each of --steps steps copies
a batch into the graph's static input tensors and replays the graph (line marked
`graph-replay`), then reads the loss with `.item()` on a line of its own (marked
`sync-after-replay`: a 4-byte copy and a stream sync after every replay).

What a user should see: the graph's kernels (~20 a replay: GEMMs, elementwise, the optimizer's)
at the `graph.replay()` line of replay_step(), one replay per step, and the sync after each
replay at the `.item()` line; the warmup's direct launches at their own lines.

Run:    python examples/torch_cuda_graph.py [--steps 200] [--warmup 3]
        gpufl record -o DIR -- python examples/torch_cuda_graph.py --steps 200
Bench:  --mode NAME adds one JSON line {"mode", "steps", "wall_s", "wall_ms_all": [ms]} with the
        wall time of the replay loop (bench/summarize.py reads it); --profiler runs the replay
        loop inside torch.profiler.profile(CPU, CUDA), as a user would.
Prints: "torch_cuda_graph: steps=N first_loss=A final_loss=B OK" (FAIL and exit 1 when the loss
        is not finite or did not go down).
"""
import argparse
import json
import math
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

WIDTH, BATCH, POOL, LR, SEED = 512, 128, 16, 0.05, 0


def build(width=WIDTH, batch=BATCH):
    """Model, optimizer and a pool of POOL batches (inputs and the teacher's targets) on the GPU."""
    torch.manual_seed(SEED)
    model = nn.Sequential(
        nn.Linear(width, width), nn.ReLU(),
        nn.Linear(width, width), nn.ReLU(),
        nn.Linear(width, width), nn.ReLU(),
        nn.Linear(width, 10),
    ).cuda()
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    teacher = torch.randn(width, 10, device="cuda") / math.sqrt(width)
    xs = torch.randn(POOL, batch, width, device="cuda")
    ys = xs @ teacher
    return model, opt, xs, ys


def train_step(model, opt, x, y):
    opt.zero_grad(set_to_none=True)
    loss = F.mse_loss(model(x), y)
    loss.backward()
    opt.step()
    return loss


def capture(model, opt, static_x, static_y, warmup):
    """Warm up on a side stream, then capture one training step. Returns the graph and the
    static loss tensor its replays write."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(warmup):
            train_step(model, opt, static_x, static_y)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    opt.zero_grad(set_to_none=True)
    with torch.cuda.graph(graph):
        static_loss = F.mse_loss(model(static_x), static_y)
        static_loss.backward()
        opt.step()
    return graph, static_loss


def replay_step(graph, static_x, static_y, static_loss, x, y):
    static_x.copy_(x)
    static_y.copy_(y)
    graph.replay()  # gpufl-example: graph-replay
    return static_loss.item()  # gpufl-example: sync-after-replay


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--mode", default=None, help="bench: print a JSON line with this mode name")
    ap.add_argument("--profiler", action="store_true", help="replay loop inside torch.profiler")
    a = ap.parse_args()
    model, opt, xs, ys = build()
    static_x, static_y = xs[0].clone(), ys[0].clone()
    graph, static_loss = capture(model, opt, static_x, static_y, max(a.warmup, 1))
    losses = []

    def loop():
        for i in range(a.steps):
            losses.append(replay_step(graph, static_x, static_y, static_loss,
                                      xs[i % POOL], ys[i % POOL]))

    torch.cuda.synchronize()
    t0 = time.perf_counter()
    if a.profiler:
        from torch.profiler import ProfilerActivity, profile
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]):
            loop()
    else:
        loop()
    wall = time.perf_counter() - t0
    if a.mode is not None:
        print(json.dumps({"mode": a.mode, "steps": a.steps, "wall_s": round(wall, 6),
                          "wall_ms_all": [round(wall * 1e3, 3)]}), flush=True)
    ok = all(math.isfinite(v) for v in losses) and (len(losses) < 20 or losses[-1] < losses[0])
    print(f"torch_cuda_graph: steps={a.steps} first_loss={losses[0]:.6f} "
          f"final_loss={losses[-1]:.6f} {'OK' if ok else 'FAIL'}")
    raise SystemExit(0 if ok else 1)


if __name__ == "__main__":
    main()
