#!/usr/bin/env bash
# Fails when a source file includes a header of a layer above its own.
# The layers (docs/ARCHITECTURE.md): mount-tools -> fuse -> store -> codec -> base,
# with cache/ beside store/ and gpu/ implementing codec's device interface.
# Each line: a folder, then the folders it must not include from.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

FORBIDDEN=(
  "base:codec store cache fuse gpu mount-tools"
  "codec:store cache fuse gpu mount-tools"
  "gpu:store cache fuse mount-tools"
  "store:fuse gpu mount-tools"
  "cache:fuse gpu mount-tools"
  "fuse:gpu mount-tools"
)

bad=0
for rule in "${FORBIDDEN[@]}"; do
  from=${rule%%:*}
  for to in ${rule#*:}; do
    while IFS= read -r hit; do
      echo "check-layers: $hit: $from/ must not include $to/ (dependencies point one way)" >&2
      bad=1
    done < <(grep -rnE "^[[:space:]]*#[[:space:]]*include[[:space:]]+\"$to/" "$from" \
               --include='*.h' --include='*.cc' --include='*.cu' --include='*.cuh' || true)
  done
done
if ((bad)); then exit 1; fi
echo "check-layers: ok (no include points up a layer)"
