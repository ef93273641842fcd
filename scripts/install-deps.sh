#!/usr/bin/env bash
# Installs everything ckptfs needs to build and test (Debian 12, run as root
# or via sudo). Idempotent and silent when everything is already present.
#   - apt packages (only missing ones; `apt-get update` only if something is missing)
#   - project-local venv .venv-debian from Debian's /usr/bin/python3 with
#     --system-site-packages, so it sees Debian's python3-torch / numpy / pytest
#   - /dev/fuse (modprobe fuse when possible)
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"

PKGS=(
  build-essential cmake pkg-config
  fuse3 libfuse3-dev
  libzstd-dev zstd libxxhash-dev
  libcli11-dev nlohmann-json3-dev libspdlog-dev libfmt-dev
  googletest libgtest-dev
  python3 python3-venv python3-torch python3-numpy python3-pytest python3-psutil
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
