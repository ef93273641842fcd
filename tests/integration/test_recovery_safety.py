"""Recovery and `ckptfs gc` delete only what they have proved unreferenced
(issue 14): one flipped byte in a pack's meta block, or a missing pack, must
not cost another file its content; the mount warns, gc exits 1, fsck names
the object, and a missing pack reads as EIO."""
from __future__ import annotations

import errno
import glob
import os
import struct

import numpy as np

from conftest import describe, run_ckptfs


def pack_files(backing):
    return sorted(glob.glob(os.path.join(backing, "packs", "*", "*.pack")))


def stored_objects(backing):
    out = set()
    for top in ("packs", "staging", "tmp"):
        for root, _dirs, files in os.walk(os.path.join(backing, top)):
            out.update(os.path.relpath(os.path.join(root, f), backing) for f in files)
    return out


def meta_block(path):
    """(offset, bases) of a pack's meta block (docs/FORMAT.md)."""
    with open(path, "rb") as f:
        hdr = f.read(64)
        meta_off, = struct.unpack_from("<Q", hdr, 40)
        f.seek(meta_off)
        meta = f.read(32)
        base_count, = struct.unpack_from("<I", meta, 16)
        bases = struct.unpack(f"<{base_count}Q", f.read(8 * base_count)) if base_count else ()
    return meta_off, bases


def pack_rel(pack_id):
    h = f"{pack_id:016x}"
    return f"packs/{h[:2]}/{h}.pack"


def flip(path, off):
    with open(path, "r+b") as f:
        f.seek(off)
        b = f.read(1)
        f.seek(off)
        f.write(bytes([b[0] ^ 0x5A]))


def npy(arr):
    import io
    buf = io.BytesIO()
    np.save(buf, arr)
    return buf.getvalue()


def test_flipped_meta_of_delta_file_deletes_nothing(mount_factory):
    m = mount_factory(name="meta")
    rng = np.random.default_rng(5)
    w = rng.normal(0, 0.02, 400_000).astype(np.float32)
    a = npy(w)
    w[:200_000] += rng.normal(0, 1e-5, 200_000).astype(np.float32)
    b = npy(w)
    c = os.urandom(300_000)
    (m.mnt / "a.npy").write_bytes(a)
    m.wait_sealed()
    (m.mnt / "b.npy").write_bytes(b)
    (m.mnt / "c.bin").write_bytes(c)
    m.wait_sealed()
    os.unlink(m.mnt / "a.npy")
    m.umount()

    with_bases = [(p, meta_block(p)) for p in pack_files(m.backing)]
    b_pack = [p for p, (_off, bases) in with_bases if bases]
    assert len(b_pack) == 1, f"expected b.npy stored as deltas against a.npy: {with_bases}"
    b_pack = b_pack[0]
    meta_off, bases = meta_block(b_pack)
    a_pack = os.path.join(m.backing, pack_rel(bases[0]))
    assert os.path.exists(a_pack), "a's pack must stay as b's base"
    # Garbage a clean recovery would delete.
    orphan = m.backing / "staging" / "00000000000000aa.stage"
    orphan.write_bytes(b"orphan")

    flip(b_pack, meta_off + 20)
    m.fsck_at_teardown = False
    before = stored_objects(m.backing)
    b_rel = os.path.relpath(b_pack, m.backing)

    p = m.mount()
    assert "could not be read" in p.stderr and "warning" in p.stderr, describe(p, "gave no warning")
    assert stored_objects(m.backing) == before, "recovery deleted something"
    assert b_rel in m.log_text() and "meta block" in m.log_text()
    assert (m.mnt / "b.npy").read_bytes() == b  # a meta block is an index, not content
    os.unlink(m.mnt / "c.bin")  # while blocked, the daemon deletes no pack
    m.umount()
    assert stored_objects(m.backing) == before

    g = run_ckptfs("gc", m.backing)
    assert g.returncode == 1, describe(g, "should exit 1 with an unreadable meta block")
    assert b_rel in g.stderr and "meta block" in g.stderr and "deleted nothing" in g.stderr, describe(g)
    assert stored_objects(m.backing) == before

    f = m.fsck()
    assert f.returncode == 1, describe(f)
    assert b_rel in f.stdout and "meta block" in f.stdout, describe(f, "does not name the object")
    assert "removes it" not in f.stdout, describe(f, "promises a removal")

    flip(b_pack, meta_off + 20)  # repaired
    g = run_ckptfs("gc", m.backing)
    assert g.returncode == 0, describe(g)
    after = stored_objects(m.backing)
    assert os.path.relpath(a_pack, m.backing) in after and b_rel in after
    assert not orphan.exists()
    assert len(after) == 2, f"c's pack and the orphan should be gone: {after}"
    m.fsck_at_teardown = True
    m.mount()
    assert (m.mnt / "b.npy").read_bytes() == b


def test_missing_pack_reads_eio(mount_factory):
    m = mount_factory(name="missing")
    data = os.urandom(500_000)
    keep = os.urandom(200_000)
    (m.mnt / "x.bin").write_bytes(data)
    m.wait_sealed()
    before = set(pack_files(m.backing))
    (m.mnt / "keep.bin").write_bytes(keep)
    m.wait_sealed()
    m.umount()
    x_pack = sorted(before)[0]
    os.unlink(x_pack)
    m.fsck_at_teardown = False

    p = m.mount()
    assert "could not be read" in p.stderr, describe(p, "gave no warning")
    fd = os.open(m.mnt / "x.bin", os.O_RDONLY)
    try:
        os.pread(fd, 4096, 0)
        raise AssertionError("a read of a file whose pack is missing succeeded")
    except OSError as e:
        assert e.errno == errno.EIO, f"expected EIO, got {errno.errorcode.get(e.errno)}"
    finally:
        os.close(fd)
    assert (m.mnt / "keep.bin").read_bytes() == keep
    assert "x.bin" in m.log_text() and "missing" in m.log_text()
    m.umount()
    f = m.fsck()
    assert f.returncode == 1 and "ns/x.bin" in f.stdout and "missing" in f.stdout, describe(f)
