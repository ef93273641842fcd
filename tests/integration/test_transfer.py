"""Data in and out of an unmounted store (issue 19): `ckptfs import` of a
checkpoint directory (oldest file first, so a series is stored as deltas),
`ckptfs export` back to plain files (bit-exact for lossless files, the
reconstruction a mount reads for lossy ones), --json summaries, and the
progress line on a terminal only."""
from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import numpy as np
import pytest

from conftest import CKPTFS, describe, run_ckptfs

torch = pytest.importorskip("torch")


def npy_series(d: Path, n: int = 4) -> list[Path]:
    """A checkpoint series: each version a small change of the last, written oldest first."""
    d.mkdir(parents=True)
    rng = np.random.default_rng(7)
    w = rng.standard_normal(300_000).astype(np.float32)
    paths = []
    for i in range(n):
        w = w + (rng.standard_normal(w.size) * 1e-3).astype(np.float32) * (np.arange(w.size) % 9 == 0)
        p = d / f"step{i}.npy"
        np.save(p, w)
        os.utime(p, (1_700_000_000 + i, 1_700_000_000 + i))
        paths.append(p)
    return paths


def tree(root: Path) -> dict:
    """Name -> (kind, bytes or link target, mode, mtime) of every entry under root."""
    out = {}
    for p in sorted(root.rglob("*")):
        st = p.lstat()
        rel = str(p.relative_to(root))
        if p.is_symlink():
            out[rel] = ("link", os.readlink(p), None, None)  # a link's own times are not kept
        elif p.is_dir():
            out[rel] = ("dir", None, st.st_mode & 0o7777, None)
        else:
            out[rel] = ("file", p.read_bytes(), st.st_mode & 0o7777, st.st_mtime_ns)
    return out


def test_import_then_export_round_trip_with_lineage(tmp_path):
    src = tmp_path / "run"
    npy_series(src)
    (src / "sub").mkdir()
    (src / "sub" / "notes.txt").write_text("lr=3e-4\n")
    os.chmod(src / "sub" / "notes.txt", 0o640)
    os.symlink("step3.npy", src / "latest.npy")
    store = tmp_path / "store"
    store.mkdir()

    imp = run_ckptfs("import", "--json", src, store)
    assert imp.returncode == 0, describe(imp)
    summary = json.loads(imp.stdout)
    assert summary["files"] == 5 and summary["symlinks"] == 1 and summary["directories"] == 2, summary
    assert summary["delta_files"] >= 2, f"the series was not stored as deltas: {summary}"
    assert summary["stored"] < summary["logical"] / 2, summary
    assert imp.stderr.strip() == "", f"no progress line when stderr is not a terminal:\n{imp.stderr}"

    st = json.loads(run_ckptfs("stats", "--json", store).stdout)
    files = {f["path"]: f for f in st["files"]}
    assert set(files) == {"run/step0.npy", "run/step1.npy", "run/step2.npy", "run/step3.npy", "run/sub/notes.txt"}
    assert not any(f["staged"] for f in files.values()), "import returned before every file was sealed"
    assert run_ckptfs("fsck", store).returncode == 0

    out = tmp_path / "out"
    exp = run_ckptfs("export", "--json", store, "run", out)
    assert exp.returncode == 0, describe(exp)
    assert json.loads(exp.stdout)["bytes"] == summary["bytes"]
    assert tree(out) == tree(src), "export differs from what was imported (bytes, modes, mtimes or links)"

    whole = tmp_path / "whole"
    assert run_ckptfs("export", store, whole).returncode == 0
    assert tree(whole / "run") == tree(src)


def test_import_into_a_path_and_a_single_file(tmp_path):
    src = tmp_path / "series"
    paths = npy_series(src, 2)
    store = tmp_path / "store"
    store.mkdir()
    assert run_ckptfs("import", src, store, "exp/a/run1").returncode == 0
    assert run_ckptfs("import", paths[0], store, "single.npy").returncode == 0
    again = run_ckptfs("import", src, store, "exp/a/run1")
    assert again.returncode == 2 and "run1 is not empty" in again.stderr, describe(again)
    assert "ckptfs-mount-" not in again.stderr, "the message names the private mount point"
    out = tmp_path / "out.npy"
    assert run_ckptfs("export", store, "single.npy", out).returncode == 0
    assert out.read_bytes() == paths[0].read_bytes()
    names = {f["path"] for f in json.loads(run_ckptfs("stats", "--json", store).stdout)["files"]}
    assert names == {"exp/a/run1/step0.npy", "exp/a/run1/step1.npy", "single.npy"}


def test_export_of_lossy_files_is_what_a_mount_reads(tmp_path, mount_factory):
    src = tmp_path / "ckpt"
    src.mkdir()
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(256, 256), torch.nn.Linear(256, 64))
    torch.save(model.state_dict(), src / "model.pt")
    store = tmp_path / "store"
    store.mkdir()
    imp = run_ckptfs("import", "--json", "-o", "lossy=0.05", src, store)
    assert imp.returncode == 0, describe(imp)
    out = tmp_path / "out"
    assert run_ckptfs("export", store, out).returncode == 0, "export"
    exported = (out / "ckpt" / "model.pt").read_bytes()
    assert exported != (src / "model.pt").read_bytes(), "the lossy file came back bit-exact"
    m = mount_factory(backing=store)
    assert (m.mnt / "ckpt" / "model.pt").read_bytes() == exported, "export differs from a read through a mount"
    m.umount()
    back = torch.load(out / "ckpt" / "model.pt")
    for k, v in model.state_dict().items():
        rel = (back[k] - v).abs().max() / v.abs().max()
        assert rel < 0.2, (k, float(rel))


def test_refusals_exit_2(tmp_path, mount_factory):
    src = tmp_path / "src"
    npy_series(src, 1)
    m = mount_factory()
    for args in (["export", m.backing, tmp_path / "o1"],          # mounted: served elsewhere
                 ["import", src, m.backing],
                 ["export", tmp_path / "src", tmp_path / "o2"],  # not a store
                 ["export", m.backing, "../x", tmp_path / "o3"],
                 ["import", src, m.backing, "/abs"],
                 ["export", m.backing],                         # DEST missing
                 ["import", src]):
        p = run_ckptfs(*args)
        assert p.returncode == 2, describe(p, "should exit 2")
    m.umount()
    full = tmp_path / "full"
    full.mkdir()
    (full / "x").write_text("x")
    p = run_ckptfs("export", m.backing, full)
    assert p.returncode == 2 and "not empty" in p.stderr, describe(p)
    p = run_ckptfs("export", m.backing, "no/such", tmp_path / "o4")
    assert p.returncode == 2 and f"{m.backing}:no/such" in p.stderr, describe(p)
    assert not list(Path(os.environ.get("TMPDIR", "/tmp")).glob("ckptfs-mount-*")), "a private mount point was left"


def test_progress_line_on_a_terminal(tmp_path):
    src = tmp_path / "run"
    npy_series(src, 2)
    store = tmp_path / "store"
    store.mkdir()
    # script(1) gives the command a terminal; the line is redrawn with \r.
    cmd = f"{CKPTFS} import {src} {store}"
    p = subprocess.run(["script", "-qfec", cmd, "/dev/null"], capture_output=True, timeout=120)
    assert p.returncode == 0, describe(p)
    assert b"\rimport  " in p.stdout and b"/s" in p.stdout and b"100%" in p.stdout, repr(p.stdout)
    for cmd in (f"{CKPTFS} fsck {store}", f"{CKPTFS} export {store} {tmp_path / 'out'}"):
        p = subprocess.run(["script", "-qfec", cmd, "/dev/null"], capture_output=True, timeout=120)
        assert p.returncode == 0, describe(p)
        what = cmd.split()[1].encode()
        assert b"\r" + what + b"  " in p.stdout and b"100%" in p.stdout, repr(p.stdout)
    fsck = run_ckptfs("fsck", store)  # not a terminal: no progress line
    assert fsck.returncode == 0 and fsck.stderr == "", describe(fsck)
