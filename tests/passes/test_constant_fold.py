"""constant_fold: all-constant nodes become constants (bit-exact, they are evaluated by the
reference's own op table); quantization ops and type-changing producers of their constant
inputs are never folded, and nothing is recorded for them."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import onnx
import onnxruntime as ort
from cleanup_harness import apply, assert_bit_exact, before_after, finish, op_sequence

from qfuse.ir import DType, Graph, Op, QuantParams, TensorInfo
from qfuse.ir.ops import (
    CastAttrs,
    DequantizeAttrs,
    ExpandAttrs,
    FakeQuantizeAttrs,
    QuantizeAttrs,
    TransposeAttrs,
)
from onnx import TensorProto, helper
from onnx import numpy_helper as nh

import qfuse
from qfuse.compiler import pipeline
from qfuse.examples.realzoo.quantize import quantize
from qfuse.passes import constant_fold

RNG = np.random.default_rng(0)


def randn(*shape: int) -> np.ndarray:
    return RNG.standard_normal(shape).astype(np.float32)


def test_transposed_weight_folds() -> None:
    g = Graph("t")
    g.add_input("x", TensorInfo((2, 3), DType.F32))
    g.add_constant("w", randn(4, 3))
    g.add_node(Op.TRANSPOSE, ["w"], ["wt"], TransposeAttrs((1, 0)), name="tr")
    g.add_node(Op.MATMUL, ["x", "wt"], ["y"], name="mm")
    finish(g, ["y"])
    w = g.constant("w").copy()
    result, pairs = before_after(constant_fold, g)
    assert result.changed == 1 and not result.declined
    assert op_sequence(g) == ["MatMul"]
    assert g.node("mm").inputs == ["x", "wt"]
    np.testing.assert_array_equal(g.constant("wt"), w.T)
    assert "w" not in g.values  # the unread source constant is dropped
    assert_bit_exact(pairs)


def test_chain_of_constant_nodes_folds_in_one_run() -> None:
    g = Graph("t")
    g.add_input("x", TensorInfo((5,), DType.F32))
    for name in ("a", "b", "c"):
        g.add_constant(name, randn(5))
    g.add_node(Op.ADD, ["a", "b"], ["ab"], name="add")
    g.add_node(Op.MUL, ["ab", "c"], ["abc"], name="mul")
    g.add_node(Op.SUB, ["x", "abc"], ["y"], name="sub")
    finish(g, ["y"])
    expected = (g.constant("a") + g.constant("b")) * g.constant("c")
    result, pairs = before_after(constant_fold, g)
    assert result.changed == 2
    assert op_sequence(g) == ["Sub"]
    np.testing.assert_array_equal(g.constant("abc"), expected)
    assert g.info("abc") == TensorInfo((5,), DType.F32)
    assert_bit_exact(pairs)


def test_folded_graph_output_keeps_its_name() -> None:
    g = Graph("t")
    g.add_input("x", TensorInfo((3,), DType.F32))
    g.add_constant("c", randn(3))
    g.add_node(Op.RELU, ["c"], ["rc"], name="relu_c")
    g.add_node(Op.TANH, ["x"], ["t"], name="tanh")
    finish(g, ["t", "rc"])
    result, pairs = before_after(constant_fold, g)
    assert result.changed == 1
    assert g.outputs == ["t", "rc"] and g.constant("rc") is not None
    assert_bit_exact(pairs)


def quantized_weight_graph() -> Graph:
    """x -> Q -> DQ -> Conv-like MatMul with a DQ(s8) weight, FQ on constants, Q of constant."""
    g = Graph("t")
    g.add_input("x", TensorInfo((2, 3), DType.F32))
    scale = g.add_constant("s", np.array([0.1, 0.2, 0.3], np.float32)).name
    zp = g.add_constant("zp", np.zeros(3, np.int8)).name
    q = RNG.integers(-127, 128, (3, 3)).astype(np.int8)
    g.add_constant("wq", q, TensorInfo((3, 3), DType.S8, QuantParams.make([0.1, 0.2, 0.3],
                                                                          [0, 0, 0], 1)))
    g.add_node(Op.DEQUANTIZE_LINEAR, ["wq", scale, zp], ["w"], DequantizeAttrs(1), name="dq")
    g.add_constant("cf", randn(3, 3))
    g.add_constant("xs", np.array(0.05, np.float32))
    g.add_node(Op.QUANTIZE_LINEAR, ["cf", "xs"], ["cq"], QuantizeAttrs(DType.U8, 1), name="q")
    g.add_node(Op.DEQUANTIZE_LINEAR, ["cq", "xs"], ["cdq"], DequantizeAttrs(1), name="dq2")
    lo, hi = g.add_constant("lo", np.float32(-1)).name, g.add_constant("hi", np.float32(1)).name
    g.add_node(Op.FAKE_QUANTIZE, ["cf", lo, hi, lo, hi], ["cfq"], FakeQuantizeAttrs(256),
               name="fq")
    g.add_constant("wf", randn(3, 3))
    g.add_node(Op.CAST, ["wf"], ["w8"], CastAttrs(DType.S8), name="cast")
    g.add_node(Op.DEQUANTIZE_LINEAR, ["w8", "xs"], ["w8dq"], DequantizeAttrs(1), name="dq3")
    value = "x"
    for i, other in enumerate(("w", "cdq", "cfq", "w8dq")):
        value = g.add_node(Op.MATMUL, [value, other], [f"m{i}"], name=f"mm{i}").outputs[0]
    return finish(g, [value])


def test_quantization_ops_and_cast_into_them_are_not_folded() -> None:
    g = quantized_weight_graph()
    ops = op_sequence(g)
    result, pairs = before_after(constant_fold, g)
    assert result.changed == 0 and not result.declined
    assert op_sequence(g) == ops
    assert g.info("wq").quant is not None and g.constant("wq").dtype == np.int8
    assert_bit_exact(pairs)


def test_cast_not_feeding_quantization_folds() -> None:
    g = Graph("t")
    g.add_input("x", TensorInfo((3,), DType.S32))
    g.add_constant("c", np.array([1.7, -2.2, 3.0], np.float32))
    g.add_node(Op.CAST, ["c"], ["ci"], CastAttrs(DType.S32), name="cast")
    g.add_node(Op.ADD, ["x", "ci"], ["y"], name="add")
    finish(g, ["y"])
    result, pairs = before_after(constant_fold, g)
    assert result.changed == 1
    assert op_sequence(g) == ["Add"]
    np.testing.assert_array_equal(g.constant("ci"), np.array([1, -2, 3], np.int32))
    assert_bit_exact(pairs)


def test_nothing_constant_nothing_folded() -> None:
    g = Graph("t")
    g.add_input("x", TensorInfo((3,), DType.F32))
    g.add_constant("c", randn(3))
    g.add_node(Op.ADD, ["x", "c"], ["y"], name="add")
    finish(g, ["y"])
    result = apply(constant_fold, g)
    assert result.changed == 0 and not result.declined
    assert op_sequence(g) == ["Add"]



# run_constant_cones: values computed from constants through quantization and compute ops
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
    inits = [nh.from_array(rng.standard_normal(s).astype(np.float32) * k, n)
             for n, s, k in (("w1", (8, 8, 3, 3), 0.2), ("w2", (8, 8, 3, 3), 0.2),
                             ("gamma", (8, 1, 1), 0.5), ("t", (1, 3), 1.0),
                             ("pw", (3, 36), 0.5))]
    inits.append(nh.from_array(np.array([8, 3], np.int64), "tshape"))
    inits.append(nh.from_array(np.array([1, 8, 6, 6], np.int64), "pshape"))
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
    step = float(next(nh.to_array(i) for i in model.graph.initializer
                      if i.name == "y_scale"))
    for seed in range(3):
        x = {"x": np.random.default_rng(seed).standard_normal((1, 8, 6, 6)).astype(np.float32)}
        lsb = np.abs(compiled.run(x)["y"] - session.run(None, x)[0]) / step
        assert lsb.max() <= 1 + 1e-3
