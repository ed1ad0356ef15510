"""Constant folding at import time and the decomposed-GELU patterns."""

from __future__ import annotations

import numpy as np
import pytest
from island_helpers import assert_island, islands
from onnx import TensorProto, helper
from onnx_builders import init, model, run_ort

from qfuse.compiler.api import compile_model
from qfuse.compiler.errors import UnsupportedModelError
from qfuse.compiler.onnx_import import import_model
from qfuse.ir import Op
from qfuse.ir.ops import GeluApprox, ReshapeAttrs

F, I64 = np.float32, np.int64
FLOAT = TensorProto.FLOAT


def const(name: str, value: object, dtype: object = F) -> object:
    return helper.make_node("Constant", [], [name], name=f"c_{name}",
                            value=helper.make_tensor(name, helper.np_dtype_to_tensor_dtype(
                                np.dtype(dtype)), np.shape(value),
                                np.asarray(value, dtype).ravel().tolist()))


def test_shape_gather_unsqueeze_concat_reshape_folds_to_a_static_reshape() -> None:
    nodes = [
        helper.make_node("Shape", ["x"], ["shape"], name="shape"),
        const("zero", 0, I64),
        helper.make_node("Gather", ["shape", "zero"], ["batch"], name="gather", axis=0),
        helper.make_node("Unsqueeze", ["batch", "axes"], ["batch1"], name="unsq"),
        const("minus1", [-1], I64),
        helper.make_node("Concat", ["batch1", "minus1"], ["target"], name="concat", axis=0),
        helper.make_node("Reshape", ["x", "target"], ["y"], name="reshape"),
    ]
    m = model(nodes, {"x": ([2, 3, 4], FLOAT)}, ["y"], [init("axes", np.array([0], I64))],
              opset=13)
    g = import_model(m)
    (node,) = list(g)
    assert node.op is Op.RESHAPE and node.attrs == ReshapeAttrs((2, 12))
    assert node.inputs == ["x"] and node.origin == ["reshape"]
    assert not [v for v in g.values.values() if v.is_constant]


def test_constant_forms_fold() -> None:
    nodes = [
        helper.make_node("Constant", [], ["a"], name="ca", value_float=2.0),
        helper.make_node("Constant", [], ["b"], name="cb", value_floats=[1.0, 2.0, 3.0]),
        helper.make_node("Constant", [], ["c"], name="cc", value_ints=[3]),
        helper.make_node("Constant", [], ["d"], name="cd", sparse_value=helper.make_sparse_tensor(
            helper.make_tensor("v", FLOAT, [2], [5.0, 7.0]),
            helper.make_tensor("i", TensorProto.INT64, [2], [0, 2]), [3])),
        helper.make_node("ConstantOfShape", ["c"], ["e"], name="cos",
                         value=helper.make_tensor("v", FLOAT, [1], [0.5])),
        helper.make_node("Mul", ["a", "b"], ["ab"], name="mul"),
        helper.make_node("Add", ["ab", "d"], ["abd"], name="add"),
        helper.make_node("Add", ["abd", "e"], ["k"], name="add2"),
        helper.make_node("Add", ["x", "k"], ["y"], name="out"),
    ]
    g = import_model(model(nodes, {"x": ([3], FLOAT)}, ["y"], opset=13))
    (node,) = list(g)
    assert node.name == "out"
    np.testing.assert_allclose(g.constant(node.inputs[1]), [7.5, 4.5, 13.5])


def test_otherwise_unsupported_ops_fold_on_constants() -> None:
    nodes = [
        helper.make_node("Erf", ["c"], ["erf"], name="erf"),
        helper.make_node("Sqrt", ["c"], ["sqrt"], name="sqrt"),
        helper.make_node("Range", ["start", "limit", "delta"], ["r"], name="range"),
        helper.make_node("Cast", ["r"], ["rf"], name="cast", to=FLOAT),
        helper.make_node("Add", ["erf", "sqrt"], ["es"], name="add"),
        helper.make_node("Mul", ["es", "rf"], ["k"], name="mul"),
        helper.make_node("Equal", ["rf", "rf"], ["eq"], name="eq"),
        helper.make_node("Where", ["eq", "k", "rf"], ["w"], name="where"),
        helper.make_node("Expand", ["w", "shape"], ["wide"], name="expand"),
        helper.make_node("Add", ["x", "wide"], ["y"], name="out"),
    ]
    inits = [init("c", np.array(0.5, F)), init("start", np.array(0, I64)),
             init("limit", np.array(3, I64)), init("delta", np.array(1, I64)),
             init("shape", np.array([2, 3], I64))]
    m = model(nodes, {"x": ([2, 3], FLOAT)}, ["y"], inits, opset=13)
    g = import_model(m)
    (node,) = list(g)
    x = np.ones((2, 3), F)
    np.testing.assert_allclose(x + g.constant(node.inputs[1]), run_ort(m, {"x": x})[0],
                               rtol=1e-6)


def test_op_without_a_native_lowering_on_runtime_values_is_an_island() -> None:
    node = helper.make_node("Erf", ["x"], ["y"], name="erf")
    assert_island(model([node], {"x": ([2], FLOAT)}, ["y"]), {"Erf"},
                  r"^op Erf has no native lowering")


def test_transpose_of_a_weight_folds() -> None:
    nodes = [helper.make_node("Transpose", ["w"], ["wt"], name="t", perm=[1, 0]),
             helper.make_node("MatMul", ["x", "wt"], ["y"], name="mm")]
    g = import_model(model(nodes, {"x": ([1, 3], FLOAT)}, ["y"],
                           [init("w", np.arange(6, dtype=F).reshape(2, 3))]))
    assert [n.op for n in g] == [Op.MATMUL]
    np.testing.assert_array_equal(g.constant("wt"), np.arange(6, dtype=F).reshape(2, 3).T)


# -------------------------------------------------------------------------------------- GELU
def gelu_erf(variant: str) -> list:
    """0.5·x·(1 + erf(x/√2)) in the orders exporters write."""
    if variant == "div":
        scaled = [const("sqrt2", 1.4142135381698608),
                  helper.make_node("Div", ["x", "sqrt2"], ["u"], name="div")]
    else:
        scaled = [const("rsqrt2", 0.7071067690849304),
                  helper.make_node("Mul", ["rsqrt2", "x"], ["u"], name="scale")]
    common = [helper.make_node("Erf", ["u"], ["e"], name="erf"), const("one", 1.0),
              helper.make_node("Add", ["e", "one"], ["a"], name="add1"), const("half", 0.5)]
    if variant == "div":  # PyTorch: Mul(x, a) then Mul(., 0.5)
        tail = [helper.make_node("Mul", ["x", "a"], ["xa"], name="mul_x"),
                helper.make_node("Mul", ["xa", "half"], ["g"], name="mul_half")]
    else:  # (0.5·x)·a
        tail = [helper.make_node("Mul", ["half", "x"], ["hx"], name="mul_half"),
                helper.make_node("Mul", ["a", "hx"], ["g"], name="mul_x")]
    return scaled + common + tail


def gelu_tanh(cube: str) -> list:
    """0.5·x·(1 + tanh(√(2/π)·(x + 0.044715·x³)))."""
    if cube == "pow":
        x3 = [const("three", 3.0), helper.make_node("Pow", ["x", "three"], ["x3"], name="pow")]
    else:
        x3 = [helper.make_node("Mul", ["x", "x"], ["xx"], name="sq"),
              helper.make_node("Mul", ["xx", "x"], ["x3"], name="cube")]
    return x3 + [
        const("c", 0.044715), helper.make_node("Mul", ["x3", "c"], ["cx3"], name="mul_c"),
        helper.make_node("Add", ["x", "cx3"], ["inner"], name="add_x"),
        const("k", 0.7978845834732056),
        helper.make_node("Mul", ["inner", "k"], ["t_in"], name="mul_k"),
        helper.make_node("Tanh", ["t_in"], ["t"], name="tanh"),
        const("one", 1.0), helper.make_node("Add", ["one", "t"], ["a"], name="add1"),
        const("half", 0.5), helper.make_node("Mul", ["x", "half"], ["hx"], name="mul_half"),
        helper.make_node("Mul", ["hx", "a"], ["g"], name="mul_x"),
    ]


def with_consumer(nodes: list) -> object:
    """x -> Relu -> [pattern on 'x'] -> Sigmoid, so the pattern sits inside a graph."""
    pre = helper.make_node("Relu", ["inp"], ["x"], name="pre")
    post = helper.make_node("Sigmoid", ["g"], ["y"], name="post")
    return model([pre, *nodes, post], {"inp": ([2, 8], FLOAT)}, ["y"], opset=17)


@pytest.mark.parametrize(("nodes", "mode"), [
    (gelu_erf("div"), GeluApprox.NONE), (gelu_erf("mul"), GeluApprox.NONE),
    (gelu_tanh("pow"), GeluApprox.TANH), (gelu_tanh("mul"), GeluApprox.TANH),
])
def test_decomposed_gelu_becomes_one_node(nodes: list, mode: GeluApprox) -> None:
    m = with_consumer(nodes)
    g = import_model(m)
    ops = [n.op for n in g]
    assert ops == [Op.RELU, Op.GELU, Op.SIGMOID]
    gelu = g.producer("g")
    assert gelu.attrs.approximate is mode and gelu.inputs == ["x"]
    absorbed = {n.name for n in nodes if n.op_type != "Constant"}
    assert set(gelu.origin) == absorbed
    # The pattern computes what the GELU it became computes (checked against ONNX Runtime).
    inp = np.linspace(-4, 4, 16, dtype=F).reshape(2, 8)
    x = np.maximum(inp, 0).astype(np.float64)
    if mode is GeluApprox.NONE:
        from math import erf

        want = 0.5 * x * (1 + np.vectorize(erf)(x / np.sqrt(2)))
    else:
        want = 0.5 * x * (1 + np.tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * x**3)))
    np.testing.assert_allclose(run_ort(m, {"inp": inp})[0], 1 / (1 + np.exp(-want)), rtol=1e-5)


def test_gelu_pattern_with_a_shared_inner_value_is_not_fused() -> None:
    nodes = gelu_erf("div")
    pre = helper.make_node("Relu", ["inp"], ["x"], name="pre")
    extra = helper.make_node("Add", ["g", "e"], ["y"], name="reads_erf")
    m = model([pre, *nodes, extra], {"inp": ([2, 8], FLOAT)}, ["y"], opset=17)
    g = import_model(m)
    assert not [n for n in g if n.op is Op.GELU]
    assert "Erf" in islands(g)[0].attrs.ops


def test_gelu_pattern_with_wrong_constant_is_not_fused() -> None:
    nodes = gelu_erf("div")
    nodes[0] = const("sqrt2", 1.5)
    g = import_model(with_consumer(nodes))
    assert not [n for n in g if n.op is Op.GELU]
    assert "Erf" in islands(g)[0].attrs.ops


def test_sparse_initializer_is_a_dense_constant() -> None:
    m = model([helper.make_node("Add", ["x", "sp"], ["y"], name="add")],
              {"x": ([4], FLOAT)}, ["y"])
    m.graph.sparse_initializer.append(helper.make_sparse_tensor(
        helper.make_tensor("sp", FLOAT, [2], [1.0, 2.0]),
        helper.make_tensor("sp_i", TensorProto.INT64, [2], [1, 3]), [4]))
    g = import_model(m)
    np.testing.assert_array_equal(g.constant("sp"), [0, 1, 0, 2])


def test_string_constant_is_unsupported() -> None:
    nodes = [helper.make_node("Constant", [], ["s"], name="cs", value_string="hi"),
             helper.make_node("Identity", ["s"], ["y"], name="id")]
    with pytest.raises(UnsupportedModelError, match=r"'cs' \(Constant\): Constant with "
                                                    r"attribute 'value_string'"):
        import_model(model(nodes, {"x": ([1], FLOAT)}, ["y"]))


def _if_on_batch(batch: int | None = None) -> object:
    """x [2, 8, 6, 6] quantized → Conv → If(Shape(x)[0] == ``batch``, or a run-time test
    x's largest element > 0 when None): then Relu(conv), else Neg(conv), both reading the
    outer conv output; → quantized."""
    rng = np.random.default_rng(2)
    then_g = helper.make_graph([helper.make_node("Relu", ["c"], ["t"], name="relu")], "then",
                               [], [helper.make_tensor_value_info("t", FLOAT, None)])
    else_g = helper.make_graph([helper.make_node("Neg", ["c"], ["e"], name="neg")], "else",
                               [], [helper.make_tensor_value_info("e", FLOAT, None)])
    nodes = [helper.make_node("QuantizeLinear", ["x", "xs", "xz"], ["xq"]),
             helper.make_node("DequantizeLinear", ["xq", "xs", "xz"], ["xd"]),
             helper.make_node("DequantizeLinear", ["w", "ws", "wz"], ["wd"], axis=0),
             helper.make_node("Conv", ["xd", "wd"], ["c"], pads=[1, 1, 1, 1])]
    if batch is None:
        nodes += [helper.make_node("ReduceMax", ["x"], ["mx"], keepdims=0),
                  helper.make_node("Greater", ["mx", "zero_f"], ["cond"])]
    else:
        nodes += [helper.make_node("Shape", ["x"], ["shape"]),
                  helper.make_node("Gather", ["shape", "zero"], ["b"], axis=0),
                  helper.make_node("Equal", ["b", "want"], ["cond"])]
    nodes += [helper.make_node("If", ["cond"], ["r"], name="if", then_branch=then_g,
                               else_branch=else_g),
              helper.make_node("QuantizeLinear", ["r", "ys", "yz"], ["yq"]),
              helper.make_node("DequantizeLinear", ["yq", "ys", "yz"], ["y"])]
    inits = [init("w", rng.integers(-127, 128, (8, 8, 3, 3)).astype(np.int8)),
             init("ws", rng.uniform(0.001, 0.003, 8).astype(F)), init("wz", np.zeros(8, np.int8)),
             init("xs", F(0.02)), init("xz", np.uint8(128)), init("ys", F(0.05)),
             init("yz", np.uint8(128)), init("zero", np.array(0, I64)),
             init("want", np.array(batch or 0, I64)), init("zero_f", F(0))]
    return model(nodes, {"x": ([2, 8, 6, 6], FLOAT)}, ["y"], inits, opset=13)


@pytest.mark.parametrize("batch", [2, 3])
def test_an_if_on_a_static_shape_is_its_branch(batch: int) -> None:
    """An If whose condition folds (a test on a static shape, as exporters write for dynamic
    batches) is the branch it takes, inlined: no island, the branch's Relu / Neg fused or
    lowered like any node; the outputs are onnxruntime's within a rounding step."""
    import qfuse
    from qfuse.runtime.numerics import step_diff

    m = _if_on_batch(batch)
    assert not islands(import_model(m))
    compiled = qfuse.compile_model(m)
    kernels = compiled.inspect()["kernels"]
    assert not [k for k in kernels if k["primitive"] == "island"], kernels
    if batch == 2:  # Relu: in the convolution's chain
        assert any("eltwise_relu" in k.get("post_ops", []) for k in kernels), kernels
    x = np.random.default_rng(0).normal(0, 1, (2, 8, 6, 6)).astype(F)
    want = run_ort(m, {"x": x})[0]
    assert step_diff(compiled.run({"x": x})["y"], want, 0.05).max_steps <= 1


def test_an_if_on_a_run_time_value_stays_an_island() -> None:
    m = _if_on_batch(None)
    assert [n.op for n in islands(import_model(m))]


@pytest.mark.parametrize("factor", [0, 3])
def test_an_integer_times_zero_folds(factor: int) -> None:
    """silero-vad keeps its sample-rate input alive as ``state + Cast(sr·0)``: an integer
    times a constant of zeros is zeros (integers hold no NaN or infinity), so the chain folds
    and no host kernel runs each time; another factor stays."""
    import qfuse

    nodes = [helper.make_node("Mul", ["sr", "k"], ["m"], name="mul"),
             helper.make_node("Cast", ["m"], ["mf"], name="cast", to=TensorProto.FLOAT),
             helper.make_node("Add", ["x", "mf"], ["y"], name="add")]
    m = model(nodes, {"x": ([2, 3], FLOAT), "sr": ([], TensorProto.INT64)}, ["y"],
              [init("k", np.array(factor, I64))], opset=13)
    ops = [n.op for n in import_model(m)]
    assert (Op.MUL not in ops) == (factor == 0), ops
    feeds = {"x": np.random.default_rng(0).normal(0, 1, (2, 3)).astype(F),
             "sr": np.array(16000, I64)}
    np.testing.assert_array_equal(qfuse.compile_model(m).run(feeds)["y"], run_ort(m, feeds)[0])


def _quantized_same_padding() -> object:
    """TF-style "same" padding as quantize_static writes it without quant_pre_process: the
    pad amounts are float arithmetic on the input's shape, and each float result gets a
    Q/DQ pair before the Cast to int64 that Pad reads (timm's ``tf_`` models)."""
    nodes = [
        helper.make_node("Shape", ["x"], ["shape"], name="shape"),
        const("hw", [2, 3], I64),
        helper.make_node("Gather", ["shape", "hw"], ["size"], name="gather", axis=0),
        helper.make_node("Cast", ["size"], ["sizef"], name="tofloat", to=FLOAT),
        const("half", 0.5),
        helper.make_node("Mul", ["sizef", "half"], ["amount"], name="amount"),
        helper.make_node("Floor", ["amount"], ["low"], name="floor"),
        helper.make_node("Ceil", ["amount"], ["high"], name="ceil"),
        helper.make_node("QuantizeLinear", ["low", "s", "z"], ["low_q"], name="q_low"),
        helper.make_node("DequantizeLinear", ["low_q", "s", "z"], ["low_d"], name="dq_low"),
        helper.make_node("QuantizeLinear", ["high", "s", "z"], ["high_q"], name="q_high"),
        helper.make_node("DequantizeLinear", ["high_q", "s", "z"], ["high_d"], name="dq_high"),
        helper.make_node("Concat", ["zeros", "low_d", "zeros", "high_d"], ["padsf"],
                         name="concat", axis=0),
        helper.make_node("QuantizeLinear", ["padsf", "s", "z"], ["pads_q"], name="q_pads"),
        helper.make_node("DequantizeLinear", ["pads_q", "s", "z"], ["pads_d"], name="dq_pads"),
        helper.make_node("Cast", ["pads_d"], ["pads"], name="toint", to=TensorProto.INT64),
        helper.make_node("Pad", ["x", "pads"], ["y"], name="pad"),
    ]
    inits = [init("s", np.float32(1 / 64)), init("z", np.uint8(0)),
             init("zeros", np.zeros(2, np.float32))]
    return model(nodes, {"x": ([1, 2, 5, 6], FLOAT)}, ["y"], inits, opset=17)


def test_pads_computed_through_quantization_ops_are_evaluated() -> None:
    """The pads are computed from constants alone, through Q/DQ pairs the import's folding
    does not cross (a weight's dequantize must reach the passes): evaluated as ONNX computes
    them, so the Pad is a static op and nothing runs as an island."""
    m = _quantized_same_padding()
    g = import_model(m)
    assert not islands(g)
    [pad] = [n for n in g if n.op is Op.PAD]
    x = np.random.default_rng(0).standard_normal((1, 2, 5, 6)).astype(F)
    [want] = run_ort(m, {"x": x}, optimized=False)
    assert g.info(pad.outputs[0]).shape == want.shape == (1, 2, 10, 12)
    np.testing.assert_array_equal(compile_model(m).run({"x": x})["y"], want)
