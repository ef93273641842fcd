"""Shared by the client scripts in this folder, which tests/integration/
test_clients.py runs with the PyPI interpreter (.venv-pypi/bin/python).

Every client is invoked as `python CLIENT.py MNT_DIR REF_DIR [ARGS...]` and
talks to the test over stdin/stdout:

  1. It writes its files into MNT_DIR (a directory in a ckptfs mount) with
     the real library, and, where the library is deterministic, the same
     files into REF_DIR (a plain directory). It loads them back from the
     mount and compares with the objects it saved. Then it prints one JSON
     line {"phase": "written", "files": {...}} describing every file, and
     waits for a line on stdin.
  2. Meanwhile the test waits until everything is sealed and remounts, so
     the files now come from the store, not from staging or the page cache.
     It writes "verify"; the client loads everything again (mmap loaders
     included), compares with the objects still in its memory, prints
     {"phase": "verified", "checks": N} and exits 0.

Any mismatch prints "MISMATCH: ..." to stderr and exits 3. A client must not
keep a file in the mount open (or mapped) while it waits, or the remount
fails with EBUSY.
"""
from __future__ import annotations

import gc
import json
import os
import sys
from pathlib import Path

# The helpers of the integration tests, one folder up (these scripts run with
# their own folder first on sys.path). Appended, so that no module of theirs
# can shadow one a client library imports.
sys.path.append(str(Path(__file__).resolve().parent.parent))
from helpers import sha256_file  # noqa: E402

MISMATCH_EXIT = 3


def fail(msg: str) -> None:
    sys.stderr.write(f"MISMATCH: {msg}\n")
    sys.stderr.flush()
    sys.exit(MISMATCH_EXIT)


def check(cond, msg) -> None:
    if not cond:
        fail(msg() if callable(msg) else msg)


# -- bit-exact comparison ----------------------------------------------------

def tensor_bytes(t) -> bytes:
    """The raw bytes of a torch tensor's elements (C order), any dtype."""
    import torch
    t = t.detach().cpu().contiguous().reshape(-1)
    return t.view(torch.uint8).numpy().tobytes() if t.numel() else b""


def same_tensor(a, b, where: str) -> None:
    import torch
    check(isinstance(b, torch.Tensor), lambda: f"{where}: tensor vs {type(b).__name__}")
    check(a.dtype == b.dtype and tuple(a.shape) == tuple(b.shape),
          lambda: f"{where}: {a.dtype}{tuple(a.shape)} vs {b.dtype}{tuple(b.shape)}")
    check(tensor_bytes(a) == tensor_bytes(b), lambda: f"{where}: {a.dtype}{tuple(a.shape)} bytes differ")


def same_array(a, b, where: str) -> None:
    import numpy as np
    b = np.asarray(b)
    check(a.dtype == b.dtype and a.shape == b.shape,
          lambda: f"{where}: {a.dtype}{a.shape} vs {b.dtype}{b.shape}")
    check(np.ascontiguousarray(a).tobytes() == np.ascontiguousarray(b).tobytes(),
          lambda: f"{where}: {a.dtype}{a.shape} bytes differ")


def same_tree(a, b, where: str = "obj") -> int:
    """Deep, bit-exact equality of nested dicts/lists/tuples of tensors,
    arrays and plain values. Returns how many tensors/arrays it compared."""
    try:
        import torch
    except ImportError:
        torch = None
    import numpy as np
    if torch is not None and isinstance(a, torch.Tensor):
        same_tensor(a, b, where)
        return 1
    if isinstance(a, np.ndarray):
        same_array(a, b, where)
        return 1
    if isinstance(a, dict):
        check(isinstance(b, dict) and list(a.keys()) == list(b.keys()),
              lambda: f"{where}: keys {list(a)[:8]} vs {list(b)[:8] if isinstance(b, dict) else type(b)}")
        return sum(same_tree(a[k], b[k], f"{where}[{k!r}]") for k in a)
    if isinstance(a, (list, tuple)):
        check(type(a) is type(b) and len(a) == len(b), lambda: f"{where}: {a!r} vs {b!r}")
        return sum(same_tree(x, y, f"{where}[{i}]") for i, (x, y) in enumerate(zip(a, b)))
    check(type(a) is type(b) and a == b, lambda: f"{where}: {a!r} != {b!r}")
    return 0


# -- protocol ----------------------------------------------------------------

def versions() -> dict[str, str]:
    """Versions of the client libraries this process imported."""
    out = {"python": sys.version.split()[0]}
    for name in ("numpy", "torch", "safetensors", "gguf", "tensorflow", "keras", "ml_dtypes", "onnx", "flax", "jax",
                 "sentence_transformers", "transformers"):
        mod = sys.modules.get(name)
        if mod is not None:
            out[name] = str(getattr(mod, "__version__", "?"))
    return out


class Client:
    """Records the files a client wrote and runs the two phases."""

    def __init__(self, argv=None):
        argv = list(sys.argv[1:] if argv is None else argv)
        if len(argv) < 2:
            sys.exit(f"usage: {sys.argv[0]} MNT_DIR REF_DIR [ARGS...]")
        self.mnt = Path(argv[0])
        self.ref = Path(argv[1])
        self.args = argv[2:]
        self.files: dict[str, dict] = {}
        self.checks = 0

    def record(self, rel: str, ref: bool, tensor_bytes: int | None = None, dtypes: list[str] | None = None,
               **extra) -> None:
        """Notes MNT_DIR/rel, with the sha256 of its bytes as read through the
        mount right after writing. ref=True: REF_DIR/rel holds the same file
        written by the same deterministic code, and must be byte-identical.
        tensor_bytes: how many bytes of tensor data the file holds, as the
        format parsers should find them, and dtypes: the sorted set of their
        element types as inspect names them (None: not checked). extra, e.g.
        names=[...] (the sorted tensor names inspect must list), is passed on."""
        path = self.mnt / rel
        digest = sha256_file(path)
        if ref:
            ref_digest = sha256_file(self.ref / rel)
            check(digest == ref_digest,
                  f"{rel}: the copy in the mount (sha256 {digest}) differs from the one in the plain "
                  f"directory ({ref_digest}) right after writing")
        self.files[rel] = {"sha256": digest, "size": os.path.getsize(path), "ref": ref,
                           "tensor_bytes": tensor_bytes, "dtypes": dtypes, **extra}

    def compare(self, a, b, where: str) -> None:
        self.checks += same_tree(a, b, where)

    def written(self) -> None:
        """Phase 1 done: report and wait for the test to seal and remount."""
        gc.collect()  # drop any mapping of a file in the mount before the remount
        print(json.dumps({"phase": "written", "files": self.files, "versions": versions()}), flush=True)
        line = sys.stdin.readline().strip()
        if line != "verify":
            sys.exit(f"expected 'verify' on stdin, got {line!r}")

    def verified(self) -> None:
        gc.collect()
        print(json.dumps({"phase": "verified", "checks": self.checks}), flush=True)

    def run(self, load) -> None:
        """Both phases around load(when), which reads every file back from
        the mount and compares: right after writing, then after the test
        sealed and remounted."""
        load("written")
        self.written()
        load("sealed")
        self.verified()


# torch dtype -> the name `ckptfs inspect` prints (codec/dtype.cc DTypeName)
INSPECT_DTYPE = {
    "float64": "F64", "float32": "F32", "float16": "F16", "bfloat16": "BF16",
    "float8_e4m3fn": "F8_E4M3", "float8_e5m2": "F8_E5M2", "int64": "I64", "int32": "I32",
    "int16": "I16", "int8": "I8", "uint8": "U8", "bool": "BOOL", "uint16": "U16",
    "uint32": "U32", "uint64": "U64", "complex64": "C64", "complex128": "C128",
}


def inspect_dtype(dtype) -> str:
    """torch or numpy dtype -> DTypeName."""
    return INSPECT_DTYPE[str(dtype).removeprefix("torch.")]


def tensors_in(obj):
    """The tensors reachable from obj through dicts, lists and tuples, in the
    order torch.save pickles them."""
    import torch
    if isinstance(obj, torch.Tensor):
        yield obj
    elif isinstance(obj, dict):
        for v in obj.values():
            yield from tensors_in(v)
    elif isinstance(obj, (list, tuple)):
        for v in obj:
            yield from tensors_in(v)


def torch_storages(obj) -> tuple[int, list[str]]:
    """(bytes, sorted dtype names) of the distinct tensor storages reachable
    from obj, which is what torch.save writes as data records."""
    seen: dict[int, int] = {}
    dtypes: set[str] = set()
    for t in tensors_in(obj):
        s = t.untyped_storage()
        seen[s.data_ptr()] = s.nbytes()
        dtypes.add(inspect_dtype(t.dtype))
    return sum(seen.values()), sorted(dtypes)


def torch_shapes(obj) -> list[list[int]]:
    """The shape `ckptfs inspect` must give each distinct storage reachable
    from obj, sorted: that of the first tensor pickled on it when the tensor
    covers the storage contiguously from offset 0 (the pickle's
    _rebuild_tensor size argument), else one flat dimension of elements."""
    shapes: dict[int, list[int]] = {}
    for t in tensors_in(obj):
        s = t.untyped_storage()
        if s.data_ptr() in shapes:
            continue
        elements = s.nbytes() // t.element_size()
        whole = t.dim() >= 1 and t.is_contiguous() and t.storage_offset() == 0 and t.numel() == elements
        shapes[s.data_ptr()] = list(t.shape) if whole else [elements]
    return sorted(shapes.values())


def special_floats(dtype):
    """A small tensor with values where bit-exactness matters: NaN (two
    payloads), +-inf, -0.0, subnormals, max/min."""
    import torch
    f = torch.finfo(dtype)
    vals = torch.tensor([float("nan"), float("inf"), float("-inf"), -0.0, 0.0, f.tiny / 4, -f.tiny / 2,
                         f.max, f.min, f.eps, 1.0, -1.0], dtype=torch.float32).to(dtype)
    # a second NaN payload, so a canonicalising copy would be caught
    raw = vals.view(torch.int16 if f.bits == 16 else torch.int32 if f.bits == 32 else torch.int64).clone()
    raw[4] = raw[0] | 1
    return raw.view(dtype)
