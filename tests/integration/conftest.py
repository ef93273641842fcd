"""Fixtures for integration tests against a real ckptfs FUSE mount.

Every test gets a fresh backing dir + mountpoint under pytest's tmp_path.

    def test_x(mount):            # a mounted filesystem; runs twice: default
        (mount.mnt / "f").write_bytes(b"...")   # options and -o writeback
        mount.remount()           # umount + mount the same backing dir

    def test_y(mount_factory):    # extra -o options / several mounts
        m = mount_factory(opts=["chunk_size=1M"])

Requires root (or /dev/fuse access) and the binary at build/ckptfs (or
$CKPTFS_BIN). A missing binary is a test failure, not a skip.
"""
from __future__ import annotations

import faulthandler
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
CKPTFS = Path(os.environ.get("CKPTFS_BIN") or (ROOT / "build" / "ckptfs")).resolve()
# Extra -o options for every mount the tests make, e.g. CKPTFS_TEST_OPTS=writeback
EXTRA_OPTS = [o for o in os.environ.get("CKPTFS_TEST_OPTS", "").split(",") if o]
# Per-test watchdog: when a test runs longer than this, every mount it owns is
# killed so a hung FUSE request turns into ENOTCONN instead of hanging CI.
TEST_TIMEOUT = float(os.environ.get("CKPTFS_TEST_TIMEOUT", "900"))
CMD_TIMEOUT = 180


def require_binary() -> Path:
    if not CKPTFS.exists():
        pytest.fail(
            f"ckptfs binary not found at {CKPTFS}; build it first "
            f"(bash scripts/build.sh) or set CKPTFS_BIN", pytrace=False)
    if not os.access(CKPTFS, os.X_OK):
        pytest.fail(f"{CKPTFS} is not executable", pytrace=False)
    if not os.path.exists("/dev/fuse"):
        pytest.fail("/dev/fuse does not exist (modprobe fuse?)", pytrace=False)
    return CKPTFS


def run_ckptfs(*args, timeout: float = CMD_TIMEOUT, check: bool = False,
               cwd=None) -> subprocess.CompletedProcess:
    """Runs build/ckptfs ARGS, capturing output into files (not pipes) so a
    daemon that inherits stdout/stderr can never block us."""
    require_binary()
    cmd = [str(CKPTFS), *[str(a) for a in args]]
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        try:
            rc = subprocess.run(cmd, stdin=subprocess.DEVNULL, stdout=out, stderr=err,
                                timeout=timeout, cwd=cwd).returncode
        except subprocess.TimeoutExpired:
            out.seek(0), err.seek(0)
            raise AssertionError(
                f"command timed out after {timeout}s: {' '.join(cmd)}\n"
                f"stdout: {out.read().decode(errors='replace')}\n"
                f"stderr: {err.read().decode(errors='replace')}")
        out.seek(0), err.seek(0)
        p = subprocess.CompletedProcess(cmd, rc, out.read().decode(errors="replace"),
                                        err.read().decode(errors="replace"))
    if check and p.returncode != 0:
        raise AssertionError(describe(p, "failed"))
    return p


def describe(p: subprocess.CompletedProcess, what: str = "") -> str:
    return (f"`{' '.join(map(str, p.args))}` {what} (exit {p.returncode})\n"
            f"--- stdout ---\n{p.stdout}\n--- stderr ---\n{p.stderr}")


def _unescape_mountinfo(s: str) -> str:
    out, i = [], 0
    while i < len(s):
        if s[i] == "\\" and i + 3 < len(s) and s[i + 1:i + 4].isdigit():
            out.append(chr(int(s[i + 1:i + 4], 8)))
            i += 4
        else:
            out.append(s[i])
            i += 1
    return "".join(out)


def mount_entry(mnt) -> dict | None:
    """The /proc/self/mountinfo entry for `mnt` (last one wins), or None.
    Works for stale mounts too (never stats the mountpoint)."""
    target = os.path.abspath(str(mnt))
    found = None
    with open("/proc/self/mountinfo") as f:
        for line in f:
            parts = line.split()
            if len(parts) < 10:
                continue
            if _unescape_mountinfo(parts[4]) == target:
                sep = parts.index("-")
                found = {"dev": parts[2], "fstype": parts[sep + 1],
                         "source": parts[sep + 2], "options": parts[5],
                         "super_options": parts[sep + 3] if len(parts) > sep + 3 else ""}
    return found


def is_mounted(mnt) -> bool:
    return mount_entry(mnt) is not None


def pid_alive(pid: int | None) -> bool:
    if not pid:
        return False
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("State:"):
                    return "Z" not in line.split()[1]
    except (FileNotFoundError, ProcessLookupError):
        return False
    return True


def pid_is_ckptfs(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return b"ckptfs" in f.read()
    except OSError:
        return False


def wait_pid_exit(pid: int | None, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while pid_alive(pid):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def vm_hwm_kib(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1])
    except OSError:
        return None
    return None


class Mount:
    """One backing dir served at one mountpoint."""

    def __init__(self, backing: Path, mnt: Path, opts=None, registry=None):
        self.backing = Path(os.path.abspath(backing))
        self.mnt = Path(os.path.abspath(mnt))
        self.opts = list(opts or [])
        self.pid: int | None = None
        # Teardown runs fsck on the backing dir after a clean unmount and
        # fails the test if it is not clean. Tests that corrupt the store on
        # purpose switch this off.
        self.fsck_at_teardown = True
        self.crashed = False  # set by kill9(), cleared by a successful mount()
        # A passive Mount shares its mountpoint or backing dir with another
        # Mount of the test (e.g. to provoke "busy"/"already served"); its
        # teardown only removes what it mounted itself.
        self.passive = False
        self._registry = registry
        if registry is not None:
            registry.append(self)

    # -- lifecycle -------------------------------------------------------
    def mount_args(self, opts=None, foreground=False):
        opts = self.opts if opts is None else list(opts)
        args = ["mount"]
        if foreground:
            args.append("-f")
        if opts:
            args += ["-o", ",".join(opts)]
        return args + [self.backing, self.mnt]

    def mount(self, opts=None, check=True) -> subprocess.CompletedProcess:
        if opts is not None:
            self.opts = list(opts)
        p = run_ckptfs(*self.mount_args())
        if p.returncode == 0:
            self.pid = self.daemon_pid()
        if check:
            assert p.returncode == 0, describe(p, "failed")
            assert is_mounted(self.mnt), describe(p, "returned 0 but nothing is mounted")
            self.pid = self.wait_live_pid()
            self.crashed = False
            assert self.pid, (f"no live daemon pid in {self.pid_file()} "
                              f"(it says {self.daemon_pid()})")
        return p

    def umount(self, check=True, wait=True) -> subprocess.CompletedProcess:
        pid = self.live_pid()
        p = run_ckptfs("umount", self.mnt)
        if check:
            assert p.returncode == 0, describe(p, "failed")
            assert not is_mounted(self.mnt), describe(p, "returned 0 but the mount is still there")
        if wait and pid and pid_is_ckptfs(pid):
            # the daemon finishes pending seals and exits after the unmount
            assert wait_pid_exit(pid, CMD_TIMEOUT), f"daemon {pid} still running after umount"
        return p

    def remount(self, opts=None):
        self.umount()
        self.mount(opts)

    def node(self) -> str | None:
        """The node name of a cluster-mode mount (-o cluster), else None."""
        names = [o.split("=", 1)[1] for o in self.opts if o.startswith("node=")]
        if names:
            return names[-1]
        return socket.gethostname() if "cluster" in self.opts else None

    def daemon_pid(self) -> int | None:
        """The pid the daemon records: in LOCK for a single-node store, in its
        membership record (nodes/NODE/member) in cluster mode."""
        node = self.node()
        if node is not None:
            try:
                return int(json.loads((self.backing / "nodes" / node / "member").read_text())["pid"])
            except (OSError, ValueError, KeyError, TypeError):
                return None
        try:
            txt = (self.backing / "LOCK").read_text().strip()
            return int(txt.split()[0]) if txt else None
        except (OSError, ValueError, IndexError):
            return None

    def pid_file(self) -> Path:
        node = self.node()
        return self.backing / "nodes" / node / "member" if node is not None else self.backing / "LOCK"

    def live_pid(self) -> int | None:
        if self.pid and pid_alive(self.pid) and pid_is_ckptfs(self.pid):
            return self.pid
        pid = self.daemon_pid()
        return pid if pid and pid_alive(pid) and pid_is_ckptfs(pid) else None

    def wait_live_pid(self, timeout: float = 10.0) -> int | None:
        """The daemon's pid from LOCK once it names a live ckptfs process.
        (test_cli.test_lock_names_daemon_when_mount_returns checks that no
        waiting is needed; everything else tolerates a short delay.)"""
        deadline = time.monotonic() + timeout
        while True:
            pid = self.daemon_pid()
            if pid and pid_alive(pid) and pid_is_ckptfs(pid):
                return pid
            if time.monotonic() > deadline:
                return None
            time.sleep(0.02)

    def kill9(self):
        """kill -9 the daemon (leaves a stale ENOTCONN mount behind)."""
        pid = self.live_pid()
        assert pid, f"no live daemon to kill ({self.pid_file()} says {self.daemon_pid()})"
        os.kill(pid, signal.SIGKILL)
        self.crashed = True
        assert wait_pid_exit(pid, 30), f"daemon {pid} survived SIGKILL"
        return pid

    # -- inspection ------------------------------------------------------
    def stats(self, path=None) -> dict:
        p = run_ckptfs("stats", "--json", path if path is not None else self.mnt)
        assert p.returncode == 0, describe(p, "failed")
        try:
            return json.loads(p.stdout)
        except json.JSONDecodeError as e:
            raise AssertionError(describe(p, f"printed invalid JSON: {e}"))

    def wait_sealed(self, timeout: float = 120.0) -> dict:
        """Polls `ckptfs stats --json` until no file is staged."""
        deadline = time.monotonic() + timeout
        while True:
            st = self.stats()
            staged = [f["path"] for f in st.get("files", []) if f.get("staged")]
            if not staged:
                return st
            if time.monotonic() > deadline:
                raise AssertionError(f"files still staged after {timeout}s: {staged[:20]}")
            time.sleep(0.1)

    def tool_args(self) -> list[str]:
        """What stats, fsck and gc need besides the store: where the Ceph
        configuration is, for packs in RADOS."""
        confs = [o.split("=", 1)[1] for o in self.opts if o.startswith("ceph_conf=")]
        return ["--ceph-conf", confs[-1]] if confs else []

    def fsck(self, *extra) -> subprocess.CompletedProcess:
        return run_ckptfs("fsck", *self.tool_args(), *extra, self.backing)

    def log_text(self) -> str:
        try:
            return (self.backing / "ckptfs.log").read_text(errors="replace")
        except FileNotFoundError:
            return ""

    def vm_hwm_kib(self) -> int | None:
        pid = self.live_pid()
        return vm_hwm_kib(pid) if pid else None

    # -- teardown --------------------------------------------------------
    def force_abort(self):
        """Watchdog path: make every pending request fail fast."""
        pid = self.live_pid()
        if pid:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        subprocess.run(["fusermount3", "-uz", str(self.mnt)], stdout=subprocess.DEVNULL,
                       stderr=subprocess.DEVNULL, timeout=30)

    def cleanup(self) -> str | None:
        """Unmounts whatever is left. Returns a problem description or None."""
        problems = []
        mounted = is_mounted(self.mnt)
        if self.passive:
            if self.pid and pid_alive(self.pid) and pid_is_ckptfs(self.pid):
                os.kill(self.pid, signal.SIGKILL)
                problems.append(f"passive mount left daemon {self.pid} running; killed")
            return "\n".join(problems) or None
        pid = self.live_pid() if mounted else self.pid
        clean = False
        if mounted:
            try:
                p = run_ckptfs("umount", self.mnt, timeout=120)
                clean = p.returncode == 0 and not is_mounted(self.mnt)
                if not clean:
                    problems.append(describe(p, "failed at teardown"))
            except BaseException as e:  # timeout, or the binary vanished (rebuild)
                problems.append(f"ckptfs umount at teardown: {e!r}")
                self.force_abort()
            if is_mounted(self.mnt):
                subprocess.run(["fusermount3", "-uz", str(self.mnt)],
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=30)
        else:
            clean = True
        if pid and pid_alive(pid) and pid_is_ckptfs(pid) and not wait_pid_exit(pid, 60):
            problems.append(f"daemon {pid} did not exit after umount; killed")
            clean = False
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            wait_pid_exit(pid, 10)
        if (clean and self.fsck_at_teardown and not self.crashed
                and (self.backing / "ns").is_dir() and CKPTFS.exists()):
            p = self.fsck()
            if p.returncode != 0:
                problems.append(describe(p, "reports problems after a clean unmount"))
        return "\n".join(problems) or None


_ACTIVE: list[Mount] = []


@pytest.fixture(scope="session")
def ckptfs_bin() -> Path:
    return require_binary()


@pytest.fixture(autouse=True)
def _watchdog(request):
    """Kills this test's mounts when it runs past TEST_TIMEOUT; dumps stacks
    and exits the whole run if even that does not unblock it."""
    fired = threading.Event()

    def fire():
        fired.set()
        sys.stderr.write(f"\n*** {request.node.nodeid}: exceeded {TEST_TIMEOUT}s; "
                         f"aborting its mounts\n")
        for m in list(_ACTIVE):
            try:
                m.force_abort()
            except Exception:
                pass

    t = threading.Timer(TEST_TIMEOUT, fire)
    t.daemon = True
    t.start()
    faulthandler.dump_traceback_later(TEST_TIMEOUT + 300, exit=True)
    try:
        yield
    finally:
        t.cancel()
        faulthandler.cancel_dump_traceback_later()
    if fired.is_set():
        pytest.fail(f"test exceeded {TEST_TIMEOUT}s (mounts were aborted)")


@pytest.fixture
def mount_factory(tmp_path, ckptfs_bin):
    """mount_factory(opts=None, name='m', backing=None, mnt=None, mount=True,
    passive=False) -> Mount. Backing dir / mountpoint default to fresh dirs in tmp_path."""
    mine: list[Mount] = []
    counter = [0]

    def make(opts=None, name=None, backing=None, mnt=None, mount=True, passive=False) -> Mount:
        counter[0] += 1
        opts = EXTRA_OPTS + list(opts or [])
        name = name or f"m{counter[0]}"
        backing = Path(backing) if backing else tmp_path / f"{name}-backing"
        mnt = Path(mnt) if mnt else tmp_path / f"{name}-mnt"
        backing.mkdir(parents=True, exist_ok=True)
        mnt.mkdir(parents=True, exist_ok=True)
        m = Mount(backing, mnt, opts)
        m.passive = passive
        mine.append(m)
        _ACTIVE.append(m)
        if mount:
            m.mount()
        return m

    yield make

    problems = []
    for m in reversed(mine):
        try:
            pr = m.cleanup()
        except BaseException as e:  # never leave a mount behind because of a bug here
            pr = f"cleanup crashed: {e!r}"
            try:
                m.force_abort()
            except Exception:
                pass
        if pr:
            problems.append(f"[{m.mnt}] {pr}")
        if m in _ACTIVE:
            _ACTIVE.remove(m)
    if problems:
        pytest.fail("teardown problems:\n" + "\n".join(problems), pytrace=False)


# Every test that uses `mount` runs twice: default options, and with the
# kernel writeback cache (a different write path through the kernel) and
# three sealing workers per file (a different seal path; CI's two cores
# would otherwise always get one).
MOUNT_VARIANTS = {"default": [], "writeback": ["writeback", "seal_workers=3"]}


@pytest.fixture(params=list(MOUNT_VARIANTS))
def mount(request, mount_factory) -> Mount:
    return mount_factory(name="fs", opts=MOUNT_VARIANTS[request.param])


@pytest.fixture
def plain_dir(tmp_path) -> Path:
    """A plain (non-FUSE) directory on the same disk, for reference copies."""
    d = tmp_path / "plain"
    d.mkdir()
    return d


def ckptfs_features() -> set[str]:
    """What this build can do: the "+name" words of `ckptfs --version`'s
    features line (optional backends: rados, cuda)."""
    lines = run_ckptfs("--version", check=True).stdout.splitlines()
    words = next((l.split()[1:] for l in lines if l.startswith("features:")), [])
    return {w[1:] for w in words if w.startswith("+")}


@pytest.fixture(scope="session")
def needs_rados():
    """Skips a test of packs=rados:POOL when this ckptfs was built without
    RADOS (-DCKPTFS_WITH_RADOS=OFF). Session-scoped, and named before `ceph`,
    so that the skip comes before the Ceph cluster starts."""
    if "rados" not in ckptfs_features():
        pytest.skip("this ckptfs was built without RADOS (ckptfs --version: -rados)")


@pytest.fixture(scope="session")
def ceph():
    """A one-machine Ceph cluster (ceph_cluster.CephCluster: mon, memstore
    OSD, MDS, CephFS mounted by ceph-fuse, the RADOS pool `ckptfs`), started
    once for every test that asks for it (about half a minute) and stopped
    at the end of the run, also when it is interrupted. Missing Ceph
    packages are a failure; CKPTFS_SKIP_CEPH=1 skips these tests instead."""
    from ceph_cluster import CephCluster, CephError, missing_binaries

    if os.environ.get("CKPTFS_SKIP_CEPH") == "1":
        pytest.skip("CKPTFS_SKIP_CEPH=1: tests on a Ceph cluster skipped")
    missing = missing_binaries()
    if missing:
        pytest.fail(f"Ceph is not installed (missing {', '.join(missing)}); run scripts/install-deps.sh, "
                    f"or set CKPTFS_SKIP_CEPH=1 to skip the tests on a Ceph cluster", pytrace=False)
    cluster = CephCluster()
    # A run ended by SIGTERM (a CI time-out) unwinds like ^C, through stop().
    previous = signal.getsignal(signal.SIGTERM)
    if previous == signal.SIG_DFL:
        signal.signal(signal.SIGTERM, signal.default_int_handler)
    try:
        try:
            cluster.start()
        except CephError as e:
            pytest.fail(str(e), pytrace=False)
        yield cluster
    finally:
        problems = cluster.stop()
        signal.signal(signal.SIGTERM, previous)
    if problems:
        pytest.fail("stopping the Ceph cluster:\n" + "\n".join(problems), pytrace=False)
