"""Issue 20's acceptance: a JAX + optax training run saving 10 checkpoints
with orbax-checkpoint's CheckpointManager through a ckptfs mount, stored at
>= 20x in total under lossy=0.05.

  .venv-pypi/bin/python bench/bench_orbax_series.py [--steps 10] [--width 1024] [--opts lossy=0.05] [--compress]
      [--keep DIR]

Runs tests/integration/clients/orbax_series.py (a Flax MLP 128 -> W -> W ->
10 trained with optax Adam, 3 updates between saves; arrays saved
uncompressed unless --compress) against a fresh store, letting each save
seal before the next, and prints logical bytes, stored bytes and their
ratio for the whole series, the OCDBT data files alone and each step; then
restores every step through a remounted store and checks the arrays are
within the lossy tolerance (or bit-exact) and that training goes on.
"""
import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile

import _common as C

CLIENT = os.path.join(C.ROOT, "tests", "integration", "clients", "orbax_series.py")
PY = os.path.join(C.ROOT, ".venv-pypi", "bin", "python")


def save(mnt, ref, a):
    extra = ["--steps", str(a.steps), "--width", str(a.width)] + (["--compress"] if a.compress else [])
    p = subprocess.Popen([PY, CLIENT, "save", mnt, ref, *extra], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                         text=True)
    while (line := p.stdout.readline()).startswith("saved "):
        C.wait_sealed(mnt)
        p.stdin.write("\n")
        p.stdin.flush()
    p.wait()
    if p.returncode != 0:
        sys.exit(f"orbax_series.py save failed ({p.returncode})")
    return json.loads(line)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--width", type=int, default=1024)
    ap.add_argument("--opts", default="lossy=0.05")
    ap.add_argument("--compress", action="store_true", help="Orbax's default zstd chunks instead of raw ones")
    ap.add_argument("--keep", metavar="DIR", help="work in DIR (must not exist) and keep the store and its log there")
    a = ap.parse_args()
    C.check_binary()
    work = a.keep or tempfile.mkdtemp(prefix="orbax-series-")
    if a.keep:
        os.makedirs(work)
    backing, mnt, ref = (os.path.join(work, d) for d in ("backing", "mnt", "ref"))
    os.makedirs(ref)
    opts = [o for o in a.opts.split(",") if o]
    C.mount(backing, mnt, opts)
    try:
        saved = save(mnt, ref, a)
        st, _ = C.wait_sealed(mnt)
        files = [f for f in st["files"] if f.get("logical")]
        logical = sum(f["logical"] for f in files)
        stored = sum(f["stored"] for f in files)
        data = set(saved["data_files"])  # stats paths are relative to the mount
        dl = sum(f["logical"] for f in files if f["path"] in data)
        ds = sum(f["stored"] for f in files if f["path"] in data)
        per_step = {}
        for f in files:
            step = f["path"].lstrip("/").split("/")[0]
            s = per_step.setdefault(step, [0, 0])
            s[0] += f["logical"]
            s[1] += f["stored"]
        print(f"mount -o {','.join(opts) or '(lossless)'}; {a.steps} steps, width {a.width}, "
              f"chunks {'zstd (Orbax default)' if a.compress else 'uncompressed'}")
        print(C.md_table(["step", "logical", "stored", "ratio"],
                         [[k, C.human(v[0]), C.human(v[1]), f"{v[0] / max(v[1], 1):.1f}x"]
                          for k, v in sorted(per_step.items(), key=lambda kv: int(kv[0]) if kv[0].isdigit() else 0)]))
        print(f"\ndata files: {C.human(dl)} -> {C.human(ds)} ({dl / max(ds, 1):.1f}x)")
        print(f"all files:  {C.human(logical)} -> {C.human(stored)} ({logical / max(stored, 1):.1f}x)")
        C.umount(mnt, backing)
        C.mount(backing, mnt, opts)
        level = next((o.split("=", 1)[1] for o in opts if o.startswith("lossy=")), None)
        fidelity = float(level) if level and level.replace(".", "", 1).isdigit() else (0.05 if level else None)
        # The policy bounds the v-weighted error of the weights by F; their
        # plain relative L2 error may be larger (as test_orbax_lossy_mount_restores_and_trains_on).
        tol = None if fidelity is None else 5 * fidelity
        r = subprocess.run([PY, CLIENT, "restore", mnt, ref, "--width", str(a.width)] +
                           (["--lossy", str(tol)] if tol else []), capture_output=True, text=True)
        if r.returncode != 0:
            sys.exit(f"restore failed:\n{r.stdout[-2000:]}\n{r.stderr[-3000:]}")
        print("restore:", r.stdout.strip().splitlines()[-1])
        C.write_json("orbax_series", {"opts": opts, "steps": a.steps, "width": a.width, "compress": a.compress,
                                      "logical": logical, "stored": stored, "data_logical": dl, "data_stored": ds,
                                      "restore": json.loads(r.stdout.strip().splitlines()[-1])})
        ok = logical / max(stored, 1) >= 20
        print(f"{'PASS' if ok else 'FAIL'}  total stored ratio >= 20x: {logical / max(stored, 1):.1f}x")
    finally:
        C.umount(mnt, backing)
        if not a.keep:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
