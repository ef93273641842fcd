"""The compute device (`-o device=auto|cpu|gpu`, `-o gpu_mem=SIZE`) and the
sealing workers (`-o seal_workers=N`) on a real FUSE mount.

Everywhere: the daemon logs which device it uses and why; device=gpu on a
machine without a usable GPU refuses to mount, saying why, and mounts
nothing. Several sealing workers store what one stores. With a GPU visible: checkpoints sealed on the GPU, lossless and
lossy, store exactly the bytes the CPU stores and read back the same. The
GPU tests skip, saying why, on machines without one.
"""
from __future__ import annotations

import io
import re
import sys

import pytest

from conftest import describe, is_mounted

try:
    import torch
except ImportError as e:  # a missing client is a collection error, never a silent skip
    raise ImportError(f"torch is not importable from {sys.executable}; run the tests with "
                      f".venv-debian/bin/python (see scripts/install-deps.sh): {e}")

DEVICE_LINE = re.compile(r"compute device: (\S+)(.*)")


def device_line(m) -> str:
    found = DEVICE_LINE.findall(m.log_text())
    assert found, f"no 'compute device:' line in the log:\n{m.log_text()[-2000:]}"
    return "".join(found[-1])


def gpu_or_skip(mount_factory):
    m = mount_factory(name="probe")
    line = device_line(m)
    m.umount()
    if not line.startswith("cuda:"):
        pytest.skip(f"no GPU: the daemon says '{line}'")


def checkpoint(seed: int) -> dict:
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(256, 1024), torch.nn.GELU(), torch.nn.Linear(1024, 256))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    for _ in range(3):
        x = torch.randn(32, 256)
        loss = (model(x) - x).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    return {"model": model.state_dict(), "optimizer": opt.state_dict(), "step": 3}


def stored_sizes(m) -> dict[str, int]:
    """What each file's own pack takes (packs also hold a seal time, so
    their bytes differ between two stores; the unit tests compare streams)."""
    return {e["path"].lstrip("/"): e["stored"] for e in m.wait_sealed()["files"]}


def test_device_choice_is_logged(mount_factory):
    m = mount_factory(opts=["device=cpu"])
    assert device_line(m) == "cpu (device=cpu)"
    m.remount(opts=["device=auto", "gpu_mem=64M"])
    line = device_line(m)
    assert line.startswith("cuda:") or line.startswith("cpu (device=auto, no usable GPU: "), line


@pytest.mark.parametrize("opt", ["device=tpu", "device=", "gpu_mem=1M", "gpu_mem=lots", "seal_workers=0",
                                 "seal_workers=many"])
def test_bad_device_options(mount_factory, opt):
    m = mount_factory(mount=False)
    m.fsck_at_teardown = False
    p = m.mount(opts=[opt], check=False)
    assert p.returncode != 0, describe(p, "mounted with a bad option")
    assert opt.split("=")[0] in (p.stdout + p.stderr), describe(p, "does not name the option")
    assert not is_mounted(m.mnt)


def test_device_gpu_without_one_refuses_to_mount(mount_factory):
    m = mount_factory(opts=["device=auto"])
    line = device_line(m)
    m.umount()
    if line.startswith("cuda:"):
        pytest.skip("a GPU is visible here: device=gpu mounts")
    p = m.mount(opts=["device=gpu"], check=False)
    assert p.returncode != 0, describe(p, "device=gpu mounted without a GPU")
    assert "device=gpu: no usable GPU" in (p.stdout + p.stderr), describe(p, "does not say why")
    assert not is_mounted(m.mnt)
    m.mount(opts=["device=cpu"])  # the store is untouched
    (m.mnt / "f").write_bytes(b"still fine")
    assert (m.mnt / "f").read_bytes() == b"still fine"


@pytest.mark.parametrize("mode", [[], ["lossy"]], ids=["lossless", "lossy"])
def test_gpu_stores_the_cpu_bytes(mount_factory, tmp_path, mode):
    gpu_or_skip(mount_factory)
    mounts = {d: mount_factory(name=d, opts=[f"device={d}", *mode]) for d in ("cpu", "gpu")}
    assert device_line(mounts["gpu"]).startswith("cuda:")
    ref = tmp_path / "ref.pt"
    written = {}
    for step in range(3):  # a lineage: later checkpoints are deltas
        torch.save(checkpoint(step), ref)
        written[step] = ref.read_bytes()
        for m in mounts.values():
            (m.mnt / f"step{step}.pt").write_bytes(written[step])
    assert stored_sizes(mounts["cpu"]) == stored_sizes(mounts["gpu"])
    for step in range(3):
        a = (mounts["cpu"].mnt / f"step{step}.pt").read_bytes()
        b = (mounts["gpu"].mnt / f"step{step}.pt").read_bytes()
        assert a == b, f"step{step}: GPU-sealed file reads back differently"
        if not mode:
            assert b == written[step]
    # GPU-encoded packs decode with the CPU alone.
    g = mounts["gpu"]
    g.remount(opts=["device=cpu", *mode])
    for step in range(3):
        assert (g.mnt / f"step{step}.pt").read_bytes() == (mounts["cpu"].mnt / f"step{step}.pt").read_bytes()
    assert g.fsck().returncode == 0


@pytest.mark.parametrize("mode", [[], ["lossy"]], ids=["lossless", "lossy"])
def test_seal_workers_store_what_one_worker_stores(mount_factory, tmp_path, mode):
    """Lossy too: torch's zip CRCs are learnt in order, then chunks are coded
    by all workers, and the reconstruction is the same bytes."""
    mounts = {n: mount_factory(name=f"w{n}", opts=[f"seal_workers={n}", "chunk_size=256K", "device=cpu", *mode])
              for n in (1, 3)}
    assert "1 worker(s) per file" in mounts[1].log_text()
    assert "3 worker(s) per file" in mounts[3].log_text()
    ref = tmp_path / "ref.pt"
    written = {}
    for step in range(3):
        torch.save(checkpoint(step), ref)
        written[step] = ref.read_bytes()
        for m in mounts.values():
            (m.mnt / f"step{step}.pt").write_bytes(written[step])
            m.wait_sealed()  # the next one is a delta against it
    sizes = {n: stored_sizes(m) for n, m in mounts.items()}
    assert sizes[1] == sizes[3]
    reads = {n: [(m.mnt / f"step{s}.pt").read_bytes() for s in range(3)] for n, m in mounts.items()}
    assert reads[1] == reads[3]
    if mode:
        assert reads[1] != [written[s] for s in range(3)], "lossy mode changed nothing"
        torch.load(io.BytesIO(reads[3][2]))  # a valid checkpoint: CRCs patched
    else:
        assert reads[3] == [written[s] for s in range(3)]
    for m in mounts.values():
        m.remount(opts=["seal_workers=2", *mode])
        assert (m.mnt / "step2.pt").read_bytes() == reads[1][2]
        assert m.fsck().returncode == 0
