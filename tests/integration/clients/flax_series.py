"""Writes flax.serialization.to_bytes of a weight [1024, 1024] and its Adam
moments (mu, nu), changed a little per step, plus a frozen embedding, as argv[1]/step_N/state.msgpack
and a copy in argv[2]/step_N.msgpack. After each save it prints "saved NAME"
and waits for a line on stdin, so the test can let the seals finish first.
Ends with a JSON line {"saved": [...]}."""
from __future__ import annotations

import json
import os
import sys

import numpy as np
from flax import serialization

STEPS = 3


def main():
    mnt, ref = sys.argv[1], sys.argv[2]
    rng = np.random.default_rng(0)
    w = rng.normal(0, 0.02, (1024, 1024)).astype(np.float32)
    frozen = rng.normal(0, 0.02, (1024, 256)).astype(np.float32)
    mu = np.zeros_like(w)
    nu = np.zeros_like(w)
    saved = []
    for step in range(1, STEPS + 1):
        g = rng.normal(0, 1e-3, w.shape).astype(np.float32)
        mu = 0.9 * mu + 0.1 * g
        nu = 0.999 * nu + 0.001 * g * g
        w = (w - 1e-4 * mu / (np.sqrt(nu) + 1e-8)).astype(np.float32)
        blob = serialization.to_bytes({"params": {"emb": frozen, "w": w}, "opt_state": {"mu": {"w": mu}, "nu": {"w": nu}},
                                       "step": step})
        os.makedirs(os.path.join(mnt, f"step_{step}"))
        with open(os.path.join(mnt, f"step_{step}", "state.msgpack"), "wb") as f:
            f.write(blob)
        with open(os.path.join(ref, f"step_{step}.msgpack"), "wb") as f:
            f.write(blob)
        saved.append(f"step_{step}/state.msgpack")
        print("saved", saved[-1], flush=True)
        sys.stdin.readline()
    print(json.dumps({"saved": saved}))


if __name__ == "__main__":
    main()
