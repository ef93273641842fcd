"""Which ckptfs mount a path is on, from /proc/self/mountinfo."""
from __future__ import annotations

import errno
import os
from dataclasses import dataclass
from typing import List, Optional, Union

PathLike = Union[str, "os.PathLike[str]"]

#: The file system type the kernel reports for a ckptfs mount (FUSE subtype ckptfs).
FSTYPE = "fuse.ckptfs"
#: An attribute every file and directory of a ckptfs mount answers.
PROBE_XATTR = "user.ckptfs.effective_policy"
MOUNTINFO = "/proc/self/mountinfo"


class NotOnCkptfsError(ValueError):
    """The path given is not inside a ckptfs mount."""


@dataclass(frozen=True)
class MountInfo:
    """One entry of /proc/self/mountinfo."""

    mountpoint: str  #: absolute path of the mount point
    fstype: str  #: e.g. ``fuse.ckptfs``
    source: str  #: for ckptfs, the backing store directory
    options: str  #: per-mount options (``rw,nosuid,...``)

    @property
    def is_ckptfs(self) -> bool:
        return self.fstype == FSTYPE


def _unescape(field: str) -> str:
    """mountinfo writes space, tab, newline and backslash as \\ooo octal."""
    out: List[str] = []
    i = 0
    while i < len(field):
        if field[i] == "\\" and i + 3 < len(field) and field[i + 1:i + 4].isdigit():
            out.append(chr(int(field[i + 1:i + 4], 8)))
            i += 4
        else:
            out.append(field[i])
            i += 1
    return "".join(out)


def read_mounts(mountinfo: str = MOUNTINFO) -> List[MountInfo]:
    """Every mount this process sees, in mount order."""
    mounts = []
    with open(mountinfo, encoding="utf-8", errors="surrogateescape") as f:
        for line in f:
            parts = line.split()
            if "-" not in parts[6:]:
                continue
            sep = parts.index("-", 6)
            if len(parts) < sep + 3:
                continue
            mounts.append(MountInfo(mountpoint=_unescape(parts[4]), fstype=parts[sep + 1],
                                    source=_unescape(parts[sep + 2]), options=parts[5]))
    return mounts


def _absolute(path: PathLike) -> str:
    # realpath resolves symlinks into the mount; it never fails on a dead
    # (ENOTCONN) mount, where it stops resolving.
    return os.path.realpath(os.fspath(path))


def _under(path: str, mountpoint: str) -> bool:
    return mountpoint == "/" or path == mountpoint or path.startswith(mountpoint + "/")


def mount_of(path: PathLike) -> MountInfo:
    """The ckptfs mount that ``path`` is inside.

    Raises :class:`NotOnCkptfsError` when the file system holding ``path``
    is another one (the message names it) and FileNotFoundError when
    ``path`` does not exist.
    """
    absolute = _absolute(path)
    try:
        os.lstat(absolute)
    except OSError as e:
        if e.errno != errno.ENOTCONN:  # a dead mount is still a mount
            raise
    try:
        mounts = read_mounts()
    except OSError:
        mounts = []
    # The last matching entry of the longest mount point is the one on top.
    best: Optional[MountInfo] = None
    for m in mounts:
        if _under(absolute, m.mountpoint) and (best is None or len(m.mountpoint) >= len(best.mountpoint)):
            best = m
    if best is not None and best.is_ckptfs:
        return best
    if not mounts and _answers_probe(absolute):  # no /proc: ask the file system itself
        return MountInfo(mountpoint="", fstype=FSTYPE, source="", options="")
    where = f"its file system is {best.fstype} mounted on {best.mountpoint}" if best else "no mount holds it"
    raise NotOnCkptfsError(f"{os.fspath(path)} is not inside a ckptfs mount ({where}); "
                           f"mount one with `ckptfs mount STORE MOUNTPOINT` and use a path below MOUNTPOINT")


def _answers_probe(path: str) -> bool:
    try:
        os.getxattr(path, PROBE_XATTR)
        return True
    except OSError:
        return False


def is_mounted(path: PathLike) -> bool:
    """Whether ``path`` is a ckptfs mount point or inside one.

    Reads /proc/self/mountinfo (the file system type ``fuse.ckptfs``), so
    it never blocks on, or fails for, a mount whose daemon is gone. False
    for a path that does not exist.
    """
    try:
        mount_of(path)
        return True
    except (NotOnCkptfsError, OSError):
        return False
