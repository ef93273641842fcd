"""torch.distributed.checkpoint client (torch 2.x): dcp.save of a model and
AdamW state (fp32, bf16, fp16) into a directory in the mount, in a single
process without a process group, and dcp.load back into fresh objects.
See common.py for the protocol."""
from __future__ import annotations

import copy
import os
import sys
import warnings

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import Client, check, inspect_dtype, special_floats, tensors_in  # noqa: E402

import torch  # noqa: E402
import torch.distributed.checkpoint as dcp  # noqa: E402
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict  # noqa: E402

# "torch.distributed is disabled, unavailable or uninitialized, assuming the
# intent is to save in a single process": exactly the case under test.
warnings.filterwarnings("ignore", message=".*assuming the intent is to .* in a single process.*")

DTYPES = [torch.float32, torch.bfloat16, torch.float16]


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fp32 = torch.nn.Sequential(torch.nn.Linear(128, 256), torch.nn.GELU(), torch.nn.Linear(256, 64))
        self.bf16 = torch.nn.Linear(128, 192).to(torch.bfloat16)
        self.fp16 = torch.nn.Linear(128, 96).to(torch.float16)

    def forward(self, x):
        return (self.fp32(x).sum() + self.bf16(x.bfloat16()).float().sum()
                + self.fp16(x.half()).float().sum())


def trained(seed, steps):
    torch.manual_seed(seed)
    model = Net()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    for _ in range(steps):
        loss = model(torch.randn(4, 128)).pow(2)
        opt.zero_grad()
        loss.backward()
        opt.step()
    return model, opt


def app_state(model, opt):
    msd, osd = get_state_dict(model, opt)
    return {"model": msd, "optim": osd,
            "extra": {f"special_{str(d).removeprefix('torch.')}": special_floats(d) for d in DTYPES}}


def main():
    c = Client()
    model, opt = trained(seed=0, steps=3)
    saved = app_state(model, opt)
    # deep copy: what the loads must give back, whatever happens to model/opt
    expect = copy.deepcopy(saved)
    for root in (c.mnt, c.ref):
        dcp.save(saved, checkpoint_id=str(root / "dcp" / "step3"))
    tensors = list(tensors_in(saved))
    nbytes = sum(t.numel() * t.element_size() for t in tensors)
    dtypes = sorted({inspect_dtype(t.dtype) for t in tensors})
    names = sorted(os.listdir(c.mnt / "dcp" / "step3"))
    check(names == sorted(os.listdir(c.ref / "dcp" / "step3")), f"dcp wrote {names} into the mount")
    check(".metadata" in names and any(n.endswith(".distcp") for n in names), f"dcp wrote {names}")
    for n in names:
        rel = f"dcp/step3/{n}"
        if n.endswith(".distcp"):
            # single process: one data file with every tensor
            c.record(rel, ref=True, tensor_bytes=nbytes, dtypes=dtypes)
        else:
            c.record(rel, ref=False)  # .metadata pickles a fresh save id

    def load(when):
        fresh, fresh_opt = trained(seed=1, steps=1)  # different values, same structure
        state = app_state(fresh, fresh_opt)
        check(any(not torch.equal(a, b) for a, b in zip(tensors_in(state["model"]), tensors_in(expect["model"]))),
              "the fresh model already equals the saved one")
        dcp.load(state, checkpoint_id=str(c.mnt / "dcp" / "step3"))
        c.compare(expect, state, f"{when}:dcp.load")
        set_state_dict(fresh, fresh_opt, model_state_dict=state["model"], optim_state_dict=state["optim"])
        c.compare(expect["model"], dict(fresh.state_dict()), f"{when}:model after set_state_dict")
        # and training continues from the restored state
        fresh(torch.randn(2, 128)).pow(2).backward()
        fresh_opt.step()

    c.run(load)


if __name__ == "__main__":
    main()
