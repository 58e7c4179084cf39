"""torch_compile_graphs.py - gpufl example: torch.compile(mode="reduce-overhead") inference.

A small block (Linear(WIDTH, 4*WIDTH), GELU, Linear(4*WIDTH, WIDTH), residual, LayerNorm; twice,
then Linear(WIDTH, 10)) compiled with `torch.compile(model, mode="reduce-overhead")`: Inductor
generates Triton kernels for the fused elementwise / normalization work (names like
`triton_poi_fused_...`, `triton_per_fused_...`) and, in this mode, records the compiled graph into
a CUDA graph (cudagraph trees) that later calls replay. --warmup calls (default 3) compile and
record; then each of --steps timed steps runs the compiled model on the next batch of a pool and
reads a scalar with `.item()` on a line of its own (marked `sync-per-step`).

What a user should see: compilation (CPU time, no GPU work) in the first calls at the
`compiled(x)` line; then the Triton and GEMM kernels as graph kernels at the graph launch made
inside the `compiled(x)` call of infer_step() (marked `compiled-call`), one replay
per step, and a sync per step at the `.item()` line.

With --reshape-at K, the timed steps from step K on run on batches of half the rows (the first
rows of each pooled batch): a new input shape fails Dynamo's guards, so `compiled(x)` compiles
again in the middle of the timed loop (a recompilation, which the `torch-compile` rule reports at
the `compiled-call` line), then replays its own CUDA graph.

Run:    python examples/torch_compile_graphs.py [--steps 100] [--warmup 3] [--reshape-at K]
        gpufl record -o DIR -- python examples/torch_compile_graphs.py --steps 100
Prints: "torch_compile_graphs: steps=N warmup=W max_abs_diff=D checksum=C OK" (the compiled
        model's output on one batch against eager; FAIL and exit 1 when they differ by more than
        1e-3 or a result is not finite). With --mode NAME also one JSON line
        {"mode", "steps", "wall_s", "wall_ms_all": [ms]} for the timed steps.
"""
import argparse
import json
import math
import time

import torch
import torch.nn as nn

WIDTH, BATCH, POOL, SEED = 256, 64, 8, 0


class Block(nn.Module):
    def __init__(self, width):
        super().__init__()
        self.up = nn.Linear(width, 4 * width)
        self.down = nn.Linear(4 * width, width)
        self.norm = nn.LayerNorm(width)

    def forward(self, x):
        return self.norm(x + self.down(nn.functional.gelu(self.up(x))))


def build(width=WIDTH, batch=BATCH):
    torch.manual_seed(SEED)
    model = nn.Sequential(Block(width), Block(width), nn.Linear(width, 10)).cuda().eval()
    xs = torch.randn(POOL, batch, width, device="cuda")
    return model, xs


def infer_step(compiled, x):
    mark = getattr(torch.compiler, "cudagraph_mark_step_begin", None)
    if mark is not None:
        mark()  # a new step: the previous step's outputs may be overwritten
    out = compiled(x)  # gpufl-example: compiled-call
    return out.float().square().mean().item()  # gpufl-example: sync-per-step


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--mode", default=None, help="bench: print a JSON line with this mode name")
    ap.add_argument("--reshape-at", type=int, default=-1,
                    help="from this timed step on, batches of half the rows (a recompilation)")
    a = ap.parse_args()
    model, xs = build()
    compiled = torch.compile(model, mode="reduce-overhead")
    with torch.no_grad():
        for i in range(max(a.warmup, 1)):
            infer_step(compiled, xs[i % POOL])
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        total = 0.0
        half = xs.shape[1] // 2
        for i in range(a.steps):
            x = xs[i % POOL]
            if 0 <= a.reshape_at <= i:
                x = x[:half]
            total += infer_step(compiled, x)
        wall = time.perf_counter() - t0
        # Check: the compiled model against eager on one batch.
        mark = getattr(torch.compiler, "cudagraph_mark_step_begin", None)
        if mark is not None:
            mark()
        got = compiled(xs[1]).clone()
        want = model(xs[1])
        diff = (got - want).abs().max().item()
    if a.mode is not None:
        print(json.dumps({"mode": a.mode, "steps": a.steps, "wall_s": round(wall, 6),
                          "wall_ms_all": [round(wall * 1e3, 3)]}), flush=True)
    ok = math.isfinite(total) and diff <= 1e-3
    print(f"torch_compile_graphs: steps={a.steps} warmup={a.warmup} max_abs_diff={diff:.2e} "
          f"checksum={total:.6f} {'OK' if ok else 'FAIL'}")
    raise SystemExit(0 if ok else 1)


if __name__ == "__main__":
    main()
