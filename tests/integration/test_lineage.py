"""Delta against the predecessor and dedup, through a real mount: later
checkpoints and identical copies cost little, and deleting, renaming or
overwriting any file of a lineage leaves every other one bit-exact, also
after a remount (recovery keeps what deltas need)."""
import os

import numpy as np


def versions(n: int, seed: int = 0) -> list[bytes]:
    """.npy checkpoints of one 'training run': half the weights drift a
    little each step, half stay frozen."""
    import io

    rng = np.random.default_rng(seed)
    w = rng.normal(0, 0.02, size=(1024, 1024)).astype(np.float32)
    out = []
    for _ in range(n):
        buf = io.BytesIO()
        np.save(buf, w)
        out.append(buf.getvalue())
        w[:512] += rng.normal(0, 1e-5, size=(512, 1024)).astype(np.float32)
    return out


def files_of(m) -> dict:
    return {f["path"]: f for f in m.wait_sealed()["files"]}


def test_successor_is_a_delta_and_copy_is_deduplicated(mount):
    v = versions(2)
    (mount.mnt / "step_100").mkdir()
    (mount.mnt / "step_200").mkdir()
    (mount.mnt / "step_100" / "ckpt.npy").write_bytes(v[0])
    mount.wait_sealed()
    (mount.mnt / "step_200" / "ckpt.npy").write_bytes(v[1])
    mount.wait_sealed()
    (mount.mnt / "last.npy").write_bytes(v[1])
    f = files_of(mount)
    first, second, copy = f["step_100/ckpt.npy"], f["step_200/ckpt.npy"], f["last.npy"]
    assert second["base"] == "step_100/ckpt.npy" and second["depth"] == 1, second
    assert second["stored"] < 0.75 * first["stored"], (first, second)
    assert copy["stored"] < 0.01 * copy["logical"], copy
    # Stats of one file name its base, which lies outside what they list.
    one = mount.stats(mount.mnt / "step_200" / "ckpt.npy")["files"]
    assert [g["base"] for g in one] == ["step_100/ckpt.npy"], one
    for name, want in (("step_100/ckpt.npy", v[0]), ("step_200/ckpt.npy", v[1]), ("last.npy", v[1])):
        assert (mount.mnt / name).read_bytes() == want
    mount.remount()
    assert (mount.mnt / "step_200" / "ckpt.npy").read_bytes() == v[1]


def test_delete_rename_overwrite_in_a_chain_break_nothing(mount):
    v = versions(4, seed=1)
    names = [f"c{i}.npy" for i in range(4)]
    for name, data in zip(names, v):
        tmp = mount.mnt / (name + ".tmp")
        tmp.write_bytes(data)
        mount.wait_sealed()
        os.rename(tmp, mount.mnt / name)  # written under a temporary name, as trainers do
    os.unlink(mount.mnt / "c1.npy")  # the middle of the chain
    os.rename(mount.mnt / "c0.npy", mount.mnt / "renamed-base.npy")
    (mount.mnt / "c3.npy").write_bytes(b"overwritten in place")
    mount.wait_sealed()
    want = {"renamed-base.npy": v[0], "c2.npy": v[2], "c3.npy": b"overwritten in place"}
    for name, data in want.items():
        assert (mount.mnt / name).read_bytes() == data, name
    mount.remount()
    for name, data in want.items():
        assert (mount.mnt / name).read_bytes() == data, name
    os.unlink(mount.mnt / "renamed-base.npy")  # the keyframe of c2's chain
    st = mount.wait_sealed()
    # Its pack stays as c2's base: counted apart, so the total is what the disk holds.
    assert st["total"]["kept_for_bases"] > 0, st["total"]
    assert st["total"]["stored"] > sum(f["stored"] for f in st["files"])
    assert (mount.mnt / "c2.npy").read_bytes() == v[2]
    for name in ("c2.npy", "c3.npy"):
        os.unlink(mount.mnt / name)
    mount.wait_sealed()
    mount.umount()
    packs = [p for p in (mount.backing / "packs").rglob("*.pack")]
    assert packs == [], packs


def test_delta_off_stores_every_file_on_its_own(mount_factory):
    m = mount_factory(opts=["delta=0"])
    v = versions(2, seed=2)
    (m.mnt / "a.npy").write_bytes(v[0])
    m.wait_sealed()
    (m.mnt / "b.npy").write_bytes(v[1])
    f = files_of(m)
    assert f["b.npy"]["base"] == "" and f["b.npy"]["depth"] == 0
    assert (m.mnt / "b.npy").read_bytes() == v[1]


def test_concurrent_writers_and_deletes_in_one_lineage(mount_factory):
    """Several trainers save, overwrite and delete checkpoints of one lineage
    at once, on a mount sealing in parallel: every surviving file reads back
    bit-exact, also after a remount, and no pack is left once all are gone."""
    from concurrent.futures import ThreadPoolExecutor

    m = mount_factory(opts=["seal_threads=3"])
    v = versions(8, seed=3)
    errors = []

    def writer(w: int):
        try:
            for i in range(w, len(v), 2):
                name = f"w{w}-{i}.npy"
                (m.mnt / name).write_bytes(v[i])
                (m.mnt / f"last-{w}.npy").write_bytes(v[i])  # overwritten each time
                if i >= 4:
                    os.unlink(m.mnt / f"w{w}-{i - 4}.npy")  # keep the newest two of each writer
        except OSError as e:
            errors.append(f"writer {w}: {e!r}")

    with ThreadPoolExecutor(2) as ex:
        list(ex.map(writer, range(2)))
    assert not errors, errors
    m.wait_sealed()
    want = {f"w{i % 2}-{i}.npy": v[i] for i in range(4, 8)}
    want.update({"last-0.npy": v[6], "last-1.npy": v[7]})
    for name, data in want.items():
        assert (m.mnt / name).read_bytes() == data, name
    assert sorted(p.name for p in m.mnt.iterdir()) == sorted(want)
    m.remount()
    for name, data in want.items():
        assert (m.mnt / name).read_bytes() == data, name
    for name in want:
        os.unlink(m.mnt / name)
    m.wait_sealed()
    m.umount()
    assert list((m.backing / "packs").rglob("*.pack")) == []


def test_gc_command_on_an_unmounted_store(mount):
    v = versions(3, seed=4)
    for i, data in enumerate(v):
        (mount.mnt / f"c{i}.npy").write_bytes(data)
        mount.wait_sealed()
    busy = run_gc(mount.backing)
    assert busy.returncode == 2 and "collects its own garbage" in busy.stderr, busy
    mount.umount()
    done = run_gc(mount.backing)
    assert done.returncode == 0 and "removed 0 pack(s)" in done.stdout, done
    mount.mount()
    for i, data in enumerate(v):
        assert (mount.mnt / f"c{i}.npy").read_bytes() == data


def run_gc(backing):
    from conftest import run_ckptfs

    return run_ckptfs("gc", backing)


def test_file_overwritten_in_place_is_its_own_lineage(mount):
    """last.ckpt rewritten each epoch: the new version is a delta against
    the one it replaced, which stays on disk only as that base."""
    v = versions(3, seed=5)
    p = mount.mnt / "last.npy"
    p.write_bytes(v[0])
    first = files_of(mount)["last.npy"]["stored"]
    for data in v[1:]:
        p.write_bytes(data)  # O_TRUNC, in place
        f = files_of(mount)["last.npy"]
        assert f["depth"] >= 1 and f["base"].startswith("(deleted file"), f
        assert f["stored"] < 0.75 * first, (f, first)
        assert p.read_bytes() == data
    mount.remount()
    assert p.read_bytes() == v[-1]
    os.unlink(p)
    mount.wait_sealed()
    mount.umount()
    assert list((mount.backing / "packs").rglob("*.pack")) == []
