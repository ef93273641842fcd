#!/usr/bin/env python3
"""Whether a torch checkpoint whose tensors all moved is stored as a delta.

Saves a series of checkpoints of a small MLP with AdamW through a
`-o lossy` mount (or the options given), training 20 steps (or --steps) between saves; each save holds a
string whose length is taken from the command line, so the pickle grows
between saves. torch's zip aligns every tensor record to 64 bytes: a growth
that crosses that alignment moves every tensor. Prints, per file, its size,
its stored size, its delta depth and its base (docs/LOSSY.md "Panel": such
a file was stored as a keyframe, 11-13% of the total ratio on the panel's
B and C with the step schedule, until base windows could start before the
base file, pack format version 5).

  .venv-pypi/bin/python bench/layout_shift.py            # pads 1, 2, 3, 78 bytes
  .venv-pypi/bin/python bench/layout_shift.py 1 1 300    # any lengths
  .venv-pypi/bin/python bench/layout_shift.py -o '' --steps 1 1 78 2   # lossless, 1 step between saves
"""
import os
import shutil
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _common as C  # noqa: E402

import torch  # noqa: E402


def main():
    args = sys.argv[1:]
    opts, steps = ["lossy"], 20
    while args[:1] in (["-o"], ["--steps"]) and len(args) >= 2:
        if args[0] == "-o":
            opts = [o for o in args[1].split(",") if o]
        else:
            steps = int(args[1])
        args = args[2:]
    lengths = [int(x) for x in args] or [1, 2, 3, 78]
    C.check_binary()
    os.makedirs(C.OUT_DIR, exist_ok=True)
    work = tempfile.mkdtemp(prefix="layout-shift-", dir=C.OUT_DIR)
    back, mnt = os.path.join(work, "backing"), os.path.join(work, "mnt")
    C.mount(back, mnt, opts)
    print(f"{C.CKPTFS}, -o {','.join(opts) or '(none)'}, {steps} steps between saves")
    try:
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.GELU(), torch.nn.Linear(128, 10))
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
        x, y = torch.randn(256, 64), torch.randint(0, 10, (256,))
        print("| file | pad bytes | size | stored | depth | base |\n|---|---|---|---|---|---|")
        for i, n in enumerate(lengths):
            for _ in range(steps):
                opt.zero_grad()
                torch.nn.functional.cross_entropy(model(x), y).backward()
                opt.step()
            path = os.path.join(mnt, f"ckpt_{i}.pt")
            torch.save({"model": model.state_dict(), "optimizer": opt.state_dict(), "pad": "a" * n}, path)
            C.wait_sealed(path)
            entry = C.stats(path)["files"][0]
            print(f"| ckpt_{i}.pt | {n} | {os.path.getsize(path)} | {entry['stored']} | {entry['depth']} "
                  f"| {entry['base'] or '-'} |")
    finally:
        C.umount(mnt, back)
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
