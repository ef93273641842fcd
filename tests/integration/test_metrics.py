"""Live metrics (issue 19, item 4): the Prometheus endpoint of -o metrics=,
`ckptfs top`, the log reopened on SIGHUP, and gc's progress line.

The endpoint is scraped with urllib; the checkpoint is a torch.save of a
small model (Debian's torch, in this process)."""
from __future__ import annotations

import io
import json
import os
import pty
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request

import pytest

from conftest import CKPTFS, describe, is_mounted, run_ckptfs
from helpers import parse_metrics

torch = pytest.importorskip("torch")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def scrape(port: int, path: str = "/metrics") -> dict[str, float]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=10) as r:
        assert r.status == 200
        assert r.headers["Content-Type"].startswith("text/plain; version=0.0.4")
        return parse_metrics(r.read().decode())


def checkpoint_bytes() -> bytes:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.ReLU(), torch.nn.Linear(512, 256))
    buf = io.BytesIO()
    torch.save(model.state_dict(), buf)
    return buf.getvalue()


def wait_for(what, fn, timeout=30.0):
    deadline = time.monotonic() + timeout
    while True:
        value = fn()
        if value:
            return value
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)


def read_uncached(path) -> bytes:
    """Reads the file through the daemon: the kernel's page cache of it is
    dropped first (the mount keeps it between opens)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        chunks = []
        while chunk := os.read(fd, 1 << 20):
            chunks.append(chunk)
        return b"".join(chunks)
    finally:
        os.close(fd)


def test_endpoint_follows_a_checkpoint(mount_factory):
    port = free_port()
    m = mount_factory(opts=[f"metrics={port}"])  # a port alone: loopback
    before = scrape(port)
    assert before["ckptfs_logical_bytes"] == 0
    assert before["ckptfs_seal_queue_depth"] == 0

    data = checkpoint_bytes()
    (m.mnt / "ckpt.pt").write_bytes(data)
    m.wait_sealed()
    after = wait_for("an empty seal queue", lambda: (s := scrape(port))["ckptfs_seal_queue_depth"] == 0 and s)
    assert after["ckptfs_logical_bytes"] == len(data)
    assert 0 < after["ckptfs_stored_bytes"] < len(data)
    assert after["ckptfs_compression_ratio"] == pytest.approx(len(data) / after["ckptfs_stored_bytes"])
    assert after["ckptfs_seal_queue_oldest_seconds"] == 0
    assert after["ckptfs_sealed_files_total"] - before["ckptfs_sealed_files_total"] == 1
    assert after["ckptfs_sealed_bytes_total"] - before["ckptfs_sealed_bytes_total"] == len(data)
    assert after["ckptfs_seal_seconds_total"] > before["ckptfs_seal_seconds_total"]
    assert after['ckptfs_errors_total{kind="eio"}'] == 0
    assert after['ckptfs_errors_total{kind="enospc"}'] == 0
    assert after["ckptfs_seal_failures_total"] == 0
    # Lossless: no lossy piece.
    assert after["ckptfs_lossy_relative_error_count"] == 0
    assert after['ckptfs_lossy_relative_error_bucket{le="+Inf"}'] == 0

    assert read_uncached(m.mnt / "ckpt.pt") == data
    first = scrape(port)
    assert first["ckptfs_read_bytes_total"] - after["ckptfs_read_bytes_total"] >= len(data)
    assert first["ckptfs_chunk_cache_misses_total"] > after["ckptfs_chunk_cache_misses_total"]
    assert read_uncached(m.mnt / "ckpt.pt") == data
    second = scrape(port)
    assert second["ckptfs_read_bytes_total"] - first["ckptfs_read_bytes_total"] >= len(data)
    assert second["ckptfs_chunk_cache_hits_total"] > first["ckptfs_chunk_cache_hits_total"]
    assert second["ckptfs_chunk_cache_bytes"] > 0

    # Deleting the file takes its bytes out of the store's figures.
    (m.mnt / "ckpt.pt").unlink()
    gone = wait_for("the pack's deletion", lambda: (s := scrape(port))["ckptfs_stored_bytes"] == 0 and s)
    assert gone["ckptfs_logical_bytes"] == 0

    with pytest.raises(urllib.error.HTTPError) as e:
        scrape(port, "/")
    assert e.value.code == 404


def test_lossy_errors_reach_the_histogram(mount_factory):
    port = free_port()
    m = mount_factory(opts=[f"metrics=127.0.0.1:{port}", "lossy=0.01"])
    data = checkpoint_bytes()
    (m.mnt / "model.pt").write_bytes(data)
    m.wait_sealed()
    s = scrape(port)
    count = s["ckptfs_lossy_relative_error_count"]
    assert count > 0
    assert s['ckptfs_lossy_relative_error_bucket{le="+Inf"}'] == count
    # Every piece met its bound (1% for weights): none above 0.03.
    assert s['ckptfs_lossy_relative_error_bucket{le="0.03"}'] == count
    assert 0 < s["ckptfs_lossy_relative_error_sum"] <= 0.03 * count


def test_non_loopback_needs_metrics_remote(mount_factory):
    port = free_port()
    m = mount_factory(opts=[f"metrics=0.0.0.0:{port}"], mount=False)
    p = m.mount(check=False)
    assert p.returncode == 2, describe(p)
    assert "metrics_remote" in p.stderr and "not a loopback address" in p.stderr, describe(p)
    assert not is_mounted(m.mnt)
    m.mount(opts=[f"metrics=0.0.0.0:{port}", "metrics_remote"])
    assert scrape(port)["ckptfs_logical_bytes"] == 0


def test_port_in_use_fails_the_mount_on_the_terminal(mount_factory):
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        m = mount_factory(opts=[f"metrics={port}"], mount=False)
        p = m.mount(check=False)
        assert p.returncode == 2, describe(p)
        assert f"127.0.0.1:{port}" in p.stderr and "cannot listen" in p.stderr, describe(p)
        assert not is_mounted(m.mnt)


def test_bad_metrics_address_is_a_usage_error(mount_factory):
    m = mount_factory(opts=["metrics=example.com:80"], mount=False)
    p = m.mount(check=False)
    assert p.returncode == 2, describe(p)
    assert "not an IP address" in p.stderr, describe(p)


def test_top_once_json_without_the_endpoint(mount_factory):
    m = mount_factory()
    data = checkpoint_bytes()
    (m.mnt / "d").mkdir()
    (m.mnt / "d" / "ckpt.pt").write_bytes(data)
    m.wait_sealed()
    p = run_ckptfs("top", "--once", "--json", m.mnt / "d")  # a path inside the mount will do
    assert p.returncode == 0, describe(p)
    j = json.loads(p.stdout)
    assert j["mountpoint"] == str(m.mnt)
    assert j["logical_bytes"] == len(data)
    assert 0 < j["stored_bytes"] < len(data)
    assert j["ratio"] == pytest.approx(len(data) / j["stored_bytes"])
    assert j["sealed_bytes"] >= len(data)
    assert j["errors"] == {"eio": 0, "enospc": 0, "seal_failures": 0}
    assert j["lossy_error"]["count"] == 0
    assert j["cache_capacity_bytes"] == 128 << 20

    p = run_ckptfs("top", "--once", m.mnt)
    assert p.returncode == 0, describe(p)
    assert "seal queue" in p.stdout and "chunk cache" in p.stdout and "lossy error" in p.stdout

    # The attribute is the daemon's: not listed, not settable.
    assert "user.ckptfs.metrics" not in os.listxattr(m.mnt)
    with pytest.raises(PermissionError):
        os.setxattr(m.mnt, "user.ckptfs.metrics", b"x")


def test_top_outside_a_mount(tmp_path):
    p = run_ckptfs("top", "--once", tmp_path)
    assert p.returncode == 2, describe(p)
    assert "not inside a ckptfs mount" in p.stderr


def test_top_live_quits_on_q(mount_factory):
    """The live view on a terminal: it draws, and q ends it with exit 0."""
    m = mount_factory()
    pid, fd = pty.fork()
    if pid == 0:
        os.execv(str(CKPTFS), [str(CKPTFS), "top", str(m.mnt)])
    out = b""
    try:
        deadline = time.monotonic() + 30
        while b"(q or Ctrl-C quits)" not in out:
            assert time.monotonic() < deadline, out
            out += os.read(fd, 4096)
        os.write(fd, b"q")
        _, status = os.waitpid(pid, 0)
        pid = 0
        assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0, status
    finally:
        if pid:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
        os.close(fd)
    assert b"ckptfs top " + str(m.mnt).encode() in out


def test_sighup_reopens_the_log(mount_factory, tmp_path):
    log = tmp_path / "daemon.log"
    m = mount_factory(opts=[f"log={log}"])
    assert "mounted" in log.read_text()
    rotated = tmp_path / "daemon.log.1"
    log.rename(rotated)
    os.kill(m.live_pid(), signal.SIGHUP)
    wait_for("the reopened log", lambda: log.exists() and "log reopened (SIGHUP)" in log.read_text())
    assert is_mounted(m.mnt), "SIGHUP ended the mount"
    (m.mnt / "f").write_bytes(b"after the rotation")
    assert (m.mnt / "f").read_bytes() == b"after the rotation"
    assert "log reopened" not in rotated.read_text()
    m.umount()
    assert "unmounted" in log.read_text() or "sealing" in log.read_text() or log.stat().st_size > 0


def store_with_garbage(mount_factory):
    """An unmounted store of 3 files and 4 packs: one is a copy of another
    under a name no stub gives."""
    m = mount_factory()
    for i in range(3):
        (m.mnt / f"f{i}").write_bytes(os.urandom(1000) * (i + 1))
    m.wait_sealed()
    m.umount()
    packs = sorted((m.backing / "packs").rglob("*.pack"))
    assert len(packs) == 3
    orphan_id = "0" * (len(packs[0].stem) - 1) + "1"
    orphan = m.backing / "packs" / orphan_id[:2] / f"{orphan_id}.pack"
    orphan.parent.mkdir(exist_ok=True)
    orphan.write_bytes(packs[0].read_bytes())
    return m


def test_gc_progress_only_on_a_terminal_and_json_summary(mount_factory):
    m = store_with_garbage(mount_factory)
    p = run_ckptfs("gc", "--json", m.backing)  # stderr is a file, not a terminal
    assert p.returncode == 0, describe(p)
    assert "packs" not in p.stderr and "\r" not in p.stderr, describe(p, "drew progress off a terminal")
    j = json.loads(p.stdout)
    assert j["cluster"] is False
    assert j["deleted_packs"] == 1
    assert j["kept_packs"] == 3
    assert j["packs_read"] == 4
    assert j["unreadable"] == []

    # On a terminal: the progress line, counted in packs.
    pid, fd = pty.fork()
    if pid == 0:
        os.execv(str(CKPTFS), [str(CKPTFS), "gc", str(m.backing)])
    out = b""
    while True:
        try:
            chunk = os.read(fd, 4096)
        except OSError:  # EIO: the child closed the terminal
            break
        if not chunk:
            break
        out += chunk
    _, status = os.waitpid(pid, 0)
    os.close(fd)
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0, out
    assert b"gc  3 / 3 packs  100%" in out, out


def test_under_journald_the_log_goes_to_the_journal_only(mount_factory, tmp_path):
    """With stderr on the journal (JOURNAL_STREAM names its device and inode,
    as systemd sets it), the daemon sends its log to journald: no
    STORE/ckptfs.log, and no text lines on stderr."""
    m = mount_factory(mount=False)
    stderr_path = tmp_path / "stderr"
    with open(stderr_path, "w") as err:
        st = os.fstat(err.fileno())
        env = dict(os.environ, JOURNAL_STREAM=f"{st.st_dev}:{st.st_ino}")
        proc = subprocess.Popen([str(CKPTFS), *map(str, m.mount_args(foreground=True))], env=env,
                                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=err)
    try:
        wait_for("the mount", lambda: is_mounted(m.mnt) or proc.poll() is not None)
        assert proc.poll() is None, stderr_path.read_text()
        (m.mnt / "f").write_bytes(b"x" * 1000)
        assert run_ckptfs("umount", m.mnt).returncode == 0
        assert proc.wait(timeout=60) == 0
    finally:
        if proc.poll() is None:
            run_ckptfs("umount", "--lazy", m.mnt)
            proc.kill()
    assert not (m.backing / "ckptfs.log").exists()
    assert "recovery: scanned" not in stderr_path.read_text()
