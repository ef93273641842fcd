"""Model-based random test: the same random operation sequence is applied to
the ckptfs mount and to a plain reference directory, and every result (bytes,
sizes, errno) must match. Fixed seed; override with CKPTFS_RANDOM_SEED and
CKPTFS_RANDOM_OPS to explore."""
from __future__ import annotations

import mmap
import os
import random
import stat

import pytest

from helpers import diff_trees, errno_name, gen_data, snapshot_tree

SEED = int(os.environ.get("CKPTFS_RANDOM_SEED", "20240601"))
N_OPS = int(os.environ.get("CKPTFS_RANDOM_OPS", "20000"))
MAX_SIZE = 256 * 1024
DIRS = ["d0", "d1"]
NAMES = [f"{d}/f{i}" for d in DIRS for i in range(4)]
MAX_OPEN = 10
REMOUNT_EVERY = 5000

OPEN_FLAGS = [
    ("rw|creat", os.O_RDWR | os.O_CREAT),
    ("rw", os.O_RDWR),
    ("rw|creat|trunc", os.O_RDWR | os.O_CREAT | os.O_TRUNC),
    ("wr|creat|append", os.O_WRONLY | os.O_CREAT | os.O_APPEND),
    ("rdonly", os.O_RDONLY),
    ("wr|creat|excl", os.O_WRONLY | os.O_CREAT | os.O_EXCL),
]


def outcome(fn):
    try:
        return ("ok", fn())
    except OSError as e:
        return ("err", errno_name(e.errno))
    except ValueError as e:  # mmap of an empty file etc.
        return ("valueerror", str(e))


class Handle:
    def __init__(self, hid, name, flags_name, fd_fs, fd_ref):
        self.hid, self.name, self.flags_name = hid, name, flags_name
        self.fd = {"fs": fd_fs, "ref": fd_ref}

    def __repr__(self):
        return f"h{self.hid}({self.name},{self.flags_name})"


class Runner:
    def __init__(self, fs_root, ref_root, rng):
        self.roots = {"fs": str(fs_root), "ref": str(ref_root)}
        self.rng = rng
        self.handles: list[Handle] = []
        self.next_hid = 0
        self.history: list[str] = []
        self.counts: dict[str, int] = {}

    def path(self, side, name):
        return os.path.join(self.roots[side], name)

    def both(self, desc, fn):
        """fn(side) -> value; runs on both sides and compares."""
        self.history.append(desc)
        r_ref = outcome(lambda: fn("ref"))
        r_fs = outcome(lambda: fn("fs"))
        if r_ref != r_fs:
            def short(r):
                if r[0] == "ok" and isinstance(r[1], bytes) and len(r[1]) > 64:
                    first = -1
                    other = r_ref[1] if r is r_fs else r_fs[1]
                    if isinstance(other, bytes):
                        first = next((i for i, (a, b) in enumerate(zip(r[1], other)) if a != b),
                                     min(len(r[1]), len(other)))
                    return f"ok <{len(r[1])} bytes, first difference at {first}>"
                return repr(r)
            hist = "\n  ".join(self.history[-40:])
            pytest.fail(f"mismatch at op #{len(self.history) - 1}: {desc}\n"
                        f"  ckptfs:    {short(r_fs)}\n  reference: {short(r_ref)}\n"
                        f"recent ops (oldest first):\n  {hist}", pytrace=False)
        return r_ref

    # ---- operations ----------------------------------------------------
    def op_open(self):
        if len(self.handles) >= MAX_OPEN:
            return self.op_close()
        name = self.rng.choice(NAMES)
        fname, flags = self.rng.choice(OPEN_FLAGS)
        fds = {}

        def fn(side):
            fds[side] = os.open(self.path(side, name), flags, 0o644)
            return "opened"
        r = self.both(f"open {name} {fname}", fn)
        if r[0] == "ok":
            h = Handle(self.next_hid, name, fname, fds["fs"], fds["ref"])
            self.next_hid += 1
            self.handles.append(h)
            self.history[-1] += f" -> {h}"

    def op_close(self):
        if not self.handles:
            return self.op_open()
        h = self.handles.pop(self.rng.randrange(len(self.handles)))
        self.both(f"close {h}", lambda side: os.close(h.fd[side]))

    def pick(self):
        return self.rng.choice(self.handles) if self.handles else None

    def op_write(self):
        h = self.pick()
        if h is None:
            return self.op_open()
        rng = self.rng
        if h.flags_name.endswith("append"):
            try:
                cur = os.fstat(h.fd["ref"]).st_size
            except OSError:
                cur = 0
            room = MAX_SIZE - cur
            if room <= 0:
                return self.op_truncate(h)
            data = gen_data(rng, rng.randint(1, min(room, 20_000)))
            self.both(f"write(append) {h} len={len(data)}",
                      lambda side: os.write(h.fd[side], data))
            return
        r = rng.random()
        if r < 0.15:
            off = rng.randint(0, MAX_SIZE - 1)           # anywhere, often past EOF
        else:
            try:
                cur = os.fstat(h.fd["ref"]).st_size
            except OSError:
                cur = 0
            off = rng.randint(max(0, cur - 20_000), min(cur, MAX_SIZE - 1))
        size = rng.choice([1, rng.randint(1, 512), rng.randint(1, 8192), rng.randint(1, 65536)])
        size = max(1, min(size, MAX_SIZE - off))
        data = gen_data(rng, size)
        self.both(f"pwrite {h} off={off} len={size}",
                  lambda side: os.pwrite(h.fd[side], data, off))

    def op_read(self):
        h = self.pick()
        if h is None:
            return self.op_read_path()
        off = self.rng.choice([0, self.rng.randint(0, MAX_SIZE + 100)])
        size = self.rng.choice([1, self.rng.randint(0, 4096), self.rng.randint(0, MAX_SIZE)])
        self.both(f"pread {h} off={off} len={size}",
                  lambda side: os.pread(h.fd[side], size, off))

    def op_read_path(self):
        name = self.rng.choice(NAMES)

        def fn(side):
            with open(self.path(side, name), "rb") as f:
                return f.read()
        self.both(f"read-whole {name}", fn)

    def op_truncate(self, h=None):
        size = self.rng.choice([0, self.rng.randint(0, 4096), self.rng.randint(0, MAX_SIZE)])
        if h is None and self.handles and self.rng.random() < 0.5:
            h = self.pick()
        if h is not None:
            self.both(f"ftruncate {h} {size}", lambda side: os.ftruncate(h.fd[side], size))
        else:
            name = self.rng.choice(NAMES)
            self.both(f"truncate {name} {size}",
                      lambda side: os.truncate(self.path(side, name), size))

    def op_rename(self):
        a, b = self.rng.choice(NAMES), self.rng.choice(NAMES)
        r = self.both(f"rename {a} -> {b}",
                      lambda side: os.rename(self.path(side, a), self.path(side, b)))
        if r[0] == "ok" and a != b:  # keep handle labels truthful (cosmetic)
            for h in self.handles:
                if h.name == b:
                    h.name = f"{b}~replaced"
            for h in self.handles:
                if h.name == a:
                    h.name = b

    def op_unlink(self):
        name = self.rng.choice(NAMES)
        r = self.both(f"unlink {name}", lambda side: os.unlink(self.path(side, name)))
        if r[0] == "ok":
            for h in self.handles:
                if h.name == name:
                    h.name = f"{name}~unlinked"

    def op_fsync(self):
        h = self.pick()
        if h is None:
            return self.op_open()
        if self.rng.random() < 0.5:
            self.both(f"fsync {h}", lambda side: os.fsync(h.fd[side]))
        else:
            self.both(f"fdatasync {h}", lambda side: os.fdatasync(h.fd[side]))

    def op_mmap(self):
        h = self.pick()
        if h is None:
            return self.op_open()

        def fn(side):
            fd = h.fd[side]
            size = os.fstat(fd).st_size
            if size == 0:
                return b""
            with mmap.mmap(fd, size, access=mmap.ACCESS_READ) as m:
                return m[:]
        self.both(f"mmap-read {h}", fn)

    def op_stat(self):
        name = self.rng.choice(NAMES)

        def fn(side):
            st = os.stat(self.path(side, name))
            return (stat.S_IFMT(st.st_mode), st.st_size, stat.S_IMODE(st.st_mode), st.st_nlink)
        self.both(f"stat {name}", fn)

    def op_fstat(self):
        h = self.pick()
        if h is None:
            return self.op_stat()

        def fn(side):
            st = os.fstat(h.fd[side])
            return (stat.S_IFMT(st.st_mode), st.st_size)
        self.both(f"fstat {h}", fn)

    def op_listdir(self):
        d = self.rng.choice(DIRS)
        self.both(f"listdir {d}", lambda side: sorted(os.listdir(self.path(side, d))))

    OPS = [
        ("open", 14), ("close", 10), ("write", 26), ("read", 18), ("read_path", 3),
        ("truncate", 5), ("rename", 4), ("unlink", 3), ("fsync", 3), ("mmap", 4),
        ("stat", 5), ("fstat", 3), ("listdir", 2),
    ]

    def step(self):
        names, weights = zip(*self.OPS)
        op = self.rng.choices(names, weights)[0]
        self.counts[op] = self.counts.get(op, 0) + 1
        getattr(self, "op_" + op)()

    def close_all(self):
        while self.handles:
            h = self.handles.pop()
            self.both(f"close {h}", lambda side: os.close(h.fd[side]))


def compare_trees(fs_root, ref_root, when):
    problems = diff_trees(snapshot_tree(ref_root), snapshot_tree(fs_root))
    assert problems == [], f"tree mismatch {when} (first=reference, second=ckptfs):\n" + \
        "\n".join(problems[:50])


VARIANTS = {  # name -> (mount options, number of ops, seed offset)
    "default": ([], N_OPS, 0),
    "small-chunks": (["chunk_size=64K", "cache_size=4M", "seal_threads=1"],
                     max(2000, N_OPS // 2), 1),
    "writeback": (["writeback", "seal_threads=2"], N_OPS, 2),
}


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_random_ops_match_reference(mount_factory, tmp_path, variant):
    opts, n_ops, seed_offset = VARIANTS[variant]
    m = mount_factory(opts=opts, name=variant)
    ref = tmp_path / f"{variant}-ref"
    ref.mkdir()
    for root in (m.mnt, ref):
        for d in DIRS:
            os.mkdir(os.path.join(root, d))
    rng = random.Random(SEED + seed_offset)
    r = Runner(m.mnt, ref, rng)
    try:
        for i in range(1, n_ops + 1):
            r.step()
            if i % REMOUNT_EVERY == 0 and i != n_ops:
                r.close_all()
                compare_trees(m.mnt, ref, f"after {i} ops")
                m.remount()
                compare_trees(m.mnt, ref, f"after {i} ops + remount")
        r.close_all()
    finally:
        for h in r.handles:  # only after a failure
            for fd in h.fd.values():
                try:
                    os.close(fd)
                except OSError:
                    pass
    compare_trees(m.mnt, ref, "at the end")
    m.wait_sealed()
    compare_trees(m.mnt, ref, "after sealing")
    m.remount()
    compare_trees(m.mnt, ref, "after the final remount")
    print(f"{variant}: {n_ops} ops, seed {SEED}: {sorted(r.counts.items())}")
    assert sum(r.counts.values()) == n_ops
