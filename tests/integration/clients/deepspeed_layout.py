"""DeepSpeed's checkpoint layout written by 8 ranks at once, each through the
mount of its own node, and `latest` written last by rank 0.

Reads lines `STEP ROOT_0 ... ROOT_7` on stdin (ROOT_r: the mount rank r
writes through; the same store seen from different nodes). For each, every
rank (a forked process) writes, concurrently with the others,
    ROOT_r/global_stepSTEP/mp_rank_{r:02d}_model_states.pt
    ROOT_r/global_stepSTEP/zero_pp_rank_{r}_mp_rank_00_optim_states.pt
with torch.save, as DeepSpeed does with tensor parallelism 8 and ZeRO; after
every rank has closed its files, rank 0 writes ROOT_0/latest
("global_stepSTEP"). Answers one JSON line per command:
{"ok": true, "files": {RELPATH: sha256}} of the rank files.
"""
from __future__ import annotations

import hashlib
import io
import json
import multiprocessing as mp
import os
import sys
import traceback

import torch

HIDDEN = 256


def rank_states(rank: int, step: int) -> tuple[dict, dict]:
    g = torch.Generator().manual_seed(1000 * rank + 1)
    shapes = {"attn.qkv.weight": (3 * HIDDEN // 8, HIDDEN), "attn.out.weight": (HIDDEN, HIDDEN // 8),
              "mlp.fc1.weight": (4 * HIDDEN // 8, HIDDEN), "mlp.fc2.weight": (HIDDEN, 4 * HIDDEN // 8)}
    module = {}
    for layer in range(4):
        for name, shape in shapes.items():
            w = torch.randn(shape, generator=g) * 0.02
            module[f"layers.{layer}.{name}"] = w + step * 1e-4 * torch.randn(shape, generator=g)
    model = {"module": module, "global_steps": step, "mp_world_size": 8, "dp_world_size": 1}
    flat = torch.cat([t.flatten() for t in module.values()])
    optim = {"optimizer_state_dict": {"state": {0: {"exp_avg": flat * 0.1, "exp_avg_sq": flat.square() * 1e-3,
                                                     "step": torch.tensor(float(step))}},
                                      "param_groups": [{"lr": 1e-4, "betas": (0.9, 0.95), "params": [0]}]},
             "fp32_flat_groups": [flat.clone()], "zero_stage": 1, "partition_count": 8}
    return model, optim


def write(path: str, obj) -> str:
    buf = io.BytesIO()
    torch.save(obj, buf)
    data = buf.getvalue()
    with open(path, "wb") as f:
        f.write(data)
    return hashlib.sha256(data).hexdigest()


def rank_main(rank: int, step: int, root: str, out):
    try:
        d = os.path.join(root, f"global_step{step}")
        os.makedirs(d, exist_ok=True)  # every rank, concurrently, through its own node
        model, optim = rank_states(rank, step)
        files = {}
        for name, obj in ((f"mp_rank_{rank:02d}_model_states.pt", model),
                          (f"zero_pp_rank_{rank}_mp_rank_00_optim_states.pt", optim)):
            files[f"global_step{step}/{name}"] = write(os.path.join(d, name), obj)
        out.put({"ok": True, "files": files})
    except BaseException:
        out.put({"ok": False, "error": f"rank {rank}:\n{traceback.format_exc()}"})


def save(step: int, roots: list[str]) -> dict:
    ctx = mp.get_context("fork")
    out = ctx.Queue()
    procs = [ctx.Process(target=rank_main, args=(r, step, roots[r], out)) for r in range(len(roots))]
    for p in procs:
        p.start()
    reports = [out.get(timeout=600) for _ in procs]
    for p in procs:
        p.join()
    failed = [r["error"] for r in reports if not r["ok"]]
    if failed:
        return {"ok": False, "error": "\n".join(failed)}
    with open(os.path.join(roots[0], "latest"), "w") as f:
        f.write(f"global_step{step}")
    return {"ok": True, "files": {k: v for r in reports for k, v in r["files"].items()}}


def main():
    for line in sys.stdin:
        if not line.strip():
            continue
        step, *roots = line.split()
        try:
            rep = save(int(step), roots)
        except Exception:
            rep = {"ok": False, "error": traceback.format_exc()}
        print(json.dumps(rep), flush=True)


if __name__ == "__main__":
    main()
