#!/usr/bin/env python3
"""Makes one golden store: mounts an empty backing dir with the ckptfs binary
of the commit that wrote that pack version, writes the inputs (inputs/)
through the mount in a fixed order, waiting for each file's seal, reads
everything back, unmounts, and copies the store into NAME/store next to
this script with NAME/manifest.json (what was done, what must read back,
which pack versions and chunk codecs each file got). Lossy files read back
as the old code reconstructed them: those bytes go to NAME/expected/.

    .venv-debian/bin/python tests/data/golden/make_store.py NAME COMMIT CKPTFS_BINARY

Run as root (FUSE). README.md says which commit made each store.
"""
import hashlib
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[1] / "integration"))
from golden_store import INPUTS, Pack, apply_steps, input_of, pack_path, stub_object  # noqa: E402

MOUNT_OPTIONS = ["chunk_size=8K"]
LOSSY_POLICY = "lossy=0.01"

# Each store holds everything its version could write. Every file is sealed
# before the next is written, so predecessors and dedup candidates are
# packs already (and a rerun makes the same choices).
BASE_STEPS = [
    ("write", "notes.txt"),                   # zstd
    ("write", "random.bin"),                  # raw
    ("write", "sparse.bin"),                  # a zero chunk between two others
    ("write", "empty.bin"),                   # no pack (object 0)
    ("write", "model.pt"),                    # torch zip: tensor chunks from v2 on
    ("write", "array.npy"),
    ("write", "weights.safetensors"),
    ("mkdir", "sub"),
    ("copy", "sub/copy.bin", "random.bin"),   # the same bytes again: refs from v3 on
    ("symlink", "link", "notes.txt"),
]
DELTA_STEPS = [("write", "step1.pt"), ("write", "step2.pt")]  # v3: deltas against the predecessor
LOSSY_STEPS = [
    ("mkdir", "lossy"),
    ("policy", "lossy", LOSSY_POLICY),
    ("write", "lossy/ckpt1.pt"),              # lossy keyframe chunks
    ("write", "lossy/ckpt2.pt"),              # lossy chunks against ckpt1's reconstruction
]
# v5: the next save of each lineage moved every tensor by 64 bytes (its
# pickle grew): its first chunk's base window starts before its predecessor.
MOVED_STEPS = [("write", "step3.pt")]
MOVED_LOSSY_STEPS = [("write", "lossy/ckpt3.pt")]
STEPS = {
    "v1": BASE_STEPS,
    "v2": BASE_STEPS,
    "v3": BASE_STEPS + DELTA_STEPS,
    "v4-lossy1": BASE_STEPS + DELTA_STEPS + LOSSY_STEPS,
    "v4": BASE_STEPS + DELTA_STEPS + LOSSY_STEPS,
    "v5": BASE_STEPS + DELTA_STEPS + MOVED_STEPS + LOSSY_STEPS + MOVED_LOSSY_STEPS,
    # Lossy piece version 2 inside pack version 5 (docs/FORMAT.md).
    "v5-piece2": BASE_STEPS + DELTA_STEPS + MOVED_STEPS + LOSSY_STEPS + MOVED_LOSSY_STEPS,
}
EXTRA_OPTIONS = {name: ["device=cpu", "seal_workers=1"] for name in ("v4-lossy1", "v4", "v5", "v5-piece2")}


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def run(*args, check=True):
    p = subprocess.run([str(a) for a in args], capture_output=True, text=True, timeout=600)
    if check and p.returncode != 0:
        raise SystemExit(f"{' '.join(map(str, args))}: exit {p.returncode}\n{p.stdout}\n{p.stderr}")
    return p


def pack_summary(backing: Path, obj: int) -> dict:
    pack = Pack(pack_path(backing, obj).read_bytes())
    return {"pack": f"{obj:016x}", "pack_version": pack.version, "codecs": pack.codecs()}


def read_back(mnt: Path, name: str, steps, out: Path) -> list:
    files = []
    for step in steps:
        if step[0] not in ("write", "copy"):
            continue
        rel = step[1]
        want = (INPUTS / input_of(step)).read_bytes()
        got = (mnt / rel).read_bytes()
        lossy = rel.startswith("lossy/")
        entry = {"path": rel, "size": len(got), "sha256": sha256(got), "lossy": lossy}
        if lossy:
            if got == want or len(got) != len(want):
                raise SystemExit(f"{rel}: expected a lossy reconstruction of the same size")
            exp = out / "expected" / rel
            exp.parent.mkdir(parents=True, exist_ok=True)
            exp.write_bytes(got)
            entry["expected"] = f"{name}/expected/{rel}"
        else:
            if got != want:
                raise SystemExit(f"{rel}: read back differs from its input")
            entry["expected"] = "inputs/" + input_of(step)
        files.append(entry)
    return files


def unmount(ckptfs, backing: Path, mnt: Path):
    pid = int((backing / "LOCK").read_text().split()[0])
    run(ckptfs, "umount", mnt)
    deadline = time.monotonic() + 60
    while Path(f"/proc/{pid}").exists():
        if time.monotonic() > deadline:
            raise SystemExit(f"daemon {pid} still running after umount")
        time.sleep(0.05)


def check_clean(backing: Path):
    for d in ("staging", "tmp"):
        left = list((backing / d).iterdir())
        if left:
            raise SystemExit(f"{d}/ not empty after a clean unmount: {left}")
    if (backing / "ckptfs.log").exists():
        raise SystemExit("ckptfs.log in the store although log= points elsewhere")


def main():
    name, commit, ckptfs = sys.argv[1], sys.argv[2], Path(sys.argv[3]).resolve()
    steps = STEPS[name]
    out = HERE / name
    if out.exists():
        shutil.rmtree(out)
    out.mkdir()
    work = Path(tempfile.mkdtemp(prefix=f"golden-{name}-"))
    backing, mnt = work / "backing", work / "mnt"
    backing.mkdir()
    mnt.mkdir()
    opts = MOUNT_OPTIONS + EXTRA_OPTIONS.get(name, [])
    run(ckptfs, "mount", "-o", ",".join(opts + [f"log={work / 'ckptfs.log'}"]), backing, mnt)
    try:
        apply_steps(ckptfs, mnt, steps)
        files = read_back(mnt, name, steps, out)
    finally:
        unmount(ckptfs, backing, mnt)
    check_clean(backing)
    fsck = run(ckptfs, "fsck", backing, check=False)
    if fsck.returncode != 0:
        raise SystemExit(f"fsck of the new store (old binary): {fsck.stdout}{fsck.stderr}")
    # LOCK is the serving daemon's flock file; a mount creates it again.
    (backing / "LOCK").unlink()
    for f in files:
        obj = stub_object(backing / "ns" / f["path"])
        f.update(pack_summary(backing, obj) if obj else {"pack": None, "pack_version": None, "codecs": []})
    shutil.copytree(backing, out / "store", symlinks=True)
    subject = run("git", "-C", HERE, "log", "-1", "--format=%s", commit).stdout.strip()
    manifest = {
        "name": name,
        "commit": run("git", "-C", HERE, "rev-parse", commit).stdout.strip(),
        "commit_subject": subject,
        "mount_options": opts,
        "steps": [list(s) for s in steps],
        "pack_versions": sorted({f["pack_version"] for f in files if f["pack_version"]}),
        "codecs": sorted({c for f in files for c in f["codecs"]}),
        "files": files,
        "symlinks": {s[1]: s[2] for s in steps if s[0] == "symlink"},
        "dirs": [s[1] for s in steps if s[0] == "mkdir"],
        "policies": {s[1]: s[2] for s in steps if s[0] == "policy"},
    }
    (out / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n")
    shutil.rmtree(work)
    print(f"{name}: pack versions {manifest['pack_versions']}, codecs {manifest['codecs']}")


if __name__ == "__main__":
    main()
