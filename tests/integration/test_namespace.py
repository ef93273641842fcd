"""Every namespace / file operation through a real ckptfs mount."""
from __future__ import annotations

import errno
import mmap
import os
import random
import stat

import pytest

from helpers import (RENAME_NOREPLACE, assert_trees_equal, gen_data, pread_all, read_file, renameat2,
                     snapshot_tree)

MiB = 1 << 20


def pwrite_all(fd, data, off):
    done = 0
    mv = memoryview(data)
    while done < len(data):
        done += os.pwrite(fd, mv[done:], off + done)


def assert_errno(err, fn, *args, **kw):
    with pytest.raises(OSError) as ei:
        fn(*args, **kw)
    assert ei.value.errno == err, (
        f"expected {errno.errorcode[err]}, got {errno.errorcode.get(ei.value.errno)}: {ei.value}")


# --------------------------------------------------------------- basic I/O
def test_create_write_read(mount):
    p = mount.mnt / "hello.txt"
    p.write_bytes(b"hello ckptfs\n")
    assert p.read_bytes() == b"hello ckptfs\n"
    st = os.stat(p)
    assert stat.S_ISREG(st.st_mode)
    assert st.st_size == 13
    assert os.listdir(mount.mnt) == ["hello.txt"]


def test_empty_file(mount):
    p = mount.mnt / "empty"
    fd = os.open(p, os.O_CREAT | os.O_WRONLY | os.O_EXCL, 0o644)
    os.close(fd)
    assert os.stat(p).st_size == 0
    assert p.read_bytes() == b""
    mount.remount()
    assert os.stat(p).st_size == 0
    assert p.read_bytes() == b""


def test_open_errors(mount):
    p = mount.mnt / "x"
    assert_errno(errno.ENOENT, os.open, p, os.O_RDONLY)
    p.write_bytes(b"1")
    assert_errno(errno.EEXIST, os.open, p, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
    fd = os.open(p, os.O_RDONLY)
    try:
        assert_errno(errno.EBADF, os.write, fd, b"x")
    finally:
        os.close(fd)
    assert_errno(errno.ENOENT, os.stat, mount.mnt / "nope" / "x")
    assert_errno(errno.ENOTDIR, os.stat, p / "x")


def test_random_offset_writes_and_reads(mount):
    rng = random.Random(1234)
    p = mount.mnt / "rand.bin"
    model = bytearray()
    fd = os.open(p, os.O_CREAT | os.O_RDWR, 0o644)
    try:
        for _ in range(300):
            off = rng.randint(0, 6 * MiB)
            data = gen_data(rng, rng.randint(1, 200_000))
            pwrite_all(fd, data, off)
            if len(model) < off:
                model += bytes(off - len(model))
            model[off:off + len(data)] = data
            ro = rng.randint(0, len(model))
            rl = rng.randint(0, 300_000)
            assert pread_all(fd, rl, ro) == bytes(model[ro:ro + rl])
        assert os.fstat(fd).st_size == len(model)
        assert pread_all(fd, len(model) + 10) == bytes(model)
    finally:
        os.close(fd)
    assert read_file(p) == bytes(model)
    mount.wait_sealed()
    # reads after sealing, random ranges across chunk boundaries
    fd = os.open(p, os.O_RDONLY)
    try:
        for _ in range(200):
            ro = rng.randint(0, len(model))
            rl = rng.randint(0, 5 * MiB)
            assert pread_all(fd, rl, ro) == bytes(model[ro:ro + rl])
    finally:
        os.close(fd)
    # overwrite parts of the sealed file, then check again after remount
    fd = os.open(p, os.O_RDWR)
    try:
        for _ in range(20):
            off = rng.randint(0, len(model) - 1)
            data = gen_data(rng, rng.randint(1, 100_000))
            pwrite_all(fd, data, off)
            if len(model) < off + len(data):
                model += bytes(off + len(data) - len(model))
            model[off:off + len(data)] = data
    finally:
        os.close(fd)
    assert read_file(p) == bytes(model)
    mount.remount()
    assert read_file(p) == bytes(model)


def test_multi_chunk_file(mount):
    rng = random.Random(7)
    data = gen_data(rng, 9 * MiB + 12345, "mixed")
    p = mount.mnt / "big.bin"
    with open(p, "wb") as f:
        for i in range(0, len(data), 1 << 20):
            f.write(data[i:i + (1 << 20)])
    assert read_file(p) == data
    mount.wait_sealed()
    assert read_file(p) == data
    mount.remount()
    assert os.stat(p).st_size == len(data)
    assert read_file(p) == data


def test_o_append(mount):
    p = mount.mnt / "log"
    p.write_bytes(b"0123456789")
    fd = os.open(p, os.O_WRONLY | os.O_APPEND)
    try:
        os.lseek(fd, 0, os.SEEK_SET)
        assert os.write(fd, b"abc") == 3
        os.lseek(fd, 2, os.SEEK_SET)
        os.write(fd, b"def")
        assert os.lseek(fd, 0, os.SEEK_CUR) == 16
    finally:
        os.close(fd)
    assert p.read_bytes() == b"0123456789abcdef"
    with open(p, "ab") as f:
        f.write(b"XYZ")
    assert p.read_bytes() == b"0123456789abcdefXYZ"
    mount.remount()
    assert p.read_bytes() == b"0123456789abcdefXYZ"


def test_o_trunc(mount):
    p = mount.mnt / "t"
    p.write_bytes(b"x" * 100_000)
    mount.wait_sealed()
    fd = os.open(p, os.O_WRONLY | os.O_TRUNC)
    try:
        assert os.fstat(fd).st_size == 0
        os.write(fd, b"new")
    finally:
        os.close(fd)
    assert p.read_bytes() == b"new"
    # O_TRUNC reopen without writing: stays empty
    os.close(os.open(p, os.O_WRONLY | os.O_TRUNC))
    assert os.stat(p).st_size == 0
    assert p.read_bytes() == b""
    mount.remount()
    assert p.read_bytes() == b""


def test_sparse_hole(mount):
    p = mount.mnt / "sparse"
    far = 64 * MiB + 17
    fd = os.open(p, os.O_CREAT | os.O_RDWR, 0o644)
    try:
        os.write(fd, b"head")
        os.pwrite(fd, b"tail", far)
        assert os.fstat(fd).st_size == far + 4
        assert os.pread(fd, 4, 0) == b"head"
        assert os.pread(fd, 1 << 16, 4) == bytes(1 << 16)
        assert os.pread(fd, 1000, far - 1000) == bytes(1000)
        assert os.pread(fd, 10, far) == b"tail"
        assert os.pread(fd, 10, far + 4) == b""
    finally:
        os.close(fd)
    assert os.stat(p).st_size == far + 4
    mount.wait_sealed()
    mount.remount()
    assert os.stat(p).st_size == far + 4
    with open(p, "rb") as f:
        assert f.read(4) == b"head"
        f.seek(32 * MiB)
        assert f.read(MiB) == bytes(MiB)
        f.seek(far)
        assert f.read() == b"tail"
    # the hole is stored cheaply
    st = mount.stats()
    ent = [e for e in st["files"] if e["path"].lstrip("/") == "sparse"]
    assert ent and ent[0]["logical"] == far + 4
    assert ent[0]["stored"] < 8 * MiB, ent


@pytest.mark.parametrize("how", ["path", "fd"])
def test_truncate_up_and_down(mount, how):
    rng = random.Random(5)
    p = mount.mnt / f"trunc-{how}"
    data = gen_data(rng, 300_000, "random")
    p.write_bytes(data)

    def trunc(n):
        if how == "path":
            os.truncate(p, n)
        else:
            fd = os.open(p, os.O_RDWR)
            try:
                os.ftruncate(fd, n)
                assert os.fstat(fd).st_size == n
            finally:
                os.close(fd)
        assert os.stat(p).st_size == n

    trunc(1000)
    assert p.read_bytes() == data[:1000]
    trunc(50_000)  # extending must expose zeros, never the old bytes
    assert p.read_bytes() == data[:1000] + bytes(49_000)
    mount.wait_sealed()
    trunc(5 * MiB)
    assert p.read_bytes() == data[:1000] + bytes(5 * MiB - 1000)
    trunc(0)
    assert p.read_bytes() == b""
    trunc(10)
    assert p.read_bytes() == bytes(10)
    mount.remount()
    assert p.read_bytes() == bytes(10)


def test_ftruncate_while_writing(mount):
    p = mount.mnt / "ft"
    fd = os.open(p, os.O_CREAT | os.O_RDWR, 0o600)
    try:
        os.write(fd, b"a" * 10_000)
        os.ftruncate(fd, 100)
        os.pwrite(fd, b"b", 200)
        assert os.fstat(fd).st_size == 201
        assert os.pread(fd, 300, 0) == b"a" * 100 + bytes(100) + b"b"
    finally:
        os.close(fd)
    mount.remount()
    assert p.read_bytes() == b"a" * 100 + bytes(100) + b"b"


# --------------------------------------------------------------- directories
def test_mkdir_rmdir(mount):
    d = mount.mnt / "d"
    os.mkdir(d, 0o750)
    assert stat.S_ISDIR(os.stat(d).st_mode)
    assert stat.S_IMODE(os.stat(d).st_mode) == 0o750
    assert_errno(errno.EEXIST, os.mkdir, d)
    (d / "f").write_bytes(b"x")
    os.mkdir(d / "sub")
    assert_errno(errno.ENOTEMPTY, os.rmdir, d)
    assert_errno(errno.ENOTDIR, os.rmdir, d / "f")
    os.unlink(d / "f")
    assert_errno(errno.ENOTEMPTY, os.rmdir, d)
    os.rmdir(d / "sub")
    os.rmdir(d)
    assert not d.exists()
    assert_errno(errno.ENOENT, os.rmdir, d)
    os.makedirs(mount.mnt / "a" / "b" / "c")
    (mount.mnt / "a" / "b" / "c" / "deep").write_bytes(b"deep")
    mount.remount()
    assert (mount.mnt / "a" / "b" / "c" / "deep").read_bytes() == b"deep"


def test_unlink(mount):
    p = mount.mnt / "gone"
    p.write_bytes(b"data" * 1000)
    mount.wait_sealed()
    os.unlink(p)
    assert not p.exists()
    assert_errno(errno.ENOENT, os.unlink, p)
    os.mkdir(mount.mnt / "dir")
    with pytest.raises(OSError) as ei:
        os.unlink(mount.mnt / "dir")
    assert ei.value.errno in (errno.EISDIR, errno.EPERM)
    mount.remount()
    assert not p.exists()
    assert os.listdir(mount.mnt) == ["dir"]
    # the store no longer accounts for it
    assert all(e["path"].lstrip("/") != "gone" for e in mount.stats()["files"])


def test_unlink_while_open(mount):
    p = mount.mnt / "open-unlinked"
    p.write_bytes(b"0123456789")
    fd = os.open(p, os.O_RDWR)
    try:
        os.unlink(p)
        assert not p.exists()
        assert os.pread(fd, 100, 0) == b"0123456789"
        os.pwrite(fd, b"AB", 10)
        assert os.pread(fd, 100, 0) == b"0123456789AB"
        assert os.fstat(fd).st_size == 12
    finally:
        os.close(fd)
    assert os.listdir(mount.mnt) == []
    mount.remount()
    assert os.listdir(mount.mnt) == []


def test_rename_over_existing(mount):
    a, b = mount.mnt / "a", mount.mnt / "b"
    a.write_bytes(b"AAAA" * 1000)
    b.write_bytes(b"old b")
    ino_a = os.stat(a).st_ino
    os.rename(a, b)
    assert not a.exists()
    assert b.read_bytes() == b"AAAA" * 1000
    assert os.stat(b).st_ino == ino_a
    assert sorted(os.listdir(mount.mnt)) == ["b"]
    mount.remount()
    assert b.read_bytes() == b"AAAA" * 1000
    assert sorted(os.listdir(mount.mnt)) == ["b"]


def test_rename_while_open_and_atomic_replace(mount):
    # torch.save-style: write tmp, fsync, rename over the final name
    final = mount.mnt / "ckpt.pt"
    final.write_bytes(b"v1" * 5000)
    tmp = mount.mnt / "ckpt.pt.tmp"
    with open(tmp, "wb") as f:
        f.write(b"v2" * 7000)
        f.flush()
        os.fsync(f.fileno())
        os.rename(tmp, final)   # rename while still open
        f.write(b"tail")
    assert final.read_bytes() == b"v2" * 7000 + b"tail"
    mount.remount()
    assert final.read_bytes() == b"v2" * 7000 + b"tail"
    assert os.listdir(mount.mnt) == ["ckpt.pt"]


def test_rename_across_directories(mount):
    os.mkdir(mount.mnt / "src")
    os.mkdir(mount.mnt / "dst")
    (mount.mnt / "src" / "f").write_bytes(b"payload")
    os.rename(mount.mnt / "src" / "f", mount.mnt / "dst" / "g")
    assert os.listdir(mount.mnt / "src") == []
    assert (mount.mnt / "dst" / "g").read_bytes() == b"payload"
    # directory rename (with contents) across parents
    os.mkdir(mount.mnt / "src" / "sub")
    (mount.mnt / "src" / "sub" / "x").write_bytes(b"xx")
    os.rename(mount.mnt / "src" / "sub", mount.mnt / "dst" / "sub2")
    assert (mount.mnt / "dst" / "sub2" / "x").read_bytes() == b"xx"
    # directory over empty directory ok, over non-empty -> ENOTEMPTY
    os.mkdir(mount.mnt / "empty")
    os.rename(mount.mnt / "dst" / "sub2", mount.mnt / "empty")
    assert (mount.mnt / "empty" / "x").read_bytes() == b"xx"
    os.mkdir(mount.mnt / "d2")
    with pytest.raises(OSError) as ei:
        os.rename(mount.mnt / "d2", mount.mnt / "empty")
    assert ei.value.errno in (errno.ENOTEMPTY, errno.EEXIST)
    # file over directory / directory over file
    assert_errno(errno.EISDIR, os.rename, mount.mnt / "dst" / "g", mount.mnt / "d2")
    assert_errno(errno.ENOTDIR, os.rename, mount.mnt / "d2", mount.mnt / "dst" / "g")
    assert_errno(errno.ENOENT, os.rename, mount.mnt / "missing", mount.mnt / "x")
    mount.remount()
    assert (mount.mnt / "dst" / "g").read_bytes() == b"payload"
    assert (mount.mnt / "empty" / "x").read_bytes() == b"xx"
    assert sorted(os.listdir(mount.mnt)) == ["d2", "dst", "empty", "src"]


def test_rename_noreplace(mount):
    a, b = mount.mnt / "a", mount.mnt / "b"
    a.write_bytes(b"a")
    b.write_bytes(b"b")
    assert_errno(errno.EEXIST, renameat2, a, b, RENAME_NOREPLACE)
    assert a.read_bytes() == b"a" and b.read_bytes() == b"b"
    renameat2(a, mount.mnt / "c", RENAME_NOREPLACE)
    assert not a.exists()
    assert (mount.mnt / "c").read_bytes() == b"a"


def test_hard_links(mount):
    a = mount.mnt / "a"
    os.mkdir(mount.mnt / "d")
    b = mount.mnt / "d" / "b"
    a.write_bytes(b"shared content")
    os.link(a, b)
    sa, sb = os.stat(a), os.stat(b)
    assert sa.st_ino == sb.st_ino
    assert sa.st_nlink == 2 and sb.st_nlink == 2
    with open(b, "r+b") as f:
        f.seek(0)
        f.write(b"SHARED")
    assert a.read_bytes() == b"SHARED content"
    assert_errno(errno.EEXIST, os.link, a, b)
    mount.remount()
    assert os.stat(a).st_nlink == 2
    assert os.stat(a).st_ino == os.stat(b).st_ino
    assert b.read_bytes() == b"SHARED content"
    with open(a, "ab") as f:
        f.write(b"!")
    assert b.read_bytes() == b"SHARED content!"
    os.unlink(a)
    assert os.stat(b).st_nlink == 1
    assert b.read_bytes() == b"SHARED content!"
    mount.remount()
    assert os.stat(b).st_nlink == 1
    assert b.read_bytes() == b"SHARED content!"
    assert_errno(errno.EPERM, os.link, mount.mnt / "d", mount.mnt / "dlink")


def test_symlink_readlink(mount):
    t = mount.mnt / "target"
    t.write_bytes(b"target data")
    os.symlink("target", mount.mnt / "rel")
    os.symlink("/nonexistent/abs/path", mount.mnt / "dangling")
    assert os.readlink(mount.mnt / "rel") == "target"
    assert os.readlink(mount.mnt / "dangling") == "/nonexistent/abs/path"
    assert stat.S_ISLNK(os.lstat(mount.mnt / "rel").st_mode)
    assert (mount.mnt / "rel").read_bytes() == b"target data"
    assert not (mount.mnt / "dangling").exists()
    assert_errno(errno.EINVAL, os.readlink, t)
    assert_errno(errno.EEXIST, os.symlink, "x", mount.mnt / "rel")
    long_target = "x/" * 1000 + "end"
    os.symlink(long_target, mount.mnt / "long")
    mount.remount()
    assert os.readlink(mount.mnt / "rel") == "target"
    assert os.readlink(mount.mnt / "long") == long_target
    assert (mount.mnt / "rel").read_bytes() == b"target data"
    os.unlink(mount.mnt / "rel")
    assert t.read_bytes() == b"target data"


# --------------------------------------------------------------- metadata
def test_chmod_chown_utime(mount):
    p = mount.mnt / "meta"
    p.write_bytes(b"m")
    os.chmod(p, 0o640)
    assert stat.S_IMODE(os.stat(p).st_mode) == 0o640
    os.chmod(p, 0o4755)
    assert stat.S_IMODE(os.stat(p).st_mode) == 0o4755
    os.chmod(p, 0o600)
    os.chown(p, 1234, 5678)
    st = os.stat(p)
    assert (st.st_uid, st.st_gid) == (1234, 5678)
    os.chown(p, -1, 42)
    assert (os.stat(p).st_uid, os.stat(p).st_gid) == (1234, 42)
    atime, mtime = 1_600_000_000_123_456_789, 1_650_000_000_987_654_321
    os.utime(p, ns=(atime, mtime))
    st = os.stat(p)
    assert st.st_mtime_ns == mtime
    assert st.st_atime_ns == atime
    d = mount.mnt / "dir"
    os.mkdir(d)
    os.chmod(d, 0o711)
    os.utime(d, ns=(atime, mtime))
    fd = os.open(p, os.O_RDWR)
    try:
        os.fchmod(fd, 0o604)
        os.utime(fd, ns=(atime + 1, mtime + 1))
    finally:
        os.close(fd)
    mount.remount()
    st = os.stat(p)
    assert stat.S_IMODE(st.st_mode) == 0o604
    assert (st.st_uid, st.st_gid) == (1234, 42)
    assert st.st_mtime_ns == mtime + 1
    assert st.st_atime_ns == atime + 1
    st = os.stat(d)
    assert stat.S_IMODE(st.st_mode) == 0o711
    assert st.st_mtime_ns == mtime


def test_metadata_survives_background_seal(mount):
    """chmod/utime right after close, while the seal of the content still runs,
    must not be undone when the seal finishes."""
    p = mount.mnt / "sealing"
    p.write_bytes(os.urandom(24 * MiB))
    os.utime(p, ns=(1_600_000_000_000_000_001, 1_650_000_000_000_000_001))
    os.chmod(p, 0o611)
    os.setxattr(p, "user.k", b"v")
    mount.wait_sealed()
    st = os.stat(p)
    assert st.st_mtime_ns == 1_650_000_000_000_000_001
    assert stat.S_IMODE(st.st_mode) == 0o611
    assert os.getxattr(p, "user.k") == b"v"
    mount.remount()
    st = os.stat(p)
    assert st.st_mtime_ns == 1_650_000_000_000_000_001
    assert stat.S_IMODE(st.st_mode) == 0o611
    assert os.getxattr(p, "user.k") == b"v"


def test_write_updates_mtime(mount):
    p = mount.mnt / "mt"
    p.write_bytes(b"a")
    os.utime(p, ns=(1_000_000_000, 1_000_000_000))
    with open(p, "ab") as f:
        f.write(b"b")
    assert os.stat(p).st_mtime_ns > 1_000_000_000
    os.utime(p, ns=(1_000_000_000, 1_000_000_000))
    os.truncate(p, 1)
    assert os.stat(p).st_mtime_ns > 1_000_000_000


def test_statfs(mount):
    sv = os.statvfs(mount.mnt)
    assert sv.f_bsize > 0
    assert sv.f_blocks > 0
    assert sv.f_namemax >= 255
    assert sv.f_bavail <= sv.f_blocks
    (mount.mnt / "f").write_bytes(b"x")
    os.statvfs(mount.mnt / "f")


def test_xattrs(mount):
    p = mount.mnt / "x"
    p.write_bytes(b"x")
    os.setxattr(p, "user.ckpt.step", b"100")
    os.setxattr(p, "user.empty", b"")
    os.setxattr(p, "user.bin", bytes(range(256)) * 4)
    assert os.getxattr(p, "user.ckpt.step") == b"100"
    assert os.getxattr(p, "user.empty") == b""
    assert os.getxattr(p, "user.bin") == bytes(range(256)) * 4
    assert sorted(os.listxattr(p)) == ["user.bin", "user.ckpt.step", "user.empty"]
    assert_errno(errno.ENODATA, os.getxattr, p, "user.missing")
    assert_errno(errno.EEXIST, os.setxattr, p, "user.empty", b"1", os.XATTR_CREATE)
    assert_errno(errno.ENODATA, os.setxattr, p, "user.nope", b"1", os.XATTR_REPLACE)
    os.setxattr(p, "user.ckpt.step", b"200", os.XATTR_REPLACE)
    os.removexattr(p, "user.empty")
    assert_errno(errno.ENODATA, os.removexattr, p, "user.empty")
    os.mkdir(mount.mnt / "d")
    os.setxattr(mount.mnt / "d", "user.dir", b"yes")
    mount.remount()
    assert sorted(os.listxattr(p)) == ["user.bin", "user.ckpt.step"]
    assert os.getxattr(p, "user.ckpt.step") == b"200"
    assert os.getxattr(p, "user.bin") == bytes(range(256)) * 4
    assert os.getxattr(mount.mnt / "d", "user.dir") == b"yes"
    # internal attributes of the backing store must not leak
    assert all(n.startswith("user.") for n in os.listxattr(p))


def test_fsync_fdatasync_flush(mount):
    p = mount.mnt / "sync"
    with open(p, "wb") as f:
        f.write(b"a" * 100_000)
        f.flush()
        os.fsync(f.fileno())
        f.write(b"b" * 100)
        f.flush()
        os.fdatasync(f.fileno())
        assert os.stat(p).st_size == 100_100
    fd = os.open(p, os.O_RDONLY)
    try:
        os.fsync(fd)  # fsync on a read-only fd is legal
    finally:
        os.close(fd)
    dfd = os.open(mount.mnt, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(dfd)
    finally:
        os.close(dfd)
    # dup'ed fd: flush happens on each close
    fd = os.open(p, os.O_WRONLY | os.O_APPEND)
    fd2 = os.dup(fd)
    os.write(fd, b"c")
    os.close(fd)
    os.write(fd2, b"d")
    os.close(fd2)
    assert p.read_bytes() == b"a" * 100_000 + b"b" * 100 + b"cd"
    mount.remount()
    assert p.read_bytes() == b"a" * 100_000 + b"b" * 100 + b"cd"


def test_o_direct(mount):
    p = mount.mnt / "direct"
    n = 4096 * 8
    buf = mmap.mmap(-1, n)  # page aligned
    pattern = bytes(random.Random(3).randbytes(n))
    buf[:] = pattern
    fd = os.open(p, os.O_CREAT | os.O_RDWR | os.O_DIRECT, 0o644)
    try:
        assert os.write(fd, buf) == n
        os.lseek(fd, 0, os.SEEK_SET)
        rbuf = mmap.mmap(-1, n)
        assert os.readv(fd, [rbuf]) == n
        assert rbuf[:] == pattern
        assert os.preadv(fd, [rbuf], 4096) == n - 4096
        assert rbuf[:n - 4096] == pattern[4096:]
    finally:
        os.close(fd)
    assert p.read_bytes() == pattern
    mount.remount()
    fd = os.open(p, os.O_RDONLY | os.O_DIRECT)
    try:
        rbuf = mmap.mmap(-1, n)
        assert os.readv(fd, [rbuf]) == n
        assert rbuf[:] == pattern
    finally:
        os.close(fd)


def test_mmap_read(mount):
    rng = random.Random(11)
    data = gen_data(rng, 5 * MiB + 333, "mixed")
    p = mount.mnt / "mm"
    p.write_bytes(data)
    for phase in ("staged-or-sealed", "after-remount"):
        with open(p, "rb") as f:
            with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as m:
                assert len(m) == len(data)
                assert m[:] == data, phase
                assert m[4 * MiB - 10:4 * MiB + 10] == data[4 * MiB - 10:4 * MiB + 10]
        if phase == "staged-or-sealed":
            mount.wait_sealed()
            mount.remount()


def test_mmap_shared_write(mount):
    rng = random.Random(12)
    data = bytearray(gen_data(rng, 3 * MiB, "random"))
    p = mount.mnt / "mw"
    p.write_bytes(bytes(data))
    mount.wait_sealed()
    fd = os.open(p, os.O_RDWR)
    m = mmap.mmap(fd, 0, flags=mmap.MAP_SHARED, prot=mmap.PROT_READ | mmap.PROT_WRITE)
    for off in (0, 4095, 1 * MiB + 7, 3 * MiB - 5):
        m[off:off + 5] = b"HELLO"
        data[off:off + 5] = b"HELLO"
    m.flush()
    m.close()
    os.close(fd)
    assert p.read_bytes() == bytes(data)
    mount.remount()
    assert p.read_bytes() == bytes(data)
    # and on a file that was never sealed yet (still open for writing)
    q = mount.mnt / "mw2"
    fd = os.open(q, os.O_CREAT | os.O_RDWR, 0o644)
    os.ftruncate(fd, 65536)
    m = mmap.mmap(fd, 65536, flags=mmap.MAP_SHARED, prot=mmap.PROT_READ | mmap.PROT_WRITE)
    m[100:103] = b"abc"
    m.flush()
    m.close()
    os.close(fd)
    expect = bytes(100) + b"abc" + bytes(65536 - 103)
    assert q.read_bytes() == expect
    mount.remount()
    assert q.read_bytes() == expect


def test_readdir(mount):
    names = set()
    for i in range(300):
        n = f"file-{i:04d}-{'x' * (i % 50)}"
        (mount.mnt / n).write_bytes(str(i).encode())
        names.add(n)
    os.mkdir(mount.mnt / "subdir")
    os.symlink("file-0000-", mount.mnt / "link")
    names |= {"subdir", "link"}
    assert set(os.listdir(mount.mnt)) == names
    assert len(os.listdir(mount.mnt)) == len(names)
    kinds = {e.name: (e.is_file(follow_symlinks=False), e.is_dir(follow_symlinks=False),
                      e.is_symlink()) for e in os.scandir(mount.mnt)}
    assert kinds["subdir"] == (False, True, False)
    assert kinds["link"] == (False, False, True)
    assert kinds["file-0001-x"] == (True, False, False)
    assert os.listdir(mount.mnt / "subdir") == []
    for i in range(0, 300, 2):
        n = f"file-{i:04d}-{'x' * (i % 50)}"
        os.unlink(mount.mnt / n)
        names.discard(n)
    assert set(os.listdir(mount.mnt)) == names
    mount.remount()
    assert set(os.listdir(mount.mnt)) == names


def test_size_while_open_and_after_seal(mount):
    rng = random.Random(99)
    p = mount.mnt / "growing.bin"
    data = gen_data(rng, 6 * MiB, "mixed")
    fd = os.open(p, os.O_CREAT | os.O_WRONLY, 0o644)
    try:
        written = 0
        for i in range(0, len(data), 512 * 1024):
            written += os.write(fd, data[i:i + 512 * 1024])
            assert os.stat(p).st_size == written
            assert os.fstat(fd).st_size == written
        assert os.stat(mount.mnt / "growing.bin").st_size == len(data)
        entries = [e for e in mount.stats()["files"] if e["path"].lstrip("/") == "growing.bin"]
        assert entries and entries[0]["staged"] is True, entries
    finally:
        os.close(fd)
    assert os.stat(p).st_size == len(data)
    st = mount.wait_sealed()
    ent = [e for e in st["files"] if e["path"].lstrip("/") == "growing.bin"]
    assert ent and ent[0]["logical"] == len(data) and ent[0]["staged"] is False
    assert os.stat(p).st_size == len(data)
    assert read_file(p) == data
    mount.remount()
    assert os.stat(p).st_size == len(data)
    assert read_file(p) == data


def test_persistence_after_remount(mount):
    rng = random.Random(2024)
    root = mount.mnt
    os.makedirs(root / "run1" / "ckpt")
    files = {}
    for i in range(12):
        rel = f"run1/ckpt/step-{i}.bin" if i % 2 else f"top-{i}.bin"
        data = gen_data(rng, rng.randint(0, 3 * MiB))
        (root / rel).write_bytes(data)
        files[rel] = data
        os.chmod(root / rel, 0o600 + (i % 8))
        os.utime(root / rel, ns=(1_700_000_000_000_000_000 + i, 1_700_000_000_100_000_000 + i))
        os.setxattr(root / rel, "user.idx", str(i).encode())
    os.symlink("ckpt/step-1.bin", root / "run1" / "latest")
    os.link(root / "top-0.bin", root / "run1" / "hardlink")
    os.utime(root / "run1" / "ckpt", ns=(1_600_000_000_000_000_000, 1_600_000_000_000_000_000))
    mount.wait_sealed()
    before = snapshot_tree(root, with_meta=True)
    xattrs = {rel: os.getxattr(root / rel, "user.idx") for rel in files}
    mount.remount()
    after = snapshot_tree(root, with_meta=True)
    assert_trees_equal(before, after)
    for rel, data in files.items():
        assert read_file(root / rel) == data
        assert os.getxattr(root / rel, "user.idx") == xattrs[rel]
    assert os.stat(root / "run1" / "hardlink").st_nlink == 2
    # and once more, after an unmount with nothing staged
    mount.remount()
    assert_trees_equal(before, snapshot_tree(root, with_meta=True))


def test_copy_tree_in_and_out(mount, plain_dir):
    import shutil
    rng = random.Random(77)
    src = plain_dir / "src"
    (src / "a" / "b").mkdir(parents=True)
    for i in range(20):
        (src / ("a" if i % 2 else "a/b") / f"f{i}").write_bytes(gen_data(rng, rng.randint(0, 400_000)))
    shutil.copytree(src, mount.mnt / "copy")
    assert_trees_equal(snapshot_tree(src), snapshot_tree(mount.mnt / "copy"))
    mount.remount()
    shutil.copytree(mount.mnt / "copy", plain_dir / "back")
    assert_trees_equal(snapshot_tree(src), snapshot_tree(plain_dir / "back"))
