#!/usr/bin/env bash
# Fuzzes the checkpoint format parsers (codec/formats) and the lossless
# tensor decoder (codec/lossless) with libFuzzer + ASan + UBSan. Not in CI.
#
#   bench/fuzz_parsers.sh [seconds per target, default 600] [jobs, default 1]
#
# Builds tests/fuzz with clang into build-fuzz, writes seeds from real files
# written by real clients (torch.save zip and legacy, safetensors, numpy
# save/savez/savez_compressed, the gguf writer, a tf.train.Checkpoint index,
# onnx.save models (tests/data/onnx, also with external data), flax to_bytes
# (tests/data/flax), h5py and Keras 3 files (tests/data/hdf5),
# orbax-checkpoint OCDBT databases (tests/data/orbax: the manifest and the
# data file holding the tree's root, as fuzz_ocdbt reads them), orbax's
# legacy per-array zarr chunks (use_ocdbt=False, raw and zstd: each chunk
# file's name and size with the .zarray beside it),
# torch.distributed.checkpoint) plus small handmade ones, then runs every
# target for the given time with -timeout=10 (an input taking longer is a
# hang). `jobs` > 1 runs that many libFuzzer workers per target.
# Prints a table target | execs | seconds | result and exits 1 if any target
# crashed, hung or ran out of memory. Reproducers land in
# build-fuzz/artifacts/<target>/, full logs in build-fuzz/logs/<target>/,
# the growing corpora in build-fuzz/corpus/<target>/.
#
# Python for the seeds: .venv-pypi/bin/python, else /tmp/pypi-probe/venv/bin/python,
# else Debian's /usr/bin/python3 (torch 1.13, numpy); $FUZZ_PYTHON overrides.
# Seeds whose writer is not installed are skipped and listed.
set -euo pipefail
SECS=${1:-600}
JOBS=${2:-1}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
BUILD=$ROOT/build-fuzz
SEEDS=$BUILD/seeds
TARGETS=(fuzz_layout fuzz_pickle fuzz_torch_zip fuzz_torch_legacy fuzz_dcp fuzz_safetensors fuzz_npy fuzz_npz
  fuzz_gguf fuzz_tf_index fuzz_onnx fuzz_onnx_external fuzz_flax_msgpack fuzz_hdf5 fuzz_ocdbt fuzz_zarr_chunk fuzz_lossless_decode fuzz_tensor_chunk fuzz_delta_chunk fuzz_delta_roundtrip fuzz_lossy_chunk
  fuzz_lossy_roundtrip fuzz_pack)
command -v clang++ >/dev/null || { echo "clang++ not found (apt-get install -y clang)" >&2; exit 1; }

cmake -S "$ROOT" -B "$BUILD" -DCMAKE_C_COMPILER=clang -DCMAKE_CXX_COMPILER=clang++ \
  -DCKPTFS_WITH_CUDA=OFF -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
cmake --build "$BUILD" -j1 --target "${TARGETS[@]}"

rm -rf "$SEEDS"
for t in "${TARGETS[@]}"; do mkdir -p "$SEEDS/${t#fuzz_}"; done
if cmake --build "$BUILD" -j1 --target lossless_seed_gen >/dev/null 2>&1; then
  "$BUILD/tests/fuzz/lossless_seed_gen" "$SEEDS/lossless_decode" "$SEEDS/tensor_chunk"
else
  echo "lossless_seed_gen did not build; fuzz_lossless_decode starts from a handmade seed" >&2
fi

PY=${FUZZ_PYTHON:-}
for cand in "$ROOT/.venv-pypi/bin/python" /tmp/pypi-probe/venv/bin/python /usr/bin/python3 python3; do
  [ -n "$PY" ] && break
  if [ -x "$cand" ] || command -v "$cand" >/dev/null; then PY=$cand; fi
done
echo "seeds written with $PY"
TF_CPP_MIN_LOG_LEVEL=3 "$PY" - "$SEEDS" <<'PY'
import io, json, os, pickle, shutil, struct, sys, tempfile, zipfile
out = sys.argv[1]
skipped = []
def w(target, name, b):
    with open(os.path.join(out, target, name), "wb") as f:
        f.write(b)
    if target not in ("layout", "pickle", "lossless_decode", "zarr_chunk"):  # zarr_chunk's are not files
        with open(os.path.join(out, "layout", target + "-" + name), "wb") as f:
            f.write(b)
def attempt(what, fn):
    try:
        fn()
    except Exception as e:  # a writer that is missing or too old: skip its seeds
        skipped.append("%s (%s: %s)" % (what, type(e).__name__, str(e).splitlines()[0][:100] if str(e) else ""))
tmp = tempfile.mkdtemp()

# ---- handmade: safetensors, gguf v3, a TF footer, legacy-style zip, pickles
buf = struct.pack("<6f", *range(6)) + struct.pack("<2q", 1, 2)
hdr = {"__metadata__": {"format": "pt"},
       "a": {"dtype": "F32", "shape": [2, 3], "data_offsets": [0, 24]},
       "b": {"dtype": "I64", "shape": [2], "data_offsets": [24, 40]}}
t = json.dumps(hdr).encode(); t += b" " * (-len(t) % 8)
w("safetensors", "hand.safetensors", struct.pack("<Q", len(t)) + t + buf)
def s(x): return struct.pack("<Q", len(x)) + x
g = b"GGUF" + struct.pack("<IQQ", 3, 2, 2)
g += s(b"general.name") + struct.pack("<I", 8) + s(b"tiny")
g += s(b"tokenizer.ggml.tokens") + struct.pack("<IIQ", 9, 8, 2) + s(b"a") + s(b"b")
g += s(b"w") + struct.pack("<IQQIQ", 2, 4, 2, 0, 0)
g += s(b"q") + struct.pack("<IQIQ", 1, 32, 2, 32)
g += b"\0" * (-len(g) % 32) + struct.pack("<8f", *range(8)) + bytes(18) + bytes(14)
w("gguf", "hand.gguf", g)
w("layout", "footer.index", bytes(40) + struct.pack("<Q", 0xdb4775248b80fb57))
w("pickle", "proto2.pkl", pickle.dumps({"a": [1, "x", (2, 3)], "b": None}, protocol=2))
w("pickle", "proto4.pkl", pickle.dumps({"a": [1, "x", (2, 3)], "b": {1.5}}, protocol=4))
w("lossless_decode", "hand-raw", struct.pack("<I", 8) + bytes([0xB1, 0, 0, 8, 0, 1, 1, 8]) + bytes(range(8)))

# ---- numpy
def numpy_seeds():
    import numpy as np
    b = io.BytesIO(); np.save(b, np.arange(12, dtype=np.float32).reshape(3, 4)); w("npy", "a.npy", b.getvalue())
    b = io.BytesIO(); np.save(b, np.asfortranarray(np.arange(6, dtype=np.float16).reshape(2, 3))); w("npy", "f.npy", b.getvalue())
    b = io.BytesIO(); np.lib.format.write_array(b, np.ones(3, bool), version=(2, 0)); w("npy", "v2.npy", b.getvalue())
    b = io.BytesIO(); np.save(b, np.array([1 + 2j], np.complex64)); w("npy", "c.npy", b.getvalue())
    b = io.BytesIO(); np.savez(b, x=np.arange(5, dtype=np.int16), y=np.ones(3, bool)); w("npz", "s.npz", b.getvalue())
    b = io.BytesIO(); np.savez_compressed(b, x=np.arange(5)); w("npz", "z.npz", b.getvalue())
attempt("numpy", numpy_seeds)

# ---- torch: zip (default), legacy, pickle protocol 4, and the data.pkl pickles
def torch_seeds():
    import torch
    sd = {"w": torch.randn(4, 4), "b": torch.zeros(4).bfloat16(), "i": torch.arange(3), "h": torch.ones(2).half(),
          "u8": torch.arange(3, dtype=torch.uint8)}
    sd["v"] = sd["w"][1]
    b = io.BytesIO(); torch.save(sd, b); w("torch_zip", "m.pt", b.getvalue())
    z = zipfile.ZipFile(io.BytesIO(b.getvalue()))
    w("pickle", "data.pkl", z.read([n for n in z.namelist() if n.endswith("/data.pkl")][0]))
    w("dcp", "m.pt", b.getvalue())
    b = io.BytesIO(); torch.save(sd, b, pickle_protocol=4); w("torch_zip", "p4.pt", b.getvalue())
    z = zipfile.ZipFile(io.BytesIO(b.getvalue()))
    w("pickle", "data-p4.pkl", z.read([n for n in z.namelist() if n.endswith("/data.pkl")][0]))
    m = torch.nn.Linear(3, 2)
    b = io.BytesIO(); torch.save({"model": m.state_dict(), "step": 3}, b, _use_new_zipfile_serialization=False)
    w("torch_legacy", "legacy.pt", b.getvalue())
    b = io.BytesIO(); torch.save(sd, b, _use_new_zipfile_serialization=False); w("torch_legacy", "legacy2.pt", b.getvalue())
    if hasattr(torch, "float8_e4m3fn"):  # _rebuild_tensor_v3 with an untyped storage
        b = io.BytesIO(); torch.save({"f8": torch.zeros(4, dtype=torch.float8_e4m3fn), "u16": torch.zeros(2, dtype=torch.uint16)}, b)
        w("torch_zip", "v3.pt", b.getvalue())
attempt("torch", torch_seeds)

def dcp_seeds():
    import torch
    import torch.distributed.checkpoint as dcp
    d = os.path.join(tmp, "dcp")
    sd = {"w": torch.randn(3, 4), "b": torch.arange(4.0).half(), "step": 7, "blob": io.BytesIO(b"abc")}
    dcp.save(sd, checkpoint_id=d)
    for n in sorted(os.listdir(d)):
        data = open(os.path.join(d, n), "rb").read()
        if n.endswith(".distcp"):
            w("dcp", n, data)
        elif n == ".metadata":
            w("pickle", "dcp.metadata", data)
attempt("torch.distributed.checkpoint", dcp_seeds)

def safetensors_seeds():
    import numpy as np
    from safetensors.numpy import save
    w("safetensors", "st.safetensors", save({"a": np.arange(6, dtype=np.float32).reshape(2, 3),
                                             "b": np.ones(5, np.float16), "c": np.arange(3, dtype=np.int64)},
                                            metadata={"format": "pt"}))
    try:
        import torch
        from safetensors.torch import save as tsave
        w("safetensors", "bf16.safetensors", tsave({"x": torch.ones(3, dtype=torch.bfloat16), "y": torch.zeros(2, 2)}))
    except ImportError:
        pass
attempt("safetensors", safetensors_seeds)

def gguf_seeds():
    import numpy as np
    import gguf
    p = os.path.join(tmp, "m.gguf")
    gw = gguf.GGUFWriter(p, "llama")
    gw.add_name("tiny")
    gw.add_block_count(1)
    gw.add_tokenizer_model("llama")
    gw.add_token_list(["<s>", "</s>", "a"])
    gw.add_tensor("tok_embd.weight", np.arange(12, dtype=np.float32).reshape(3, 4))
    gw.add_tensor("norm.weight", np.ones(4, np.float16))
    gw.write_header_to_file()
    gw.write_kv_data_to_file()
    gw.write_tensors_to_file()
    gw.close()
    w("gguf", "writer.gguf", open(p, "rb").read())
attempt("gguf", gguf_seeds)

def tf_seeds():
    os.environ["TF_CPP_MIN_LOG_LEVEL"] = "3"
    import tensorflow as tf
    d = os.path.join(tmp, "tf")
    ck = tf.train.Checkpoint(w=tf.Variable(tf.ones([3, 2])), i=tf.Variable(tf.range(4, dtype=tf.int64)),
                             h=tf.Variable(tf.zeros([2], tf.float16)), s=tf.Variable("x"))
    p = ck.save(os.path.join(d, "ck"))
    w("tf_index", "ck.index", open(p + ".index", "rb").read())
    pol = tf.train.experimental.MaxShardSizePolicy(max_shard_size=64)
    p = tf.train.Checkpoint(w=tf.Variable(tf.ones([8, 4])), b=tf.Variable(tf.zeros([5]))).save(
        os.path.join(d, "sh"), options=tf.train.CheckpointOptions(experimental_sharding_callback=pol))
    w("tf_index", "sharded.index", open(p + ".index", "rb").read())
attempt("tensorflow", tf_seeds)

# ---- orbax's legacy per-array zarr layout (use_ocdbt=False): fuzz_zarr_chunk's
# input is a chunk file's size (8 bytes LE), a 1-byte name length, its name,
# then the .zarray beside it.
def zarr_chunk(size, name, zarray):
    return struct.pack("<QB", size, len(name)) + name.encode() + zarray
w("zarr_chunk", "hand-0.0", zarr_chunk(48, "0.0", json.dumps(
    {"chunks": [3, 4], "compressor": None, "dimension_separator": ".", "dtype": "<f4", "fill_value": None,
     "filters": None, "order": "C", "shape": [3, 4], "zarr_format": 2}).encode()))
w("zarr_chunk", "hand-wrap", zarr_chunk(4, "0", json.dumps(  # 4 * (2^62 + 1) bytes wrap to 4
    {"chunks": [2**62 + 1], "compressor": None, "dtype": "<f4", "filters": None, "order": "C",
     "zarr_format": 2}).encode()))
def orbax_legacy_seeds():
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    import jax
    import numpy as np
    import orbax.checkpoint as ocp
    tree = {"params": {"w": np.arange(12, dtype=np.float32).reshape(3, 4), "b": np.ones(5, np.float16)},
            "step": np.int32(3), "m": np.zeros((2, 3, 4), jax.numpy.bfloat16), "big": np.ones((300, 70), np.float32)}
    tree = jax.tree_util.tree_map(jax.numpy.asarray, tree)
    for comp in (False, True):
        d = os.path.join(tmp, "legacy%d" % comp)
        ocp.Checkpointer(ocp.PyTreeCheckpointHandler(use_ocdbt=False, use_compression=comp)).save(
            d, args=ocp.args.PyTreeSave(tree))
        for a in sorted(os.listdir(d)):
            z = os.path.join(d, a, ".zarray")
            if not os.path.isfile(z):
                continue
            for c in sorted(os.listdir(os.path.join(d, a))):
                if not c.startswith("."):
                    w("zarr_chunk", "legacy%d-%s-%s" % (comp, a, c), zarr_chunk(
                        os.path.getsize(os.path.join(d, a, c)), c, open(z, "rb").read()))
attempt("orbax-checkpoint (legacy zarr)", orbax_legacy_seeds)

shutil.rmtree(tmp, ignore_errors=True)
for what in skipped:
    print("no seeds from", what, file=sys.stderr)
PY
# The repo's committed TF bundles and ONNX models (onnx.save) are real files too.
for f in "$ROOT"/tests/data/onnx/*.onnx; do
  [ -f "$f" ] && cp "$f" "$SEEDS/onnx/repo-$(basename "$f")" && cp "$f" "$SEEDS/layout/onnx-$(basename "$f")"
done
for f in "$ROOT"/tests/data/onnx/ext*.onnx; do
  [ -f "$f" ] && cp "$f" "$SEEDS/onnx_external/repo-$(basename "$f")"
done
for f in "$ROOT"/tests/data/hdf5/*.h5 "$ROOT"/tests/data/hdf5/*.keras; do
  [ -f "$f" ] && cp "$f" "$SEEDS/hdf5/repo-$(basename "$f")" && cp "$f" "$SEEDS/layout/hdf5-$(basename "$f")"
done
for f in "$ROOT"/tests/data/flax/*.msgpack; do
  [ -f "$f" ] && cp "$f" "$SEEDS/flax_msgpack/repo-$(basename "$f")" && cp "$f" "$SEEDS/layout/flax-$(basename "$f")"
done
# fuzz_ocdbt's input: a 2-byte length, manifest.ocdbt, then one data file.
for db in "$ROOT"/tests/data/orbax/*/; do
  [ -f "$db/manifest.ocdbt" ] || continue
  for f in "$db"/d/*; do
    python3 -c 'import struct, sys; m = open(sys.argv[1], "rb").read(); d = open(sys.argv[2], "rb").read()
open(sys.argv[3], "wb").write(struct.pack("<H", len(m)) + m + d)' "$db/manifest.ocdbt" "$f" \
      "$SEEDS/ocdbt/repo-$(basename "$db")-$(basename "$f")"
  done
done
for f in "$ROOT"/tests/data/tf_bundle/*/*.index; do
  [ -f "$f" ] && cp "$f" "$SEEDS/tf_index/repo-$(basename "$(dirname "$f")").index"
done
for t in "${TARGETS[@]}"; do
  d=${t#fuzz_}
  printf '%-22s %3d seeds, largest %6d bytes\n' "$t" "$(ls "$SEEDS/$d" | wc -l)" \
    "$(find "$SEEDS/$d" -type f -printf '%s\n' | sort -n | tail -1)"
done

PAR=()
[ "$JOBS" -gt 1 ] && PAR=(-jobs="$JOBS" -workers="$JOBS")
RESULTS=()
status=0
for target in "${TARGETS[@]}"; do
  dir=${target#fuzz_}
  logs=$BUILD/logs/$target
  rm -rf "$logs"
  mkdir -p "$BUILD/corpus/$dir" "$BUILD/artifacts/$target" "$logs"
  echo "== $target for ${SECS}s"
  start=$(date +%s)
  rc=0
  # libFuzzer writes fuzz-N.log into the working directory with -jobs.
  (cd "$logs" && timeout -k 30 $((SECS + 300)) "$BUILD/tests/fuzz/$target" "$BUILD/corpus/$dir" "$SEEDS/$dir" \
    -max_total_time="$SECS" "${PAR[@]}" -max_len=65536 -rss_limit_mb=2048 -timeout=10 \
    -artifact_prefix="$BUILD/artifacts/$target/" -print_final_stats=1 >"$logs/run.log" 2>&1) || rc=$?
  secs=$(($(date +%s) - start))
  tail -n 12 "$logs/run.log"
  execs=$(cat "$logs"/*.log | sed -n 's/^stat::number_of_executed_units: *//p' | awk '{s += $1} END {print s + 0}')
  result=ok
  if grep -qh "ERROR: libFuzzer: timeout" "$logs"/*.log; then
    result=HANG
  elif grep -qh "ERROR: libFuzzer: out-of-memory\|ERROR: libFuzzer: malloc" "$logs"/*.log; then
    result=OOM
  elif grep -qh "ERROR: AddressSanitizer\|runtime error:\|ERROR: libFuzzer: deadly signal\|ERROR: UndefinedBehaviorSanitizer" "$logs"/*.log; then
    result=CRASH
  elif [ "$rc" -ne 0 ]; then
    result="FAILED (rc $rc)"
  fi
  [ "$result" = ok ] || status=1
  [ "$result" = ok ] || result="$result: $(ls "$BUILD/artifacts/$target" | head -3 | tr '\n' ' ')"
  RESULTS+=("| $target | $execs | $secs | $result |")
done

echo
echo "| target | execs | seconds | result |"
echo "|---|---:|---:|---|"
printf '%s\n' "${RESULTS[@]}"
exit $status
