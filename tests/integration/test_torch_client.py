"""A real client: PyTorch (Debian's python3-torch via .venv-debian) saving and
loading model + AdamW checkpoints through the mount."""
from __future__ import annotations

import os
import sys

import pytest

from helpers import read_file

try:
    import torch
except ImportError as e:  # a missing client is a collection error, never a silent skip
    raise ImportError(f"torch is not importable from {sys.executable}; run the tests with "
                      f".venv-debian/bin/python (see scripts/install-deps.sh): {e}")
import numpy as np  # noqa: E402


def make_checkpoint(seed=0, width=1024, steps=3):
    torch.manual_seed(seed)
    model = torch.nn.Sequential(
        torch.nn.Linear(512, width), torch.nn.GELU(),
        torch.nn.Linear(width, width), torch.nn.LayerNorm(width), torch.nn.GELU(),
        torch.nn.Linear(width, 512),
    )
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.01)
    for _ in range(steps):
        x = torch.randn(16, 512)
        loss = (model(x) - x).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    return {"model": model.state_dict(), "optim": opt.state_dict(), "step": steps,
            "note": "ckptfs integration test"}


def assert_same(a, b, where="ckpt"):
    """Deep equality with torch.equal for every tensor."""
    if isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor), f"{where}: tensor vs {type(b)}"
        assert a.dtype == b.dtype and a.shape == b.shape, f"{where}: {a.dtype}{tuple(a.shape)} " \
            f"vs {b.dtype}{tuple(b.shape)}"
        assert torch.equal(a, b), f"{where}: tensor values differ"
    elif isinstance(a, dict):
        assert isinstance(b, dict) and list(a.keys()) == list(b.keys()), \
            f"{where}: keys {list(a)[:10]} vs {list(b)[:10] if isinstance(b, dict) else b}"
        for k in a:
            assert_same(a[k], b[k], f"{where}[{k!r}]")
    elif isinstance(a, (list, tuple)):
        assert type(a) is type(b) and len(a) == len(b), f"{where}: {a!r} vs {b!r}"
        for i, (x, y) in enumerate(zip(a, b)):
            assert_same(x, y, f"{where}[{i}]")
    else:
        assert a == b, f"{where}: {a!r} != {b!r}"


def count_tensors(obj):
    if isinstance(obj, torch.Tensor):
        return 1
    if isinstance(obj, dict):
        return sum(count_tensors(v) for v in obj.values())
    if isinstance(obj, (list, tuple)):
        return sum(count_tensors(v) for v in obj)
    return 0


@pytest.fixture(scope="module")
def ckpt():
    c = make_checkpoint()
    n_bytes = sum(p.numel() * p.element_size() for p in c["model"].values())
    assert 5 << 20 <= n_bytes <= 20 << 20, n_bytes
    assert len(c["optim"]["state"]) == len(c["model"])  # every param has AdamW state
    return c


@pytest.mark.parametrize("fmt", ["zip", "legacy"])
def test_torch_save_load(mount, plain_dir, ckpt, fmt):
    kw = {} if fmt == "zip" else {"_use_new_zipfile_serialization": False}
    # same basename in both places: the zip format embeds it in record names
    os.makedirs(mount.mnt / "run")
    fs_path = mount.mnt / "run" / "ckpt-step3.pt"
    ref_path = plain_dir / "ckpt-step3.pt"
    torch.save(ckpt, fs_path, **kw)
    torch.save(ckpt, ref_path, **kw)
    ref_bytes = read_file(ref_path)
    assert os.path.getsize(fs_path) == len(ref_bytes)
    assert read_file(fs_path) == ref_bytes

    def check_all(when):
        assert read_file(fs_path) == ref_bytes, when
        loaded = torch.load(fs_path, map_location="cpu")
        assert count_tensors(loaded) == count_tensors(ckpt) > 30
        assert_same(ckpt, loaded, f"{when}:ckpt")
        mm = np.memmap(fs_path, dtype=np.uint8, mode="r")
        try:
            ref = np.fromfile(ref_path, dtype=np.uint8)
            assert mm.shape == ref.shape, when
            assert np.array_equal(mm, ref), when
            # random slices through the mapping too
            rng = np.random.default_rng(0)
            for _ in range(50):
                a = int(rng.integers(0, len(ref)))
                b = min(len(ref), a + int(rng.integers(1, 1 << 20)))
                assert np.array_equal(mm[a:b], ref[a:b]), f"{when}: memmap slice {a}:{b}"
        finally:
            del mm

    check_all("before sealing (or while)")
    mount.wait_sealed()
    check_all("after sealing")
    mount.remount()
    check_all("after remount")
    # the store actually compressed something and accounts for the file
    st = mount.stats()
    ent = [e for e in st["files"] if e["path"].lstrip("/") == "run/ckpt-step3.pt"]
    assert ent and ent[0]["logical"] == len(ref_bytes), st


def test_torch_checkpoint_series_with_atomic_replace(mount, plain_dir):
    """The usual training-loop pattern: save to tmp, os.replace() to final,
    keep a 'latest' symlink, continue training from the reloaded state."""
    d = mount.mnt / "ckpts"
    d.mkdir()
    torch.manual_seed(1)
    model = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.ReLU(),
                                torch.nn.Linear(512, 256))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    saved = {}
    for step in range(1, 6):
        x = torch.randn(8, 256)
        loss = model(x).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        obj = {"model": model.state_dict(), "optim": opt.state_dict(), "step": step}
        tmp = d / f"step-{step}.pt.tmp"
        with open(tmp, "wb") as f:
            torch.save(obj, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, d / f"step-{step}.pt")
        if os.path.lexists(d / "latest"):
            os.unlink(d / "latest")
        os.symlink(f"step-{step}.pt", d / "latest")
        saved[step] = {"model": {k: v.clone() for k, v in obj["model"].items()},
                       "optim": torch.load(d / f"step-{step}.pt")["optim"]}
    mount.remount()
    assert sorted(os.listdir(d)) == ["latest"] + [f"step-{s}.pt" for s in range(1, 6)]
    latest = torch.load(d / "latest")
    assert latest["step"] == 5
    assert_same(saved[5]["model"], latest["model"], "latest.model")
    for step in range(1, 6):
        got = torch.load(d / f"step-{step}.pt")
        assert_same(saved[step]["model"], got["model"], f"step{step}.model")
        assert_same(saved[step]["optim"], got["optim"], f"step{step}.optim")
    # resume training from the reloaded state
    model.load_state_dict(latest["model"])
    opt.load_state_dict(latest["optim"])
    opt.step()
