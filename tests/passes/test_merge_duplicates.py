"""merge_duplicates: nodes computing the same value from the same inputs become one.

The rewrite is exact (no arithmetic): reference outputs are bit-identical before and after.
End to end: onnxruntime's quantize_static with ``DedicatedQDQPair`` (a quantize → dequantize
pair per reader) compiles to the same kernels as its default output, bit-identically.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from cleanup_harness import apply, assert_bit_exact, before_after, finish, reasons
from onnx import TensorProto
from onnx import helper as h
from onnx import numpy_helper as nh

from qfuse import compile_model
from qfuse.ir import DType, Graph, Op, TensorInfo
from qfuse.ir.ops import SplitAttrs
from qfuse.passes import merge_duplicates
from tests.passes.quant_helpers import add, dequantize, quantize


def _dedicated_pairs(second_scale: float = 0.05) -> Graph:
    """x → Relu → (Q → DQ → Sigmoid, Q' → DQ' → Tanh) → Add: one pair per reader, each
    with its own (equal-valued) scale and zero point constants."""
    g = Graph("t")
    g.add_input("x", TensorInfo((2, 3, 4), DType.F32))
    add(g, Op.RELU, ["x"], "r")
    quantize(g, "r", "q1", 0.05, 3)
    dequantize(g, "q1", "d1", 0.05, 3)
    quantize(g, "r", "q2", second_scale, 3)
    dequantize(g, "q2", "d2", second_scale, 3)
    g.add_node(Op.SIGMOID, ["d1"], ["s"], name="sigmoid")
    g.add_node(Op.TANH, ["d2"], ["t"], name="tanh")
    g.add_node(Op.ADD, ["s", "t"], ["y"], name="add")
    return finish(g, ["y"])


def test_dedicated_quantize_pairs_merge() -> None:
    g = _dedicated_pairs()
    result, pairs = before_after(merge_duplicates, g)
    assert result.changed == 2 and not result.declined  # the quantize, then its dequantize
    ops = [n.op for n in g.topo_order()]
    assert ops.count(Op.QUANTIZE_LINEAR) == 1 and ops.count(Op.DEQUANTIZE_LINEAR) == 1
    assert g.node("sigmoid").inputs == g.node("tanh").inputs == ["d1"]
    assert g.node("q1").origin == ["q1", "q2"] and g.node("d1").origin == ["d1", "d2"]
    assert_bit_exact(pairs)


def test_different_parameters_stay() -> None:
    g = _dedicated_pairs(second_scale=0.06)
    assert apply(merge_duplicates, g).changed == 0
    assert [n.op for n in g.topo_order()].count(Op.QUANTIZE_LINEAR) == 2


def test_graph_output_duplicate_is_declined() -> None:
    g = Graph("t")
    g.add_input("x", TensorInfo((4,), DType.F32))
    g.add_node(Op.RELU, ["x"], ["a"], name="relu_a")
    g.add_node(Op.RELU, ["x"], ["b"], name="relu_b")
    g.add_node(Op.TANH, ["a"], ["t"], name="tanh")
    finish(g, ["t", "b"])
    result = apply(merge_duplicates, g)
    assert result.changed == 0
    assert any("writes a graph output" in r for r in reasons(result))
    assert g.has_node("relu_b")


def test_multi_output_nodes_merge_output_by_output() -> None:
    g = Graph("t")
    g.add_input("x", TensorInfo((4, 6), DType.F32))
    g.add_node(Op.SPLIT, ["x"], ["a1", "b1"], SplitAttrs(1, (2, 4)), name="split1")
    g.add_node(Op.SPLIT, ["x"], ["a2", "b2"], SplitAttrs(1, (2, 4)), name="split2")
    g.add_node(Op.SPLIT, ["x"], ["a3", "b3"], SplitAttrs(1, (3, 3)), name="other_sizes")
    g.add_node(Op.RELU, ["b2"], ["r"], name="relu")
    g.add_node(Op.TANH, ["a2"], ["t"], name="tanh")
    g.add_node(Op.SIGMOID, ["a3"], ["s"], name="sigmoid")
    finish(g, ["r", "t", "s", "b1"])
    result, pairs = before_after(merge_duplicates, g)
    assert result.changed == 1
    assert not g.has_node("split2") and g.has_node("other_sizes")
    assert g.node("relu").inputs == ["b1"] and g.node("tanh").inputs == ["a1"]
    assert_bit_exact(pairs)


# ----------------------------------------------------------------- end to end (quantize_static)
def _float_model() -> onnx.ModelProto:
    """conv → relu, read by two convs (their sum the output) and a max pool."""
    rng = np.random.default_rng(0)
    inits = [nh.from_array(rng.standard_normal(shape).astype(np.float32) * 0.3, name)
             for name, shape in (("w0", (8, 3, 3, 3)), ("w1", (8, 8, 3, 3)),
                                 ("w2", (8, 8, 1, 1)))]
    nodes = [h.make_node("Conv", ["x", "w0"], ["c0"], pads=[1, 1, 1, 1]),
             h.make_node("Relu", ["c0"], ["r0"]),
             h.make_node("Conv", ["r0", "w1"], ["c1"], pads=[1, 1, 1, 1]),
             h.make_node("Conv", ["r0", "w2"], ["c2"]),
             h.make_node("MaxPool", ["r0"], ["p"], kernel_shape=[1, 1]),
             h.make_node("Add", ["c1", "c2"], ["s"]),
             h.make_node("Add", ["s", "p"], ["y"])]
    graph = h.make_graph(nodes, "g", [h.make_tensor_value_info("x", TensorProto.FLOAT,
                                                               [1, 3, 12, 12])],
                         [h.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8, 12, 12])],
                         inits)
    return h.make_model(graph, opset_imports=[h.make_opsetid("", 17)])


@pytest.fixture(scope="module")
def quantized(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    from onnxruntime.quantization import QuantFormat, quantize_static

    tmp = tmp_path_factory.mktemp("dedicated")
    src = tmp / "float.onnx"
    onnx.save(_float_model(), src)
    rng = np.random.default_rng(1)
    feeds = [{"x": rng.standard_normal((1, 3, 12, 12)).astype(np.float32)} for _ in range(4)]

    class Reader:
        def __init__(self) -> None:
            self.it = iter(feeds)

        def get_next(self) -> dict[str, np.ndarray] | None:
            return next(self.it, None)

    paths = {}
    for kind, extra in (("shared", {}), ("dedicated", {"DedicatedQDQPair": True})):
        paths[kind] = tmp / f"{kind}.onnx"
        quantize_static(str(src), str(paths[kind]), Reader(), quant_format=QuantFormat.QDQ,
                        per_channel=True, extra_options=extra)
    return paths


def test_dedicated_qdq_pairs_compile_like_shared_ones(quantized: dict[str, Path]) -> None:
    dedicated = onnx.load(quantized["dedicated"])
    shared = onnx.load(quantized["shared"])
    count = sum(n.op_type == "QuantizeLinear" for n in dedicated.graph.node)
    assert count > sum(n.op_type == "QuantizeLinear" for n in shared.graph.node)  # premise
    x = {"x": np.random.default_rng(2).standard_normal((1, 3, 12, 12)).astype(np.float32)}
    kernels, outputs, merged = {}, {}, {}
    for kind, path in quantized.items():
        model = compile_model(str(path))
        details = model.inspect()
        kernels[kind], merged[kind] = len(details["kernels"]), details["passes"]["merge_duplicates"]
        outputs[kind] = model.run(x)["y"]
    assert kernels["dedicated"] == kernels["shared"]
    assert merged["shared"] == 0 and merged["dedicated"] > 0  # the pass is what did it
    np.testing.assert_array_equal(outputs["dedicated"], outputs["shared"])
