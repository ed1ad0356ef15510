"""Shape rules of the quantization ops and infer_shapes over a whole graph."""

from __future__ import annotations

import numpy as np
import pytest
from shape_helpers import f32, rule

from qfuse.ir import DType, Graph, GraphError, Op, QuantParams, TensorInfo
from qfuse.ir.ops import CastAttrs, DequantizeAttrs, FakeQuantizeAttrs, QuantizeAttrs
from qfuse.ir.shapes import infer_shapes

S = np.float32


def test_quantize_per_tensor_reads_constant_scale_and_zero_point() -> None:
    (out,) = rule(Op.QUANTIZE_LINEAR, QuantizeAttrs(DType.U8),
                  [f32(1, 3), np.array(0.5, S), np.array(10, np.uint8)])
    assert out == TensorInfo((1, 3), DType.U8, QuantParams((0.5,), (10,), None))


def test_quantize_one_element_scale_is_per_tensor_and_zero_point_defaults_to_zero() -> None:
    (out,) = rule(Op.QUANTIZE_LINEAR, QuantizeAttrs(DType.S8), [f32(4), np.array([0.5], S)])
    assert out.quant == QuantParams((0.5,), (0,), None)
    assert out.quant.per_tensor


def test_quantize_per_axis() -> None:
    scale = np.array([0.1, 0.2, 0.4], S)
    (out,) = rule(Op.QUANTIZE_LINEAR, QuantizeAttrs(DType.S8, axis=1),
                  [f32(2, 3, 4), scale, np.zeros(3, np.int8)])
    assert out.quant is not None and out.quant.axis == 1 and len(out.quant.scale) == 3
    with pytest.raises(GraphError, match=r"'n' \(QuantizeLinear\): 3 scales for 4 channels"):
        rule(Op.QUANTIZE_LINEAR, QuantizeAttrs(DType.S8, axis=2), [f32(2, 3, 4), scale])


def test_quantize_with_a_computed_scale_has_no_quant_params() -> None:
    (out,) = rule(Op.QUANTIZE_LINEAR, QuantizeAttrs(DType.U8), [f32(2), f32()])
    assert out == TensorInfo((2,), DType.U8, None)


def test_dequantize_gives_f32_and_wants_integers() -> None:
    (out,) = rule(Op.DEQUANTIZE_LINEAR, DequantizeAttrs(),
                  [TensorInfo((2, 3), DType.S8), np.array(0.5, S)])
    assert out == f32(2, 3)
    with pytest.raises(GraphError, match="dequantizes a f32 tensor"):
        rule(Op.DEQUANTIZE_LINEAR, DequantizeAttrs(), [f32(2), np.array(0.5, S)])


def test_fake_quantize_f32_unless_typed_by_a_pass() -> None:
    lo, hi = np.array(0.0, S), np.array(1.0, S)
    inputs = [f32(1, 3, 2, 2), lo, hi, lo, hi]
    assert rule(Op.FAKE_QUANTIZE, FakeQuantizeAttrs(256), inputs) == [f32(1, 3, 2, 2)]
    typed = TensorInfo((1, 3, 2, 2), DType.U8, QuantParams.make(1 / 255, 0))
    assert rule(Op.FAKE_QUANTIZE, FakeQuantizeAttrs(256), inputs, out_info=typed) == [typed]
    per_channel = np.zeros((1, 3, 1, 1), S)
    assert rule(Op.FAKE_QUANTIZE, FakeQuantizeAttrs(256),
                [f32(1, 3, 2, 2), per_channel, hi, lo, hi])[0].shape == (1, 3, 2, 2)
    with pytest.raises(GraphError, match="input_low of shape"):
        rule(Op.FAKE_QUANTIZE, FakeQuantizeAttrs(256), [f32(1, 3, 2, 2), np.zeros(4, S), hi,
                                                        lo, hi])


def test_cast() -> None:
    assert rule(Op.CAST, CastAttrs(DType.S64), [f32(2)]) == [TensorInfo((2,), DType.S64)]


def test_infer_shapes_fills_a_qdq_chain_in_order() -> None:
    g = Graph("qdq")
    g.add_input("x", f32(1, 3, 4, 4))
    g.add_constant("s", np.array(0.05, S))
    g.add_constant("zp", np.array(128, np.uint8))
    q = g.add_node(Op.QUANTIZE_LINEAR, ["x", "s", "zp"], ["q"], QuantizeAttrs(DType.U8))
    g.add_node(Op.RELU, ["q"], ["r"])
    from qfuse.ir.ops import TransposeAttrs

    g.add_node(Op.TRANSPOSE, ["r"], ["t"], TransposeAttrs((0, 2, 3, 1)))
    g.add_node(Op.DEQUANTIZE_LINEAR, ["t", "s", "zp"], ["y"], DequantizeAttrs())
    g.outputs = ["y"]
    infer_shapes(g)
    assert g.info(q.outputs[0]) == TensorInfo((1, 3, 4, 4), DType.U8,
                                              QuantParams.make(0.05, 128))
    assert g.info("t").shape == (1, 4, 4, 3)
    assert g.info("t").quant == g.info("q").quant
    assert g.info("y") == f32(1, 4, 4, 3)
    assert g.info("s") == TensorInfo((), DType.F32)


def test_infer_shapes_names_the_failing_node() -> None:
    g = Graph("bad")
    g.add_input("a", f32(2, 3))
    g.add_input("b", f32(4))
    g.add_node(Op.ADD, ["a", "b"], ["c"], name="add1")
    with pytest.raises(GraphError, match=r"node 'add1' \(Add\): shapes"):
        infer_shapes(g)


def test_infer_shapes_wants_input_infos() -> None:
    g = Graph("noinfo")
    g.add_input("a", f32(1))
    g.values["a"].info = None
    with pytest.raises(GraphError, match="graph input 'a' has no tensor info"):
        infer_shapes(g)
