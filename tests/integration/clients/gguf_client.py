"""gguf client (llama.cpp's Python package): GGUFWriter writes metadata and
f32, f16, bf16, i32 and Q8_0 tensors; GGUFReader (a memmap of the file)
reads them back. See common.py for the protocol."""
from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import Client, check  # noqa: E402

import gguf  # noqa: E402
import numpy as np  # noqa: E402
from gguf import GGMLQuantizationType as QT  # noqa: E402

METADATA = {  # key -> (adder, value)
    "ckptfs.test.u32": ("add_uint32", 7),
    "ckptfs.test.i64": ("add_int64", -(2**40)),
    "ckptfs.test.f32": ("add_float32", 0.125),
    "ckptfs.test.bool": ("add_bool", True),
    "ckptfs.test.str": ("add_string", "ckptfs client test \u00e9"),
    "ckptfs.test.arr": ("add_array", [1, 2, 3, 5, 8]),
}


def tensors():
    """name -> (the array handed to add_tensor, raw_dtype or None, logical float32 values or None)."""
    rng = np.random.default_rng(3)
    out = {}
    out["token_embd.weight"] = (rng.standard_normal((1000, 64), dtype=np.float32), None, None)
    out["blk.0.attn_q.weight"] = ((rng.standard_normal((64, 64)) * 0.02).astype(np.float16), None, None)
    out["blk.0.attn_norm.weight"] = (np.ones(64, dtype=np.float32), None, None)
    w = rng.standard_normal((128, 64), dtype=np.float32)  # rows are a multiple of the 32-element block
    out["blk.0.ffn_up.weight"] = (gguf.quants.quantize(w, QT.Q8_0), QT.Q8_0, w)
    b = rng.standard_normal((16, 64), dtype=np.float32)
    out["blk.0.ffn_gate.weight"] = (gguf.quants.quantize(b, QT.BF16), QT.BF16, b)
    out["positions.i32"] = (np.arange(-100, 924, dtype=np.int32), None, None)
    return out


def write(path, ts):
    w = gguf.GGUFWriter(path, arch="llama")
    w.add_name("ckptfs-gguf-test")
    w.add_block_count(1)
    w.add_context_length(1024)
    for key, (adder, value) in METADATA.items():
        getattr(w, adder)(key, value)
    for name, (data, raw_dtype, _) in ts.items():
        w.add_tensor(name, data, raw_dtype=raw_dtype)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def field_value(f):
    """The value of a ReaderField: scalar, string or list."""
    return f.contents()


def main():
    c = Client()
    ts = tensors()
    for root in (c.mnt, c.ref):
        os.makedirs(root / "gguf", exist_ok=True)
        write(root / "gguf" / "model.gguf", ts)
    c.record("gguf/model.gguf", ref=True, tensor_bytes=sum(d.nbytes for d, _, _ in ts.values()),
             names=sorted(ts))

    def load(when):
        r = gguf.GGUFReader(c.mnt / "gguf" / "model.gguf")
        check(field_value(r.fields["general.name"]) == "ckptfs-gguf-test", f"{when}: general.name")
        check(field_value(r.fields["general.architecture"]) == "llama", f"{when}: general.architecture")
        for key, (_, value) in METADATA.items():
            got = field_value(r.fields[key])
            if isinstance(value, float):
                check(np.float32(got) == np.float32(value), f"{when}: {key} = {got!r}")
            else:
                check(got == value, f"{when}: {key} = {got!r}, wrote {value!r}")
        by_name = {t.name: t for t in r.tensors}
        check(sorted(by_name) == sorted(ts), f"{when}: tensors {sorted(by_name)}")
        for name, (data, raw_dtype, logical) in ts.items():
            t = by_name[name]
            got = np.asarray(t.data)
            check(got.tobytes() == np.ascontiguousarray(data).tobytes(), f"{when}:{name}: bytes differ")
            check(t.n_bytes == data.nbytes, f"{when}:{name}: n_bytes {t.n_bytes} vs {data.nbytes}")
            if raw_dtype is None:
                c.compare(data, got, f"{when}:{name}")
            else:
                check(t.tensor_type == raw_dtype, f"{when}:{name}: type {t.tensor_type!r}")
                # dequantised values equal those of the original quantised bytes
                ref = gguf.quants.dequantize(data, raw_dtype)
                deq = gguf.quants.dequantize(got, t.tensor_type)
                c.compare(ref, deq, f"{when}:{name} dequantised")
                check(deq.shape == logical.shape, f"{when}:{name}: shape {deq.shape}")
                # and are what was quantised, up to the type's precision
                tol = 2.0**-8 if raw_dtype == QT.BF16 else 1 / 127
                check(np.all(np.abs(deq - logical) <= tol * np.abs(logical).max(axis=-1, keepdims=True)),
                      f"{when}:{name}: dequantised values are not the quantised ones")
        del r, by_name, t, got

    c.run(load)


if __name__ == "__main__":
    main()
