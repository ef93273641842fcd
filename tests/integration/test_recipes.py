"""The framework recipes of docs/RECIPES.md, run against a real mount with a
tiny model each: Hugging Face Transformers `Trainer` (save_steps,
save_total_limit, resume_from_checkpoint) fine-tuning the shipped
all-MiniLM-L6-v2, and PyTorch Lightning `ModelCheckpoint` (save_top_k,
every_n_epochs, save_last, fit(ckpt_path=...)), also in a directory under a
lossy policy.

Each runs a client script from tests/integration/clients/ in .venv-pypi, as
test_clients.py does (same two-phase protocol, clients/common.py), but phase
2 resumes training from the sealed checkpoints after a remount. DCP and
DeepSpeed-style per-rank files are covered by test_clients.py,
test_cluster.py and test_lossy.py (see docs/RECIPES.md).
"""
from __future__ import annotations

import json
import os
import subprocess

from helpers import sha256_file
from test_clients import ClientRun, check_inspect, inspect_json, pypi_python  # noqa: F401


def start_client(m, plain_dir, python, script: str, name: str, args=()) -> tuple[ClientRun, dict]:
    mnt_dir, ref_dir = m.mnt / name, plain_dir / name
    mnt_dir.mkdir(exist_ok=True)
    ref_dir.mkdir()
    run = ClientRun(python, script, mnt_dir, ref_dir, args)
    try:
        files = run.written()["files"]
    except BaseException:
        run.kill()
        raise
    assert files, run.describe("reported no files")
    return run, files


def check_files(mnt_dir, ref_dir, files: dict, only=None) -> None:
    """Bytes through the mount against the client's sha256 when written and
    the plain-directory copies."""
    for rel, info in sorted(files.items()):
        if only is not None and not only(rel):
            continue
        got = sha256_file(mnt_dir / rel)
        assert got == info["sha256"], f"{rel}: sha256 through the mount {got} != {info['sha256']} when written"
        if info["ref"]:
            assert sha256_file(ref_dir / rel) == got, f"{rel}: differs from the copy written to a plain directory"


def zstd3_size(data: bytes) -> int:
    return len(subprocess.run(["zstd", "-3", "-c"], input=data, capture_output=True, check=True).stdout)


def by_path(st: dict, prefix: str) -> dict:
    return {f["path"].lstrip("/")[len(prefix):]: f for f in st["files"] if f["path"].lstrip("/").startswith(prefix)}


def test_hf_trainer_rotation_and_resume(pypi_python, mount_factory, plain_dir):
    """Trainer(save_steps=1, save_total_limit=2) fine-tuning MiniLM for 3
    steps: the rotated checkpoint-1 is gone, the kept ones read back equal to
    copies written to a plain directory, ckptfs codes model.safetensors and
    optimizer.pt as tensors and each model.safetensors as a delta of an
    earlier one; then resume_from_checkpoint on the sealed checkpoint-2 loads its
    state bit for bit and repeats step 3 exactly."""
    m = mount_factory()
    mnt_dir, ref_dir = m.mnt / "hf", plain_dir / "hf"
    run, files = start_client(m, plain_dir, pypi_python, "hf_trainer.py", "hf")
    try:
        st = m.wait_sealed()
        stored = by_path(st, "hf/")
        assert sorted({p.split("/")[1] for p in stored}) == ["checkpoint-2", "checkpoint-3"], sorted(stored)
        assert sorted(os.listdir(ref_dir / "run")) == [f"checkpoint-{i}" for i in range(1, 4)]
        for rel, info in files.items():
            assert stored[rel]["logical"] == info["size"], (rel, stored[rel], info["size"])
        # what ckptfs made of the checkpoint files
        formats = {"model.safetensors": "safetensors", "optimizer.pt": "torch-zip", "scheduler.pt": "torch-zip",
                   "rng_state.pth": "torch-zip", "training_args.bin": "torch-zip"}
        problems = []
        for rel, info in sorted(files.items()):
            want = formats.get(os.path.basename(rel), "unknown")
            problems += check_inspect(rel, info, inspect_json(mnt_dir / rel), want)
        assert not problems, "ckptfs inspect:\n" + "\n".join(problems)
        # model.safetensors: a delta of an earlier one (the frozen layers cost nothing), checkpoint-2's of
        # checkpoint-1's, which, rotated away, stays in the store as its base (`kept_for_bases`);
        # checkpoint-3's of checkpoint-2's, or of the root of its chain, whichever codes smaller
        for ckpt, bases in (("checkpoint-2", ("(deleted file",)), ("checkpoint-3", ("(deleted file", "hf/run/"))):
            f = stored[f"run/{ckpt}/model.safetensors"]
            assert f["base"].startswith(bases) and f["depth"] >= 1 and f["ratio"] > 5, f
        assert st["total"]["kept_for_bases"] > 0, st["total"]
        # optimizer.pt: Adam's moments move too much in one step for a delta to pay, but the tensor
        # codec beats zstd on them
        for ckpt in ("checkpoint-2", "checkpoint-3"):
            rel = f"run/{ckpt}/optimizer.pt"
            zstd = zstd3_size((mnt_dir / rel).read_bytes())
            assert stored[rel]["stored"] < 0.97 * zstd, (stored[rel], zstd)
        m.remount()  # from here on every byte comes from the packs
        check_files(mnt_dir, ref_dir, files)
        assert run.verify() > 0, run.describe("compared nothing")
    finally:
        run.kill()
    m.wait_sealed()
    m.remount()
    # The resumed run wrote checkpoint-3 again: the same weights and optimizer state, byte for byte.
    check_files(mnt_dir, ref_dir, files,
                only=lambda rel: "checkpoint-2/" in rel or rel.endswith((".safetensors", "optimizer.pt")))


def read_losses(run: ClientRun) -> dict[str, float]:
    out = {}
    for line in run.lines:
        if line.startswith('{"phase": "loss"'):
            msg = json.loads(line)
            out[msg["run"]] = msg["loss"]
    return out


def run_lightning(m, plain_dir, python, name: str, mode: str, policy: str | None = None, sealed=None):
    """The Lightning client through both phases; returns its files, the
    stats of its sealed checkpoints and its losses. `sealed`, when given,
    is called with those stats once the first phase's files are sealed."""
    if policy is not None:
        (m.mnt / name).mkdir()
        os.setxattr(m.mnt / name, "user.ckptfs.policy", policy.encode())
    run, files = start_client(m, plain_dir, python, "lightning_ckpt.py", name, [mode])
    try:
        stored = by_path(m.wait_sealed(), f"{name}/")
        assert sorted(stored) == sorted(files), (sorted(stored), sorted(files))
        problems = []
        for rel, info in sorted(files.items()):
            problems += check_inspect(rel, info, inspect_json(m.mnt / name / rel), "torch-zip")
        assert not problems, "ckptfs inspect:\n" + "\n".join(problems)
        if sealed is not None:
            sealed(stored)
        m.remount()
        assert run.verify() > 0, run.describe("compared nothing")
    finally:
        run.kill()
    return files, stored, read_losses(run)


def test_lightning_model_checkpoint_and_resume(pypi_python, mount_factory, plain_dir):
    """ModelCheckpoint(save_top_k=2, every_n_epochs=1, save_last=True) over 3
    epochs: epoch 0's file is deleted, the kept ones and last.ckpt load bit
    for bit from the sealed store, fit(ckpt_path=epoch 1's) loads its state
    bit for bit and trains epoch 2 to the same weights and loss; the tensor
    codec beats zstd, and last.ckpt is stored as references to the top-k
    file of the same epoch (or that file to it)."""
    m = mount_factory()
    files, stored, losses = run_lightning(m, plain_dir, pypi_python, "lit", "lossless")
    assert losses["resumed"] == losses["first"], losses
    # Adam at lr=1e-3 moves every weight of so small a model too far in an epoch for a delta to pay,
    # but the tensor codec beats zstd; last.ckpt holds the same tensors as the top-k file beside it.
    for name in ("epoch=1-step=16.ckpt", "epoch=2-step=24.ckpt"):
        f = stored[f"checkpoints/{name}"]
        zstd = zstd3_size((m.mnt / "lit" / "checkpoints" / name).read_bytes())
        assert f["lossy"] is None and f["stored"] < 0.97 * zstd, (f, zstd)
    # (whichever of the two is sealed second refers to the other's chunks)
    pair = sorted((stored["checkpoints/last.ckpt"], stored["checkpoints/epoch=2-step=24.ckpt"]),
                  key=lambda f: f["stored"])
    assert pair[0]["base"] == pair[1]["path"].lstrip("/") and pair[0]["stored"] < 0.01 * pair[0]["logical"], pair
    m.remount()
    check_files(m.mnt / "lit", plain_dir / "lit", files, only=lambda rel: "step=16" in rel or "step=24.ckpt" in rel)


def test_lightning_in_a_lossy_directory(pypi_python, mount_factory, plain_dir):
    """The same run in a directory with user.ckptfs.policy=lossy=0.05: the
    checkpoints are lossy within their targets and load close to what was
    saved; resuming from one loads the reconstruction bit for bit and goes
    on for two epochs to a loss below that of the first run's last epoch.
    last.ckpt holds the same state as the epoch's top-k file: it reads back
    identical to it and is stored once (references to its pack), although
    each file's closed-loop coding would start from a different predecessor."""
    m = mount_factory()
    ckdir = m.mnt / "lit-lossy" / "checkpoints"

    def same_pair(stored, last="last.ckpt", twin="epoch=2-step=24.ckpt"):
        a, b = stored[f"checkpoints/{twin}"], stored[f"checkpoints/{last}"]
        print(f"stored bytes: {twin} {a['stored']}, {last} {b['stored']} (of {a['logical']})")
        assert sha256_file(ckdir / last) == sha256_file(ckdir / twin), (a, b)
        # whichever of the two is sealed second refers to the other's pack
        copy, first = sorted((a, b), key=lambda f: f["stored"])
        assert copy["stored"] < 0.01 * copy["logical"] < first["stored"], (a, b)
        assert copy["base"] == first["path"].lstrip("/") and copy["lossy"] == first["lossy"], (a, b)

    files, stored, losses = run_lightning(m, plain_dir, pypi_python, "lit-lossy", "lossy", policy="lossy=0.05",
                                          sealed=same_pair)
    for rel, f in stored.items():
        lossy = f["lossy"]
        assert lossy is not None and abs(lossy["fidelity"] - 0.05) < 1e-6, f
        for role in ("weights", "first_moments", "second_moments"):
            r = lossy[role]
            assert r["elements"] > 0 and r["max_error"] <= r["target"], (rel, role, r)
        assert f["stored"] < 0.5 * f["logical"], f
    # Each epoch's checkpoint is predicted from the one before (the lossy chunks are).
    assert stored["checkpoints/epoch=2-step=24.ckpt"]["depth"] >= 1, stored
    # The first run's last epoch (2) ended at a loss of about 1.10; resumed from epoch 1's lossy
    # checkpoint and trained through epoch 3, the run ends lower (about 0.85).
    assert losses["resumed"] < losses["first"] * 1.05, losses
    # the resumed run's last.ckpt and its last epoch's file: the same again
    same_pair(by_path(m.wait_sealed(), "lit-lossy/"), twin="epoch=3-step=32.ckpt")
