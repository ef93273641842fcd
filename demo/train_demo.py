#!/usr/bin/env python3
"""ckptfs demo: train a tiny PyTorch model, save checkpoints (model + AdamW
state) with torch.save into a ckptfs mount, reload the last one, verify it,
and show logical vs stored bytes.

Run it through scripts/demo.sh (which builds ckptfs and mounts ./checkpoints),
or by hand:  .venv-debian/bin/python demo/train_demo.py --dir ./checkpoints
"""
import argparse
import json
import os
import subprocess
import sys
import time

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CKPTFS = os.environ.get("CKPTFS_BIN", os.path.join(ROOT, "build", "ckptfs"))


def human(n):
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.1f} {unit}" if unit != "B" else f"{n} B"
        n /= 1024


def stats_json(path):
    p = subprocess.run([CKPTFS, "stats", "--json", path], capture_output=True, text=True)
    if p.returncode != 0:
        sys.exit(f"ckptfs stats failed ({p.returncode}): {p.stderr.strip()}")
    return json.loads(p.stdout)


def wait_sealed(path, timeout=120):
    deadline = time.monotonic() + timeout
    while True:
        st = stats_json(path)
        if not any(f.get("staged") for f in st["files"]):
            return st
        if time.monotonic() > deadline:
            print("warning: some files are still being sealed; numbers are provisional")
            return st
        time.sleep(0.2)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dir", default=os.path.join(ROOT, "checkpoints"),
                    help="checkpoint directory (a ckptfs mountpoint)")
    ap.add_argument("--checkpoints", type=int, default=5)
    ap.add_argument("--steps-between", type=int, default=20)
    ap.add_argument("--hidden", type=int, default=384)
    args = ap.parse_args()

    run_dir = os.path.join(args.dir, "demo-run")
    os.makedirs(run_dir, exist_ok=True)
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(1, args.hidden), torch.nn.Tanh(),
        torch.nn.Linear(args.hidden, args.hidden), torch.nn.Tanh(),
        torch.nn.Linear(args.hidden, args.hidden), torch.nn.Tanh(),
        torch.nn.Linear(args.hidden, 1),
    )
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=1e-4)
    n_params = sum(p.numel() for p in model.parameters())
    print(f"model: {n_params:,} parameters; task: fit y = sin(3x) on [-2, 2]")

    step = 0
    last_path, last_state = None, None
    for k in range(1, args.checkpoints + 1):
        for _ in range(args.steps_between):
            x = torch.rand(64, 1) * 4 - 2
            loss = (model(x) - torch.sin(3 * x)).pow(2).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
            step += 1
        path = os.path.join(run_dir, f"ckpt-step{step:05d}.pt")
        state = {"model": model.state_dict(), "optim": opt.state_dict(), "step": step,
                 "loss": loss.item()}
        t0 = time.perf_counter()
        tmp = path + ".tmp"
        torch.save(state, tmp)
        os.replace(tmp, path)  # atomic replace, as training loops usually do
        dt = time.perf_counter() - t0
        print(f"step {step:5d}  loss {loss.item():.5f}  saved {os.path.basename(path)} "
              f"({human(os.path.getsize(path))}, {dt * 1000:.0f} ms)")
        last_path = path
        last_state = {"model": {n: t.clone() for n, t in state["model"].items()},
                      "optim": opt.state_dict()}

    # reload the last checkpoint and compare every tensor
    loaded = torch.load(last_path, map_location="cpu")
    bad = []
    for name, t in last_state["model"].items():
        if not torch.equal(t, loaded["model"][name]):
            bad.append(f"model.{name}")
    for idx, s in last_state["optim"]["state"].items():
        for key, t in s.items():
            other = loaded["optim"]["state"][idx][key]
            if isinstance(t, torch.Tensor) and not torch.equal(t, other):
                bad.append(f"optim.state[{idx}].{key}")
    if bad or loaded["step"] != step:
        sys.exit(f"VERIFY FAILED: {bad[:10]} step={loaded['step']}")
    n_tensors = len(last_state["model"]) + sum(len(s) for s in last_state["optim"]["state"].values())
    print(f"reloaded {os.path.basename(last_path)}: all {n_tensors} tensors identical (torch.equal)")

    # logical vs stored, once the background sealing (compression) is done
    st = wait_sealed(args.dir)
    print()
    print(f"$ ckptfs stats {args.dir}")
    sys.stdout.flush()
    subprocess.run([CKPTFS, "stats", args.dir], check=False)
    tot = st["total"]
    if tot["stored"]:
        print(f"\nlogical {human(tot['logical'])} -> stored {human(tot['stored'])} "
              f"({tot['logical'] / tot['stored']:.2f}x)")


if __name__ == "__main__":
    main()
