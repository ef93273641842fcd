#!/usr/bin/env bash
# ckptfs demo: installs dependencies, builds, mounts the store
# ./ckptfs-data/store on ./checkpoints, trains a tiny PyTorch model that saves
# checkpoints there, verifies the last one and prints logical vs stored bytes.
# The mount stays up afterwards; unmount with: build/ckptfs umount ./checkpoints
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"

bash scripts/install-deps.sh
bash scripts/build.sh

STORE="$ROOT/ckptfs-data/store"
MNT="$ROOT/checkpoints"
CKPTFS="$ROOT/build/ckptfs"

is_mounted() {  # works for stale (ENOTCONN) mounts too: never stats the path
  awk -v m="$1" '$5 == m { found = 1 } END { exit !found }' /proc/self/mountinfo
}

if is_mounted "$MNT"; then
  echo "demo: unmounting the previous mount on $MNT"
  "$CKPTFS" umount "$MNT" || fusermount3 -uz "$MNT" || umount -l "$MNT"
fi
mkdir -p "$STORE" "$MNT"

echo "demo: mounting $STORE on $MNT"
"$CKPTFS" mount "$STORE" "$MNT"

"$ROOT/.venv-debian/bin/python" demo/train_demo.py --dir "$MNT"

cat <<EOF

ckptfs is still mounted: $MNT  (store: $STORE, log: $STORE/ckptfs.log)
  inspect:  build/ckptfs stats ./checkpoints
  unmount:  build/ckptfs umount ./checkpoints
EOF
