"""A multi-process torch.distributed.checkpoint save and load (torch 2.x, gloo,
CPU), each rank through a directory of its own: on a ckptfs cluster, rank r
passes node r's mount path of the same checkpoint directory.

    dcp_cluster.py save STEP DIR_0 DIR_1 ... DIR_{W-1}   world size W, rank r writes through DIR_r
    dcp_cluster.py load STEP DIR_0 ... DIR_{W-1}         world size W, rank r reads through DIR_r
    dcp_cluster.py                                       the same commands, one per line on stdin

(Without arguments torch is imported once for all the commands a test
sends; each command forks its ranks.)

The state dict holds DTensors sharded by rows over a 1-D CPU device mesh,
with row counts no world size divides, so a load at another world size
reshards: every loading rank reads slices of several saving ranks' files.
The values are a function of the tensor's name and STEP (each step moves the
weights a little, as a training step does), so a load checks every element
bit for bit against what that step saved. Prints one JSON line:
{"ok": true, "files": {NAME: sha256}} (the files of the checkpoint directory,
hashed through rank 0's directory after the save or load) per command, or
{"ok": false, "error": ...} (and a single command exits non-zero).
"""
from __future__ import annotations

import datetime
import hashlib
import json
import os
import socket
import sys
import time
import traceback
import warnings

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
import torch.multiprocessing as mp
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import Shard, distribute_tensor

warnings.filterwarnings("ignore")

# name -> (rows, cols, dtype); no row count is a multiple of 2 or 3
TENSORS = {
    "layers.0.attn.weight": (1001, 512, torch.float32),
    "layers.0.mlp.weight": (1537, 512, torch.float32),
    "layers.1.attn.weight": (1001, 512, torch.float32),
    "layers.1.mlp.weight": (1537, 512, torch.bfloat16),
    "optim.layers.0.mlp.exp_avg": (1537, 512, torch.float32),
    "optim.layers.0.mlp.exp_avg_sq": (1537, 512, torch.float32),
    "embed.weight": (773, 512, torch.float32),
}
BITS = {torch.float32: torch.int32, torch.bfloat16: torch.int16}


def full_value(name: str, step: int) -> torch.Tensor:
    rows, cols, dtype = TENSORS[name]
    seed = int.from_bytes(hashlib.sha256(name.encode()).digest()[:4], "little")
    g = torch.Generator().manual_seed(seed)
    base = torch.randn(rows, cols, generator=g) * 0.02
    drift = torch.randn(rows, cols, generator=g) * 1e-4
    if "exp_avg_sq" in name:
        base, drift = base.abs() * 1e-3, drift.abs() * 1e-6
    return (base + step * drift).to(dtype)


def sha_dir(d: str) -> dict:
    out = {}
    for n in sorted(os.listdir(d)):
        h = hashlib.sha256()
        with open(os.path.join(d, n), "rb") as f:
            while b := f.read(1 << 20):
                h.update(b)
        out[n] = h.hexdigest()
    return out


def worker(rank: int, world: int, port: int, mode: str, step: int, dirs: list[str], result):
    try:
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world,
                                timeout=datetime.timedelta(seconds=300))
        mesh = init_device_mesh("cpu", (world,))
        if mode == "save":
            state = {n: distribute_tensor(full_value(n, step), mesh, [Shard(0)]) for n in TENSORS}
            state["step"] = torch.tensor([step])
            dcp.save(state, storage_writer=dcp.FileSystemWriter(dirs[rank]))
        else:
            state = {n: distribute_tensor(torch.zeros(TENSORS[n][:2], dtype=TENSORS[n][2]), mesh, [Shard(0)])
                     for n in TENSORS}
            state["step"] = torch.tensor([-1])
            dcp.load(state, storage_reader=dcp.FileSystemReader(dirs[rank]))
            if int(state["step"]) != step:
                raise AssertionError(f"rank {rank}: step {int(state['step'])} loaded, {step} saved")
            for n in TENSORS:
                got, want = state[n].full_tensor(), full_value(n, step)
                bits = BITS[want.dtype]
                if not torch.equal(got.view(bits), want.view(bits)):
                    bad = (got.view(bits) != want.view(bits)).sum().item()
                    raise AssertionError(f"rank {rank}: {n} differs from step {step}'s in {bad} elements")
        dist.barrier()
        if rank == 0:
            result.put({"ok": True, "files": sha_dir(dirs[0])})
        dist.destroy_process_group()
    except BaseException:
        result.put({"ok": False, "rank": rank, "error": traceback.format_exc()})
        raise


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run(mode: str, step: int, dirs: list[str]) -> dict:
    assert mode in ("save", "load") and dirs, __doc__
    ctx = mp.get_context("fork")  # the children share the parent's imported torch: no second import
    result = ctx.Queue()
    world = len(dirs)
    port = free_port()
    procs = [ctx.Process(target=worker, args=(r, world, port, mode, step, dirs, result)) for r in range(world)]
    for p in procs:
        p.start()
    # A rank that fails leaves the others waiting in a collective: end them.
    while any(p.exitcode is None for p in procs):
        if any(p.exitcode for p in procs):
            time.sleep(2)
            for p in procs:
                if p.exitcode is None:
                    p.kill()
        time.sleep(0.05)
    for p in procs:
        p.join()
    reports = []
    while not result.empty():
        reports.append(result.get())
    failed = [r for r in reports if not r["ok"]]
    codes = [p.exitcode for p in procs]
    if failed or any(codes) or not reports:
        errors = "".join(f"rank {r['rank']} failed:\n{r['error']}\n" for r in failed)
        return {"ok": False, "error": f"{errors}{mode} step {step}: exit codes {codes}"}
    return reports[0]


def main():
    if len(sys.argv) > 1:
        rep = run(sys.argv[1], int(sys.argv[2]), sys.argv[3:])
        print(json.dumps(rep), flush=True)
        sys.exit(0 if rep["ok"] else 1)
    for line in sys.stdin:
        if line.strip():
            mode, step, *dirs = line.split()
            print(json.dumps(run(mode, int(step), dirs)), flush=True)


if __name__ == "__main__":
    main()
