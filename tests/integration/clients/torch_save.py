"""PyTorch 2.x client: torch.save / torch.load of model state_dicts plus AdamW
state in fp32, bf16 and fp16, as a zip archive (also loaded with mmap=True)
and in the legacy format. See common.py for the protocol."""
from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import Client, check, special_floats, torch_shapes, torch_storages  # noqa: E402

import torch  # noqa: E402


def build(dtype):
    model = torch.nn.Sequential(
        torch.nn.Linear(256, 512), torch.nn.GELU(),
        torch.nn.Linear(512, 512), torch.nn.LayerNorm(512),
        torch.nn.Linear(512, 256),
    ).to(dtype)
    return model, torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.01)


def train(dtype, seed, steps=3):
    torch.manual_seed(seed)
    model, opt = build(dtype)
    for _ in range(steps):
        x = torch.randn(8, 256, dtype=dtype)
        loss = (model(x).float() - x.float()).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    return model.state_dict(), opt.state_dict()


def make_checkpoint():
    ckpt = {"step": 3, "note": "ckptfs client test", "special": {}}
    for i, dt in enumerate([torch.float32, torch.bfloat16, torch.float16]):
        name = str(dt).removeprefix("torch.")
        model, optim = train(dt, seed=i)
        ckpt[f"model_{name}"] = model
        ckpt[f"optim_{name}"] = optim
        ckpt["special"][name] = special_floats(dt)
    ckpt["special"]["int64"] = torch.arange(-5, 100, dtype=torch.int64)
    ckpt["special"]["bool"] = torch.tensor([True, False, True])
    # a view: torch.save writes the whole storage, the view keeps its offset
    base = torch.randn(64, 64)
    ckpt["view"] = base[3:7, 10:20]
    return ckpt


def main():
    c = Client()
    ckpt = make_checkpoint()
    nbytes, dtypes = torch_storages(ckpt)
    files = {
        "torch-zip/ckpt-step3.pt": {},
        "torch-legacy/ckpt-step3.pt": {"_use_new_zipfile_serialization": False},
    }
    for rel, kw in files.items():
        for root in (c.mnt, c.ref):
            os.makedirs(root / os.path.dirname(rel), exist_ok=True)
            torch.save(ckpt, root / rel, **kw)
        c.record(rel, ref=True, tensor_bytes=nbytes, dtypes=dtypes, shapes=torch_shapes(ckpt))

    def load_all(when):
        for rel in files:
            got = torch.load(c.mnt / rel, map_location="cpu")  # weights_only=True is the 2.x default
            c.compare(ckpt, got, f"{when}:{rel}")
            check(got["view"].storage_offset() == ckpt["view"].storage_offset(), f"{rel}: view offset")
            del got
        # mmap=True maps the zip archive's storages from the file in the mount
        got = torch.load(c.mnt / "torch-zip/ckpt-step3.pt", mmap=True, map_location="cpu")
        c.compare(ckpt, got, f"{when}:mmap")
        del got
        # the training loop's way back: into a fresh model and optimizer
        got = torch.load(c.mnt / "torch-zip/ckpt-step3.pt")
        for name in ("float32", "bfloat16", "float16"):
            model, opt = build(getattr(torch, name))
            model.load_state_dict(got[f"model_{name}"])
            opt.load_state_dict(got[f"optim_{name}"])
            c.compare(ckpt[f"model_{name}"], model.state_dict(), f"{when}:resumed model_{name}")
            c.compare(ckpt[f"optim_{name}"]["state"], opt.state_dict()["state"], f"{when}:resumed optim_{name}")
        del got

    c.run(load_all)


if __name__ == "__main__":
    main()
