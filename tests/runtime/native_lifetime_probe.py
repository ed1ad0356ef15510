"""Subprocess for test_native_lifetime.py: compile (and run once) QDQ models in a loop, print
how anonymous resident memory grows.

    python -m tests.runtime.native_lifetime_probe WARMUP COUNT [same]
    python -m tests.runtime.native_lifetime_probe campaign WARMUP COUNT SAME FILL FULL

The first form compiles ``model(index)``: distinct for every index (different channel counts
and image sizes, so no oneDNN primitive repeats) with convolutions, relu, a residual sum, max
and average pooling, concat, matmul and softmax (``same``: model 0 every time); it prints RSS
after the warm-up and at the end, bytes. The second (the fast test) uses ``small_model``, one
convolution, and prints KiB per compile of each phase (``campaign``). Set
ONEDNN_PRIMITIVE_CACHE_CAPACITY before starting it (oneDNN reads it when loaded).
"""

from __future__ import annotations

import gc
import json
import sys
import time

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


def small_model(index: int) -> onnx.ModelProto:
    """x -> Q -> DQ -> Conv (s8 weights) -> Q -> DQ -> y with 4 + (97 * index) % 251 output
    channels: distinct for 251 consecutive indices, and spread over the whole range from the
    first ones on (sizes that grow with the index would grow the heap's high-water mark)."""
    rng = np.random.default_rng(index)
    channels, side = 4 + (97 * index) % 251, 6 + index // 251
    nodes: list[onnx.NodeProto] = []
    inits: list[onnx.TensorProto] = []
    x = _qdq(nodes, inits, "x", "in")
    y = _qdq(nodes, inits, _conv(nodes, inits, x, "c1", 3, channels, 3, rng), "out")
    nodes.append(helper.make_node("Identity", [y], ["y"]))
    graph = helper.make_graph(
        nodes, f"small{index}",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, side, side])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, channels, side, side])],
        inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def rss() -> int:
    """Anonymous resident memory in bytes: resident minus shared pages of /proc/self/statm.

    The shared (file-backed) pages are the libraries' code and data paged in the first time a
    code path runs (onnxruntime's, libdnnl's, libc's: hundreds of KiB in steps over the first
    few hundred compiles); they are not allocated by a compile and cannot leak.
    """
    import resource

    with open("/proc/self/statm") as f:
        fields = f.read().split()
    return (int(fields[1]) - int(fields[2])) * resource.getpagesize()


def _compile_and_run(proto: onnx.ModelProto) -> None:
    compiled = compile_model(proto)
    compiled.run(random_inputs(compiled))


def campaign(warmup: int, count: int, same: int, fill: int, full: int) -> dict[str, float]:
    """The fast test's measurements in one process, small models, cache off at start
    (ONEDNN_PRIMITIVE_CACHE_CAPACITY=0): ``warmup`` distinct compiles, then ``count``
    distinct ones, ``same`` repeats of one model, and, with the cache resized to 64 entries,
    ``fill`` compiles to fill it and ``full`` more with it full. KiB per compile of each
    measured phase."""
    from qfuse.runtime.onednn.threads import set_primitive_cache_capacity

    index = 0

    def phase(n: int, repeat: int | None = None) -> float:
        nonlocal index
        gc.collect()
        before = rss()
        for _ in range(n):
            _compile_and_run(small_model(index if repeat is None else repeat))
            index += repeat is None
        gc.collect()
        return (rss() - before) / n / 1024

    phase(warmup)
    figures = {"distinct": phase(count), "same": phase(same, repeat=index - 1)}
    set_primitive_cache_capacity(64)
    phase(fill)
    figures["full_cache"] = phase(full)
    return figures


def main() -> None:
    if sys.argv[1] == "campaign":
        start = time.perf_counter()
        figures = campaign(*(int(a) for a in sys.argv[2:7]))
        print(json.dumps({**figures, "seconds": round(time.perf_counter() - start, 1)}))
        return
    warmup, count = int(sys.argv[1]), int(sys.argv[2])
    same = len(sys.argv) > 3 and sys.argv[3] == "same"
    start = time.perf_counter()
    for index in range(warmup):
        _compile_and_run(model(0 if same else index))
    gc.collect()
    after_warmup = rss()
    for index in range(warmup, warmup + count):
        _compile_and_run(model(0 if same else index))
    gc.collect()
    print(json.dumps({"after_warmup": after_warmup, "end": rss(), "count": count,
                      "seconds": round(time.perf_counter() - start, 1)}))


if __name__ == "__main__":
    main()
