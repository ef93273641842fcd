"""POSIX lifetime of a file's content (docs/SEMANTICS.md, "Lifetime").

A reader's open() is a LOOKUP and then an OPEN; a writer's rename over the
file can land between the two. The content must then still be there: it
lives until the kernel forgets the inode and the last handle is closed,
as on a local file system, and is freed after that."""
from __future__ import annotations

import glob
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

RACE = Path(__file__).with_name("replace_race.py")


def run_race(mount, writer_mode: str, reader_mode: str, iterations: int, readers: int = 2):
    """Runs one writer replacing `target` and `readers` reader processes until
    the writer is done; returns the readers' reports."""
    target = str(mount.mnt / "target")
    stop = str(mount.mnt.parent / f"{mount.mnt.name}.stop")
    # The first version exists before any reader starts: every read has a file.
    subprocess.run([sys.executable, RACE, writer_mode, target, "1"], check=True, timeout=300)
    procs = [subprocess.Popen([sys.executable, RACE, reader_mode, target, stop],
                              stdout=subprocess.PIPE, text=True) for _ in range(readers)]
    try:
        w = subprocess.run([sys.executable, RACE, writer_mode, target, str(iterations)],
                           capture_output=True, text=True, timeout=900)
        assert w.returncode == 0, f"writer failed:\n{w.stderr}"
    finally:
        Path(stop).touch()
        outs = [p.communicate(timeout=300)[0] for p in procs]
        os.unlink(stop)
    reports = [json.loads(o.strip().splitlines()[-1]) for o in outs]
    for p, o in zip(procs, outs):
        assert p.returncode == 0, f"reader failed: {o}"
    return reports


def assert_all_reads_complete(reports):
    bad = [b for r in reports for b in r["bad"]]
    reads = sum(r["reads"] for r in reports)
    assert not bad, f"{len(bad)} of {reads} reads were not one complete version: {bad[:10]}"
    # The race was exercised: readers kept reading while versions changed.
    assert reads >= 2 * len(reports) and sum(r["versions"] for r in reports) >= 2, reports


def test_open_racing_replace_reads_one_complete_version(mount_factory):
    """Two readers open and read `target` while a writer replaces it 2,000
    times by tmp + os.replace: no empty, short or mixed read. Before the
    content outlived the kernel's lookup, ~0.7% of the reads failed (ENOENT
    from read: the pack or staging file was gone) or came back empty."""
    m = mount_factory()
    reports = run_race(m, "writer", "reader", iterations=2000)
    assert_all_reads_complete(reports)


def test_torch_load_racing_training_loop(mount_factory):
    """torch.load of last.ckpt in a loop while a training loop saves it by
    torch.save to tmp + rename: every load succeeds and is one step's state."""
    pytest.importorskip("torch")
    m = mount_factory()
    reports = run_race(m, "torch-writer", "torch-reader", iterations=600)
    assert_all_reads_complete(reports)


def store_objects(backing: Path):
    packs = sorted(glob.glob(str(backing / "packs" / "*" / "*.pack")))
    staging = sorted(os.listdir(backing / "staging")) if (backing / "staging").exists() else []
    return packs, staging


def wait_for(pred, what: str, timeout: float = 30.0):
    deadline = time.monotonic() + timeout
    while not pred():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def test_content_freed_after_last_close_and_forget(mount_factory):
    """Objects of a file that is replaced or unlinked while open stay until
    the last handle closes and are then deleted while mounted; those of a
    file still open when the daemon dies are collected by the next mount's
    recovery. The store then checks clean."""
    m = mount_factory()
    keep, gone, staged = m.mnt / "keep.bin", m.mnt / "gone.bin", m.mnt / "staged.bin"
    keep.write_bytes(os.urandom(1 << 20))
    m.wait_sealed()
    keep_packs, _ = store_objects(m.backing)
    gone.write_bytes(os.urandom(1 << 20))
    m.wait_sealed()
    gone_pack = sorted(set(store_objects(m.backing)[0]) - set(keep_packs))
    assert len(keep_packs) == 1 and len(gone_pack) == 1, (keep_packs, gone_pack)

    # A sealed file replaced while open, and a staged file unlinked while
    # open for writing: both stay readable (and writable) through their handles.
    old = gone.read_bytes()
    fd_sealed = os.open(gone, os.O_RDONLY)
    fd_staged = os.open(staged, os.O_RDWR | os.O_CREAT, 0o644)
    os.write(fd_staged, b"staged bytes")
    tmp = m.mnt / "gone.tmp"
    tmp.write_bytes(b"new version")
    os.replace(tmp, gone)
    os.unlink(staged)
    try:
        assert os.pread(fd_sealed, 1 << 21, 0) == old
        assert os.pread(fd_staged, 100, 0) == b"staged bytes"
        os.pwrite(fd_staged, b"more", 12)
        assert os.pread(fd_staged, 100, 0) == b"staged bytes" + b"more"
        assert os.path.exists(gone_pack[0])
        assert len(store_objects(m.backing)[1]) >= 1  # the unlinked file's staging file
    finally:
        os.close(fd_sealed)
        os.close(fd_staged)
    # After the last close the kernel forgets the deleted inodes, and their
    # pack and staging file go while mounted: only keep.bin's pack and the
    # new gone.bin's remain.
    m.wait_sealed()
    wait_for(lambda: len(store_objects(m.backing)[0]) == 2 and not store_objects(m.backing)[1],
             "the replaced pack and the unlinked staging file to be deleted")
    assert not os.path.exists(gone_pack[0])
    assert set(keep_packs) <= set(store_objects(m.backing)[0])
    assert gone.read_bytes() == b"new version"

    # The daemon dies while a deleted file is still open: its stub is gone
    # from ns/, so recovery at the next mount collects its pack.
    held = m.mnt / "held.bin"
    held.write_bytes(os.urandom(1 << 20))
    m.wait_sealed()
    fd_held = os.open(held, os.O_RDONLY)
    os.unlink(held)
    assert len(store_objects(m.backing)[0]) == 3
    m.kill9()
    try:
        os.close(fd_held)
    except OSError:
        pass  # the connection is gone
    m.umount()
    m.mount()
    assert len(store_objects(m.backing)[0]) == 2 and not store_objects(m.backing)[1], store_objects(m.backing)
    m.umount()
    fsck = m.fsck()
    assert fsck.returncode == 0, fsck.stdout + fsck.stderr
    m.mount()
    assert keep.stat().st_size == 1 << 20 and gone.read_bytes() == b"new version"
