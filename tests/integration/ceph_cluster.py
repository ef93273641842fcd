"""A one-machine Ceph cluster for the cluster-mode tests and bench.

CephCluster starts, in a fresh temporary directory, the cluster of
/work/shared/notes/cluster.md: one monitor, one memstore OSD, one MDS, the
CephFS `cfs`, a RADOS pool (`ckptfs`), and ceph-fuse on a directory.

    with CephCluster() as c:              # or c = CephCluster(); c.start(); ...; c.stop()
        c.conf                            # path of its ceph.conf (ceph -c, -o ceph_conf=)
        c.cephfs_mount                    # the CephFS, mounted through ceph-fuse
        c.pool                            # the RADOS pool for -o packs=rados:POOL
        c.mount_cephfs(DIR)               # one more CephFS client (e.g. one per "node")
        c.bytes_used()                    # bytes the OSD stores

Nothing it starts can clash with a second cluster on the machine: the
monitor listens on a port picked free at start, the OSD and MDS bind free
ports themselves, and every path (data, sockets, logs) is under its own
directory. Every daemon runs in the foreground as our child, so stop() ends
exactly the processes it started, by PID; the daemons also get SIGKILL from
the kernel if the process that started them dies (PR_SET_PDEATHSIG), and an
atexit hook stops clusters a caller forgot. A start that fails or times out
stops everything it started and raises CephError with the tails of the
daemons' logs.

Requires root (ceph-fuse) and the Debian packages ceph-mon, ceph-osd,
ceph-mds, ceph-fuse and ceph-common (scripts/install-deps.sh).
"""
from __future__ import annotations

import atexit
import ctypes
import json
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import uuid
from pathlib import Path

START_TIMEOUT = float(os.environ.get("CKPTFS_CEPH_START_TIMEOUT", "240"))
CMD_TIMEOUT = 60.0
# The OSD keeps every object in memory (memstore); the tests store well under this.
DEFAULT_MEMSTORE_BYTES = 2 << 30
BINARIES = ("monmaptool", "ceph-mon", "ceph-osd", "ceph-mds", "ceph-fuse", "ceph", "rados")

_PR_SET_PDEATHSIG = 1
_libc = ctypes.CDLL("libc.so.6", use_errno=True)
_LIVE: list["CephCluster"] = []


class CephError(RuntimeError):
    pass


def missing_binaries() -> list[str]:
    return [b for b in BINARIES if shutil.which(b) is None]


def _die_with_parent():
    # Runs in the child between fork and exec: a daemon outlives nothing that
    # started it, even a test run killed with SIGKILL.
    _libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    os.setpgid(0, 0)  # a ^C at the terminal reaches the test run only; it stops us


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _mounted(path: Path) -> bool:
    return _fuse_connection(path) is not None


def _fuse_connection(path: Path) -> int | None:
    """The FUSE connection id (the device minor) of the mount on PATH, or None."""
    target = os.path.abspath(path)
    found = None
    with open("/proc/self/mountinfo") as f:
        for line in f:
            parts = line.split()
            if parts[4] == target:
                found = int(parts[2].split(":")[1])
    return found


def _abort_fuse_connection(conn: int) -> None:
    """Fails every request pending on a FUSE connection. A ceph-fuse told to
    stop while a reader waits on it can hang in its exit on a page that
    reader holds locked; the abort frees both."""
    ctl = Path("/sys/fs/fuse/connections")
    if not any(ctl.iterdir()):
        subprocess.run(["mount", "-t", "fusectl", "none", str(ctl)], capture_output=True, timeout=30)
    try:
        (ctl / str(conn) / "abort").write_text("1")
    except OSError:
        pass  # gone already


def _tail(path: Path, lines: int = 25) -> str:
    try:
        text = path.read_text(errors="replace").splitlines()
    except OSError as e:
        return f"({e})"
    return "\n".join(text[-lines:])


class CephCluster:
    def __init__(self, base_dir: str | os.PathLike | None = None, pool: str = "ckptfs",
                 memstore_bytes: int = DEFAULT_MEMSTORE_BYTES, start_timeout: float = START_TIMEOUT):
        # Unix socket paths are limited to 107 bytes: the admin sockets go in a
        # short directory under /tmp even when base_dir is deep.
        self.dir = Path(tempfile.mkdtemp(prefix="ckptfs-ceph-", dir=base_dir))
        self.run_dir = Path(tempfile.mkdtemp(prefix="ckptfs-ceph-run-", dir="/tmp"))
        self.log_dir = self.dir / "log"
        self.conf = self.dir / "ceph.conf"
        self.cephfs_mount = self.dir / "cephfs"
        self.pool = pool
        self.fs_name = "cfs"
        self.memstore_bytes = memstore_bytes
        self.start_timeout = start_timeout
        self.port = 0
        self.osd_id: int | None = None
        self._procs: list[tuple[str, subprocess.Popen]] = []
        self._fuse_mounts: list[Path] = []
        self._deadline = 0.0
        self._stopped = False

    # -- lifecycle -------------------------------------------------------
    def __enter__(self) -> "CephCluster":
        return self.start()

    def __exit__(self, *exc):
        self.stop()

    def start(self) -> "CephCluster":
        missing = missing_binaries()
        if missing:
            raise CephError(f"Ceph is not installed (missing {', '.join(missing)}); "
                            f"run scripts/install-deps.sh")
        _LIVE.append(self)
        self._deadline = time.monotonic() + self.start_timeout
        try:
            self._start_monitor()
            self._start_osd()
            self._create_pools_and_fs()
            self._start_mds()
            self._check_rados()
            self.mount_cephfs(self.cephfs_mount)
        except BaseException as e:
            report = self._failure_report(e)
            self.stop()
            if isinstance(e, (KeyboardInterrupt, SystemExit)):
                raise
            raise CephError(report) from e
        return self

    def stop(self) -> list[str]:
        """Unmounts every ceph-fuse mount it made and ends every daemon it
        started (SIGTERM, then SIGKILL). Returns what went wrong, if anything."""
        if self._stopped:
            return []
        self._stopped = True
        problems = []
        for mnt in reversed(self._fuse_mounts):
            conn = _fuse_connection(mnt)
            if conn is None:
                continue
            p = subprocess.run(["fusermount3", "-u", str(mnt)], capture_output=True, text=True, timeout=60)
            if p.returncode != 0:
                problems.append(f"fusermount3 -u {mnt}: {p.stderr.strip()}; aborted and detached")
                _abort_fuse_connection(conn)
                subprocess.run(["fusermount3", "-u", "-z", str(mnt)], capture_output=True, timeout=60)
        # Clients and the MDS first, the monitor last: a daemon whose
        # monitor is gone hangs in its shutdown instead of exiting.
        for name, p in reversed(self._procs):
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
            try:
                p.wait(timeout=5)
            except subprocess.TimeoutExpired:
                p.kill()  # memstore: nothing on disk to lose
                try:
                    p.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    problems.append(f"{name} (pid {p.pid}) survived SIGKILL")
        if self in _LIVE:
            _LIVE.remove(self)
        shutil.rmtree(self.run_dir, ignore_errors=True)
        if not problems:
            shutil.rmtree(self.dir, ignore_errors=True)
        return problems

    def pids(self) -> dict[str, int]:
        return {name: p.pid for name, p in self._procs if p.poll() is None}

    # -- what the tests use ----------------------------------------------
    def ceph(self, *args, timeout: float = CMD_TIMEOUT, check: bool = True) -> subprocess.CompletedProcess:
        return self._run(["ceph", "-c", str(self.conf), *map(str, args)], timeout, check)

    def rados(self, *args, timeout: float = CMD_TIMEOUT, check: bool = True) -> subprocess.CompletedProcess:
        return self._run(["rados", "-c", str(self.conf), *map(str, args)], timeout, check)

    def bytes_used(self) -> int:
        """Bytes the cluster stores: the sizes of every object in every pool
        (one replica per object here, and memstore allocates exactly the
        data). `ceph df` and `rados df` report nothing without a ceph-mgr,
        which this cluster does not run, and the OSD's own statfs counter
        lags by a heartbeat. Flushes the CephFS clients' dirty data first."""
        self.flush_clients()
        return sum(self.pool_bytes(pool) for pool in self.pools())

    def flush_clients(self) -> None:
        """syncfs on every ceph-fuse mount: their dirty data reaches the OSD."""
        for mnt in self._fuse_mounts:
            fd = os.open(mnt, os.O_RDONLY | os.O_DIRECTORY)
            try:
                _libc.syncfs(fd)
            finally:
                os.close(fd)

    def pools(self) -> list[str]:
        return self.rados("lspools").stdout.split()

    def pool_bytes(self, pool: str) -> int:
        """The sum of the sizes of POOL's objects (logical bytes, not replicas)."""
        try:
            import rados  # python3-rados; absent from a venv without system site packages
        except ImportError:
            return self._pool_bytes_cli(pool)
        with rados.Rados(conffile=str(self.conf)) as cluster:
            with cluster.open_ioctx(pool) as io:
                io.set_namespace(rados.LIBRADOS_ALL_NSPACES)
                objects = [(o.nspace, o.key) for o in io.list_objects()]
                total = 0
                for nspace, key in objects:
                    io.set_namespace(nspace)
                    total += io.stat(key)[0]
                return total

    def _pool_bytes_cli(self, pool: str) -> int:
        total = 0
        for line in filter(None, self.rados("-p", pool, "ls", "--all").stdout.splitlines()):
            nspace, _, name = line.rpartition("\t")  # "NAMESPACE<tab>NAME"
            st = self.rados("-p", pool, "-N", nspace, "stat", name).stdout  # "POOL/NAME mtime ..., size N"
            total += int(st.rsplit("size", 1)[1].strip())
        return total

    def mount_cephfs(self, mnt: str | os.PathLike) -> Path:
        """Mounts the CephFS on MNT through a new ceph-fuse client (one per
        simulated node makes each node a CephFS client of its own)."""
        mnt = Path(os.path.abspath(mnt))
        mnt.mkdir(parents=True, exist_ok=True)
        name = f"ceph-fuse[{mnt}]"
        proc = self._spawn(name, ["ceph-fuse", "-f", "-c", str(self.conf), str(mnt)])
        self._fuse_mounts.append(mnt)
        deadline = time.monotonic() + 120
        probe = mnt / f".probe-{uuid.uuid4().hex}"
        while True:
            if proc.poll() is not None:
                raise CephError(f"{name} exited with {proc.returncode}\n{self._stderr_tail(name)}")
            if _mounted(mnt):
                try:
                    probe.write_bytes(b"probe")
                    ok = probe.read_bytes() == b"probe"
                    probe.unlink()
                    if ok:
                        return mnt
                except OSError:
                    pass
            if time.monotonic() > deadline:
                raise CephError(f"{name}: CephFS not usable on {mnt} in time\n{self._stderr_tail(name)}")
            time.sleep(0.2)

    def umount_cephfs(self, mnt: str | os.PathLike) -> None:
        mnt = Path(os.path.abspath(mnt))
        subprocess.run(["fusermount3", "-u", str(mnt)], check=True, capture_output=True, timeout=60)
        name = f"ceph-fuse[{mnt}]"
        for n, p in self._procs:
            if n == name and p.poll() is None:
                p.wait(timeout=30)
        self._fuse_mounts.remove(mnt)

    # -- start-up steps --------------------------------------------------
    def _write_conf(self, fsid: str) -> None:
        d = self.dir
        self.conf.write_text(f"""[global]
fsid = {fsid}
mon host = v2:127.0.0.1:{self.port}
mon initial members = a
auth cluster required = none
auth service required = none
auth client required = none
osd pool default size = 1
osd pool default min size = 1
mon allow pool size one = true
mon warn on pool no redundancy = false
mon data avail crit = 1
osd objectstore = memstore
memstore device bytes = {self.memstore_bytes}
osd crush chooseleaf type = 0
run dir = {self.run_dir}
log file = {self.log_dir}/$name.log
keyring = /dev/null
[mon.a]
mon data = {d}/mon
[osd.0]
osd data = {d}/osd0
[mds.a]
mds data = {d}/mds
""")

    def _start_monitor(self) -> None:
        for sub in ("mon", "osd0", "mds", "log"):
            (self.dir / sub).mkdir()
        fsid = str(uuid.uuid4())
        self.port = _free_port()
        self._write_conf(fsid)
        monmap = self.dir / "monmap"
        self._run(["monmaptool", "--create", "--addv", "a", f"[v2:127.0.0.1:{self.port}]", "--fsid", fsid,
                   str(monmap)], CMD_TIMEOUT, True)
        self._run(["ceph-mon", "-c", str(self.conf), "--mkfs", "-i", "a", "--monmap", str(monmap)],
                  CMD_TIMEOUT, True)
        self._spawn("ceph-mon", ["ceph-mon", "-f", "-c", str(self.conf), "-i", "a"])
        self._wait("the monitor to answer", lambda: self._try_ceph("mon", "stat") is not None)

    def _start_osd(self) -> None:
        osd_uuid = str(uuid.uuid4())
        self.osd_id = int(self.ceph("osd", "new", osd_uuid).stdout.strip())
        if self.osd_id != 0:
            raise CephError(f"expected osd id 0 from `ceph osd new`, got {self.osd_id}")
        self._run(["ceph-osd", "-c", str(self.conf), "-i", "0", "--mkfs", "--osd-uuid", osd_uuid], CMD_TIMEOUT, True)
        self._spawn("ceph-osd", ["ceph-osd", "-f", "-c", str(self.conf), "-i", "0"])

        def osd_up():
            out = self._try_ceph("osd", "dump", "--format", "json")
            return out is not None and any(o["osd"] == 0 and o["up"] for o in json.loads(out)["osds"])

        self._wait("osd.0 to be up", osd_up)

    def _create_pools_and_fs(self) -> None:
        for pool in (self.pool, "cephfs_meta", "cephfs_data"):
            self.ceph("osd", "pool", "create", pool, "8")
        self.ceph("fs", "new", self.fs_name, "cephfs_meta", "cephfs_data")

    def _start_mds(self) -> None:
        self._spawn("ceph-mds", ["ceph-mds", "-f", "-c", str(self.conf), "-i", "a"])

        def mds_active():
            out = self._try_ceph("fs", "dump", "--format", "json")
            if out is None:
                return False
            for fs in json.loads(out).get("filesystems", []):
                if fs["mdsmap"]["fs_name"] == self.fs_name:
                    return any(i["state"] == "up:active" for i in fs["mdsmap"]["info"].values())
            return False

        self._wait("the MDS to be active", mds_active)

    def _check_rados(self) -> None:
        """A put and get: the pool's placement groups are active."""
        src = self.dir / "rados-probe"
        back = self.dir / "rados-probe.back"
        src.write_bytes(os.urandom(4096))
        self.rados("-p", self.pool, "put", "ckptfs-probe", src, timeout=self._left())
        self.rados("-p", self.pool, "get", "ckptfs-probe", back, timeout=self._left())
        self.rados("-p", self.pool, "rm", "ckptfs-probe", timeout=self._left())
        if back.read_bytes() != src.read_bytes():
            raise CephError("a RADOS object read back differs from what was put")

    # -- plumbing --------------------------------------------------------
    def _spawn(self, name: str, argv: list[str]) -> subprocess.Popen:
        err = open(self.log_dir / f"{name.replace('/', '_')}.stderr", "wb")
        try:
            proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=err, stderr=subprocess.STDOUT,
                                    preexec_fn=_die_with_parent)
        finally:
            err.close()
        self._procs.append((name, proc))
        return proc

    def _stderr_tail(self, name: str) -> str:
        return _tail(self.log_dir / f"{name.replace('/', '_')}.stderr")

    def _left(self) -> float:
        return max(1.0, self._deadline - time.monotonic())

    def _run(self, argv: list, timeout: float, check: bool) -> subprocess.CompletedProcess:
        argv = [str(a) for a in argv]
        try:
            p = subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=timeout)
        except subprocess.TimeoutExpired:
            raise CephError(f"`{' '.join(argv)}` timed out after {timeout:.0f}s")
        if check and p.returncode != 0:
            raise CephError(f"`{' '.join(argv)}` failed (exit {p.returncode})\n{p.stdout}\n{p.stderr}")
        return p

    def _try_ceph(self, *args) -> str | None:
        try:
            p = self._run(["ceph", "-c", str(self.conf), "--connect-timeout", "10", *args],
                          min(CMD_TIMEOUT, self._left()), False)
        except CephError:
            return None
        return p.stdout if p.returncode == 0 else None

    def _wait(self, what: str, ready) -> None:
        while not ready():
            for name, p in self._procs:
                if p.poll() is not None:
                    raise CephError(f"{name} exited with {p.returncode} while waiting for {what}")
            if time.monotonic() > self._deadline:
                raise CephError(f"timed out after {self.start_timeout:.0f}s waiting for {what}")
            time.sleep(0.5)

    def _failure_report(self, e: BaseException) -> str:
        lines = [f"Ceph cluster in {self.dir} did not start: {e}"]
        for name, p in self._procs:
            state = "running" if p.poll() is None else f"exited {p.returncode}"
            lines.append(f"--- {name} (pid {p.pid}, {state}), stderr:\n{self._stderr_tail(name)}")
        for log in sorted(self.log_dir.glob("*.log")) if self.log_dir.is_dir() else []:
            lines.append(f"--- {log.name}:\n{_tail(log)}")
        return "\n".join(lines)


@atexit.register
def _stop_forgotten_clusters():
    for c in list(_LIVE):
        c.stop()
