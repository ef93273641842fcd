"""A consistent backup of a live store (issue 19): `ckptfs freeze MNT`
stops the daemon (every thread), the store directory is copied with cp -a,
`ckptfs thaw MNT` resumes; the copy is fsck clean, and mounting it gives
back every file sealed before the freeze, bit-exact, while a file that was
still being written is whatever recovery makes of it."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np

from conftest import describe, run_ckptfs


def thread_states(pid: int) -> set[str]:
    states = set()
    for tid in os.listdir(f"/proc/{pid}/task"):
        with open(f"/proc/{pid}/task/{tid}/stat") as f:
            states.add(f.read().rsplit(")", 1)[1].split()[0])
    return states


def test_freeze_copy_thaw_gives_a_clean_store(tmp_path, mount_factory):
    m = mount_factory()
    rng = np.random.default_rng(3)
    w = rng.standard_normal(200_000).astype(np.float32)
    sealed = {}
    for i in range(3):
        w = w + (rng.standard_normal(w.size) * 1e-3).astype(np.float32)
        np.save(m.mnt / f"step{i}.npy", w)
        sealed[f"step{i}.npy"] = (m.mnt / f"step{i}.npy").read_bytes()
    m.wait_sealed()
    # A file open for writing across the freeze, held by another process:
    # a process that closes a file of the frozen mount (as a fork closing
    # inherited fds does) waits for the thaw.
    writer = subprocess.Popen(
        [sys.executable, "-c",
         "import os, sys\n"
         "f = open(sys.argv[1], 'wb'); f.write(os.urandom(3 << 20)); f.flush(); print('ready', flush=True)\n"
         "sys.stdin.readline(); f.write(os.urandom(1 << 20)); f.close()",
         str(m.mnt / "partial.bin")],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert writer.stdout.readline().strip() == "ready"
    (m.mnt / "late.bin").write_bytes(os.urandom(2 << 20))

    copy = tmp_path / "backup"
    fr = run_ckptfs("freeze", m.mnt)
    try:
        assert fr.returncode == 0, describe(fr)
        assert thread_states(m.pid) <= {"T", "t"}, "a daemon thread still runs while frozen"
        cp = subprocess.run(["cp", "-a", str(m.backing), str(copy)], capture_output=True, text=True, timeout=120)
        assert cp.returncode == 0, cp.stderr
    finally:
        th = run_ckptfs("thaw", m.mnt, timeout=30)
    assert th.returncode == 0, describe(th)
    assert not (thread_states(m.pid) <= {"T", "t"}), "the daemon did not resume"
    writer.communicate("go\n", timeout=60)
    assert writer.returncode == 0

    fsck = run_ckptfs("fsck", copy)
    assert fsck.returncode == 0, describe(fsck, "the frozen copy should be clean")
    restored = mount_factory(backing=copy, name="restored")
    for name, data in sealed.items():
        assert (restored.mnt / name).read_bytes() == data, name
    assert (restored.mnt / "late.bin").stat().st_size in (0, 2 << 20)
    restored.umount()
    assert run_ckptfs("fsck", copy).returncode == 0


def test_freeze_refuses_what_is_not_a_ckptfs_mount(tmp_path):
    for cmd in ("freeze", "thaw"):
        p = run_ckptfs(cmd, tmp_path)
        assert p.returncode == 2 and "not a ckptfs mount point" in p.stderr, describe(p)
