"""Regenerates the Orbax checkpoints of the unit tests (jax, optax and
orbax-checkpoint from .venv-pypi):
  .venv-pypi/bin/python tests/data/orbax/gen.py
raw/ and zstd/: one CheckpointManager step (an optax Adam state after one
update of a Dense [4, 8] + [8, 2] MLP) saved by PyTreeCheckpointHandler with
use_compression=False (raw/) and with Orbax's default zstd (zstd/). Only the
OCDBT database of the item (manifest.ocdbt, d/) is kept: the JSON files
beside it are not read by ckptfs."""
import os
import shutil
import tempfile

import jax
import jax.numpy as jnp
import numpy as np
import optax
import orbax.checkpoint as ocp

HERE = os.path.dirname(os.path.abspath(__file__))


def state():
    params = {"Dense_0": {"kernel": jnp.asarray(np.arange(512, dtype=np.float32).reshape(16, 32) / 7),
                          "bias": jnp.zeros(32, jnp.float32)},
              "Dense_1": {"kernel": jnp.asarray(np.linspace(-1, 1, 128, dtype=np.float32).reshape(32, 4)),
                          "bias": jnp.ones(4, jnp.float32)}}
    tx = optax.adam(1e-2)
    opt = tx.init(params)
    grads = jax.tree_util.tree_map(lambda p: p * 0.5 + 0.25, params)
    updates, opt = tx.update(grads, opt, params)
    return {"params": optax.apply_updates(params, updates), "opt_state": opt}


def save(name, compress):
    tmp = tempfile.mkdtemp()
    try:
        mgr = ocp.CheckpointManager(tmp, item_handlers=ocp.PyTreeCheckpointHandler(use_compression=compress))
        mgr.save(1, args=ocp.args.PyTreeSave(state()))
        mgr.wait_until_finished()
        db = os.path.join(tmp, "1", "default", "ocdbt.process_0")
        out = os.path.join(HERE, name)
        shutil.rmtree(out, ignore_errors=True)
        shutil.copytree(db, out)
    finally:
        shutil.rmtree(tmp)


if __name__ == "__main__":
    save("raw", False)
    save("zstd", True)
