"""The lossy policy of a directory: the ``user.ckptfs.policy`` attribute.

A directory's policy covers its whole subtree, the nearest directory with
one winning, else the mount's ``-o lossy`` option (docs/SEMANTICS.md,
"Lossy mode"). It is looked up when a file is sealed, so it applies to
files closed after it is set.
"""
from __future__ import annotations

import errno
import math
import os
from dataclasses import dataclass
from typing import Optional, Union

from ._mounts import PathLike, mount_of

POLICY_XATTR = "user.ckptfs.policy"
EFFECTIVE_POLICY_XATTR = "user.ckptfs.effective_policy"
#: The fidelity a bare ``lossy`` policy means (codec/lossy/policy.h).
DEFAULT_FIDELITY = 0.01
MAX_FIDELITY = 0.5
SCOPES = ("models", "all")


@dataclass(frozen=True)
class Policy:
    """A lossy policy in its parsed form."""

    fidelity: float  #: 0 for lossless; else the weights' relative error target
    scope: str = "models"  #: ``models`` (parameters and optimizer state) or ``all`` (every float tensor)
    #: Whether the directory asked about carries the policy itself (else it
    #: is inherited from a directory above, or the mount's option).
    explicit: bool = False

    @property
    def lossy(self) -> bool:
        return self.fidelity > 0

    @property
    def text(self) -> str:
        """The attribute's text form: ``lossless``, ``lossy=0.05``, ``lossy=0.05,scope=all``."""
        if not self.lossy:
            return "lossless"
        return f"lossy={self.fidelity!r}" + (",scope=all" if self.scope == "all" else "")

    @classmethod
    def parse(cls, text: str, *, explicit: bool = False) -> "Policy":
        """Parses the attribute's text form (what the daemon accepts)."""
        body = text.strip().rstrip("\0")
        scope = "models"
        if "," in body:
            body, rest = body.split(",", 1)
            if not rest.startswith("scope=") or rest[6:] not in SCOPES:
                raise ValueError(f"policy {text!r}: expected ',scope=models' or ',scope=all' after the comma")
            scope = rest[6:]
        if body == "lossless" and scope == "models" and "," not in text:
            return cls(0.0, explicit=explicit)
        if body == "lossy":
            return cls(DEFAULT_FIDELITY, scope, explicit)
        if body.startswith("lossy="):
            return cls(_fidelity(body[6:], text), scope, explicit)
        raise ValueError(f"policy {text!r}: expected 'lossless', 'lossy' or 'lossy=FIDELITY' "
                         f"(0 < FIDELITY <= {MAX_FIDELITY}), optionally followed by ',scope=all'")


def _fidelity(value: Union[str, float], shown: object) -> float:
    try:
        f = float(value)
    except ValueError:
        f = math.nan
    if not (0 < f <= MAX_FIDELITY):
        raise ValueError(f"lossy fidelity {shown!r}: expected a number in (0, {MAX_FIDELITY}], e.g. 0.05 "
                         f"(the weights' relative error target)")
    return f


LossyArg = Union[bool, float, int, str, Policy]


def _policy_of(lossy: LossyArg, scope: Optional[str]) -> Policy:
    if scope is not None and scope not in SCOPES:
        raise ValueError(f"scope={scope!r}: expected one of {SCOPES}")
    if isinstance(lossy, Policy):
        p = lossy
    elif isinstance(lossy, bool):
        p = Policy(DEFAULT_FIDELITY if lossy else 0.0)
    elif isinstance(lossy, (int, float)):
        p = Policy(_fidelity(lossy, lossy))
    elif isinstance(lossy, str):
        p = Policy.parse(lossy)
    else:
        raise TypeError(f"lossy={lossy!r}: expected True/False, a fidelity such as 0.05, or a policy string")
    if scope is not None:
        if not p.lossy:
            raise ValueError("scope applies to a lossy policy only")
        p = Policy(p.fidelity, scope)
    return p


def _directory(path: PathLike) -> str:
    mount_of(path)
    d = os.path.realpath(os.fspath(path))
    if not os.path.isdir(d):
        raise NotADirectoryError(errno.ENOTDIR, "a lossy policy applies to a directory (its whole subtree)", d)
    return d


def set_policy(directory: PathLike, lossy: LossyArg, *, scope: Optional[str] = None) -> Policy:
    """Sets the lossy policy of ``directory`` and its subtree.

    ``lossy`` is ``False`` or ``"lossless"`` (store exactly, overriding a
    lossy policy above), ``True`` or ``"lossy"`` (the default fidelity,
    0.01), a fidelity such as ``0.05`` (0 < f <= 0.5), or the attribute's
    text (``"lossy=0.05,scope=all"``). ``scope="all"`` also quantizes
    NumPy arrays, data tensors and buffers (default ``models``).

    Only the directory's owner (or root) may set it. Returns the policy
    the directory now has. Files already sealed keep how they were stored.
    """
    d = _directory(directory)
    p = _policy_of(lossy, scope)
    try:
        os.setxattr(d, POLICY_XATTR, p.text.encode())
    except OSError as e:
        if e.errno == errno.EINVAL:
            raise ValueError(f"ckptfs refused policy {p.text!r} on {d}: {e.strerror}") from e
        raise
    return get_policy(d)


def clear_policy(directory: PathLike) -> Policy:
    """Removes the directory's own policy (it then inherits from above);
    returns the policy that now applies."""
    d = _directory(directory)
    try:
        os.removexattr(d, POLICY_XATTR)
    except OSError as e:
        if e.errno != errno.ENODATA:
            raise
    return get_policy(d)


def get_policy(directory: PathLike) -> Policy:
    """The policy a file sealed in ``directory`` now would get: its own
    ``user.ckptfs.policy``, else the nearest directory's above it, else the
    mount's ``-o lossy`` option. ``Policy.explicit`` says whether it is the
    directory's own."""
    d = _directory(directory)
    try:
        own = os.getxattr(d, POLICY_XATTR).decode()
    except OSError as e:
        if e.errno not in (errno.ENODATA, errno.ENOTSUP):
            raise
        own = None
    if own is not None:
        return Policy.parse(own, explicit=True)
    try:
        effective = os.getxattr(d, EFFECTIVE_POLICY_XATTR).decode()
    except OSError as e:
        if e.errno in (errno.ENODATA, errno.ENOTSUP):
            raise RuntimeError(f"the ckptfs daemon serving {d} does not answer {EFFECTIVE_POLICY_XATTR} "
                               f"(it predates it), so the inherited policy is unknown") from e
        raise
    return Policy.parse(effective)
