"""The Python package `ckptfs` (python/) against a real mount: is_mounted,
stats (the usage attributes, checked against `ckptfs stats --json`),
set_policy / get_policy, wait_sealed, report; clear errors for paths that
are not on a ckptfs mount; `pip install ./python` into a scratch venv; and
the demo (demo/train_demo.py), shortened.

The API runs in this process (PYTHONPATH=python, Debian's torch and
matplotlib); the installed package runs in a scratch venv on .venv-pypi's
packages (torch 2.x, matplotlib from PyPI).
"""
from __future__ import annotations

import errno
import json
import os
import re
import shutil
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from conftest import CKPTFS, ROOT, describe, run_ckptfs
from test_clients import pypi_python  # noqa: F401  (fixture)

sys.path.insert(0, str(ROOT / "python"))
import ckptfs  # noqa: E402

try:
    import torch
except ImportError as e:  # a missing client is a collection error, never a silent skip
    raise ImportError(f"torch is not importable from {sys.executable}; run the tests with "
                      f".venv-debian/bin/python (see scripts/install-deps.sh): {e}")



def save_series(directory: Path, n: int, hidden: int = 96, seed: int = 0, lr: float = 1e-3) -> list[str]:
    """n torch.save checkpoints (model + AdamW state) of one training run,
    5 steps apart. Small steps (lr=1e-5) make lossless deltas pay off."""
    directory.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(8, hidden), torch.nn.Tanh(), torch.nn.Linear(hidden, hidden),
                                torch.nn.Tanh(), torch.nn.Linear(hidden, 1))
    opt = torch.optim.AdamW(model.parameters(), lr=lr)
    names = []
    for k in range(n):
        for _ in range(5):
            x = torch.randn(32, 8)
            loss = (model(x) - x.sum(1, keepdim=True)).pow(2).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
        name = f"ckpt-{k:02d}.pt"
        torch.save({"model": model.state_dict(), "optim": opt.state_dict(), "step": k}, directory / name)
        names.append(name)
    return names


def cli_stats(path) -> dict:
    p = run_ckptfs("stats", "--json", path)
    assert p.returncode == 0, describe(p)
    return json.loads(p.stdout)


def check_against_cli(st: ckptfs.Stats, cli: dict) -> None:
    """Every number stats() gives is the CLI's for the same file."""
    by_path = {f["path"]: f for f in cli["files"]}
    assert sorted(by_path) == [f.relpath for f in st.files]
    for f in st.files:
        c = by_path[f.relpath]
        assert (f.logical, f.stored, f.depth, not f.sealed) == (c["logical"], c["stored"], c["depth"],
                                                                c["staged"]), (f, c)
        if c["base"].startswith("(deleted file, pack "):  # the CLI names only bases among the files it shows
            assert f.base_pack == c["base"][len("(deleted file, pack "):-1], (f, c)
        else:
            assert (f.base or "") == c["base"], (f, c)
        assert f.ratio == pytest.approx(c["ratio"], rel=1e-6, abs=1e-9)
        if c["lossy"] is None:
            assert f.lossy is None, f
            continue
        assert f.lossy is not None and f.lossy.fidelity == pytest.approx(c["lossy"]["fidelity"], rel=1e-5)
        assert (f.lossy.scope, f.lossy.sensitivity) == (c["lossy"]["scope"], c["lossy"]["sensitivity"])
        roles = {r for r in ckptfs._stats.ROLES if c["lossy"][r]["elements"] > 0}
        assert set(f.lossy.roles) == roles, (f, c)
        for r in roles:
            assert f.lossy.roles[r].error == pytest.approx(c["lossy"][r]["max_error"], rel=1e-5)
            assert f.lossy.roles[r].target == pytest.approx(c["lossy"][r]["target"], rel=1e-5)
    assert st.logical == sum(c["logical"] for c in cli["files"])
    assert st.stored - (st.kept_for_bases or 0) == sum(c["stored"] for c in cli["files"])


def check_report(path: Path, files) -> str:
    text = path.read_text()
    assert text.startswith("<!DOCTYPE html>") and text.rstrip().endswith("</html>")
    # Self-contained: nothing is loaded from anywhere else.
    assert not re.search(r"""(src|href)\s*=\s*["']?(https?:|//|file:)""", text, re.I), "external resource"
    assert "<script" not in text.lower() and "<link" not in text.lower()
    images = re.findall(r"""<img [^>]*src=['"]([^'"]+)['"]""", text)
    assert len(images) >= 3 and all(s.startswith("data:image/png;base64,") for s in images), images[:1]
    for f in files:
        assert f in text, f"report does not mention {f}"
    return text


def test_api_on_lossless_and_lossy_series(mount_factory, tmp_path, monkeypatch):
    m = mount_factory(opts=["chunk_size=64K"])
    run = m.mnt / "run"
    lossy_dir = run / "lossy"
    lossy_dir.mkdir(parents=True)
    assert ckptfs.is_mounted(m.mnt) and ckptfs.is_mounted(run)
    info = ckptfs.mount_of(run)
    assert (info.mountpoint, info.source, info.fstype) == (str(m.mnt), str(m.backing), "fuse.ckptfs")

    p = ckptfs.set_policy(lossy_dir, lossy=0.05)
    assert (p.fidelity, p.scope, p.explicit, p.text) == (0.05, "models", True, "lossy=0.05")
    assert os.getxattr(lossy_dir, "user.ckptfs.policy") == b"lossy=0.05"
    assert ckptfs.get_policy(run) == ckptfs.Policy(0.0)

    # Two runs (identical bytes would be stored once); chunks of 64 KiB, so
    # that deltas are chosen per tensor group rather than per 130 KiB file.
    names = save_series(run / "lossless", 4, seed=0, lr=1e-5)
    save_series(lossy_dir, 4, seed=1)
    st = ckptfs.wait_sealed(run, timeout=120)
    assert not st.staged and len(st) == 8 and st.source == "xattr"
    check_against_cli(st, cli_stats(run))
    check_against_cli(ckptfs.stats(m.mnt), cli_stats(m.mnt))
    check_against_cli(ckptfs.stats(run / "lossy" / names[2]), cli_stats(run / "lossy" / names[2]))

    # The CLI path gives the same numbers (it cannot give codecs and pack ids).
    monkeypatch.setenv("PATH", "/nonexistent")
    monkeypatch.delenv("CKPTFS_BIN", raising=False)
    with pytest.raises(RuntimeError, match="needs the ckptfs binary on PATH or in \\$CKPTFS_BIN"):
        ckptfs.stats(run, via="cli")
    monkeypatch.setenv("CKPTFS_BIN", str(CKPTFS))
    via_cli = ckptfs.stats(run, via="cli")
    assert via_cli.source == "cli"
    for a, b in zip(st.files, via_cli.files):
        assert (a.relpath, a.logical, a.stored, a.depth, a.base) == (b.relpath, b.logical, b.stored, b.depth, b.base)
        assert (a.lossy is None) == (b.lossy is None) and a.codecs and b.codecs is None
        if a.lossy:
            assert a.lossy.fidelity == pytest.approx(b.lossy.fidelity) and set(a.lossy.roles) == set(b.lossy.roles)

    for i, name in enumerate(names):
        exact, lossy = st.file(f"run/lossless/{name}"), st.file(f"run/lossy/{name}")
        assert exact.lossy is None and exact.sealed and exact.pack and re.fullmatch(r"[0-9a-f]{16}", exact.pack)
        assert exact.logical == os.path.getsize(exact.path) and exact.ratio > 1
        assert sum(c.raw for c in exact.codecs) == exact.logical
        assert lossy.lossy is not None and lossy.lossy.fidelity == pytest.approx(0.05)
        assert set(lossy.lossy.roles) == {"weights", "first_moments", "second_moments"}
        for r in lossy.lossy.roles.values():
            assert 0 <= r.error <= r.target * 1.0001, r
        assert lossy.stored < exact.stored
        # A checkpoint is stored on its own or against an earlier file of the
        # same layout (lineage goes by tensors, not names: the other run's too).
        for f in (exact, lossy):
            if f.base is None:
                assert f.depth == 0 and f.base_pack is None, f
            else:
                base = st.file(f.base)
                assert base.mtime <= f.mtime and f.depth >= 1 and base.pack == f.base_pack, (f, base)
        if exact.base:
            assert "delta" in [c.codec for c in exact.codecs], exact.codecs
    assert st.file(f"run/lossless/{names[0]}").codec == "tensor"
    # Small steps: some lossless checkpoints are deltas; lossy ones are coded against their predecessor.
    assert [f for f in st.files if f.base and "lossless" in f.relpath], st.files
    assert all(st.file(f"run/lossy/{n}").base for n in names[1:]), st.files

    out = ckptfs.report(run, tmp_path / "report.html", stats=st)
    text = check_report(Path(out), [f.relpath for f in st.files])
    assert "Lossy error per role" in text and "Delta chain" in text
    # Without stats= it reads them itself; a single lossless file works too.
    check_report(Path(ckptfs.report(run / "lossless" / names[0], tmp_path / "one.html")), [f"lossless/{names[0]}"])


def test_policy_forms_and_inheritance(mount_factory):
    m = mount_factory(opts=["lossy=0.02"])
    top, sub = m.mnt / "a", m.mnt / "a" / "b"
    sub.mkdir(parents=True)
    assert ckptfs.get_policy(m.mnt) == ckptfs.Policy(0.02)  # the mount's option
    assert ckptfs.get_policy(sub) == ckptfs.Policy(0.02)
    assert ckptfs.set_policy(top, lossy=False) == ckptfs.Policy(0.0, explicit=True)
    assert ckptfs.get_policy(sub) == ckptfs.Policy(0.0)  # inherited from a/
    assert ckptfs.set_policy(sub, lossy=True) == ckptfs.Policy(0.01, explicit=True)
    assert ckptfs.set_policy(sub, "lossy=0.1,scope=all").text == "lossy=0.1,scope=all"
    assert ckptfs.set_policy(sub, 0.25, scope="all") == ckptfs.Policy(0.25, "all", explicit=True)
    assert ckptfs.set_policy(sub, "lossless").text == "lossless"
    assert ckptfs.clear_policy(sub) == ckptfs.Policy(0.0)
    assert ckptfs.clear_policy(top) == ckptfs.Policy(0.02)
    assert ckptfs.clear_policy(top) == ckptfs.Policy(0.02)  # nothing to remove is fine

    # A file sealed under the inherited policy says so in its stats.
    ckptfs.set_policy(top, lossy=0.04)
    save_series(sub, 1)
    (f,) = ckptfs.wait_sealed(sub).files
    assert f.lossy is not None and f.lossy.fidelity == pytest.approx(0.04)
    assert os.getxattr(f.path, "user.ckptfs.effective_policy") == b"lossy=0.04"

    for bad in (0.0, 0.7, -1, float("nan"), "lossy=2", "bogus", "lossless,scope=all"):
        with pytest.raises(ValueError):
            ckptfs.set_policy(sub, bad)
    with pytest.raises(ValueError, match="scope"):
        ckptfs.set_policy(sub, 0.1, scope="everything")
    with pytest.raises(TypeError):
        ckptfs.set_policy(sub, [0.1])
    with pytest.raises(NotADirectoryError):
        ckptfs.set_policy(f.path, 0.1)
    assert ckptfs.get_policy(sub) == ckptfs.Policy(0.04)  # nothing bad was set


def test_usage_attributes_are_read_only_and_unlisted(mount_factory):
    m = mount_factory()
    f = m.mnt / "x.bin"
    f.write_bytes(b"\1" * 100_000)
    st = ckptfs.wait_sealed(f)
    assert st.files[0].codecs and st.files[0].stored < 100_000
    names = ["state", "logical", "stored", "depth", "pack", "codecs", "effective_policy"]
    for n in names:
        assert os.getxattr(f, f"user.ckptfs.{n}"), n
        for call in (lambda: os.setxattr(f, f"user.ckptfs.{n}", b"1"),
                     lambda: os.removexattr(f, f"user.ckptfs.{n}")):
            with pytest.raises(OSError) as e:
                call()
            assert e.value.errno == errno.EPERM, n
    assert not [x for x in os.listxattr(f) if x.startswith("user.ckptfs.")]
    with pytest.raises(OSError) as e:
        os.getxattr(f, "user.ckptfs.base")  # stored on its own
    assert e.value.errno == errno.ENODATA
    with pytest.raises(OSError) as e:
        os.getxattr(m.mnt, "user.ckptfs.state")  # directories have no usage
    assert e.value.errno == errno.ENODATA
    # Other user.* attributes still work as before.
    os.setxattr(f, "user.note", b"hi")
    assert os.getxattr(f, "user.note") == b"hi"


def test_wait_sealed_waits_for_a_file_being_written(mount_factory):
    m = mount_factory()
    path = m.mnt / "open.bin"
    fh = open(path, "wb")
    try:
        fh.write(os.urandom(1 << 20))
        fh.flush()
        assert ckptfs.stats(path).files[0].state == "staged"
        with pytest.raises(TimeoutError, match="open.bin"):
            ckptfs.wait_sealed(m.mnt, timeout=0.5)
        closer = threading.Timer(0.5, fh.close)
        closer.start()
        st = ckptfs.wait_sealed(m.mnt, timeout=60)
        closer.join()
    finally:
        fh.close()
    assert st.files[0].sealed and st.files[0].logical == 1 << 20


def test_paths_not_on_ckptfs_fail_clearly(mount_factory, tmp_path):
    plain = tmp_path / "plain"
    plain.mkdir()
    assert not ckptfs.is_mounted(plain)
    assert not ckptfs.is_mounted(tmp_path / "missing")
    for call in (ckptfs.stats, ckptfs.wait_sealed, ckptfs.get_policy, ckptfs.clear_policy,
                 lambda p: ckptfs.set_policy(p, 0.05), lambda p: ckptfs.report(p, tmp_path / "r.html")):
        with pytest.raises(ckptfs.NotOnCkptfsError, match=r"plain is not inside a ckptfs mount \(its file system "
                                                          r"is \S+ mounted on "):
            call(plain)
    with pytest.raises(FileNotFoundError):
        ckptfs.stats(tmp_path / "missing")
    assert not (tmp_path / "r.html").exists()
    # A dead mount is still recognised as one, and fails as the kernel says.
    m = mount_factory()
    (m.mnt / "f").write_bytes(b"x")
    m.kill9()
    assert ckptfs.is_mounted(m.mnt)
    with pytest.raises(OSError) as e:
        ckptfs.stats(m.mnt)
    assert e.value.errno == errno.ENOTCONN
    with pytest.raises(ValueError, match="via"):
        ckptfs.stats(plain, via="nfs")


INSTALLED_CLIENT = r"""
import json, os, sys, torch, ckptfs
run = sys.argv[1]
assert ckptfs.is_mounted(run)
os.makedirs(os.path.join(run, "lossy"))
ckptfs.set_policy(os.path.join(run, "lossy"), lossy=0.05)
torch.manual_seed(1)
model = torch.nn.Linear(64, 64)
opt = torch.optim.Adam(model.parameters(), lr=1e-2)
for k in range(3):
    model(torch.randn(4, 64)).sum().backward()
    opt.step()
    for d in ("", "lossy"):
        torch.save({"model": model.state_dict(), "optim": opt.state_dict()}, os.path.join(run, d, f"s{k}.pt"))
st = ckptfs.wait_sealed(run, timeout=120)
out = ckptfs.report(run, sys.argv[2])
print(json.dumps({"module": ckptfs.__file__, "version": ckptfs.__version__, "torch": torch.__version__,
                  "files": {f.relpath: [f.logical, f.stored, f.depth, f.base or "",
                                        f.lossy.fidelity if f.lossy else None] for f in st}}))
"""


def test_pip_install_into_a_scratch_venv(mount_factory, tmp_path, pypi_python):  # noqa: F811
    python = pypi_python
    # `pip install ./python`, from a copy (pip builds in the source tree),
    # with CMakeLists.txt beside it: setup.py reads the version there.
    src = tmp_path / "src"
    shutil.copytree(ROOT / "python", src / "python", ignore=shutil.ignore_patterns("build", "*.egg-info",
                                                                                   "__pycache__"))
    shutil.copy(ROOT / "CMakeLists.txt", src / "CMakeLists.txt")
    venv = tmp_path / "venv"
    subprocess.run(["/usr/bin/python3", "-m", "venv", venv], check=True)
    # The scratch venv also sees .venv-pypi's packages (torch 2.x,
    # matplotlib) through a .pth, the way --system-site-packages would show
    # the system's; its own pip and setuptools come first.
    site = subprocess.run([venv / "bin/python", "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
                          capture_output=True, text=True, check=True).stdout.strip()
    pypi_site = subprocess.run([python, "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
                               capture_output=True, text=True, check=True).stdout.strip()
    Path(site, "ckptfs-test-pypi.pth").write_text(pypi_site + "\n")
    # Offline: the build backend is the venv's setuptools, not a download.
    p = subprocess.run([venv / "bin/python", "-m", "pip", "install", "-q", "--disable-pip-version-check",
                        "--no-index", "--no-build-isolation", "./python"], capture_output=True, text=True, cwd=src)
    assert p.returncode == 0, p.stdout + p.stderr
    assert Path(site, "ckptfs", "py.typed").exists()

    m = mount_factory()
    run, out = m.mnt / "run", tmp_path / "installed.html"
    run.mkdir()
    p = subprocess.run([venv / "bin/python", "-c", INSTALLED_CLIENT, run, out], capture_output=True, text=True,
                       cwd=tmp_path, timeout=300)
    assert p.returncode == 0, p.stdout + p.stderr
    got = json.loads(p.stdout.strip().splitlines()[-1])
    assert got["module"].startswith(site), got["module"]  # the installed copy, not python/
    cmake = re.search(r"project\(ckptfs VERSION ([0-9.]+)", (ROOT / "CMakeLists.txt").read_text()).group(1)
    assert got["version"] == cmake and got["torch"].split(".")[0] == "2"
    cli = {f["path"]: f for f in cli_stats(run)["files"]}
    assert sorted(got["files"]) == sorted(cli) and len(cli) == 6
    for path, (logical, stored, depth, base, fidelity) in got["files"].items():
        c = cli[path]
        assert [logical, stored, depth, base] == [c["logical"], c["stored"], c["depth"], c["base"]], path
        assert (fidelity is None) == (c["lossy"] is None) == ("lossy" not in path), path
    check_report(out, list(got["files"]))


def test_demo_trains_saves_restores_and_reports(mount_factory, tmp_path):
    m = mount_factory()
    out = tmp_path / "demo.html"
    p = subprocess.run([sys.executable, ROOT / "demo" / "train_demo.py", "--dir", m.mnt, "--checkpoints", "3",
                        "--first-save", "10", "--steps-between", "10", "--hidden", "64", "--report", out],
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stdout + p.stderr
    lines = p.stdout.splitlines()
    rows = [ln for ln in lines if ln.startswith("ckpt-step")]
    assert [r.split()[0] for r in rows] == ["ckpt-step00010.pt", "ckpt-step00020.pt", "ckpt-step00030.pt"]
    assert "on its own" in rows[0].split("|")[2] and "delta vs step000" in rows[1].split("|")[2], rows
    assert any(ln.startswith("total") for ln in lines)
    assert re.search(r"final eval loss, restored +\| +[0-9.]+ \(bit for bit\) +\| +[0-9.]+ \(weights within "
                     r"[0-9.]+ relative L2\)", p.stdout), p.stdout
    st = ckptfs.stats(m.mnt / "demo-run")
    assert len(st.lossy) == 3 and len(st) == 6
    check_report(out, [f.relpath for f in st.files])
