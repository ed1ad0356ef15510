"""A quantized constant no kernel reads in integers is folded to float32 with what computes
from it alone (passes/fold_float_constants.py): NNCF's attention-bias table — Q/DQ on the
table, a Gather by a constant index map, a Gather per head — becomes one constant operand, and
the attention logits' MatMul takes the Add as a post-op. A constant a MatMul reads as its
weights keeps its integers."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

import qfuse
from qfuse.compiler import pipeline
from qfuse.compiler.api import import_graph
from qfuse.compiler.pipeline import run_pipeline
from qfuse.ir import Op
from qfuse.passes import fold_float_constants
from qfuse.passes.base import PassContext

TOKENS, DIM, OFFSETS = 49, 16, 20


def _const(name: str, value: object, dtype: object = np.float32) -> onnx.TensorProto:
    return numpy_helper.from_array(np.asarray(value, dtype), name)


def _attention_logits(direct: bool = False) -> onnx.ModelProto:
    """softmax(DQ(Q(DQ(q)·DQ(k))) + bias) → Q/DQ, NNCF's form: s8 symmetric Q/DQ pairs, the bias
    ``DQ(Q(table))[:, index][1]`` (``direct``: a Q/DQ'd [TOKENS, TOKENS] bias itself)."""
    rng = np.random.default_rng(0)
    table = rng.standard_normal((2, OFFSETS)).astype(np.float32)
    index = rng.integers(0, OFFSETS, (TOKENS, TOKENS)).astype(np.int64)
    inits = [_const("s_q", 0.02), _const("s_k", 0.03), _const("s_l", 0.05), _const("s_p", 1 / 255),
             _const("s_t", float(np.abs(table).max() / 127)), _const("z", 0, np.int8),
             _const("zu", 0, np.uint8), _const("table", table), _const("index", index, np.int64),
             _const("head", 1, np.int64), _const("direct", table[1][index])]

    def qdq(src: str, scale: str, dst: str, zero: str = "z") -> list[onnx.NodeProto]:
        return [helper.make_node("QuantizeLinear", [src, scale, zero], [f"{dst}_q"]),
                helper.make_node("DequantizeLinear", [f"{dst}_q", scale, zero], [dst])]

    nodes = [*qdq("q", "s_q", "qd"), *qdq("k", "s_k", "kd"),
             helper.make_node("MatMul", ["qd", "kd"], ["l"]), *qdq("l", "s_l", "ld")]
    if direct:
        nodes += qdq("direct", "s_t", "bias")
    else:
        nodes += [*qdq("table", "s_t", "td"),
                  helper.make_node("Gather", ["td", "index"], ["all"], axis=1),
                  helper.make_node("Gather", ["all", "head"], ["bias"], axis=0)]
    nodes += [helper.make_node("Add", ["ld", "bias"], ["a"]),
              helper.make_node("Softmax", ["a"], ["p"], axis=-1), *qdq("p", "s_p", "y", "zu")]
    graph = helper.make_graph(
        nodes, "logits",
        [helper.make_tensor_value_info("q", TensorProto.FLOAT, (1, TOKENS, DIM)),
         helper.make_tensor_value_info("k", TensorProto.FLOAT, (1, DIM, TOKENS))],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, (1, TOKENS, TOKENS))], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _feeds(seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {"q": rng.standard_normal((1, TOKENS, DIM)).astype(np.float32),
            "k": rng.standard_normal((1, DIM, TOKENS)).astype(np.float32)}


def test_the_bias_table_becomes_one_constant() -> None:
    graph = import_graph(_attention_logits())
    run_pipeline(graph, until="fold_float_constants")
    [add] = [n for n in graph.topo_order() if n.op is Op.ADD]
    bias = graph.constant(add.inputs[1])
    assert bias is not None and bias.shape == (TOKENS, TOKENS)
    assert not [n for n in graph.topo_order() if n.op is Op.ISLAND or n.op is Op.SLICE]
    # the values: head 1's row of the table, quantized and dequantized as ONNX does, gathered
    model = _attention_logits()
    inits = {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}
    s_t = inits["s_t"]
    levels = np.clip(np.rint(inits["table"] / s_t), -128, 127).astype(np.int8)
    np.testing.assert_array_equal(bias, (levels.astype(np.float32) * s_t)[1][inits["index"]])


def test_the_logits_matmul_takes_the_bias_add() -> None:
    model = _attention_logits()
    compiled = qfuse.compile_model(model)
    kernels = compiled.inspect()["kernels"]
    [matmul] = [k for k in kernels if k["primitive"] == "matmul"]
    assert "binary_add" in matmul["post_ops"], matmul
    saved = list(pipeline.PIPELINE)
    try:
        # fold_constant_cones, earlier, folds the same table where nothing moved it yet
        pipeline.PIPELINE[:] = [p for p in saved
                                if p[0] not in ("fold_float_constants", "fold_constant_cones")]
        without = qfuse.compile_model(model)
    finally:
        pipeline.PIPELINE[:] = saved
    # without: the MatMul writes its output quantize; a dequantize and an Add kernel follow
    # (without VNNI the 8-bit store may be a kernel of its own as well)
    assert len(without.inspect()["kernels"]) >= len(kernels) + 2
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    session = ort.InferenceSession(model.SerializeToString(), so,
                                   providers=["CPUExecutionProvider"])
    for seed in range(3):
        feeds = _feeds(seed)
        got = compiled.run(feeds)["y"]
        np.testing.assert_array_equal(got, without.run(feeds)["y"])  # the same arithmetic
        steps = np.abs(got - session.run(None, feeds)[0]) * 255
        assert steps.max() <= 1.0 + 1e-3  # softmax: oneDNN's exp against ONNX Runtime's


def test_matmul_weights_keep_their_integers() -> None:
    """DQ(s8 w) → Transpose → MatMul: the Transpose computes from the constant alone, but the
    MatMul reads it as weights — nothing folds."""
    rng = np.random.default_rng(1)
    inits = [_const("w", rng.integers(-100, 100, (8, DIM)), np.int8), _const("s_w", 0.01),
             _const("z", 0, np.int8), _const("s_x", 0.02)]
    nodes = [helper.make_node("QuantizeLinear", ["x", "s_x", "z"], ["xq"]),
             helper.make_node("DequantizeLinear", ["xq", "s_x", "z"], ["xd"]),
             helper.make_node("DequantizeLinear", ["w", "s_w", "z"], ["wd"]),
             helper.make_node("Transpose", ["wd"], ["wt"], perm=[1, 0]),
             helper.make_node("MatMul", ["xd", "wt"], ["y"])]
    graph = helper.make_graph(
        nodes, "weights", [helper.make_tensor_value_info("x", TensorProto.FLOAT, (4, DIM))],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, (4, 8))], inits)
    graph = import_graph(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]))
    assert fold_float_constants.run(graph, PassContext()) == 0
    assert [n for n in graph.topo_order() if n.op is Op.DEQUANTIZE_LINEAR
            and graph.constant(n.inputs[0]) is not None]


def test_a_dequantized_operand_read_directly_stays() -> None:
    """DQ(c) read by the Add itself: already a constant operand to the fusion passes."""
    graph = import_graph(_attention_logits(direct=True))
    run_pipeline(graph, until="fold_weight_quantize")
    [dq] = [n for n in graph.topo_order() if n.op is Op.DEQUANTIZE_LINEAR
            and graph.constant(n.inputs[0]) is not None]
    before = [n.op for n in graph.topo_order()]
    assert fold_float_constants.run(graph, PassContext()) == 0
    assert [n.op for n in graph.topo_order()] == before
