#!/usr/bin/env python3
"""Where a checkpoint's stored bytes go, successor by successor (issue 18).

Saves a series of torch.save checkpoints of a small character transformer
with AdamW (workload A's shape: 3 layers, d_model 96, 42 parameters, so
174 zip entries) through a mount, training a few steps between saves, and
splits each file's pack by parsing it (docs/FORMAT.md): lossy pieces
(header and levels, rANS tables, symbols, escapes; by role w/m/v from the
pack's lossy section) and everything else ("other"), which is split again
by what the file holds there (zip local headers, pickle, small tensors,
central directory) in proportion to the raw bytes each coded segment
covers, plus the segment descriptors and the pack's own framing.

  .venv-pypi/bin/python bench/where_bytes.py                 # -o lossy, 6 saves
  .venv-pypi/bin/python bench/where_bytes.py --opts ''       # lossless
"""
import argparse
import io
import os
import shutil
import struct
import sys
import tempfile
import zipfile
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _common as C  # noqa: E402

sys.path.insert(0, os.path.join(C.ROOT, "tests", "integration"))
from golden_store import Pack, pack_path, stub_object  # noqa: E402

import torch  # noqa: E402

from lossy_accuracy import CharLM  # noqa: E402


def varint(b, p):
    v = s = 0
    while True:
        x = b[p]
        p += 1
        v |= (x & 0x7F) << s
        s += 7
        if not x & 0x80:
            return v, p


def segments(b, p, lossy=False):
    """A tensor chunk or lossy chunk header: ([(kind, raw, stored)], payload
    start). Lossy chunks of version 2 store no length for lossless segments."""
    version = b[p]
    n, p = varint(b, p + 1)
    segs = []
    for _ in range(n):
        kind = b[p]
        raw, p = varint(b, p + 1)
        stored = 0
        if not (lossy and version == 2 and kind == 0):
            stored, p = varint(b, p)
        segs.append((kind, raw, stored))
    return segs, p


def in_run(spans, a, b):
    """File ranges of bytes [a, b) of a run that lays `spans` end to end."""
    at = 0
    for begin, end in spans:
        n = end - begin
        lo, hi = max(a, at), min(b, at + n)
        if lo < hi:
            yield begin + lo - at, begin + hi - at
        at += n


def piece_parts(b):
    """A lossy piece's bytes: header+levels, rANS tables, symbols, escapes."""
    dt, dom, flags = b[1], b[2], b[3]
    _n, p = varint(b, 4)
    k = b[p]
    p += 1
    if flags & 2:  # piece version 2: a uniform grid, f32 step and first multiple
        _, p = varint(b, p + 4)
    elif dom == 0:
        p += 4 * k
    else:
        for _ in range(k):
            _, p = varint(b, p)
    n_esc, p = varint(b, p)
    rans_len, p = varint(b, p)
    head = p
    r = p
    n, r = varint(b, r)
    words = 0
    if n and b[r] in (1, 2):  # rANS with 8 states, or (mode 2) one
        states = 8 if b[r] == 1 else 1
        r += 1
        d = b[r + 1] + 1
        r += 2 + (d if d <= 32 else 32)
        for _ in range(d - 1):
            _, r = varint(b, r)
        r += 4 * states
        for _ in range(states):
            w, r = varint(b, r)
            words += w
    tables = rans_len - 2 * words
    return {"piece header+levels": head, "rANS tables": tables, "symbols": 2 * words,
            "escapes": len(b) - head - rans_len}


def file_regions(data):
    """Sorted (begin, end, what) of a torch.save zip's bytes."""
    zf = zipfile.ZipFile(io.BytesIO(data))
    out = []
    for zi in zf.infolist():
        h = zi.header_offset
        name_len, extra_len = struct.unpack_from("<HH", data, h + 26)
        d = h + 30 + name_len + extra_len
        out.append((h, d, "zip local headers"))
        what = "pickle" if zi.filename.endswith("data.pkl") else "tensors/entries"
        out.append((d, d + zi.compress_size, what))
    out.append((zf.start_dir, len(data), "central directory"))
    return sorted(out)


def attribute(regions, begin, end, stored, acc, lossless_tensors):
    """Adds `stored` bytes over file range [begin, end) to acc, in proportion."""
    total = end - begin
    if total == 0 or stored == 0:
        return
    for b, e, what in regions:
        o = min(e, end) - max(b, begin)
        if o > 0:
            if what == "tensors/entries":
                what = lossless_tensors
            acc[what] += stored * o / total


def attribute_tensor_chunk(regions, b, p, file_pos, acc, label):
    """A tensor chunk blob at b[p:], holding the file's bytes from file_pos
    on: its descriptors, and each segment's stored bytes over its range."""
    inner, r = segments(b, p)
    acc["tensor-chunk descriptors"] += r - p
    for _ik, iraw, ist in inner:
        attribute(regions, file_pos, file_pos + iraw, ist, acc, label)
        file_pos += iraw


def analyse(backing, path, data):
    pack = Pack(pack_path(backing, stub_object(Path(backing) / "ns" / path)).read_bytes())
    regions = file_regions(data)
    acc = defaultdict(float)
    chunk = 0
    payload_total = 0
    for i, (off, stored, codec) in enumerate(pack.entries):
        raw_len, = struct.unpack_from("<I", pack.data, pack.table_offset + 40 * i + 12)
        b = pack.data[off:off + stored]
        payload_total += stored
        if codec == 6:  # lossy
            acc["base refs + chunk descriptors"] += 16
            segs, p = segments(b, 16, lossy=True)
            if b[16] == 2:  # one lossless run, before the pieces
                n, q = varint(b, p + 1)
                acc["base refs + chunk descriptors"] += q - 16
                run = b[q:q + n]
                spans, pos = [], chunk
                for kind, raw, _st in segs:
                    if kind == 0:
                        spans.append((pos, pos + raw))
                    pos += raw
                if n:
                    inner, r = segments(run, 0)
                    acc["tensor-chunk descriptors"] += r
                    ipos = 0
                    for _ik, iraw, ist in inner:
                        for fb, fe in in_run(spans, ipos, ipos + iraw):
                            attribute(regions, fb, fe, ist * (fe - fb) / iraw, acc, "small tensors")
                        ipos += iraw
                p = q + n
                segs = [(k, raw, st) if k else (k, raw, 0) for k, raw, st in segs]
            else:
                acc["base refs + chunk descriptors"] += p - 16
            pos = chunk
            for kind, raw, st in segs:
                blob = b[p:p + st]
                if kind == 1:
                    for k, v in piece_parts(blob).items():
                        acc["lossy " + k] += v
                elif st:
                    attribute_tensor_chunk(regions, blob, 0, pos, acc, "small tensors")
                pos += raw
                p += st
        elif codec == 5:  # delta
            acc["base refs + chunk descriptors"] += 16 + 2
            q = 18
            if b[17] == 2:
                n, q = varint(b, q)
                for _ in range(n):
                    _, q = varint(b, q)
                    _, q = varint(b, q)
                    q += 1
                acc["base refs + chunk descriptors"] += q - 18
            attribute_tensor_chunk(regions, b, q, chunk, acc, "tensor residuals")
        elif codec == 3:
            attribute_tensor_chunk(regions, b, 0, chunk, acc, "tensors (lossless)")
        else:
            attribute(regions, chunk, chunk + raw_len, stored, acc, f"codec {codec}")
        chunk += raw_len
    acc["pack header/meta/table/footer"] = len(pack.data) - payload_total
    return len(pack.data), acc


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--opts", default="lossy", help="mount options ('' for lossless)")
    ap.add_argument("--saves", type=int, default=6)
    ap.add_argument("--steps", type=int, default=10, help="training steps between saves")
    ap.add_argument("--dim", type=int, default=96)
    ap.add_argument("--layers", type=int, default=3)
    args = ap.parse_args()
    C.check_binary()
    os.makedirs(C.OUT_DIR, exist_ok=True)
    work = tempfile.mkdtemp(prefix="where-bytes-", dir=C.OUT_DIR)
    back, mnt = os.path.join(work, "backing"), os.path.join(work, "mnt")
    C.mount(back, mnt, [o for o in args.opts.split(",") if o])
    rows = []
    try:
        torch.manual_seed(0)
        vocab, ctx = 96, 64
        model = CharLM(vocab, args.dim, args.layers, 4, ctx)
        opt = torch.optim.AdamW(model.parameters(), lr=3e-3, betas=(0.9, 0.99), weight_decay=0.1)
        for i in range(args.saves):
            for _ in range(args.steps):
                x = torch.randint(0, vocab, (8, ctx + 1))
                opt.zero_grad()
                logits = model(x[:, :-1])
                torch.nn.functional.cross_entropy(logits.reshape(-1, vocab), x[:, 1:].reshape(-1)).backward()
                opt.step()
            buf = io.BytesIO()
            torch.save({"model": model.state_dict(), "optimizer": opt.state_dict(), "step": i}, buf)
            data = buf.getvalue()
            name = f"ckpt_{i}.pt"
            with open(os.path.join(mnt, name), "wb") as f:
                f.write(data)
            C.wait_sealed(os.path.join(mnt, name))
            entry = C.stats(os.path.join(mnt, name))["files"][0]
            size, acc = analyse(back, name, data)
            lossy = entry.get("lossy") or {}
            role = {r: (lossy.get(k) or {}).get("stored", 0)
                    for r, k in (("w", "weights"), ("m", "first_moments"), ("v", "second_moments"))}
            rows.append((name, len(data), entry["stored"], entry["depth"], role, acc))
    finally:
        C.umount(mnt, back)
        shutil.rmtree(work, ignore_errors=True)
    print(f"mount -o {args.opts or '(lossless)'}; file {rows[0][1]} bytes, "
          f"{len(zipfile.ZipFile(io.BytesIO(data)).infolist())} zip entries")
    print("| file | stored | depth | w | m | v | other |\n|---|---|---|---|---|---|---|")
    for name, _n, stored, depth, role, _acc in rows:
        other = stored - sum(role.values())
        print(f"| {name} | {stored} | {depth} | {role['w']} | {role['m']} | {role['v']} | {other} |")
    keys = sorted({k for r in rows for k in r[5]})
    print("\nby part (bytes; pieces' parts summed over w, m, v):\n")
    print("| part | " + " | ".join(r[0] for r in rows) + " |\n|---|" + "---|" * len(rows))
    for k in keys:
        print(f"| {k} | " + " | ".join(f"{r[5].get(k, 0):.0f}" for r in rows) + " |")


if __name__ == "__main__":
    main()
