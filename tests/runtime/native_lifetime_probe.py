"""Subprocess for test_native_lifetime.py: compile distinct QDQ models in a loop, print RSS.

    python -m tests.runtime.native_lifetime_probe WARMUP COUNT [same]

Each model (a function of its index) has a different channel count and image size, so no
oneDNN primitive repeats: convolutions with relu and a residual sum, max and average pooling,
concat, matmul and softmax. Prints one JSON line: RSS after the warm-up and at the end, bytes.
Set ONEDNN_PRIMITIVE_CACHE_CAPACITY before starting it (oneDNN reads it when loaded).
"""

from __future__ import annotations

import gc
import json
import sys

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from qfuse.compiler.api import compile_model, random_inputs


def _qdq(nodes: list[onnx.NodeProto], inits: list[onnx.TensorProto], value: str,
         tag: str) -> str:
    inits += [numpy_helper.from_array(np.array(0.05, np.float32), f"{tag}_s"),
              numpy_helper.from_array(np.array(128, np.uint8), f"{tag}_z")]
    nodes += [helper.make_node("QuantizeLinear", [value, f"{tag}_s", f"{tag}_z"], [f"{tag}_q"]),
              helper.make_node("DequantizeLinear", [f"{tag}_q", f"{tag}_s", f"{tag}_z"],
                               [f"{tag}_d"])]
    return f"{tag}_d"


def _conv(nodes: list[onnx.NodeProto], inits: list[onnx.TensorProto], value: str, tag: str,
          c_in: int, c_out: int, kernel: int, rng: np.random.Generator) -> str:
    w = rng.integers(-100, 100, (c_out, c_in, kernel, kernel)).astype(np.int8)
    inits += [numpy_helper.from_array(w, f"{tag}_w"),
              numpy_helper.from_array(np.full(c_out, 0.002, np.float32), f"{tag}_ws"),
              numpy_helper.from_array(np.zeros(c_out, np.int8), f"{tag}_wz")]
    pad = kernel // 2
    nodes += [helper.make_node("DequantizeLinear", [f"{tag}_w", f"{tag}_ws", f"{tag}_wz"],
                               [f"{tag}_wd"], axis=0),
              helper.make_node("Conv", [value, f"{tag}_wd"], [f"{tag}_y"],
                               pads=[pad] * 4)]
    return f"{tag}_y"


def model(index: int) -> onnx.ModelProto:
    """Distinct for every index: channels 4..35, sides 6..; same ops."""
    rng = np.random.default_rng(index)
    channels, side = 4 + index % 32, 6 + index // 32
    nodes: list[onnx.NodeProto] = []
    inits: list[onnx.TensorProto] = []
    x = _qdq(nodes, inits, "x", "in")
    a = _qdq(nodes, inits, _conv(nodes, inits, x, "c1", 3, channels, 3, rng), "a")
    nodes.append(helper.make_node("Relu", [a], ["a_relu"]))
    b = _conv(nodes, inits, _qdq(nodes, inits, "a_relu", "ar"), "c2", channels, channels, 1, rng)
    nodes.append(helper.make_node("Add", [_qdq(nodes, inits, b, "b"), "a_relu"], ["sum"]))
    s = _qdq(nodes, inits, "sum", "s")
    nodes += [helper.make_node("MaxPool", [s], ["mp"], kernel_shape=[2, 2], strides=[2, 2]),
              helper.make_node("AveragePool", [s], ["ap"], kernel_shape=[2, 2], strides=[2, 2])]
    nodes.append(helper.make_node("Concat", [_qdq(nodes, inits, "mp", "mp"),
                                             _qdq(nodes, inits, "ap", "ap")], ["cat"], axis=1))
    nodes.append(helper.make_node("GlobalAveragePool", [_qdq(nodes, inits, "cat", "cat")],
                                  ["gap"]))
    inits.append(numpy_helper.from_array(np.array([1, 2 * channels], np.int64), "shape"))
    nodes.append(helper.make_node("Reshape", [_qdq(nodes, inits, "gap", "gap"), "shape"],
                                  ["flat"]))
    w = rng.integers(-100, 100, (2 * channels, 10)).astype(np.int8)
    inits += [numpy_helper.from_array(w, "fc_w"),
              numpy_helper.from_array(np.array(0.002, np.float32), "fc_ws"),
              numpy_helper.from_array(np.array(0, np.int8), "fc_wz")]
    nodes += [helper.make_node("DequantizeLinear", ["fc_w", "fc_ws", "fc_wz"], ["fc_wd"]),
              helper.make_node("MatMul", [_qdq(nodes, inits, "flat", "flat"), "fc_wd"],
                               ["logits"])]
    nodes.append(helper.make_node("Softmax", [_qdq(nodes, inits, "logits", "lg")], ["y"],
                                  axis=-1))
    graph = helper.make_graph(
        nodes, f"distinct{index}",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, side, side])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 10])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def rss() -> int:
    with open("/proc/self/statm") as f:
        pages = int(f.read().split()[1])
    import resource

    return pages * resource.getpagesize()


def main() -> None:
    warmup, count = int(sys.argv[1]), int(sys.argv[2])
    same = len(sys.argv) > 3 and sys.argv[3] == "same"
    after_warmup = 0
    for index in range(warmup + count):
        compiled = compile_model(model(0 if same else index))
        compiled.run(random_inputs(compiled))
        del compiled
        if index == warmup - 1:
            gc.collect()
            after_warmup = rss()
    gc.collect()
    print(json.dumps({"after_warmup": after_warmup, "end": rss(), "count": count}))


if __name__ == "__main__":
    main()
