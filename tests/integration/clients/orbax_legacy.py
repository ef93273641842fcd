"""orbax-checkpoint's legacy per-array zarr layout
(PyTreeCheckpointHandler(use_ocdbt=False, use_compression=False)): a tree of
float arrays saved into argv[1] (the mount) and argv[2] (a plain directory),
restored from the mount bit-exact. Ends with a JSON line {"chunks":
[chunk files, relative to argv[1]], "checked": arrays}."""
from __future__ import annotations

import json
import os
import sys

import jax
import numpy as np
import orbax.checkpoint as ocp


def main():
    mnt, ref = (os.path.abspath(p) for p in sys.argv[1:3])
    rng = np.random.default_rng(0)
    tree = {"params": {"dense": {"kernel": rng.normal(0, 0.02, (512, 512)).astype(np.float32),
                                 "bias": rng.normal(0, 0.02, (512,)).astype(np.float32)}},
            "opt_state": {"mu": rng.normal(0, 1e-4, (512, 512)).astype(np.float32)}}
    tree = jax.tree_util.tree_map(jax.numpy.asarray, tree)
    ck = ocp.Checkpointer(ocp.PyTreeCheckpointHandler(use_ocdbt=False, use_compression=False))
    for root in (mnt, ref):
        ck.save(os.path.join(root, "legacy"), args=ocp.args.PyTreeSave(tree))
    got = ck.restore(os.path.join(mnt, "legacy"), args=ocp.args.PyTreeRestore(tree))
    checked = 0
    for g, w in zip(jax.tree_util.tree_leaves(got), jax.tree_util.tree_leaves(tree)):
        g, w = np.asarray(g), np.asarray(w)
        assert g.dtype == w.dtype and g.shape == w.shape and g.tobytes() == w.tobytes()
        checked += 1
    chunks = sorted(os.path.relpath(os.path.join(d, f), mnt) for d, _, fs in os.walk(mnt) for f in fs
                    if os.path.exists(os.path.join(d, ".zarray")) and not f.startswith("."))
    assert not any("ocdbt" in c for c in chunks), chunks
    print(json.dumps({"chunks": chunks, "checked": checked}))


if __name__ == "__main__":
    main()
