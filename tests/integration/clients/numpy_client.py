"""NumPy 2.x client: np.save, np.savez, np.savez_compressed; np.load, also
with mmap_mode='r'. See common.py for the protocol."""
from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import Client, check, inspect_dtype  # noqa: E402

import ml_dtypes  # noqa: E402
import numpy as np  # noqa: E402


def arrays():
    rng = np.random.default_rng(7)
    special = np.array([np.nan, np.inf, -np.inf, -0.0, 0.0, 1e-45, -1e-40, 3.4e38], dtype=np.float32)
    special.view(np.uint32)[4] = 0x7FC00001  # a second NaN payload
    return {
        "weights_f32": rng.standard_normal((512, 256), dtype=np.float32),
        "weights_f16": (rng.standard_normal((300, 77)) * 0.02).astype(np.float16),
        "weights_f64_fortran": np.asfortranarray(rng.standard_normal((64, 48))),
        "bf16_void": rng.standard_normal(1000, dtype=np.float32).astype(ml_dtypes.bfloat16),
        "ids_i64": rng.integers(-2**62, 2**62, size=(4096,), dtype=np.int64),
        "u8_image": rng.integers(0, 256, size=(3, 32, 32), dtype=np.uint8),
        "mask_bool": rng.random((17, 19)) > 0.5,
        "c64": (rng.standard_normal(100) + 1j * rng.standard_normal(100)).astype(np.complex64),
        "special_f32": special,
        "scalar_f64": np.array(2.5),
    }


def npy_dtypes(a):
    """What the npy parser reports: element dtypes for native types; ml_dtypes
    types are stored as void ('<V2') so their dtype is not asserted."""
    return None if a.dtype == ml_dtypes.bfloat16 else [inspect_dtype(a.dtype)]


def main():
    c = Client()
    arrs = arrays()
    for root in (c.mnt, c.ref):
        os.makedirs(root / "np", exist_ok=True)
        for k, a in arrs.items():
            np.save(root / "np" / f"{k}.npy", a)
    for k, a in arrs.items():
        c.record(f"np/{k}.npy", ref=True, tensor_bytes=a.nbytes, dtypes=npy_dtypes(a))
    # savez: zip members carry the current time, so no reference copy
    np.savez(c.mnt / "np" / "bundle.npz", **arrs)
    np.savez_compressed(c.mnt / "np" / "bundle_compressed.npz", **arrs)
    c.record("np/bundle.npz", ref=False, tensor_bytes=sum(a.nbytes for a in arrs.values()))
    # deflated members are metadata to the parser (nothing to find in place)
    c.record("np/bundle_compressed.npz", ref=False, tensor_bytes=0, dtypes=[])

    def load(when):
        for k, a in arrs.items():
            path = c.mnt / "np" / f"{k}.npy"
            b = np.load(path)
            check(b.flags.f_contiguous == a.flags.f_contiguous, f"{when}:{k}: fortran order lost")
            if a.dtype == ml_dtypes.bfloat16:  # npy stores it as '<V2': same bytes, void dtype
                check(b.dtype.itemsize == 2 and b.tobytes() == a.tobytes(), f"{when}:np.load({k})")
                c.compare(a, b.view(ml_dtypes.bfloat16), f"{when}:np.load({k}).view(bfloat16)")
                continue
            c.compare(a, b, f"{when}:np.load({k})")
            m = np.load(path, mmap_mode="r")
            check(isinstance(m, np.memmap), f"{when}:{k}: mmap_mode='r' gave {type(m)}")
            c.compare(a, np.asarray(m), f"{when}:np.load({k}, mmap_mode='r')")
            del m
        for name in ("bundle.npz", "bundle_compressed.npz"):
            with np.load(c.mnt / "np" / name) as z:
                check(sorted(z.files) == sorted(arrs), f"{when}:{name}: members {z.files}")
                for k, a in arrs.items():
                    b = z[k]
                    if a.dtype == ml_dtypes.bfloat16:
                        b = b.view(ml_dtypes.bfloat16)
                    c.compare(a, b, f"{when}:{name}[{k}]")

    c.run(load)


if __name__ == "__main__":
    main()
