#!/usr/bin/env bash
# Fuzzes the checkpoint format parsers (codec/formats) with libFuzzer +
# ASan + UBSan. Builds tests/fuzz with clang into build-fuzz, writes seed
# files (real numpy/torch files when those modules import, plus
# safetensors/GGUF written in plain Python), then runs every target.
#
#   bench/fuzz_parsers.sh [seconds per target, default 600] [jobs, default 1]
# Crash reproducers land in build-fuzz/artifacts/<target>/.
set -euo pipefail
SECS=${1:-600}
JOBS=${2:-1}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
BUILD=$ROOT/build-fuzz
SEEDS=$BUILD/seeds
command -v clang++ >/dev/null || { echo "clang++ not found (apt-get install -y clang)" >&2; exit 1; }

cmake -S "$ROOT" -B "$BUILD" -DCMAKE_C_COMPILER=clang -DCMAKE_CXX_COMPILER=clang++ \
  -DCKPTFS_WITH_CUDA=OFF -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
cmake --build "$BUILD" -j1 --target fuzz_layout fuzz_pickle

rm -rf "$SEEDS" && mkdir -p "$SEEDS/layout" "$SEEDS/pickle"
# Debian's python3 is the one with numpy/torch; a pyenv shim may not be.
PY=/usr/bin/python3
[ -x "$PY" ] || PY=python3
"$PY" - "$SEEDS" <<'PY'
import io, json, os, struct, sys, pickle
out = sys.argv[1]
L, P = os.path.join(out, "layout"), os.path.join(out, "pickle")
def w(d, name, b): open(os.path.join(d, name), "wb").write(b)
# safetensors
buf = struct.pack("<6f", *range(6)) + struct.pack("<2q", 1, 2)
hdr = {"__metadata__": {"format": "pt"},
       "a": {"dtype": "F32", "shape": [2, 3], "data_offsets": [0, 24]},
       "b": {"dtype": "I64", "shape": [2], "data_offsets": [24, 40]}}
t = json.dumps(hdr).encode(); t += b" " * (-len(t) % 8)
w(L, "st.safetensors", struct.pack("<Q", len(t)) + t + buf)
# gguf v3
def s(x): return struct.pack("<Q", len(x)) + x
g = b"GGUF" + struct.pack("<IQQ", 3, 2, 2)
g += s(b"general.name") + struct.pack("<I", 8) + s(b"tiny")
g += s(b"tokenizer.ggml.tokens") + struct.pack("<IIQ", 9, 8, 2) + s(b"a") + s(b"b")
g += s(b"w") + struct.pack("<IQQIQ", 2, 4, 2, 0, 0)
g += s(b"q") + struct.pack("<IQIQ", 1, 32, 2, 32)
g += b"\0" * (-len(g) % 32) + struct.pack("<8f", *range(8)) + bytes(18) + bytes(14)
w(L, "tiny.gguf", g)
# TF index footer
w(L, "model.index", bytes(40) + struct.pack("<Q", 0xdb4775248b80fb57))
try:
    import numpy as np
    b = io.BytesIO(); np.save(b, np.arange(12, dtype=np.float32).reshape(3, 4)); w(L, "a.npy", b.getvalue())
    b = io.BytesIO(); np.savez(b, x=np.arange(5, dtype=np.int16), y=np.ones(3, bool)); w(L, "s.npz", b.getvalue())
    b = io.BytesIO(); np.savez_compressed(b, x=np.arange(5)); w(L, "z.npz", b.getvalue())
except ImportError:
    pass
try:
    import torch, zipfile
    sd = {"w": torch.randn(4, 4), "b": torch.zeros(4).bfloat16(), "i": torch.arange(3), "h": torch.ones(2).half()}
    sd["v"] = sd["w"][1]
    b = io.BytesIO(); torch.save(sd, b); w(L, "m.pt", b.getvalue())
    w(P, "data.pkl", zipfile.ZipFile(io.BytesIO(b.getvalue())).read("archive/data.pkl"))
    b = io.BytesIO(); torch.save(sd, b, _use_new_zipfile_serialization=False); w(L, "legacy.pt", b.getvalue())
    w(P, "proto4.pkl", pickle.dumps({"a": [1, "x", (2, 3)], "b": {1.5}}, protocol=4))
except ImportError:
    pass
w(P, "proto2.pkl", pickle.dumps({"a": [1, "x", (2, 3)], "b": None}, protocol=2))
PY

PAR=()
[ "$JOBS" -gt 1 ] && PAR=(-jobs="$JOBS" -workers="$JOBS")
cd "$BUILD"  # libFuzzer writes fuzz-N.log into the working directory with -jobs
for target in fuzz_layout fuzz_pickle; do
  dir=${target#fuzz_}
  mkdir -p "$BUILD/corpus/$dir" "$BUILD/artifacts/$target"
  echo "== $target for ${SECS}s"
  "$BUILD/tests/fuzz/$target" "$BUILD/corpus/$dir" "$SEEDS/$dir" \
    -max_total_time="$SECS" "${PAR[@]}" -max_len=65536 -rss_limit_mb=2048 -timeout=10 \
    -artifact_prefix="$BUILD/artifacts/$target/" -print_final_stats=1 2>&1 | tail -n 15
done
