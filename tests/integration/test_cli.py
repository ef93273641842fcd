"""The ckptfs command line: help, mount error messages, options, stats."""
from __future__ import annotations

import errno
import os
import random
import subprocess
import time

import psutil
import pytest

from conftest import (CKPTFS, describe, is_mounted, mount_entry, pid_alive, pid_is_ckptfs,
                      run_ckptfs)
from helpers import gen_data, read_file

MiB = 1 << 20


def out(p):
    return (p.stdout + "\n" + p.stderr)


# --------------------------------------------------------------- help
def test_help(ckptfs_bin):
    p = run_ckptfs("--help")
    assert p.returncode == 0, describe(p)
    for sub in ("mount", "umount", "stats", "fsck"):
        assert sub in out(p), describe(p, f"--help does not mention {sub}")


@pytest.mark.parametrize("sub", ["mount", "umount", "stats", "fsck"])
def test_subcommand_help(ckptfs_bin, sub):
    p = run_ckptfs(sub, "--help")
    assert p.returncode == 0, describe(p)
    assert len(out(p).strip()) > 20, describe(p, "prints no help")
    if sub == "mount":
        for opt in ("cache_size", "chunk_size", "zstd_level"):
            assert opt in out(p), describe(p, f"mount --help does not document {opt}")


def test_no_args_and_unknown_subcommand(ckptfs_bin):
    p = run_ckptfs()
    assert p.returncode != 0 or "mount" in out(p)
    p = run_ckptfs("frobnicate")
    assert p.returncode != 0, describe(p, "accepted an unknown subcommand")


# --------------------------------------------------------------- mount errors
def assert_mount_fails(p, *needles, path=None):
    assert p.returncode != 0, describe(p, "should have failed")
    text = out(p)
    assert text.strip(), describe(p, "failed without any message")
    if path is not None:
        assert str(path) in text or os.path.basename(str(path)) in text, \
            describe(p, f"message does not name {path}")
    for n in needles:
        assert n.lower() in text.lower(), describe(p, f"message lacks {n!r}")


def test_mount_missing_backing(tmp_path, ckptfs_bin):
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    p = run_ckptfs("mount", tmp_path / "no-such-backing", mnt)
    assert_mount_fails(p, path=tmp_path / "no-such-backing")
    assert not is_mounted(mnt)


def test_mount_backing_is_a_file(tmp_path, ckptfs_bin):
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    f = tmp_path / "backing-file"
    f.write_bytes(b"not a dir")
    p = run_ckptfs("mount", f, mnt)
    assert_mount_fails(p, path=f)
    assert not is_mounted(mnt)
    assert f.read_bytes() == b"not a dir"


def test_mount_backing_not_a_store(tmp_path, ckptfs_bin):
    """A non-empty dir that is not a ckptfs store is refused, and left alone."""
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    b = tmp_path / "random-dir"
    b.mkdir()
    (b / "precious.txt").write_bytes(b"user data")
    p = run_ckptfs("mount", b, mnt)
    if p.returncode == 0:
        run_ckptfs("umount", mnt)
        pytest.fail(describe(p, "mounted a non-empty directory that is not a store"))
    assert_mount_fails(p, path=b)
    assert sorted(os.listdir(b)) == ["precious.txt"]


def test_mount_missing_mountpoint(tmp_path, ckptfs_bin):
    b = tmp_path / "backing"
    b.mkdir()
    p = run_ckptfs("mount", b, tmp_path / "no-such-mnt")
    assert_mount_fails(p, path=tmp_path / "no-such-mnt")
    # The failed attempt leaves no process behind, and nothing holds the
    # store: the next mount of it succeeds.
    survivors = [pr.pid for pr in psutil.process_iter(["cmdline"])
                 if str(b) in " ".join(pr.info["cmdline"] or [])]
    assert not survivors, f"processes survived a failed mount: {survivors}"
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    run_ckptfs("mount", b, mnt, check=True)
    run_ckptfs("umount", mnt, check=True)


def test_mountpoint_busy(mount_factory):
    m1 = mount_factory(name="first")
    (m1.mnt / "f").write_bytes(b"first")
    m2 = mount_factory(name="second", mnt=m1.mnt, mount=False, passive=True)
    p = m2.mount(check=False)
    assert_mount_fails(p, path=m1.mnt)
    # the first mount is untouched
    assert (m1.mnt / "f").read_bytes() == b"first"
    assert m1.live_pid() is not None


def test_mountpoint_stale(mount_factory):
    m = mount_factory()
    (m.mnt / "f").write_bytes(b"data")
    m.wait_sealed()
    m.kill9()
    assert is_mounted(m.mnt)
    p = m.mount(check=False)
    assert_mount_fails(p, "stale", "ckptfs umount")
    p = run_ckptfs("umount", m.mnt)
    assert p.returncode == 0, describe(p)
    assert not is_mounted(m.mnt)
    m.mount()
    assert (m.mnt / "f").read_bytes() == b"data"


def test_store_already_served(mount_factory):
    m1 = mount_factory(name="one")
    m2 = mount_factory(name="two", backing=m1.backing, mount=False, passive=True)
    p = m2.mount(check=False)
    assert_mount_fails(p, "already served")
    assert not is_mounted(m2.mnt)
    (m1.mnt / "still-works").write_bytes(b"ok")
    assert (m1.mnt / "still-works").read_bytes() == b"ok"


@pytest.mark.parametrize("opt", ["bogus=1", "bogus", "cache_size=lots", "zstd_level=abc",
                                 "chunk_size=-1", "log_level=shouty"])
def test_bad_option(mount_factory, opt):
    m = mount_factory(mount=False)
    m.fsck_at_teardown = False
    p = m.mount(opts=[opt], check=False)
    assert_mount_fails(p)
    # the message names the offending option (unknown) or value (bad value)
    name, _, value = opt.partition("=")
    if name == "bogus":
        assert "bogus" in out(p), describe(p, "does not name the unknown option")
    else:
        assert name in out(p) or f"{value}" in out(p), describe(p, "does not name the bad value")
    assert not is_mounted(m.mnt)


def test_lock_names_daemon_when_mount_returns(mount_factory):
    """Right when `ckptfs mount` returns, BACKING/LOCK already holds the pid
    of the live daemon (scripts and tests read it to find the daemon)."""
    m = mount_factory(mount=False)
    bad = []
    for i in range(30):
        p = run_ckptfs(*m.mount_args())
        assert p.returncode == 0, describe(p)
        pid = m.daemon_pid()
        if not (pid and pid_alive(pid) and pid_is_ckptfs(pid)):
            bad.append((i, pid))
        m.wait_live_pid()
        m.umount()
    assert not bad, (f"after `ckptfs mount` returned, LOCK named a pid that is not a live "
                     f"daemon in {len(bad)}/30 mounts: {bad}")


def test_mount_returns_with_pipes_closed(mount_factory):
    """`ckptfs mount` returns once mounted even when its stdout/stderr are
    pipes (the daemon must not keep them open: $(ckptfs mount ...) works)."""
    m = mount_factory(mount=False)
    try:
        p = subprocess.run([str(CKPTFS), *map(str, m.mount_args())], capture_output=True,
                           timeout=60, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        pytest.fail("ckptfs mount did not return within 60s with piped stdout/stderr "
                    "(the daemon keeps the pipes open?)")
    assert p.returncode == 0, p
    assert is_mounted(m.mnt)


def test_foreground_mount(mount_factory):
    m = mount_factory(mount=False)
    proc = subprocess.Popen([str(CKPTFS), *map(str, m.mount_args(foreground=True))],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 30
        while not is_mounted(m.mnt):
            assert proc.poll() is None, f"ckptfs mount -f exited with {proc.returncode}"
            assert time.monotonic() < deadline, "mount -f did not mount within 30s"
            time.sleep(0.05)
        (m.mnt / "fg").write_bytes(b"foreground")
        assert m.daemon_pid() == proc.pid
        p = run_ckptfs("umount", m.mnt)
        assert p.returncode == 0, describe(p)
        assert proc.wait(timeout=60) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    m.mount()
    assert (m.mnt / "fg").read_bytes() == b"foreground"


def test_relative_paths_daemonized(tmp_path, mount_factory):
    m = mount_factory(mount=False, name="rel")
    rel_b = os.path.relpath(m.backing, tmp_path)
    rel_m = os.path.relpath(m.mnt, tmp_path)
    p = run_ckptfs("mount", rel_b, rel_m, cwd=tmp_path)
    assert p.returncode == 0, describe(p)
    ent = mount_entry(m.mnt)
    assert ent is not None, f"not mounted at {m.mnt}: relative mountpoint resolved wrongly"
    assert ent["fstype"].startswith("fuse")
    (m.mnt / "x.bin").write_bytes(b"relative")
    m.wait_sealed()
    # the daemon also resolved the backing dir against the caller's cwd
    assert (m.backing / "ns" / "x.bin").exists(), sorted(os.listdir(m.backing))
    p = run_ckptfs("umount", rel_m, cwd=tmp_path)
    assert p.returncode == 0, describe(p)
    assert not is_mounted(m.mnt)
    m.mount()
    assert (m.mnt / "x.bin").read_bytes() == b"relative"


# --------------------------------------------------------------- options
def test_all_options_accepted(mount_factory, tmp_path):
    log = tmp_path / "custom.log"
    m = mount_factory(opts=["cache_size=64M", "chunk_size=1M", "zstd_level=5",
                            "seal_threads=1", "attr_timeout=0", f"log={log}",
                            "log_level=debug", "allow_other", "default_permissions"])
    rng = random.Random(1)
    data = gen_data(rng, 5 * MiB + 3, "mixed")
    (m.mnt / "f").write_bytes(data)
    st = m.wait_sealed()
    assert _files_by_path(st)["f"]["logical"] == len(data)
    assert read_file(m.mnt / "f") == data
    ent = mount_entry(m.mnt)
    assert "allow_other" in ent["super_options"], ent
    assert "default_permissions" in ent["super_options"], ent
    m.remount()
    assert read_file(m.mnt / "f") == data
    assert log.exists() and log.stat().st_size > 0, "log=PATH was not used"
    # a store written with one chunk size reads back with another
    m.remount(opts=["chunk_size=4M"])
    assert read_file(m.mnt / "f") == data


def test_ro_option(mount_factory):
    m = mount_factory()
    (m.mnt / "f").write_bytes(b"read me")
    os.mkdir(m.mnt / "d")
    m.remount(opts=["ro"])
    assert "ro" in mount_entry(m.mnt)["options"].split(",")
    assert (m.mnt / "f").read_bytes() == b"read me"
    for fn in (lambda: (m.mnt / "new").write_bytes(b"x"),
               lambda: open(m.mnt / "f", "r+b"),
               lambda: os.unlink(m.mnt / "f"),
               lambda: os.mkdir(m.mnt / "d2"),
               lambda: os.rename(m.mnt / "f", m.mnt / "g")):
        with pytest.raises(OSError) as ei:
            fn()
        assert ei.value.errno == errno.EROFS, ei.value
    m.remount(opts=[])
    (m.mnt / "new").write_bytes(b"x")


# --------------------------------------------------------------- stats
def _files_by_path(st):
    return {e["path"].lstrip("/"): e for e in st["files"]}


def test_stats(mount_factory):
    m = mount_factory()
    rng = random.Random(8)
    comp = gen_data(rng, 3 * MiB, "text")
    rnd = rng.randbytes(1 * MiB)
    os.mkdir(m.mnt / "sub")
    (m.mnt / "comp.bin").write_bytes(comp)
    (m.mnt / "sub" / "rand.bin").write_bytes(rnd)
    (m.mnt / "sub" / "empty").write_bytes(b"")
    st = m.wait_sealed()
    assert set(st) >= {"files", "total"}, st
    files = _files_by_path(st)
    assert set(files) == {"comp.bin", "sub/rand.bin", "sub/empty"}, files.keys()
    for e in st["files"]:
        assert set(e) >= {"path", "logical", "stored", "staged"}, e
        assert e["staged"] is False
    assert files["comp.bin"]["logical"] == len(comp)
    assert 0 < files["comp.bin"]["stored"] < len(comp) // 2, files["comp.bin"]
    assert files["sub/rand.bin"]["logical"] == len(rnd)
    assert files["sub/rand.bin"]["stored"] >= len(rnd) * 0.99
    assert files["sub/empty"]["logical"] == 0
    tot = st["total"]
    assert set(tot) >= {"logical", "stored", "ratio"}
    assert tot["logical"] == len(comp) + len(rnd)
    assert tot["stored"] == sum(e["stored"] for e in st["files"])
    r1, r2 = tot["logical"] / tot["stored"], tot["stored"] / tot["logical"]
    assert any(abs(tot["ratio"] - r) <= 0.01 * r + 1e-3 for r in (r1, r2)), tot

    # same numbers from the backing dir and (subset) from a dir inside the mount
    st_b = m.stats(m.backing)
    assert _files_by_path(st_b) == files
    assert st_b["total"] == tot
    st_sub = m.stats(m.mnt / "sub")
    paths_sub = {p.split("sub/")[-1] for p in _files_by_path(st_sub)}
    assert {"rand.bin", "empty"} <= paths_sub

    # human-readable form names the files and prints totals
    p = run_ckptfs("stats", m.mnt)
    assert p.returncode == 0, describe(p)
    assert "comp.bin" in p.stdout and "rand.bin" in p.stdout, describe(p)
    assert "total" in p.stdout.lower(), describe(p)

    # staged while open
    fd = os.open(m.mnt / "open.bin", os.O_CREAT | os.O_WRONLY, 0o644)
    try:
        os.write(fd, b"x" * 100_000)
        e = _files_by_path(m.stats()).get("open.bin")
        assert e is not None and e["staged"] is True, e
    finally:
        os.close(fd)
    e = _files_by_path(m.wait_sealed())["open.bin"]
    assert e["staged"] is False and e["logical"] == 100_000


def test_stats_errors(tmp_path, ckptfs_bin):
    p = run_ckptfs("stats", tmp_path / "nothing-here")
    assert p.returncode != 0, describe(p)
    assert out(p).strip()
    (tmp_path / "plain").mkdir()
    p = run_ckptfs("stats", tmp_path / "plain")
    assert p.returncode != 0, describe(p, "stats on a plain dir should fail")


def test_umount_not_mounted(tmp_path, ckptfs_bin):
    (tmp_path / "d").mkdir()
    p = run_ckptfs("umount", tmp_path / "d")
    assert p.returncode != 0, describe(p, "umount of a plain dir should fail")
    assert out(p).strip()
