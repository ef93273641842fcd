"""Shared helpers for the integration tests (data generation, tree compare)."""
from __future__ import annotations

import ctypes
import ctypes.util
import errno
import hashlib
import os
import random
import stat
import time
from pathlib import Path

AT_FDCWD = -100
RENAME_NOREPLACE = 1
RENAME_EXCHANGE = 2

_libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)


def renameat2(old, new, flags: int) -> None:
    fn = _libc.renameat2
    fn.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
    fn.restype = ctypes.c_int
    if fn(AT_FDCWD, os.fsencode(str(old)), AT_FDCWD, os.fsencode(str(new)), flags) != 0:
        e = ctypes.get_errno()
        raise OSError(e, os.strerror(e), str(old), None, str(new))


_WORDS = (b"tensor weight bias layer.0 attention.q_proj mlp.fc1 exp_avg exp_avg_sq "
          b"step lr betas eps weight_decay amsgrad module. running_mean num_batches ").split()


def gen_data(rng: random.Random, n: int, kind: str | None = None) -> bytes:
    """Deterministic test data of length n. Kinds: random, zeros, text,
    pattern, mixed (default: pick one)."""
    if n <= 0:
        return b""
    kind = kind or rng.choice(["random", "zeros", "text", "pattern", "mixed"])
    if kind == "random":
        return rng.randbytes(n)
    if kind == "zeros":
        return bytes(n)
    if kind == "text":
        out = bytearray()
        while len(out) < n:
            out += rng.choice(_WORDS) + b" "
        return bytes(out[:n])
    if kind == "pattern":
        unit = rng.randbytes(rng.randint(1, 64))
        return (unit * (n // len(unit) + 1))[:n]
    # mixed: runs of the other kinds
    out = bytearray()
    while len(out) < n:
        k = rng.choice(["random", "zeros", "text", "pattern"])
        out += gen_data(rng, min(n - len(out), rng.randint(1, 64 * 1024)), k)
    return bytes(out)


def float_like(rng: random.Random, n: int) -> bytes:
    """Bytes that look like float32 weights (compressible a bit, like real ones)."""
    import numpy as np
    g = np.random.default_rng(rng.getrandbits(32))
    a = (g.standard_normal(n // 4 + 1) * 0.02).astype(np.float32)
    return a.tobytes()[:n]


def pread_all(fd: int, size: int, off: int = 0) -> bytes:
    """Reads up to `size` bytes at `off`, looping over short reads."""
    out = bytearray()
    while len(out) < size:
        b = os.pread(fd, size - len(out), off + len(out))
        if not b:
            break
        out += b
    return bytes(out)


def apply_pwrite(model: bytearray, off: int, chunk: bytes) -> None:
    """What pwrite(fd, chunk, off) does to a file whose bytes are `model`."""
    if off > len(model):
        model += bytes(off - len(model))
    model[off:off + len(chunk)] = chunk


def sha256_file(path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while True:
            b = f.read(1 << 20)
            if not b:
                return h.hexdigest()
            h.update(b)


def read_file(path) -> bytes:
    with open(path, "rb") as f:
        return f.read()


def snapshot_tree(root, with_meta=False) -> dict:
    """{relpath: (kind, payload)} for everything under root.
    kind 'f' -> (size, sha256), 'd' -> None, 'l' -> readlink target."""
    root = Path(root)
    out = {}
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames.sort()
        for name in sorted(dirnames + filenames):
            p = os.path.join(dirpath, name)
            rel = os.path.relpath(p, root)
            st = os.lstat(p)
            if stat.S_ISLNK(st.st_mode):
                entry = ("l", os.readlink(p))
            elif stat.S_ISDIR(st.st_mode):
                entry = ("d", None)
            else:
                entry = ("f", (st.st_size, sha256_file(p)))
            if with_meta:
                entry = entry + (stat.S_IMODE(st.st_mode), st.st_mtime_ns)
            out[rel] = entry
    return out


def diff_trees(a: dict, b: dict) -> list[str]:
    problems = []
    for k in sorted(set(a) | set(b)):
        if k not in a:
            problems.append(f"only in second: {k} {b[k]}")
        elif k not in b:
            problems.append(f"only in first: {k} {a[k]}")
        elif a[k] != b[k]:
            problems.append(f"differs: {k}: {a[k]} != {b[k]}")
    return problems


def assert_trees_equal(a: dict, b: dict, what: str = "trees differ"):
    problems = diff_trees(a, b)
    assert not problems, f"{what} ({len(problems)}):\n" + "\n".join(problems[:40])


def errno_name(e: int | None) -> str:
    return errno.errorcode.get(e, str(e)) if e is not None else "OK"


def parse_metrics(text: str) -> dict[str, float]:
    """Prometheus text exposition as {series: value}, comments skipped."""
    series = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, value = line.rsplit(" ", 1)
            series[name] = float(value)
    return series


def wait_for(pred, what: str, timeout: float = 60.0):
    """Polls `pred` until it holds: a wait on an event the test can see (a
    state attribute, a log line, a file), with `timeout` only as the bound
    after which the test fails."""
    deadline = time.monotonic() + timeout
    while not pred():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(0.05)
