#!/usr/bin/env python3
"""Big-file benchmark: writes a 4 GiB file through a ckptfs mount (default
options) in 1 MiB writes of non-trivial data (a pseudo-random 64 MiB block,
repeated, each 1 MiB piece with a varying prefix), waits until it is sealed,
reads it back and compares checksums, and reports the daemon's peak RSS
(VmHWM), which must stay below 300 MiB. Exit status 1 when a check fails.

  .venv-debian/bin/python bench/bench_bigfile.py [--size-gib 4]
"""
import argparse
import hashlib
import os
import shutil
import sys
import threading
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _common as C  # noqa: E402

MiB = 1 << 20
RSS_LIMIT_MIB = 300


def kib_mib(k):
    return f"{k / 1024:.1f} MiB" if k else "?"


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size-gib", type=float, default=4.0)
    ap.add_argument("--workdir", default=os.path.join(C.OUT_DIR, "work-bigfile"))
    ap.add_argument("-o", "--mount-options", default="", help="extra ckptfs -o options")
    ap.add_argument("--keep", action="store_true")
    args = ap.parse_args()
    C.check_binary()

    work = os.path.abspath(args.workdir)
    backing, mnt = os.path.join(work, "backing"), os.path.join(work, "mnt")
    if C.is_mounted(mnt):
        C.umount(mnt, backing)
    shutil.rmtree(backing, ignore_errors=True)
    os.makedirs(work, exist_ok=True)
    n_mib = int(args.size_gib * 1024)
    free = shutil.disk_usage(work).free
    if free < 2.2 * n_mib * MiB:
        sys.exit(f"need ~{2.2 * n_mib / 1024:.1f} GiB free in {work} (staging + pack), "
                 f"have {free / (1 << 30):.1f} GiB")

    opts = [o for o in args.mount_options.split(",") if o]
    C.mount(backing, mnt, opts)
    pid = C.daemon_pid(backing)
    peak = {"kib": 0}
    stop = threading.Event()

    def sampler():  # VmHWM is the kernel's own peak; sampling VmRSS is a cross-check
        while not stop.is_set():
            v = C.status_kib(pid, "VmRSS")
            if v:
                peak["kib"] = max(peak["kib"], v)
            time.sleep(0.2)

    threading.Thread(target=sampler, daemon=True).start()
    block = np.random.default_rng(12345).integers(0, 256, 64 * MiB, dtype=np.uint8).tobytes()
    path = os.path.join(mnt, "big.bin")
    res = {"size_bytes": n_mib * MiB, "mount_options": opts}
    ok = True
    try:
        h = hashlib.sha256()
        buf = bytearray(MiB)
        t0 = time.perf_counter()
        fd = os.open(path, os.O_CREAT | os.O_WRONLY | os.O_TRUNC, 0o644)
        try:
            for i in range(n_mib):
                j = i % 64
                buf[:] = block[j * MiB:(j + 1) * MiB]
                buf[:16] = i.to_bytes(8, "little") * 2  # varying prefix
                os.write(fd, buf)
                h.update(buf)
        finally:
            os.close(fd)
        res["write_s"] = time.perf_counter() - t0
        res["vmhwm_kib_after_write"] = C.status_kib(pid, "VmHWM")
        want = h.hexdigest()
        print(f"wrote {n_mib} MiB in {res['write_s']:.1f}s "
              f"({n_mib / res['write_s']:.0f} MiB/s)", flush=True)

        st, res["seal_wait_s"] = C.wait_sealed(mnt, timeout=7200, poll=0.25)
        res["vmhwm_kib_after_seal"] = C.status_kib(pid, "VmHWM")
        print(f"sealed after another {res['seal_wait_s']:.1f}s", flush=True)
        ent = [f for f in st["files"] if f["path"].lstrip("/") == "big.bin"]
        res["logical_bytes"] = ent[0]["logical"] if ent else None
        res["stored_bytes"] = ent[0]["stored"] if ent else None
        res["dropped_caches"] = C.drop_caches()

        t0 = time.perf_counter()
        h = hashlib.sha256()
        with open(path, "rb", buffering=0) as f:
            while True:
                b = f.read(8 * MiB)
                if not b:
                    break
                h.update(b)
        res["read_s"] = time.perf_counter() - t0
        got = h.hexdigest()
        res["checksum_ok"] = got == want
        ok &= res["checksum_ok"]
        print(f"read back in {res['read_s']:.1f}s ({n_mib / res['read_s']:.0f} MiB/s), "
              f"sha256 {'OK' if got == want else 'MISMATCH'}", flush=True)
        res["vmhwm_kib"] = C.status_kib(pid, "VmHWM")
    finally:
        stop.set()
        if not args.keep:
            C.umount(mnt, backing)
            shutil.rmtree(backing, ignore_errors=True)
    res["sampled_peak_rss_kib"] = peak["kib"]
    hwm_mib = (res["vmhwm_kib"] or 0) / 1024
    res["rss_ok"] = res["vmhwm_kib"] is not None and hwm_mib < RSS_LIMIT_MIB
    ok &= res["rss_ok"]
    size_ok = res["logical_bytes"] == n_mib * MiB
    ok &= size_ok

    print()
    print(C.md_table(["metric", "value", "check"], [
        ["file size", C.human(n_mib * MiB), "ok" if size_ok else f"FAIL ({res['logical_bytes']})"],
        ["write (1 MiB writes)", f"{res['write_s']:.1f}s, {n_mib / res['write_s']:.0f} MiB/s", ""],
        ["wait until sealed", f"{res['seal_wait_s']:.1f}s", ""],
        ["read back", f"{res['read_s']:.1f}s, {n_mib / res['read_s']:.0f} MiB/s"
         + ("" if res["dropped_caches"] else " (page cache not dropped)"), ""],
        ["sha256 compare", "equal" if res["checksum_ok"] else "DIFFERENT",
         "ok" if res["checksum_ok"] else "FAIL"],
        ["stored bytes", C.human(res["stored_bytes"] or 0), ""],
        ["daemon VmHWM", f"{hwm_mib:.1f} MiB (after write {kib_mib(res['vmhwm_kib_after_write'])}"
                         f", after seal {kib_mib(res['vmhwm_kib_after_seal'])}; sampled VmRSS "
                         f"peak {peak['kib'] / 1024:.1f} MiB)",
         "ok" if res["rss_ok"] else f"FAIL (limit {RSS_LIMIT_MIB} MiB)"],
    ]))
    print(f"\nJSON: {C.write_json('bench_bigfile', res)}")
    print("PASS" if ok else "FAIL")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
