"""Real local users for the hostile-tenant tests (test_security.py,
test_tenants.py): accounts made with useradd for the test and removed
after it, whose commands run through setpriv with only their own groups,
and a mount with allow_other on a path they can walk."""
from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import tempfile
import uuid
from pathlib import Path

import pytest

from conftest import describe

PY = "/usr/bin/python3"


class User:
    def __init__(self, name: str):
        self.name = name
        out = subprocess.run(["id", "-u", name], capture_output=True, text=True, check=True)
        self.uid = int(out.stdout)
        self.gid = int(subprocess.run(["id", "-g", name], capture_output=True, text=True,
                                      check=True).stdout)

    def run(self, code: str, umask: int = 0o022) -> subprocess.CompletedProcess:
        """Runs Python `code` as this user, with their own groups only."""
        prelude = f"import os, errno, json\nos.umask({umask:#o})\n"
        return subprocess.run(
            ["setpriv", f"--reuid={self.uid}", f"--regid={self.gid}", "--init-groups",
             "--reset-env", PY, "-c", prelude + code],
            capture_output=True, text=True, timeout=120, cwd="/")

    def attempts(self, calls: dict[str, str], umask: int = 0o022) -> dict[str, str]:
        """Runs each Python expression as this user: {name: "OK" or errno name}."""
        body = "res = {}\n"
        for name, expr in calls.items():
            body += (f"try:\n    ({expr})\n    res[{name!r}] = 'OK'\n"
                     f"except OSError as e:\n    res[{name!r}] = errno.errorcode.get(e.errno, str(e.errno))\n")
        body += "print(json.dumps(res))\n"
        p = self.run(body, umask)
        assert p.returncode == 0, describe(p, f"attempts as {self.name}")
        return json.loads(p.stdout)


@pytest.fixture(scope="module")
def users():
    if os.geteuid() != 0:
        pytest.fail("needs root to create users (CI runs as root)")
    made = []
    try:
        for role in ("atk", "vic"):
            name = f"ckfs{role}{uuid.uuid4().hex[:8]}"
            p = subprocess.run(["useradd", "--no-create-home", "--user-group", "--shell", "/usr/sbin/nologin",
                                name], capture_output=True, text=True)
            assert p.returncode == 0, f"useradd {name}: {p.stderr}"
            made.append(name)
        yield User(made[0]), User(made[1])
    finally:
        for name in made:
            subprocess.run(["userdel", name], capture_output=True)
            subprocess.run(["groupdel", name], capture_output=True)  # when userdel left it


@pytest.fixture
def shared_top():
    # pytest's tmp dirs are 0700: other users need a path they can walk.
    top = Path(tempfile.mkdtemp(prefix="ckptfs-sec-", dir="/tmp"))
    top.chmod(0o755)
    yield top
    shutil.rmtree(top, ignore_errors=True)


@pytest.fixture
def shared_mount(shared_top, mount_factory):  # shared_top is removed after the unmount
    # A new store's mount root is 0755 like a fresh file system's, although
    # the daemon's umask is 077.
    m = mount_factory(opts=["allow_other"], backing=shared_top / "backing", mnt=shared_top / "mnt")
    assert stat.S_IMODE(os.stat(m.mnt).st_mode) == 0o755
    return m
