#!/usr/bin/env python3
"""Restore benchmark: a model + AdamW checkpoint (torch.save) and its delta
successor, saved through two ckptfs stores (one lossless, one whose tree
is under `lossy=0.05`) and directly to a plain directory on the same disk.
Each policy has a store of its own: in one store the lossy file would be
coded against its lossless twin, which holds the same bytes, and would
cost nothing to seal or store (what earlier versions of this bench measured).

Columns: save stall (torch.save + fsync), seal time and MB/s per core, cold
torch.load and cold `cat` (page cache dropped and daemon restarted before
each), 8 concurrent readers each loading its own shard, the daemon's peak
RSS, and the mount/direct ratio of every timing, all from this one run.
The reads are made `--rounds` times (3), each round reading a direct file
right before its mount twins; the tables give each timing's median, and a
last table every round's ratio (this VM's reads vary by up to 2x from one
minute to the next). Markdown on stdout, JSON in bench/out/.

  .venv-debian/bin/python bench/restore.py --gb 4
  .venv-debian/bin/python bench/restore.py --gb 1 --shard-mb 128   # quicker
"""
import argparse
import multiprocessing as mp
import os
import shutil
import subprocess
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _common as C  # noqa: E402

READERS = 8


def build_model(gb, width):
    # checkpoint bytes ~= 3 x params x 4 (weights + exp_avg + exp_avg_sq)
    layers = max(1, round(gb * (1 << 30) / 12 / (width * width + width)))
    return torch.nn.Sequential(*[torch.nn.Linear(width, width) for _ in range(layers)])


def train_step(model, opt, width):
    x = torch.randn(16, width)
    loss = (model(x) - x).pow(2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()


def timed_save(obj, path):
    """The save stall a trainer sees: torch.save, then fsync (what DCP and
    Lightning-style savers do before they report a checkpoint done)."""
    os.sync()
    t0 = time.perf_counter()
    with open(path, "wb") as f:
        torch.save(obj, f)
        f.flush()
        os.fsync(f.fileno())
    return time.perf_counter() - t0


def timed_load(path):
    t0 = time.perf_counter()
    torch.load(path, map_location="cpu")
    return time.perf_counter() - t0


def timed_cat(path):
    t0 = time.perf_counter()
    subprocess.run(["cat", path], stdout=subprocess.DEVNULL, check=True)
    return time.perf_counter() - t0


class Daemon:
    """The ckptfs mount, restarted before each cold read so that its chunk
    cache is as cold as the page cache after drop_caches. Keeps the highest
    VmHWM of all the daemons it started."""

    def __init__(self, backing, mnt, opts):
        self.backing, self.mnt, self.opts = backing, mnt, opts
        self.peak_kib = 0
        self.pid = None

    def start(self):
        C.mount(self.backing, self.mnt, self.opts)
        self.pid = C.daemon_pid(self.backing)

    def note_peak(self):
        h = C.status_kib(self.pid, "VmHWM") if self.pid else None
        self.peak_kib = max(self.peak_kib, h or 0)

    def stop(self):
        self.note_peak()
        C.umount(self.mnt, self.backing)
        self.pid = None

    def restart(self):
        self.stop()
        self.start()


def decode_work(mnt):
    """The daemon's read counters since it started (None from a daemon
    without them): chunk decodes, decoded bytes, bytes read (replied or
    pushed into the page cache), FUSE reads.
    They do not depend on the machine's load, as the timings do."""
    text = os.getxattr(mnt, "user.ckptfs.metrics").decode()
    m = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, _, value = line.rpartition(" ")
            m[name] = float(value)
    if "ckptfs_chunk_decodes_total" not in m:
        return None
    return {"decodes": int(m["ckptfs_chunk_decodes_total"]),
            "decoded_bytes": int(m["ckptfs_chunk_decoded_bytes_total"]),
            # Bytes handed to the kernel: replied, or pushed into its page
            # cache when the cache evicted them unread (0 before that).
            "read_bytes": int(m["ckptfs_read_bytes_total"] + m.get("ckptfs_pages_pushed_bytes_total", 0)),
            "read_requests": int(m["ckptfs_read_requests_total"])}


def cold(daemon, path, fn, work=None):
    """fn(path) with the page cache dropped and, for a file on the mount
    (`daemon` not None), a fresh daemon, whose decode counters go into
    `work` (a dict) if given."""
    on_mount = daemon is not None
    if on_mount:
        daemon.restart()
    if not C.drop_caches():
        sys.exit("cannot drop the page cache (run as root): cold reads would be warm")
    seconds = fn(path)
    if on_mount and work is not None:
        work.update(decode_work(daemon.mnt) or {})
        work["daemon_cpu_s"] = daemon_cpu_seconds(daemon.pid)
    return seconds


def daemon_cpu_seconds(pid):
    """User + system CPU seconds of the daemon so far (it was started for
    this read): the decode work in seconds, from any binary."""
    fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _shard_reader(path, start, done):
    start.wait()
    t0 = time.perf_counter()
    torch.load(path, map_location="cpu")
    done.put((t0, time.perf_counter()))


def concurrent_loads(paths):
    """Seconds from the common start until the last of len(paths) processes,
    each loading its own file, is done. Processes are forked with torch
    already imported, so that no start-up is timed."""
    ctx = mp.get_context("fork")
    start, done = ctx.Event(), ctx.Queue()
    procs = [ctx.Process(target=_shard_reader, args=(p, start, done)) for p in paths]
    for p in procs:
        p.start()
    time.sleep(0.5)
    t0 = time.perf_counter()
    start.set()
    ends = [done.get()[1] for _ in procs]
    for p in procs:
        p.join()
        if p.exitcode != 0:
            sys.exit(f"a shard reader failed (exit {p.exitcode})")
    return max(ends) - t0


def make_shards(state, shard_bytes):
    """READERS dicts of tensors cut from the checkpoint's tensors (weights and
    Adam moments), each about shard_bytes."""
    flat = [t.reshape(-1) for t in state["model"].values()]
    for s in state["optim"]["state"].values():
        flat += [s["exp_avg"].reshape(-1), s["exp_avg_sq"].reshape(-1)]
    allv = torch.cat(flat)
    per = shard_bytes // 4
    # --gb 4 holds a little under 8 x 512 MB of tensors (the pickle and
    # scalars take the rest): the last shard wraps round to the start.
    while per * READERS > allv.numel():
        allv = torch.cat([allv, allv[:per * READERS - allv.numel()]])
    return [{"shard": i, "w": allv[i * per:(i + 1) * per].clone()} for i in range(READERS)]


def seal_seconds(path):
    return C.wait_file_sealed(path)


def save_everywhere(obj, name, dirs, daemons, results):
    """Saves obj as `name` in each of dirs (direct, lossless, lossy), waiting
    for each seal before the next save so that no save pays for a seal."""
    for kind, d in dirs.items():
        r = results.setdefault((name, kind), {"file": name, "kind": kind})
        r["save_s"] = timed_save(obj, os.path.join(d, name))
        r["bytes"] = os.path.getsize(os.path.join(d, name))
        if kind != "direct":
            r["seal_s"] = seal_seconds(os.path.join(d, name))
        print(f"saved {kind}/{name}: save {r['save_s']:.2f}s"
              + (f", sealed {r['seal_s']:.2f}s later" if "seal_s" in r else ""), flush=True)


def ratio(a, b):
    return f"{a / b:.2f}x" if a is not None and b else "-"


def pair(a, b):
    return f"{a:.2f} / {b:.2f} ({ratio(a, b)})"


def table(results, stats, cores):
    by_path = {f["path"].lstrip("/"): f for st in stats.values() for f in st["files"]}
    rows = []
    for name in ("ckpt-1.pt", "ckpt-2.pt"):
        d = results[(name, "direct")]
        for kind in ("lossless", "lossy"):
            r = results[(name, kind)]
            st = by_path.get(f"{kind}/{name}", {})
            mbps = r["bytes"] / 1e6 / r["seal_s"] if r["seal_s"] else None
            rows.append([
                f"{name} {kind}" + (" (delta successor)" if name == "ckpt-2.pt" else ""), C.human(r["bytes"]),
                pair(r["save_s"], d["save_s"]), f"{r['seal_s']:.2f}",
                f"{mbps / cores:.0f}" if mbps else "-",
                pair(r["load_s"], d["load_s"]), pair(r["cat_s"], d["cat_s"]),
                C.human(st["stored"]) if "stored" in st else "?"])
    return C.md_table(["file", "logical", "save stall s mount / direct", "seal s", "seal MB/s per core",
                       "cold torch.load s mount / direct", "cold cat s mount / direct", "stored"], rows)


def work_cell(w):
    if not w:
        return "-"
    cpu = f"{w['daemon_cpu_s']:.2f}" if "daemon_cpu_s" in w else "-"
    if "decodes" not in w:
        return f"- / - / - / {cpu}"
    per = w["decoded_bytes"] / w["read_bytes"] if w["read_bytes"] else 0
    return f"{w['decodes']} / {per:.2f} / {w['read_requests']} / {cpu}"


def work_table(results):
    """Decode work of each cold read through the mount: what a change to the
    read path should lower whatever the machine's load."""
    rows = []
    for name in ("ckpt-1.pt", "ckpt-2.pt"):
        for kind in ("lossless", "lossy"):
            r = results[(name, kind)]
            rows.append([f"{name} {kind}", work_cell(r.get("load_work")), work_cell(r.get("cat_work"))])
    head = "chunk decodes / decoded bytes per byte read / FUSE reads / daemon CPU s"
    return C.md_table(["file", f"cold torch.load: {head}", f"cold cat: {head}"], rows)


def setup(work, opts):
    """A store and mount per policy (backing-lossless, mnt-lossless, ...)
    and the plain directory."""
    direct = os.path.join(work, "direct")
    shutil.rmtree(direct, ignore_errors=True)
    os.makedirs(direct)
    daemons, dirs = {}, {"direct": direct}
    for kind in ("lossless", "lossy"):
        backing, mnt = os.path.join(work, f"backing-{kind}"), os.path.join(work, f"mnt-{kind}")
        if C.is_mounted(mnt):
            C.umount(mnt, backing)
        shutil.rmtree(backing, ignore_errors=True)
        daemons[kind] = Daemon(backing, mnt, opts)
        daemons[kind].start()
        dirs[kind] = os.path.join(mnt, kind)
        os.makedirs(dirs[kind], exist_ok=True)
    os.setxattr(dirs["lossy"], "user.ckptfs.policy", b"lossy=0.05")
    return daemons, dirs


def run_checkpoints(args, daemons, dirs):
    torch.manual_seed(0)
    model = build_model(args.gb, args.width)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    results = {}
    train_step(model, opt, args.width)
    state = {"model": model.state_dict(), "optim": opt.state_dict()}
    save_everywhere(state, "ckpt-1.pt", dirs, daemons, results)
    train_step(model, opt, args.width)
    state = {"model": model.state_dict(), "optim": opt.state_dict()}
    save_everywhere(state, "ckpt-2.pt", dirs, daemons, results)
    shards = make_shards(state, args.shard_mb << 20)
    del state, opt, model
    return results, shards


def cold_reads(daemons, dirs, results, baseline=None, rounds=1):
    """Each file cold, with torch.load and with cat, `rounds` times; with
    `baseline` (another ckptfs binary), each file on the mount again through
    that binary's daemon, right after, so that both see the same load. A
    round reads every file once, a direct file right before its mount
    twins, so that each ratio compares reads made close together; each
    timing is then the median of its rounds (and its decode work that of
    the median round; the upper of an even count), every round's kept in
    `*_rounds`."""
    for rnd in range(rounds):
        for (name, kind), r in results.items():
            path = os.path.join(dirs[kind], name)
            for prefix, binary in (("", None), ("base_", baseline)):
                if prefix and (binary is None or kind == "direct"):
                    continue
                saved = C.CKPTFS
                C.CKPTFS = binary or saved
                try:
                    daemon = daemons.get(kind)
                    for what, fn in (("load", timed_load), ("cat", timed_cat)):
                        work = {}
                        r.setdefault(f"{prefix}{what}_rounds", []).append(cold(daemon, path, fn, work))
                        r.setdefault(f"{prefix}{what}_works", []).append(work)
                finally:
                    C.CKPTFS = saved
                print(f"round {rnd + 1}: cold {kind}/{name}{' (baseline)' if prefix else ''}: torch.load "
                      f"{r[f'{prefix}load_rounds'][-1]:.2f}s, cat {r[f'{prefix}cat_rounds'][-1]:.2f}s", flush=True)
    for r in results.values():
        for key in [k[:-len("_rounds")] for k in r if k.endswith("_rounds")]:
            r[f"{key}_s"], r[f"{key}_work"] = median_round(r[f"{key}_rounds"], r.pop(f"{key}_works"))
    if baseline:
        for daemon in daemons.values():
            daemon.restart()  # the rest of the run on this binary


def median_round(seconds, works):
    """The median timing and the decode work of the round that made it."""
    i = C.median_index(seconds)
    return seconds[i], works[i]


def rounds_table(results, conc):
    """Every round's mount/direct ratio: how far one run's figure can be
    trusted on this machine."""
    rows = []
    for name in ("ckpt-1.pt", "ckpt-2.pt"):
        d = results[(name, "direct")]
        for kind in ("lossless", "lossy"):
            r = results[(name, kind)]
            each = [", ".join(ratio(m, x) for m, x in zip(r[f"{w}_rounds"], d[f"{w}_rounds"])) for w in ("load", "cat")]
            rows.append([f"{name} {kind}"] + each)
    agg = ", ".join(ratio(x, m) for m, x in zip(conc["lossless_rounds"], conc["direct_rounds"]))
    rows.append([f"{READERS} readers' aggregate throughput (direct s / mount s)", agg, "-"])
    return C.md_table(["file", "cold torch.load mount/direct, each round", "cold cat mount/direct, each round"],
                      rows)


def baseline_table(results):
    rows = []
    for name in ("ckpt-1.pt", "ckpt-2.pt"):
        d = results[(name, "direct")]
        for kind in ("lossless", "lossy"):
            r = results[(name, kind)]
            rows.append([f"{name} {kind}",
                         f"{pair(r['load_s'], r['base_load_s'])}; {ratio(r['load_s'], d['load_s'])} / "
                         f"{ratio(r['base_load_s'], d['load_s'])} of direct",
                         f"{pair(r['cat_s'], r['base_cat_s'])}; {ratio(r['cat_s'], d['cat_s'])} / "
                         f"{ratio(r['base_cat_s'], d['cat_s'])} of direct",
                         work_cell(r.get("base_load_work")), work_cell(r.get("base_cat_work"))])
    return C.md_table(["file", "cold torch.load s this / baseline", "cold cat s this / baseline",
                       "baseline torch.load work", "baseline cat work"], rows)


def shard_reads(daemon, dirs, shards, rounds=1):
    """8 concurrent readers of their own shards, through the mount and
    direct, `rounds` times (each the median; every round's kept)."""
    paths = {}
    for kind in ("direct", "lossless"):
        d = os.path.join(dirs[kind], "shards")
        os.makedirs(d, exist_ok=True)
        paths[kind] = [os.path.join(d, f"shard-{i}.pt") for i in range(len(shards))]
        for s, p in zip(shards, paths[kind]):
            torch.save(s, p)
    C.wait_sealed(daemon.mnt)
    total = sum(os.path.getsize(p) for p in paths["direct"])
    out = {"bytes": total, "lossless_rounds": [], "direct_rounds": [], "works": []}
    for rnd in range(rounds):
        for kind in ("lossless", "direct"):
            if kind == "lossless":
                daemon.restart()
            C.drop_caches()
            out[f"{kind}_rounds"].append(concurrent_loads(paths[kind]))
            if kind == "lossless":
                out["works"].append(dict(decode_work(daemon.mnt) or {}, daemon_cpu_s=daemon_cpu_seconds(daemon.pid)))
            seconds = out[f"{kind}_rounds"][-1]
            print(f"round {rnd + 1}: {READERS} concurrent readers, {kind}: {seconds:.2f}s", flush=True)
    out["lossless_s"], out["work"] = median_round(out["lossless_rounds"], out.pop("works"))
    out["direct_s"] = C.median(out["direct_rounds"])
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gb", type=float, default=4.0, help="checkpoint size in GiB (model + AdamW)")
    ap.add_argument("--shard-mb", type=int, default=512, help="bytes of each concurrent reader's shard")
    ap.add_argument("--width", type=int, default=2048)
    ap.add_argument("--workdir", default=os.path.join(C.OUT_DIR, "restore"),
                    help="holds backing/, mnt/ and direct/ (same disk for both)")
    ap.add_argument("-o", "--mount-options", default="", help="extra ckptfs -o options")
    ap.add_argument("--keep", action="store_true", help="keep the mount and files")
    ap.add_argument("--baseline-bin", help="another ckptfs binary (e.g. main's): every cold read through the "
                    "mount is repeated through it, on the same store, right after")
    ap.add_argument("--rounds", type=int, default=3,
                    help="cold reads (and the 8 readers) this many times; each timing is the median")
    args = ap.parse_args()
    C.check_binary()
    work = os.path.abspath(args.workdir)
    opts = [o for o in args.mount_options.split(",") if o]
    cores = os.cpu_count()
    daemons, dirs = setup(work, opts)
    try:
        results, shards = run_checkpoints(args, daemons, dirs)
        stats = {kind: C.stats(d.mnt) for kind, d in daemons.items()}
        cold_reads(daemons, dirs, results, args.baseline_bin and os.path.abspath(args.baseline_bin), args.rounds)
        conc = shard_reads(daemons["lossless"], dirs, shards, args.rounds)
    finally:
        for daemon in daemons.values():
            if daemon.pid:
                daemon.stop()
            if not args.keep:
                shutil.rmtree(daemon.backing, ignore_errors=True)
        if not args.keep:
            shutil.rmtree(dirs["direct"], ignore_errors=True)
    peak_kib = max(d.peak_kib for d in daemons.values())

    print(f"\n# ckptfs restore benchmark\n\n{args.gb:g} GiB checkpoint (model + AdamW), {cores} cores, "
          f"mount options: {','.join(opts) or '(defaults)'}; read timings are medians of {args.rounds} "
          f"round(s)\n")
    print(table(results, stats, cores))
    print()
    print(work_table(results))
    if args.baseline_bin:
        print(f"\nAgainst the baseline binary {args.baseline_bin}:\n")
        print(baseline_table(results))
    agg_m, agg_d = conc["bytes"] / 1e6 / conc["lossless_s"], conc["bytes"] / 1e6 / conc["direct_s"]
    print()
    print(C.md_table(["metric", "value"], [
        [f"{READERS} concurrent torch.load, {args.shard_mb} MB shard each (lossless), s mount / direct",
         pair(conc["lossless_s"], conc["direct_s"])],
        ["aggregate MB/s mount / direct", f"{agg_m:.0f} / {agg_d:.0f} ({ratio(agg_m, agg_d)})"],
        [f"{READERS} readers' chunk decodes / decoded bytes per byte read / FUSE reads / daemon CPU s",
         work_cell(conc.get("work"))],
        ["daemon peak RSS (VmHWM, highest of every daemon in the run)", f"{peak_kib / 1024:.0f} MiB"],
    ]))
    if args.rounds > 1:
        print("\nEach round's ratio (the table above takes each timing's median):\n")
        print(rounds_table(results, conc))
    path = C.write_json("restore", {
        "args": vars(args), "cores": cores, "daemon_vmhwm_kib": peak_kib, "concurrent": conc,
        "per_file": [dict(r) for r in results.values()], "stats": stats})
    print(f"\nJSON: {path}")


if __name__ == "__main__":
    main()
