"""Writer and reader processes for test_lifetime.py (not a test module).

usage: replace_race.py writer TARGET ITERATIONS
       replace_race.py reader TARGET STOPFILE
       replace_race.py torch-writer TARGET ITERATIONS
       replace_race.py torch-reader TARGET STOPFILE

`writer` replaces TARGET ITERATIONS times the way trainers publish a file:
write TARGET.tmp, close, os.replace(TARGET.tmp, TARGET). Version v is a
header (magic, v, length, sha256 of the body) and a body that only v makes.

`reader` opens and reads TARGET in a loop until STOPFILE exists, checking
each read against the header: it must be one complete version. It prints
one JSON line: reads, versions seen, and every bad read (empty, short,
wrong bytes, errors).

`torch-writer` is a training loop: each step updates a small model and an
AdamW optimizer and saves {step, model, optimizer} to TARGET.tmp with
torch.save, then renames it over TARGET. Every tensor of step s is
derived from s, so `torch-reader` can check a loaded state dict against
the step it claims to be, with torch.load.
"""
import hashlib
import json
import os
import struct
import sys

MAGIC = b"CKPTRACE"
HEADER = struct.Struct("<8sQQ32s")  # magic, version, body length, sha256(body)
BASE_SIZE = 1 << 20


def body_of(version: int) -> bytes:
    # ~1 MiB, a different length per version, recognisable at every offset.
    n = BASE_SIZE + (version * 4099) % 65536
    unit = struct.pack("<QQ", version, version * 0x9E3779B97F4A7C15 % (1 << 64))
    return (unit * (n // len(unit) + 1))[:n]


def file_of(version: int) -> bytes:
    body = body_of(version)
    return HEADER.pack(MAGIC, version, len(body), hashlib.sha256(body).digest()) + body


def check(data: bytes, fstat_size: int):
    """(version, None) for a complete version, else (None, what is wrong)."""
    if not data:
        return None, f"empty read (fstat size {fstat_size})"
    if len(data) < HEADER.size:
        return None, f"short read: {len(data)} bytes (fstat size {fstat_size})"
    magic, version, n, digest = HEADER.unpack_from(data)
    if magic != MAGIC:
        return None, f"bad magic {magic!r} in {len(data)} bytes"
    if len(data) != HEADER.size + n:
        return None, f"version {version}: {len(data)} bytes, expected {HEADER.size + n} (fstat size {fstat_size})"
    if hashlib.sha256(data[HEADER.size:]).digest() != digest or data[HEADER.size:] != body_of(version):
        return None, f"version {version}: wrong bytes"
    return version, None


def write_all(fd: int, data: bytes):
    mv = memoryview(data)
    while mv:
        mv = mv[os.write(fd, mv):]


def publish(target: str, data: bytes):
    tmp = target + ".tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        write_all(fd, data)
    finally:
        os.close(fd)
    os.replace(tmp, target)


def writer(target: str, iterations: int):
    for v in range(1, iterations + 1):
        publish(target, file_of(v))


def read_whole(path: str):
    """open, fstat, read to EOF: what `open(p, 'rb').read()` does."""
    fd = os.open(path, os.O_RDONLY)
    try:
        size = os.fstat(fd).st_size
        chunks = []
        while True:
            b = os.read(fd, 1 << 20)
            if not b:
                break
            chunks.append(b)
        return b"".join(chunks), size
    finally:
        os.close(fd)


def reader_loop(target: str, stopfile: str, read_one):
    reads, versions, bad = 0, set(), []
    while not os.path.exists(stopfile):
        reads += 1
        try:
            version, problem = read_one(target)
        except Exception as e:  # noqa: BLE001 - every failure is a finding
            version, problem = None, f"{type(e).__name__}: {e}"
        if problem:
            bad.append(problem)
        else:
            versions.add(version)
    print(json.dumps({"reads": reads, "versions": len(versions), "bad": bad}), flush=True)


def read_checked(target: str):
    data, size = read_whole(target)
    return check(data, size)


# -- torch ---------------------------------------------------------------

def torch_model(torch):
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.GELU(), torch.nn.Linear(256, 64))


def torch_writer(target: str, iterations: int):
    import torch
    model = torch_model(torch)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    for step in range(1, iterations + 1):
        # A deterministic "training step": the state after step s is a
        # function of s alone, so a reader can rebuild and compare it.
        with torch.no_grad():
            for i, p in enumerate(model.parameters()):
                p.fill_(float(step) + i / 10)
        opt.zero_grad()
        model(torch.ones(4, 64)).sum().backward()
        opt.step()
        state = {"step": step, "model": model.state_dict(), "optimizer": opt.state_dict()}
        torch.save(state, target + ".tmp")
        os.replace(target + ".tmp", target)


def torch_check(target: str):
    import torch
    state = torch.load(target, map_location="cpu")
    step = state["step"]
    params = list(state["model"].values())
    if len(params) != 4:
        return None, f"step {step}: {len(params)} model tensors"
    for i, p in enumerate(params):
        # AdamW moves each parameter by about lr from step + i/10.
        expected = float(step) + i / 10
        if not torch.all((p - expected).abs() < 0.01):
            return None, f"step {step}: model tensor {i} is not from step {step}"
    opt_state = state["optimizer"]["state"]
    if len(opt_state) != 4 or any(int(s["step"]) != step for s in opt_state.values()):
        return None, f"step {step}: optimizer state of another step"
    return step, None


def main(argv):
    mode, target = argv[1], argv[2]
    if mode == "writer":
        writer(target, int(argv[3]))
    elif mode == "reader":
        reader_loop(target, argv[3], read_checked)
    elif mode == "torch-writer":
        torch_writer(target, int(argv[3]))
    elif mode == "torch-reader":
        reader_loop(target, argv[3], torch_check)
    else:
        raise SystemExit(__doc__)


if __name__ == "__main__":
    main(sys.argv)
