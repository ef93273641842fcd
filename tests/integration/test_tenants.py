"""Hostile tenants, round two (issue 40): no local user can stall, flood or
steer the daemon. A real second user (local_users.py) attacks a root
daemon mounted with allow_other; each section covers one way in, and each
test fails on the binary before issue 40's fixes.

  1. file descriptors: one user's files cannot exhaust the daemon's fds;
  2. the log: nothing a user supplies forges or floods a log line;
  3. sealing: holes cost nothing, unlinked files stop sealing, one user's
     big file does not hold another user's small one;
  4. lossy scope: data files named like parameters stay exact.
"""
from __future__ import annotations

import os
import stat
import subprocess
from pathlib import Path

import pytest

from conftest import describe, run_ckptfs
from local_users import PY, User, shared_mount, shared_top, users  # noqa: F401 (fixtures)


# ------------------------------------------------- 1. bounded file descriptors
# (section 1 tests go here)


# ----------------------------------------------------------- 2. the log
# (section 2 tests go here)


# ----------------------------------------------------- 3. fair, bounded sealing
# (section 3 tests go here)


# ------------------------------------------------------- 4. lossy scope
# Under scope=models a torch tensor is lossy only when the pickle proves it
# a parameter or optimizer moment (a Module.state_dict()'s _metadata, an
# optimizer state_dict's entries); names never do (docs/SEMANTICS.md).

# Run by the attacker (Debian's torch 1.13 under /usr/bin/python3): saves
# each file into its lossy directory in the mount and into a plain
# directory under the same name (torch.save's zip embeds the name), so the
# plain copies are what every byte must read back as.
LOSSY_SAVES = r"""
import collections, sys, torch
mnt, ref = sys.argv[1], sys.argv[2]
torch.manual_seed(40)
n = 1 << 16
model = torch.nn.Sequential(torch.nn.Linear(256, 256), torch.nn.ReLU(), torch.nn.Linear(256, 256))
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
for _ in range(3):
    loss = model(torch.randn(32, 256)).pow(2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
files = {
    # issue 40's three data files named like parameters
    "sample_weight.pt": {"inputs": torch.randn(n // 64, 64), "labels": torch.randn(n),
                         "sample_weight": torch.rand(n)},
    "train_xy.pt": collections.OrderedDict(train_x=torch.randn(n // 64, 64), train_y=torch.randn(n)),
    "mnist.pt": {"mnist.train": torch.rand(n // 64, 64), "mnist.test": torch.rand(n // 128, 64)},
    # a model's tensors copied into a plain dict: no _metadata, no optimizer
    "plain_dict.pt": {k: v.clone() for k, v in model.state_dict().items()},
    # the positive control: a real checkpoint
    "checkpoint.pt": {"model": model.state_dict(), "optimizer": opt.state_dict(), "epoch": 3},
}
for name, obj in files.items():
    for d in (mnt, ref):
        torch.save(obj, d + "/" + name)
"""
EXACT = ("sample_weight.pt", "train_xy.pt", "mnist.pt", "plain_dict.pt")


def run_as(user: User, code: str, *args: str) -> subprocess.CompletedProcess:
    """`code` run by `user`'s own Python with argv[1:] = args."""
    return subprocess.run(["setpriv", f"--reuid={user.uid}", f"--regid={user.gid}", "--init-groups",
                           "--reset-env", PY, "-c", code, *args],
                          capture_output=True, text=True, timeout=300, cwd="/")


@pytest.mark.parametrize("policy", ["lossy", "lossy=aggressive"])
def test_lossy_policy_keeps_data_named_like_parameters_exact(shared_mount, shared_top, users, policy):
    atk, _ = users
    m = shared_mount
    home, ref = m.mnt / "atk", shared_top / "atk-ref"
    for d in (home, ref):
        d.mkdir()
        os.chown(d, atk.uid, atk.gid)
    res = atk.attempts({"own lossy dir": f"os.mkdir({str(home / 'run')!r}) or "
                                         f"os.setxattr({str(home / 'run')!r}, 'user.ckptfs.policy', {policy.encode()!r})"})
    assert res == {"own lossy dir": "OK"}, res
    p = run_as(atk, LOSSY_SAVES, str(home / "run"), str(ref))
    assert p.returncode == 0, describe(p, f"torch.save as {atk.name}")
    st = {e["path"].lstrip("/"): e for e in m.wait_sealed()["files"]}

    changed = []
    for name in EXACT:
        got, want = (home / "run" / name).read_bytes(), (ref / name).read_bytes()
        lossy = st[f"atk/run/{name}"]["lossy"]
        if got != want or lossy is not None:
            diff = sum(a != b for a, b in zip(got, want)) + abs(len(got) - len(want))
            changed.append(f"{name}: {diff} bytes differ, stats lossy={lossy}")
    assert not changed, f"under {policy}, data files were coded lossy:\n" + "\n".join(changed)

    # The control: the real checkpoint in the same directory is lossy.
    ctl = st["atk/run/checkpoint.pt"]["lossy"]
    assert ctl is not None and ctl["weights"]["elements"] == 2 * (256 * 256 + 256), ctl
    assert (home / "run" / "checkpoint.pt").read_bytes() != (ref / "checkpoint.pt").read_bytes()
