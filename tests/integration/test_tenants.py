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

import json
import os
import stat
import subprocess
import threading
from pathlib import Path

import pytest

from conftest import CKPTFS, describe, run_ckptfs
from local_users import PY, User, shared_mount, shared_top, users  # noqa: F401 (fixtures)


# ------------------------------------------------- 1. bounded file descriptors
# The daemon held two fds per inode the kernel cached, so one user's files
# took it to its RLIMIT_NOFILE and then everyone got EMFILE. Its fds are
# now bounded by max_fds, by default the soft limit less an eighth
# (fuse/fs.h DefaultMaxFds), whatever the kernel caches. bench/fd_flood.py
# runs the same attack at 100,000 files.

FD_LIMIT = 1024        # the daemon's RLIMIT_NOFILE, soft and hard, in test 1a
FD_BOUND = FD_LIMIT - max(64, FD_LIMIT // 8)  # the default max_fds under it
ATTACK_FILES = 20_000  # made and listed (`ls -l`) by one user


def daemon_fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


class FdSampler:
    """The most fds the daemon held while the block ran, sampled as fast as
    /proc allows (a lower bound of the true peak; the count after the attack,
    with every inode still cached by the kernel, is the deterministic one)."""

    def __init__(self, pid: int):
        self.pid, self.peak = pid, daemon_fds(pid)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self):
        while not self._stop.is_set():
            try:
                self.peak = max(self.peak, daemon_fds(self.pid))
            except OSError:
                return

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()


def user_dirs(m, users) -> tuple[Path, Path]:
    attacker, victim = users
    atk, vic = m.mnt / "atk", m.mnt / "vic"
    for d, u in ((atk, attacker), (vic, victim)):
        d.mkdir()
        os.chown(d, u.uid, u.gid)
    return atk, vic


def flood(attacker, atk: Path, files: int) -> dict:
    """The attacker makes `files` empty files and lists them like `ls -l`,
    going on past errors; returns what it made, listed and the errors."""
    p = attacker.run(f"""
made = listed = 0
errors = {{}}
def err(e):
    name = errno.errorcode.get(e.errno, str(e.errno))
    errors[name] = errors.get(name, 0) + 1
for i in range({files}):
    try:
        os.close(os.open({str(atk)!r} + "/f%d" % i, os.O_CREAT | os.O_WRONLY, 0o644))
        made += 1
    except OSError as e:
        err(e)
try:
    for e in os.scandir({str(atk)!r}):
        try:
            e.stat(follow_symlinks=False)
            listed += 1
        except OSError as x:
            err(x)
except OSError as e:
    err(e)
print(json.dumps({{"made": made, "listed": listed, "errors": errors}}))
""")
    assert p.returncode == 0, describe(p, "attacker's flood")
    return json.loads(p.stdout)


OLD_BYTES = "bytes(range(256)) * 4096"  # the victim's file written before the flood, 1 MiB
WRONG = "(_ for _ in ()).throw(OSError(errno.EIO, 'wrong bytes'))"


def victim_works(victim, vic: Path) -> dict[str, str]:
    """The victim's everyday calls after the flood: read a file written
    before it, create and read back a new one, list its directory."""
    return victim.attempts({
        "read old": f"open({str(vic / 'old')!r}, 'rb').read() == {OLD_BYTES} or {WRONG}",
        "create": f"open({str(vic / 'new')!r}, 'wb').write(b'fresh')",
        "read new": f"open({str(vic / 'new')!r}, 'rb').read() == b'fresh' or {WRONG}",
        "ls": f"os.listdir({str(vic)!r})",
        "stat": f"os.stat({str(vic / 'old')!r})",
    })


def test_one_users_files_cannot_exhaust_the_daemons_fds(users, shared_top, mount_factory):
    """1a. Under RLIMIT_NOFILE 1024 (prlimit, soft and hard, so the daemon
    cannot raise it), one user makes and lists 20,000 files: the daemon's fds
    stay under the default bound and the other user's reads and creates work.
    Before issue 40 the daemon reached 1024 fds and both users got EMFILE."""
    attacker, victim = users
    m = mount_factory(opts=["allow_other"], backing=shared_top / "backing", mnt=shared_top / "mnt", mount=False)
    p = subprocess.run(["prlimit", f"--nofile={FD_LIMIT}:{FD_LIMIT}", str(CKPTFS), *map(str, m.mount_args())],
                       capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL)
    assert p.returncode == 0, describe(p, "mount under prlimit")
    m.pid = m.wait_live_pid()
    assert m.pid, "no daemon"
    atk, vic = user_dirs(m, users)
    assert victim.attempts({"write old": f"open({str(vic / 'old')!r}, 'wb').write({OLD_BYTES})"}) \
        == {"write old": "OK"}
    with FdSampler(m.pid) as sampler:
        got = flood(attacker, atk, ATTACK_FILES)
        after = victim_works(victim, vic)
    held = daemon_fds(m.pid)
    print(f"fds: peak {sampler.peak}, after {held} (limit {FD_LIMIT}, bound {FD_BOUND}); attacker {got}")
    assert after == dict.fromkeys(after, "OK"), f"the victim's calls failed: {after} (daemon at {held} fds)"
    assert got == {"made": ATTACK_FILES, "listed": ATTACK_FILES, "errors": {}}, \
        "the attacker's own calls saw the daemon's fd limit"
    assert sampler.peak < FD_BOUND and held < FD_BOUND, \
        f"daemon held {max(sampler.peak, held)} fds, bound {FD_BOUND} (limit {FD_LIMIT})"


def test_max_fds_bounds_the_daemons_fds(users, shared_top, mount_factory):
    """1b. -o max_fds=N bounds the fds whatever the rlimit: 5,000 files made
    and listed keep a max_fds=192 daemon under 192 fds, and both users' calls
    work. (The binary before issue 40 refuses the option.)"""
    attacker, victim = users
    m = mount_factory(opts=["allow_other", "max_fds=192"], backing=shared_top / "backing",
                      mnt=shared_top / "mnt")
    atk, vic = user_dirs(m, users)
    assert victim.attempts({"write old": f"open({str(vic / 'old')!r}, 'wb').write({OLD_BYTES})"}) \
        == {"write old": "OK"}
    with FdSampler(m.pid) as sampler:
        got = flood(attacker, atk, 5000)
        after = victim_works(victim, vic)
    held = daemon_fds(m.pid)
    print(f"fds: peak {sampler.peak}, after {held} (max_fds 192); attacker {got}")
    assert after == dict.fromkeys(after, "OK"), f"the victim's calls failed: {after}"
    assert got == {"made": 5000, "listed": 5000, "errors": {}}
    assert sampler.peak < 192 and held < 192, f"daemon held {max(sampler.peak, held)} fds over max_fds=192"


# ----------------------------------------------------------- 2. the log
# (section 2 tests go here)


# ----------------------------------------------------- 3. fair, bounded sealing
# (section 3 tests go here)


# ------------------------------------------------------- 4. lossy scope
# (section 4 tests go here)
