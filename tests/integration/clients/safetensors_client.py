"""safetensors client: save_file from torch and from numpy (ml_dtypes
bfloat16), read back with load_file and safe_open (framework "pt" and
"numpy"; safe_open maps the file). See common.py for the protocol."""
from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import Client, check, inspect_dtype, special_floats, tensor_bytes  # noqa: E402

import ml_dtypes  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402
from safetensors import safe_open  # noqa: E402
import safetensors.numpy  # noqa: E402
import safetensors.torch  # noqa: E402

# One key only: safetensors serialises the metadata map in hash order, so
# with several keys two saves of the same data differ in the header.
METADATA = {"format": "pt"}


def torch_tensors():
    g = torch.Generator().manual_seed(0)
    t = {
        "embed.weight": torch.randn(1000, 128, generator=g),
        "layer0.attn.qkv.weight": (torch.randn(384, 128, generator=g) * 0.02).bfloat16(),
        "layer0.attn.qkv.bias": torch.zeros(384, dtype=torch.bfloat16),
        "layer0.mlp.fc1.weight": (torch.randn(512, 128, generator=g) * 0.02).half(),
        "layer0.norm.weight": torch.ones(128, dtype=torch.float64),
        "fp8.e4m3": torch.randn(64, 64, generator=g).to(torch.float8_e4m3fn),
        "fp8.e5m2": torch.randn(33, 7, generator=g).to(torch.float8_e5m2),
        "position_ids": torch.arange(512, dtype=torch.int64).unsqueeze(0),
        "counts.i32": torch.randint(-2**31, 2**31 - 1, (77,), dtype=torch.int32, generator=g),
        "mask": torch.rand(5, 9, generator=g) > 0.5,
        "bytes.u8": torch.randint(0, 256, (3, 5, 7), dtype=torch.uint8, generator=g),
        "scalar": torch.tensor(3.5),
    }
    for d in (torch.float32, torch.bfloat16, torch.float16):
        t[f"special.{str(d).removeprefix('torch.')}"] = special_floats(d)
    return t


def numpy_arrays():
    rng = np.random.default_rng(1)
    return {
        "w.f32": rng.standard_normal((256, 64), dtype=np.float32),
        "w.bf16": rng.standard_normal((128, 64), dtype=np.float32).astype(ml_dtypes.bfloat16),
        "w.f16": rng.standard_normal((100, 3)).astype(np.float16),
        "ids.i64": rng.integers(-1000, 1000, size=(50,), dtype=np.int64),
        "ok.bool": rng.random((4, 4)) > 0.3,
    }


def in_order_of(expect: dict, got: dict) -> dict:
    """safetensors returns tensors in file order (sorted by dtype, then name)."""
    check(sorted(got) == sorted(expect), lambda: f"keys {sorted(got)} vs {sorted(expect)}")
    return {k: got[k] for k in expect}


def main():
    c = Client()
    tt, na = torch_tensors(), numpy_arrays()
    for root in (c.mnt, c.ref):
        os.makedirs(root / "st", exist_ok=True)
        safetensors.torch.save_file(tt, root / "st" / "model.safetensors", metadata=METADATA)
        safetensors.numpy.save_file(na, root / "st" / "numpy.safetensors")
    c.record("st/model.safetensors", ref=True,
             tensor_bytes=sum(v.numel() * v.element_size() for v in tt.values()),
             dtypes=sorted({inspect_dtype(v.dtype) for v in tt.values()}), names=sorted(tt))
    c.record("st/numpy.safetensors", ref=True, tensor_bytes=sum(a.nbytes for a in na.values()),
             dtypes=sorted({"BF16" if a.dtype == ml_dtypes.bfloat16 else inspect_dtype(a.dtype)
                            for a in na.values()}), names=sorted(na))

    def load(when):
        path = c.mnt / "st" / "model.safetensors"
        c.compare(tt, in_order_of(tt, safetensors.torch.load_file(path)), f"{when}:load_file")
        with open(path, "rb") as f:
            c.compare(tt, in_order_of(tt, safetensors.torch.load(f.read())), f"{when}:load(bytes)")
        with safe_open(path, framework="pt") as f:
            check(f.metadata() == METADATA, f"{when}: metadata {f.metadata()}")
            check(sorted(f.keys()) == sorted(tt), f"{when}: keys {sorted(f.keys())}")
            for k, v in tt.items():
                c.compare(v, f.get_tensor(k), f"{when}:safe_open(pt)[{k}]")
            # a slice reads only part of the tensor's bytes
            c.compare(tt["embed.weight"][100:300], f.get_slice("embed.weight")[100:300],
                      f"{when}:get_slice")
        with safe_open(path, framework="numpy") as f:
            for k, v in tt.items():
                if v.dtype in (torch.float8_e4m3fn, torch.float8_e5m2):
                    continue  # safetensors' numpy framework has no float8
                a = f.get_tensor(k)
                check(tuple(a.shape) == tuple(v.shape) and a.dtype.itemsize == v.element_size(),
                      f"{when}: numpy {k}: {a.dtype}{a.shape} vs {v.dtype}{tuple(v.shape)}")
                check(np.ascontiguousarray(a).tobytes() == tensor_bytes(v), f"{when}: numpy {k}: bytes differ")
                c.checks += 1
        npath = c.mnt / "st" / "numpy.safetensors"
        c.compare(na, in_order_of(na, safetensors.numpy.load_file(npath)), f"{when}:numpy.load_file")
        with safe_open(npath, framework="numpy") as f:
            c.compare(na, {k: f.get_tensor(k) for k in na}, f"{when}:safe_open(numpy)")
        with safe_open(npath, framework="pt") as f:
            check(f.get_tensor("w.bf16").dtype == torch.bfloat16, "numpy bf16 not read back as bf16")
            check(tensor_bytes(f.get_tensor("w.bf16")) == na["w.bf16"].tobytes(), f"{when}: numpy bf16 as pt")

    c.run(load)


if __name__ == "__main__":
    main()
