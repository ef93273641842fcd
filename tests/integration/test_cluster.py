"""Cluster mode on a real Ceph cluster (issue 16): three ckptfs daemons,
nodes n0, n1 and n2, each with its own mount point and node-local staging
directory, serving one store directory on CephFS.

Each node reaches the store through a CephFS client of its own (a ceph-fuse
mount per node, as on three machines), so what one node's daemon writes the
others see only through Ceph. The cluster (conftest.py `ceph`, started once
per run) is ceph_cluster.CephCluster; the daemons are the usual
mount_factory mounts with -o cluster,node=nI,staging=DIR.

What is checked, per docs/SEMANTICS.md "Cluster mode":
- DCP saves at world size 3, every rank through its own node, restored at
  world size 2 through other nodes (resharding), bit-exact; later steps
  stored as deltas of earlier ones written by other nodes; packs in the
  store directory and in a RADOS pool;
- kill -9 of a node in mid-save: no survivor ever sees a partial file, the
  previous checkpoint and the survivors' files stay intact, the remount of
  the killed node recovers what it had closed;
- cluster GC on one node while another seals a delta of a pack the GC's
  node left unreferenced;
- a DeepSpeed-style layout, 8 ranks over 3 nodes, written concurrently;
- close-to-open consistency, last rename wins, files being written on one
  node are invisible (ENOENT) on the others until closed.
"""
from __future__ import annotations

import json
import os
import random
import select
import subprocess
import tempfile
import threading
import time
import uuid
from pathlib import Path

import pytest

from conftest import ROOT, describe, run_ckptfs
from helpers import float_like, read_file, sha256_file, snapshot_tree
from test_clients import pypi_python  # noqa: F401  (fixture)

NODES = 3
# Cross-node visibility is bounded by the kernel's caches of the reading node.
ATTR_TIMEOUT = 1
NODE_OPTS = [f"attr_timeout={ATTR_TIMEOUT}", f"entry_timeout={ATTR_TIMEOUT}"]
DEBIAN_PYTHON = ROOT / ".venv-debian" / "bin" / "python"
CLIENTS = Path(__file__).resolve().parent / "clients"
CLIENT_TIMEOUT = float(os.environ.get("CKPTFS_CLIENT_TIMEOUT", "600"))


# -- fixtures -----------------------------------------------------------------
@pytest.fixture(scope="session")
def node_cephfs(ceph) -> list[Path]:
    """One CephFS client (ceph-fuse mount) per node, for the whole run."""
    return [ceph.mount_cephfs(ceph.dir / f"client-n{i}") for i in range(NODES)]


class Cluster:
    """Three daemons over one store directory on CephFS."""

    def __init__(self, ceph, clients: list[Path], make_mount, tmp_path: Path, opts: list[str]):
        self.ceph = ceph
        self.tmp_path = tmp_path
        self.store_name = f"stores/{uuid.uuid4().hex[:12]}"
        self.nodes = []
        for i in range(NODES):
            self.nodes.append(make_mount(
                name=f"n{i}", backing=clients[i] / self.store_name, mnt=tmp_path / f"n{i}-mnt",
                opts=["cluster", f"node=n{i}", f"staging={tmp_path / f'n{i}-staging'}", *NODE_OPTS, *opts]))

    @property
    def backing(self) -> Path:
        return self.nodes[0].backing

    def path(self, node: int, rel: str) -> Path:
        return self.nodes[node % NODES].mnt / rel

    def stats(self) -> dict:
        """`ckptfs stats --json BACKING`: {path: entry} of every file in the store."""
        p = run_ckptfs("stats", "--json", *self.nodes[0].tool_args(), self.backing)
        assert p.returncode == 0, describe(p, "failed")
        return {f["path"]: f for f in json.loads(p.stdout)["files"]}

    def wait_sealed(self, timeout: float = 300) -> dict:
        deadline = time.monotonic() + timeout
        while True:
            files = self.stats()
            staged = sorted(p for p, f in files.items() if f["staged"])
            if not staged:
                return files
            assert time.monotonic() < deadline, f"files still staged after {timeout}s: {staged[:20]}"
            time.sleep(0.2)

    def fsck(self):
        p = self.nodes[0].fsck()
        assert p.returncode == 0, describe(p, "reports problems")

    def gc(self, node: int = 0, grace: int = 0) -> subprocess.CompletedProcess:
        """`ckptfs gc --grace GRACE BACKING`, BACKING as NODE's CephFS client sees it."""
        n = self.nodes[node]
        p = run_ckptfs("gc", "--grace", grace, *n.tool_args(), n.backing)
        assert p.returncode == 0, describe(p, "failed")
        return p

    def trees(self, rel: str) -> list[dict]:
        return [snapshot_tree(n.mnt / rel) for n in self.nodes]

    def assert_same_everywhere(self, rel: str, want: dict[str, str] | None = None) -> None:
        """Every node lists the same files under REL with the same bytes (and,
        given WANT {name: sha256}, those)."""
        trees = self.trees(rel)
        for i, t in enumerate(trees[1:], 1):
            assert t == trees[0], f"node n{i} sees {rel} differently from n0:\n{t}\n{trees[0]}"
        if want is not None:
            got = {k: v[1][1] for k, v in trees[0].items() if v[0] == "f"}
            assert got == want, f"{rel}: read {got}, written {want}"


@pytest.fixture
def cluster_factory(request, ceph, node_cephfs, tmp_path):
    """cluster_factory(opts=[]) -> Cluster. mount_factory is set up after the
    CephFS clients, so its teardown (unmount, fsck) runs before theirs."""
    make_mount = request.getfixturevalue("mount_factory")
    return lambda opts=(): Cluster(ceph, node_cephfs, make_mount, tmp_path, list(opts))


class Client:
    """A long-lived client script: one command per line on its stdin, one
    JSON line back on its stdout."""

    def __init__(self, python: Path, script: str, *args):
        env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")}
        env.update(PYTHONDONTWRITEBYTECODE="1", PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1")
        self.args = [str(python), str(CLIENTS / script), *map(str, args)]
        self.err = tempfile.TemporaryFile()
        self.proc = subprocess.Popen(self.args, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.err,
                                     cwd=ROOT, env=env)

    def stderr(self) -> str:
        self.err.seek(0)
        return self.err.read().decode(errors="replace")[-8000:]

    def send(self, *words) -> dict:
        line = " ".join(map(str, words))
        self.proc.stdin.write((line + "\n").encode())
        self.proc.stdin.flush()
        ready, _, _ = select.select([self.proc.stdout], [], [], CLIENT_TIMEOUT)
        out = self.proc.stdout.readline() if ready else b""
        assert out, f"`{line}`: no answer from {' '.join(self.args)} (exit {self.proc.poll()})\n{self.stderr()}"
        rep = json.loads(out)
        assert rep["ok"], f"`{line}` failed:\n{rep.get('error')}\n--- stderr ---\n{self.stderr()}"
        return rep

    def close(self):
        if self.proc.poll() is None:
            self.proc.stdin.close()
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.err.close()


@pytest.fixture
def dcp_client(pypi_python):
    c = Client(pypi_python, "dcp_cluster.py")
    yield c
    c.close()


# -- the Ceph cluster itself ----------------------------------------------------
def test_ceph_cluster_smoke(ceph, tmp_path):
    """The fixture's cluster works: a file through ceph-fuse, an object through RADOS."""
    data = os.urandom(3 << 20)
    f = ceph.cephfs_mount / f"smoke-{uuid.uuid4().hex}"
    f.write_bytes(data)
    assert f.read_bytes() == data
    before = ceph.bytes_used()
    src, back = tmp_path / "obj", tmp_path / "obj.back"
    src.write_bytes(data[:1 << 20])
    ceph.rados("-p", ceph.pool, "put", "smoke", src)
    ceph.rados("-p", ceph.pool, "get", "smoke", back)
    assert back.read_bytes() == src.read_bytes()
    assert ceph.bytes_used() >= before + (1 << 20)
    import rados  # python3-rados, the Python API the bench may use
    with rados.Rados(conffile=str(ceph.conf)) as r, r.open_ioctx(ceph.pool) as io:
        assert io.read("smoke", length=1 << 20) == src.read_bytes()
        io.remove_object("smoke")
    f.unlink()


def test_failed_start_leaves_no_daemon(ceph, monkeypatch):
    """A second cluster beside the running one (its own port and directories)
    whose start fails after its monitor and OSD are up: CephError, and every
    process it started is gone."""
    from ceph_cluster import CephCluster, CephError

    second = CephCluster()

    def fail():
        raise RuntimeError("injected failure before the MDS")

    monkeypatch.setattr(second, "_start_mds", fail)
    with pytest.raises(CephError, match="injected failure") as e:
        second.start()
    assert "ceph-mon" in str(e.value) and "ceph-osd" in str(e.value)  # the report names them
    assert second.port != 0 and not second.pids(), second.pids()
    assert not second.dir.exists() and not second.run_dir.exists()
    for name, p in second._procs:
        assert p.poll() is not None, f"{name} (pid {p.pid}) still running"
    assert "ceph-mon" in ceph.pids()  # the session's cluster is untouched
    ceph.ceph("mon", "stat")


# -- DCP over three nodes -------------------------------------------------------
def dcp_round_trips(c: Cluster, dcp, steps: int = 3) -> dict:
    """Saves steps 1..STEPS at world size 3 (rank r through node (r+step)%3),
    restores each at world size 2 through the next nodes, and once more at the
    end through yet others. Returns the store's files after the last seal."""
    written = {}
    for step in range(1, steps + 1):
        rel = f"ckpt/step{step}"
        save = dcp.send("save", step, *[c.path(r + step, rel) for r in range(3)])
        written[step] = save["files"]
        assert len([n for n in save["files"] if n.endswith(".distcp")]) == 3, save["files"]
        # close-to-open: loads right away, through nodes that did not write rank 0's shard
        load = dcp.send("load", step, *[c.path(r + step + 1, rel) for r in range(2)])
        assert load["files"] == save["files"]
        c.wait_sealed()
        c.assert_same_everywhere(rel, save["files"])
    for step in range(1, steps + 1):
        load = dcp.send("load", step, *[c.path(r + step + 2, f"ckpt/step{step}") for r in range(2)])
        assert load["files"] == written[step]
    return c.wait_sealed()


def assert_shards_are_deltas(files: dict, steps: int = 3) -> None:
    """Every shard of a later step is stored against an earlier step's shard
    of the same rank, written through another node (ranks rotate over
    nodes). By layout every rank's shard matches every other's; the content
    tells them apart (store/base_closeness.h)."""
    for step in range(2, steps + 1):
        for r in range(3):
            f = files[f"ckpt/step{step}/__{r}_0.distcp"]
            earlier = {f"ckpt/step{k}/__{r}_0.distcp" for k in range(1, step)}
            assert f["base"] in earlier, f"ckpt/step{step}/__{r}_0.distcp is stored against {f['base']!r}: {files}"
            assert f["depth"] >= 1 and f["stored"] < f["logical"], f


def test_dcp_three_nodes_reshard_and_delta(cluster_factory, dcp_client):
    c = cluster_factory()
    files = dcp_round_trips(c, dcp_client)
    assert_shards_are_deltas(files)
    c.fsck()


def test_dcp_three_nodes_packs_in_rados(needs_rados, ceph, cluster_factory, dcp_client):
    objects_before = ceph.pool_bytes(ceph.pool)
    c = cluster_factory(["packs=rados:" + ceph.pool, f"ceph_conf={ceph.conf}"])
    files = dcp_round_trips(c, dcp_client)
    assert_shards_are_deltas(files)
    stored = sum(f["stored"] for f in files.values())
    in_pool = ceph.pool_bytes(ceph.pool) - objects_before
    # The files' packs went to the pool (stats' per-file figure and the
    # objects' sizes were seen to differ by a metadata-sized pack: within 1%).
    assert in_pool >= 0.99 * stored, f"the pool grew by {in_pool} bytes, the store's files take {stored}"
    packs_in_dir = [p for p in c.backing.rglob("*.pack")]
    assert not packs_in_dir, f"packs=rados, but pack files in the store directory: {packs_in_dir[:5]}"
    c.fsck()


# -- kill -9 in mid-save --------------------------------------------------------
class Observer(threading.Thread):
    """Polls DIR through one node while a save runs: every file it sees must
    read back as one of the contents written under that name, in full."""

    def __init__(self, root: Path, expected: dict[str, set[bytes]], skip=()):
        super().__init__(daemon=True)
        self.root, self.expected, self.stop_event = root, expected, threading.Event()
        # This node's own files being written (partial here, as on any file
        # system), and files whose open may wait for a dead node.
        self.skip = set(skip)
        self.problems: list[str] = []
        self.reads = 0
        self.current = ""

    def run(self):
        while not self.stop_event.is_set():
            try:
                names = sorted(os.listdir(self.root))
            except FileNotFoundError:
                names = []
            except OSError as e:
                self.problems.append(f"listdir {self.root}: {e}")
                return
            for name in names:
                if name in self.skip:
                    continue
                self.current = name
                try:
                    data = read_file(self.root / name)
                except FileNotFoundError:
                    continue
                except OSError as e:
                    self.problems.append(f"{self.root / name}: {e}")
                    continue
                finally:
                    self.current = ""
                self.reads += 1
                if data not in self.expected.get(name, ()):
                    self.problems.append(f"{self.root / name}: {len(data)} bytes that were never written "
                                         f"as {name} (sizes written: {sorted(map(len, self.expected.get(name, ())))})")
            time.sleep(0.05)

    def finish(self) -> None:
        self.stop_event.set()
        self.join(120)
        assert not self.is_alive(), f"observer of {self.root} blocked reading {self.current!r}"
        assert not self.problems, "\n".join(self.problems[:20])


@pytest.fixture
def observe():
    """observe(DIR, expected, skip=()) -> a started Observer; stopped at teardown
    whatever happens (a reader left on a mount would block its unmount)."""
    started = []

    def start(root: Path, expected: dict[str, set[bytes]], skip=()) -> Observer:
        o = Observer(root, expected, skip)
        started.append(o)
        o.start()
        return o

    yield start
    for o in started:
        o.stop_event.set()
    for o in started:
        o.join(60)


def write_slowly(path: Path, data: bytes, pieces: int, pause: float, closed: threading.Event | None = None):
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        step = -(-len(data) // pieces)
        for off in range(0, len(data), step):
            os.pwrite(fd, data[off:off + step], off)
            time.sleep(pause)
    finally:
        os.close(fd)
    if closed:
        closed.set()


def test_kill9_of_a_node_in_mid_save(cluster_factory, observe):
    c = cluster_factory()
    rng = random.Random(16)
    # The previous checkpoint: one file per node, closed and sealed.
    step1 = {f"rank{r}.bin": float_like(rng, 6 << 20) for r in range(3)}
    c.path(0, "ckpt/step1").mkdir(parents=True)
    for r, (name, data) in enumerate(step1.items()):
        c.path(r, f"ckpt/step1/{name}").write_bytes(data)
    c.wait_sealed()
    c.path(0, "ckpt/step2").mkdir()
    step2 = {}
    for name, d in step1.items():
        d = bytearray(d)
        d[::4096] = bytes(len(d[::4096]))  # one byte in every 4 KiB changes: a delta of step 1
        step2[name] = bytes(d)
    victim_closed = float_like(rng, 24 << 20)  # closed on n2 just before the kill
    victim_open = float_like(rng, 24 << 20)  # still being written on n2 at the kill
    expected = {**{n: {d} for n, d in step2.items()}, "n2-closed.bin": {victim_closed},
                "n2-open.bin": {victim_open}}

    # Each survivor watches step 2 (but not its own file being written, nor
    # n2's closed file, whose open may wait for n2's seal: read below) and step 1.
    observers = [observe(c.path(i, "ckpt/step2"), expected, skip={f"rank{i}.bin", "n2-closed.bin"})
                 for i in (0, 1)]
    observers += [observe(c.path(i, "ckpt/step1"), {n: {d} for n, d in step1.items()}) for i in (0, 1)]
    survivors = [threading.Thread(target=write_slowly, args=(c.path(r, f"ckpt/step2/rank{r}.bin"),
                                                             step2[f"rank{r}.bin"], 12, 0.1)) for r in (0, 1)]
    for t in survivors:
        t.start()
    c.path(2, "ckpt/step2/n2-closed.bin").write_bytes(victim_closed)
    half_written, killed = threading.Event(), threading.Event()
    victim_errors = []

    def victim():
        fd = os.open(c.path(2, "ckpt/step2/n2-open.bin"), os.O_WRONLY | os.O_CREAT, 0o644)
        try:
            half = len(victim_open) // 2
            os.pwrite(fd, victim_open[:half], 0)
            half_written.set()
            killed.wait(300)  # the rest never arrives
            os.pwrite(fd, victim_open[half:], half)
        except OSError as e:
            victim_errors.append(e)
        finally:
            try:
                os.close(fd)
            except OSError:
                pass

    vt = threading.Thread(target=victim, daemon=True)
    vt.start()
    assert half_written.wait(120)
    killed_pid = c.nodes[2].kill9()
    killed.set()
    vt.join(60)
    assert victim_errors, "a write into n2's mount after its daemon was killed did not fail"
    # A survivor opening n2's closed file: complete (n2 sealed it before the
    # kill), or absent until n2 is back (docs/SEMANTICS.md), never partial.
    closed_reads: dict[int, object] = {}

    def read_closed(i):
        try:
            closed_reads[i] = read_file(c.path(i, "ckpt/step2/n2-closed.bin"))
        except OSError as e:
            closed_reads[i] = e

    closed_readers = [threading.Thread(target=read_closed, args=(i,), daemon=True) for i in (0, 1)]
    for t in closed_readers:
        t.start()
    for t in survivors:
        t.join(120)
    settle()
    for r in (0, 1):  # the survivors' files, closed after the kill, are complete on both
        for i in (0, 1):
            assert read_file(c.path(i, f"ckpt/step2/rank{r}.bin")) == step2[f"rank{r}.bin"], f"n{i}: rank{r}"
    for o in observers:
        o.finish()
    assert sum(o.reads for o in observers) > 0
    for i in (0, 1):
        assert "n2-open.bin" not in os.listdir(c.path(i, "ckpt/step2")), f"n{i} lists n2's unclosed file"
        for name, data in step1.items():
            assert read_file(c.path(i, f"ckpt/step1/{name}")) == data, f"n{i}: step1/{name}"

    # n2 remounts with the same node name and staging: what it closed is back
    c.nodes[2].remount()
    assert c.nodes[2].pid != killed_pid
    for t in closed_readers:
        t.join(120)
        assert not t.is_alive(), "a survivor's open of n2's closed file still waits after n2's remount"
    for i, got in closed_reads.items():
        assert got == victim_closed or isinstance(got, FileNotFoundError), (
            f"n{i} opened n2's closed file while n2 was down and got "
            f"{got!r:.200}" if not isinstance(got, bytes) else f"{len(got)} bytes")
    files = c.wait_sealed()
    settle()
    assert "ckpt/step2/n2-closed.bin" in files
    for i in range(3):
        assert read_file(c.path(i, "ckpt/step2/n2-closed.bin")) == victim_closed, f"n{i}: n2-closed.bin"
        for name, data in step1.items():
            assert read_file(c.path(i, f"ckpt/step1/{name}")) == data, f"n{i}: step1/{name}"
        for name in ("rank0.bin", "rank1.bin"):  # n2 never got to write its rank2.bin
            assert read_file(c.path(i, f"ckpt/step2/{name}")) == step2[name], f"n{i}: step2/{name}"
        unclosed = c.path(i, "ckpt/step2/n2-open.bin")
        if unclosed.exists():  # what the crash left of an unclosed file: at most what was written
            got = read_file(unclosed)
            assert victim_open.startswith(got), f"n{i}: n2-open.bin holds {len(got)} bytes never written"
    c.assert_same_everywhere("ckpt")
    c.fsck()


# -- cluster GC against a seal in flight ------------------------------------------
def test_gc_on_one_node_while_another_seals_a_delta(cluster_factory, tmp_path):
    """n1 seals step 2's file, a delta of step 1's, and is held (-o seal_hold)
    after it pinned its base and before it publishes; meanwhile n0 deletes
    step 1, which leaves that base unreferenced, and runs `ckptfs gc --grace 0`.
    n1's file then reads back bit-exact from every node, also after another
    collection."""
    hold = tmp_path / "seal-hold"
    c = cluster_factory([f"seal_hold={hold}"])
    # An .npy file: a recognised format, whose tensor finds its predecessor
    # (raw bytes of unknown format are stored on their own).
    import io
    import numpy as np
    g = np.random.default_rng(7)
    w = (g.standard_normal(3 << 20) * 0.02).astype(np.float32)

    def npy(a) -> bytes:
        buf = io.BytesIO()
        np.save(buf, a)
        return buf.getvalue()

    base = npy(w)
    c.path(1, "step1").mkdir()
    c.path(1, "step1/model.bin").write_bytes(base)
    c.wait_sealed()
    w[::2048] += np.float32(1e-3)
    nxt = npy(w)
    c.path(1, "step2").mkdir()
    hold.touch()
    try:
        c.path(1, "step2/model.bin").write_bytes(nxt)
        pins = c.backing / "nodes" / "n1" / "pins"
        deadline = time.monotonic() + 120
        while not any(pins.glob("*")):  # n1's seal has pinned its base
            assert time.monotonic() < deadline, f"no pin in {pins} while n1 seals step2/model.bin"
            time.sleep(0.1)
        assert c.stats()["step2/model.bin"]["staged"]
        settle()
        os.unlink(c.path(0, "step1/model.bin"))
        os.rmdir(c.path(0, "step1"))
        c.gc(node=0)
    finally:
        hold.unlink()
    files = c.wait_sealed()
    assert list(files) == ["step2/model.bin"], files
    f = files["step2/model.bin"]
    assert f["depth"] >= 1 and f["base"].startswith("(deleted file"), f"not a delta of step 1's pack: {f}"
    settle()
    for i in range(3):
        assert read_file(c.path(i, "step2/model.bin")) == nxt, f"n{i} reads step2/model.bin wrong"
    c.gc(node=2)
    for i in range(3):
        assert read_file(c.path(i, "step2/model.bin")) == nxt, f"n{i} reads step2/model.bin wrong after gc"
    c.fsck()


# -- many files per rank --------------------------------------------------------
def test_deepspeed_layout_eight_ranks_over_three_nodes(cluster_factory):
    c = cluster_factory()
    client = Client(DEBIAN_PYTHON, "deepspeed_layout.py")
    try:
        written = {}
        for step in (1, 2):
            rep = client.send(step, *[c.nodes[r % NODES].mnt for r in range(8)])
            written.update(rep["files"])
            settle()  # the other nodes have seen step 1's `latest`
            # `latest` was written last, by rank 0, after every rank had closed its files
            assert read_file(c.path(1, "latest")) == f"global_step{step}".encode()
            for i in range(3):
                for rel, sha in rep["files"].items():
                    assert sha256_file(c.path(i, rel)) == sha, f"n{i}: {rel}"
        files = c.wait_sealed()
    finally:
        client.close()
    assert len([p for p in files if p.startswith("global_step")]) == 2 * 2 * 8
    for i in range(3):
        for rel, sha in written.items():
            assert sha256_file(c.path(i, rel)) == sha, f"n{i}: {rel} after sealing"
    c.assert_same_everywhere(".")
    c.fsck()


# -- close-to-open consistency --------------------------------------------------
def settle():
    """Longer than the nodes' attribute and entry timeouts."""
    time.sleep(ATTR_TIMEOUT + 0.5)


def test_close_to_open_across_nodes(cluster_factory):
    c = cluster_factory()
    a, b = 0, 1
    rng = random.Random(3)
    assert not c.path(b, "f.bin").exists()  # B has looked the name up: nothing there yet
    v1 = float_like(rng, 5 << 20)
    c.path(a, "f.bin").write_bytes(v1)
    settle()
    assert read_file(c.path(b, "f.bin")) == v1
    # B keeps an open file of v1 while A replaces it by tmp + rename; a new open on B sees v2
    with open(c.path(b, "f.bin"), "rb") as old:
        v2 = float_like(rng, 3 << 20)
        c.path(a, "f.tmp").write_bytes(v2)
        os.rename(c.path(a, "f.tmp"), c.path(a, "f.bin"))
        settle()
        assert read_file(c.path(b, "f.bin")) == v2
        assert old.read() == v1  # the open file keeps what it opened
    c.wait_sealed()
    settle()
    for i in range(3):
        assert read_file(c.path(i, "f.bin")) == v2


def test_last_rename_wins_and_readers_never_see_a_mix(cluster_factory, observe):
    c = cluster_factory()
    rng = random.Random(5)
    versions = {}
    expected: dict[str, set[bytes]] = {}
    c.path(0, "d").mkdir()
    for rnd in range(4):
        va, vb = float_like(rng, 2 << 20), float_like(rng, 2 << 20)
        versions[rnd] = (va, vb)
        expected.setdefault("ckpt.bin", set()).update((va, vb))
        c.path(0, f"d/.tmp-a{rnd}").write_bytes(va)
        c.path(1, f"d/.tmp-b{rnd}").write_bytes(vb)
        expected[f".tmp-a{rnd}"] = {va}
        expected[f".tmp-b{rnd}"] = {vb}
        if rnd == 0:
            observer = observe(c.path(2, "d"), expected)
        os.rename(c.path(0, f"d/.tmp-a{rnd}"), c.path(0, "d/ckpt.bin"))
        os.rename(c.path(1, f"d/.tmp-b{rnd}"), c.path(1, "d/ckpt.bin"))  # the last rename
        settle()
        for i in range(3):
            assert read_file(c.path(i, "d/ckpt.bin")) == vb, f"round {rnd}: n{i} does not see the last rename"
    c.wait_sealed()
    observer.finish()
    settle()
    for i in range(3):
        assert sorted(os.listdir(c.path(i, "d"))) == ["ckpt.bin"]
        assert read_file(c.path(i, "d/ckpt.bin")) == versions[3][1]


def test_file_being_written_is_invisible_on_other_nodes(cluster_factory):
    c = cluster_factory()
    data = float_like(random.Random(9), 4 << 20)
    c.path(0, "dir").mkdir()
    fd = os.open(c.path(0, "dir/open.bin"), os.O_WRONLY | os.O_CREAT, 0o644)
    try:
        os.pwrite(fd, data[:len(data) // 2], 0)
        os.fsync(fd)
        settle()
        for i in (1, 2):
            assert "open.bin" not in os.listdir(c.path(i, "dir")), f"n{i} lists a file still open on n0"
            with pytest.raises(FileNotFoundError):
                os.stat(c.path(i, "dir/open.bin"))
            with pytest.raises(FileNotFoundError):
                open(c.path(i, "dir/open.bin"), "rb")
        assert os.stat(c.path(0, "dir/open.bin")).st_size == len(data) // 2  # the writer's node sees it
        os.pwrite(fd, data[len(data) // 2:], len(data) // 2)
    finally:
        os.close(fd)
    settle()
    for i in (1, 2):
        assert read_file(c.path(i, "dir/open.bin")) == data, f"n{i} after the close"
