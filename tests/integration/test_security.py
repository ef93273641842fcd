"""A hostile local user on a shared node (issue 14): the backing store is
private to the daemon's user, nothing a user does through the mount reaches
it except through the daemon, and the mount enforces modes for everyone.

The attacker and the victim are real unprivileged users created for the
test (useradd, removed afterwards); their commands run as them through
setpriv with only their own groups."""
from __future__ import annotations

import errno
import os
import stat
import uuid
from pathlib import Path

import pytest

from conftest import describe, is_mounted, run_ckptfs
from helpers import read_file
from local_users import shared_mount, shared_top, users  # noqa: F401 (fixtures)

CODE = {e: n for n, e in errno.__dict__.items() if n.startswith("E") and isinstance(e, int)}


def internal_entries(backing: Path):
    """(path, lstat) of everything in BACKING except the logical tree."""
    out = [(backing, os.lstat(backing))]
    for name in os.listdir(backing):
        if name in ("ns", "lost+found"):
            continue
        p = backing / name
        out.append((p, os.lstat(p)))
        if p.is_dir() and not p.is_symlink():
            for dirpath, dirnames, filenames in os.walk(p):
                for n in dirnames + filenames:
                    q = Path(dirpath) / n
                    out.append((q, os.lstat(q)))
    return out


def assert_store_private(backing: Path):
    loose = []
    for p, st in internal_entries(backing):
        want = 0o700 if stat.S_ISDIR(st.st_mode) else 0o600
        if stat.S_ISREG(st.st_mode) or stat.S_ISDIR(st.st_mode):
            if stat.S_IMODE(st.st_mode) != want:
                loose.append(f"{p}: {stat.S_IMODE(st.st_mode):04o}, want {want:04o}")
    assert not loose, "store not private:\n" + "\n".join(loose)


def pack_files(backing: Path) -> list[Path]:
    return sorted((backing / "packs").glob("*/*.pack"))


# ------------------------------------------------------------ the private store
def test_new_store_is_private(shared_mount):
    m = shared_mount
    (m.mnt / "a.bin").write_bytes(os.urandom(200_000))
    (m.mnt / "d").mkdir()
    (m.mnt / "d" / "b.bin").write_bytes(b"b" * 70_000)
    m.wait_sealed()
    with open(m.mnt / "staged.bin", "wb") as f:  # held open: stays staged
        f.write(b"s" * 5000)
        f.flush()
        assert list((m.backing / "staging").iterdir()), "expected a staging file"
        assert pack_files(m.backing), "expected packs"
        assert (m.backing / "ckptfs.log").exists()
        assert_store_private(m.backing)
    # ns/ is the mount's root: it has the mount root's mode, which its owner may change.
    assert stat.S_IMODE(os.stat(m.backing / "ns").st_mode) == 0o755
    os.chmod(m.mnt, 0o1777)
    m.remount()
    assert stat.S_IMODE(os.stat(m.mnt).st_mode) == 0o1777
    assert stat.S_IMODE(os.stat(m.backing / "ns").st_mode) == 0o1777
    assert_store_private(m.backing)


def test_attacker_cannot_read_or_forge_anything_in_backing(shared_mount, users):
    atk, vic = users
    m = shared_mount
    b = m.backing
    pub = m.mnt / "pub"  # like /tmp: all may create, none may move others' files
    pub.mkdir()
    pub.chmod(0o1777)
    secret = pub / "secret.bin"
    p = vic.run(f"""
with open({str(secret)!r}, 'wb') as f: f.write(b'VICTIM-SECRET' * 10000)
os.chmod({str(secret)!r}, 0o600)
os.mkdir({str(pub / 'vicdir')!r})
""")
    assert p.returncode == 0, describe(p)
    p = atk.run(f"os.mkdir({str(pub / 'atkdir')!r})\nopen({str(pub / 'atkdir' / 'mine')!r}, 'wb').write(b'x')")
    assert p.returncode == 0, describe(p)
    m.wait_sealed()
    victim_stub = b / "ns" / "pub" / "secret.bin"
    victim_pack = pack_files(b)[0]
    # A staged file of the victim's: its stub names a staging file.
    staged = pub / "staged.bin"
    holder = open(staged, "wb")
    try:
        holder.write(b"STAGED-SECRET" * 1000)
        holder.flush()
        os.chown(staged, vic.uid, vic.gid)
        os.chmod(staged, 0o600)
        staging_file = next((b / "staging").iterdir())
        forged_sealed = read_file(victim_stub)
        forged_staged = read_file(b / "ns" / "pub" / "staged.bin")
        atk_stub = b / "ns" / "pub" / "atkdir" / "mine"
        res = atk.attempts({
            "list BACKING": f"os.listdir({str(b)!r})",
            "read a pack": f"open({str(victim_pack)!r}, 'rb').read()",
            "list packs": f"os.listdir({str(b / 'packs')!r})",
            "list ns": f"os.listdir({str(b / 'ns')!r})",
            "read a stub": f"open({str(victim_stub)!r}, 'rb').read()",
            "list staging": f"os.listdir({str(b / 'staging')!r})",
            "read a staging file": f"open({str(staging_file)!r}, 'rb').read()",
            "read the log": f"open({str(b / 'ckptfs.log')!r}, 'rb').read()",
            "read LOCK": f"open({str(b / 'LOCK')!r}, 'rb').read()",
            # forging: the attacker's own stub (they own the file and its
            # directory in ns/) rewritten to name the victim's pack / staging
            "forge stub -> pack": f"open({str(atk_stub)!r}, 'r+b').write({forged_sealed!r})",
            "forge stub -> staging": f"open({str(atk_stub)!r}, 'r+b').write({forged_staged!r})",
            "plant a stub": f"open({str(b / 'ns' / 'pub' / 'atkdir' / 'new')!r}, 'xb').write({forged_sealed!r})",
            "link a stub": f"os.link({str(victim_stub)!r}, {str(b / 'ns' / 'pub' / 'atkdir' / 'l')!r})",
            "plant a pack": f"open({str(b / 'packs' / 'planted.pack')!r}, 'xb')",
            # through the mount, kernel permission checks apply
            "read the secret": f"open({str(secret)!r}, 'rb').read()",
            "read the staged secret": f"open({str(staged)!r}, 'rb').read()",
            "symlink into BACKING": (f"os.symlink({str(victim_pack)!r}, {str(pub / 'atkdir' / 'sl')!r}) or "
                                     f"open({str(pub / 'atkdir' / 'sl')!r}, 'rb').read()"),
            "hard link the secret": f"os.link({str(secret)!r}, {str(pub / 'atkdir' / 'hl')!r})",
            "rename the secret": f"os.rename({str(secret)!r}, {str(pub / 'atkdir' / 'stolen')!r})",
            "device node": f"os.mknod({str(pub / 'atkdir' / 'dev')!r}, 0o600 | 0o20000, os.makedev(1, 3))",
            "trusted xattr": f"os.setxattr({str(pub / 'atkdir' / 'mine')!r}, 'trusted.ckptfs', b'x')",
            "security xattr": f"os.setxattr({str(pub / 'atkdir' / 'mine')!r}, 'security.ckptfs', b'x')",
            "chown to victim": f"os.chown({str(pub / 'atkdir' / 'mine')!r}, {vic.uid}, {vic.gid})",
        })
    finally:
        holder.close()
    expected_denied = {k: v for k, v in res.items() if k != "symlink into BACKING"}
    bad = {k: v for k, v in expected_denied.items() if v not in ("EACCES", "EPERM")}
    assert not bad, f"the attacker got through: {bad} (all: {res})"
    # the symlink itself may be made; following it is the kernel's walk as the attacker
    assert res["symlink into BACKING"] == "EACCES", res
    # nothing changed: the victim's data is intact and the attacker's file is theirs
    assert read_file(secret) == b"VICTIM-SECRET" * 10000
    assert read_file(staged) == b"STAGED-SECRET" * 1000
    assert read_file(pub / "atkdir" / "mine") == b"x"
    assert victim_pack.exists() and not (b / "packs" / "planted.pack").exists()
    m.remount()
    assert read_file(secret) == b"VICTIM-SECRET" * 10000


def test_log_elsewhere_is_created_private(mount_factory, tmp_path):
    log = tmp_path / "elsewhere.log"
    m = mount_factory(opts=[f"log={log}"])
    (m.mnt / "f").write_bytes(b"x")
    m.umount()
    assert log.exists() and stat.S_IMODE(os.stat(log).st_mode) == 0o600
    assert not (m.backing / "ckptfs.log").exists()


def test_log_holds_no_file_contents(shared_mount, users):
    atk, _ = users
    m = shared_mount
    marker = b"CONTENT-MARKER-" + uuid.uuid4().hex.encode()
    (m.mnt / "f.bin").write_bytes(marker * 3000)
    (m.mnt / "g.bin").write_bytes(marker)
    m.wait_sealed()
    m.remount()  # recovery and mount lines too
    assert read_file(m.mnt / "f.bin") == marker * 3000
    log = m.backing / "ckptfs.log"
    assert stat.S_IMODE(os.stat(log).st_mode) == 0o600
    assert marker not in read_file(log)
    assert atk.attempts({"read log": f"open({str(log)!r}, 'rb').read()"}) == {"read log": "EACCES"}


# ------------------------------------------------------------ through the mount
def test_policy_xattr_only_for_the_directory_owner(shared_mount, users):
    atk, vic = users
    m = shared_mount
    shared = m.mnt / "shared"  # root's, writable by all
    shared.mkdir()
    shared.chmod(0o777)
    os.setxattr(shared, "user.ckptfs.policy", b"lossless")
    victims = m.mnt / "victims"
    victims.mkdir()
    os.chown(victims, vic.uid, vic.gid)
    victims.chmod(0o777)
    res = atk.attempts({
        "set on root's dir": f"os.setxattr({str(shared)!r}, 'user.ckptfs.policy', b'lossy=0.5')",
        "remove on root's dir": f"os.removexattr({str(shared)!r}, 'user.ckptfs.policy')",
        "set on victim's dir": f"os.setxattr({str(victims)!r}, 'user.ckptfs.policy', b'lossy')",
        "plain xattr on a dir it may write": f"os.setxattr({str(shared)!r}, 'user.note', b'hi')",
        "make own dir": f"os.mkdir({str(shared / 'mine')!r})",
        "set on own dir": f"os.setxattr({str(shared / 'mine')!r}, 'user.ckptfs.policy', b'lossy=0.1')",
        "remove on own dir": f"os.removexattr({str(shared / 'mine')!r}, 'user.ckptfs.policy')",
    })
    assert res == {
        "set on root's dir": "EPERM",
        "remove on root's dir": "EPERM",
        "set on victim's dir": "EPERM",
        "plain xattr on a dir it may write": "OK",  # the kernel's rule for user.* xattrs
        "make own dir": "OK",
        "set on own dir": "OK",
        "remove on own dir": "OK",
    }, res
    assert os.getxattr(shared, "user.ckptfs.policy") == b"lossless"
    with pytest.raises(OSError) as e:
        os.getxattr(victims, "user.ckptfs.policy")
    assert e.value.errno == errno.ENODATA
    # the owner and root still may
    assert vic.attempts({"own": f"os.setxattr({str(victims)!r}, 'user.ckptfs.policy', b'lossless')"}) == \
        {"own": "OK"}
    os.removexattr(victims, "user.ckptfs.policy")


def test_files_get_the_modes_their_creators_ask_for(shared_mount, users):
    """The daemon's umask is 077; entries made through the mount still get
    the requested mode minus the caller's umask, as on any file system."""
    atk, _ = users
    m = shared_mount
    pub = m.mnt / "pub"
    pub.mkdir()
    pub.chmod(0o777)
    p = atk.run(f"""
os.close(os.open({str(pub / 'f664')!r}, os.O_CREAT | os.O_WRONLY, 0o666))
os.mkdir({str(pub / 'd775')!r}, 0o777)
os.mkfifo({str(pub / 'p664')!r}, 0o666)
os.umask(0)
os.close(os.open({str(pub / 'f666')!r}, os.O_CREAT | os.O_WRONLY, 0o666))
os.umask(0o077)
os.mkdir({str(pub / 'd700')!r}, 0o777)
""", umask=0o002)
    assert p.returncode == 0, describe(p)
    want = {"f664": 0o664, "d775": 0o775, "p664": 0o664, "f666": 0o666, "d700": 0o700}
    got = {n: stat.S_IMODE(os.lstat(pub / n).st_mode) for n in want}
    assert got == want, {n: oct(v) for n, v in got.items()}
    assert all(os.lstat(pub / n).st_uid == atk.uid for n in want)
    m.remount()  # stored on the backing entries, not only cached
    assert {n: stat.S_IMODE(os.lstat(pub / n).st_mode) for n in want} == want


# ------------------------------------------------------------ opening a store
def test_existing_loose_store_is_tightened_on_mount(mount_factory, tmp_path):
    m = mount_factory()
    for i in range(5):
        (m.mnt / f"f{i}.bin").write_bytes(os.urandom(50_000))
    m.wait_sealed()
    m.umount()
    # what earlier versions left: 0755 directories, 0644 files, a 0666 log
    for p, st in internal_entries(m.backing):
        if stat.S_ISDIR(st.st_mode):
            os.chmod(p, 0o755)
        elif stat.S_ISREG(st.st_mode):
            os.chmod(p, 0o644)
    os.chmod(m.backing / "ckptfs.log", 0o666)
    m.mount()
    assert_store_private(m.backing)
    log = m.log_text()
    assert "store permissions" in log and "private" in log, log[-2000:]
    assert "packs" in log
    for i in range(5):
        assert len(read_file(m.mnt / f"f{i}.bin")) == 50_000
    # a second mount of a private store has nothing to tighten
    m.umount()
    before = m.log_text().count("store permissions")
    m.mount()
    assert m.log_text().count("store permissions") == before


@pytest.mark.parametrize("mode", [0o777, 0o775, 0o1777])
def test_backing_writable_by_others_is_refused(tmp_path, ckptfs_bin, mode):
    b = tmp_path / "backing"
    mnt = tmp_path / "mnt"
    b.mkdir()
    mnt.mkdir()
    b.chmod(mode)
    p = run_ckptfs("mount", b, mnt)
    if p.returncode == 0:
        run_ckptfs("umount", mnt)
        pytest.fail(describe(p, "mounted a backing directory others can write"))
    text = p.stdout + p.stderr
    assert str(b) in text and "writable" in text and "chmod go-w" in text, describe(p)
    assert not is_mounted(mnt)
    assert os.listdir(b) == [], "a refused store was touched"
    b.chmod(0o755)
    p = run_ckptfs("mount", b, mnt)
    assert p.returncode == 0, describe(p)
    try:
        assert stat.S_IMODE(os.stat(b).st_mode) == 0o700
    finally:
        run_ckptfs("umount", mnt, check=True)


def test_a_parent_others_can_write_is_warned_about(shared_top, mount_factory):
    loose = shared_top / "loose"
    loose.mkdir()
    loose.chmod(0o777)  # not sticky: anyone may rename the store away
    m = mount_factory(backing=loose / "backing", mnt=shared_top / "mnt")
    log = m.log_text()
    assert f"store permissions: parent {loose} of the store" in log and "other users" in log, log[-2000:]


def test_backing_owned_by_another_user_is_refused(tmp_path, ckptfs_bin, users):
    atk, _ = users
    b = tmp_path / "backing"
    mnt = tmp_path / "mnt"
    b.mkdir(mode=0o700)
    mnt.mkdir()
    os.chown(b, atk.uid, atk.gid)
    p = run_ckptfs("mount", b, mnt)
    if p.returncode == 0:
        run_ckptfs("umount", mnt)
        pytest.fail(describe(p, "mounted a backing directory another user owns"))
    text = p.stdout + p.stderr
    assert str(b) in text and "belongs to uid" in text and "chown" in text, describe(p)
    assert not is_mounted(mnt) and os.listdir(b) == []


# ------------------------------------------------------------ smaller defects
def test_stats_on_a_stale_mount_is_a_clear_error(mount_factory):
    m = mount_factory()
    (m.mnt / "f").write_bytes(b"data")
    m.wait_sealed()
    m.kill9()
    for path in (m.mnt, m.mnt / "f"):
        p = run_ckptfs("stats", path)
        assert p.returncode == 2, describe(p)
        text = p.stdout + p.stderr
        assert "stale" in text and "ckptfs umount" in text, describe(p)
        assert "terminate" not in text and "filesystem_error" not in text, describe(p)
    assert run_ckptfs("umount", m.mnt).returncode == 0
    m.mount()
    assert read_file(m.mnt / "f") == b"data"


def test_nonempty_mountpoint_needs_the_nonempty_option(mount_factory):
    m = mount_factory(mount=False)
    (m.mnt / "hidden.txt").write_bytes(b"under the mount")
    p = m.mount(check=False)
    assert p.returncode != 0, describe(p, "mounted over a non-empty directory")
    text = p.stdout + p.stderr
    assert "not empty" in text and "-o nonempty" in text and str(m.mnt) in text, describe(p)
    assert not is_mounted(m.mnt)
    assert read_file(m.mnt / "hidden.txt") == b"under the mount"
    m.mount(opts=m.opts + ["nonempty"])
    assert os.listdir(m.mnt) == []
    (m.mnt / "new").write_bytes(b"in the store")
    m.umount()
    assert os.listdir(m.mnt) == ["hidden.txt"]
    help_text = run_ckptfs("mount", "--help").stdout
    assert "nonempty" in help_text
