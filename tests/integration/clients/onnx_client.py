"""ONNX client (onnx from PyPI): onnx.save of a small MLP whose
initializers hold raw_data (f32, f16, bf16, i64), once with the weights
inside the model and once with them in an external data file; onnx.load
(which reads the external data too) must give equal initializers.
See common.py for the protocol."""
from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import Client, check  # noqa: E402

import numpy as np  # noqa: E402
import onnx  # noqa: E402
from onnx import TensorProto, helper, numpy_helper  # noqa: E402


def initializers():
    rng = np.random.default_rng(5)
    out = [numpy_helper.from_array((rng.standard_normal((256, 512)) * 0.02).astype(np.float32), "fc1.weight"),
           numpy_helper.from_array(np.zeros(512, np.float32), "fc1.bias"),
           numpy_helper.from_array((rng.standard_normal((512, 128)) * 0.02).astype(np.float16), "fc2.weight"),
           numpy_helper.from_array(np.array([1, 128], np.int64), "shape")]
    bf = (rng.standard_normal(1024).astype(np.float32).view(np.uint32) >> 16).astype(np.uint16)
    out.append(helper.make_tensor("emb.bf16", TensorProto.BFLOAT16, [1024], vals=bf.tobytes(), raw=True))
    return out


def model():
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 256])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 512])
    nodes = [helper.make_node("MatMul", ["x", "fc1.weight"], ["h"]), helper.make_node("Add", ["h", "fc1.bias"], ["y"])]
    graph = helper.make_graph(nodes, "mlp", [x], [y], initializer=initializers())
    return helper.make_model(graph, producer_name="ckptfs-client")


def raw(t):
    return t.raw_data if t.raw_data else numpy_helper.to_array(t).tobytes()


def main():
    c = Client()
    m = model()
    want = {t.name: (t.data_type, list(t.dims), t.raw_data) for t in m.graph.initializer}
    tensor_bytes = sum(len(r) for _, _, r in want.values())
    for root in (c.mnt, c.ref):
        os.makedirs(root / "onnx", exist_ok=True)
        onnx.save(model(), root / "onnx" / "mlp.onnx")
        onnx.save(model(), root / "onnx" / "mlp_ext.onnx", save_as_external_data=True,
                  all_tensors_to_one_file=True, location="mlp_ext.onnx.data", size_threshold=0)
    c.record("onnx/mlp.onnx", ref=True, tensor_bytes=tensor_bytes, dtypes=["BF16", "F16", "F32", "I64"],
             names=sorted(want))
    c.record("onnx/mlp_ext.onnx", ref=True, tensor_bytes=0)
    # Headerless: its tensors come from the sibling model that names it.
    c.record("onnx/mlp_ext.onnx.data", ref=True, tensor_bytes=tensor_bytes, dtypes=["BF16", "F16", "F32", "I64"],
             names=sorted(want))

    def load(when):
        for name in ("mlp.onnx", "mlp_ext.onnx"):
            got = onnx.load(str(c.mnt / "onnx" / name))
            onnx.checker.check_model(got)
            inits = {t.name: t for t in got.graph.initializer}
            check(sorted(inits) == sorted(want), f"{when}:{name}: initializers {sorted(inits)}")
            for k, (dtype, dims, data) in want.items():
                t = inits[k]
                check(t.data_type == dtype and list(t.dims) == dims, f"{when}:{name}:{k}: dtype or dims")
                check(raw(t) == data, f"{when}:{name}:{k}: bytes differ")
                c.checks += 1

    c.run(load)


if __name__ == "__main__":
    main()
