"""Keras 3 and h5py client (keras with the JAX backend, h5py from PyPI):
model.save (.keras: a zip whose stored member model.weights.h5 is HDF5),
model.save_weights (.weights.h5), a ModelCheckpoint callback saving the
weights of each of 2 epochs, and plain h5py files: libhdf5's default format
(contiguous, chunked with a v1 B-tree, gzip-filtered) and libver="latest"
(fixed-array and single-chunk indexes). Every file is loaded back bit-exact
with Keras (weights) and h5py (every dataset). The parsers find every
unfiltered numeric dataset's storage: tensor_bytes is what h5py reports
as its storage size. See common.py for the protocol."""
from __future__ import annotations

import io
import os
import sys
import zipfile

os.environ.setdefault("KERAS_BACKEND", "jax")
os.environ.setdefault("JAX_PLATFORMS", "cpu")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import Client, check  # noqa: E402

import h5py  # noqa: E402
import keras  # noqa: E402
import numpy as np  # noqa: E402


def build():
    m = keras.Sequential([keras.Input((32,)), keras.layers.Dense(256, activation="relu"),
                          keras.layers.Dense(128, activation="relu"), keras.layers.Dense(10)])
    m.compile(optimizer=keras.optimizers.Adam(1e-3), loss="mse")
    return m


def datasets(f) -> dict[str, bytes]:
    out = {}
    f.visititems(lambda name, o: out.__setitem__(name, (o.dtype.str, o.shape, o[()].tobytes() if o.shape != ()
                                                        else np.asarray(o[()]).tobytes()))
                 if isinstance(o, h5py.Dataset) else None)
    return out


def found_bytes(f) -> tuple[int, list[str]]:
    """Storage of the datasets the parser codes as tensors, and their dtypes."""
    total, dtypes = 0, set()
    names = {"f2": "F16", "f4": "F32", "f8": "F64", "i4": "I32", "i8": "I64", "u2": "U16", "u1": "U8"}

    def visit(_, o):
        nonlocal total
        if isinstance(o, h5py.Dataset) and o.dtype.kind in "fiu" and o.compression is None:
            total += o.id.get_storage_size()
            dtypes.add(names[o.dtype.str[1:]])
    f.visititems(visit)
    return total, sorted(dtypes)


def h5_file(path):
    if str(path).endswith(".keras"):
        with zipfile.ZipFile(path) as z:
            return h5py.File(io.BytesIO(z.read("model.weights.h5")), "r")
    return h5py.File(path, "r")


def write_plain(root):
    rng = np.random.default_rng(3)
    with h5py.File(root / "keras" / "plain.h5", "w") as f:
        f["contiguous"] = rng.standard_normal((512, 256)).astype(np.float32)
        f.create_dataset("chunked", data=rng.standard_normal((300, 200)), chunks=(64, 64))
        f.create_dataset("gzip", data=rng.standard_normal((256, 256)).astype(np.float32), compression="gzip")
        f["group/half"] = rng.standard_normal((128, 64)).astype(np.float16)
        f["group/ids"] = np.arange(1000, dtype=np.int64)
    # The newest format's object headers carry timestamps (root group too):
    # the mount's and the plain directory's copies, written a second apart,
    # would differ, so this file is written without them.
    with h5py.File(latest_format_without_times(root / "keras" / "latest.h5")) as f:
        f.create_dataset("fixed", data=rng.standard_normal((200, 100)).astype(np.float32), chunks=(50, 40),
                         track_times=False)
        f.create_dataset("single", data=rng.standard_normal(4096).astype(np.float32), chunks=(4096,),
                         track_times=False)
        f.create_dataset("contiguous", data=np.arange(2048, dtype=np.int32), track_times=False)


def latest_format_without_times(path):
    fcpl = h5py.h5p.create(h5py.h5p.FILE_CREATE)
    fcpl.set_obj_track_times(False)
    fapl = h5py.h5p.create(h5py.h5p.FILE_ACCESS)
    fapl.set_libver_bounds(h5py.h5f.LIBVER_LATEST, h5py.h5f.LIBVER_LATEST)
    return h5py.h5f.create(str(path).encode(), h5py.h5f.ACC_TRUNC, fapl=fapl, fcpl=fcpl)


def main():
    c = Client()
    keras.utils.set_random_seed(0)
    os.makedirs(c.mnt / "keras" / "ckpt", exist_ok=True)
    os.makedirs(c.ref / "keras", exist_ok=True)
    model = build()
    x = np.random.default_rng(1).standard_normal((256, 32)).astype(np.float32)
    y = np.random.default_rng(2).standard_normal((256, 10)).astype(np.float32)
    epochs = {}

    class Snapshot(keras.callbacks.Callback):
        def on_epoch_end(self, epoch, logs=None):
            epochs[epoch + 1] = [np.array(w) for w in self.model.get_weights()]

    ckpt = keras.callbacks.ModelCheckpoint(str(c.mnt / "keras" / "ckpt" / "epoch_{epoch:02d}.weights.h5"),
                                           save_weights_only=True)
    model.fit(x, y, epochs=2, batch_size=32, verbose=0, callbacks=[ckpt, Snapshot()])
    weights = [np.array(w) for w in model.get_weights()]
    model.save(c.mnt / "keras" / "m.keras")
    model.save_weights(c.mnt / "keras" / "w.weights.h5")
    write_plain(c.mnt)
    write_plain(c.ref)
    rels = ["keras/m.keras", "keras/w.weights.h5", "keras/plain.h5", "keras/latest.h5",
            "keras/ckpt/epoch_01.weights.h5", "keras/ckpt/epoch_02.weights.h5"]
    contents = {}
    for rel in rels:
        with h5_file(c.mnt / rel) as f:
            contents[rel] = datasets(f)
            tensor_bytes, dtypes = found_bytes(f)
        check(len(contents[rel]) >= 3, f"{rel}: only {len(contents[rel])} datasets")
        c.record(rel, ref=rel in ("keras/plain.h5", "keras/latest.h5"), tensor_bytes=tensor_bytes, dtypes=dtypes)

    def same_weights(got, want, where):
        check(len(got) == len(want), f"{where}: {len(got)} weights, saved {len(want)}")
        for i, (a, b) in enumerate(zip(got, want)):
            check(a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes(), f"{where}: weight {i}")
            c.checks += 1

    def load(when):
        for rel in rels:
            with h5_file(c.mnt / rel) as f:
                got = datasets(f)
            check(got == contents[rel], f"{when}:{rel}: datasets differ")
            c.checks += 1
        same_weights(keras.models.load_model(c.mnt / "keras" / "m.keras").get_weights(), weights, f"{when}:m.keras")
        for rel, want in [("keras/w.weights.h5", weights), ("keras/ckpt/epoch_01.weights.h5", epochs[1]),
                          ("keras/ckpt/epoch_02.weights.h5", epochs[2])]:
            m = build()
            m.load_weights(c.mnt / rel)
            same_weights(m.get_weights(), want, f"{when}:{rel}")

    c.run(load)


if __name__ == "__main__":
    main()
