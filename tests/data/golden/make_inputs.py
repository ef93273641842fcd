#!/usr/bin/env python3
"""Writes the input files of the golden stores into inputs/ (next to this
script) or the directory given as the first argument.

Deterministic: a fixed NumPy seed, and torch.save of the same objects gives
the same bytes with the same torch version (the checked-in files were made
with torch 1.13 of .venv-debian; make_store.py writes what is checked in,
never a fresh run of this script). Sizes are kept small (a few KB each) so
that five stores fit in the repository; the stores are made with 8 KiB
chunks (make_store.py) so that files still span several chunks.

    .venv-debian/bin/python tests/data/golden/make_inputs.py
"""
import collections
import json
import struct
import sys
from pathlib import Path

import numpy as np
import torch

rng = np.random.default_rng(20261203)


def normal(shape, scale, dtype=np.float32):
    return (rng.standard_normal(shape) * scale).astype(dtype)


def tensor(a):
    return torch.from_numpy(np.ascontiguousarray(a))


def write(out: Path, name: str, data: bytes):
    p = out / name
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_bytes(data)


def write_torch(out: Path, name: str, obj):
    # To the path, as a client saves: torch.save names the zip's top
    # directory after the file ("archive" for a buffer).
    p = out / name
    p.parent.mkdir(parents=True, exist_ok=True)
    torch.save(obj, p)


def safetensors_bytes(tensors: dict) -> bytes:
    """The safetensors layout (u64 header length, JSON header padded with
    spaces to 8 bytes, data back to back), tensors in name order (the
    safetensors package orders them by alignment, then name; any order is
    valid, and torch 1.13's venv has no safetensors)."""
    header, data, off = {}, b"", 0
    names = {np.dtype(np.float32): "F32", np.dtype(np.float16): "F16", np.dtype(np.int32): "I32"}
    for name in sorted(tensors):
        a = np.ascontiguousarray(tensors[name])
        b = a.tobytes()
        header[name] = {"dtype": names[a.dtype], "shape": list(a.shape), "data_offsets": [off, off + len(b)]}
        data += b
        off += len(b)
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * (-len(h) % 8)
    return struct.pack("<Q", len(h)) + h + data


def npy_bytes(a) -> bytes:
    import io
    buf = io.BytesIO()
    np.save(buf, a)
    return buf.getvalue()


def text_bytes() -> bytes:
    lines = [f"step {i:05d} loss {1.0 / (i + 1):.6f} lr 0.001 tokens {i * 4096}\n" for i in range(120)]
    return "".join(lines).encode()


def model_state():
    sd = collections.OrderedDict()
    sd["encoder.weight"] = tensor(normal((32, 48), 0.02))                       # f32, 6 KiB
    sd["encoder.bias"] = tensor(normal((32,), 0.01))
    sd["decoder.weight"] = tensor(normal((48, 64), 0.02, np.float16))           # f16, 6 KiB
    sd["embed.weight"] = tensor(normal((32, 64), 0.02)).to(torch.bfloat16)      # bf16, 4 KiB
    sd["positions"] = torch.arange(640, dtype=torch.int64)                      # i64, 5 KiB
    return sd


def training_checkpoint(step: int, w, b, extra=None):
    sd = collections.OrderedDict([("fc.weight", tensor(w)), ("fc.bias", tensor(b))])
    ck = {"model": sd, "step": step}
    if extra is not None:
        ck["optimizer"] = extra
    return ck


def adam_state(m_w, v_w, m_b, v_b, step):
    return {
        "state": {
            0: {"step": torch.tensor(float(step)), "exp_avg": tensor(m_w), "exp_avg_sq": tensor(v_w)},
            1: {"step": torch.tensor(float(step)), "exp_avg": tensor(m_b), "exp_avg_sq": tensor(v_b)},
        },
        "param_groups": [{"lr": 1e-3, "betas": (0.9, 0.999), "eps": 1e-8, "weight_decay": 0.0,
                          "amsgrad": False, "params": [0, 1]}],
    }


def data_offsets(path: Path) -> list[int]:
    """Where each tensor's bytes start in a torch.save zip."""
    import zipfile
    out = []
    with zipfile.ZipFile(path) as z, open(path, "rb") as f:
        for i in z.infolist():
            if "/data/" in i.filename:
                f.seek(i.header_offset)
                name_len, extra_len = struct.unpack("<HH", f.read(30)[26:30])
                out.append(i.header_offset + 30 + name_len + extra_len)
    return out


def save_moved(out: Path, name: str, before: str, ck: dict):
    """Saves `ck` with a note just long enough that every tensor sits 64
    bytes further into the file than in `before` (torch.save aligns tensor
    records to 64 bytes: the pickle grew across that alignment)."""
    want = [o + 64 for o in data_offsets(out / before)]
    for n in range(1, 200):
        write_torch(out, name, dict(ck, note="n" * n))
        if data_offsets(out / name) == want:
            return
    raise SystemExit(f"{name}: no note length moves every tensor by 64 bytes")


def write_moved_successors(out: Path, step2, lossy2):
    """From pack version 5: the next save of each lineage, its pickle grown
    so that every tensor moved by 64 bytes; its first chunk's base window
    starts before its predecessor."""
    w, b = step2
    w3 = w.copy()
    w3[3::8] += normal((6, 64), 0.001)
    save_moved(out, "step3.pt", "step2.pt", training_checkpoint(300, w3, b))
    w, b, opt = lossy2
    w = w - 1e-3 * opt["state"][0]["exp_avg"].numpy() * 0.05
    save_moved(out, "lossy/ckpt3.pt", "lossy/ckpt2.pt", training_checkpoint(30, w.astype(np.float32), b, opt))


def main():
    out = Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).resolve().parent / "inputs"
    out.mkdir(parents=True, exist_ok=True)

    write(out, "notes.txt", text_bytes())                                   # zstd chunks
    write(out, "random.bin", rng.integers(0, 256, 12 * 1024, dtype=np.uint8).tobytes())  # raw chunks
    sparse = bytearray(20 * 1024)                                           # an all-zero 8 KiB chunk inside
    sparse[:8192] = text_bytes()[:8192]
    sparse[16384:] = rng.integers(0, 4, 4096, dtype=np.uint8).tobytes()
    write(out, "sparse.bin", bytes(sparse))
    write(out, "empty.bin", b"")
    write_torch(out, "model.pt", model_state())
    write(out, "array.npy", npy_bytes(normal((24, 64), 1.0)))
    write(out, "weights.safetensors", safetensors_bytes({
        "layer.weight": normal((32, 64), 0.05),
        "layer2.weight": normal((48, 64), 0.05, np.float16),
        "ids": rng.integers(0, 50000, 1024, dtype=np.int32),
    }))

    # Two successive checkpoints: the second changes a few rows, so it is
    # stored as deltas (and refs) against the first from pack version 3 on.
    w = normal((48, 64), 0.02)
    b = normal((64,), 0.01)
    write_torch(out, "step1.pt", training_checkpoint(100, w, b))
    w2 = w.copy()
    w2[::8] += normal((6, 64), 0.001)
    write_torch(out, "step2.pt", training_checkpoint(200, w2, b))
    step_b = b

    # Lossy pair: a model with its Adam state (weights weighed by their own
    # second moments), then the next save, coded against the first's
    # reconstruction.
    w = normal((16, 64), 0.02)
    b = normal((64,), 0.01)
    m_w, v_w = normal((16, 64), 1e-4), np.abs(normal((16, 64), 1e-6)) + 1e-9
    m_b, v_b = normal((64,), 1e-4), np.abs(normal((64,), 1e-6)) + 1e-9
    write_torch(out, "lossy/ckpt1.pt", training_checkpoint(10, w, b, adam_state(m_w, v_w, m_b, v_b, 10)))
    w = w - 1e-3 * m_w / (np.sqrt(v_w) + 1e-8) * 0.05
    m_w = 0.9 * m_w + normal((16, 64), 1e-5)
    v_w = 0.999 * v_w + np.abs(normal((16, 64), 1e-8))
    opt = adam_state(m_w.astype(np.float32), v_w.astype(np.float32), m_b, v_b, 20)
    write_torch(out, "lossy/ckpt2.pt", training_checkpoint(20, w.astype(np.float32), b, opt))
    write_moved_successors(out, (w2, step_b), (w.astype(np.float32), b, opt))
    for p in sorted(out.rglob("*")):
        if p.is_file():
            print(f"{p.relative_to(out)}: {p.stat().st_size} bytes")


if __name__ == "__main__":
    main()
