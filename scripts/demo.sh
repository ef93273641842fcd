#!/usr/bin/env bash
# ckptfs demo: installs dependencies, builds, mounts the store
# ./ckptfs-data/store on ./checkpoints, trains a small PyTorch model that saves
# each checkpoint into ./checkpoints/demo-run/lossless and (policy lossy=0.05)
# ./checkpoints/demo-run/lossy, restores the last of each, prints logical vs
# stored bytes per checkpoint side by side with the restored models' loss, and
# writes the HTML report ./ckptfs-report.html (demo/train_demo.py).
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
# The demo's checkpoints are 1.5 MiB: chunks of 256 KiB (default 4 MiB) let
# the lossless series show its deltas, which are chosen chunk by chunk.
"$CKPTFS" mount -o chunk_size=256K "$STORE" "$MNT"

"$ROOT/.venv-debian/bin/python" demo/train_demo.py --dir "$MNT" --report "$ROOT/ckptfs-report.html"

cat <<EOF

ckptfs is still mounted: $MNT  (store: $STORE, log: $STORE/ckptfs.log)
  report:   $ROOT/ckptfs-report.html
  inspect:  build/ckptfs stats ./checkpoints/demo-run
  unmount:  build/ckptfs umount ./checkpoints
EOF
