"""A Keras 3 model (JAX backend) trained with a ModelCheckpoint callback
that writes one file per epoch into argv[1] (the mount): `w.NN.weights.h5`
(save_weights_only) or, with --keras, `m.NN.keras` (the whole model and
its optimizer). After each epoch's file it copies that file's bytes, as
written, to argv[2] (a plain directory), prints "saved NAME" and waits for
a line on stdin, so the test can let the seal finish before the next
epoch (a file's predecessor must be sealed to be found). Ends with a JSON
line {"saved": [names], "weights": {name: sha256 of each weight's bytes}}.

  keras_epochs.py MNT REF [--epochs N] [--keras]
  keras_epochs.py check MNT REF
      Loads every saved file back through Keras and checks its weights'
      hashes against the JSON line's (read from REF/weights.json)."""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import sys

os.environ.setdefault("KERAS_BACKEND", "jax")
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import keras  # noqa: E402
import numpy as np  # noqa: E402


def build(lr=1e-4):
    keras.utils.set_random_seed(0)
    m = keras.Sequential([keras.Input((256,)), keras.layers.Dense(512, activation="relu"),
                          keras.layers.Dense(512, activation="relu"), keras.layers.Dense(10)])
    m.compile(optimizer=keras.optimizers.Adam(lr), loss="mse")
    return m


def digest(weights) -> list[str]:
    return [hashlib.sha256(np.ascontiguousarray(w).tobytes()).hexdigest() for w in weights]


def save(a):
    model = build(a.lr)
    rng = np.random.default_rng(0)
    x = rng.normal(size=(512, 256)).astype(np.float32)
    y = rng.normal(size=(512, 10)).astype(np.float32)
    pattern = "m.{epoch:02d}.keras" if a.keras else "w.{epoch:02d}.weights.h5"
    saved, weights = [], {}

    class Pause(keras.callbacks.Callback):
        def on_epoch_end(self, epoch, logs=None):
            name = pattern.format(epoch=epoch + 1)
            shutil.copyfile(os.path.join(a.mnt, name), os.path.join(a.ref, name))
            saved.append(name)
            weights[name] = digest(self.model.get_weights())
            print("saved", name, flush=True)
            sys.stdin.readline()

    ckpt = keras.callbacks.ModelCheckpoint(os.path.join(a.mnt, pattern), save_weights_only=not a.keras)
    model.fit(x, y, epochs=a.epochs, batch_size=64, verbose=0, callbacks=[ckpt, Pause()])
    out = {"saved": saved, "weights": weights}
    with open(os.path.join(a.ref, "weights.json"), "w") as f:
        json.dump(out, f)
    print(json.dumps(out))


def check(a):
    want = json.load(open(os.path.join(a.ref, "weights.json")))
    checked = 0
    for name in want["saved"]:
        path = os.path.join(a.mnt, name)
        if name.endswith(".keras"):
            got = keras.models.load_model(path).get_weights()
        else:
            m = build()
            m.load_weights(path)
            got = m.get_weights()
        assert digest(got) == want["weights"][name], f"{name}: weights differ"
        checked += 1
    print(json.dumps({"checked": checked}))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("mode", nargs="?", default="save")
    ap.add_argument("mnt")
    ap.add_argument("ref")
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--keras", action="store_true")
    ap.add_argument("--lr", type=float, default=1e-4)
    a = ap.parse_args()
    (check if a.mode == "check" else save)(a)


if __name__ == "__main__":
    main()
