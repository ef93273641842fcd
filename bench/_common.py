"""Small helpers shared by the bench scripts (mount lifecycle, stats, RSS)."""
import json
import os
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# One sha256_file for tests and benches: the integration tests' helpers.
sys.path.append(os.path.join(ROOT, "tests", "integration"))
from helpers import sha256_file  # noqa: E402,F401  (C.sha256_file in the bench scripts)
CKPTFS = os.environ.get("CKPTFS_BIN", os.path.join(ROOT, "build", "ckptfs"))
OUT_DIR = os.path.join(ROOT, "bench", "out")


def check_binary():
    if not os.access(CKPTFS, os.X_OK):
        sys.exit(f"{CKPTFS} not found: build first (bash scripts/build.sh)")


def run(*args, check=True, **kw):
    p = subprocess.run([CKPTFS, *map(str, args)], capture_output=True, text=True,
                       stdin=subprocess.DEVNULL, **kw)
    if check and p.returncode != 0:
        sys.exit(f"`ckptfs {' '.join(map(str, args))}` failed ({p.returncode}):\n"
                 f"{p.stdout}{p.stderr}")
    return p


def is_mounted(mnt):
    mnt = os.path.abspath(mnt)
    with open("/proc/self/mountinfo") as f:
        return any(line.split()[4] == mnt for line in f)


def mount(backing, mnt, opts=()):
    os.makedirs(backing, exist_ok=True)
    os.makedirs(mnt, exist_ok=True)
    if is_mounted(mnt):
        umount(mnt)
    args = ["mount"]
    if opts:
        args += ["-o", ",".join(opts)]
    run(*args, backing, mnt)


def daemon_pid(backing):
    try:
        return int(open(os.path.join(backing, "LOCK")).read().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def umount(mnt, backing=None):
    pid = daemon_pid(backing) if backing else None
    p = run("umount", mnt, check=False)
    if p.returncode != 0 and is_mounted(mnt):
        subprocess.run(["fusermount3", "-uz", mnt])
    if pid:
        deadline = time.monotonic() + 300
        while os.path.exists(f"/proc/{pid}") and time.monotonic() < deadline:
            try:
                if "Z" in open(f"/proc/{pid}/stat").read().split(") ")[1][:1]:
                    break
            except OSError:
                break
            time.sleep(0.1)


def stats(path):
    return json.loads(run("stats", "--json", path).stdout)


def wait_sealed(path, timeout=3600, poll=0.2):
    t0 = time.monotonic()
    while True:
        st = stats(path)
        if not any(f.get("staged") for f in st["files"]):
            return st, time.monotonic() - t0
        if time.monotonic() - t0 > timeout:
            sys.exit(f"files still staged after {timeout}s")
        time.sleep(poll)


def wait_file_sealed(path, timeout=3600, poll=0.02):
    """Seconds until the file `path` in a mount is sealed, by its
    user.ckptfs.state attribute: one getxattr a poll. For timing a seal:
    wait_sealed runs `ckptfs stats` a poll (about 20 ms of CPU each), which
    on 2 cores takes a quarter of a core from the seal it times."""
    t0 = time.monotonic()
    while os.getxattr(path, "user.ckptfs.state") != b"sealed":
        if time.monotonic() - t0 > timeout:
            sys.exit(f"{path} still staged after {timeout}s")
        time.sleep(poll)
    return time.monotonic() - t0


def status_kib(pid, key):
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith(key + ":"):
                    return int(line.split()[1])
    except OSError:
        return None
    return None


def drop_caches():
    """Returns True when the page cache could be dropped (root, not in a
    restricted container)."""
    try:
        os.sync()
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("3\n")
        return True
    except OSError:
        return False


def fsync_path(path):
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def median_index(values):
    """Index of the median value (the upper of the two middle ones of an
    even count), so that what was measured with it can be picked too."""
    order = sorted(range(len(values)), key=lambda i: values[i])
    return order[len(values) // 2]


def median(xs):
    return xs[median_index(xs)]


def human(n):
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n} B" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024


def md_table(headers, rows):
    out = ["| " + " | ".join(headers) + " |", "|" + "|".join("---" for _ in headers) + "|"]
    for r in rows:
        out.append("| " + " | ".join(str(c) for c in r) + " |")
    return "\n".join(out)


def write_json(name, obj):
    os.makedirs(OUT_DIR, exist_ok=True)
    path = os.path.join(OUT_DIR, f"{name}-{time.strftime('%Y%m%d-%H%M%S')}.json")
    with open(path, "w") as f:
        json.dump(obj, f, indent=2)
    return path


def timed_raw_read(path, block=8 << 20):
    """Sequential read into a reused buffer (no hashing inside the timing)."""
    buf = bytearray(block)
    t0 = time.perf_counter()
    with open(path, "rb", buffering=0) as f:
        while f.readinto(buf):
            pass
    return time.perf_counter() - t0


def zstd_size(path, level=3):
    """Bytes of `zstd -LEVEL` of the file (streamed, never in memory) and seconds taken."""
    t0 = time.perf_counter()
    p = subprocess.Popen(["zstd", f"-{level}", "-q", "-c", path], stdout=subprocess.PIPE)
    n = 0
    while True:
        b = p.stdout.read(1 << 20)
        if not b:
            break
        n += len(b)
    if p.wait() != 0:
        sys.exit(f"zstd failed on {path}")
    return n, time.perf_counter() - t0
