"""Cluster mode on Ceph: three ckptfs daemons on CephFS against the same
torch.distributed.checkpoint save straight into CephFS (issue 16).

    .venv-debian/bin/python bench/cluster_bench.py            # --checkpoints 4 --d-model 384 --layers 6

Starts a one-machine Ceph cluster (tests/integration/ceph_cluster.py: mon,
memstore OSD, MDS) and one CephFS client (ceph-fuse) per node for three
nodes. A small GPT-style transformer is trained with Adam on a synthetic
token stream; every --steps-between steps its model and optimizer state is
saved with DCP at world size 3 (gloo, CPU; each rank holds a third of every
tensor as a DTensor, as FSDP would), rank r writing through node r, in
three ways on the same run and with the same state:

  direct    straight into a directory on CephFS (each rank through its node's client)
  lossless  through three ckptfs daemons (-o cluster, node-local staging) over one store on CephFS
  lossy     the same with -o lossy (--lossy picks the policy, e.g. lossy=0.05)

and reports per way: the aggregate save time (what the ranks wait for, the
slowest rank's dcp.save), the time until the bytes have left the nodes
(ckptfs: every file sealed and published), the bytes that reach the Ceph
cluster (the sum of the sizes of the objects in every pool, before and after
each save, CephFS clients flushed), and the restore time of the last
checkpoint at world size 3 through other nodes, with the page cache dropped.
Lossless restores are checked bit for bit; the lossy one reports the largest
relative error of a weight.

The orchestrator runs under Debian's Python (python3-rados); training and
DCP run in a worker under .venv-pypi (torch 2.x), `--worker` mode of this file.
"""
from __future__ import annotations

import argparse
import json
import os
import select
import shutil
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
WAYS = ("direct", "lossless", "lossy")


# -- worker (.venv-pypi: torch 2.x) ------------------------------------------------
def worker_main():
    import datetime
    import socket
    import traceback
    import warnings

    import torch
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    import torch.multiprocessing as mp
    from torch.distributed.checkpoint.state_dict import get_state_dict
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor, Shard, distribute_tensor

    warnings.filterwarnings("ignore")
    # One thread: the ranks are forked from this process, and an OpenMP pool
    # the parent has used hangs in a forked child.
    torch.set_num_threads(1)

    class Block(torch.nn.Module):
        def __init__(self, d, heads):
            super().__init__()
            self.ln1, self.ln2 = torch.nn.LayerNorm(d), torch.nn.LayerNorm(d)
            self.attn = torch.nn.MultiheadAttention(d, heads, batch_first=True)
            self.mlp = torch.nn.Sequential(torch.nn.Linear(d, 4 * d), torch.nn.GELU(), torch.nn.Linear(4 * d, d))

        def forward(self, x, mask):
            h = self.ln1(x)
            x = x + self.attn(h, h, h, attn_mask=mask, need_weights=False)[0]
            return x + self.mlp(self.ln2(x))

    class GPT(torch.nn.Module):
        def __init__(self, vocab, d, layers, heads, ctx):
            super().__init__()
            self.tok, self.pos = torch.nn.Embedding(vocab, d), torch.nn.Embedding(ctx, d)
            self.blocks = torch.nn.ModuleList(Block(d, heads) for _ in range(layers))
            self.ln, self.head = torch.nn.LayerNorm(d), torch.nn.Linear(d, vocab, bias=False)

        def forward(self, idx):
            t = idx.shape[1]
            mask = torch.triu(torch.full((t, t), float("-inf")), 1)
            x = self.tok(idx) + self.pos(torch.arange(t))
            for b in self.blocks:
                x = b(x, mask)
            return self.head(self.ln(x))

    st = {}

    def init(cfg):
        torch.manual_seed(cfg["seed"])
        st["cfg"] = cfg
        st["model"] = GPT(cfg["vocab"], cfg["d_model"], cfg["layers"], cfg["heads"], cfg["ctx"])
        st["opt"] = torch.optim.Adam(st["model"].parameters(), lr=3e-4)
        # a Markov-ish token stream: every token predicts the next one somewhat
        g = torch.Generator().manual_seed(cfg["seed"] + 1)
        st["table"] = torch.randint(0, cfg["vocab"], (cfg["vocab"], 4), generator=g)
        st["gen"] = g
        return {"params": sum(p.numel() for p in st["model"].parameters())}

    def batch():
        cfg, g = st["cfg"], st["gen"]
        seq = [torch.randint(0, cfg["vocab"], (cfg["batch"],), generator=g)]
        for _ in range(cfg["ctx"]):
            pick = torch.randint(0, 4, (cfg["batch"],), generator=g)
            seq.append(st["table"][seq[-1], pick])
        s = torch.stack(seq, 1)
        return s[:, :-1], s[:, 1:]

    def train(steps):
        model, opt = st["model"], st["opt"]
        loss = None
        for _ in range(steps):
            x, y = batch()
            loss = torch.nn.functional.cross_entropy(model(x).flatten(0, 1), y.flatten())
            opt.zero_grad()
            loss.backward()
            opt.step()
        return {"loss": float(loss)}

    def full_state():
        msd, osd = get_state_dict(st["model"], st["opt"])
        return {"model": msd, "optim": osd}

    def shard(obj, mesh, fn):
        if isinstance(obj, dict):
            return {k: shard(v, mesh, fn) for k, v in obj.items()}
        if isinstance(obj, list):
            return [shard(v, mesh, fn) for v in obj]
        if torch.is_tensor(obj) and obj.dim() >= 1 and obj.shape[0] >= 3:
            return distribute_tensor(fn(obj), mesh, [Shard(0)])
        return fn(obj) if torch.is_tensor(obj) else obj

    def pairs(a, b, prefix=""):
        if isinstance(a, dict):
            for k in a:
                yield from pairs(a[k], b[k], f"{prefix}/{k}")
        elif isinstance(a, list):
            for i, (x, y) in enumerate(zip(a, b)):
                yield from pairs(x, y, f"{prefix}/{i}")
        elif torch.is_tensor(a):
            yield prefix, a, b

    def rank_run(rank, world, port, mode, dirs, out):
        try:
            dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world,
                                    timeout=datetime.timedelta(seconds=600))
            mesh = init_device_mesh("cpu", (world,))
            full = full_state()
            if mode == "save":
                state = shard(full, mesh, lambda t: t.detach().clone())
                dist.barrier()
                t0 = time.perf_counter()
                dcp.save(state, storage_writer=dcp.FileSystemWriter(dirs[rank]))
                dist.barrier()
                seconds = time.perf_counter() - t0
                rep = {"seconds": seconds}
            else:
                state = shard(full, mesh, torch.zeros_like)
                dist.barrier()
                t0 = time.perf_counter()
                dcp.load(state, storage_reader=dcp.FileSystemReader(dirs[rank]))
                dist.barrier()
                seconds = time.perf_counter() - t0
                exact, worst = True, 0.0
                for name, want, got in pairs(full, state):
                    if isinstance(got, DTensor):
                        got = got.full_tensor()
                    if want.is_floating_point():
                        w, g = want.float(), got.float()
                        if not torch.equal(want.view(torch.uint8) if want.dim() else want,
                                           got.view(torch.uint8) if got.dim() else got):
                            exact = False
                            if "/model/" in name:
                                worst = max(worst, float((g - w).norm() / w.norm().clamp_min(1e-30)))
                    elif not torch.equal(want, got):
                        exact = False
                rep = {"seconds": seconds, "exact": exact, "max_rel_error": worst}
            if rank == 0:
                out.put({"ok": True, **rep})
            dist.destroy_process_group()
        except BaseException:
            out.put({"ok": False, "error": f"rank {rank}: {traceback.format_exc()}"})
            raise

    def ranks(mode, dirs):
        ctx = mp.get_context("fork")
        out = ctx.Queue()
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        procs = [ctx.Process(target=rank_run, args=(r, len(dirs), port, mode, dirs, out)) for r in range(len(dirs))]
        for p in procs:
            p.start()
        rep = out.get(timeout=3600)
        for p in procs:
            if not rep["ok"]:
                p.kill()  # the others wait in a collective for the rank that failed
            p.join()
        return rep

    for line in sys.stdin:
        cmd, *args = line.split()
        try:
            if cmd == "init":
                rep = {"ok": True, **init(json.loads(args[0]))}
            elif cmd == "train":
                rep = {"ok": True, **train(int(args[0]))}
            else:
                rep = ranks(cmd, args)
        except Exception:
            rep = {"ok": False, "error": traceback.format_exc()}
        print(json.dumps(rep), flush=True)


# -- orchestrator (Debian Python: python3-rados) --------------------------------------
class Worker:
    def __init__(self, python):
        self.proc = subprocess.Popen([python, os.path.abspath(__file__), "--worker"], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, env={**os.environ, "OMP_NUM_THREADS": "1"})

    def send(self, *words):
        self.proc.stdin.write((" ".join(map(str, words)) + "\n").encode())
        self.proc.stdin.flush()
        select.select([self.proc.stdout], [], [], 7200)
        line = self.proc.stdout.readline()
        if not line:
            sys.exit(f"worker exited ({self.proc.poll()}) on `{' '.join(map(str, words))}`")
        rep = json.loads(line)
        if not rep["ok"]:
            sys.exit(f"worker failed on `{words[0]}`:\n{rep['error']}")
        return rep

    def close(self):
        self.proc.stdin.close()
        self.proc.wait()


def du(path):
    return sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(path) for f in fs)


def wait_sealed(C, backing, timeout=3600):
    t0 = time.monotonic()
    while True:
        files = C.stats(backing)["files"]
        if not any(f["staged"] for f in files):
            return
        if time.monotonic() - t0 > timeout:
            sys.exit(f"{backing}: files still staged after {timeout}s")
        time.sleep(0.1)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--checkpoints", type=int, default=4)
    ap.add_argument("--steps-between", type=int, default=10)
    ap.add_argument("--warmup-steps", type=int, default=20)
    ap.add_argument("--d-model", type=int, default=384)
    ap.add_argument("--layers", type=int, default=6)
    ap.add_argument("--vocab", type=int, default=8192)
    ap.add_argument("--memstore-gib", type=float, default=6)
    ap.add_argument("-o", dest="opts", default="", help="extra mount options for both ckptfs ways")
    ap.add_argument("--lossy", default="lossy", help="the lossy way's policy option (default: lossy; e.g. lossy=0.05)")
    ap.add_argument("--ways", default=",".join(WAYS), help="a subset of direct,lossless,lossy (default: all)")
    ap.add_argument("--workdir", default=None)
    ap.add_argument("--keep", action="store_true")
    args = ap.parse_args()
    if args.worker:
        return worker_main()
    ways = [w for w in WAYS if w in args.ways.split(",")]

    import _common as C
    from ceph_cluster import CephCluster

    C.check_binary()
    pypi = os.path.join(C.ROOT, ".venv-pypi", "bin", "python")
    if not os.access(pypi, os.X_OK):
        sys.exit(f"{pypi} missing: bash scripts/install-deps.sh")
    work = os.path.abspath(args.workdir or os.path.join(C.OUT_DIR, "cluster-work"))
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    ceph = CephCluster(memstore_bytes=int(args.memstore_gib * (1 << 30))).start()
    mounts = []
    worker = None
    try:
        clients = [ceph.mount_cephfs(os.path.join(ceph.dir, f"client-n{i}")) for i in range(3)]
        extra = [o for o in args.opts.split(",") if o]
        way_opts = {w: o for w, o in (("lossless", extra), ("lossy", extra + [args.lossy])) if w in ways}
        mnt = {"direct": [os.path.join(c, "direct") for c in clients]}
        os.makedirs(mnt["direct"][0], exist_ok=True)
        backing = {}
        for way, opts in way_opts.items():
            backing[way] = [os.path.join(c, f"store-{way}") for c in clients]
            mnt[way] = [os.path.join(work, f"{way}-n{i}-mnt") for i in range(3)]
            for i in range(3):
                C.mount(backing[way][i], mnt[way][i],
                        ["cluster", f"node=n{i}", f"staging={work}/{way}-n{i}-staging", *opts])
                mounts.append((mnt[way][i], backing[way][i]))

        worker = Worker(pypi)
        cfg = {"seed": 0, "vocab": args.vocab, "d_model": args.d_model, "layers": args.layers,
               "heads": max(1, args.d_model // 64), "ctx": 128, "batch": 8}
        params = worker.send("init", json.dumps(cfg).replace(" ", ""))["params"]
        print(f"model: {params / 1e6:.1f} M parameters, checkpoints of ~{params * 12 / 1e6:.0f} MB "
              f"(fp32 weights and Adam moments)", flush=True)
        worker.send("train", args.warmup_steps)
        rows = {w: {"save_s": 0.0, "published_s": 0.0, "bytes": 0, "logical": 0} for w in ways}
        per_ckpt = []
        for k in range(1, args.checkpoints + 1):
            loss = worker.send("train", args.steps_between)["loss"]
            line = {"checkpoint": k, "loss": loss}
            for way in ways:
                before = ceph.bytes_used()
                t0 = time.monotonic()
                dirs = [os.path.join(m, f"ckpt/step{k}") for m in mnt[way]]
                save_s = worker.send("save", *dirs)["seconds"]
                if way != "direct":
                    wait_sealed(C, backing[way][0])
                ceph.flush_clients()
                published_s = time.monotonic() - t0
                used = ceph.bytes_used() - before
                logical = du(os.path.join(mnt[way][0], f"ckpt/step{k}"))
                r = rows[way]
                r["save_s"] += save_s
                r["published_s"] += published_s
                r["bytes"] += used
                r["logical"] += logical
                line[way] = {"save_s": save_s, "published_s": published_s, "bytes": used, "logical": logical}
                print(f"checkpoint {k} {way:8s}: save {save_s:6.2f} s, published after {published_s:6.2f} s, "
                      f"{used / 1e6:8.1f} MB to Ceph of {logical / 1e6:.1f} MB", flush=True)
            per_ckpt.append(line)
        dropped = True
        last = args.checkpoints
        for way in ways:
            dropped &= C.drop_caches()
            dirs = [os.path.join(mnt[way][(r + 1) % 3], f"ckpt/step{last}") for r in range(3)]
            rep = worker.send("load", *dirs)
            rows[way].update(restore_s=rep["seconds"], exact=rep["exact"], max_rel_error=rep["max_rel_error"])
            print(f"restore {way:8s}: {rep['seconds']:6.2f} s, exact {rep['exact']}, "
                  f"max relative error of a weight tensor {rep['max_rel_error']:.2e}", flush=True)
        report(rows, args, params, dropped, per_ckpt)
    finally:
        if worker:
            worker.close()
        for m, b in mounts:
            C.umount(m)
        problems = ceph.stop()
        if problems:
            print("stopping Ceph:", *problems, sep="\n  ")
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)


def report(rows, args, params, dropped, per_ckpt):
    import _common as C
    d = rows.get("direct") or next(iter(rows.values()))
    print(f"\n{args.checkpoints} DCP checkpoints (world size 3, {params / 1e6:.1f} M-parameter transformer + Adam), "
          f"{d['logical'] / 1e6:.0f} MB logical in total; restore of the last one at world size 3 through other "
          f"nodes{'' if dropped else ' (page cache NOT dropped: no permission)'}\n")
    print("| way | save (s) | until published (s) | bytes to Ceph (MB) | vs direct | restore (s) | restored |")
    print("|---|---:|---:|---:|---:|---:|---|")
    for way, r in rows.items():
        ratio = d["bytes"] / r["bytes"] if r["bytes"] else float("inf")
        restored = "bit-exact" if r["exact"] else f"max rel. error {r['max_rel_error']:.1e}"
        print(f"| {way} | {r['save_s']:.1f} | {r['published_s']:.1f} | {r['bytes'] / 1e6:.1f} | "
              f"{ratio:.2f}x | {r['restore_s']:.2f} | {restored} |")
    os.makedirs(C.OUT_DIR, exist_ok=True)
    out = os.path.join(C.OUT_DIR, "cluster_bench.json")
    with open(out, "w") as f:
        json.dump({"args": vars(args), "params": params, "rows": rows, "checkpoints": per_ckpt}, f, indent=2)
    print(f"\n(JSON: {out})")


if __name__ == "__main__":
    main()
