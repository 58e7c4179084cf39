"""jax_train.py - gpufl example: a jax.jit training step whose loss is read on the host every step.

A 4-layer MLP (width 1024, batch 512, tanh) trained with plain SGD on random data; the
whole step (forward, grad, update) is one `jax.jit` function. After each step the loop
reads the loss with `float(loss)`: a device-to-host copy plus a wait, every step. XLA
issues its CUDA calls (launches, the copy, the wait) from its own worker threads, which
run no Python; the Python thread that waits is blocked inside `float()`. gpufl should
name the `float(loss)` line (marker `gpufl-example: host read`), "via" the thread
blocked there.

Fix: keep the loss on the device and read it every K steps (or accumulate and read once).

Run:    python examples/jax_train.py [--steps 200] [--warmup 5]
        gpufl record -o DIR -- python examples/jax_train.py --steps 200
Prints: one line "jax_train: steps=N final loss X.XXXXXX" (no timings). Exit 0.
"""
import argparse
import os

# Take GPU memory as it is needed rather than 75 % of the card at start (friendlier to a
# shared machine; changes nothing gpufl looks at).
os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

WIDTH, DEPTH, BATCH, LR = 1024, 4, 512, 1e-2


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


def main(steps, warmup):
    key = jax.random.PRNGKey(0)
    params = init(key)
    kx, ky = jax.random.split(jax.random.PRNGKey(1))
    x = jax.random.normal(kx, (BATCH, WIDTH), jnp.float32)
    y = jax.random.normal(ky, (BATCH, WIDTH), jnp.float32) * 0.1
    loss_value = 0.0
    for _ in range(warmup + steps):
        params, loss = train_step(params, x, y)
        loss_value = float(loss)  # gpufl-example: host read
    return loss_value


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--warmup", type=int, default=5)
    args = ap.parse_args()
    final = main(args.steps, args.warmup)
    print(f"jax_train: steps={args.steps} final loss {final:.6f}")
