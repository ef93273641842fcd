"""The golden stores (tests/data/golden/): how their files are written
through a mount, and a reader of the stub and pack fields (docs/FORMAT.md)
that tell which pack a file has and what in it may differ between two
writes of the same input. Shared by tests/data/golden/make_store.py, which
made the stores with the binaries of older commits, and
test_golden_stores.py, which reads them with today's.
"""
from __future__ import annotations

import json
import os
import struct
import subprocess
import time
from pathlib import Path

GOLDEN = Path(__file__).resolve().parents[1] / "data" / "golden"
INPUTS = GOLDEN / "inputs"
CODEC_NAMES = {0: "raw", 1: "zstd", 2: "zero", 3: "tensor", 4: "ref", 5: "delta", 6: "lossy"}
STORED_AGAINST_BASE = (4, 5, 6)  # ref, delta, lossy: payload starts with u64 base pack id, u64 offset


def wait_sealed(ckptfs, mnt, timeout: float = 120.0):
    """Polls `ckptfs stats --json` (every version has it) until no file is staged."""
    deadline = time.monotonic() + timeout
    while True:
        p = subprocess.run([str(ckptfs), "stats", "--json", str(mnt)], capture_output=True, text=True,
                           timeout=180)
        if p.returncode != 0:
            raise AssertionError(f"ckptfs stats: exit {p.returncode}: {p.stderr}")
        if not any(f.get("staged") for f in json.loads(p.stdout).get("files", [])):
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"files still staged after {timeout}s")
        time.sleep(0.1)


def input_of(step) -> str:
    """The input file (under INPUTS) a write or copy step writes."""
    return step[2] if step[0] == "copy" else step[1]


def apply_steps(ckptfs, mnt: Path, steps):
    """Writes the store's namespace through the mount, in order; each file
    is sealed before the next is written, so predecessors and dedup
    candidates are published packs and every run makes the same choices."""
    for step in steps:
        op, path = step[0], Path(mnt) / step[1]
        if op == "mkdir":
            path.mkdir()
        elif op == "policy":
            os.setxattr(path, "user.ckptfs.policy", step[2].encode())
        elif op == "symlink":
            path.symlink_to(step[2])
        elif op in ("write", "copy"):
            with open(path, "wb") as f:
                f.write((INPUTS / input_of(step)).read_bytes())
            wait_sealed(ckptfs, mnt)
        else:
            raise ValueError(f"unknown step {step!r}")


def stub_object(stub: Path) -> int:
    """The object the stub's current slot names (the slot with the valid
    magic and the higher generation; a torn slot is not expected here)."""
    data = stub.read_bytes()
    best = (-1, 0)
    for off in range(0, len(data) - 63, 64):
        if data[off:off + 4] == b"CKST":
            gen, _size, obj = struct.unpack_from("<QQQ", data, off + 8)
            best = max(best, (gen, obj))
    return best[1]


def pack_path(backing: Path, obj: int) -> Path:
    hexid = f"{obj:016x}"
    return Path(backing) / "packs" / hexid[:2] / f"{hexid}.pack"


class Pack:
    """Header, chunk table and meta block offsets of one pack's bytes."""

    def __init__(self, data: bytes):
        self.data = data
        self.version, = struct.unpack_from("<I", data, 8)
        self.chunk_count, = struct.unpack_from("<Q", data, 32)
        self.meta_offset, = struct.unpack_from("<Q", data, 40)
        self.meta_len, = struct.unpack_from("<I", data, 48)
        self.table_offset, = struct.unpack_from("<Q", data, len(data) - 32)
        self.entries = []  # (payload offset, stored length, codec)
        for i in range(self.chunk_count):
            e = self.table_offset + 40 * i
            off, stored = struct.unpack_from("<QI", data, e)
            self.entries.append((off, stored, data[e + 16]))

    def codecs(self) -> list[str]:
        return [CODEC_NAMES[c] for _, _, c in self.entries]

    def normalized(self, idmap: dict[int, int]) -> bytes:
        """The pack with what a second write of the same input legitimately
        changes taken out: base pack ids (random object ids) mapped through
        `idmap`, the meta block's sealed-at time and the checksums that
        cover those fields (the stored checksums of chunks against a base,
        the meta block's, the table's) zeroed."""
        b = bytearray(self.data)

        def remap(at):
            old, = struct.unpack_from("<Q", b, at)
            struct.pack_into("<Q", b, at, idmap.get(old, old))

        for i, (off, _stored, codec) in enumerate(self.entries):
            if codec in STORED_AGAINST_BASE:
                remap(off)
                struct.pack_into("<Q", b, self.table_offset + 40 * i + 24, 0)
        if self.version >= 3:
            m = self.meta_offset
            struct.pack_into("<Q", b, m + 8, 0)
            bases, = struct.unpack_from("<I", b, m + 16)
            for k in range(bases):
                remap(m + 32 + 8 * k)
            struct.pack_into("<Q", b, m + self.meta_len - 8, 0)
        struct.pack_into("<Q", b, len(b) - 16, 0)
        return bytes(b)

    def region(self, at: int) -> str:
        """Which part of the pack byte `at` is in, for messages."""
        if at < 64:
            return "header"
        for i, (off, stored, codec) in enumerate(self.entries):
            if off <= at < off + stored:
                return f"chunk {i} payload ({CODEC_NAMES[codec]}), byte {at - off}"
        if self.version >= 3 and self.meta_offset <= at < self.meta_offset + self.meta_len:
            return f"meta block byte {at - self.meta_offset}"
        if at < len(self.data) - 32:
            return f"chunk table entry {(at - self.table_offset) // 40}"
        return "footer"
