"""An optax Adam training loop on a Flax MLP, saved by orbax-checkpoint's
CheckpointManager into argv[2] (the mount) and the same states into argv[3]
(a plain directory), one step per save.

  orbax_series.py save MNT REF [--steps N] [--width W] [--lr LR] [--compress]
      After each save it prints "saved N" and waits for a line on stdin, so
      the test can let the seals finish first. Ends with a JSON line
      {"saved": [steps], "data_files": [paths of the OCDBT data files]}.
      Without --compress the arrays are written uncompressed
      (PyTreeCheckpointHandler(use_compression=False)), the setting
      docs/FORMAT.md recommends; with it, Orbax's default zstd.
  orbax_series.py restore MNT REF [--width W] [--lr LR] [--lossy TOL]
      Restores every step from both and compares them: bit-exact, or the
      parameters within TOL in relative L2. Then trains 5 more steps from
      the mount's last state. Prints {"checked": arrays, "max_rel_err": e,
      "loss_before": l0, "loss_after": l1}."""
from __future__ import annotations

import argparse
import json
import os
import sys

import jax
import jax.numpy as jnp
import numpy as np
import optax
import orbax.checkpoint as ocp
from flax import linen as nn


class MLP(nn.Module):
    width: int

    @nn.compact
    def __call__(self, x):
        x = nn.relu(nn.Dense(self.width)(x))
        x = nn.relu(nn.Dense(self.width)(x))
        return nn.Dense(10)(x)


def problem(width, lr=1e-3):
    key = jax.random.PRNGKey(0)
    x = jax.random.normal(key, (256, 128))
    y = jnp.argmax(x[:, :10], axis=1)
    model = MLP(width)
    params = model.init(key, x)
    tx = optax.adam(lr)

    def loss_fn(p):
        return optax.softmax_cross_entropy_with_integer_labels(model.apply(p, x), y).mean()

    @jax.jit
    def step(p, o):
        loss, g = jax.value_and_grad(loss_fn)(p)
        u, o = tx.update(g, o, p)
        return optax.apply_updates(p, u), o, loss

    return params, tx.init(params), step, jax.jit(loss_fn)


def manager(root, compress):
    return ocp.CheckpointManager(os.path.abspath(root),
                                 item_handlers=ocp.PyTreeCheckpointHandler(use_compression=compress),
                                 options=ocp.CheckpointManagerOptions(max_to_keep=None))


def save(a):
    params, opt, step, _ = problem(a.width, a.lr)
    mgrs = [manager(a.mnt, a.compress), manager(a.ref, a.compress)]
    saved = []
    for n in range(1, a.steps + 1):
        for _ in range(3):
            params, opt, _ = step(params, opt)
        for m in mgrs:
            m.save(n, args=ocp.args.PyTreeSave({"params": params, "opt_state": opt}))
            m.wait_until_finished()
        saved.append(n)
        print("saved", n, flush=True)
        sys.stdin.readline()
    data = sorted(os.path.relpath(os.path.join(d, f), a.mnt) for d, _, fs in os.walk(a.mnt) for f in fs
                  if os.path.basename(d) == "d" and "ocdbt.process_" in d)
    print(json.dumps({"saved": saved, "data_files": data}))


def restore(a):
    """Parameters within TOL in relative L2 (moments have looser targets,
    docs/SEMANTICS.md: they are only checked finite), the rest bit-exact."""
    params, opt, step, loss_fn = problem(a.width, a.lr)
    target = {"params": params, "opt_state": opt}
    mnt, ref = manager(a.mnt, False), manager(a.ref, False)
    checked, worst, got = 0, 0.0, None
    for n in ref.all_steps():
        got = mnt.restore(n, args=ocp.args.PyTreeRestore(target))
        want = ref.restore(n, args=ocp.args.PyTreeRestore(target))
        for part in ("params", "opt_state"):
            for g, w in zip(jax.tree_util.tree_leaves(got[part]), jax.tree_util.tree_leaves(want[part])):
                g, w = np.asarray(g), np.asarray(w)
                assert g.shape == w.shape and g.dtype == w.dtype, (g.shape, w.shape, g.dtype, w.dtype)
                checked += 1
                if a.lossy is None or not np.issubdtype(w.dtype, np.floating):
                    assert g.tobytes() == w.tobytes(), f"step {n}: an array of {part} differs"
                elif part == "params":
                    norm = float(np.linalg.norm(w.astype(np.float64))) or 1.0
                    worst = max(worst, float(np.linalg.norm(g.astype(np.float64) - w)) / norm)
                else:
                    assert np.all(np.isfinite(g)), f"step {n}: a moment is not finite"
    p, o = got["params"], got["opt_state"]
    before = float(loss_fn(p))
    for _ in range(5):
        p, o, _ = step(p, o)
    after = float(loss_fn(p))
    assert np.isfinite(after) and after < before, (before, after)
    if a.lossy is not None:
        assert worst <= a.lossy, worst
    print(json.dumps({"checked": checked, "max_rel_err": worst, "loss_before": before, "loss_after": after}))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("mode", choices=["save", "restore"])
    ap.add_argument("mnt")
    ap.add_argument("ref")
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--width", type=int, default=512)
    ap.add_argument("--compress", action="store_true")
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--lossy", type=float)
    a = ap.parse_args()
    save(a) if a.mode == "save" else restore(a)


if __name__ == "__main__":
    main()
