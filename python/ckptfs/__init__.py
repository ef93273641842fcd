"""A Python handle on a ckptfs mount.

>>> import ckptfs
>>> ckptfs.is_mounted("/mnt/ckpt")
True
>>> ckptfs.set_policy("/mnt/ckpt/run1/lossy", lossy=0.05)
Policy(fidelity=0.05, scope='models', explicit=True)
>>> torch.save(state, "/mnt/ckpt/run1/lossy/step100.pt")
>>> st = ckptfs.wait_sealed("/mnt/ckpt/run1", timeout=60)
>>> st.logical, st.stored, st.ratio
>>> ckptfs.report("/mnt/ckpt/run1", "report.html")

Everything goes through the mount (its extended attributes and
/proc/self/mountinfo): no access to the backing store and no CLI needed.
See python/README.md and docs/SEMANTICS.md ("Usage attributes").
"""
from __future__ import annotations

from ._mounts import FSTYPE, MountInfo, NotOnCkptfsError, is_mounted, mount_of
from ._policy import Policy, clear_policy, get_policy, set_policy
from ._report import report
from ._stats import CodecStats, FileStats, LossyStats, RoleError, Stats, stats, wait_sealed


def _version() -> str:
    try:
        from importlib.metadata import PackageNotFoundError, version
        try:
            return version("ckptfs")
        except PackageNotFoundError:
            pass
    except ImportError:
        pass
    # Used from the repository (PYTHONPATH=python): the version CMakeLists.txt holds.
    import os
    import re
    cmake = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "CMakeLists.txt")
    try:
        with open(cmake, encoding="utf-8") as f:
            m = re.search(r"project\(\s*ckptfs\s+VERSION\s+([0-9][0-9.]*)", f.read())
        return m.group(1) if m else "unknown"
    except OSError:
        return "unknown"


__version__ = _version()

__all__ = [
    "FSTYPE", "CodecStats", "FileStats", "LossyStats", "MountInfo", "NotOnCkptfsError", "Policy", "RoleError",
    "Stats", "clear_policy", "get_policy", "is_mounted", "mount_of", "report", "set_policy", "stats",
    "wait_sealed", "__version__",
]
