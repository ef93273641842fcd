"""Flipped bytes in a pack must surface as EIO (never wrong bytes), be logged
with the file name and offset, and be reported by `ckptfs fsck`."""
from __future__ import annotations

import errno
import glob
import os
import random
import re

import pytest

from conftest import describe
from helpers import gen_data, read_file

MiB = 1 << 20
NAME = "precious-weights.bin"


def pack_files(backing):
    return sorted(glob.glob(os.path.join(backing, "packs", "*", "*.pack")))


def flip_byte(path, offset):
    with open(path, "r+b") as f:
        f.seek(offset)
        b = f.read(1)
        assert len(b) == 1
        f.seek(offset)
        f.write(bytes([b[0] ^ 0x5A]))
        f.flush()
        os.fsync(f.fileno())


def check_never_wrong(path, original, step=64 * 1024):
    """Reads the file in pieces: every piece is either EIO or correct.
    Returns the number of EIO pieces."""
    eio = 0
    fd = os.open(path, os.O_RDONLY)
    try:
        for off in range(0, len(original), step):
            try:
                got = os.pread(fd, step, off)
            except OSError as e:
                assert e.errno == errno.EIO, f"offset {off}: expected EIO, got {e!r}"
                eio += 1
                continue
            assert got == original[off:off + step], f"WRONG BYTES returned at offset {off}"
    finally:
        os.close(fd)
    return eio


def setup_store(mount, data_kind):
    """Writes a bystander file, then NAME; seals; umounts; checks fsck is
    clean. Returns (original bytes, bystander bytes, NAME's pack path)."""
    rng = random.Random(42)
    other = gen_data(rng, 2 * MiB, "mixed")
    (mount.mnt / "bystander.bin").write_bytes(other)
    mount.wait_sealed()
    before = set(pack_files(mount.backing))
    if data_kind == "random":
        data = rng.randbytes(6 * MiB + 1234)
    else:
        data = gen_data(rng, 6 * MiB + 1234, "text")
    (mount.mnt / NAME).write_bytes(data)
    mount.wait_sealed()
    mount.umount()
    new = sorted(set(pack_files(mount.backing)) - before)
    assert len(new) == 1, (f"expected exactly one new pack for {NAME} under "
                           f"{mount.backing}/packs/*/*.pack, found {new}")
    p = mount.fsck()
    assert p.returncode == 0, describe(p, "on a clean store should exit 0")
    return data, other, new[0]


def test_fsck_clean_store(mount):
    (mount.mnt / "a").write_bytes(b"a" * 100000)
    os.mkdir(mount.mnt / "d")
    (mount.mnt / "d" / "b").write_bytes(os.urandom(5 * MiB))
    (mount.mnt / "empty").write_bytes(b"")
    mount.wait_sealed()
    mount.umount()
    p = mount.fsck()
    assert p.returncode == 0, describe(p, "on a clean store should exit 0")
    p = mount.fsck("--json")
    assert p.returncode == 0, describe(p)
    import json
    json.loads(p.stdout)


@pytest.mark.parametrize("data_kind", ["random", "compressible"])
def test_payload_bitflip_gives_eio(mount, data_kind):
    mount.fsck_at_teardown = False
    data, other, pack = setup_store(mount, data_kind)
    size = os.path.getsize(pack)
    off = size // 2
    assert off > 64 + 16, f"pack {pack} too small ({size} B) to have a payload"
    if data_kind == "random":
        # incompressible data is stored ~raw: the middle of the pack is payload
        assert size > 6 * MiB
    flip_byte(pack, off)

    mount.mount()
    with pytest.raises(OSError) as ei:
        read_file(mount.mnt / NAME)
    assert ei.value.errno == errno.EIO, f"expected EIO, got {ei.value!r}"
    assert check_never_wrong(mount.mnt / NAME, data) >= 1
    # the daemon survives and other files are fine
    assert read_file(mount.mnt / "bystander.bin") == other
    assert os.stat(mount.mnt / NAME).st_size == len(data)
    assert NAME in os.listdir(mount.mnt)

    log = mount.log_text()
    lines = [l for l in log.splitlines()
             if NAME in l and re.search(r"off(set)?\W{0,3}(0x)?\d", l, re.I)]
    assert lines, (f"no log line in {mount.backing}/ckptfs.log names {NAME} and an offset; "
                   f"log tail:\n{log[-3000:]}")

    mount.umount()
    p = mount.fsck()
    assert p.returncode == 1, describe(p, "should exit 1 on a corrupted store")
    assert NAME in p.stdout + p.stderr, describe(p, f"does not name {NAME}")
    p = mount.fsck("--json")
    assert p.returncode == 1, describe(p)
    assert NAME in p.stdout, describe(p, f"--json does not name {NAME}")


@pytest.mark.parametrize("where", ["header", "table", "footer"])
def test_metadata_bitflip_never_returns_wrong_bytes(mount, where):
    mount.fsck_at_teardown = False
    data, other, pack = setup_store(mount, "compressible")
    size = os.path.getsize(pack)
    off = {"header": 20, "table": size - 32 - 20, "footer": size - 10}[where]
    flip_byte(pack, off)
    p = mount.mount(check=False)
    assert p.returncode == 0, describe(p, "a single corrupted pack must not prevent mounting")
    try:
        got = read_file(mount.mnt / NAME)
    except OSError as e:
        assert e.errno == errno.EIO, f"expected EIO, got {e!r}"
    else:
        pytest.fail(f"read of a file with a corrupted pack {where} succeeded "
                    f"({'same' if got == data else 'WRONG'} bytes)")
    assert read_file(mount.mnt / "bystander.bin") == other
    mount.umount()
    p = mount.fsck()
    assert p.returncode == 1, describe(p, "should exit 1 on a corrupted store")
    assert NAME in p.stdout + p.stderr, describe(p, f"does not name {NAME}")


def test_fsck_cannot_run(tmp_path):
    from conftest import run_ckptfs
    p = run_ckptfs("fsck", tmp_path / "does-not-exist")
    assert p.returncode == 2, describe(p, "should exit 2 when it cannot run")
    (tmp_path / "notastore").mkdir()
    (tmp_path / "notastore" / "junk").write_bytes(b"x")
    p = run_ckptfs("fsck", tmp_path / "notastore")
    assert p.returncode == 2, describe(p, "should exit 2 on a dir that is not a store")
