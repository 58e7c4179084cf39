"""jax_recompile.py - gpufl example: a jax.jit step recompiled whenever the batch shape changes.

A 3-layer MLP (width 1024, tanh) trained with plain SGD; the whole step (forward, grad, update)
is one `jax.jit` function. The batch size changes every `--every` steps (default 10) to a size
not seen before (256, 288, 320, …), so each change makes XLA trace and compile the step again,
on the Python thread, inside the call marked `gpufl-example: recompile`: the GPU idles for the
whole compilation (hundreds of ms), far longer than a step. The loss is read on the host at the
end of each shape's steps only.
Fix: keep shapes static (pad batches to a few fixed sizes, or drop the last partial batch), or
mark the varying dimension for `jax.jit` with bucketing.

Run:    python examples/jax_recompile.py [--steps 60] [--every 10]
        gpufl record -o DIR -- python examples/jax_recompile.py --steps 60
Prints: "jax_recompile: steps=N shapes=S final loss X.XXXXXX" (no timings). Exit 0.
"""
import argparse
import os

# Take GPU memory as it is needed rather than 75 % of the card at start.
os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

WIDTH, DEPTH, BASE_BATCH, LR = 1024, 3, 256, 1e-2


def init(key):
    params = []
    for _ in range(DEPTH):
        key, k = jax.random.split(key)
        params.append(jax.random.normal(k, (WIDTH, WIDTH), jnp.float32) / jnp.sqrt(WIDTH))
    return params


def loss_fn(params, x, y):
    h = x
    for w in params:
        h = jnp.tanh(h @ w)
    return jnp.mean((h - y) ** 2)


@jax.jit
def train_step(params, x, y):
    loss, grads = jax.value_and_grad(loss_fn)(params, x, y)
    params = [w - LR * g for w, g in zip(params, grads)]
    return params, loss


def main(steps, every):
    params = init(jax.random.PRNGKey(0))
    key = jax.random.PRNGKey(1)
    loss_value, shapes = 0.0, 0
    for step in range(steps):
        if step % every == 0:
            batch = BASE_BATCH + 32 * shapes  # a new shape: the next call compiles
            shapes += 1
            key, kx, ky = jax.random.split(key, 3)
            x = jax.random.normal(kx, (batch, WIDTH), jnp.float32)
            y = jax.random.normal(ky, (batch, WIDTH), jnp.float32) * 0.1
        params, loss = train_step(params, x, y)  # gpufl-example: recompile
        if (step + 1) % every == 0 or step + 1 == steps:
            loss_value = float(loss)
    return shapes, loss_value


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--every", type=int, default=10)
    a = ap.parse_args()
    shapes, final = main(a.steps, max(1, a.every))
    print(f"jax_recompile: steps={a.steps} shapes={shapes} final loss {final:.6f}")
