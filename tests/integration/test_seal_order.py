"""Readers never wait longer than they must for a lossy seal (issue 17).

A lossy file reads back as its reconstruction once it is closed, so a read
of a staged lossy file waits for its seal. These tests hold every seal at
its publication (-o seal_hold=PATH) and check, by results rather than by
timing, that

  - an open for reading, then fsync and close, an open that is write-only,
    and a read-only open that reads nothing all return while the seal
    cannot finish; the first read is what waits;
  - the file a reader waits for is sealed on the reader's own thread, ahead
    of files queued before it (with one seal thread, busy with another file).
"""
from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest

from helpers import read_file, wait_for
from test_lossy import make_ckpt, pypi_python, run_client, stats_entry, write_file  # noqa: F401 (a fixture)

torch = pytest.importorskip("torch")

SEAL_OPTS = ["lossy=0.05", "seal_threads=1", "log_level=debug", "device=cpu"]


def ckpt_bytes(tmp: Path, seed: int) -> bytes:
    p = tmp / f"ref{seed}.pt"
    torch.save(make_ckpt(seed=seed), p)
    return read_file(p)


def sealing_line(m, path: Path) -> str:
    return f"sealing inode {os.stat(path).st_ino}"


def held_seals(m) -> int:
    return m.log_text().count("seal_hold: a seal waits")


def in_thread(fn) -> tuple[threading.Thread, dict]:
    out: dict = {}

    def run():
        try:
            out["value"] = fn()
        except BaseException as e:  # reported by the test
            out["error"] = e

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t, out


def returns_while_held(fn, hold: Path, what: str):
    """fn() must finish although `hold` keeps every seal from publishing."""
    t, out = in_thread(fn)
    t.join(60)
    assert hold.exists()
    assert not t.is_alive(), f"{what} waited for a held lossy seal"
    if "error" in out:
        raise out["error"]


def test_only_reads_wait_for_a_lossy_seal(mount_factory, tmp_path):
    hold = tmp_path / "hold"
    hold.touch()
    m = mount_factory(opts=SEAL_OPTS + [f"seal_hold={hold}"])
    a, b = m.mnt / "a.pt", m.mnt / "b.pt"
    raw_b = ckpt_bytes(tmp_path, 2)
    write_file(a, ckpt_bytes(tmp_path, 1))
    wait_for(lambda: held_seals(m) == 1, "a.pt's seal to reach the hold")
    write_file(b, raw_b)  # queued behind a.pt, which holds the only seal thread

    def open_fsync_close(flags):
        fd = os.open(b, flags)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

    returns_while_held(lambda: open_fsync_close(os.O_RDONLY), hold, "open(O_RDONLY) + fsync")
    returns_while_held(lambda: open_fsync_close(os.O_WRONLY), hold, "open(O_WRONLY) + fsync")
    returns_while_held(lambda: open(b, "rb").close(), hold, "a read-only open that reads nothing")
    assert any(f["staged"] for f in m.stats()["files"] if f["path"].endswith("b.pt"))

    reader, got = in_thread(lambda: read_file(b))
    wait_for(lambda: held_seals(m) == 2, "the reader's seal of b.pt to reach the hold")
    assert f"{sealing_line(m, b)} (a reader waits for it)" in m.log_text()
    assert reader.is_alive(), "a read of a staged lossy file returned before its seal"
    hold.unlink()
    reader.join(120)
    assert not reader.is_alive()
    assert "error" not in got, got.get("error")
    assert len(got["value"]) == len(raw_b) and got["value"] != raw_b, "the read returned the bytes as written"
    m.wait_sealed()
    assert read_file(b) == got["value"], "the reader saw other bytes than the sealed file's"


def test_file_a_reader_waits_for_jumps_the_seal_queue(mount_factory, tmp_path):
    hold = tmp_path / "hold"
    hold.touch()
    m = mount_factory(opts=SEAL_OPTS + [f"seal_hold={hold}"])
    paths = [m.mnt / f"{n}.pt" for n in ("a", "b", "c")]
    write_file(paths[0], ckpt_bytes(tmp_path, 1))
    wait_for(lambda: held_seals(m) == 1, "a.pt's seal to reach the hold")
    for i, p in enumerate(paths[1:], start=2):
        write_file(p, ckpt_bytes(tmp_path, i))  # queued in order b, c behind a
    reader, got = in_thread(lambda: read_file(paths[2]))
    wait_for(lambda: held_seals(m) == 2, "the reader's seal of c.pt to reach the hold")
    log = m.log_text()
    assert f"{sealing_line(m, paths[2])} (a reader waits for it)" in log
    assert sealing_line(m, paths[1]) not in log, "b.pt, queued before c.pt, was sealed first"
    hold.unlink()
    reader.join(120)
    assert not reader.is_alive() and "error" not in got
    m.wait_sealed()
    log = m.log_text()
    assert log.index(sealing_line(m, paths[2])) < log.index(sealing_line(m, paths[1]))
    assert read_file(paths[2]) == got["value"]


ORBAX_RAW = Path(__file__).resolve().parents[1] / "data" / "orbax" / "raw"


ORBAX_DATA = "d/6f0d4f352afbe02aa2c511bc5dd649f8"  # values, then its root node at 6144 of 8125 bytes


def read_orbax_data_while_held(mount_factory, tmp_path, data: bytes, off: int):
    """Writes the raw Orbax database, with `data` for ORBAX_DATA, on a mount
    whose seals are held at their publication, reads the byte at `off` on
    a thread and lets the seals go. Returns the mount, the data file's path,
    whether the read finished while the seals were held, and what it read."""
    hold = tmp_path / "hold"
    hold.touch()
    m = mount_factory(opts=SEAL_OPTS + [f"seal_hold={hold}"])
    db = m.mnt / "ckpt" / "ocdbt.process_0"
    (db / "d").mkdir(parents=True)
    others = [f"d/{p.name}" for p in sorted((ORBAX_RAW / "d").iterdir()) if f"d/{p.name}" != ORBAX_DATA]
    for rel in ["manifest.ocdbt"] + others:
        write_file(db / rel, read_file(ORBAX_RAW / rel))
    write_file(db / ORBAX_DATA, data)
    wait_for(lambda: held_seals(m) >= 1, "a seal to reach the hold")

    def read_byte():
        fd = os.open(db / ORBAX_DATA, os.O_RDONLY)
        try:
            return os.pread(fd, 1, off)
        finally:
            os.close(fd)

    t, out = in_thread(read_byte)
    t.join(60)
    finished = not t.is_alive()
    hold.unlink()
    t.join(120)
    return m, db / ORBAX_DATA, finished, out.get("value")


def test_a_read_of_the_page_holding_an_orbax_tail_node_does_not_wait(mount_factory, tmp_path):
    """TensorStore reads back the B+tree node ending a closed data file
    before it writes the nodes describing the file's values, which that
    file's lossy seal waits for. The kernel asks for whole pages, so a node
    that starts mid-page (here at 6144 of 8125 bytes) is read from its
    page's start: that read is served while the seal is held, and the seal
    keeps the bytes from that page on exact (the tensor ending in it too)."""
    raw = read_file(ORBAX_RAW / ORBAX_DATA)
    assert len(raw) == 8125
    m, path, finished, got = read_orbax_data_while_held(mount_factory, tmp_path, raw, len(raw) - 1)
    assert finished, "a read of the page holding the tail node waited for the held lossy seal"
    assert got == raw[-1:], got
    m.wait_sealed()
    sealed = read_file(path)
    assert sealed[4096:] == raw[4096:], "bytes a reader could have been served before the seal changed"
    assert sealed[:4096] != raw[:4096], "the moments before the node's page were not coded lossily"


def test_a_read_of_an_orbax_node_far_from_the_end_does_not_wait(mount_factory, tmp_path):
    """TensorStore may write a commit's node, then more of the next commit's
    values than the last 4 MiB the tail rule searches, and read that node
    back before it writes the nodes describing them (the Orbax series under
    load: a 4 KiB read at 0.53 MB of a 4.7 MB data file waited for the
    seal, which waited for those nodes). A read within the pages of any node is
    served while the seal is held, and the seal keeps those pages exact."""
    raw = read_file(ORBAX_RAW / ORBAX_DATA)
    more = raw + os.urandom(4 << 20) + os.urandom(64 << 10)
    more += bytes(-len(more) % 4096)
    m, path, finished, got = read_orbax_data_while_held(mount_factory, tmp_path, more, len(raw) - 1)
    assert finished, "a read of a node's page waited for the held lossy seal"
    assert got == raw[-1:], got
    m.wait_sealed()
    sealed = read_file(path)
    assert len(sealed) == len(more)
    assert sealed[4096:8192] == more[4096:8192], "the node's page a reader could have been served changed"
    assert sealed[8192:] == more[8192:], "bytes no tree describes changed"
    assert sealed[:4096] != raw[:4096], "the moments before the node's page were not coded lossily"


def test_a_seal_waiting_for_its_save_leaves_the_seal_thread_to_others(mount_factory, tmp_path, plain_dir,
                                                                       pypi_python):  # noqa: F811
    """A DCP shard's lossy seal waits, up to 60 s after the shard's last
    write, for the save's .metadata, which names its tensors. It gives the
    mount's one seal thread back meanwhile and is tried again: a checkpoint
    written after the shard is sealed while the shard still waits, and once
    .metadata comes the shard is sealed with its names."""
    src = plain_dir / "src"
    run_client(pypi_python, tmp_path, "dcp", src, plain_dir / "ref")
    shard = next(n for n in os.listdir(src) if n.endswith(".distcp"))
    m = mount_factory(opts=["lossy=0.01", "seal_threads=1", "device=cpu"])
    (m.mnt / "step1").mkdir()
    write_file(m.mnt / "step1" / shard, read_file(src / shard))
    write_file(m.mnt / "other.pt", ckpt_bytes(tmp_path, 1))

    def staged() -> set:
        return {f["path"].lstrip("/") for f in m.stats()["files"] if f.get("staged")}

    wait_for(lambda: "other.pt" not in staged(), "the checkpoint written after the shard to be sealed", 50)
    assert f"step1/{shard}" in staged(), "the shard was sealed before its save's .metadata came"
    write_file(m.mnt / "step1" / ".metadata", read_file(src / ".metadata"))
    lossy = stats_entry(m, f"step1/{shard}")["lossy"]
    assert lossy is not None and lossy["sensitivity"] == "second-moments", lossy
