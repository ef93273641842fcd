"""Regenerates the Flax msgpack file of the unit tests (flax from .venv-pypi):
  .venv-pypi/bin/python tests/data/flax/gen.py
state.msgpack: flax.serialization.to_bytes of {params, opt_state (optax
Adam: count, mu, nu), step} for a Dense layer [8, 4] f32 plus a bf16 and an
f16 array."""
import os

import numpy as np
import optax
from flax import serialization

HERE = os.path.dirname(os.path.abspath(__file__))

if __name__ == "__main__":
    params = {"Dense_0": {"kernel": (np.arange(32, dtype=np.float32).reshape(8, 4) / 7), "bias": np.zeros(4, np.float32)},
              "emb": np.arange(6, dtype=np.float32).astype("bfloat16").reshape(2, 3),
              "half": np.array([1, -2], np.float16)}
    state = {"params": params, "opt_state": optax.adam(1e-3).init(params), "step": 3}
    with open(os.path.join(HERE, "state.msgpack"), "wb") as f:
        f.write(serialization.to_bytes(state))
