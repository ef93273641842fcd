#!/usr/bin/env bash
# Fails when a source file includes a header of a layer above its own, or
# when the CMake graph does not mirror the folders: each folder's
# CMakeLists.txt builds that folder's sources only, and links no library of
# a folder it must not include.
# The layers (docs/ARCHITECTURE.md): mount-tools -> fuse -> seal -> store -> codec -> base,
# with cache/ beside store/ and gpu/ implementing codec's device interface.
# store/cluster/ (cluster mode's mechanisms) lies beneath the Store class:
# the core drives it, it never reaches back up (checked below).
# Each line: a folder, then the folders it must not include from.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

FORBIDDEN=(
  "base:codec store cache seal fuse gpu mount-tools"
  "codec:store cache seal fuse gpu mount-tools"
  "gpu:store cache seal fuse mount-tools"
  "store:seal fuse gpu mount-tools"
  "store/cluster:seal fuse gpu mount-tools cache"
  "cache:seal fuse gpu mount-tools"
  "seal:fuse gpu mount-tools"
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

# The library `$1` is defined by its folder's CMakeLists.txt.
folder_of() { grep -lE "^[[:space:]]*add_(library|executable)\($1[ )]" -- */CMakeLists.txt */*/CMakeLists.txt | head -1 | xargs -r dirname || true; }
for rule in "${FORBIDDEN[@]}" "mount-tools:"; do
  from=${rule%%:*}
  cmake=$from/CMakeLists.txt
  if [[ ! -f $cmake ]]; then
    echo "check-layers: $cmake missing (one library per folder)" >&2
    bad=1
    continue
  fi
  if grep -nE '\.\./|CMAKE_SOURCE_DIR\}/' "$cmake" >&2; then
    echo "check-layers: $cmake builds sources of another folder" >&2
    bad=1
  fi
  for lib in $(tr '\n' ' ' <"$cmake" | grep -oE 'target_link_libraries\([^)]*\)' | grep -oE 'ckptfs[a-z_]*' | sort -u); do
    to=$(folder_of "$lib")
    for forbidden in ${rule#*:}; do
      if [[ $to == "$forbidden" ]]; then
        echo "check-layers: $cmake links $lib: $from/ must not link $to/ (dependencies point one way)" >&2
        bad=1
      fi
    done
  done
done
# Readers link no encoder (zstd's lib/ split): each line, a library, then
# the libraries it must not link.
READ_ONLY=(
  "codec/ckptfs_codec_decode:ckptfs_codec_encode ckptfs_codec_formats ckptfs_codec"
  "store/ckptfs_store_read:ckptfs_codec_encode ckptfs_codec_formats ckptfs_codec ckptfs_store"
)
for rule in "${READ_ONLY[@]}"; do
  lib=${rule%%:*}
  links=$(tr '\n' ' ' <"${lib%%/*}/CMakeLists.txt" | grep -oE "target_link_libraries\\(${lib#*/} [^)]*\\)" || true)
  for forbidden in ${rule#*:}; do
    if grep -qE "[ (]$forbidden[ )]" <<<"$links"; then
      echo "check-layers: ${lib#*/} links $forbidden: a reader must not link the encoders" >&2
      bad=1
    fi
  done
done
# Formats are seal/'s and codec/'s knowledge (issue 42): fuse/ names none,
# not even in a comment, and store/ names none outside the files listed
# here, which still hold format-aware sealing that is to move up to seal/.
FORMAT_NAMES='orbax|ocdbt|onnx|torch|hdf5|safetensors|pickle|tensorstore'
STORE_NOT_YET=" store/sibling_files.cc "
while IFS= read -r hit; do
  echo "check-layers: $hit names a file format: fuse/ is format-blind (ask seal/read_hints.h)" >&2
  bad=1
done < <(grep -rilE "$FORMAT_NAMES" fuse --include="*.h" --include="*.cc" --include=CMakeLists.txt || true)
while IFS= read -r file; do
  if [[ $STORE_NOT_YET != *" $file "* ]]; then
    echo "check-layers: $file names a file format: store/ is format-blind (format knowledge goes to seal/)" >&2
    bad=1
  fi
done < <(grep -rilE "$FORMAT_NAMES" store --include="*.h" --include="*.cc" --include=CMakeLists.txt || true)
# docs/ARCHITECTURE.md's include table is the code's (scripts/layer-table.sh).
if ! scripts/layer-table.sh --check; then bad=1; fi
# store/cluster/ lies beneath the Store class: it includes no store/store.h
# and links no ckptfs_store (the core includes its headers, not the
# reverse). librados stays in the one file that loads it at run time, so
# the none-backend (-DCKPTFS_WITH_RADOS=OFF) and the .deb need nothing else.
while IFS= read -r hit; do
  echo "check-layers: $hit: store/cluster/ must not include store/store.h (the Store class drives it, not the reverse)" >&2
  bad=1
done < <(grep -rnE '^[[:space:]]*#[[:space:]]*include[[:space:]]+"store/store\.h"' store/cluster \
           --include='*.h' --include='*.cc' || true)
if tr '\n' ' ' <store/cluster/CMakeLists.txt | grep -oE 'target_link_libraries\([^)]*\)' | grep -qE '[ (]ckptfs_store[ )]'; then
  echo "check-layers: store/cluster/CMakeLists.txt links ckptfs_store: store/cluster/ must not link the Store above it" >&2
  bad=1
fi
while IFS= read -r hit; do
  echo "check-layers: $hit: only store/cluster/librados_client.cc may include librados (it loads it at run time)" >&2
  bad=1
done < <(grep -rnE '^[[:space:]]*#[[:space:]]*include[[:space:]]+<rados/' base codec cache store gpu fuse mount-tools \
           --include='*.h' --include='*.cc' | grep -v '^store/cluster/librados_client\.cc:' || true)
if git ls-files -- '*CMakeLists.txt' | xargs grep -nE 'Ceph::rados|RADOS_LIBRARY' >&2; then
  echo "check-layers: a CMakeLists.txt links librados: it is loaded at run time (store/cluster/librados_client.cc)" >&2
  bad=1
fi
if ((bad)); then exit 1; fi
echo "check-layers: ok (no include points up a layer; each folder's library links only the layers below; docs/ARCHITECTURE.md's include table is current)"
