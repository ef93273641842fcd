"""Writes a series of tf.train.Checkpoint saves (a 1024x1024 f32 weight
with Adam-like slots, changed a little per step) into argv[1] and copies
each bundle into argv[2] as written, for a bit-exact comparison after the
mount's seals. After each save it prints "saved NAME" and waits for a line
on stdin, so the test can let the seals finish first. With `restore`, restores every bundle in argv[1] and checks
it equals the copy in argv[2]. Prints one JSON line."""
from __future__ import annotations

import json
import os
import shutil
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

STEPS = 3


def make_vars():
    return {"w": tf.Variable(tf.zeros((1024, 1024))), "m": tf.Variable(tf.zeros((1024, 1024))),
            "b": tf.Variable(tf.zeros((1024,))), "step": tf.Variable(0, dtype=tf.int64)}


def save(mnt, ref):
    rng = np.random.default_rng(0)
    w = rng.normal(0, 0.02, (1024, 1024)).astype(np.float32)
    m = np.zeros_like(w)
    v = make_vars()
    ckpt = tf.train.Checkpoint(**v)
    saved = []
    for step in range(1, STEPS + 1):
        g = rng.normal(0, 1e-3, w.shape).astype(np.float32)
        m = 0.9 * m + 0.1 * g
        w = w - 1e-3 * np.sign(m)
        v["w"].assign(w), v["m"].assign(m), v["b"].assign(w[0]), v["step"].assign(step)
        saved.append(os.path.basename(ckpt.save(os.path.join(mnt, "ckpt"))))
        print("saved", saved[-1], flush=True)
        sys.stdin.readline()
    for name in os.listdir(mnt):
        if name.startswith("ckpt-"):
            shutil.copyfile(os.path.join(mnt, name), os.path.join(ref, name))
    return {"saved": saved}


def restore(mnt, ref):
    checked = 0
    for step in range(1, STEPS + 1):
        got, want = make_vars(), make_vars()
        tf.train.Checkpoint(**got).restore(os.path.join(mnt, f"ckpt-{step}")).assert_consumed()
        tf.train.Checkpoint(**want).restore(os.path.join(ref, f"ckpt-{step}")).assert_consumed()
        for k in got:
            a, b = got[k].numpy(), want[k].numpy()
            if a.tobytes() != b.tobytes():
                raise SystemExit(f"ckpt-{step}: {k} differs after restore")
            checked += 1
    return {"checked": checked}


if __name__ == "__main__":
    mnt, ref = sys.argv[1], sys.argv[2]
    out = restore(mnt, ref) if sys.argv[3:] == ["restore"] else save(mnt, ref)
    print(json.dumps(out))
