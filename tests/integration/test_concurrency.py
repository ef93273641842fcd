"""Concurrency around the background seal: readers while a file is sealed,
writes that race a seal, many files at once; plus store hygiene (no orphaned
packs or staging files once everything is sealed and unmounted)."""
from __future__ import annotations

import glob
import os
import random
import threading
from concurrent.futures import ThreadPoolExecutor

from helpers import apply_pwrite, gen_data, pread_all, read_file

MiB = 1 << 20


def test_readers_during_seal(mount):
    rng = random.Random(1)
    data = gen_data(rng, 40 * MiB, "mixed")
    p = mount.mnt / "sealing.bin"
    p.write_bytes(data)  # the seal starts in the background right after close
    stop = threading.Event()
    errors = []

    def reader(seed):
        r = random.Random(seed)
        fd = os.open(p, os.O_RDONLY)
        try:
            while not stop.is_set():
                off = r.randint(0, len(data) - 1)
                n = r.randint(1, 3 * MiB)
                got = pread_all(fd, n, off)
                if got != data[off:off + n]:
                    errors.append(f"reader {seed}: wrong bytes at {off}+{n}")
                    return
        except OSError as e:
            errors.append(f"reader {seed}: {e!r}")
        finally:
            os.close(fd)

    ts = [threading.Thread(target=reader, args=(i,)) for i in range(4)]
    for t in ts:
        t.start()
    try:
        mount.wait_sealed()
    finally:
        stop.set()
        for t in ts:
            t.join()
    assert not errors, errors
    assert read_file(p) == data


def test_writes_racing_the_seal(mount):
    """Close, then immediately reopen and modify, many times: a seal that
    started on an older version must never win."""
    rng = random.Random(2)
    model = bytearray(gen_data(rng, 12 * MiB, "random"))
    p = mount.mnt / "racy.bin"
    p.write_bytes(bytes(model))
    for i in range(25):
        fd = os.open(p, os.O_RDWR)
        try:
            for _ in range(rng.randint(1, 3)):
                off = rng.randint(0, len(model) + 1000)
                chunk = gen_data(rng, rng.randint(1, 200_000))
                os.pwrite(fd, chunk, off)
                apply_pwrite(model, off, chunk)
            if i % 5 == 4:
                n = rng.randint(len(model) // 2, len(model))
                os.ftruncate(fd, n)
                del model[n:]
        finally:
            os.close(fd)
        if i % 3 == 0:
            assert read_file(p) == bytes(model), f"iteration {i}"
    mount.wait_sealed()
    assert read_file(p) == bytes(model)
    mount.remount()
    assert read_file(p) == bytes(model)


def test_unlink_and_rename_racing_the_seal(mount):
    rng = random.Random(3)
    a = gen_data(rng, 16 * MiB, "random")
    b = gen_data(rng, 16 * MiB, "text")
    (mount.mnt / "victim").write_bytes(a)
    os.unlink(mount.mnt / "victim")  # while its seal runs
    (mount.mnt / "moved").write_bytes(b)
    os.rename(mount.mnt / "moved", mount.mnt / "final")  # while its seal runs
    (mount.mnt / "over").write_bytes(a)
    os.rename(mount.mnt / "final", mount.mnt / "over")  # replace a file being sealed
    mount.wait_sealed()
    assert os.listdir(mount.mnt) == ["over"]
    assert read_file(mount.mnt / "over") == b
    mount.remount()
    assert os.listdir(mount.mnt) == ["over"]
    assert read_file(mount.mnt / "over") == b


def test_many_files_parallel(mount):
    def work(i):
        r = random.Random(i)
        d = mount.mnt / f"dir{i % 4}"
        d.mkdir(exist_ok=True)
        out = {}
        for j in range(15):
            data = gen_data(r, r.randint(0, 2 * MiB))
            path = d / f"t{i}-{j}.bin"
            path.write_bytes(data)
            out[path] = data
            if j % 4 == 0:
                assert read_file(path) == data
        return out

    expected = {}
    with ThreadPoolExecutor(8) as ex:
        for out in ex.map(work, range(8)):
            expected.update(out)
    for path, data in expected.items():
        assert read_file(path) == data, path
    st = mount.wait_sealed()
    assert len([f for f in st["files"]]) == len(expected)
    mount.remount()
    for path, data in expected.items():
        assert read_file(path) == data, path


def test_store_hygiene_after_churn(mount):
    """After overwrites, truncates, unlinks, renames and a clean unmount there
    is one pack per file (none orphaned) and no staging leftovers."""
    rng = random.Random(4)
    root = mount.mnt
    names = [f"f{i}" for i in range(10)]
    for step in range(120):
        n = rng.choice(names)
        op = rng.choice(["write", "write", "overwrite", "truncate", "unlink", "rename"])
        try:
            if op == "write":
                (root / n).write_bytes(gen_data(rng, rng.randint(0, 600_000)))
            elif op == "overwrite":
                with open(root / n, "r+b") as f:
                    f.seek(rng.randint(0, 300_000))
                    f.write(gen_data(rng, rng.randint(1, 100_000)))
            elif op == "truncate":
                os.truncate(root / n, rng.randint(0, 700_000))
            elif op == "unlink":
                os.unlink(root / n)
            else:
                os.rename(root / n, root / rng.choice(names))
        except FileNotFoundError:
            pass
    mount.wait_sealed()
    inodes = {os.stat(root / n).st_ino: os.stat(root / n).st_size for n in os.listdir(root)}
    nonempty = [i for i, size in inodes.items() if size > 0]
    mount.umount()
    packs = glob.glob(str(mount.backing / "packs" / "*" / "*.pack"))
    staging = os.listdir(mount.backing / "staging") if (mount.backing / "staging").exists() else []
    assert staging == [], f"staging leftovers after a clean unmount: {staging}"
    # one pack per non-empty file; an empty file may or may not have one
    assert len(nonempty) <= len(packs) <= len(inodes), (
        f"{len(packs)} packs for {len(inodes)} files ({len(nonempty)} non-empty): "
        f"orphaned or missing packs")
    # Offline, after the kernel has forgotten every inode: while mounted, the
    # pack of an unlinked file stays until the kernel's FORGET for it arrives,
    # which it sends when it pleases.
    st = mount.stats(mount.backing)
    assert sum(e["stored"] for e in st["files"]) == st["total"]["stored"], st["total"]
    mount.mount()
