"""The PyTorch Lightning recipe of docs/RECIPES.md: a small LightningModule
(an MLP classifier with Adam) trained 3 epochs on the CPU with
ModelCheckpoint(save_top_k=2, monitor="step", mode="max", every_n_epochs=1,
save_last=True) writing into MNT_DIR/checkpoints, then resumed with
Trainer.fit(ckpt_path=...) after the test sealed and remounted.

`python lightning_ckpt.py MNT_DIR REF_DIR lossless|lossy`:
- lossless: every kept checkpoint loads equal, bit for bit, to the state the
  module's on_save_checkpoint saw; resuming from the epoch-1 checkpoint
  loads that state bit for bit and trains epoch 2 to the same weights.
- lossy (the test set user.ckptfs.policy on MNT_DIR): the checkpoints load,
  their weights close to what was saved but not all equal; resuming loads
  the reconstruction bit for bit and trains two more epochs.
The last loss of each run is printed as {"phase": "loss", ...}.
See common.py for the protocol."""
from __future__ import annotations

import copy
import json
import logging
import os
import sys
import warnings

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import Client, check, torch_storages  # noqa: E402

import lightning as L  # noqa: E402
import torch  # noqa: E402
from lightning.pytorch.callbacks import ModelCheckpoint  # noqa: E402

warnings.filterwarnings("ignore", ".*does not have many workers.*")
warnings.filterwarnings("ignore", ".*Checkpoint directory .* exists and is not empty.*")
logging.getLogger("lightning.pytorch").setLevel(logging.ERROR)

EPOCHS = 3
KEPT = ["epoch=1-step=16.ckpt", "epoch=2-step=24.ckpt", "last.ckpt"]


def dataset():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(512, 64, generator=g)
    y = (x @ torch.randn(64, 8, generator=g)).argmax(dim=1)
    return torch.utils.data.TensorDataset(x, y)


class Classifier(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Linear(64, 512), torch.nn.ReLU(), torch.nn.Linear(512, 512),
                                       torch.nn.ReLU(), torch.nn.Linear(512, 8))
        self.saved: dict[int, dict] = {}  # global_step -> the checkpoint dict as saved
        self.loaded = None  # set: compare the state at the start of fit with it
        self.losses: list[float] = []

    def training_step(self, batch, _):
        x, y = batch
        loss = torch.nn.functional.cross_entropy(self.net(x), y)
        self.losses.append(loss.item())
        return loss

    def configure_optimizers(self):
        return torch.optim.Adam(self.parameters(), lr=1e-3)

    def train_dataloader(self):
        return torch.utils.data.DataLoader(dataset(), batch_size=64, shuffle=False)

    def on_save_checkpoint(self, checkpoint):
        self.saved[checkpoint["global_step"]] = copy.deepcopy(
            {k: checkpoint[k] for k in ("state_dict", "optimizer_states", "epoch", "global_step")})

    def on_train_start(self):
        if self.loaded is not None:
            self.loaded(self)


def trainer(root, max_epochs) -> L.Trainer:
    ckpt = ModelCheckpoint(dirpath=root / "checkpoints", filename="{epoch}-{step}", save_top_k=2, monitor="step",
                           mode="max", every_n_epochs=1, save_last=True)
    return L.Trainer(max_epochs=max_epochs, accelerator="cpu", devices=1, callbacks=[ckpt], logger=False,
                     enable_progress_bar=False, enable_model_summary=False, deterministic=True,
                     default_root_dir=root)


STEPS_PER_EPOCH = 8


def last_epoch_loss(module) -> float:
    return sum(module.losses[-STEPS_PER_EPOCH:]) / STEPS_PER_EPOCH


def step_of(name: str) -> int:
    return EPOCHS * STEPS_PER_EPOCH if name == "last.ckpt" else int(name.split("step=")[1].split(".")[0])


def core(ckpt: dict) -> dict:
    return {k: ckpt[k] for k in ("state_dict", "optimizer_states", "epoch", "global_step")}


def rel_error(a, b) -> float:
    return float((a.double() - b.double()).norm() / a.double().norm().clamp_min(1e-30))


def compare_lossy(c, want: dict, got: dict, where: str) -> int:
    """Loaded state close to what was saved; returns how many float tensors differ."""
    differ = 0
    for k, w in want["state_dict"].items():
        g = got["state_dict"][k]
        check(g.dtype == w.dtype and g.shape == w.shape and torch.isfinite(g).all(), f"{where}: {k}")
        err = rel_error(w, g)
        check(err < 0.3, f"{where}: {k} relative L2 error {err:.3g}")
        differ += int(not torch.equal(w, g))
        c.checks += 1
    return differ


def main():
    c = Client()
    lossy = c.args[0] == "lossy"
    torch.set_num_threads(1)  # the resumed epoch must repeat the first run's bit for bit
    L.seed_everything(0, verbose=False)
    first = Classifier()
    trainer(c.mnt, EPOCHS).fit(first)
    ckdir = c.mnt / "checkpoints"
    got = sorted(os.listdir(ckdir))
    check(got == KEPT, f"save_top_k=2 + save_last should leave {KEPT} in {ckdir}, found {got}")
    check(sorted(first.saved) == [8, 16, 24], f"saved at steps {sorted(first.saved)}")
    for name in KEPT:
        # the whole file: Lightning adds callback and loop state (ModelCheckpoint's scores are tensors too)
        nbytes, dtypes = torch_storages(torch.load(ckdir / name, weights_only=False))
        c.record(f"checkpoints/{name}", ref=False, tensor_bytes=nbytes, dtypes=dtypes)
    print(json.dumps({"phase": "loss", "run": "first", "loss": last_epoch_loss(first)}), flush=True)

    def load(when):
        for name in KEPT:
            step = step_of(name)
            loaded = core(torch.load(ckdir / name, weights_only=False))
            if lossy:
                differ = compare_lossy(c, first.saved[step], loaded, f"{when}:{name}")
                check(differ > 0, f"{when}:{name}: every tensor is bit-exact under a lossy policy")
            else:
                c.compare(first.saved[step], loaded, f"{when}:{name}")
        if when != "sealed":
            return
        # The recipe's resume: from the checkpoint of epoch 1, in a new process's Trainer.
        L.seed_everything(0, verbose=False)
        resumed = Classifier()
        seen = []
        start = ckdir / "epoch=1-step=16.ckpt"
        # what resuming must load, bit for bit: the state saved, or its reconstruction under a lossy policy
        want = core(torch.load(start, weights_only=False)) if lossy else first.saved[16]

        def check_loaded(module):
            state = {"state_dict": module.state_dict(),
                     "optimizer_states": [module.trainer.optimizers[0].state_dict()],
                     "epoch": module.current_epoch, "global_step": module.global_step}
            check(state["epoch"] == 2 and state["global_step"] == 16,
                  f"resumed at epoch {state['epoch']}, step {state['global_step']}")
            c.compare(want["state_dict"], state["state_dict"], "resume: state_dict")
            c.compare(want["optimizer_states"], state["optimizer_states"], "resume: optimizer")
            if lossy:
                compare_lossy(c, first.saved[16], state, "resume")
            seen.append(True)

        resumed.loaded = check_loaded
        epochs = EPOCHS + 1 if lossy else EPOCHS
        trainer(c.mnt, epochs).fit(resumed, ckpt_path=str(start))
        check(seen, "on_train_start was not called on resume")
        check(resumed.global_step == STEPS_PER_EPOCH * epochs, f"resumed run ended at step {resumed.global_step}")
        if not lossy:
            c.compare(first.saved[24]["state_dict"], resumed.state_dict(), "epoch 2 after resume")
        print(json.dumps({"phase": "loss", "run": "resumed", "loss": last_epoch_loss(resumed)}), flush=True)
        check(sorted(os.listdir(ckdir))[-1] == "last.ckpt", f"{ckdir}: {sorted(os.listdir(ckdir))}")
        last = torch.load(ckdir / "last.ckpt", weights_only=False)
        check(last["global_step"] == STEPS_PER_EPOCH * epochs,
              f"last.ckpt after resume is of step {last['global_step']}")

    c.run(load)


if __name__ == "__main__":
    main()
