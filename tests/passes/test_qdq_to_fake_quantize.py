"""qdq_to_fake_quantize: Q → DQ pairs become one FakeQuantize.

Numerics: the FakeQuantize carries the pair it stands for (``FakeQuantizeAttrs.onnx``) and
rounds ONNX's way, rint(x/s) + zp, so the rewrite is bit-exact, on exact ties (whatever the
parity of the zero point) and near them too. (The level-index formula the ranges alone would
give, rint((x - il)/(ih - il)·255), differs by one level on exact ties when zp - qmin is odd,
and near ties where float32 lands on the other side: that is why the pair is carried.)
"""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper
from onnx import numpy_helper as nh
from quant_helpers import (
    F32,
    add,
    apply,
    dequantize,
    finish,
    new_graph,
    ops,
    qdq,
    quantize,
    reasons,
    reference,
    weights,
)

import qfuse
import qfuse.passes.qdq_to_fake_quantize as P
from qfuse.compiler.api import import_graph
from qfuse.compiler.pipeline import run_pipeline
from qfuse.examples.realzoo.quantize import quantize as quantize_static
from qfuse.ir import DType, Op
from qfuse.ir.ops import ConvAttrs
from qfuse.runtime.reference import evaluate


def _fq_ranges(graph, node):
    return [graph.constant(v) for v in node.inputs[1:]]


def test_pair_becomes_fake_quantize():
    g = new_graph((1, 3, 4, 4))
    y = qdq(g, "x", "y", 0.02, 113)
    add(g, Op.RELU, [y], "r")
    finish(g, "r")
    result = apply(P, g)
    assert result.changed == 1 and not result.declined
    assert ops(g) == ["FakeQuantize", "Relu"]
    fq = g.producer("y")  # the DQ's output name survives
    il, ih, ol, oh = _fq_ranges(g, fq)
    assert fq.attrs.levels == 256 and g.info("y").dtype is DType.F32
    assert il == ol == F32(0.02) * F32(-113) and ih == oh == F32(0.02) * F32(255 - 113)
    dtype, quant = fq.meta["qdq"]
    assert dtype is DType.U8 and quant.scale == (float(F32(0.02)),) and quant.zero_point == (113,)
    assert fq.meta["q_output"] == "y_q"


def test_shared_dequantizes_and_graph_output_name():
    g = new_graph((1, 8))
    quantize(g, "x", "q", 0.1, -3, DType.S8)
    dequantize(g, "q", "d1", 0.1, -3)
    dequantize(g, "q", "d2", 0.1, -3)
    add(g, Op.RELU, ["d2"], "r")
    finish(g, "d1", "r")
    assert apply(P, g).changed == 1
    assert ops(g) == ["FakeQuantize", "Relu"]
    assert g.outputs == ["d1", "r"] and g.node("r").inputs == ["d1"]
    il, ih, _, _ = _fq_ranges(g, g.producer("d1"))
    assert il == F32(0.1) * F32(-128 + 3) and ih == F32(0.1) * F32(127 + 3)


def test_per_channel_ranges_broadcast_on_the_axis():
    g = new_graph((1, 3, 2, 2))
    scale, zp = np.array([0.1, 0.2, 0.3], F32), np.array([1, 2, 3])
    quantize(g, "x", "q", scale, zp, DType.U8, axis=1)
    dequantize(g, "q", "y", scale, zp, axis=1)
    finish(g, "y")
    assert apply(P, g).changed == 1
    il, ih, _, _ = _fq_ranges(g, g.producer("y"))
    assert il.shape == ih.shape == (1, 3, 1, 1)
    np.testing.assert_array_equal(il.ravel(), scale * (0 - zp).astype(F32))
    assert g.producer("y").meta["qdq"][1].axis == 1


@pytest.mark.parametrize("case", ["other_reader", "scale", "zero_point", "graph_output"])
def test_declined_with_reason(case):
    g = new_graph((1, 4))
    quantize(g, "x", "q", 0.1, 10)
    other = 0.2 if case == "scale" else 0.1
    zp = 11 if case == "zero_point" else 10
    dequantize(g, "q", "y", other, zp)
    outs = ["y"]
    if case == "other_reader":
        add(g, Op.IDENTITY, ["q"], "raw")
        outs.append("raw")
    if case == "graph_output":
        outs.append("q")
    finish(g, *outs)
    before = ops(g)
    result = apply(P, g)
    assert result.changed == 0 and ops(g) == before
    want = {"other_reader": "not only by DequantizeLinear", "scale": "differs from",
            "zero_point": "differs from", "graph_output": "is a graph output"}[case]
    assert len(result.declined) == 1 and want in reasons(result)[0]


def test_constant_weights_are_not_touched():
    g = new_graph((1, 2, 4, 4))
    x = qdq(g, "x", "xd", 0.05, 0)
    w = weights(g, "w", np.ones((3, 2, 1, 1), np.int8), np.array([0.1, 0.2, 0.3], F32))
    add(g, Op.CONV, [x, w], "y", ConvAttrs((1, 1), (1, 1), (0, 0, 0, 0), (1, 1)))
    finish(g, "y")
    result = apply(P, g)
    assert result.changed == 1 and not result.declined  # only the activation pair
    assert ops(g).count("DequantizeLinear") == 1


def _pair(scale: float, zp: int, dtype: DType, n: int):
    g = new_graph((1, n))
    qdq(g, "x", "y", scale, zp, dtype)
    finish(g, "y")
    after = g.copy()
    apply(P, after)
    return g, after


def test_numerics_bit_exact_near_ties():
    """The FakeQuantize carries the pair (FakeQuantizeAttrs.onnx): the rewrite is exact."""
    rng = np.random.default_rng(3)
    for trial in range(40):
        dtype = (DType.U8, DType.S8)[trial % 2]
        lo, hi = dtype.range
        scale = float(F32(np.exp(rng.uniform(np.log(1e-3), 0.0))))
        zp = int(rng.integers(lo, hi + 1))
        before, after = _pair(scale, zp, dtype, 4096)
        x = (rng.uniform(lo - zp - 3, hi - zp + 3, (1, 2048)) * scale).astype(F32)
        ties = ((rng.integers(lo - zp, hi - zp, (1, 2048)) + F32(0.5)) * F32(scale)).astype(F32)
        near = np.nextafter(ties, np.where(rng.random(ties.shape) < 0.5, F32(np.inf),
                                           F32(-np.inf)).astype(F32))
        x = np.concatenate([x, near], axis=1)
        b, a = reference(before, {"x": x})["y"], reference(after, {"x": x})["y"]
        assert np.array_equal(a, b)


@pytest.mark.parametrize("zp", [0, 1, 2, 3, 100, 101, 255])
def test_exact_ties_round_like_onnx(zp):
    scale = 2.0 ** -6
    before, after = _pair(scale, zp, DType.U8, 255)
    m = np.arange(-zp, 255 - zp, dtype=F32)
    x = ((m + F32(0.5)) * F32(scale)).reshape(1, -1)
    b, a = reference(before, {"x": x})["y"], reference(after, {"x": x})["y"]
    assert np.array_equal(a, b)  # rint(x/s) + zp, whatever the parity of zp


def test_unused_quantize_is_ignored():
    g = new_graph((1, 4))
    quantize(g, "x", "q", 0.1, 0)
    add(g, Op.RELU, ["x"], "y")
    g.outputs = ["y"]
    g.verify()
    result = apply(P, g)
    assert result.changed == 0 and not result.declined


def _linear_gelu() -> onnx.ModelProto:
    """x @ W1 + b1 → GELU (erf form) → @ W2: a transformer's MLP as torch.onnx writes it
    (MatMul and Add apart; quant_pre_process would merge them)."""
    rng = np.random.default_rng(5)
    inits = [nh.from_array(rng.standard_normal(s).astype(np.float32) * k, n)
             for n, s, k in (("w1", (16, 32), 0.3), ("b1", (32,), 0.5), ("w2", (32, 8), 0.2))]
    inits += [nh.from_array(np.array(v, np.float32), n)
              for n, v in (("sqrt2", 2 ** 0.5), ("one", 1.0), ("half", 0.5))]
    nodes = [helper.make_node("MatMul", ["x", "w1"], ["h"]),
             helper.make_node("Add", ["h", "b1"], ["hb"]),
             helper.make_node("Div", ["hb", "sqrt2"], ["t"]),
             helper.make_node("Erf", ["t"], ["e"]),
             helper.make_node("Add", ["e", "one"], ["e1"]),
             helper.make_node("Mul", ["hb", "e1"], ["g"]),
             helper.make_node("Mul", ["g", "half"], ["gh"]),
             helper.make_node("MatMul", ["gh", "w2"], ["y"])]
    graph = helper.make_graph(
        nodes, "mlp", [helper.make_tensor_value_info("x", TensorProto.FLOAT, (1, 10, 16))],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, (1, 10, 8))], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _raw_quantized(tmp_path):
    rng = np.random.default_rng(6)
    calibration = [{"x": rng.standard_normal((1, 10, 16)).astype(np.float32)}
                   for _ in range(4)]
    model, _ = quantize_static(_linear_gelu(), calibration, "qdq-raw")
    path = tmp_path / "mlp.onnx"
    onnx.save(model, path)
    return path


def test_a_quantize_only_tables_read_becomes_a_quantize_only_fake_quantize(tmp_path):
    """MatMul → Q → DQ → Add b → Q → GELU: table_lookup takes the last DQ into the GELU's
    table, and the Q before it, read by the table alone, is the quantize-only FakeQuantize
    (its integers, ONNX's rounding): bit-exact."""
    graph = import_graph(onnx.load(_raw_quantized(tmp_path)))
    run_pipeline(graph, until="table_lookup")
    [table] = [n for n in graph.topo_order() if n.op is Op.TABLE]
    q = graph.producer(table.inputs[0])
    assert q.op is Op.QUANTIZE_LINEAR
    feeds = [{"x": np.random.default_rng(s).standard_normal((1, 10, 16)).astype(F32)}
             for s in range(3)]
    before = [evaluate(graph, f) for f in feeds]
    result = apply(P, graph)
    assert result.changed >= 1
    q = graph.producer(table.inputs[0])
    assert q.op is Op.FAKE_QUANTIZE and graph.info(q.outputs[0]).dtype is DType.U8
    for f, b in zip(feeds, before, strict=True):
        after = evaluate(graph, f)
        for name in b:
            np.testing.assert_array_equal(after[name], b[name])


def test_the_bias_add_joins_the_matmul_before_the_table(tmp_path):
    """End to end: the first MatMul writes the quantized sum with its bias (no dequantize,
    Add and quantize kernels after it), within one step of onnxruntime."""
    path = _raw_quantized(tmp_path)
    compiled = qfuse.compile_model(str(path))
    kernels = compiled.inspect()["kernels"]
    # the input's quantize, the MatMuls (without VNNI: as convolutions, split exactly), the
    # GELU's table: no dequantize, Add or quantize kernel of their own
    standalone = [k["name"] for k in kernels if k["primitive"] in ("binary", "reorder")]
    assert standalone == ["x_QuantizeLinear"], standalone
    assert [k["primitive"] for k in kernels].count("numpy") == 1
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    session = ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])
    model = onnx.load(path)
    [step] = [float(nh.to_array(i)) for i in model.graph.initializer
              if i.name == "y_scale"]
    for seed in range(3):
        x = {"x": np.random.default_rng(seed).standard_normal((1, 10, 16)).astype(F32)}
        lsb = np.abs(compiled.run(x)["y"] - session.run(None, x)[0]) / step
        assert lsb.max() <= 1 + 1e-3
