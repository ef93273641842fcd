"""Lossy roles on real torch checkpoints: `ckptfs inspect --json --roles`
must call every parameter a weight paired with its own exp_avg_sq, every
exp_avg an adam_m paired with the same exp_avg_sq, every exp_avg_sq an
adam_v and every 'step' other; BatchNorm's running statistics and every
tensor of a file of raw data ({'data': ..., 'inputs': ...}) are other (out
of lossy mode's default scope). No mount is needed.

Checkpoints come from Debian's torch 1.13 (the interpreter running pytest,
as in test_torch_client.py) and from PyPI's torch 2.x (.venv-pypi, as in
test_clients.py), zip and legacy serialization, for a model with a
BatchNorm, a registered buffer, a frozen parameter and tied weights, saved
with AdamW, Adam(amsgrad), SGD(momentum) and as a bare state_dict. The
expected answer comes from the optimizer's own structure (param index ->
parameter name) and the model's modules, never from the rule inspect
applies. A buffer registered under a name that does not say so (`buf`) is
indistinguishable from a parameter in a state_dict, and counts as a weight.
"""
from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import describe, run_ckptfs
from test_clients import pypi_python  # noqa: F401  (fixture)

GEN_TIMEOUT = 600

# Writes the checkpoints and manifest.json: per file the storages in the
# order the pickler first meets them (dicts in insertion order, depth
# first), each {label, numel, role, partner}, partner being the index of
# the exp_avg_sq of the same parameter or -1.
GENERATOR = r'''
import json, os, sys
import torch

out = sys.argv[1]
FLOATS = (torch.float32, torch.float16, torch.bfloat16, torch.float64)


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.register_buffer("buf", torch.ones(8))
        self.emb = torch.nn.Embedding(10, 8)
        self.l1 = torch.nn.Linear(8, 8)
        self.bn = torch.nn.BatchNorm1d(8)
        self.frozen = torch.nn.Linear(8, 8)
        self.frozen.weight.requires_grad_(False)
        self.bn2 = torch.nn.BatchNorm1d(8)
        self.l2 = torch.nn.Linear(8, 12)
        self.head = torch.nn.Linear(12, 8, bias=False)  # as many elements as l2.weight
        self.tied = torch.nn.Linear(8, 10, bias=False)
        self.tied.weight = self.emb.weight

    def forward(self, x):
        h = self.bn(self.l1(self.emb(x).mean(1)))
        h = self.l2(self.bn2(self.frozen(h)) + self.buf)
        return self.tied(self.head(h))


def storage_of(t):
    if hasattr(t, "untyped_storage"):
        s = t.untyped_storage()
        return s.data_ptr(), s.nbytes()
    s = t.storage()
    return s.data_ptr(), s.size() * t.element_size()


def walk(obj, key, found):
    """(key, tensor) for each tensor in pickling order."""
    if isinstance(obj, torch.Tensor):
        found.append((key, obj))
    elif isinstance(obj, dict):
        for k, v in obj.items():
            walk(v, k, found)
    elif isinstance(obj, (list, tuple)):
        for v in obj:
            walk(v, None, found)


def expected(ckpt, model, opt):
    names = {id(p): n for n, p in model.named_parameters()}
    bn_stats = {f"{mn}.{b}" for mn, mod in model.named_modules()
                if isinstance(mod, torch.nn.modules.batchnorm._BatchNorm) for b in ("running_mean", "running_var")}
    params = [p for g in opt.param_groups for p in g["params"]] if opt else []
    state = ckpt["optimizer"]["state"] if opt else {}
    role_of, entry = {}, {}  # storage ptr -> role; param name -> state dict
    for i, p in enumerate(params):
        entry[names[id(p)]] = state.get(i, {})
        for k, t in state.get(i, {}).items():
            if isinstance(t, torch.Tensor):
                role_of[storage_of(t)[0]] = {"exp_avg": "adam_m", "momentum_buffer": "adam_m",
                                             "exp_avg_sq": "adam_v", "max_exp_avg_sq": "adam_v"}.get(k, "other")
    found = []
    walk(ckpt, None, found)
    rows, index = [], {}
    for key, t in found:
        ptr, nbytes = storage_of(t)
        if ptr in index:
            continue
        index[ptr] = len(rows)
        numel = nbytes // t.element_size()
        role = role_of.get(ptr, "weight")
        if t.dtype not in FLOATS or numel < 2 or key == "step" or key in bn_stats:
            role = "other"
        rows.append({"label": key if isinstance(key, str) else "", "numel": numel, "role": role,
                     "dtype": str(t.dtype), "partner": -1, "_ptr": ptr, "_tensor": t})
    for row in rows:
        if row["role"] == "weight" and row["label"] in entry:
            e = entry[row["label"]]
        elif row["role"] == "adam_m":
            e = next((s for s in entry.values() if any(v is row["_tensor"] for v in s.values())), {})
        else:
            continue
        if "exp_avg_sq" in e:
            row["partner"] = index[storage_of(e["exp_avg_sq"])[0]]
    for row in rows:
        del row["_ptr"], row["_tensor"]
    return rows


def train(make_opt, dtype=torch.float32):
    torch.manual_seed(0)
    model = Net().to(dtype)
    opt = make_opt([p for p in model.parameters() if p.requires_grad]) if make_opt else None
    for _ in range(3 if opt else 0):
        loss = model(torch.randint(0, 10, (4, 5))).float().pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    return model, opt


manifest = {}
cases = {
    "state_dict": (None, torch.float32),
    "adamw": (lambda ps: torch.optim.AdamW(ps, lr=1e-3), torch.float32),
    "adamw_bf16": (lambda ps: torch.optim.AdamW(ps, lr=1e-3), torch.bfloat16),
    "amsgrad": (lambda ps: torch.optim.Adam(ps, lr=1e-3, amsgrad=True), torch.float32),
    "sgd": (lambda ps: torch.optim.SGD(ps, lr=1e-3, momentum=0.9), torch.float32),
}
for name, (make_opt, dtype) in cases.items():
    model, opt = train(make_opt, dtype)
    ckpt = model.state_dict() if opt is None else \
        {"model": model.state_dict(), "optimizer": opt.state_dict(), "step": 5}
    rows = expected(ckpt, model, opt)
    for legacy in (False, True):
        path = os.path.join(out, name + ("_legacy" if legacy else "") + ".pt")
        torch.save(ckpt, path, _use_new_zipfile_serialization=not legacy)
        manifest[path] = {"format": "torch-legacy" if legacy else "torch-zip", "tensors": rows}
# Raw data saved with torch.save: nothing in it is a parameter.
g = torch.Generator().manual_seed(1)
data = {"data": torch.randn(64, 8, generator=g), "inputs": torch.randn(32, 8, generator=g),
        "targets": torch.randn(32, generator=g), "labels": torch.randint(0, 9, (32,), generator=g)}
rows = [{"label": k, "numel": t.numel(), "role": "other", "dtype": str(t.dtype), "partner": -1}
        for k, t in data.items()]
for legacy in (False, True):
    path = os.path.join(out, "data" + ("_legacy" if legacy else "") + ".pt")
    torch.save(data, path, _use_new_zipfile_serialization=not legacy)
    manifest[path] = {"format": "torch-legacy" if legacy else "torch-zip", "tensors": rows}
json.dump({"torch": torch.__version__, "files": manifest}, open(os.path.join(out, "manifest.json"), "w"))
'''


def generate(python: Path, out: Path) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")}
    p = subprocess.run([str(python), "-c", GENERATOR, str(out)], stdin=subprocess.DEVNULL,
                       capture_output=True, text=True, timeout=GEN_TIMEOUT, env=env)
    assert p.returncode == 0, describe(p, "failed to write checkpoints")
    return json.loads((out / "manifest.json").read_text())


def inspect_roles(path: str) -> dict:
    p = run_ckptfs("inspect", "--json", "--roles", path)
    assert p.returncode == 0, describe(p, "failed")
    return json.loads(p.stdout)


def check_file(path: str, want: dict) -> list[str]:
    got = inspect_roles(path)
    name = Path(path).name
    if got["format"] != want["format"]:
        return [f"{name}: format {got['format']} ({got['note']}), want {want['format']}"]
    rows, tensors = want["tensors"], got["tensors"]
    errors = []
    if len(tensors) != len(rows):
        errors.append(f"{name}: {len(tensors)} tensors, want {len(rows)}")
    for t in tensors:
        numel = math.prod(t["shape"])
        w = rows[t["order"]] if t["order"] < len(rows) else None
        where = f"{name}: order {t['order']} ({t['label']!r})"
        if w is None or w["label"] != t["label"] or w["numel"] != numel:
            errors.append(f"{where}: is {numel} elements, want {w}")
            continue
        partner = tensors[t["partner_v"]]["order"] if t["partner_v"] >= 0 else -1
        if (t["role"], partner) != (w["role"], w["partner"]):
            errors.append(f"{where}: role {t['role']} partner {partner}, want {w['role']} partner {w['partner']}")
    return errors


@pytest.fixture(params=["torch1-debian", "torch2-pypi"])
def torch_python(request) -> Path:
    if request.param == "torch1-debian":
        return Path(sys.executable)
    return request.getfixturevalue("pypi_python")


def test_roles_of_real_checkpoints(torch_python, tmp_path):
    manifest = generate(torch_python, tmp_path)
    assert len(manifest["files"]) == 12, manifest
    errors = []
    for path, want in manifest["files"].items():
        errors += check_file(path, want)
    assert not errors, f"torch {manifest['torch']}:\n" + "\n".join(errors)

    # The plain listing shows them too: ... shape role name label
    path = next(p for p in manifest["files"] if p.endswith("/adamw.pt"))
    p = run_ckptfs("inspect", path)
    assert p.returncode == 0, describe(p, "failed")
    rows = [line.split() for line in p.stdout.splitlines()]
    assert any(r[4:5] + r[-1:] == ["weight", "emb.weight"] for r in rows), p.stdout
    assert any(r[4:5] + r[-1:] == ["adam_v", "exp_avg_sq"] for r in rows), p.stdout
    assert any(r[4:5] + r[-1:] == ["other", "bn.running_var"] for r in rows), p.stdout
