"""Hostile tenants, round two (issue 40): no local user can stall, flood or
steer the daemon. A real second user (local_users.py) attacks a root
daemon mounted with allow_other; each section covers one way in, and each
test fails on the binary before issue 40's fixes.

  1. file descriptors: one user's files cannot exhaust the daemon's fds;
  2. the log: nothing a user supplies forges or floods a log line;
  3. sealing: holes cost nothing, unlinked files stop sealing, one user's
     big file does not hold another user's small one;
  4. lossy scope: data files named like parameters stay exact.
"""
from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from conftest import describe, run_ckptfs
from local_users import PY, User, shared_mount, shared_top, users  # noqa: F401 (fixtures)


# ------------------------------------------------- 1. bounded file descriptors
# (section 1 tests go here)


# ----------------------------------------------------------- 2. the log
# (section 2 tests go here)


# ----------------------------------------------------- 3. fair, bounded sealing
# (section 3 tests go here)


# ------------------------------------------------------- 4. lossy scope
# (section 4 tests go here)
