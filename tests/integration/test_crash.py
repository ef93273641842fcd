"""kill -9 the daemon under concurrent writers; everything that was closed or
fsynced before the kill must survive byte-identical after
`ckptfs umount` (stale mount) + remount, and fsck must be clean."""
from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from conftest import describe, is_mounted, run_ckptfs
from helpers import sha256_file, snapshot_tree

WRITER = Path(__file__).with_name("crash_writer.py")
ROUNDS = int(os.environ.get("CKPTFS_CRASH_ROUNDS", "4"))


class Writers:
    def __init__(self, root: Path, n_procs: int, threads: int, seed: int):
        self.lines: list[list[str]] = []
        self.procs = []
        self.readers = []
        self.lock = threading.Lock()
        self.done_count = 0
        env = dict(os.environ, PYTHONDONTWRITEBYTECODE="1")
        for w in range(n_procs):
            p = subprocess.Popen([sys.executable, str(WRITER), str(root), str(w),
                                  str(seed + w), str(threads)],
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                 text=True, env=env)
            self.procs.append(p)
            buf: list[str] = []
            self.lines.append(buf)
            t = threading.Thread(target=self._read, args=(p, buf), daemon=True)
            t.start()
            self.readers.append(t)

    def _read(self, p, buf):
        for line in p.stdout:
            with self.lock:
                buf.append(line.rstrip("\n"))
                if line.startswith("DONE"):
                    self.done_count += 1

    def wait_done(self, n, timeout):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with self.lock:
                if self.done_count >= n:
                    return
            for p in self.procs:
                if p.poll() is not None:
                    raise AssertionError(f"writer exited early (rc {p.returncode}): "
                                         f"{p.stderr.read()[-3000:]}")
            time.sleep(0.02)
        raise AssertionError(f"writers reported only {self.done_count}/{n} completions "
                             f"in {timeout}s")

    def stop(self):
        for p in self.procs:
            if p.poll() is None:
                p.send_signal(signal.SIGKILL)
        for p in self.procs:
            try:
                p.wait(timeout=60)
            except subprocess.TimeoutExpired:
                raise AssertionError(f"writer {p.pid} stuck after the daemon died "
                                     f"(unkillable: FUSE request never aborted?)")
        for t in self.readers:
            t.join(timeout=30)

    def expectations(self, expect: dict):
        """Folds the event log into expect: path -> sha | None (in flight) | 'GONE'."""
        for buf in self.lines:
            for line in buf:
                parts = line.split(" ")
                if parts[0] == "BEGIN":
                    expect[parts[1]] = None
                elif parts[0] == "DONE":
                    expect[parts[1]] = parts[2]
                elif parts[0] == "GONE":
                    expect[parts[1]] = "GONE"


def verify(expect: dict, root: Path, when: str):
    problems = []
    checked = 0
    for path, want in sorted(expect.items()):
        if want is None:
            continue
        exists = os.path.lexists(path)
        if want == "GONE":
            if exists:
                problems.append(f"{path}: unlinked/renamed away before the kill but exists")
            continue
        if not exists:
            problems.append(f"{path}: closed/fsynced before the kill but missing")
            continue
        try:
            got = sha256_file(path)
        except OSError as e:
            problems.append(f"{path}: read failed: {e}")
            continue
        checked += 1
        if got != want:
            problems.append(f"{path}: content differs (size now {os.path.getsize(path)})")
    # everything else (in flight at the kill) must at least be readable
    try:
        snapshot_tree(root)
    except OSError as e:
        problems.append(f"tree not fully readable: {e}")
    assert not problems, f"{when}: {len(problems)} problems:\n" + "\n".join(problems[:40])
    return checked


def crash_round(m, rnd, expect, n_procs=3, threads=2, min_done=40):
    root = m.mnt / f"round{rnd}"
    root.mkdir()
    w = Writers(root, n_procs, threads, seed=1000 * rnd)
    try:
        w.wait_done(min_done, timeout=300)
        time.sleep(random.Random(rnd).uniform(0.0, 0.3))
        pid = m.kill9()
    finally:
        w.stop()
    w.expectations(expect)
    return pid


def recover(m):
    assert is_mounted(m.mnt), "the stale mount vanished by itself"
    with pytest.raises(OSError):
        os.stat(m.mnt / "anything")  # ENOTCONN on the dead mount
    p = run_ckptfs("umount", m.mnt)
    assert p.returncode == 0, describe(p, "failed on a stale mount")
    assert not is_mounted(m.mnt)
    m.mount()


def test_kill9_under_writers(mount):
    m = mount
    expect: dict = {}
    for rnd in range(ROUNDS):
        crash_round(m, rnd, expect)
        n_durable = sum(1 for v in expect.values() if v not in (None, "GONE"))
        assert n_durable >= 25
        recover(m)
        checked = verify(expect, m.mnt, f"round {rnd} after recovery")
        assert checked == n_durable
        in_flight = sum(1 for v in expect.values() if v is None)
        print(f"round {rnd}: {checked} durable files verified, {in_flight} in flight at "
              f"the kill, {sum(1 for v in expect.values() if v == 'GONE')} removed")
        # the recovered store keeps working: writes, seals, remount
        (m.mnt / f"round{rnd}" / "after.bin").write_bytes(b"after" * 1000)
        m.wait_sealed()
    m.remount()
    verify(expect, m.mnt, "after a clean remount")
    m.umount()
    p = m.fsck()
    assert p.returncode == 0, describe(p, "not clean after crash recovery")
    m.mount()
    verify(expect, m.mnt, "after fsck")


def test_kill9_with_open_fsynced_file_then_fsck(mount):
    """The simplest case, spelled out: one fsynced-and-still-open file, one
    closed file, one file half written, then kill -9."""
    m = mount
    closed = os.urandom(3 << 20) + bytes(1 << 20)
    synced = b"fsynced " * 100_000
    (m.mnt / "closed.bin").write_bytes(closed)
    fd = os.open(m.mnt / "synced.bin", os.O_CREAT | os.O_WRONLY, 0o644)
    os.write(fd, synced)
    os.fsync(fd)
    fd2 = os.open(m.mnt / "partial.bin", os.O_CREAT | os.O_WRONLY, 0o644)
    os.write(fd2, b"p" * 100_000)
    m.kill9()
    for f in (fd, fd2):
        try:
            os.close(f)
        except OSError:
            pass
    recover(m)
    assert (m.mnt / "closed.bin").read_bytes() == closed
    assert (m.mnt / "synced.bin").read_bytes() == synced
    if (m.mnt / "partial.bin").exists():
        (m.mnt / "partial.bin").read_bytes()  # any content, but readable
    m.wait_sealed()
    m.umount()
    p = m.fsck()
    assert p.returncode == 0, describe(p, "not clean after crash recovery")
    m.mount()
    assert (m.mnt / "synced.bin").read_bytes() == synced


def test_kill9_while_sealing_large_file(mount):
    """Kill while the background seal of a just-closed big file runs."""
    m = mount
    rng = random.Random(3)
    data = rng.randbytes(8 << 20) + b"z" * (24 << 20)
    (m.mnt / "big.bin").write_bytes(data)
    m.kill9()  # right after close: sealing is most likely in progress
    recover(m)
    assert (m.mnt / "big.bin").read_bytes() == data
    m.wait_sealed()
    m.remount()
    assert (m.mnt / "big.bin").read_bytes() == data
