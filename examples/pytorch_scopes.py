"""pytorch_scopes.py - gpufl example: named scopes and NVTX ranges, with syncs rolled up per scope.

A small training loop (two Linear(2048, 2048), tanh, MSE, SGD) whose phases are named three ways:
`gpufl.scope("forward")` (context manager), `@gpufl.scope("backward")` (decorator) and
`torch.cuda.nvtx.range("optimizer")` (NVTX, recorded without gpufl code). The whole step is
`gpufl.scope("train_step")`. Inside "forward", `loss.item()` waits for the GPU every step (marked
"gpufl-example: scopes"): the report's scope table must put the syncs and the time blocked in
them under train_step > forward, none under backward or optimizer, and the sync insights must say
"in scope train_step > forward".

    gpufl record -o DIR -- python examples/pytorch_scopes.py --steps 30
    GPUFL_CAPTURE_LIB=.../libgpufl_capture.so python examples/pytorch_scopes.py --in-process
"""

import argparse

import gpufl
import torch

p = argparse.ArgumentParser()
p.add_argument("--steps", type=int, default=30)
p.add_argument("--in-process", action="store_true", help="call gpufl.init() / shutdown() here")
args = p.parse_args()

if args.in_process:
    gpufl.init(app_name="pytorch_scopes", enable_stack_trace=True)

torch.manual_seed(0)
dev = "cuda"
model = torch.nn.Sequential(
    torch.nn.Linear(2048, 2048, bias=False), torch.nn.Tanh(), torch.nn.Linear(2048, 2048, bias=False)
).to(dev)
opt = torch.optim.SGD(model.parameters(), lr=1e-3)
x = torch.randn(4096, 2048, device=dev)
y = torch.randn(4096, 2048, device=dev)


@gpufl.scope("backward")
def backward(loss):
    loss.backward()


losses = []
for step in range(args.steps):
    with gpufl.scope("train_step"):
        with gpufl.scope("forward"):
            out = model(x)
            loss = torch.nn.functional.mse_loss(out, y)
            losses.append(loss.item())  # gpufl-example: scopes
        backward(loss)
        with torch.cuda.nvtx.range("optimizer"):
            opt.step()
            opt.zero_grad(set_to_none=True)

torch.cuda.synchronize()
print(f"final loss {losses[-1]:.6f}")
if args.in_process:
    print(f"session {gpufl.session_dir()}")
    gpufl.shutdown()
