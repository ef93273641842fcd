"""Mounting the way admins mount (issue 19): `mount -t fuse.ckptfs`, fstab
lines read through `mount -T FILE`, with the mount.ckptfs helper and through
fuse3's generic mount.fuse; the version and the exit codes of every command.

mount(8) looks for its helpers in /sbin only, and mount.fuse runs `ckptfs`
from /bin/sh's default PATH. So that the tests install nothing on the
machine, each mount runs in a private mount namespace (unshare -m) in which
an overlay puts the build's helper into /usr/sbin, or a tmpfs puts the
build's binary into /usr/local/bin; the script unmounts before it leaves.
"""
from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path

import pytest

from conftest import CKPTFS, ROOT, describe, require_binary, run_ckptfs

SCRIPT_TIMEOUT = 120

# What an admin's fstab line carries besides ckptfs's own options.
FSTAB_OPTS = "_netdev,nofail,x-systemd.requires=network-online.target,x-systemd.automount,allow_other,defaults,rw"

# Puts the helper where mount(8) looks for it, in this namespace only.
HELPER_IN_SBIN = """
mkdir -p "$T/sbin"
ln -sf "$CKPTFS" "$T/sbin/mount.ckptfs"
ln -sf "$CKPTFS" "$T/sbin/mount.fuse.ckptfs"
mount -t overlay overlay -o "lowerdir=$T/sbin:/usr/sbin" /usr/sbin
"""
# Puts `ckptfs` on /bin/sh's default PATH, where mount.fuse finds it.
BINARY_ON_PATH = """
mount -t tmpfs tmpfs /usr/local/bin
ln -s "$CKPTFS" /usr/local/bin/ckptfs
"""


def skip_if_helper_installed():
    """With mount.fuse.ckptfs installed, mount(8) never reaches mount.fuse."""
    if Path("/sbin/mount.fuse.ckptfs").exists():
        pytest.skip("/sbin/mount.fuse.ckptfs is installed: mount(8) uses it, not fuse3's mount.fuse")


def in_mount_namespace(tmp_path: Path, script: str) -> subprocess.CompletedProcess:
    """Runs `script` (sh -eu) in a private mount namespace with $S (a store),
    $M (a mount point), $T (a scratch dir) and $CKPTFS set. Whatever it
    leaves mounted is detached when it exits, which ends the daemon."""
    require_binary()
    env = dict(os.environ, S=str(tmp_path / "store"), M=str(tmp_path / "mnt"), T=str(tmp_path),
               CKPTFS=str(CKPTFS))
    for d in ("store", "mnt"):
        (tmp_path / d).mkdir(exist_ok=True)
    wrapped = 'trap \'umount -l "$M" 2>/dev/null || true\' EXIT\n' + script
    p = subprocess.run(["unshare", "-m", "--propagation", "private", "sh", "-euc", wrapped], env=env,
                       stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=SCRIPT_TIMEOUT)
    return p


def mounted_line(stdout: str) -> str:
    lines = [ln for ln in stdout.splitlines() if ln.startswith("MOUNTED ")]
    assert lines, f"the script printed no MOUNTED line:\n{stdout}"
    return lines[0]


# Writes a file through the mount, reads it back, shows the mount's line and
# unmounts through ckptfs, which waits for the seal.
USE_AND_UNMOUNT = """
echo "MOUNTED $(grep " $M " /proc/self/mounts)"
head -c 1048576 /dev/urandom > "$T/data.bin"
cp "$T/data.bin" "$M/data.bin"
cmp "$T/data.bin" "$M/data.bin"
"$CKPTFS" umount "$M"
"""


def assert_store_holds_data(tmp_path: Path):
    st = run_ckptfs("stats", "--json", tmp_path / "store")
    assert st.returncode == 0, describe(st)
    files = {f["path"] for f in json.loads(st.stdout)["files"]}
    assert "data.bin" in files, st.stdout
    fsck = run_ckptfs("fsck", tmp_path / "store")
    assert fsck.returncode == 0, describe(fsck)


def test_mount_t_fuse_ckptfs_through_the_helper(tmp_path):
    p = in_mount_namespace(tmp_path, HELPER_IN_SBIN + f"""
mount -t fuse.ckptfs "$S" "$M" -o {FSTAB_OPTS},cache_size=64M
""" + USE_AND_UNMOUNT)
    assert p.returncode == 0, describe(p)
    line = mounted_line(p.stdout)
    assert " fuse.ckptfs " in line and "allow_other" in line, line
    assert_store_holds_data(tmp_path)


def test_fstab_line_through_the_helper(tmp_path):
    p = in_mount_namespace(tmp_path, HELPER_IN_SBIN + f"""
echo "$S $M fuse.ckptfs {FSTAB_OPTS},lossy=0.05,zstd_level=5 0 0" > "$T/fstab"
mount -T "$T/fstab" "$M"
""" + USE_AND_UNMOUNT)
    assert p.returncode == 0, describe(p)
    assert " fuse.ckptfs " in mounted_line(p.stdout)
    assert_store_holds_data(tmp_path)


def test_fstab_ckptfs_hash_form_through_mount_fuse(tmp_path):
    """fstab's old `ckptfs#STORE MNT fuse` form: fuse3's mount.fuse runs
    `ckptfs STORE MNT -o OPTIONS`, which used to fail with "A subcommand is
    required"."""
    p = in_mount_namespace(tmp_path, BINARY_ON_PATH + f"""
echo "ckptfs#$S $M fuse {FSTAB_OPTS} 0 0" > "$T/fstab"
mount -T "$T/fstab" "$M"
""" + USE_AND_UNMOUNT)
    assert p.returncode == 0, describe(p)
    assert " fuse.ckptfs " in mounted_line(p.stdout)
    assert_store_holds_data(tmp_path)


def test_mount_t_fuse_ckptfs_without_the_helper_goes_through_mount_fuse(tmp_path):
    skip_if_helper_installed()
    p = in_mount_namespace(tmp_path, BINARY_ON_PATH + f"""
mount -t fuse.ckptfs "$S" "$M" -o {FSTAB_OPTS}
""" + USE_AND_UNMOUNT)
    assert p.returncode == 0, describe(p)
    assert_store_holds_data(tmp_path)


def test_helper_fake_sloppy_and_unknown_options(tmp_path):
    p = in_mount_namespace(tmp_path, HELPER_IN_SBIN + """
mount -f -t fuse.ckptfs "$S" "$M" -o rw,cache_size=64M
if grep -q " $M " /proc/self/mounts; then echo "FAKE MOUNTED"; fi
if mount -t fuse.ckptfs "$S" "$M" -o rw,frobnicate 2>"$T/err"; then echo "UNKNOWN ACCEPTED"; fi
cat "$T/err"
mount -s -t fuse.ckptfs "$S" "$M" -o rw,frobnicate
echo "MOUNTED $(grep " $M " /proc/self/mounts)"
"$CKPTFS" umount "$M"
""")
    assert p.returncode == 0, describe(p)
    assert "FAKE MOUNTED" not in p.stdout and "UNKNOWN ACCEPTED" not in p.stdout, p.stdout
    assert "unknown mount option 'frobnicate'" in p.stdout, p.stdout
    assert " fuse.ckptfs " in mounted_line(p.stdout)


def test_helper_name_next_to_the_binary():
    helper = CKPTFS.parent / "mount.ckptfs"
    assert helper.exists(), f"the build makes {helper} next to the binary"
    p = subprocess.run([str(helper)], capture_output=True, text=True)
    assert p.returncode == 2 and "expected STORE MOUNTPOINT" in p.stderr, describe(p)


# --- version and exit codes ---------------------------------------------------

def cmake_version() -> str:
    m = re.search(r"project\(ckptfs VERSION (\d+\.\d+\.\d+)", (ROOT / "CMakeLists.txt").read_text())
    assert m, "CMakeLists.txt has no project(ckptfs VERSION X.Y.Z)"
    return m.group(1)


def test_version_comes_from_cmake_and_matches_the_readme():
    p = run_ckptfs("--version")
    assert p.returncode == 0, describe(p)
    assert p.stdout.splitlines()[0] == f"ckptfs {cmake_version()}", p.stdout
    # Then what the build has: each optional backend, in or out.
    assert re.fullmatch(r"features: [+-]rados [+-]cuda", p.stdout.splitlines()[1]), p.stdout
    major_minor = ".".join(cmake_version().split(".")[:2])
    readme = (ROOT / "README.md").read_text()
    stated = set(re.findall(r"Current state \(v(\d+\.\d+)\)", readme))
    assert stated == {major_minor}, f"README states {stated}, CMakeLists.txt {cmake_version()}"


USAGE_ERRORS = [
    [],                                   # no subcommand
    ["frobnicate"],                       # unknown subcommand
    ["--bogus"],
    ["mount"],                            # operands missing
    ["mount", "-o"],
    ["mount", "--bogus", "a", "b"],
    ["umount"],
    ["umount", "a", "b"],
    ["stats"],
    ["stats", "--bogus", "x"],
    ["fsck"],
    ["fsck", "a", "b"],
    ["gc"],
    ["gc", "--grace", "-1", "x"],
    ["gc", "--grace", "lots", "x"],
    ["inspect"],
    ["inspect", "--bogus", "x"],
    ["export"],
    ["export", "store"],
    ["export", "a", "b", "c", "d"],
    ["import"],
    ["import", "src"],
    ["freeze"],
    ["freeze", "--timeout", "x", "m"],
    ["thaw"],
]


@pytest.mark.parametrize("args", USAGE_ERRORS, ids=lambda a: " ".join(a) or "nothing")
def test_usage_errors_exit_2(args):
    p = run_ckptfs(*args)
    assert p.returncode == 2, describe(p, "should exit 2 (usage error)")
    assert p.stderr.strip(), describe(p, "should say what is wrong")


def test_operational_errors_exit_2(tmp_path):
    (tmp_path / "mnt").mkdir()
    for args in (["mount", tmp_path / "no-such-store", tmp_path / "mnt"],
                 ["mount", tmp_path / "mnt", tmp_path / "no-such-mnt"],
                 ["mount", "-o", "cache_size=lots", tmp_path / "mnt", tmp_path / "mnt2"],
                 ["umount", tmp_path / "mnt"],
                 ["stats", tmp_path / "mnt"],
                 ["fsck", tmp_path / "mnt"],
                 ["gc", tmp_path / "mnt"],
                 ["inspect", tmp_path / "no-such-file"]):
        p = run_ckptfs(*args)
        assert p.returncode == 2, describe(p, "should exit 2 (operational error)")


@pytest.mark.parametrize("sub", [None, "mount", "umount", "stats", "fsck", "gc", "inspect", "export", "import",
                                 "freeze", "thaw"])
def test_help_states_the_exit_codes(sub):
    p = run_ckptfs(*([sub] if sub else []), "--help")
    assert p.returncode == 0, describe(p)
    assert "Exit status: 0 success; 1 the command ran and found a problem" in p.stdout, p.stdout
