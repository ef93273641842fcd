"""Shared machines: with -o allow_other (which turns on default_permissions)
other users reach the mount, the kernel enforces modes, and files a user
creates belong to that user even though the daemon runs as root."""
import os
import shutil
import stat
import subprocess
import tempfile
from pathlib import Path

import pytest

NOBODY = 65534
PY = "/usr/bin/python3"


def as_nobody(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([PY, "-c", code], user=NOBODY, group=NOBODY, extra_groups=[],
                          capture_output=True, text=True, timeout=60, cwd="/")


@pytest.fixture
def shared_mount(mount_factory):
    if os.geteuid() != 0:
        pytest.fail("needs root to switch users (CI runs as root)")
    # pytest's tmp dirs are 0700; other users need a traversable path.
    top = Path(tempfile.mkdtemp(prefix="ckptfs-perm-", dir="/tmp"))
    top.chmod(0o755)
    m = mount_factory(opts=["allow_other"], backing=top / "backing", mnt=top / "mnt")
    os.chmod(m.mnt, 0o755)
    yield m
    shutil.rmtree(top, ignore_errors=True)


def test_allow_other_implies_default_permissions(shared_mount):
    with open("/proc/self/mountinfo") as f:
        line = next(l for l in f if f" {shared_mount.mnt} " in l)
    assert "allow_other" in line and "default_permissions" in line, line


def test_other_user_creates_files_owned_by_them(shared_mount):
    pub = shared_mount.mnt / "pub"
    pub.mkdir()
    pub.chmod(0o777)
    p = as_nobody(f"""
import os
with open({str(pub / 'mine.bin')!r}, 'wb') as f: f.write(b'x' * 1000)
os.mkdir({str(pub / 'mydir')!r})
os.symlink('mine.bin', {str(pub / 'link')!r})
os.chmod({str(pub / 'mine.bin')!r}, 0o600)
""")
    assert p.returncode == 0, p.stderr
    for name in ("mine.bin", "mydir", "link"):
        st = os.lstat(pub / name)
        assert (st.st_uid, st.st_gid) == (NOBODY, NOBODY), name
    assert stat.S_IMODE(os.stat(pub / "mine.bin").st_mode) == 0o600
    assert (pub / "mine.bin").read_bytes() == b"x" * 1000
    shared_mount.remount()  # ownership is stored, not just cached
    assert os.stat(pub / "mine.bin").st_uid == NOBODY


def test_modes_are_enforced_for_other_users(shared_mount):
    secret = shared_mount.mnt / "secret.bin"
    secret.write_bytes(b"s" * 100)
    secret.chmod(0o600)
    public = shared_mount.mnt / "public.bin"
    public.write_bytes(b"p" * 100)
    public.chmod(0o644)
    p = as_nobody(f"""
import errno, os
def code(fn):
    try:
        fn(); return 0
    except OSError as e:
        return e.errno
print(code(lambda: open({str(secret)!r}, 'rb').read()))
print(code(lambda: open({str(public)!r}, 'ab').write(b'z')))
print(code(lambda: os.unlink({str(public)!r})))
print(code(lambda: os.chown({str(public)!r}, {NOBODY}, {NOBODY})))
print(len(open({str(public)!r}, 'rb').read()))
""")
    assert p.returncode == 0, p.stderr
    import errno
    read_secret, append_public, unlink_public, chown_public, public_len = p.stdout.split()
    assert int(read_secret) == errno.EACCES
    assert int(append_public) == errno.EACCES
    assert int(unlink_public) == errno.EACCES  # mount root is 0755 root-owned
    assert int(chown_public) == errno.EPERM
    assert int(public_len) == 100
    assert public.read_bytes() == b"p" * 100 and secret.read_bytes() == b"s" * 100
