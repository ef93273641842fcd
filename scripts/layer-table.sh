#!/usr/bin/env bash
# Prints the folder-to-folder include table that docs/ARCHITECTURE.md embeds
# between <!-- layer-table:begin --> and <!-- layer-table:end -->: one row per
# edge "from -> to" with the number of #include "to/..." lines in from's
# *.h/*.cc/*.cu/*.cuh files. Self-edges are left out.
#
# Folders: every top-level folder with a CMakeLists.txt except the ones that
# are not library code (bench, tests, packaging), so a new layer (seal/, say)
# appears without editing this script. A subfolder is its own row
# (codec/formats, codec/lossless, codec/lossy, store/cluster...): issue 42 is
# about which folders name formats, and codec/formats is where formats live.
# A file directly in codec/ is "codec".
#
# Usage: scripts/layer-table.sh            print the table
#        scripts/layer-table.sh --write    rewrite the block in docs/ARCHITECTURE.md
# scripts/check-layers.sh fails when the embedded block differs.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

DOC=docs/ARCHITECTURE.md
BEGIN='<!-- layer-table:begin -->'
END='<!-- layer-table:end -->'
# Top to bottom; folders not named here sort after these, by name.
ORDER="mount-tools fuse seal plan cache store gpu codec base"

folders() {
  for f in */CMakeLists.txt; do
    d=${f%%/*}
    case $d in bench | tests | packaging | build* | python | demo) continue ;; esac
    echo "$d"
  done
}

# The folder a repository path belongs to: top-level folder, plus its first
# subfolder when the path lies in one.
folder_of() { awk -F/ '{ if (NF >= 3) print $1 "/" $2; else print $1 }'; }

table() {
  local tops
  tops=$(folders | tr '\n' ' ')
  # Every source file of every folder, with the paths it includes.
  for top in $tops; do
    find "$top" -type f \( -name '*.h' -o -name '*.cc' -o -name '*.cu' -o -name '*.cuh' \) | sort
  done | while read -r file; do
    from=$(folder_of <<<"$file")
    sed -nE 's/^[[:space:]]*#[[:space:]]*include[[:space:]]+"([^"]+)".*/\1/p' "$file" |
      while read -r inc; do
        top=${inc%%/*}
        [[ " $tops " == *" $top "* && $inc == */* ]] || continue
        to=$(folder_of <<<"$inc")
        # An include of a subfolder that does not exist (yet) counts as the top.
        if [[ $to == */* && ! -d $to ]]; then to=$top; fi
        if [[ $to != "$from" ]]; then echo "$from $to"; fi
      done
  done | sort | uniq -c | awk -v order="$ORDER" '
    BEGIN { n = split(order, o, " "); for (i = 1; i <= n; i++) rank[o[i]] = i }
    function key(f,   t) { t = f; sub(/\/.*/, "", t); return sprintf("%02d %s", (t in rank) ? rank[t] : 99, f) }
    { print key($2) "\t" key($3) "\t" $2 "\t" $3 "\t" $1 }' |
    sort -t$'\t' -k1,1 -k2,2 | awk -F'\t' '
    BEGIN { print "| edge | includes |"; print "|---|---:|" }
    { print "| " $3 " -> " $4 " | " $5 " |" }'
}

# The block as ARCHITECTURE.md holds it (between the markers, exclusive).
embedded() { awk -v b="$BEGIN" -v e="$END" '$0 == e { on = 0 } on { print } $0 == b { on = 1 }' "$DOC"; }

case ${1:-} in
  "") table ;;
  --write)
    if ! grep -qxF "$BEGIN" "$DOC" || ! grep -qxF "$END" "$DOC"; then
      echo "layer-table: $DOC has no $BEGIN / $END lines" >&2
      exit 1
    fi
    new=$(table)
    awk -v b="$BEGIN" -v e="$END" -v t="$new" '
      $0 == b { print; print t; skip = 1; next }
      $0 == e { skip = 0 }
      !skip { print }' "$DOC" >"$DOC.tmp"
    mv "$DOC.tmp" "$DOC"
    echo "layer-table: wrote $(wc -l <<<"$new") lines into $DOC"
    ;;
  --check)
    if ! diff <(embedded) <(table) >&2; then
      echo "layer-table: the include table in $DOC is stale (lines above: < doc, > code);" \
        "run scripts/layer-table.sh --write" >&2
      exit 1
    fi
    ;;
  *)
    echo "usage: $0 [--write | --check]" >&2
    exit 2
    ;;
esac
