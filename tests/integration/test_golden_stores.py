"""Golden stores (tests/data/golden/README.md): one real store per pack
format version this code has written, made by the binary of that time.
Today's build mounts a copy of each (never the checked-in tree: the mount
runs recovery and tightens modes), reads every file back, and fsck finds
it clean; and the v5 inputs, written again today, seal to the same pack
bytes as the v5 store holds (ids and times aside), or for files an
intended encoder change altered, to the packs resealed.json records, so
a change that alters what the codecs store is caught.
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil

import pytest

from conftest import CKPTFS, describe, run_ckptfs
from golden_store import GOLDEN, Pack, apply_steps, pack_path, stub_object

STORES = sorted(p.parent.name for p in GOLDEN.glob("*/manifest.json"))


def manifest(name: str) -> dict:
    return json.loads((GOLDEN / name / "manifest.json").read_text())


def copy_store(name: str, dst):
    """A copy as a git checkout has it: git keeps no empty directory, so
    the store's empty staging/ and tmp/ are missing, and its modes are the
    checkout's (0755/0644, not the store's 0700/0600)."""
    shutil.copytree(GOLDEN / name / "store", dst, symlinks=True)
    for d in ("staging", "tmp"):
        if (dst / d).is_dir() and not any((dst / d).iterdir()):
            (dst / d).rmdir()
    return dst


def test_golden_stores_cover_every_pack_version():
    versions = {v for name in STORES for v in manifest(name)["pack_versions"]}
    assert versions == {1, 2, 3, 4, 5}, f"golden stores {STORES} hold pack versions {sorted(versions)}"
    codecs = {c for name in STORES for c in manifest(name)["codecs"]}
    assert codecs == {"raw", "zstd", "zero", "tensor", "ref", "delta", "lossy"}


@pytest.mark.parametrize("name", STORES)
def test_fsck_of_a_checkout_copy(name, tmp_path):
    backing = copy_store(name, tmp_path / "backing")
    # fsck, a read-only tool, does not create the layout (a mount does):
    # it refuses a store without staging/ or tmp/, so they come back first.
    for d in ("staging", "tmp"):
        (backing / d).mkdir()
    p = run_ckptfs("fsck", backing)
    assert p.returncode == 0, describe(p, "reports problems in a golden store")
    assert " 0 errors, 0 warnings" in p.stdout, describe(p)


@pytest.mark.parametrize("name", STORES)
def test_golden_store_reads_back(name, mount_factory, tmp_path):
    m = manifest(name)
    fs = mount_factory(name="golden", backing=copy_store(name, tmp_path / "backing"))
    for f in m["files"]:
        got = (fs.mnt / f["path"]).read_bytes()
        assert hashlib.sha256(got).hexdigest() == f["sha256"], f"{name}: {f['path']} reads back other bytes"
        assert got == (GOLDEN / f["expected"]).read_bytes(), f"{name}: {f['path']} differs from {f['expected']}"
    for link, target in m["symlinks"].items():
        assert os.readlink(fs.mnt / link) == target
    names = {str(p.relative_to(fs.mnt)) for p in fs.mnt.rglob("*")}
    assert names == {f["path"] for f in m["files"]} | set(m["symlinks"]) | set(m["dirs"])
    for f in m["files"]:
        if f["lossy"]:
            fidelity = os.getxattr(fs.mnt / f["path"], "user.ckptfs.lossy.fidelity").decode()
            assert float(fidelity) == pytest.approx(0.01), f"{f['path']}: fidelity {fidelity}"
    fs.umount()
    p = fs.fsck()
    assert p.returncode == 0, describe(p, f"{name}: fsck after a mount")
    # Recovery deleted nothing: every pack of the old store was needed.
    assert sorted(p.name for p in (fs.backing / "packs").rglob("*.pack")) == \
        sorted(p.name for p in (GOLDEN / name / "store" / "packs").rglob("*.pack"))


def resealed(name: str) -> dict[str, str]:
    """Files whose packs an intended change to what the encoders store has
    altered since the store was written (tests/data/golden/README.md,
    "Sealed again"): path -> sha256 of the pack sealed now, normalized with
    each pack id replaced by its file's place in the manifest (1, 2, ...)."""
    f = GOLDEN / name / "resealed.json"
    return json.loads(f.read_text())["files"] if f.exists() else {}


def _mismatch(name: str, path: str, old: Pack, a: bytes, b: bytes) -> str:
    if len(a) != len(b):
        return f"{path}: pack is {len(b)} bytes, the {name} store's {len(a)}"
    at = next(i for i in range(len(a)) if a[i] != b[i])
    return f"{path}: pack differs first in the {old.region(at)} (byte {at})"


@pytest.mark.parametrize("workers", [1, 3])
def test_v5_inputs_seal_to_the_same_pack_bytes(workers, mount_factory):
    """Packs are deterministic for the same input, written in the same order
    with the same options, except for what is random or a clock by design:
    object ids (the base ids in ref, delta and lossy chunks and in the meta
    block) and the meta block's sealed-at time, and the checksums over them.
    Sealing workers code chunks at the same time but write the same bytes."""
    name = "v5"
    m = manifest(name)
    old_backing = GOLDEN / name / "store"
    fs = mount_factory(name="again", opts=m["mount_options"] + [f"seal_workers={workers}"])
    apply_steps(CKPTFS, fs.mnt, m["steps"])
    fs.umount()
    old_ids = {f["path"]: stub_object(old_backing / "ns" / f["path"]) for f in m["files"]}
    new_ids = {f["path"]: stub_object(fs.backing / "ns" / f["path"]) for f in m["files"]}
    idmap = {old_ids[p]: new_ids[p] for p in old_ids}
    places = {new_ids[f["path"]]: i + 1 for i, f in enumerate(m["files"]) if new_ids[f["path"]]}
    now = resealed(name)
    problems = []
    for f in m["files"]:
        if not old_ids[f["path"]]:
            if new_ids[f["path"]]:
                problems.append(f"{f['path']}: has a pack now, none in the {name} store")
            continue
        old = Pack(pack_path(old_backing, old_ids[f["path"]]).read_bytes())
        new = Pack(pack_path(fs.backing, new_ids[f["path"]]).read_bytes())
        if f["path"] in now:
            digest = hashlib.sha256(new.normalized(places)).hexdigest()
            if digest != now[f["path"]]:
                problems.append(f"{f['path']}: pack differs from the one resealed.json records "
                                f"(now sha256 {digest}); codecs then {old.codecs()}, now {new.codecs()}")
            continue
        a, b = old.normalized(idmap), new.normalized({})
        if a != b:
            problems.append(_mismatch(name, f["path"], old, a, b) +
                            f"; codecs then {old.codecs()}, now {new.codecs()}")
    assert not problems, "stored bytes changed:\n" + "\n".join(problems)
