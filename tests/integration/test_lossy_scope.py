"""Lossy only where it is meant (docs/SEMANTICS.md "Lossy mode").

Under -o lossy, only the parameters and optimizer moments of files that are
recognisably model weights or training checkpoints change: a dataset .npy,
a torch file of raw data tensors, an npz of training data and BatchNorm's
running statistics read back bit for bit. Each lossy file carries read-only
user.ckptfs.lossy.* extended attributes (fidelity, scope, the rule that
weighed the weights' errors, target and measured error per role); other
files have none. A model file takes its weights' sensitivity from an
optimizer file beside it only when that file has the same owner, was
written in the same save window and matches the model's parameters;
otherwise the recorded rule is magnitude.
"""
from __future__ import annotations

import errno
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import describe, is_mounted
from helpers import read_file

try:
    import torch
except ImportError as e:  # a missing client is a collection error, never a silent skip
    raise ImportError(f"torch is not importable from {sys.executable}; run the tests with "
                      f".venv-debian/bin/python (see scripts/install-deps.sh): {e}")
import numpy as np  # noqa: E402

from test_clients import pypi_python  # noqa: E402,F401  (fixture)
from test_lossy import (POLICY_XATTR, TOL, assert_exact, lossy_eligible, sensitivity, stats_entry,  # noqa: E402
                        tensor_bytes, value_error)

PREFIX = "user.ckptfs.lossy."
ROLES = ("weights", "first_moments", "second_moments")


def lossy_xattrs(path: Path) -> dict[str, str]:
    return {n[len(PREFIX):]: os.getxattr(path, n).decode() for n in os.listxattr(path) if n.startswith(PREFIX)}


def assert_no_lossy_xattrs(path: Path):
    assert lossy_xattrs(path) == {}, f"{path.name}: stored exactly, yet has {lossy_xattrs(path)}"
    with pytest.raises(OSError) as ei:
        os.getxattr(path, PREFIX + "fidelity")
    assert ei.value.errno == errno.ENODATA, ei.value


def bn_model(seed: int):
    """A model with a BatchNorm of 128 features, so its weight and bias are
    big enough to quantize and its running statistics are too."""
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.BatchNorm1d(128), torch.nn.ReLU(),
                                torch.nn.Linear(128, 64))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.01)
    for _ in range(4):
        x = torch.randn(32, 64)
        loss = (model(x) - x).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    return model, opt


def write_safetensors(path: Path, tensors: dict[str, np.ndarray]):
    """The safetensors layout, written by hand (no safetensors package in the
    Debian venv): u64 header length, JSON header, data in header order."""
    header, offset = {}, 0
    for name, a in tensors.items():
        assert a.dtype == np.float32
        header[name] = {"dtype": "F32", "shape": list(a.shape), "data_offsets": [offset, offset + a.nbytes]}
        offset += a.nbytes
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as fh:
        fh.write(len(h).to_bytes(8, "little") + h)
        for a in tensors.values():
            fh.write(np.ascontiguousarray(a).tobytes())


def read_safetensors(path: Path) -> dict[str, np.ndarray]:
    b = read_file(path)
    n = int.from_bytes(b[:8], "little")
    header = json.loads(b[8:8 + n])
    return {k: np.frombuffer(b[8 + n + v["data_offsets"][0]:8 + n + v["data_offsets"][1]],
                             dtype=np.float32).reshape(v["shape"]) for k, v in header.items()}


def test_only_the_checkpoint_changes(mount_factory, plain_dir):
    f = 0.05
    m = mount_factory(opts=[f"lossy={f}"])
    rng = np.random.default_rng(3)
    features = rng.standard_normal((512, 64)).astype(np.float32)  # N(0, 1) dataset features
    g = torch.Generator().manual_seed(4)
    raw = {"data": torch.randn(256, 64, generator=g), "inputs": torch.randn(256, 64, generator=g),
           "targets": torch.randn(256, generator=g), "activations": torch.randn(128, 128, generator=g).half()}
    train_x = rng.standard_normal((300, 32)).astype(np.float32)
    train_y = rng.standard_normal(300).astype(np.float32)
    model, opt = bn_model(5)
    ckpt = {"model": model.state_dict(), "optimizer": opt.state_dict(), "epoch": 1}

    for d in (m.mnt, plain_dir):
        np.save(d / "features.npy", features)
        torch.save(raw, d / "raw.pt")
        np.savez(d / "train.npz", x=train_x, y=train_y)
        torch.save(ckpt, d / "ckpt.pt")
    st = {e["path"].lstrip("/"): e for e in m.wait_sealed()["files"]}

    for name in ("features.npy", "raw.pt", "train.npz"):
        assert read_file(m.mnt / name) == read_file(plain_dir / name), f"{name}: data must read back bit-exact"
        assert st[name]["lossy"] is None, f"ckptfs stats lists {name} as lossy: {st[name]}"
        assert_no_lossy_xattrs(m.mnt / name)

    back = torch.load(m.mnt / "ckpt.pt", map_location="cpu")
    sd, rsd = ckpt["model"], back["model"]
    v_of = {name: ckpt["optimizer"]["state"][i]["exp_avg_sq"]
            for i, name in enumerate(n for n, _ in model.named_parameters())}
    params = {n for n, _ in model.named_parameters()}
    weight_elements = 0
    for name, t in sd.items():
        r = rsd[name]
        if name not in params or not lossy_eligible(t):
            assert_exact(t, r, f"model/{name}")  # running_mean, running_var, num_batches_tracked
            continue
        if t.dim() >= 2:
            assert tensor_bytes(t) != tensor_bytes(r), f"model/{name}: a weight matrix was not quantized"
        err = value_error(t.double().numpy(), r.double().numpy(), sensitivity(v_of[name].double().numpy(), "weights"))
        assert err <= f * TOL, f"model/{name}: error {err}"
        weight_elements += t.numel()
    assert {"1.running_mean", "1.running_var", "1.num_batches_tracked"} <= set(sd) - params
    for idx, s in ckpt["optimizer"]["state"].items():
        for k, t in s.items():
            r = back["optimizer"]["state"][idx][k]
            if k == "step" or not lossy_eligible(t):
                assert_exact(t, r, f"optimizer/{idx}/{k}")
            elif t.dim() >= 2:
                assert tensor_bytes(t) != tensor_bytes(r), f"optimizer/{idx}/{k}: a moment was not quantized"
    assert back["optimizer"]["param_groups"] == ckpt["optimizer"]["param_groups"]
    assert back["epoch"] == 1

    lossy = st["ckpt.pt"]["lossy"]
    assert lossy is not None and lossy["weights"]["elements"] == weight_elements, lossy
    assert lossy["scope"] == "models" and lossy["sensitivity"] == "second-moments", lossy

    # The attributes say the same as stats, and are read-only.
    xa = lossy_xattrs(m.mnt / "ckpt.pt")
    assert float(xa["fidelity"]) == pytest.approx(f, rel=1e-5), xa
    assert xa["scope"] == "models" and xa["sensitivity"] == "second-moments", xa
    for role in ROLES:
        assert float(xa[f"target.{role}"]) == pytest.approx(lossy[role]["target"], rel=1e-5), (role, xa)
        assert float(xa[f"error.{role}"]) == pytest.approx(lossy[role]["max_error"], rel=1e-5), (role, xa)
        assert 0 < float(xa[f"error.{role}"]) <= float(xa[f"target.{role}"]) * TOL, (role, xa)
    for name in (PREFIX + "fidelity", PREFIX + "error.weights", PREFIX + "anything"):
        with pytest.raises(OSError) as ei:
            os.setxattr(m.mnt / "ckpt.pt", name, b"0")
        assert ei.value.errno == errno.EPERM, (name, ei.value)
        with pytest.raises(OSError) as ei:
            os.removexattr(m.mnt / "ckpt.pt", name)
        assert ei.value.errno == errno.EPERM, (name, ei.value)
    with pytest.raises(OSError) as ei:
        os.setxattr(m.mnt / "features.npy", PREFIX + "fidelity", b"0.5")
    assert ei.value.errno == errno.EPERM
    assert lossy_xattrs(m.mnt / "ckpt.pt") == xa

    # They travel with cp --preserve=xattr to another file system.
    dst = plain_dir / "copied.pt"
    p = subprocess.run(["cp", "--preserve=xattr", str(m.mnt / "ckpt.pt"), str(dst)], capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    assert read_file(dst) == read_file(m.mnt / "ckpt.pt")
    assert lossy_xattrs(dst) == xa

    m.remount()
    assert lossy_xattrs(m.mnt / "ckpt.pt") == xa
    for name in ("features.npy", "raw.pt", "train.npz"):
        assert read_file(m.mnt / name) == read_file(plain_dir / name)
        assert_no_lossy_xattrs(m.mnt / name)


def test_copy_within_the_mount(mount_factory):
    """cp --preserve=xattr from one ckptfs file to another: the copy's own
    attributes come from its own seal; setting ours fails with EPERM, which
    cp reports while copying the data."""
    m = mount_factory(opts=["lossy=0.05"])
    model, opt = bn_model(6)
    torch.save({"model": model.state_dict(), "optimizer": opt.state_dict()}, m.mnt / "a.pt")
    m.wait_sealed()
    src = lossy_xattrs(m.mnt / "a.pt")
    assert src, "a.pt has no lossy attributes"
    os.mkdir(m.mnt / "exact")
    os.setxattr(m.mnt / "exact", POLICY_XATTR, b"lossless")
    p = subprocess.run(["cp", "--preserve=xattr", str(m.mnt / "a.pt"), str(m.mnt / "exact" / "a.pt")],
                       capture_output=True, text=True)
    assert "Operation not permitted" in p.stderr, (p.returncode, p.stderr)
    m.wait_sealed()
    assert read_file(m.mnt / "exact" / "a.pt") == read_file(m.mnt / "a.pt")
    assert_no_lossy_xattrs(m.mnt / "exact" / "a.pt")  # stored exactly: it is not lossy itself
    subprocess.run(["cp", "-a", str(m.mnt / "a.pt"), str(m.mnt / "b.pt")], capture_output=True, text=True)
    m.wait_sealed()
    assert lossy_xattrs(m.mnt / "b.pt")["fidelity"] == src["fidelity"], "b.pt is sealed under the mount's policy"


def test_policy_scope_all_quantizes_arrays(mount_factory, plain_dir):
    """Only an explicit scope=all makes NumPy arrays and data tensors lossy."""
    m = mount_factory(opts=["lossy=0.05", "lossy_scope=all"])
    features = np.random.default_rng(8).standard_normal((256, 64)).astype(np.float32)
    raw = {"data": torch.randn(256, 64)}
    np.save(m.mnt / "features.npy", features)
    torch.save(raw, m.mnt / "raw.pt")
    m.wait_sealed()
    assert 0 < value_error(features, np.load(m.mnt / "features.npy")) <= 0.05 * TOL
    back = torch.load(m.mnt / "raw.pt")
    assert 0 < value_error(raw["data"].numpy(), back["data"].numpy()) <= 0.05 * TOL
    for name in ("features.npy", "raw.pt"):
        xa = lossy_xattrs(m.mnt / name)
        assert xa["scope"] == "all" and xa["sensitivity"] == "magnitude", (name, xa)


@pytest.mark.parametrize("opt", ["lossy_scope=npy", "lossy_scope=", "lossy_scope"])
def test_bad_scope_option(mount_factory, opt):
    m = mount_factory(mount=False)
    m.fsck_at_teardown = False
    p = m.mount(opts=["lossy", opt], check=False)
    assert p.returncode != 0, describe(p, "mounted with a bad option")
    assert "lossy_scope" in p.stdout + p.stderr or "scope" in p.stdout + p.stderr, describe(p)
    assert not is_mounted(m.mnt)


# -- the sibling optimizer file ------------------------------------------------

def save_model_and_optimizer(save_dir: Path, model, opt, *, opt_owner=None, opt_age=None):
    save_dir.mkdir()
    torch.save(opt.state_dict(), save_dir / "optimizer.pt")
    if opt_owner is not None:
        os.chown(save_dir / "optimizer.pt", opt_owner, opt_owner)
    if opt_age is not None:
        t = time.time() - opt_age
        os.utime(save_dir / "optimizer.pt", (t, t))


def sibling_case(m, name: str, opt_model_seed=21, opt_sizes=(64, 512), **kw):
    torch.manual_seed(opt_model_seed)
    model = torch.nn.Sequential(torch.nn.Linear(64, 512), torch.nn.GELU(), torch.nn.Linear(512, 64))
    opt_model = model if opt_sizes == (64, 512) else \
        torch.nn.Sequential(torch.nn.Linear(*opt_sizes), torch.nn.GELU(), torch.nn.Linear(opt_sizes[1], 64))
    opt = torch.optim.AdamW(opt_model.parameters(), lr=1e-3)
    for _ in range(5):
        x = torch.randn(16, 64) if opt_model is model else torch.randn(16, opt_sizes[0])
        loss = opt_model(x).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    save_dir = m.mnt / name
    save_model_and_optimizer(save_dir, model, opt, **kw)
    m.wait_sealed()
    weights = {k: v.detach().numpy().copy() for k, v in model.state_dict().items()}
    write_safetensors(save_dir / "model.safetensors", weights)
    m.wait_sealed()
    return save_dir, weights, opt


def test_sibling_optimizer_file_gives_sensitivity(mount_factory):
    """model.safetensors beside the optimizer.pt of the same save (as a
    Trainer writes them) is weighed by that file's second moments."""
    f = 0.05
    m = mount_factory(opts=[f"lossy={f}"])
    save_dir, weights, opt = sibling_case(m, "checkpoint-5")
    xa = lossy_xattrs(save_dir / "model.safetensors")
    assert xa["sensitivity"] == "sibling-second-moments", (xa, m.log_text()[-3000:])
    assert "second moments of optimizer.pt" in m.log_text()
    ent = stats_entry(m, "checkpoint-5/model.safetensors")
    assert ent["lossy"]["sensitivity"] == "sibling-second-moments", ent
    back = read_safetensors(save_dir / "model.safetensors")
    state = opt.state_dict()["state"]
    for i, name in enumerate(weights):  # state_dict order is the optimizer's parameter order
        v = state[i]["exp_avg_sq"].numpy().astype(np.float64).ravel()
        err = value_error(weights[name].ravel(), back[name].ravel(), sensitivity(v, "weights"))
        assert err <= f * TOL, f"{name}: v-weighted error {err} above {f}"


@pytest.mark.parametrize("case", ["foreign_owner", "other_shapes", "earlier_save"])
def test_planted_sibling_is_not_used(mount_factory, case):
    """An optimizer file that is another user's, belongs to another model or
    was written long before the model file leaves the model's weights
    weighed by magnitude, and the file's attributes say so."""
    f = 0.05
    m = mount_factory(opts=[f"lossy={f}"])
    kw = {"foreign_owner": {"opt_owner": 4242},
          "other_shapes": {"opt_sizes": (32, 512)},
          "earlier_save": {"opt_age": 3600}}[case]
    save_dir, weights, _ = sibling_case(m, "ckpt", **kw)
    xa = lossy_xattrs(save_dir / "model.safetensors")
    assert xa["sensitivity"] == "magnitude", (case, xa)
    assert stats_entry(m, "ckpt/model.safetensors")["lossy"]["sensitivity"] == "magnitude"
    log = m.log_text()
    assert "weights weighed by magnitude" in log, log[-3000:]
    if case == "other_shapes":
        assert "optimizer.pt not used: parameter 0" in log, log[-3000:]
    back = read_safetensors(save_dir / "model.safetensors")
    for name, w in weights.items():
        if w.size >= 64:
            assert 0 < value_error(w, back[name]) <= f * TOL, name


HF_CLIENT = r'''
import sys, time, torch
from safetensors.torch import save_file
save_dir, named = sys.argv[1], sys.argv[2] == "named"
torch.manual_seed(3)
model = torch.nn.Sequential(torch.nn.Linear(64, 512), torch.nn.GELU(), torch.nn.Linear(512, 64))
opt = torch.optim.AdamW(model.named_parameters() if named else model.parameters(), lr=1e-3)
for _ in range(5):
    loss = model(torch.randn(16, 64)).pow(2).mean()
    opt.zero_grad(); loss.backward(); opt.step()
torch.save(opt.state_dict(), save_dir + "/optimizer.pt")
time.sleep(1)  # sealed before the model file, as a Trainer's save usually is
save_file(model.state_dict(), save_dir + "/model.safetensors")  # sorted by name: 0.bias first
'''


@pytest.mark.parametrize("named", ["named", "unnamed"])
def test_sibling_of_a_safetensors_model_by_name(mount_factory, pypi_python, tmp_path, named):
    """torch 2.x + the safetensors library, as a Trainer saves: the model
    file's tensors are sorted by name, the optimizer's state keyed by index.
    With the parameter names torch >= 2.6 keeps in param_groups
    (an optimizer built from named_parameters()) they pair by name;
    without them no order can be trusted, and magnitude is used."""
    m = mount_factory(opts=["lossy=0.05"])
    save_dir = m.mnt / "checkpoint-5"
    save_dir.mkdir()
    script = tmp_path / "hf_client.py"
    script.write_text(HF_CLIENT)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")}
    p = subprocess.run([str(pypi_python), str(script), str(save_dir), named], capture_output=True, text=True,
                       timeout=600, env=env, stdin=subprocess.DEVNULL)
    assert p.returncode == 0, describe(p, "client failed")
    m.wait_sealed()
    xa = lossy_xattrs(save_dir / "model.safetensors")
    want = "sibling-second-moments" if named == "named" else "magnitude"
    assert xa["sensitivity"] == want, (xa, m.log_text()[-3000:])
