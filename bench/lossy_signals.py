#!/usr/bin/env python3
"""What a checkpoint series shows about its own tolerance (issue 41).

Trains a lossy_accuracy.py workload through its protocol (no restores, no
mount) and, at each of the 20 checkpoints, measures in the one-step measure's
metric (docs/LOSSY.md: Fisher energy, s = v + 0.01 mean(v)):

  k        steps since the previous checkpoint (the `step` tensors' gap);
  lr       the learning rate in param_groups;
  snr      sum m^2 / sum v (bias-corrected): Adam's gradient signal-to-noise;
  c_diff   sqrt(k * noise / step): the minibatch diffusion between two saves
           in steps (noise: the Fisher energy of one step's gradient noise,
           lr^2 (v - m^2)/v per element);
  c_drift  the weights' actual move since the previous checkpoint, in steps;
  c_rel    the budget, in steps, that a relative error of 5% gives.

  .venv-pypi/bin/python bench/lossy_signals.py --workloads A,B,C,D --seed 1 --schedule linear
"""
import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import lossy_accuracy as LA  # noqa: E402
import torch  # noqa: E402

FLOOR = 0.01


def adam_moments(tr):
    """[(w, m_hat, v_hat, lr, eps)] per parameter with Adam state."""
    out = []
    for group in tr.opt.param_groups:
        b1, b2 = group.get("betas", (0.9, 0.999))
        for p in group["params"]:
            st = tr.opt.state.get(p, {})
            if "exp_avg_sq" not in st:
                continue
            t = float(st["step"])
            m = st["exp_avg"].double() / (1 - b1 ** t)
            v = st["exp_avg_sq"].double() / (1 - b2 ** t)
            out.append((p.detach().double().clone(), m, v, group["lr"], group["eps"]))
    return out


def signals(now, before, k):
    step = noise = drift = wenergy = secant = vdw = progress = 0.0
    for i, (w, m, v, lr, eps) in enumerate(now):
        s = v + FLOOR * v.mean()
        d = (v.sqrt() + eps) ** 2
        step += float((s * lr * lr * m * m / d).sum())
        noise += float((s * lr * lr * (v - m * m).clamp(min=0) / d).sum())
        wenergy += float((s * w * w).sum())
        if before is not None:
            dw = w - before[i][0]
            drift += float((s * dw ** 2).sum())
            secant += float(((m - before[i][1]) * dw).sum())
            vdw += float((v * dw ** 2).sum())
            progress -= float((0.5 * (m + before[i][1]) * dw).sum())
    msum = sum(float((m * m).sum()) for _, m, _, _, _ in now)
    vsum = sum(float(v.sum()) for _, _, v, _, _ in now)
    return {"k": k, "lr": now[0][3], "snr": msum / vsum if vsum else 0,
            "c_diff": (k * noise / step) ** 0.5 if step else 0,
            "c_drift": (drift / step) ** 0.5 if step and before is not None else 0,
            "c_rel": 0.05 * (wenergy / step) ** 0.5 if step else 0,
            # The loss's curvature along the move since the previous save, in
            # units of v (the secant of the bias-corrected first moment), the
            # first-order loss decrease of that move, and the budget in steps
            # whose immediate loss, 1/2 b_eff sum v dw^2, equals that decrease.
            "b_eff": secant / vdw if vdw else 0, "progress": progress,
            "c_prog": (2 * progress / (secant / vdw * step)) ** 0.5 if vdw and secant > 0 and progress > 0 else 0}


def run(key, args):
    size = "quick" if args.quick else "full"
    warmup = args.warmup or LA.WARMUP[size][key]
    steps = args.steps or LA.STEPS[size][key]
    wl = LA.WORKLOADS[key](LA.SIZES[size][key], warmup, steps)
    tr = LA.make_trainer(wl)
    every = steps // LA.CHECKPOINTS
    rows, before = [], None
    for i in range(warmup + steps):
        tr.step(i)
        done = i + 1 - warmup
        if done > 0 and done % every == 0:
            now = adam_moments(tr)
            if not now:
                break
            rows.append(signals(now, before, every))
            rows[-1]["val"] = wl.evaluate(tr.model)["val_loss"]
            before = now
    return rows


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--workloads", default="A,B,C,D")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--schedule", default="linear")
    ap.add_argument("--warmup", type=int)
    ap.add_argument("--steps", type=int)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "out", "lossy_signals.json"))
    args = ap.parse_args()
    LA.RUN.update(seed=args.seed, schedule=args.schedule)
    torch.set_num_threads(1)
    result = {}
    for key in args.workloads.split(","):
        rows = run(key, args)
        result[key] = rows
        print(f"## {key} (seed {args.seed}, {args.schedule})")
        print("| ckpt | k | lr | snr | c_diff | c_drift | c_rel(5%) | b_eff | progress | c_prog | val |")
        print("|---|---|---|---|---|---|---|---|---|---|---|")
        for j, r in enumerate(rows):
            print(f"| {j + 1} | {r['k']} | {r['lr']:.2e} | {r['snr']:.3f} | {r['c_diff']:.2f} | "
                  f"{r['c_drift']:.2f} | {r['c_rel']:.2f} | {r['b_eff']:.3g} | {r['progress']:.3g} | {r['c_prog']:.2f} | "
                  f"{r['val']:.4f} |", flush=True)
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
