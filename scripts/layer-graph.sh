#!/usr/bin/env bash
# Prints the folder-to-folder include graph: "from -> to: count" for every
# #include "folder/..." that crosses folders (docs/ARCHITECTURE.md's picture).
# Usage: scripts/layer-graph.sh [git-revision]   (default: the work tree)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
FOLDERS="base codec store cache fuse gpu mount-tools"
rev=${1:-}
list() {
  if [[ -n $rev ]]; then git ls-tree -r --name-only "$rev" -- $FOLDERS
  else git ls-files -co --exclude-standard -- $FOLDERS; fi
}
show() { if [[ -n $rev ]]; then git show "$rev:$1"; else cat "$1"; fi; }
list | grep -E '\.(h|cc|cu|cuh)$' | while read -r f; do
  from=${f%%/*}
  show "$f" | sed -nE 's/^[[:space:]]*#[[:space:]]*include[[:space:]]+"([^/"]+)\/.*/\1/p' |
    while read -r to; do
      if [[ " $FOLDERS " == *" $to "* && $to != "$from" ]]; then echo "$from -> $to"; fi
    done
done | sort | uniq -c | awk '{printf "%-12s -> %-12s %3d\n", $2, $4, $1}'
