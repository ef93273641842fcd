#!/usr/bin/env python3
"""Sealing speed, per core, lossless and lossy: writes a checkpoint and its
successor into a fresh mount per (binary, worker count, mode), waits for
each seal, and reports MB/s per core two ways (and the daemon's peak RSS):

  - per CPU second: file bytes / the daemon's CPU time (user + system, from
    /proc/PID/stat) spent while the file sealed. What a core sustains; it
    holds on a busy machine, where wall time does not. Also per user CPU
    second alone: on a VM whose host backs guest memory lazily, the system
    part (page-cache copies of the pack write, the staging file freed)
    swings several-fold from run to run with the host, not the code.
  - per worker: file bytes / (seal wall time from the daemon's debug log x
    seal_workers).

Workloads: `torch` (default), an fp32 `torch.save` of a model (a stack of
1024x1024 linear layers; `--width` sets another width) with its AdamW
state after 2 steps, and its successor one step later; `npy`, a `.npy` of
N(0, 0.02) weights and a successor with a third of them moved. Modes: lossless, and each `--lossy`
fidelity. Each seal's stored size is reported; lossy files also give the
largest error the encoder measured per role (the file's
user.ckptfs.lossy.error.* attributes). With `--baseline BIN` an older
ckptfs binary runs the same files in the same run, interleaved, and the
table shows both, and says whether the new binary reads back the same
bytes as the old one (a lossy coding change need not). Checks that every
worker count stores the same sizes and reads back the same bytes (the file
as written for lossless, one reconstruction for lossy). Exit status 1 when
a check fails.

  .venv-debian/bin/python bench/bench_seal.py [--mib 256] [--width 1024] [--workers 1,2]
        [--workload torch|npy] [--lossy 0.05] [--baseline /tmp/ckptfs-main]
"""
import argparse
import os
import re
import shutil
import subprocess
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _common as C  # noqa: E402

SEAL_LINE = re.compile(r"publishing pack \w+: (\d+) bytes stored in (\d+) \(([\d.]+)x\), ([\d.]+) s with (\d+) worker")
ROLES = ("weights", "first_moments", "second_moments")

TORCH_SCRIPT = r'''
import sys, torch
torch.manual_seed(0)
mib, out, d = int(sys.argv[1]), sys.argv[2], int(sys.argv[3])
layers = max(1, mib * (1 << 20) // (12 * (d * d + d)))
model = torch.nn.Sequential(*[torch.nn.Linear(d, d) for _ in range(layers)])
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
for step in range(3):
    loss = model(torch.randn(64, d)).pow(2).mean()
    opt.zero_grad(); loss.backward(); opt.step()
    if step >= 1:
        torch.save({"model": model.state_dict(), "optimizer": opt.state_dict()}, f"{out}/step{step - 1}.pt")
'''


def torch_checkpoints(mib: int, work: str, width: int = 1024) -> list[str]:
    subprocess.run([sys.executable, "-c", TORCH_SCRIPT, str(mib), work, str(width)], check=True)
    return [os.path.join(work, f"step{i}.pt") for i in range(2)]


def npy_checkpoints(mib: int, work: str, width: int = 0) -> list[str]:
    rng = np.random.default_rng(0)
    w = (rng.standard_normal(mib * (1 << 20) // 4, dtype=np.float32) * 0.02)
    paths = []
    for step in range(2):
        if step:
            w[::3] += rng.standard_normal(w[::3].shape, dtype=np.float32) * 1e-4
        p = os.path.join(work, f"step{step}.npy")
        np.save(p, w)
        paths.append(p)
    return paths


def cpu_times(pid: int) -> tuple[float, float]:
    """User and system CPU seconds of the process so far."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return int(fields[11]) / os.sysconf("SC_CLK_TCK"), int(fields[12]) / os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    return sum(cpu_times(pid))


def lossy_errors(path: str) -> dict:
    out = {}
    for role in ROLES:
        try:
            out[role] = float(os.getxattr(path, f"user.ckptfs.lossy.error.{role}"))
        except OSError:
            pass
    return out


def peak_rss_mib(pid: int) -> float:
    """The daemon's peak resident set so far (VmHWM), MiB."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    return 0.0


def seal_run(binary, files, work, tag, workers, opts):
    """Seals `files` in order in a fresh mount; returns one dict per file
    (each with the daemon's peak RSS once that file is sealed)."""
    C.CKPTFS = binary
    backing, mnt = os.path.join(work, f"b-{tag}"), os.path.join(work, f"m-{tag}")
    C.mount(backing, mnt, [f"seal_workers={workers}", "device=cpu", "log_level=debug", *opts])
    out = []
    try:
        pid = C.daemon_pid(backing)
        for f in files:
            dst = os.path.join(mnt, os.path.basename(f))
            shutil.copyfile(f, dst)
            u0, s0 = cpu_times(pid)
            C.wait_file_sealed(dst)  # the successor is a delta against it
            u1, s1 = cpu_times(pid)
            out.append({"cpu": u1 - u0 + s1 - s0, "user": u1 - u0, "errors": lossy_errors(dst),
                        "rss": peak_rss_mib(pid), "sha": C.sha256_file(dst)})
    finally:
        C.umount(mnt, backing)
    seals = SEAL_LINE.findall(open(os.path.join(backing, "ckptfs.log")).read())
    shutil.rmtree(backing, ignore_errors=True)
    for o, s in zip(out, seals):
        o.update(size=int(s[0]), stored=int(s[1]), wall=float(s[3]))
    return out


def cell(r: dict, workers: int) -> str:
    mb = r["size"] / 1e6
    text = (f"{mb / r['cpu']:.0f} (user {mb / max(r['user'], 1e-3):.0f}) / {mb / (r['wall'] * workers):.0f} MB/s, "
            f"{r['stored'] / 1e6:.2f} MB, peak RSS {r['rss']:.0f} MiB")
    if r["errors"]:
        text += " (" + " ".join(f"{r['errors'][k]:.4f}" for k in ROLES if k in r["errors"]) + ")"
    return text


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mib", type=int, default=256, help="checkpoint size")
    ap.add_argument("--workload", choices=("torch", "npy"), default="torch")
    ap.add_argument("--width", type=int, default=1024,
                    help="torch: the layers' width (at 4 GB, 1024 gives 341 layers, whose optimizer state is "
                         "mostly untouched by gradients; 4096 gives 21, as deep as 256 MiB at 1024)")
    ap.add_argument("--workers", default="1,2")
    ap.add_argument("--lossy", default="0.05", help="comma-separated fidelities ('' for lossless only)")
    ap.add_argument("--rounds", type=int, default=1, help="rounds; each cell keeps its fastest (CPU) round")
    ap.add_argument("--baseline", help="an older ckptfs binary, run on the same files in the same run")
    ap.add_argument("-o", "--mount-options", default="", help="extra ckptfs -o options")
    ap.add_argument("--workdir", default=os.path.join(C.OUT_DIR, "work-seal"))
    args = ap.parse_args()
    C.check_binary()
    binaries = {"new": C.CKPTFS}
    if args.baseline:
        binaries = {"base": os.path.abspath(args.baseline), **binaries}
    work = os.path.abspath(args.workdir)
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    files = (torch_checkpoints if args.workload == "torch" else npy_checkpoints)(args.mib, work, args.width)
    want = tuple(C.sha256_file(f) for f in files)
    extra = [o for o in args.mount_options.split(",") if o]
    modes = {"lossless": []} | {f"lossy={f}": [f"lossy={f}"] for f in args.lossy.split(",") if f}
    counts = sorted({int(x) for x in args.workers.split(",")})
    best, reads, sizes = {}, {}, {}
    for r in range(args.rounds):  # interleaved: the VM's slow spells hit every cell
        for mode, opts in modes.items():
            for n in counts:
                for name, binary in binaries.items():
                    got = seal_run(binary, files, work, f"{name}-{n}-{r}", n, opts + extra)
                    key = (mode, n, name)
                    best[key] = [min(a, b, key=lambda x: x["cpu"]) for a, b in zip(best[key], got)] \
                        if key in best else got
                    reads.setdefault((mode, name), set()).add(tuple(g["sha"] for g in got))
                    sizes.setdefault((mode, name), set()).add(tuple(g["stored"] for g in got))
    sizes_mib = os.path.getsize(files[0]) / (1 << 20)
    print(f"bench_seal: {args.workload} checkpoint of {sizes_mib:.0f} MiB and its successor, {os.cpu_count()} cores, "
          f"options: {args.mount_options or 'default'}\n")
    print("Each cell: MB/s per CPU second (per user CPU second) / MB/s per worker (wall), stored MB,"
          " the daemon's peak RSS (VmHWM) once the file is sealed"
          " (lossy: largest error measured for weights, first and second moments).\n")
    rows = []
    for (mode, n, name), got in best.items():
        rows.append([mode, n, name] + [cell(g, n) for g in got])
    print(C.md_table(["mode", "seal_workers", "binary", "first checkpoint", "successor (delta)"], rows))
    ok = True
    for (mode, name), s in sizes.items():
        same = len(s) == 1 and len(reads[(mode, name)]) == 1
        exact = mode != "lossless" or reads[(mode, name)] == {want}
        ok &= same and exact
        print(f"\n{mode} {name}: same stored sizes and bytes read back for every worker count: "
              f"{'PASS' if same else 'FAIL'}" + ("" if mode != "lossless" else
                                                  f"; reads back as written: {'PASS' if exact else 'FAIL'}"))
    if args.baseline:
        for mode in modes:
            for n in counts:
                b, c = best[(mode, n, "base")], best[(mode, n, "new")]
                ratios = ", ".join(f"{bb['cpu'] / cc['cpu']:.2f}x less CPU, stored {cc['stored'] / bb['stored']:.4f}x"
                                   for bb, cc in zip(b, c))
                print(f"{mode}, {n} worker(s), new vs base (first, successor): {ratios}")
            # A speed-only change should give the same reconstruction; one
            # that changes the coding says so here (not a failure).
            same = reads[(mode, "new")] == reads[(mode, "base")]
            print(f"{mode}: new reads back the same bytes as base: {'yes' if same else 'no'}")
    shutil.rmtree(work, ignore_errors=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
