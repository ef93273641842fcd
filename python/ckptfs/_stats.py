"""How the files of a ckptfs mount are stored: ``stats`` and ``wait_sealed``.

The numbers come from read-only extended attributes that the daemon
answers for every regular file (docs/SEMANTICS.md, "Usage attributes"):
``user.ckptfs.state``, ``.logical``, ``.stored``, ``.depth``, ``.pack``,
``.base``, ``.codecs`` and, for lossy files, ``user.ckptfs.lossy.*``. They
are the same numbers ``ckptfs stats --json`` prints, but need neither the
CLI nor read access to the backing store. A daemon too old to answer them
is asked through ``ckptfs stats --json`` instead.
"""
from __future__ import annotations

import errno
import json
import os
import shutil
import stat as stat_mod
import subprocess
import time
from dataclasses import dataclass, field, replace
from typing import Dict, Iterator, List, Optional, Tuple

from ._mounts import MountInfo, PathLike, mount_of

#: Roles of the tensors lossy mode quantizes, as ``ckptfs stats --json`` names them.
ROLES = ("weights", "first_moments", "second_moments")
USAGE_PREFIX = "user.ckptfs."
LOSSY_PREFIX = "user.ckptfs.lossy."


@dataclass(frozen=True)
class CodecStats:
    """The chunks of one codec in a file's own pack."""

    codec: str  #: raw, zstd, zero, tensor, ref (dedup), delta or lossy
    chunks: int
    raw: int  #: logical bytes those chunks hold
    stored: int  #: bytes of their payloads in the pack


@dataclass(frozen=True)
class RoleError:
    """What lossy mode did to one role of a file's tensors."""

    role: str  #: weights, first_moments or second_moments
    target: float  #: the error bound its fidelity gives this role
    error: float  #: the largest error measured when the file was sealed (same units)


@dataclass(frozen=True)
class LossyStats:
    """How a lossy file was sealed (its ``user.ckptfs.lossy.*`` attributes)."""

    fidelity: float
    scope: str  #: ``models`` or ``all``
    sensitivity: str  #: how the weights' errors were weighed
    roles: Dict[str, RoleError] = field(default_factory=dict)  #: roles with lossy elements only


@dataclass(frozen=True)
class FileStats:
    """One regular file of the mount."""

    path: str  #: absolute path through the mount
    relpath: str  #: relative to the mount point, as ``ckptfs stats`` prints it
    logical: int  #: the file's size
    stored: int  #: what it adds to the store (its stub and its own pack, or its staging file)
    state: str  #: ``staged`` (being written or waiting for its seal) or ``sealed``
    depth: int  #: longest delta chain a read of it decodes (0: stored on its own)
    pack: Optional[str]  #: id of its pack (16 hex digits); None while staged or empty
    base_pack: Optional[str]  #: the pack most of its delta chunks refer to; None for none
    base: Optional[str]  #: relpath of the file holding ``base_pack``, when one is found
    codecs: Optional[Tuple[CodecStats, ...]]  #: None when read through the CLI
    lossy: Optional[LossyStats]  #: None for files stored exactly
    mtime: float  #: last modification, seconds since the epoch

    @property
    def sealed(self) -> bool:
        return self.state == "sealed"

    @property
    def ratio(self) -> float:
        """logical / stored (0 when nothing is stored)."""
        return self.logical / self.stored if self.stored else 0.0

    @property
    def codec(self) -> str:
        """The codec holding most of the file's bytes ("delta", "tensor", "lossy", ...),
        ``staged`` while staged, ``empty`` for an empty file, ``unknown`` via the CLI."""
        if not self.sealed:
            return "staged"
        if self.codecs is None:
            return "unknown"
        if not self.codecs:
            return "empty"
        return max(self.codecs, key=lambda c: c.raw).codec

    @property
    def name(self) -> str:
        return os.path.basename(self.relpath)

    @property
    def directory(self) -> str:
        """The directory relative to the mount point ("" for the top)."""
        return os.path.dirname(self.relpath)


@dataclass(frozen=True)
class Stats:
    """The files below one path of a mount, sorted by relpath."""

    path: str  #: what was asked for, absolute
    mountpoint: str
    store: str  #: the backing store directory
    files: Tuple[FileStats, ...]
    source: str  #: ``xattr`` or ``cli``: where the numbers came from
    #: Packs of deleted files kept as bases of others (the CLI's
    #: ``kept_for_bases`` for a whole store); None when not known.
    kept_for_bases: Optional[int] = None

    @property
    def logical(self) -> int:
        return sum(f.logical for f in self.files)

    @property
    def stored(self) -> int:
        """The files' stored bytes, plus ``kept_for_bases`` when known."""
        return sum(f.stored for f in self.files) + (self.kept_for_bases or 0)

    @property
    def ratio(self) -> float:
        return self.logical / self.stored if self.stored else 0.0

    @property
    def staged(self) -> List[FileStats]:
        return [f for f in self.files if not f.sealed]

    @property
    def lossy(self) -> List[FileStats]:
        return [f for f in self.files if f.lossy is not None]

    def file(self, name: str) -> FileStats:
        """The file whose relpath, absolute path or (unique) basename is ``name``."""
        hits = [f for f in self.files if name in (f.relpath, f.path)]
        hits = hits or [f for f in self.files if f.name == name]
        if len(hits) != 1:
            raise KeyError(f"{name}: {'no' if not hits else len(hits)} matching files under {self.path}")
        return hits[0]

    def __iter__(self) -> Iterator[FileStats]:
        return iter(self.files)

    def __len__(self) -> int:
        return len(self.files)


# -- reading the attributes ------------------------------------------------------------------------

def _xattr(path: str, name: str) -> Optional[str]:
    """The attribute's value, or None when the file has none."""
    try:
        return os.getxattr(path, name, follow_symlinks=False).decode()
    except OSError as e:
        if e.errno in (errno.ENODATA, errno.ENOTSUP):
            return None
        raise


def _int_xattr(path: str, name: str) -> int:
    value = _xattr(path, USAGE_PREFIX + name)
    if value is None:
        raise OSError(errno.ENODATA, f"{path}: no {USAGE_PREFIX + name} attribute")
    return int(value)


def _parse_codecs(text: str) -> Tuple[CodecStats, ...]:
    out = []
    for item in text.split():
        name, chunks, raw, stored = item.split(":")
        out.append(CodecStats(codec=name, chunks=int(chunks), raw=int(raw), stored=int(stored)))
    return tuple(out)


def _lossy_from_xattrs(path: str) -> Optional[LossyStats]:
    fidelity = _xattr(path, LOSSY_PREFIX + "fidelity")
    if fidelity is None:
        return None
    roles = {}
    for role in ROLES:
        target = _xattr(path, f"{LOSSY_PREFIX}target.{role}")
        error = _xattr(path, f"{LOSSY_PREFIX}error.{role}")
        if target is not None and error is not None:
            roles[role] = RoleError(role=role, target=float(target), error=float(error))
    return LossyStats(fidelity=float(fidelity), scope=_xattr(path, LOSSY_PREFIX + "scope") or "models",
                      sensitivity=_xattr(path, LOSSY_PREFIX + "sensitivity") or "none", roles=roles)


def _file_from_xattrs(path: str, relpath: str, st: os.stat_result) -> Optional[FileStats]:
    """None when the daemon does not answer the usage attributes (an older ckptfs)."""
    state = _xattr(path, USAGE_PREFIX + "state")
    if state is None:
        return None
    sealed = state == "sealed"
    codecs = _xattr(path, USAGE_PREFIX + "codecs") if sealed else None
    return FileStats(
        path=path, relpath=relpath, logical=_int_xattr(path, "logical"), stored=_int_xattr(path, "stored"),
        state=state, depth=_int_xattr(path, "depth"),
        pack=_xattr(path, USAGE_PREFIX + "pack") if sealed else None,
        base_pack=_xattr(path, USAGE_PREFIX + "base") if sealed else None, base=None,
        codecs=_parse_codecs(codecs) if codecs is not None else (() if sealed else None),
        lossy=_lossy_from_xattrs(path) if sealed else None, mtime=st.st_mtime)


# -- walking the tree ------------------------------------------------------------------------------

def _regular_files(top: str) -> Iterator[Tuple[str, os.stat_result]]:
    """Regular files at or below ``top`` (symlinks not followed, hard links once)."""
    st = os.lstat(top)
    if stat_mod.S_ISREG(st.st_mode):
        yield top, st
        return
    if not stat_mod.S_ISDIR(st.st_mode):
        raise ValueError(f"{top} is neither a regular file nor a directory")
    seen = set()
    for directory, dirs, names in os.walk(top):
        dirs.sort()
        for name in sorted(names):
            path = os.path.join(directory, name)
            try:
                st = os.lstat(path)
            except FileNotFoundError:  # deleted meanwhile
                continue
            if stat_mod.S_ISREG(st.st_mode) and (st.st_dev, st.st_ino) not in seen:
                seen.add((st.st_dev, st.st_ino))
                yield path, st


def _relpath(path: str, mount: MountInfo) -> str:
    return os.path.relpath(path, mount.mountpoint) if mount.mountpoint else path


def _stats_via_xattrs(top: str, mount: MountInfo) -> Optional[List[FileStats]]:
    files = []
    for path, st in _regular_files(top):
        try:
            f = _file_from_xattrs(path, _relpath(path, mount), st)
        except FileNotFoundError:
            continue
        if f is None:
            return None
        files.append(f)
    return files


# -- the CLI fallback --------------------------------------------------------------------------------

def _cli() -> str:
    exe = os.environ.get("CKPTFS_BIN") or shutil.which("ckptfs")
    if not exe:
        raise RuntimeError("reading stats through the CLI (via='cli', or a daemon too old to answer the usage "
                           "attributes) needs the ckptfs binary on PATH or in $CKPTFS_BIN")
    return exe


def _role_errors(lossy: dict) -> Dict[str, RoleError]:
    return {r: RoleError(role=r, target=float(lossy[r]["target"]), error=float(lossy[r]["max_error"]))
            for r in ROLES if r in lossy and lossy[r].get("elements", 0) > 0}


def _stats_via_cli(top: str, mount: MountInfo) -> Tuple[List[FileStats], Optional[int]]:
    cmd = [_cli(), "stats", "--json", top]
    p = subprocess.run(cmd, stdin=subprocess.DEVNULL, capture_output=True, text=True)
    if p.returncode != 0:
        raise RuntimeError(f"`{' '.join(cmd)}` failed (exit {p.returncode}): {p.stderr.strip()}")
    j = json.loads(p.stdout)
    files = []
    for e in j["files"]:
        path = os.path.join(mount.mountpoint, e["path"])
        try:
            mtime = os.lstat(path).st_mtime
        except FileNotFoundError:
            continue
        lossy = e.get("lossy")
        base = e.get("base") or None
        base_pack = None
        if base and base.startswith("(deleted file, pack "):
            base_pack, base = base[len("(deleted file, pack "):].rstrip(")"), None
        files.append(FileStats(
            path=path, relpath=e["path"], logical=int(e["logical"]), stored=int(e["stored"]),
            state="staged" if e["staged"] else "sealed", depth=int(e["depth"]), pack=None, base_pack=base_pack,
            base=base, codecs=None, mtime=mtime,
            lossy=None if not lossy else LossyStats(
                fidelity=float(lossy["fidelity"]), scope=lossy.get("scope", "models"),
                sensitivity=lossy.get("sensitivity", "none"), roles=_role_errors(lossy))))
    kept = j.get("total", {}).get("kept_for_bases")
    return files, (int(kept) if kept is not None and os.path.realpath(top) == mount.mountpoint else None)


# -- the API -----------------------------------------------------------------------------------------

def stats(path: PathLike, *, via: str = "auto") -> Stats:
    """How the files at or below ``path`` (a file or directory inside a
    ckptfs mount) are stored.

    ``via="xattr"`` reads the files' attributes through the mount (no CLI,
    no access to the backing store needed); ``via="cli"`` runs
    ``ckptfs stats --json`` (``$CKPTFS_BIN`` or ``ckptfs`` on PATH; it reads
    the backing store, so it usually needs the daemon's user); ``auto``
    (the default) uses the attributes when the daemon answers them.

    Raises :class:`~ckptfs.NotOnCkptfsError` for a path outside any ckptfs
    mount, FileNotFoundError for a missing one.
    """
    if via not in ("auto", "xattr", "cli"):
        raise ValueError(f"via={via!r}: expected 'auto', 'xattr' or 'cli'")
    mount = mount_of(path)
    top = os.path.realpath(os.fspath(path))
    files: Optional[List[FileStats]] = None
    kept = None
    source = "xattr"
    if via != "cli":
        files = _stats_via_xattrs(top, mount)
        if files is None and via == "xattr":
            raise RuntimeError(f"the ckptfs daemon serving {mount.mountpoint} does not answer the usage "
                               f"attributes (user.ckptfs.state): it predates them; use via='cli'")
    if files is None:
        files, kept = _stats_via_cli(top, mount)
        source = "cli"
    else:
        files = _with_bases(files, mount)
    files.sort(key=lambda f: f.relpath)
    return Stats(path=top, mountpoint=mount.mountpoint, store=mount.source, files=tuple(files), source=source,
                 kept_for_bases=kept)


def _with_bases(files: List[FileStats], mount: MountInfo) -> List[FileStats]:
    """``files`` with ``base`` named: the file holding each base pack, found
    among ``files`` or else beside the files that refer to it."""
    owner = {f.pack: f.relpath for f in files if f.pack}
    wanted = {f.base_pack for f in files if f.base_pack and f.base_pack not in owner}
    for directory in sorted({os.path.dirname(f.path) for f in files if f.base_pack in wanted}):
        try:
            names = sorted(os.listdir(directory))
        except OSError:
            continue
        for name in names:
            path = os.path.join(directory, name)
            try:
                pack = _xattr(path, USAGE_PREFIX + "pack")
            except OSError:
                continue
            if pack in wanted and pack not in owner:
                owner[pack] = _relpath(path, mount)
    return [replace(f, base=owner.get(f.base_pack)) if f.base_pack else f for f in files]


def wait_sealed(path: PathLike, timeout: float = 120.0, *, poll: float = 0.1) -> Stats:
    """Waits until every file at or below ``path`` is sealed (compressed and
    published in the store), then returns their :class:`Stats`.

    Files still being written stay staged until they are closed, so call it
    after the checkpoint's files are closed. Files created while it waits
    are not waited for; files deleted meanwhile count as done. Raises
    TimeoutError, naming the files still staged, after ``timeout`` seconds.
    """
    mount = mount_of(path)
    top = os.path.realpath(os.fspath(path))
    deadline = time.monotonic() + timeout
    pending = [p for p, _ in _regular_files(top)]
    while True:
        pending = [p for p in pending if _still_staged(p, mount)]
        if not pending:
            return stats(path)
        if time.monotonic() >= deadline:
            shown = ", ".join(_relpath(p, mount) for p in pending[:10])
            more = f" and {len(pending) - 10} more" if len(pending) > 10 else ""
            raise TimeoutError(f"{len(pending)} file(s) still staged after {timeout} s: {shown}{more}")
        time.sleep(poll)


def _still_staged(path: str, mount: MountInfo) -> bool:
    try:
        state = _xattr(path, USAGE_PREFIX + "state")
    except FileNotFoundError:
        return False
    if state is not None:
        return state != "sealed"
    # A daemon without the attribute: ask the CLI about this one file.
    files, _ = _stats_via_cli(path, mount)
    return any(not f.sealed for f in files)

