"""strip_quantization (the fp32 mode's first pass) and mark_float_compute."""

from __future__ import annotations

import numpy as np

from qfuse.ir import DType, Graph, Op
from qfuse.ir.ops import ConvAttrs, NoAttrs
from qfuse.passes import strip_quantization
from qfuse.passes.base import PassContext, run_pass
from qfuse.runtime.reference import evaluate
from tests.passes.quant_helpers import add, const, dequantize, new_graph, quantize

F32 = np.float32


def _conv_qdq(zp: int) -> Graph:
    """x → Q/DQ → Conv(DQ(s8 weights), DQ(s32 bias)) → Q/DQ → y (ORT's QDQ layout)."""
    g = new_graph((1, 3, 6, 6))
    quantize(g, "x", "xq", 0.05, 128)
    dequantize(g, "xq", "xd", 0.05, 128)
    w = const(g, "w", np.random.default_rng(0).integers(-127, 128, (4, 3, 3, 3)), np.int8)
    dequantize(g, w, "wd", 0.01, 0)
    b = const(g, "b", [100, -50, 0, 7], np.int32)
    dequantize(g, b, "bd", 0.0005, 0, axis=0)
    add(g, Op.CONV, ["xd", "wd", "bd"], "c", ConvAttrs((3, 3), (1, 1), (1, 1, 1, 1), (1, 1)))
    quantize(g, "c", "cq", 0.02, zp)
    dequantize(g, "cq", "y", 0.02, zp)
    g.outputs.append("y")
    return g


def _strip(g: Graph) -> int:
    result = run_pass("strip_quantization", strip_quantization.run, g, PassContext())
    g.verify()
    return result.changed


def test_qdq_pairs_go_and_constants_fold() -> None:
    g = _conv_qdq(zp=100)
    assert _strip(g) > 0
    assert [n.op for n in g.topo_order()] == [Op.CONV]
    assert g.outputs == ["y"]  # the output keeps its name
    conv = g.topo_order()[0]
    assert g.constant(conv.inputs[1]).dtype == F32  # (w - 0)·0.01
    x = np.random.default_rng(1).standard_normal((1, 3, 6, 6)).astype(F32)
    stripped = evaluate(g, {"x": x})["y"]
    assert np.abs(stripped).max() > 0


def test_clamp_at_zero_becomes_a_clip() -> None:
    """zp = qmin after a Conv: ONNX Runtime removed a Relu there; stripping restores it."""
    g = _conv_qdq(zp=0)
    _strip(g)
    ops = [n.op for n in g.topo_order()]
    assert ops == [Op.CONV, Op.CLIP]
    clip = g.topo_order()[1]
    assert clip.attrs.min == 0.0 and np.isclose(clip.attrs.max, 0.02 * 255)
    x = np.random.default_rng(2).standard_normal((1, 3, 6, 6)).astype(F32)
    assert evaluate(g, {"x": x})["y"].min() >= 0


def test_integer_interface_stays() -> None:
    """A quantize producing a graph output is part of the interface: declined, not removed."""
    g = new_graph((2, 3))
    quantize(g, "x", "q", 0.1, 0)
    g.outputs.append("q")
    result = run_pass("strip_quantization", strip_quantization.run, g, PassContext())
    assert result.changed == 0 and len(result.declined) == 1
    assert [n.op for n in g.topo_order()] == [Op.QUANTIZE_LINEAR]


def test_mark_float_compute_moves_the_bias_into_the_chain() -> None:
    g = _conv_qdq(zp=100)
    _strip(g)
    result = run_pass("mark_float_compute", strip_quantization.mark_float_compute, g,
                      PassContext())
    g.verify()
    conv = g.topo_order()[0]
    assert result.changed == 1 and conv.fused is not None and len(conv.inputs) == 2
    assert len(conv.fused.chain) == 1  # Shift(bias)


def test_non_float_matmul_is_not_marked() -> None:
    g = new_graph((2, 4), DType.U8)
    w = const(g, "w", np.ones((4, 3)), np.uint8)
    add(g, Op.MATMUL, ["x", w], "y", NoAttrs())
    g.outputs.append("y")
    assert strip_quantization.mark_float_compute(g, PassContext()) == 0
