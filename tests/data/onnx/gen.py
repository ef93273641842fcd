"""Regenerates the small ONNX models of the unit tests (onnx from .venv-pypi):
  .venv-pypi/bin/python tests/data/onnx/gen.py
model.onnx: a Gemm+Add graph whose initializers hold raw_data (f32 [8,4],
f16 [4], i64 [2], bf16 [3]) plus one float_data initializer (no raw bytes);
ext.onnx + ext.onnx.data: the same with every initializer in external data."""
import os

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

HERE = os.path.dirname(os.path.abspath(__file__))


def model():
    w = numpy_helper.from_array(np.arange(32, dtype=np.float32).reshape(8, 4) / 7, "w")
    h = numpy_helper.from_array(np.array([1, -2, 0.5, 3], dtype=np.float16), "h")
    shape = numpy_helper.from_array(np.array([1, 4], dtype=np.int64), "shape")
    bf = helper.make_tensor("bf", TensorProto.BFLOAT16, [3], vals=b"\x80\x3f\x00\x40\x40\x40", raw=True)
    typed = helper.make_tensor("typed", TensorProto.FLOAT, [2], [1.5, 2.5])  # float_data, not raw
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])
    nodes = [helper.make_node("MatMul", ["x", "w"], ["y"])]
    graph = helper.make_graph(nodes, "g", [x], [y], initializer=[w, h, shape, bf, typed])
    return helper.make_model(graph, producer_name="ckptfs-test")


if __name__ == "__main__":
    onnx.save(model(), os.path.join(HERE, "model.onnx"))
    onnx.save(model(), os.path.join(HERE, "ext.onnx"), save_as_external_data=True, all_tensors_to_one_file=True,
              location="ext.onnx.data", size_threshold=0)
