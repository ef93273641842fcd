"""Reads the package version from the repository's CMakeLists.txt, the one
place that holds ckptfs's version; everything else is in pyproject.toml."""
import pathlib
import re

from setuptools import setup

CMAKE = pathlib.Path(__file__).resolve().parent.parent / "CMakeLists.txt"


def cmake_version() -> str:
    try:
        text = CMAKE.read_text()
    except OSError as e:
        raise SystemExit(f"ckptfs: cannot read the version from {CMAKE} ({e}); "
                         "build the package from the ckptfs repository (pip install ./python)")
    m = re.search(r"project\(\s*ckptfs\s+VERSION\s+([0-9][0-9.]*)", text)
    if not m:
        raise SystemExit(f"ckptfs: no `project(ckptfs VERSION X.Y.Z)` in {CMAKE}")
    return m.group(1)


setup(version=cmake_version())
