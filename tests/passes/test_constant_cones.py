"""fold_constant_cones (passes/constant_fold.py ``run_constant_cones``): every value computed
from constants alone, through quantization ops and compute ops too, is evaluated once,
bit-exact with the reference; the nodes a run-time compute op or quantizer reads through
constants (weights) and a dequantize only run-time nodes read stay.

NNCF's attention-bias table — Q/DQ on the table, a Gather by a constant index map, a Gather
per head — becomes one constant operand, and the attention logits' MatMul takes the Add as a
post-op. quantize_static without quant_pre_process: a product of quantized constants and a
layer scale shared through an Identity (``Q(Identity(DQ(gamma)))``) are constants, no kernel
computes them."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import onnx
import onnxruntime as ort
from cleanup_harness import apply, assert_bit_exact, before_after, finish, op_sequence
from onnx import TensorProto, helper, numpy_helper

import qfuse
from qfuse.compiler import pipeline
from qfuse.compiler.api import import_graph
from qfuse.compiler.pipeline import run_pipeline
from qfuse.examples.realzoo.quantize import quantize
from qfuse.ir import DType, Graph, Op, QuantParams, TensorInfo
from qfuse.ir.ops import DequantizeAttrs, ExpandAttrs, QuantizeAttrs, TransposeAttrs
from qfuse.passes import constant_fold
from qfuse.passes.base import PassContext

RNG = np.random.default_rng(0)


def randn(*shape: int) -> np.ndarray:
    return RNG.standard_normal(shape).astype(np.float32)
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
    run_pipeline(graph, until="fold_constant_cones")
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
        pipeline.PIPELINE[:] = [p for p in saved if p[0] != "fold_constant_cones"]
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
    assert constant_fold.run_constant_cones(graph, PassContext()) == 0
    assert [n for n in graph.topo_order() if n.op is Op.DEQUANTIZE_LINEAR
            and graph.constant(n.inputs[0]) is not None]


def test_a_dequantized_operand_read_directly_stays() -> None:
    """DQ(c) read by the Add itself: already a constant operand to the fusion passes (the
    quantize of the float table before it folds to the integers; the dequantize stays)."""
    graph = import_graph(_attention_logits(direct=True))
    run_pipeline(graph, until="fold_constant_cones")
    [add] = [n for n in graph.topo_order() if n.op is Op.ADD]
    dq = graph.producer(add.inputs[1])
    assert dq is not None and dq.op is Op.DEQUANTIZE_LINEAR
    assert graph.constant(dq.inputs[0]) is not None


CONES = SimpleNamespace(__name__="qfuse.passes.fold_constant_cones",
                        run=constant_fold.run_constant_cones)


def quantized_table_graph() -> Graph:
    """ConViT's positional projection as quantize_static writes it without quant_pre_process:
    ``MatMul(DQ(Q(Expand(c))), DQ(w8)) + DQ(Q(bias))`` → Q → DQ → Transpose, added to a
    run-time tensor; the same DQ(w8) is a run-time MatMul's weights, and a DQ(c8) an Add
    reads directly."""
    g = Graph("t")
    g.add_input("x", TensorInfo((4, 5), DType.F32))
    g.add_input("x3", TensorInfo((2, 3), DType.F32))
    g.add_input("x4", TensorInfo((2, 4), DType.F32))
    s, z = g.add_constant("s", np.float32(0.02)).name, g.add_constant("z", np.uint8(3)).name
    sw, zw = g.add_constant("sw", np.float32(0.05)).name, g.add_constant("zw", np.int8(0)).name
    g.add_constant("w8", RNG.integers(-127, 128, (3, 4)).astype(np.int8),
                   TensorInfo((3, 4), DType.S8, QuantParams.make([0.05], [0])))
    g.add_node(Op.DEQUANTIZE_LINEAR, ["w8", sw, zw], ["w"], DequantizeAttrs(1), name="dq_w")
    g.add_constant("table", randn(1, 3))
    g.add_node(Op.EXPAND, ["table"], ["big"], ExpandAttrs((5, 3)), name="expand")
    g.add_node(Op.QUANTIZE_LINEAR, ["big", s, z], ["bq"], QuantizeAttrs(DType.U8, 1), name="q")
    g.add_node(Op.DEQUANTIZE_LINEAR, ["bq", s, z], ["bd"], DequantizeAttrs(1), name="dq")
    g.add_node(Op.MATMUL, ["bd", "w"], ["p"], name="proj")
    g.add_constant("bias", randn(4))
    g.add_node(Op.QUANTIZE_LINEAR, ["bias", s, z], ["biq"], QuantizeAttrs(DType.U8, 1),
               name="q_bias")
    g.add_node(Op.DEQUANTIZE_LINEAR, ["biq", s, z], ["bid"], DequantizeAttrs(1), name="dq_bias")
    g.add_node(Op.ADD, ["p", "bid"], ["pb"], name="add_bias")
    g.add_node(Op.QUANTIZE_LINEAR, ["pb", s, z], ["pq"], QuantizeAttrs(DType.U8, 1), name="q_p")
    g.add_node(Op.DEQUANTIZE_LINEAR, ["pq", s, z], ["pd"], DequantizeAttrs(1), name="dq_p")
    g.add_node(Op.TRANSPOSE, ["pd"], ["pt"], TransposeAttrs((1, 0)), name="tr")
    g.add_node(Op.ADD, ["x", "pt"], ["y"], name="add_x")
    g.add_node(Op.MATMUL, ["x3", "w"], ["y2"], name="weights_user")
    g.add_constant("c8", RNG.integers(0, 256, (4,)).astype(np.uint8))
    g.add_node(Op.DEQUANTIZE_LINEAR, ["c8", s, z], ["cd"], DequantizeAttrs(1), name="dq_c")
    g.add_node(Op.ADD, ["x4", "cd"], ["y3"], name="add_c")
    return finish(g, ["y", "y2", "y3"])


def test_a_quantized_constant_cone_folds_bit_exact() -> None:
    g = quantized_table_graph()
    result, pairs = before_after(CONES, g)
    assert result.changed == 10 and not result.declined  # expand ... tr
    assert op_sequence(g) == ["DequantizeLinear", "Add", "MatMul", "DequantizeLinear", "Add"]
    assert g.constant(g.node("add_x").inputs[1]) is not None
    assert_bit_exact(pairs)


def test_weights_and_directly_read_dequantizes_keep_their_integers() -> None:
    g = quantized_table_graph()
    apply(CONES, g)
    assert g.node("weights_user").inputs[1] == "w"
    assert g.node("dq_w").inputs[0] == "w8" and g.constant("w8").dtype == np.int8
    assert g.node("add_c").inputs[1] == "cd" and g.node("dq_c").inputs[0] == "c8"


def _raw_float_model() -> onnx.ModelProto:
    """A conv stage with a layer scale shared by two blocks (torch.onnx writes an Identity
    for the repeated initializer) and a positional table ``Expand(t) @ W`` added to it."""
    rng = np.random.default_rng(3)
    inits = [numpy_helper.from_array(rng.standard_normal(s).astype(np.float32) * k, n)
             for n, s, k in (("w1", (8, 8, 3, 3), 0.2), ("w2", (8, 8, 3, 3), 0.2),
                             ("gamma", (8, 1, 1), 0.5), ("t", (1, 3), 1.0),
                             ("pw", (3, 36), 0.5))]
    inits.append(numpy_helper.from_array(np.array([8, 3], np.int64), "tshape"))
    inits.append(numpy_helper.from_array(np.array([1, 8, 6, 6], np.int64), "pshape"))
    nodes = [helper.make_node("Expand", ["t", "tshape"], ["tt"]),
             helper.make_node("MatMul", ["tt", "pw"], ["pos"]),
             helper.make_node("Reshape", ["pos", "pshape"], ["pos4"]),
             helper.make_node("Add", ["x", "pos4"], ["x1"]),
             helper.make_node("Conv", ["x1", "w1"], ["c1"], pads=[1, 1, 1, 1]),
             helper.make_node("Mul", ["c1", "gamma"], ["m1"]),
             helper.make_node("Add", ["x1", "m1"], ["r1"]),
             helper.make_node("Identity", ["gamma"], ["gamma2"]),
             helper.make_node("Conv", ["r1", "w2"], ["c2"], pads=[1, 1, 1, 1]),
             helper.make_node("Mul", ["c2", "gamma2"], ["m2"]),
             helper.make_node("Add", ["r1", "m2"], ["y"])]
    graph = helper.make_graph(
        nodes, "raw", [helper.make_tensor_value_info("x", TensorProto.FLOAT, (1, 8, 6, 6))],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, (1, 8, 6, 6))], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_quantize_static_without_pre_processing_runs_no_constant_kernels(tmp_path) -> None:
    """onnxruntime's quantize_static on a model quant_pre_process did not fold: the table's
    product and the second layer scale (``Q(Identity(DQ(gamma)))``) are quantized constants;
    folded, no kernel computes them, the convs take the layer scales, and the outputs are
    those of the model in onnxruntime."""
    rng = np.random.default_rng(4)
    calibration = [{"x": rng.standard_normal((1, 8, 6, 6)).astype(np.float32)}
                   for _ in range(4)]
    model, notes = quantize(_raw_float_model(), calibration, "qdq-raw")
    assert notes == ["quant_pre_process skipped"]
    path = tmp_path / "raw.onnx"
    onnx.save(model, path)
    compiled = qfuse.compile_model(str(path))
    kernels = compiled.inspect()["kernels"]
    # without: the table's float32 MatMul, its quantize and dequantize kernels, and the
    # second conv on ref:any (its layer scale a run-time binary operand)
    assert not [k["name"] for k in kernels if "ref" in k["impl"] or k["primitive"] == "matmul"]
    assert [k["src_dtype"] for k in kernels if k["src_dtype"] == "f32"] == ["f32"]  # input's Q
    saved = list(pipeline.PIPELINE)
    try:
        pipeline.PIPELINE[:] = [p for p in saved if p[0] != "fold_constant_cones"]
        without = qfuse.compile_model(str(path))
    finally:
        pipeline.PIPELINE[:] = saved
    assert len(without.inspect()["kernels"]) >= len(kernels) + 3
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    session = ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])
    step = float(next(numpy_helper.to_array(i) for i in model.graph.initializer
                      if i.name == "y_scale"))
    for seed in range(3):
        x = {"x": np.random.default_rng(seed).standard_normal((1, 8, 6, 6)).astype(np.float32)}
        lsb = np.abs(compiled.run(x)["y"] - session.run(None, x)[0]) / step
        assert lsb.max() <= 1 + 1e-3
