#!/usr/bin/env python3
"""Checkpoint benchmark: real torch checkpoints (model + AdamW, several
training steps apart) saved through a ckptfs mount and directly to a plain
directory on the same disk.

Reports save / load / raw-read time (mount vs direct), stored bytes vs
logical vs `zstd -3` of the same files, and the daemon's peak RSS (VmHWM).
Markdown on stdout, JSON in bench/out/.

  .venv-debian/bin/python bench/bench_mount.py --total-mb 400 --checkpoints 5
"""
import argparse
import os
import shutil
import subprocess
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _common as C  # noqa: E402


def build_model(ckpt_mb, width):
    # checkpoint bytes ~= 3 x params x 4 (weights + exp_avg + exp_avg_sq)
    params = int(ckpt_mb * (1 << 20) / 12)
    layers = max(1, round(params / (width * width)))
    mods = []
    for _ in range(layers):
        mods += [torch.nn.Linear(width, width), torch.nn.GELU()]
    return torch.nn.Sequential(*mods)


def train(model, opt, steps, width):
    for _ in range(steps):
        x = torch.randn(32, width)
        loss = (model(x) - x).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()


def timed_save(obj, path, fsync):
    """torch.save into a new file and close it; with fsync, also make it
    durable first (what DCP / Lightning-style savers do)."""
    t0 = time.perf_counter()
    with open(path, "wb") as f:
        torch.save(obj, f)
        if fsync:
            f.flush()
            os.fsync(f.fileno())
    return time.perf_counter() - t0


def measured_saves(obj, mnt, direct, name, reps):
    """Median save time per side and mode. Before each timed save, sealing
    is idle and dirty pages are written back, so neither side pays for the
    other's (or its own earlier) background work; sealing is timed apart."""
    times, seal_waits = {}, []
    for fsync in (False, True):
        for rep in range(reps):
            sides = [("mount", mnt), ("direct", direct)]
            if rep % 2:
                sides.reverse()
            for side, d in sides:
                os.sync()
                path = os.path.join(d, f"{name}.tmp{rep}{int(fsync)}")
                times.setdefault((side, fsync), []).append(timed_save(obj, path, fsync))
                if side == "mount":
                    seal_waits.append(C.wait_file_sealed(path))
    for d in (mnt, direct):  # keep one copy under the real name
        tmps = sorted(f for f in os.listdir(d) if f.startswith(name + ".tmp"))
        os.rename(os.path.join(d, tmps[-1]), os.path.join(d, name))
        for f in tmps[:-1]:
            os.unlink(os.path.join(d, f))
    out = {f"save_{side}{'_fsync' if fs else ''}_s": C.median(v) for (side, fs), v in times.items()}
    out["seal_after_close_s"] = C.median(seal_waits)
    return out


def timed_load(path):
    t0 = time.perf_counter()
    torch.load(path, map_location="cpu")
    return time.perf_counter() - t0


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--total-mb", type=float, default=400, help="total checkpoint bytes")
    ap.add_argument("--checkpoints", type=int, default=5)
    ap.add_argument("--steps-between", type=int, default=10)
    ap.add_argument("--width", type=int, default=1024)
    ap.add_argument("--workdir", default=os.path.join(C.OUT_DIR, "work"),
                    help="holds backing/, mnt/ and direct/ (same disk for both)")
    ap.add_argument("-o", "--mount-options", default="", help="extra ckptfs -o options")
    ap.add_argument("--keep", action="store_true", help="keep the mount and files")
    ap.add_argument("--reps", type=int, default=3, help="timed saves per checkpoint and side (median)")
    args = ap.parse_args()
    C.check_binary()

    work = os.path.abspath(args.workdir)
    backing, mnt, direct = (os.path.join(work, d) for d in ("backing", "mnt", "direct"))
    if C.is_mounted(mnt):
        C.umount(mnt, backing)
    for d in (backing, direct):
        shutil.rmtree(d, ignore_errors=True)
    opts = [o for o in args.mount_options.split(",") if o]
    C.mount(backing, mnt, opts)
    pid = C.daemon_pid(backing)

    torch.manual_seed(0)
    os.makedirs(direct, exist_ok=True)
    ckpt_mb = args.total_mb / args.checkpoints
    model = build_model(ckpt_mb, args.width)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    n_params = sum(p.numel() for p in model.parameters())
    print(f"# ckptfs checkpoint benchmark\n\nmodel: {n_params:,} params, "
          f"{args.checkpoints} checkpoints x ~{ckpt_mb:.0f} MB, "
          f"{args.steps_between} AdamW steps apart; workdir {work}\n", flush=True)

    rows, results = [], []
    can_drop = C.drop_caches()
    try:
        for k in range(1, args.checkpoints + 1):
            train(model, opt, args.steps_between, args.width)
            obj = {"model": model.state_dict(), "optim": opt.state_dict(),
                   "step": k * args.steps_between}
            name = f"ckpt-{k:03d}.pt"
            fm, fd = os.path.join(mnt, name), os.path.join(direct, name)
            saves = measured_saves(obj, mnt, direct, name, args.reps)
            results.append({"file": name, "bytes": os.path.getsize(fd), **saves})
            print(f"saved {name}: {C.human(os.path.getsize(fd))}  median of {args.reps}: "
                  f"mount {saves['save_mount_s']:.3f}s direct {saves['save_direct_s']:.3f}s; "
                  f"with fsync mount {saves['save_mount_fsync_s']:.3f}s "
                  f"direct {saves['save_direct_fsync_s']:.3f}s", flush=True)
        st, seal_wait = C.wait_sealed(mnt)
        hwm_write = C.status_kib(pid, "VmHWM") if pid else None

        def fresh_daemon():
            """Remount so the daemon's decoded-chunk cache is cold too, like the
            page cache after drop_caches. Returns the previous daemon's VmHWM."""
            nonlocal pid
            h = C.status_kib(pid, "VmHWM") if pid else None
            C.umount(mnt, backing)
            C.mount(backing, mnt, opts)
            pid = C.daemon_pid(backing)
            return h

        fresh_daemon()
        for r in results:
            fm, fd = os.path.join(mnt, r["file"]), os.path.join(direct, r["file"])
            C.drop_caches()
            r["load_mount_s"] = timed_load(fm)
            C.drop_caches()
            r["load_direct_s"] = timed_load(fd)
        hwm_load = fresh_daemon()
        for r in results:
            fm, fd = os.path.join(mnt, r["file"]), os.path.join(direct, r["file"])
            C.drop_caches()
            r["read_mount_s"] = C.timed_raw_read(fm)
            C.drop_caches()
            r["read_direct_s"] = C.timed_raw_read(fd)
            if C.sha256_file(fm) != C.sha256_file(fd):  # untimed content check
                sys.exit(f"CONTENT MISMATCH: {r['file']} differs between mount and direct")
            r["zstd3_bytes"], r["zstd3_s"] = C.zstd_size(fd)
        hwm_read = C.status_kib(pid, "VmHWM") if pid else None
        hwms = [h for h in (hwm_write, hwm_load, hwm_read) if h]
        hwm = max(hwms) if hwms else None
        rss = C.status_kib(pid, "VmRSS") if pid else None
    finally:
        if not args.keep:
            C.umount(mnt, backing)
            shutil.rmtree(direct, ignore_errors=True)
            shutil.rmtree(backing, ignore_errors=True)

    by_path = {f["path"].lstrip("/"): f for f in st["files"]}
    for r in results:
        e = by_path.get(r["file"], {})
        r["stored_bytes"] = e.get("stored")

    def ratio(a, b):
        return f"{a / b:.2f}x" if b else "-"

    for r in results:
        rows.append([r["file"], C.human(r["bytes"]),
                     f"{r['save_mount_s']:.2f} / {r['save_direct_s']:.2f} "
                     f"({ratio(r['save_mount_s'], r['save_direct_s'])})",
                     f"{r['save_mount_fsync_s']:.2f} / {r['save_direct_fsync_s']:.2f} "
                     f"({ratio(r['save_mount_fsync_s'], r['save_direct_fsync_s'])})",
                     f"{r['load_mount_s']:.2f} / {r['load_direct_s']:.2f} "
                     f"({ratio(r['load_mount_s'], r['load_direct_s'])})",
                     f"{r['read_mount_s']:.2f} / {r['read_direct_s']:.2f} "
                     f"({ratio(r['read_mount_s'], r['read_direct_s'])})",
                     C.human(r["stored_bytes"]) if r["stored_bytes"] is not None else "?",
                     C.human(r["zstd3_bytes"])])
    tot = {k: sum(r[k] for r in results) for k in
           ("bytes", "save_mount_s", "save_direct_s", "save_mount_fsync_s", "save_direct_fsync_s",
            "load_mount_s", "load_direct_s",
            "read_mount_s", "read_direct_s", "zstd3_bytes", "zstd3_s")}
    tot["stored_bytes"] = st["total"]["stored"]
    tot["logical_bytes"] = st["total"]["logical"]
    rows.append(["**total**", C.human(tot["bytes"]),
                 f"{tot['save_mount_s']:.2f} / {tot['save_direct_s']:.2f} "
                 f"({ratio(tot['save_mount_s'], tot['save_direct_s'])})",
                 f"{tot['save_mount_fsync_s']:.2f} / {tot['save_direct_fsync_s']:.2f} "
                 f"({ratio(tot['save_mount_fsync_s'], tot['save_direct_fsync_s'])})",
                 f"{tot['load_mount_s']:.2f} / {tot['load_direct_s']:.2f} "
                 f"({ratio(tot['load_mount_s'], tot['load_direct_s'])})",
                 f"{tot['read_mount_s']:.2f} / {tot['read_direct_s']:.2f} "
                 f"({ratio(tot['read_mount_s'], tot['read_direct_s'])})",
                 C.human(tot["stored_bytes"]), C.human(tot["zstd3_bytes"])])
    print()
    print(C.md_table(["checkpoint", "logical", "torch.save s mount/direct",
                      "torch.save+fsync s mount/direct", "torch.load s mount/direct",
                      "raw read s mount/direct", "ckptfs stored", "zstd -3"], rows))
    print()
    print(C.md_table(["metric", "value"], [
        ["logical bytes (ckptfs stats)", C.human(tot["logical_bytes"])],
        ["stored bytes (ckptfs stats)", f"{C.human(tot['stored_bytes'])} "
                                        f"({ratio(tot['logical_bytes'], tot['stored_bytes'])})"],
        ["zstd -3 of the same files", f"{C.human(tot['zstd3_bytes'])} "
                                      f"({ratio(tot['bytes'], tot['zstd3_bytes'])}, "
                                      f"{tot['zstd3_s']:.1f}s single-threaded CLI)"],
        ["background sealing after close (median per checkpoint, polled)",
         f"{C.median([r['seal_after_close_s'] for r in results]):.2f}s"],
        ["daemon peak RSS (VmHWM; max of save / load / read phases)",
         f"{hwm / 1024:.1f} MiB" if hwm else "?"],
        ["daemon RSS at end (VmRSS)", f"{rss / 1024:.1f} MiB" if rss else "?"],
        ["page cache dropped between reads", "yes" if can_drop else
         "no (not permitted: read numbers include cache hits)"],
        ["daemon restarted before the load and read phases", "yes (cold chunk cache)"],
        ["mount options", ",".join(opts) or "(defaults)"],
    ]))
    path = C.write_json("bench_mount", {
        "args": vars(args), "params": n_params, "per_checkpoint": results, "total": tot,
        "seal_wait_s": seal_wait, "daemon_vmhwm_kib": hwm,
        "daemon_vmhwm_kib_by_phase": {"save": hwm_write, "load": hwm_load, "read": hwm_read}, "daemon_vmrss_kib": rss,
        "dropped_caches": can_drop, "stats": st})
    print(f"\nJSON: {path}")


if __name__ == "__main__":
    main()
