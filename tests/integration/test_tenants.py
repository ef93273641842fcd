"""Hostile tenants, round two (issue 40): no local user can stall, flood or
steer the daemon. A real second user (local_users.py) attacks a root
daemon mounted with allow_other; each section covers one way in, and each
test fails on the binary before issue 40's fixes.

  1. file descriptors: one user's files cannot exhaust the daemon's fds;
  2. the log: nothing a user supplies forges or floods a log line;
  3. sealing: holes cost nothing, unlinked files stop sealing, one user's
     big file does not hold another user's small one;
  4. lossy scope: data files named like parameters stay exact.
"""
from __future__ import annotations

import os
import random
import stat
import time
from pathlib import Path

import pytest

from conftest import describe, run_ckptfs, wait_pid_exit
from local_users import PY, User, shared_mount, shared_top, users  # noqa: F401 (fixtures)


# ------------------------------------------------- 1. bounded file descriptors
# (section 1 tests go here)


# ----------------------------------------------------------- 2. the log
# (section 2 tests go here)


# ----------------------------------------------------- 3. fair, bounded sealing
# A seal skips a sparse file's holes (SEEK_DATA) and stores them as zero
# chunks; rm of a file stops its seal; small files never wait for another
# user's big seal (docs/ARCHITECTURE.md, "Sealing"). Interleavings are
# forced with -o seal_hold, and waits are on the file's state attribute or
# the daemon's log, never on time.

TB = 1 << 40


def seal_mount(mount_factory, shared_top, *opts):
    """A root daemon with allow_other, like shared_mount, with more options."""
    return mount_factory(opts=["allow_other", *opts], backing=shared_top / "backing", mnt=shared_top / "mnt")


def home_of(m, user: User) -> Path:
    d = m.mnt / user.name
    d.mkdir()
    os.chown(d, user.uid, user.gid)
    return d


def wait_until(pred, what: str, timeout: float = 60.0):
    deadline = time.monotonic() + timeout
    while not pred():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(0.05)


def file_state(path: Path) -> str:
    return os.getxattr(path, "user.ckptfs.state").decode()


def wait_sealed(path: Path, what: str, timeout: float = 60.0):
    wait_until(lambda: file_state(path) == "sealed", what, timeout)


def cpu_seconds(pid: int) -> float:
    """User plus system CPU time of a process so far (/proc/PID/stat)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def held_seals(m) -> int:
    return m.log_text().count("seal_hold: a seal waits")


def as_user(user: User, code: str, what: str):
    p = user.run(code)
    assert p.returncode == 0, describe(p, what)


def pwrite_code(path: Path, off: int, data: bytes) -> str:
    return (f"fd = os.open({str(path)!r}, os.O_WRONLY | os.O_CREAT, 0o644)\n"
            f"os.pwrite(fd, {data!r}, {off})\nos.close(fd)\n")


def test_a_terabyte_hole_seals_at_once_and_delays_no_one(mount_factory, shared_top, users):
    atk, vic = users
    m = seal_mount(mount_factory, shared_top)
    sparse, small = home_of(m, atk) / "sparse", home_of(m, vic) / "small"
    cpu_before = cpu_seconds(m.pid)
    as_user(atk, pwrite_code(sparse, TB, b"X"), "the attacker's pwrite at 1 TB")
    as_user(vic, f"open({str(small)!r}, 'wb').write(b'v' * 100000)\n", "the victim's write")
    wait_sealed(small, "the victim's small file to be sealed behind a 1 TB hole")
    wait_sealed(sparse, "the 1 TB sparse file to be sealed")
    spent = cpu_seconds(m.pid) - cpu_before
    assert spent < 20, f"the daemon spent {spent:.1f} CPU-seconds on a file with one byte of data"
    assert os.stat(sparse).st_size == TB + 1
    with open(sparse, "rb") as f:
        assert os.pread(f.fileno(), 2, TB) == b"X"
        assert os.pread(f.fileno(), 1 << 20, TB // 2) == bytes(1 << 20)
        assert os.pread(f.fileno(), 4096, 0) == bytes(4096)
        assert os.pread(f.fileno(), 4096, TB - 4095) == bytes(4095) + b"X"
    assert small.read_bytes() == b"v" * 100000


def test_a_sparse_file_reads_back_exact_after_its_seal(mount_factory, shared_top):
    """Data extents of every shape between holes: inside a chunk, across
    chunk boundaries, at the very end. (A guard for the hole path; the
    binary before issue 40 reads holes as zeros too.)"""
    m = seal_mount(mount_factory, shared_top)
    path, rng = m.mnt / "sparse", random.Random(40)
    mib = 1 << 20
    model = bytearray(64 * mib + 123)
    extents = [(0, 1000), (5 * mib + 7, 3 * mib), (20 * mib, 1), (40 * mib - 100, 200),
               (52 * mib - 1, 4 * mib + 2), (64 * mib + 122, 1)]
    fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o644)
    try:
        os.ftruncate(fd, len(model))
        for off, n in extents:
            data = rng.randbytes(n)
            os.pwrite(fd, data, off)
            model[off:off + n] = data
    finally:
        os.close(fd)
    wait_sealed(path, "the sparse file to be sealed")
    assert path.read_bytes() == bytes(model)


def test_rm_cancels_a_seal_and_umount_does_not_wait_for_it(mount_factory, shared_top, users):
    atk, _ = users
    hold = shared_top / "hold"
    hold.touch()
    try:
        m = seal_mount(mount_factory, shared_top, f"seal_hold={hold}")
        sparse = home_of(m, atk) / "sparse"
        as_user(atk, pwrite_code(sparse, TB, b"X"), "the attacker's pwrite at 1 TB")
        # In progress: its pack is being written in tmp/ (reading holes), or
        # it is held before it publishes.
        wait_until(lambda: any((m.backing / "tmp").iterdir()), "the sparse file's seal to start")
        as_user(atk, f"os.unlink({str(sparse)!r})\n", "the attacker's rm")
        pid = m.live_pid()
        p = run_ckptfs("umount", m.mnt, timeout=60)
        assert p.returncode == 0, describe(p, "failed")
        assert wait_pid_exit(pid, 60), "the daemon still runs 60 s after umount"
        assert hold.exists(), "the hold was not what ended the seal"
        leftovers = [p.name for d in ("staging", "tmp") for p in (m.backing / d).iterdir()]
        assert leftovers == [], f"the deleted file left {leftovers} behind"
    finally:
        hold.unlink(missing_ok=True)


def test_a_big_seal_does_not_keep_another_users_small_file_staged(mount_factory, shared_top, users):
    atk, vic = users
    hold = shared_top / "hold"
    hold.touch()
    try:
        m = seal_mount(mount_factory, shared_top, f"seal_hold={hold}")
        big, small = home_of(m, atk) / "big", home_of(m, vic) / "small"
        as_user(atk, f"with open({str(big)!r}, 'wb') as f:\n"
                     f"    for _ in range(96):\n        f.write(os.urandom(1 << 20))\n", "the attacker's write")
        wait_until(lambda: held_seals(m) == 1, "the attacker's big seal to reach the hold")
        # The only seal thread (seal_threads=1) is busy with the big file.
        as_user(vic, f"open({str(small)!r}, 'wb').write(b'v' * 100000)\n", "the victim's write")
        wait_until(lambda: held_seals(m) == 2, "the victim's seal to run beside the attacker's")
        assert file_state(big) == "staged"
        hold.unlink()
        wait_sealed(small, "the victim's small file to be sealed")
        wait_sealed(big, "the attacker's big file to be sealed")
        assert small.read_bytes() == b"v" * 100000
    finally:
        hold.unlink(missing_ok=True)


# ------------------------------------------------------- 4. lossy scope
# (section 4 tests go here)
