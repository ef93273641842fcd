"""Installing the way admins install (issue 19): `cmake --install` into a
scratch root, the .deb CPack builds (its dependencies are Debian 12
packages; installed with dpkg -x into a scratch root, whose binary and
helper then mount), the man page, bash completion and the systemd unit
(readiness after recovery through NOTIFY_SOCKET, a clean stop that waits
for the seals), run here as systemd would run it.
"""
from __future__ import annotations

import json
import os
import re
import shlex
import socket
import subprocess
import time
from pathlib import Path

import pytest

from conftest import CKPTFS, ROOT, ckptfs_features, describe, is_mounted, require_binary, run_ckptfs
from test_admin import USE_AND_UNMOUNT, assert_store_holds_data, in_mount_namespace, mounted_line

BUILD = CKPTFS.parent
UNIT = ROOT / "packaging" / "ckptfs@.service"


def run(*args, **kw) -> subprocess.CompletedProcess:
    return subprocess.run([str(a) for a in args], capture_output=True, text=True, timeout=300, **kw)


def cmake_install(dest: Path, prefix: str = "/usr") -> Path:
    require_binary()
    p = run("cmake", "--install", BUILD, "--prefix", prefix, env=dict(os.environ, DESTDIR=str(dest)))
    assert p.returncode == 0, describe(p)
    return dest / prefix.lstrip("/")


def test_cmake_install_puts_everything_in_place(tmp_path):
    usr = cmake_install(tmp_path / "root")
    assert os.access(usr / "bin/ckptfs", os.X_OK)
    for helper in ("mount.ckptfs", "mount.fuse.ckptfs"):
        link = usr / "sbin" / helper
        assert link.is_symlink() and os.readlink(link) == "../bin/ckptfs", link
        assert link.resolve() == (usr / "bin/ckptfs").resolve()
    assert (usr / "lib/systemd/system/ckptfs@.service").read_text() == UNIT.read_text()
    assert (usr / "share/bash-completion/completions/ckptfs").exists()
    assert (usr / "share/man/man8/ckptfs.8").exists()
    v = run(usr / "bin/ckptfs", "--version")
    assert v.returncode == 0 and v.stdout == run_ckptfs("--version").stdout, describe(v)


def mount_option_names() -> list[str]:
    """Every -o option `ckptfs mount --help` lists: the table's, then the
    paragraph of those passed to the kernel."""
    table = run_ckptfs("mount", "--help").stdout.split("Mount options (-o, comma-separated):")[1]
    own, kernel = table.split("\n  allow_other", 1)
    kernel = "allow_other" + kernel.split(": passed to the kernel mount")[0]
    names = re.findall(r"^  ([a-z_]+)", own, re.M) + re.split(r",\s*", kernel.strip())
    assert "cache_size" in names and "allow_other" in names and "noatime" in names, names
    return names


def test_man_page_renders_and_covers_every_option_and_exit_code(tmp_path):
    usr = cmake_install(tmp_path / "root")
    page = usr / "share/man/man8/ckptfs.8"
    p = run("man", "-l", page, env=dict(os.environ, MANWIDTH="100", MAN_KEEP_FORMATTING="0"))
    assert p.returncode == 0, describe(p)
    text = re.sub(".\b", "", p.stdout)  # man's overstrike bold
    for section in ("SYNOPSIS", "COMMANDS", "MOUNT OPTIONS", "FSTAB AND MOUNT(8)", "SYSTEMD", "EXIT STATUS"):
        assert section in text, section
    source = (ROOT / "docs/ckptfs.8.scd").read_text()
    missing = [n for n in mount_option_names() if f"*{n}" not in source]
    assert not missing, f"docs/ckptfs.8.scd does not describe mount options {missing}"
    for sub in ("mount", "umount", "stats", "fsck", "gc", "inspect", "export", "import", "freeze", "thaw", "top"):
        assert f"*{sub}*" in source, sub


def complete(script: Path, words: list[str]) -> list[str]:
    """What the completion script offers for the last of `words`."""
    line = " ".join(shlex.quote(w) for w in words)
    code = (f"source {shlex.quote(str(script))}; COMP_WORDS=({line}); COMP_CWORD={len(words) - 1}; "
            f"_ckptfs; printf '%s\\n' \"${{COMPREPLY[@]}}\"")
    p = run("bash", "-c", code)
    assert p.returncode == 0, describe(p)
    return [w for w in p.stdout.splitlines() if w]


def test_bash_completion(tmp_path):
    script = ROOT / "packaging" / "ckptfs.bash-completion"
    ckptfs = str(CKPTFS)
    assert complete(script, [ckptfs, "fs"]) == ["fsck"]
    subs = {"mount", "umount", "stats", "fsck", "gc", "inspect", "export", "import", "freeze", "thaw", "top"}
    assert set(complete(script, [ckptfs, ""])) == subs | {"--help", "--version"}
    assert complete(script, [ckptfs, "fsck", "--j"]) == ["--json"]
    assert complete(script, [ckptfs, "mount", "-o", "cache_size=1G,zst"]) == ["cache_size=1G,zstd_level="]
    assert complete(script, [ckptfs, "mount", "-o", "allow_o"]) == ["allow_other"]
    offered = complete(script, [ckptfs, "mount", "-o", ""])
    assert {o.rstrip("=") for o in offered} == set(mount_option_names())


def deb_file(tmp_path: Path) -> Path:
    require_binary()
    config = BUILD / "CPackConfig.cmake"
    assert config.exists(), f"{config} is missing: configure the build with cmake first"
    p = run("cpack", "-G", "DEB", "-B", tmp_path / "deb", "--config", config)
    assert p.returncode == 0, describe(p)
    debs = list((tmp_path / "deb").glob("ckptfs_*.deb"))
    assert len(debs) == 1, p.stdout
    return debs[0]


def test_deb_depends_on_debian_packages_and_installs_and_mounts(tmp_path):
    deb = deb_file(tmp_path)
    fields = run("dpkg-deb", "-f", deb, "Package", "Version", "Depends", "Recommends").stdout
    assert "Package: ckptfs" in fields
    version = run_ckptfs("--version").stdout.split()[1]
    assert f"Version: {version}" in fields, fields
    depends = re.search(r"^Depends: (.*)$", fields, re.M).group(1)
    names = [re.match(r"\s*([a-z0-9.+-]+)", d).group(1) for d in depends.split(",")]
    assert "fuse3" in names and "libfuse3-3" in names, names
    # RADOS is an optional backend, loaded at run time: recommended at most.
    assert not [n for n in names if n.startswith("librados")], names
    if "rados" in ckptfs_features():
        assert re.search(r"^Recommends: .*\blibrados2\b", fields, re.M), fields
    # apt resolves every dependency from Debian's archive (and installs nothing: -s).
    sim = run("apt-get", "-s", "install", deb)
    assert sim.returncode == 0 and "Inst ckptfs" in sim.stdout, describe(sim)

    root = tmp_path / "root"
    p = run("dpkg", "-x", deb, root)
    assert p.returncode == 0, describe(p)
    installed = root / "usr/bin/ckptfs"
    assert run(installed, "--version").stdout.splitlines()[0] == f"ckptfs {version}"
    # The package's binary and helper in place of the system's, in a mount
    # namespace only: mount(8) finds /sbin/mount.fuse.ckptfs -> ../bin/ckptfs.
    p = in_mount_namespace(tmp_path, f"""
mount -t overlay overlay -o lowerdir={root}/usr/bin:/usr/bin /usr/bin
mount -t overlay overlay -o lowerdir={root}/usr/sbin:/usr/sbin /usr/sbin
CKPTFS=/usr/bin/ckptfs
echo "$S $M fuse.ckptfs _netdev,nofail,defaults,allow_other 0 0" > "$T/fstab"
mount -T "$T/fstab" "$M"
echo "DAEMON $(readlink /proc/$(pgrep -n -f "mount.fuse.ckptfs $S")/exe)"
""" + USE_AND_UNMOUNT)
    assert p.returncode == 0, describe(p)
    assert " fuse.ckptfs " in mounted_line(p.stdout)
    assert "DAEMON /usr/bin/ckptfs" in p.stdout, p.stdout
    assert_store_holds_data(tmp_path)


# --- the systemd unit ---------------------------------------------------------

def unit_commands(unit_text: str) -> dict[str, str]:
    return dict(re.findall(r"^(Exec\w+)=(.*)$", unit_text, re.M))


def test_unit_file_is_valid_for_systemd(tmp_path):
    text = UNIT.read_text()
    assert re.search(r"^Type=notify$", text, re.M) and re.search(r"^EnvironmentFile=/etc/ckptfs/%i.conf$", text, re.M)
    if not Path("/usr/bin/systemd-analyze").exists():
        pytest.skip("systemd-analyze is not installed")
    unit = tmp_path / "ckptfs@mnt-ckpt.service"
    unit.write_text(text)
    p = run("systemd-analyze", "verify", unit)
    # Only what this machine lacks: ckptfs and its man page are not installed.
    problems = [ln for ln in (p.stdout + p.stderr).splitlines()
                if ln.strip() and "is not executable" not in ln and "man ckptfs(8)" not in ln]
    assert not problems, describe(p)


class NotifySocket:
    """The socket systemd hands a Type=notify service in NOTIFY_SOCKET."""

    def __init__(self, path: Path):
        self.path = str(path)
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(self.path)

    def wait_for(self, key: str, proc: subprocess.Popen, timeout: float = 60) -> str:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            self.sock.settimeout(0.2)
            try:
                msg = self.sock.recv(4096).decode()
            except socket.timeout:
                assert proc.poll() is None, f"the service exited ({proc.returncode}) before {key}"
                continue
            if key in msg.splitlines():
                return msg
        raise AssertionError(f"no {key} within {timeout} s")


def test_unit_runs_as_systemd_runs_it(tmp_path):
    """ExecStart and ExecStop of ckptfs@.service with %f, %i and the
    environment file filled in as systemd fills them: READY=1 comes once
    recovery is done and the mount serves; the stop waits for the seal."""
    require_binary()
    store, mnt = tmp_path / "store", tmp_path / "mnt"
    store.mkdir(), mnt.mkdir()
    env_file = {"CKPTFS_STORE": str(store), "CKPTFS_OPTIONS": "cache_size=64M,zstd_level=5"}
    cmds = unit_commands(UNIT.read_text())

    def argv(key: str) -> list[str]:
        line = cmds[key].lstrip("-").replace("%f", str(mnt))
        line = re.sub(r"\$\{(\w+)\}", lambda m: shlex.quote(env_file[m.group(1)]), line)
        words = shlex.split(line)
        assert words[0] == "ckptfs", words
        return [str(CKPTFS)] + words[1:]

    notify = NotifySocket(tmp_path / "notify")
    log = open(tmp_path / "journal", "w")
    proc = subprocess.Popen(argv("ExecStart"), env=dict(os.environ, NOTIFY_SOCKET=notify.path),
                            stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT)
    try:
        ready = notify.wait_for("READY=1", proc)
        assert is_mounted(mnt), "READY=1 before the mount serves"
        journal = (tmp_path / "journal").read_text()
        assert "recovery: scanned" in journal, journal  # the log reaches stderr, hence the journal
        assert "STATUS=serving" in ready
        data = os.urandom(3 << 20)
        (mnt / "ckpt.bin").write_bytes(data)
        stop = run(*argv("ExecStop"))
        assert stop.returncode == 0, describe(stop)
        notify.wait_for("STOPPING=1", proc) if proc.poll() is None else None
        assert proc.wait(timeout=60) == 0
    finally:
        if proc.poll() is None:
            run_ckptfs("umount", "--lazy", mnt)
            proc.kill()
        log.close()
    assert not is_mounted(mnt)
    # Sealed before the stop returned: an unmounted store holds the file whole.
    st = json.loads(run_ckptfs("stats", "--json", store).stdout)
    files = {f["path"]: f for f in st["files"]}
    assert files["ckpt.bin"]["logical"] == len(data) and not files["ckpt.bin"]["staged"], files
    assert run_ckptfs("fsck", store).returncode == 0
    post = run(*argv("ExecStopPost"))
    assert post.returncode == 2, describe(post)  # nothing left to detach
