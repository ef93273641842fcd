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
import random
import stat
import subprocess
import threading
from pathlib import Path

import pytest

from conftest import CKPTFS, describe, is_mounted, run_ckptfs, wait_pid_exit
from helpers import wait_for
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
FORGED = "2026-01-01T00:00:00.000 info [1] FORGED ssh-ed25519 AAAAC3Nz attacker@evil"


def attacker_dir(m, atk: User) -> Path:
    """A directory of the attacker's own in the mount: where a policy
    setxattr passes the owner check and reaches the parser."""
    pub = m.mnt / "pub"
    pub.mkdir(exist_ok=True)
    pub.chmod(0o777)
    own = pub / f"d{atk.uid}"
    p = atk.run(f"os.mkdir({str(own)!r})")
    assert p.returncode == 0, describe(p, "mkdir as the attacker")
    return own


def setxattr_flood(atk: User, path: Path, value: bytes, times: int) -> int:
    """Sets an invalid user.ckptfs.policy `times` times as the attacker;
    returns how many were refused with EINVAL."""
    p = atk.run(f"""
refused = 0
for _ in range({times}):
    try:
        os.setxattr({str(path)!r}, 'user.ckptfs.policy', {value!r})
    except OSError as e:
        refused += e.errno == errno.EINVAL
print(refused)
""")
    assert p.returncode == 0, describe(p, "setxattr as the attacker")
    return int(p.stdout)


def test_log_policy_value_cannot_forge_a_line(shared_mount, users):
    # The value of a refused policy is logged: with its newlines verbatim, a
    # user wrote whole log lines of their choosing, up to 64 KB.
    atk, _ = users
    m = shared_mount
    own = attacker_dir(m, atk)
    value = ("lossy=0.5\n" + FORGED + "\n" + "A" * 60_000).encode()
    assert setxattr_flood(atk, own, value, 1) == 1
    lines = m.log_text().splitlines()
    assert not [ln for ln in lines if ln.startswith(FORGED[:23])], "a log line starts as the attacker chose"
    logged = [ln for ln in lines if "setxattr user.ckptfs.policy" in ln]
    assert len(logged) == 1, lines[-20:]
    # escaped, and cut to about 200 bytes of the user's text
    assert "\\x0a" + FORGED in logged[0], logged[0][:500]
    assert "[cut" in logged[0] and len(logged[0]) < 600, len(logged[0])
    assert "A" * 250 not in m.log_text()


def test_log_flood_of_refused_policies_is_rate_limited(shared_mount, users):
    # 12,051 refused setxattr calls in 2 s grew the log by 750 MB.
    atk, _ = users
    m = shared_mount
    own = attacker_dir(m, atk)
    log = m.backing / "ckptfs.log"
    before = log.stat().st_size
    value = ("lossy=2\n" + "B" * 2000).encode()
    assert setxattr_flood(atk, own, value, 5000) == 5000
    m.umount()  # the daemon reports what it dropped by the end, at the latest
    grown = log.stat().st_size - before
    text = m.log_text()
    assert grown < 64 * 1024, f"log grew {grown} bytes for 5,000 refused calls"
    assert "suppressed" in text and f"uid {atk.uid}" in text, text[-2000:]
    shown = text.count("setxattr user.ckptfs.policy")
    assert 1 <= shown < 200, shown


def test_log_rotates_at_its_cap(mount_factory):
    m = mount_factory(opts=["log_max=4K", "log_level=debug"])
    for i in range(60):
        (m.mnt / f"f{i}.bin").write_bytes(os.urandom(3000))
    m.wait_sealed()
    m.umount()
    log = m.backing / "ckptfs.log"
    rotated = [m.backing / f"ckptfs.log.{i}" for i in (1, 2)]
    assert all(p.exists() for p in rotated), sorted(os.listdir(m.backing))
    assert not (m.backing / "ckptfs.log.3").exists()
    for p in [log, *rotated]:
        assert p.stat().st_size <= 4096, (p, p.stat().st_size)
        assert stat.S_IMODE(p.stat().st_mode) == 0o600
    # the daemon went on logging into the new files, to the end
    assert "unmounted" in log.read_text() + rotated[0].read_text()


def refused_log_mount(mount_factory, backing: Path, mnt: Path, opts, why: str) -> None:
    m = mount_factory(opts=opts, backing=backing, mnt=mnt, mount=False)
    p = m.mount(check=False)
    assert p.returncode == 2 and not is_mounted(mnt), describe(p, "mounted with a log it must refuse")
    assert why in p.stderr, describe(p, f"no {why!r} in the message")


def attacker_log_dir(shared_top: Path, atk: User) -> Path:
    """A directory the attacker may write (here: owns), not sticky, where
    an admin points log=; and a root-owned file worth attacking."""
    logs = shared_top / "logs"
    logs.mkdir()
    os.chown(logs, atk.uid, atk.gid)
    return logs


def test_log_option_refuses_a_planted_symlink(shared_top, mount_factory, users):
    # The attacker plants a symlink where the log will be, to a root-owned
    # file: the root daemon appended its lines (theirs, with item 2) there.
    atk, _ = users
    link = attacker_log_dir(shared_top, atk) / "ckptfs.log"
    keys = shared_top / "authorized_keys"
    keys.write_text("ssh-ed25519 AAAA admin@host\n")
    keys.chmod(0o600)
    p = atk.run(f"os.symlink({str(keys)!r}, {str(link)!r})")
    assert p.returncode == 0, describe(p, "planting as the attacker")
    refused_log_mount(mount_factory, shared_top / "b", shared_top / "m", [f"log={link}"], "symlink")
    assert keys.read_text() == "ssh-ed25519 AAAA admin@host\n"


def test_log_option_refuses_another_users_file(shared_top, mount_factory, users):
    # A log file the attacker made first stays theirs: they could read the
    # daemon's lines, or swap the file under it.
    atk, _ = users
    theirs = attacker_log_dir(shared_top, atk) / "ckptfs.log"
    p = atk.run(f"open({str(theirs)!r}, 'w').write('mine\\n')")
    assert p.returncode == 0, describe(p, "planting as the attacker")
    refused_log_mount(mount_factory, shared_top / "b", shared_top / "m", [f"log={theirs}"],
                      f"owned by uid {atk.uid}")
    assert theirs.read_text() == "mine\n"


def test_backing_log_symlink_is_refused(mount_factory, tmp_path):
    m = mount_factory()
    m.umount()
    target = tmp_path / "target"
    target.write_text("untouched\n")
    log = m.backing / "ckptfs.log"
    log.unlink()
    log.symlink_to(target)
    refused_log_mount(mount_factory, m.backing, m.mnt, [], "symlink")
    assert target.read_text() == "untouched\n"
    log.unlink()  # for the teardown's fsck and unmount


# ----------------------------------------------------- 3. fair, bounded sealing
# A seal skips a sparse file's holes (SEEK_DATA) and stores them as zero
# chunks; rm of a file stops its seal; small files never wait for another
# user's big seal (docs/ARCHITECTURE.md, "Seal path"). Interleavings are
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


def file_state(path: Path) -> str:
    return os.getxattr(path, "user.ckptfs.state").decode()


def wait_sealed(path: Path, what: str, timeout: float = 60.0):
    wait_for(lambda: file_state(path) == "sealed", what, timeout)


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


@pytest.fixture
def hold(shared_top):
    """A seal_hold file: seals wait while it exists. Removed when the test
    ends, before its mounts are (list the fixture after mount_factory)."""
    path = shared_top / "hold"
    path.touch()
    yield path
    path.unlink(missing_ok=True)


def test_rm_cancels_a_seal_and_umount_does_not_wait_for_it(mount_factory, shared_top, users, hold):
    atk, _ = users
    m = seal_mount(mount_factory, shared_top, f"seal_hold={hold}")
    sparse = home_of(m, atk) / "sparse"
    as_user(atk, pwrite_code(sparse, TB, b"X"), "the attacker's pwrite at 1 TB")
    # In progress: its pack is being written in tmp/ (reading holes), or
    # it is held before it publishes.
    wait_for(lambda: any((m.backing / "tmp").iterdir()), "the sparse file's seal to start")
    as_user(atk, f"os.unlink({str(sparse)!r})\n", "the attacker's rm")
    pid = m.live_pid()
    p = run_ckptfs("umount", m.mnt, timeout=60)
    assert p.returncode == 0, describe(p, "failed")
    assert wait_pid_exit(pid, 60), "the daemon still runs 60 s after umount"
    assert hold.exists(), "the hold was not what ended the seal"
    leftovers = [p.name for d in ("staging", "tmp") for p in (m.backing / d).iterdir()]
    assert leftovers == [], f"the deleted file left {leftovers} behind"


def test_a_big_seal_does_not_keep_another_users_small_file_staged(mount_factory, shared_top, users, hold):
    atk, vic = users
    m = seal_mount(mount_factory, shared_top, f"seal_hold={hold}")
    big, small = home_of(m, atk) / "big", home_of(m, vic) / "small"
    as_user(atk, f"with open({str(big)!r}, 'wb') as f:\n"
                 f"    for _ in range(96):\n        f.write(os.urandom(1 << 20))\n", "the attacker's write")
    wait_for(lambda: held_seals(m) == 1, "the attacker's big seal to reach the hold")
    # The only seal thread (seal_threads=1) is busy with the big file.
    as_user(vic, f"open({str(small)!r}, 'wb').write(b'v' * 100000)\n", "the victim's write")
    wait_for(lambda: held_seals(m) == 2, "the victim's seal to run beside the attacker's")
    assert file_state(big) == "staged"
    hold.unlink()
    wait_sealed(small, "the victim's small file to be sealed")
    wait_sealed(big, "the attacker's big file to be sealed")
    assert small.read_bytes() == b"v" * 100000


# ------------------------------------------------------- 4. lossy scope
# Under scope=models a torch tensor is lossy only when the pickle proves it
# a parameter or optimizer moment (a Module.state_dict()'s _metadata, an
# optimizer state_dict's entries); names never do (docs/SEMANTICS.md).

# Run by the attacker (Debian's torch 1.13 under /usr/bin/python3): saves
# each file into its lossy directory in the mount and into a plain
# directory under the same name (torch.save's zip embeds the name), so the
# plain copies are what every byte must read back as.
LOSSY_SAVES = r"""
import collections, sys, torch
mnt, ref = sys.argv[1], sys.argv[2]
torch.manual_seed(40)
n = 1 << 16
model = torch.nn.Sequential(torch.nn.Linear(256, 256), torch.nn.ReLU(), torch.nn.Linear(256, 256))
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
for _ in range(3):
    loss = model(torch.randn(32, 256)).pow(2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
files = {
    # issue 40's three data files named like parameters
    "sample_weight.pt": {"inputs": torch.randn(n // 64, 64), "labels": torch.randn(n),
                         "sample_weight": torch.rand(n)},
    "train_xy.pt": collections.OrderedDict(train_x=torch.randn(n // 64, 64), train_y=torch.randn(n)),
    "mnist.pt": {"mnist.train": torch.rand(n // 64, 64), "mnist.test": torch.rand(n // 128, 64)},
    # a model's tensors copied into a plain dict: no _metadata, no optimizer
    "plain_dict.pt": {k: v.clone() for k, v in model.state_dict().items()},
    # the positive control: a real checkpoint
    "checkpoint.pt": {"model": model.state_dict(), "optimizer": opt.state_dict(), "epoch": 3},
}
for name, obj in files.items():
    for d in (mnt, ref):
        torch.save(obj, d + "/" + name)
"""
EXACT = ("sample_weight.pt", "train_xy.pt", "mnist.pt", "plain_dict.pt")


def run_as(user: User, code: str, *args: str) -> subprocess.CompletedProcess:
    """`code` run by `user`'s own Python with argv[1:] = args."""
    return subprocess.run(["setpriv", f"--reuid={user.uid}", f"--regid={user.gid}", "--init-groups",
                           "--reset-env", PY, "-c", code, *args],
                          capture_output=True, text=True, timeout=300, cwd="/")


@pytest.mark.parametrize("policy", ["lossy", "lossy=aggressive"])
def test_lossy_policy_keeps_data_named_like_parameters_exact(shared_mount, shared_top, users, policy):
    atk, _ = users
    m = shared_mount
    home, ref = m.mnt / "atk", shared_top / "atk-ref"
    for d in (home, ref):
        d.mkdir()
        os.chown(d, atk.uid, atk.gid)
    res = atk.attempts({"own lossy dir": f"os.mkdir({str(home / 'run')!r}) or "
                                         f"os.setxattr({str(home / 'run')!r}, 'user.ckptfs.policy', {policy.encode()!r})"})
    assert res == {"own lossy dir": "OK"}, res
    p = run_as(atk, LOSSY_SAVES, str(home / "run"), str(ref))
    assert p.returncode == 0, describe(p, f"torch.save as {atk.name}")
    st = {e["path"].lstrip("/"): e for e in m.wait_sealed()["files"]}

    changed = []
    for name in EXACT:
        got, want = (home / "run" / name).read_bytes(), (ref / name).read_bytes()
        lossy = st[f"atk/run/{name}"]["lossy"]
        if got != want or lossy is not None:
            diff = sum(a != b for a, b in zip(got, want)) + abs(len(got) - len(want))
            changed.append(f"{name}: {diff} bytes differ, stats lossy={lossy}")
    assert not changed, f"under {policy}, data files were coded lossy:\n" + "\n".join(changed)

    # The control: the real checkpoint in the same directory is lossy.
    ctl = st["atk/run/checkpoint.pt"]["lossy"]
    assert ctl is not None and ctl["weights"]["elements"] == 2 * (256 * 256 + 256), ctl
    assert (home / "run" / "checkpoint.pt").read_bytes() != (ref / "checkpoint.pt").read_bytes()
