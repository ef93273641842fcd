"""Regenerates the small HDF5 files of the unit tests (h5py and keras from .venv-pypi):
  .venv-pypi/bin/python tests/data/hdf5/gen.py
plain.h5: h5py defaults (superblock 0, v1 object headers, symbol-table groups):
  contiguous f32 "c", chunked f64 "k" (v1 B-tree), gzip-filtered "g",
  f16 "sub/h", i64 "sub/deeper/i", a bool dataset and a string dataset;
latest.h5: libver="latest" (superblock 3, OHDR headers, link messages):
  contiguous, a fixed-array chunked dataset, a single-chunk one and an
  extensible-array one (one unlimited dim: not followed);
userblock.h5: plain contiguous data after a 512-byte user block;
dense.h5: libver="latest", a group of 40 links in dense storage (fractal
  heap), one deleted, and a track_order=True group;
w.weights.h5 / m.keras: a Keras 3 Dense model's save_weights / save.
expected.json: for each file, every dataset's data regions as h5py reports
them (absolute offset, length), the truth the parser is tested against."""
import json
import os
import zipfile

os.environ.setdefault("KERAS_BACKEND", "jax")
import h5py
import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))


def p(name):
    return os.path.join(HERE, name)


def plain():
    with h5py.File(p("plain.h5"), "w") as f:
        f["c"] = np.arange(64, dtype=np.float32) / 3
        f.create_dataset("k", data=np.arange(200, dtype=np.float64).reshape(10, 20) / 7, chunks=(4, 8))
        f.create_dataset("g", data=np.arange(256, dtype=np.float32), compression="gzip")
        f["sub/h"] = np.arange(12, dtype=np.float16).reshape(3, 4)
        f["sub/deeper/i"] = np.arange(5, dtype=np.int64) - 2
        f["flags"] = np.array([True, False, True])
        f["text"] = "hello"


def latest():
    with h5py.File(p("latest.h5"), "w", libver="latest") as f:
        f["c"] = np.arange(32, dtype=np.int32)
        f.create_dataset("fa", data=np.arange(120, dtype=np.float32).reshape(10, 12), chunks=(4, 5))
        f.create_dataset("one", data=np.arange(6, dtype=np.uint16), chunks=(6,))
        f.create_dataset("ea", data=np.arange(40, dtype=np.float32), chunks=(10,), maxshape=(None,))
        f["g/w"] = np.ones((2, 2), np.float64)


def dense():
    with h5py.File(p("dense.h5"), "w", libver="latest") as f:
        g = f.create_group("many")
        for i in range(40):
            g[f"d{i}"] = np.full(3, i, np.float32)
        del g["d7"]
        t = f.create_group("ordered", track_order=True)
        for i in range(12):
            t[f"x{i}"] = np.full(2, i, np.int16)


def userblock():
    with h5py.File(p("userblock.h5"), "w", userblock_size=512) as f:
        f["u"] = np.arange(16, dtype=np.float32)


def keras_files():
    import keras
    m = keras.Sequential([keras.Input((6,)), keras.layers.Dense(5, activation="relu"), keras.layers.Dense(2)])
    m.compile(optimizer="adam", loss="mse")
    m.fit(np.ones((8, 6), np.float32), np.zeros((8, 2), np.float32), epochs=1, verbose=0)
    m.save_weights(p("w.weights.h5"))
    m.save(p("m.keras"))


def regions(path, base=0):
    out = []
    with h5py.File(path, "r") as f:
        def visit(name, obj):
            if not isinstance(obj, h5py.Dataset):
                return
            if obj.chunks is None:
                off = obj.id.get_offset()
                if off is not None:
                    out.append({"name": "/" + name, "offset": base + off, "length": obj.id.get_storage_size()})
                return
            for i in range(obj.id.get_num_chunks()):
                c = obj.id.get_chunk_info(i)
                out.append({"name": "/" + name, "offset": base + c.byte_offset, "length": c.size,
                            "filtered": obj.compression is not None})
        f.visititems(visit)
    return sorted(out, key=lambda r: r["offset"])


if __name__ == "__main__":
    plain()
    latest()
    userblock()
    dense()
    keras_files()
    expected = {n: regions(p(n)) for n in ["plain.h5", "latest.h5", "userblock.h5", "dense.h5", "w.weights.h5"]}
    with zipfile.ZipFile(p("m.keras")) as z:
        info = z.getinfo("model.weights.h5")
        assert info.compress_type == zipfile.ZIP_STORED
        with open(p("m.keras"), "rb") as f:
            f.seek(info.header_offset + 26)
            n, m = np.frombuffer(f.read(4), np.uint16)
        data = info.header_offset + 30 + int(n) + int(m)
        with open(p("inner.h5"), "wb") as f:
            f.write(z.read("model.weights.h5"))
    expected["m.keras"] = regions(p("inner.h5"), base=data)
    os.remove(p("inner.h5"))
    with open(p("expected.json"), "w") as f:
        json.dump(expected, f, indent=1)
