"""Flax client (flax, jax, optax from PyPI): flax.serialization.to_bytes of
a Flax MLP's params and its optax Adam state after a few steps, written
into the mount; from_bytes of the file restores every array bit-exact.
See common.py for the protocol."""
from __future__ import annotations

import os
import sys

os.environ.setdefault("JAX_PLATFORMS", "cpu")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import Client, check  # noqa: E402

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import optax  # noqa: E402
from flax import linen as nn  # noqa: E402
from flax import serialization  # noqa: E402


class MLP(nn.Module):
    @nn.compact
    def __call__(self, x):
        x = nn.relu(nn.Dense(256)(x))
        x = nn.LayerNorm()(x)
        return nn.Dense(10, param_dtype=jnp.bfloat16)(x)


def state():
    model = MLP()
    x = jax.random.normal(jax.random.PRNGKey(1), (16, 128))
    params = model.init(jax.random.PRNGKey(0), x)["params"]
    opt = optax.adam(1e-3)
    opt_state = opt.init(params)
    loss = lambda p: jnp.mean(jnp.square(model.apply({"params": p}, x).astype(jnp.float32)))  # noqa: E731
    for _ in range(3):
        grads = jax.grad(loss)(params)
        updates, opt_state = opt.update(grads, opt_state, params)
        params = optax.apply_updates(params, updates)
    return {"params": params, "opt_state": opt_state, "step": 3}


def leaves(tree):
    return [np.asarray(a) for a in jax.tree_util.tree_leaves(tree)]


def main():
    c = Client()
    s = state()
    blob = serialization.to_bytes(s)
    arrays = leaves(s)
    for root in (c.mnt, c.ref):
        os.makedirs(root / "flax", exist_ok=True)
        (root / "flax" / "state.msgpack").write_bytes(blob)
    check(sum(1 for a in arrays if a.ndim > 0) > 10, "too few arrays")
    # every leaf is an ndarray ext (the int `step` is a plain msgpack int)
    tensor_bytes = sum(a.nbytes for a in arrays if isinstance(a, np.ndarray) and a.dtype != object) - 8
    c.record("flax/state.msgpack", ref=True, tensor_bytes=tensor_bytes)

    def load(when):
        got = serialization.from_bytes(s, (c.mnt / "flax" / "state.msgpack").read_bytes())
        g = leaves(got)
        check(len(g) == len(arrays), f"{when}: {len(g)} leaves, saved {len(arrays)}")
        for i, (a, b) in enumerate(zip(arrays, g)):
            check(a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes(), f"{when}: leaf {i} differs")
            c.checks += 1

    c.run(load)


if __name__ == "__main__":
    main()
