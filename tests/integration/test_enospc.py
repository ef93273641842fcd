"""A full backing volume: writes fail with ENOSPC, nothing already written is
lost, a seal that cannot get space is retried once space comes back, and
the store stays consistent. The backing store is the root of a small ext4
volume (a loop-mounted image), lost+found and all."""
import errno
import os
import subprocess
import time

import pytest

MiB = 1 << 20


@pytest.fixture
def small_volume(tmp_path):
    image, vol = tmp_path / "vol.ext4", tmp_path / "vol"
    vol.mkdir()
    with open(image, "wb") as f:
        f.truncate(48 * MiB)
    subprocess.run(["mkfs.ext4", "-q", "-F", "-m", "0", str(image)], check=True)
    p = subprocess.run(["mount", "-o", "loop", str(image), str(vol)], capture_output=True, text=True)
    if p.returncode != 0:
        pytest.skip(f"cannot loop-mount an ext4 image here: {p.stderr.strip()}")
    yield vol
    subprocess.run(["umount", "-l", str(vol)], check=False)


def fill(path, total, block=MiB):
    """Writes random blocks until `total` bytes or ENOSPC; returns bytes written."""
    done = 0
    with open(path, "wb", buffering=0) as f:
        while done < total:
            try:
                done += f.write(os.urandom(block))
            except OSError as e:
                assert e.errno == errno.ENOSPC, e
                return done
    return done


def avail(path):
    st = os.statvfs(path)
    return st.f_bavail * st.f_frsize


def wait_for(pred, timeout=30.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return True
        time.sleep(0.2)
    return False


def test_writes_fail_cleanly_when_the_volume_is_full(small_volume, mount_factory):
    m = mount_factory(backing=small_volume, mnt=small_volume.parent / "mnt")
    keep = os.urandom(2 * MiB)
    (m.mnt / "keep.bin").write_bytes(keep)
    m.wait_sealed()

    written = fill(m.mnt / "big.bin", 200 * MiB)
    assert written < 200 * MiB, "the 48 MiB volume never reported ENOSPC"
    assert (m.mnt / "keep.bin").read_bytes() == keep
    os.unlink(m.mnt / "big.bin")  # its staging file goes with it
    assert wait_for(lambda: avail(small_volume) > 30 * MiB), "space of the deleted file not returned"
    again = os.urandom(8 * MiB)
    (m.mnt / "again.bin").write_bytes(again)
    m.wait_sealed()
    m.remount()
    assert (m.mnt / "keep.bin").read_bytes() == keep
    assert (m.mnt / "again.bin").read_bytes() == again


def test_seal_without_space_is_retried(small_volume, mount_factory):
    m = mount_factory(backing=small_volume, mnt=small_volume.parent / "mnt")
    # Ballast outside ckptfs (lost+found is the one foreign entry a store
    # tolerates), sized so the staged file fits but its pack does not.
    ballast = small_volume / "lost+found" / "ballast"
    with open(ballast, "wb") as f:
        f.write(os.urandom(int(avail(small_volume) * 0.35)))
        os.fsync(f.fileno())
    size = int(avail(small_volume) * 0.6) // MiB * MiB
    data = os.urandom(size)  # random: the pack is as large as the data
    (m.mnt / "ckpt.bin").write_bytes(data)
    assert wait_for(lambda: "will retry" in m.log_text()), "seal did not fail for lack of space"
    assert (m.mnt / "ckpt.bin").read_bytes() == data  # served from staging meanwhile
    assert any(f["staged"] for f in m.stats()["files"])

    ballast.unlink()  # an admin frees space: the retry succeeds
    m.wait_sealed(timeout=120)
    assert (m.mnt / "ckpt.bin").read_bytes() == data
    m.remount()
    assert (m.mnt / "ckpt.bin").read_bytes() == data
