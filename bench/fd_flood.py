"""Issue 40 item 1 at full size: one process makes and lists (`ls -l`)
--files empty files through a mount whose daemon runs under RLIMIT_NOFILE
--limit (prlimit, soft and hard), while the daemon's fd count is sampled;
then a second process reads a file written before the flood and creates a
new one. Prints the peak and final fd counts and every error seen.
(tests/integration/test_tenants.py section 1 runs the same attack smaller,
with a real second user.)

    .venv-debian/bin/python bench/fd_flood.py --files 100000 --limit 1024
"""
import argparse
import errno
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time

import _common as C


def daemon_fds(pid):
    return len(os.listdir(f"/proc/{pid}/fd"))


def flood(d, files):
    made = listed = 0
    errors = {}

    def err(e):
        name = errno.errorcode.get(e.errno, str(e.errno))
        errors[name] = errors.get(name, 0) + 1

    for i in range(files):
        try:
            os.close(os.open(f"{d}/f{i}", os.O_CREAT | os.O_WRONLY, 0o644))
            made += 1
        except OSError as e:
            err(e)
    try:
        for e in os.scandir(d):
            try:
                e.stat(follow_symlinks=False)
                listed += 1
            except OSError as x:
                err(x)
    except OSError as e:
        err(e)
    return made, listed, errors


def victim(vic, old):
    def read_old():
        if open(f"{vic}/old", "rb").read() != old:
            raise OSError(errno.EIO, "wrong bytes")

    res = {}
    for name, fn in {
        "read old": read_old,
        "create": lambda: open(f"{vic}/new", "wb").write(b"fresh"),
        "ls": lambda: os.listdir(vic),
    }.items():
        try:
            fn()
            res[name] = "OK"
        except OSError as e:
            res[name] = errno.errorcode.get(e.errno, str(e.errno))
    return res


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--files", type=int, default=100_000)
    ap.add_argument("--limit", type=int, default=1024)
    ap.add_argument("-o", dest="opts", default="", help="extra mount options")
    args = ap.parse_args()
    C.check_binary()
    work = tempfile.mkdtemp(prefix="fd-flood-")
    backing, mnt = f"{work}/backing", f"{work}/mnt"
    os.makedirs(backing)
    os.makedirs(mnt)
    try:
        cmd = ["prlimit", f"--nofile={args.limit}:{args.limit}", C.CKPTFS, "mount"]
        if args.opts:
            cmd += ["-o", args.opts]
        subprocess.run(cmd + [backing, mnt], check=True, stdin=subprocess.DEVNULL)
        pid = C.daemon_pid(backing)
        os.makedirs(f"{mnt}/atk")
        os.makedirs(f"{mnt}/vic")
        old = os.urandom(1 << 20)
        with open(f"{mnt}/vic/old", "wb") as f:
            f.write(old)
        peak = [daemon_fds(pid)]
        stop = threading.Event()

        def sample():
            while not stop.is_set():
                peak[0] = max(peak[0], daemon_fds(pid))

        t = threading.Thread(target=sample, daemon=True)
        t.start()
        start = time.monotonic()
        made, listed, errors = flood(f"{mnt}/atk", args.files)
        took = time.monotonic() - start
        vic = victim(f"{mnt}/vic", old)
        stop.set()
        t.join()
        final = daemon_fds(pid)
        print(C.md_table(["binary", "files", "limit", "made", "listed", "errors", "fds peak", "fds after",
                          "victim", "flood s"],
                         [[C.CKPTFS, args.files, args.limit, made, listed, errors or "none", peak[0], final,
                           vic, f"{took:.1f}"]]))
    finally:
        C.umount(mnt, backing)
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
