"""Writer process for test_crash.py (not a test module).

usage: crash_writer.py DIR WRITER_ID SEED THREADS

Each thread writes files under DIR forever and reports on stdout, one line
per event, flushed before/after the operation:
  BEGIN <path>            about to create/modify/remove <path>
  DONE <path> <sha256>    <path> was closed or fsynced with this content
  GONE <path>             <path> was unlinked
It stops at the first error (the daemon gets killed under it).
"""
import hashlib
import os
import random
import sys
import threading

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from helpers import apply_pwrite, gen_data  # noqa: E402

_out_lock = threading.Lock()
_keep_open = []  # fsynced files stay open (no further writes) until we die


def report(*parts):
    with _out_lock:
        sys.stdout.write(" ".join(parts) + "\n")
        sys.stdout.flush()


def write_all(fd, data):
    mv = memoryview(data)
    done = 0
    while done < len(data):
        step = min(len(data) - done, 256 * 1024)
        done += os.write(fd, mv[done:done + step])


def sha(b):
    return hashlib.sha256(b).hexdigest()


def worker(root, wid, tid, seed):
    rng = random.Random(seed * 1000 + tid)
    done_files = {}  # path -> bytes, closed files this thread may rewrite/remove
    i = 0
    while True:
        i += 1
        mode = rng.choices(["close", "fsync", "rewrite", "rename", "unlink"],
                           [40, 20, 20, 15, 5])[0]
        size = rng.choice([0, rng.randint(1, 4096), rng.randint(1, 1 << 20),
                           rng.randint(1 << 20, 6 << 20)])
        if mode in ("rewrite", "unlink") and not done_files:
            mode = "close"
        if mode == "close" or mode == "fsync":
            path = os.path.join(root, f"w{wid}-t{tid}-{i}.bin")
            data = gen_data(rng, size)
            report("BEGIN", path)
            fd = os.open(path, os.O_CREAT | os.O_WRONLY | os.O_TRUNC, 0o644)
            write_all(fd, data)
            if mode == "fsync":
                os.fsync(fd)
                _keep_open.append(fd)
            else:
                os.close(fd)
                done_files[path] = data
            report("DONE", path, sha(data))
        elif mode == "rewrite":
            path = rng.choice(sorted(done_files))
            data = bytearray(done_files[path])
            report("BEGIN", path)
            fd = os.open(path, os.O_WRONLY)
            for _ in range(rng.randint(1, 5)):
                off = rng.randint(0, len(data) + 10000)
                chunk = gen_data(rng, rng.randint(1, 300_000))
                os.pwrite(fd, chunk, off)
                apply_pwrite(data, off, chunk)
            if rng.random() < 0.3:
                n = rng.randint(0, len(data))
                os.ftruncate(fd, n)
                del data[n:]
            os.close(fd)
            done_files[path] = bytes(data)
            report("DONE", path, sha(data))
        elif mode == "rename":
            # torch.save-style atomic replace: tmp file, fsync, rename over final
            final = os.path.join(root, f"w{wid}-t{tid}-ckpt{rng.randint(0, 2)}.pt")
            tmp = final + f".tmp{i}"
            data = gen_data(rng, size)
            report("BEGIN", tmp)
            report("BEGIN", final)
            fd = os.open(tmp, os.O_CREAT | os.O_WRONLY | os.O_TRUNC, 0o644)
            write_all(fd, data)
            os.fsync(fd)
            os.close(fd)
            os.rename(tmp, final)
            done_files.pop(final, None)
            report("GONE", tmp)
            report("DONE", final, sha(data))
        elif mode == "unlink":
            path = rng.choice(sorted(done_files))
            report("BEGIN", path)
            os.unlink(path)
            del done_files[path]
            report("GONE", path)


def main():
    root, wid, seed, threads = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
    errors = []

    def run(tid):
        try:
            worker(root, wid, tid, seed)
        except BaseException as e:  # the daemon was killed: stop quietly
            errors.append(e)

    ts = [threading.Thread(target=run, args=(t,), daemon=True) for t in range(threads)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    report("EXIT", repr(errors[:1]))


if __name__ == "__main__":
    main()
