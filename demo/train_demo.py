#!/usr/bin/env python3
"""ckptfs demo: two training runs of a small PyTorch model (seeds 0 and 1)
save checkpoints (model + AdamW state, torch.save) into one ckptfs mount:
one into a lossless directory, one into a `lossy` directory (policy
lossy=0.05, set with the Python package). Then it restores the last
checkpoint of each, prints a side-by-side table of logical and stored bytes
per checkpoint (the first stored on its own, the next ones as deltas
against a predecessor), the ratios and the loss of each model as trained
and as restored, and writes an HTML report.

Two runs rather than one saved twice: identical bytes in both directories
would be stored once (deduplicated), and the lossy copies would be coded
against the lossless ones.

Run it through scripts/demo.sh (which builds ckptfs and mounts ./checkpoints),
or by hand:  .venv-debian/bin/python demo/train_demo.py --dir ./checkpoints
"""
from __future__ import annotations

import argparse
import math
import os
import shutil
import sys
import time

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "python"))  # the ckptfs package, without installing it

import ckptfs  # noqa: E402
from ckptfs._report import human  # noqa: E402


def make_model(hidden: int) -> torch.nn.Module:
    return torch.nn.Sequential(
        torch.nn.Linear(1, hidden), torch.nn.Tanh(),
        torch.nn.Linear(hidden, hidden), torch.nn.Tanh(),
        torch.nn.Linear(hidden, hidden), torch.nn.Tanh(),
        torch.nn.Linear(hidden, 1),
    )


def make_optimizer(model: torch.nn.Module, lr: float) -> torch.optim.Optimizer:
    return torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=1e-4)


def batch(n: int = 64) -> tuple[torch.Tensor, torch.Tensor]:
    x = torch.rand(n, 1) * 4 - 2
    return x, torch.sin(3 * x)


EVAL_X = torch.linspace(-2, 2, 1001).unsqueeze(1)


def eval_loss(model: torch.nn.Module) -> float:
    with torch.no_grad():
        return (model(EVAL_X) - torch.sin(3 * EVAL_X)).pow(2).mean().item()


def save(state: dict, path: str) -> None:
    tmp = path + ".tmp"
    torch.save(state, tmp)
    os.replace(tmp, path)  # atomic replace, as training loops usually do


def train(args, directory: str, seed: int) -> tuple[list[str], torch.nn.Module]:
    """One training run (cosine learning-rate schedule) that saves a
    checkpoint into `directory` every --steps-between steps from step
    --first-save on. Returns the file names and the trained model."""
    torch.manual_seed(seed)
    model = make_model(args.hidden)
    opt = make_optimizer(model, args.lr)
    total = args.first_save + (args.checkpoints - 1) * args.steps_between
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 0.5 * (1 + math.cos(math.pi * s / total)))
    names = []
    for step in range(1, total + 1):
        x, y = batch()
        loss = (model(x) - y).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        sched.step()
        if step < args.first_save or (step - args.first_save) % args.steps_between:
            continue
        name = f"ckpt-step{step:05d}.pt"
        path = os.path.join(directory, name)
        save({"model": model.state_dict(), "optim": opt.state_dict(), "sched": sched.state_dict(),
              "step": step}, path)
        print(f"  {os.path.basename(directory):>8}  step {step:4d}  lr {sched.get_last_lr()[0]:.1e}  "
              f"train loss {loss.item():.5f}  saved {name} ({human(os.path.getsize(path))})")
        names.append(name)
    return names, model


def restore(path: str, hidden: int) -> torch.nn.Module:
    model = make_model(hidden)
    model.load_state_dict(torch.load(path, map_location="cpu")["model"])
    return model


def weight_error(a: torch.nn.Module, b: torch.nn.Module) -> float:
    """Relative L2 error of b's parameters against a's."""
    num = sum((pa - pb).pow(2).sum().item() for pa, pb in zip(a.parameters(), b.parameters()))
    den = sum(pa.pow(2).sum().item() for pa in a.parameters())
    return math.sqrt(num / den)


def stored_as(f: ckptfs.FileStats) -> str:
    if f.base:
        base = os.path.basename(f.base)[5:-3]  # ckpt-step00100.pt -> step00100
        same_dir = os.path.dirname(f.base) == f.directory
        return f"delta vs {base}" if same_dir else f"delta vs {os.path.basename(os.path.dirname(f.base))}/{base}"
    return "on its own" if f.sealed else "staged"


def print_table(names: list[str], lossless: ckptfs.Stats, lossy: ckptfs.Stats, fidelity: float) -> str:
    head = (f"{'checkpoint':<18} {'logical':>9} | {'lossless':>9} {'ratio':>6} {'stored as':<18} | "
            f"{f'lossy={fidelity:g}':>10} {'ratio':>7} {'stored as':<18} {'w error':>7}")
    rule = "-" * len(head)
    print(head)
    print(rule)
    for name in names:
        a, b = lossless.file(name), lossy.file(name)
        w = b.lossy.roles.get("weights") if b.lossy else None
        print(f"{name:<18} {human(a.logical):>9} | {human(a.stored):>9} {a.ratio:>5.2f}x {stored_as(a):<18} | "
              f"{human(b.stored):>10} {b.ratio:>6.1f}x {stored_as(b):<18} {w.error if w else 0:>7.4f}")
    print(rule)
    print(f"{'total':<18} {human(lossless.logical):>9} | {human(lossless.stored):>9} {lossless.ratio:>5.2f}x "
          f"{'':<18} | {human(lossy.stored):>10} {lossy.ratio:>6.1f}x")
    return rule


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dir", default=os.path.join(ROOT, "checkpoints"),
                    help="checkpoint directory (inside a ckptfs mount)")
    ap.add_argument("--checkpoints", type=int, default=8)
    ap.add_argument("--steps-between", type=int, default=10)
    ap.add_argument("--first-save", type=int, default=100, help="the step of the first checkpoint")
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--fidelity", type=float, default=0.05, help="of the lossy directory's policy")
    ap.add_argument("--report", default=os.path.join(ROOT, "ckptfs-report.html"), help="HTML report to write")
    args = ap.parse_args()

    if not ckptfs.is_mounted(args.dir):
        sys.exit(f"{args.dir} is not inside a ckptfs mount (run scripts/demo.sh, or `ckptfs mount STORE DIR`)")
    run = os.path.join(args.dir, "demo-run")
    shutil.rmtree(run, ignore_errors=True)  # a rerun starts a fresh series
    lossless_dir, lossy_dir = os.path.join(run, "lossless"), os.path.join(run, "lossy")
    os.makedirs(lossless_dir)
    os.makedirs(lossy_dir)
    policy = ckptfs.set_policy(lossy_dir, lossy=args.fidelity)
    print(f"policies: {lossless_dir}: {ckptfs.get_policy(lossless_dir).text}; {lossy_dir}: {policy.text}")

    n_params = sum(p.numel() for p in make_model(args.hidden).parameters())
    print(f"two training runs (seeds 0 and 1): {n_params:,} parameters, AdamW, cosine schedule from "
          f"lr {args.lr:g}; task: fit y = sin(3x) on [-2, 2]")
    names, exact_model = train(args, lossless_dir, seed=0)
    _, lossy_model = train(args, lossy_dir, seed=1)

    t0 = time.perf_counter()
    ckptfs.wait_sealed(run, timeout=120)
    print(f"all checkpoints sealed {time.perf_counter() - t0:.1f} s after the last save")
    lossless, lossy = ckptfs.stats(lossless_dir), ckptfs.stats(lossy_dir)
    # Restore the last checkpoint of each run into a fresh model.
    exact_restored = restore(os.path.join(lossless_dir, names[-1]), args.hidden)
    lossy_restored = restore(os.path.join(lossy_dir, names[-1]), args.hidden)
    if not all(torch.equal(a, b) for a, b in zip(exact_model.state_dict().values(),
                                                 exact_restored.state_dict().values())):
        sys.exit("VERIFY FAILED: the lossless checkpoint does not restore the model bit for bit")
    print()
    rule = print_table(names, lossless, lossy, args.fidelity)
    print(f"{'final eval loss, trained':<30} | {eval_loss(exact_model):>9.5f}{'':<27} | {eval_loss(lossy_model):>10.5f}")
    print(f"{'final eval loss, restored':<30} | {eval_loss(exact_restored):>9.5f} (bit for bit){'':<14} | "
          f"{eval_loss(lossy_restored):>10.5f} (weights within {weight_error(lossy_model, lossy_restored):.3f} "
          f"relative L2)")
    print(rule)
    both = ckptfs.stats(run)
    print(f"both runs: {human(both.logical)} written, {human(both.stored)} stored ({both.ratio:.2f}x)")
    out = ckptfs.report(run, args.report, title="ckptfs demo: a lossless and a lossy checkpoint series",
                        stats=both)
    print(f"report: {out}")


if __name__ == "__main__":
    main()
