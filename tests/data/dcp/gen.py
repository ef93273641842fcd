# Regenerates the DCP save used by tests/unit/dcp_labels_test.cc:
#   python gen.py   (torch 2.x; written with 2.15)
# adam/: a two-layer model and its Adam state (FQN-keyed, as get_state_dict
# gives it), saved by torch.distributed.checkpoint in one process: one shard
# (__0_0.distcp) holding bare tensors in size order, and .metadata naming them.
import os
import shutil
import warnings

import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import get_state_dict

warnings.filterwarnings("ignore", message=".*single process.*")
here = os.path.join(os.path.dirname(os.path.abspath(__file__)), "adam")
shutil.rmtree(here, ignore_errors=True)
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Linear(16, 8))
opt = torch.optim.Adam(model.parameters(), lr=1e-2)
for _ in range(2):
    loss = model(torch.randn(4, 8)).pow(2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
msd, osd = get_state_dict(model, opt)
dcp.save({"model": msd, "optim": osd}, checkpoint_id=here)
