"""Reads of sealed files with decode-ahead: many readers at once, of every
member of a delta chain and of the same file, each with its own read size,
get exactly the bytes written, through a cache far smaller than the files
(so chunks decoded ahead and delta bases are evicted and decoded again),
and the same with decode-ahead off."""
import os
import threading

import numpy as np
import pytest


def chain(n: int, seed: int = 3) -> list[bytes]:
    """.npy versions of one drifting weight matrix (4 MiB each), so each
    is stored as a delta of the one before; a run of zeros makes a hole."""
    import io

    rng = np.random.default_rng(seed)
    w = rng.normal(0, 0.02, size=(1024, 1024)).astype(np.float32)
    w[300:400] = 0
    out = []
    for _ in range(n):
        buf = io.BytesIO()
        np.save(buf, w)
        out.append(buf.getvalue())
        w[:700] += rng.normal(0, 1e-5, size=(700, 1024)).astype(np.float32)
    return out


def read_all(path, block: int, start: int = 0) -> bytes:
    parts = []
    with open(path, "rb", buffering=0) as f:
        f.seek(start)
        while b := f.read(block):
            parts.append(b)
    return b"".join(parts)


@pytest.mark.parametrize("decode_threads", ["2", "0"])
def test_concurrent_readers_of_a_delta_chain_get_exact_bytes(mount_factory, decode_threads):
    m = mount_factory(opts=["chunk_size=64K", "cache_size=1M", f"decode_threads={decode_threads}"])
    versions = chain(4)
    names = [f"step{i}.npy" for i in range(len(versions))]
    for name, data in zip(names, versions):
        (m.mnt / name).write_bytes(data)
        m.wait_sealed()
    files = {f["path"]: f for f in m.wait_sealed()["files"]}
    for name in names[1:]:
        assert files[name]["base"] and files[name]["depth"] >= 1, files[name]
    m.remount()  # cold cache

    jobs = []
    for i, name in enumerate(names):  # two readers per file, one from the middle
        jobs.append((name, versions[i], 128 << 10, 0))
        jobs.append((name, versions[i], 100_003, len(versions[i]) // 3))
    got = [None] * len(jobs)

    def reader(k):
        name, _, block, start = jobs[k]
        got[k] = read_all(m.mnt / name, block, start)

    threads = [threading.Thread(target=reader, args=(k,)) for k in range(len(jobs))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for k, (name, want, _, start) in enumerate(jobs):
        assert got[k] is not None and got[k] == want[start:], f"{name} from {start} differs"


def test_random_and_backward_reads_after_decode_ahead(mount_factory):
    m = mount_factory(opts=["chunk_size=64K", "cache_size=1M", "decode_threads=2"])
    data = chain(2, seed=5)
    (m.mnt / "a.npy").write_bytes(data[0])
    m.wait_sealed()
    (m.mnt / "b.npy").write_bytes(data[1])
    m.wait_sealed()
    m.remount()
    rng = np.random.default_rng(1)
    with open(m.mnt / "b.npy", "rb", buffering=0) as f:
        assert f.read(1 << 20) == data[1][:1 << 20]  # sequential: decode-ahead starts
        for _ in range(200):
            off = int(rng.integers(0, len(data[1])))
            n = int(rng.integers(1, 300_000))
            f.seek(off)
            assert f.read(n) == data[1][off:off + n], (off, n)
    assert os.path.getsize(m.mnt / "b.npy") == len(data[1])
