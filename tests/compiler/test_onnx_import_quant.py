"""QuantizeLinear / DequantizeLinear / FakeQuantize import: QuantParams on values, integer
weights kept as constants, and every invalid quantization refused with the node's name."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from island_helpers import assert_island, islands
from onnx import TensorProto, helper
from onnx_builders import init, model, run_ort

from qfuse.compiler.api import compile_model
from qfuse.compiler.errors import MalformedModelError, UnsupportedModelError
from qfuse.compiler.onnx_import import import_model
from qfuse.ir import DType, Op, QuantParams
from qfuse.ir.ops import DequantizeAttrs, FakeQuantizeAttrs, QuantizeAttrs

F = np.float32
FLOAT = TensorProto.FLOAT


def qdq_model(scale: object = 0.05, zp: object = np.uint8(128), opset: int = 13,
              q_attrs: dict | None = None, shape: tuple[int, ...] = (1, 3, 4, 4)) -> object:
    """x -> QuantizeLinear('q') -> DequantizeLinear('dq') -> y."""
    inits = [init("s", np.asarray(scale, F))]
    names = ["x", "s"]
    if zp is not None:
        inits.append(init("zp", np.asarray(zp)))
        names.append("zp")
    nodes = [helper.make_node("QuantizeLinear", names, ["xq"], name="q", **(q_attrs or {})),
             helper.make_node("DequantizeLinear", ["xq", *names[1:]], ["y"], name="dq")]
    return model(nodes, {"x": (list(shape), FLOAT)}, ["y"], inits, opset)


def test_qdq_per_tensor() -> None:
    g = import_model(qdq_model())
    q, dq = list(g)
    assert q.op is Op.QUANTIZE_LINEAR and q.attrs == QuantizeAttrs(DType.U8, 1)
    assert dq.op is Op.DEQUANTIZE_LINEAR and dq.attrs == DequantizeAttrs(1)
    assert g.info("xq").dtype is DType.U8
    assert g.info("xq").quant == QuantParams.make(0.05, 128)
    assert g.info("y").dtype is DType.F32 and q.origin == ["q"] and dq.origin == ["dq"]


def test_zero_point_defaults_to_u8_zero() -> None:
    g = import_model(qdq_model(zp=None))
    assert g.info("xq").dtype is DType.U8 and g.info("xq").quant == QuantParams.make(0.05, 0)
    assert g.node("q").inputs == ["x", "s"]


def test_s8_per_axis_activation_quantization() -> None:
    g = import_model(qdq_model(scale=[0.1, 0.2, 0.3], zp=np.zeros(3, np.int8),
                               q_attrs={"axis": -3}))
    quant = g.info("xq").quant
    assert g.info("xq").dtype is DType.S8 and quant is not None and quant.axis == 1
    assert g.node("q").attrs.axis == 1


def test_opset21_output_dtype_and_saturate_ignored() -> None:
    g = import_model(qdq_model(zp=None, opset=21,
                               q_attrs={"output_dtype": TensorProto.INT8, "saturate": 1}))
    assert g.info("xq").dtype is DType.S8


def test_onnxruntime_weights_stay_integer_constants_with_their_scales() -> None:
    """The ONNX Runtime quantizer's layout: s8 weights + per-channel DQ, s32 bias + DQ."""
    rng = np.random.default_rng(0)
    w = rng.integers(-127, 128, (4, 3, 3, 3)).astype(np.int8)
    w_scale = np.array([0.01, 0.02, 0.03, 0.04], F)
    b = rng.integers(-1000, 1000, 4).astype(np.int32)
    inits = [init("w", w), init("w_s", w_scale), init("w_zp", np.zeros(4, np.int8)),
             init("b", b), init("b_s", w_scale * 0.05), init("b_zp", np.zeros(4, np.int32)),
             init("s", np.array(0.05, F)), init("zp", np.array(128, np.uint8))]
    nodes = [
        helper.make_node("QuantizeLinear", ["x", "s", "zp"], ["xq"], name="q"),
        helper.make_node("DequantizeLinear", ["xq", "s", "zp"], ["xd"], name="dq"),
        helper.make_node("DequantizeLinear", ["w", "w_s", "w_zp"], ["wd"], name="dq_w", axis=0),
        helper.make_node("DequantizeLinear", ["b", "b_s", "b_zp"], ["bd"], name="dq_b", axis=0),
        helper.make_node("Conv", ["xd", "wd", "bd"], ["y"], name="conv", pads=[1, 1, 1, 1]),
    ]
    g = import_model(model(nodes, {"x": ([1, 3, 8, 8], FLOAT)}, ["y"], inits))
    assert [n.op for n in g].count(Op.DEQUANTIZE_LINEAR) == 3
    weight = g.values["w"]
    assert weight.is_constant and weight.data.dtype == np.int8
    np.testing.assert_array_equal(weight.data, w)
    assert weight.info.quant == QuantParams.make(w_scale, 0, axis=0)
    bias = g.values["b"]
    assert bias.data.dtype == np.int32 and bias.info.quant is not None
    assert bias.info.quant.axis == 0 and g.node("dq_w").attrs.axis == 0
    assert g.info("y").shape == (1, 4, 8, 8)


def _torch_conv(cast: bool) -> onnx.ModelProto:
    """A PyTorch-quantized convolution as torch.onnx exports it: QuantizeLinear, a Cast to
    UINT8 of its (already u8) output, DequantizeLinear; s8 per-channel weights, an int32 bias
    dequantized, ReLU, QuantizeLinear / Cast / DequantizeLinear of the output. ``cast=False``:
    the same model without the Casts."""
    rng = np.random.default_rng(3)
    w_scale = rng.uniform(0.005, 0.02, 8).astype(F)
    inits = [init("s", np.array(0.04, F)), init("zp", np.array(120, np.uint8)),
             init("w", rng.integers(-127, 128, (8, 4, 3, 3)).astype(np.int8)),
             init("w_s", w_scale), init("w_zp", np.zeros(8, np.int8)),
             init("b", rng.integers(-3000, 3000, 8).astype(np.int32)),
             init("b_s", w_scale * F(0.04)), init("b_zp", np.zeros(8, np.int32)),
             init("o_s", np.array(0.03, F)), init("o_zp", np.array(0, np.uint8))]

    def pair(src: str, scale: str, zp: str, dst: str) -> list[onnx.NodeProto]:
        q = helper.make_node("QuantizeLinear", [src, scale, zp], [f"{dst}_q"])
        if not cast:
            return [q, helper.make_node("DequantizeLinear", [f"{dst}_q", scale, zp], [dst])]
        return [q, helper.make_node("Cast", [f"{dst}_q"], [f"{dst}_c"], to=TensorProto.UINT8),
                helper.make_node("DequantizeLinear", [f"{dst}_c", scale, zp], [dst])]

    nodes = [*pair("x", "s", "zp", "xd"),
             helper.make_node("DequantizeLinear", ["w", "w_s", "w_zp"], ["wd"], axis=0),
             helper.make_node("DequantizeLinear", ["b", "b_s", "b_zp"], ["bd"], axis=0),
             helper.make_node("Conv", ["xd", "wd", "bd"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c"], ["r"]), *pair("r", "o_s", "o_zp", "y")]
    return model(nodes, {"x": ([1, 4, 10, 10], FLOAT)}, ["y"], inits)


def test_a_cast_to_the_type_it_has_is_an_identity() -> None:
    """torch.onnx's Cast between QuantizeLinear and DequantizeLinear leaves the pair a pair:
    the same kernels as without it (int8 convolutions, no numpy Cast), and ONNX Runtime's outputs."""
    g = import_model(_torch_conv(cast=True))
    assert Op.CAST not in [n.op for n in g]
    x = np.random.default_rng(4).standard_normal((1, 4, 10, 10)).astype(F)
    kernels = []
    for cast in (True, False):
        compiled = compile_model(_torch_conv(cast))
        kernels.append([k["primitive"] for k in compiled.inspect()["kernels"]])
        np.testing.assert_array_equal(compiled.run({"x": x})["y"],
                                      run_ort(_torch_conv(cast), {"x": x}, optimized=False)[0])
    assert kernels[0] == kernels[1]
    assert "convolution" in kernels[0] and "numpy" not in kernels[0], kernels[0]


def test_quantize_of_a_float_weight_folds_into_an_integer_constant() -> None:
    w = np.array([[0.1, -0.2], [0.3, 0.5]], F)
    nodes = [
        helper.make_node("QuantizeLinear", ["w", "s", "zp"], ["wq"], name="q_w"),
        helper.make_node("DequantizeLinear", ["wq", "s", "zp"], ["wd"], name="dq_w"),
        helper.make_node("MatMul", ["x", "wd"], ["y"], name="mm"),
    ]
    inits = [init("w", w), init("s", np.array(0.01, F)), init("zp", np.array(0, np.int8))]
    g = import_model(model(nodes, {"x": ([1, 2], FLOAT)}, ["y"], inits))
    assert [n.op for n in g] == [Op.DEQUANTIZE_LINEAR, Op.MATMUL]
    folded = g.values["wq"]
    np.testing.assert_array_equal(folded.data, np.array([[10, -20], [30, 50]], np.int8))
    assert folded.info.dtype is DType.S8 and folded.info.quant == QuantParams.make(0.01, 0)


def test_one_initializer_two_scales_is_copied() -> None:
    nodes = [helper.make_node("DequantizeLinear", ["w", "s1"], ["a"], name="d1"),
             helper.make_node("DequantizeLinear", ["w", "s2"], ["b"], name="d2"),
             helper.make_node("Add", ["a", "b"], ["c"], name="add"),
             helper.make_node("Add", ["x", "c"], ["y"], name="add2")]
    inits = [init("w", np.ones(3, np.uint8)), init("s1", np.array(0.5, F)),
             init("s2", np.array(0.25, F))]
    g = import_model(model(nodes, {"x": ([3], FLOAT)}, ["y"], inits))
    first, second = g.node("d1").inputs[0], g.node("d2").inputs[0]
    assert first != second
    assert g.info(first).quant.scale == (0.5,) and g.info(second).quant.scale == (0.25,)


# ---------------------------------------------------------------------------------- errors
@pytest.mark.parametrize(("scale", "text"), [
    (0.0, "scale must be > 0, got 0.0"),
    (-0.5, "scale must be > 0, got -0.5"),
    (np.nan, "scale must be a number, got nan"),
    ([0.1, 0.0, 0.2], "scale must be > 0, got 0.0"),
])
def test_invalid_scales(scale: object, text: str) -> None:
    zp = np.zeros(3, np.uint8) if np.ndim(scale) else np.uint8(0)
    with pytest.raises(MalformedModelError, match=rf"node 'q' \(QuantizeLinear\): {text}"):
        import_model(qdq_model(scale=scale, zp=zp))


def _pair_model(zp_type: int) -> onnx.ModelProto:
    zp = helper.make_tensor("zp", zp_type, [], [0])
    nodes = [helper.make_node("QuantizeLinear", ["x", "s", "zp"], ["xq"], name="q"),
             helper.make_node("DequantizeLinear", ["xq", "s", "zp"], ["y"], name="dq")]
    return model(nodes, {"x": ([2, 3], FLOAT)}, ["y"], [init("s", np.array(0.1, F)), zp],
                 opset=21)


@pytest.mark.parametrize("zp_type", [TensorProto.INT16, TensorProto.UINT16])
def test_16bit_pair_is_a_float_fake_quantize(zp_type: int) -> None:
    """No 16-bit kernels: the pair is one FakeQuantize computing (Q(x) − zp)·s in float32,
    onnxruntime's values (tests/compiler/test_wide_quantization.py covers the fusion)."""
    m = _pair_model(zp_type)
    graph = import_model(m)
    assert not islands(graph)
    assert [n.op for n in graph.topo_order()] == [Op.FAKE_QUANTIZE, Op.IDENTITY]
    x = np.array([[0.05, -0.05, 0.15], [1e6, -1e6, -0.25]], F)
    for mode in ("reference", "fused"):
        np.testing.assert_array_equal(compile_model(m, mode=mode).run({"x": x})["y"],
                                      run_ort(m, {"x": x})[0])


@pytest.mark.parametrize(("zp_type", "name"), [
    (TensorProto.INT4, "INT4"), (TensorProto.FLOAT8E4M3FN, "FLOAT8E4M3FN"),
])
def test_unsupported_quantized_types_opset21(zp_type: int, name: str) -> None:
    m = _pair_model(zp_type)
    with pytest.raises(UnsupportedModelError,  # numpy has no 4-bit / float8 type
                       match=rf"node 'q' \(QuantizeLinear\): quantized type {name} is not.*as "
                             r"a float island: .*which the IR cannot hold"):
        import_model(m)


def test_int16_output_dtype_attribute_is_read() -> None:
    m = qdq_model(zp=None, opset=21, q_attrs={"output_dtype": TensorProto.INT16})
    graph = import_model(m)
    assert not islands(graph)
    fq = next(n for n in graph.topo_order() if n.op is Op.FAKE_QUANTIZE)
    assert fq.attrs.onnx.dtype is DType.S16 and fq.attrs.levels == 65536


@pytest.mark.parametrize(("elem_type", "name"), [
    (TensorProto.INT16, "INT16"), (TensorProto.UINT16, "UINT16"), (TensorProto.INT4, "INT4"),
    (TensorProto.UINT4, "UINT4"),
])
def test_dequantize_of_other_integer_types_is_unsupported(elem_type: int, name: str) -> None:
    """Not lowered, not refused: of a run-time tensor it is an island; of a constant, as
    here, onnxruntime computes it once at import (no island), with onnxruntime's values."""
    nodes = [helper.make_node("DequantizeLinear", ["w", "s"], ["wd"], name="dqw"),
             helper.make_node("Add", ["x", "wd"], ["y"], name="add")]
    weight = helper.make_tensor("w", elem_type, [2], [1, 2])
    m = model(nodes, {"x": ([2], FLOAT)}, ["y"], [weight, init("s", np.array(0.1, F))],
              opset=21)
    assert not islands(import_model(m))
    x = np.array([0.5, -1.0], F)
    for mode in ("reference", "fused"):
        np.testing.assert_array_equal(compile_model(m, mode=mode).run({"x": x})["y"],
                                      run_ort(m, {"x": x})[0])
    if elem_type in (TensorProto.INT16, TensorProto.UINT16):  # numpy can feed these
        m = model(nodes, {"x": ([2], FLOAT), "w": ([2], elem_type)}, ["y"],
                  [init("s", np.array(0.1, F))], opset=21)
        assert_island(m, {"DequantizeLinear"}, rf"^dequantizing type {name} is not")


def test_block_size_is_unsupported() -> None:
    m = qdq_model(scale=np.full((1, 3, 4, 2), 0.1, F), zp=None, opset=21,
                  q_attrs={"block_size": 2, "axis": 3})
    assert_island(m, {"QuantizeLinear", "DequantizeLinear"}, r"^blocked ", run=False)


def test_zero_point_out_of_range_and_of_another_type() -> None:
    nodes = [helper.make_node("DequantizeLinear", ["w", "s", "zp"], ["wd"], name="dqw"),
             helper.make_node("Add", ["x", "wd"], ["y"], name="add")]
    base = [init("w", np.ones(2, np.int8)), init("s", np.array(0.1, F))]
    m = model(nodes, {"x": ([2], FLOAT)}, ["y"], [*base, init("zp", np.array(200, np.uint8))])
    with pytest.raises(MalformedModelError, match=r"'dqw' \(DequantizeLinear\): zero point 200 "
                                                  r"is outside the INT8 range \[-128, 127\]"):
        import_model(m)
    m = model(nodes, {"x": ([2], FLOAT)}, ["y"], [*base, init("zp", np.array(5, np.uint8))])
    with pytest.raises(MalformedModelError, match="zero point type UINT8 differs from the "
                                                  "quantized type INT8"):
        import_model(m)


def test_scale_computed_at_run_time_is_unsupported() -> None:
    nodes = [helper.make_node("QuantizeLinear", ["x", "s"], ["y"], name="q")]
    m = model(nodes, {"x": ([2], FLOAT), "s": ([], FLOAT)}, ["y"])
    assert_island(m, {"QuantizeLinear"}, r"^scale 's' must be a constant")


def test_per_axis_scale_count_must_match_channels() -> None:
    with pytest.raises(MalformedModelError, match=r"'q' \(QuantizeLinear\): 2 scales for 3 "
                                                  r"channels on axis 1"):
        import_model(qdq_model(scale=[0.1, 0.2], zp=np.zeros(2, np.uint8)))


# ----------------------------------------------------------------------------- FakeQuantize
def fq_model(levels: int = 256, ranges_const: bool = True, **attrs: object) -> object:
    node = helper.make_node("FakeQuantize", ["x", "il", "ih", "ol", "oh"], ["y"], name="fq",
                            domain="org.openvinotoolkit", levels=levels, **attrs)
    values = {"il": np.zeros((1, 3, 1, 1), F), "ih": np.ones((1, 3, 1, 1), F),
              "ol": np.array(0.0, F), "oh": np.array(1.0, F)}
    inputs = {"x": ([1, 3, 4, 4], FLOAT)}
    inits = [init(k, v) for k, v in values.items()]
    if not ranges_const:
        inputs["ih"] = ([1, 3, 1, 1], FLOAT)
        inits = [t for t in inits if t.name != "ih"]
    return model([node], inputs, ["y"], inits, extra_opsets={"org.openvinotoolkit": 1})


def test_fake_quantize_from_openvino_domain() -> None:
    g = import_model(fq_model(auto_broadcast="numpy"))
    (node,) = list(g)
    assert node.op is Op.FAKE_QUANTIZE and node.attrs == FakeQuantizeAttrs(256)
    assert node.inputs == ["x", "il", "ih", "ol", "oh"]
    assert g.info("y").dtype is DType.F32 and g.info("y").shape == (1, 3, 4, 4)


def test_fake_quantize_errors() -> None:
    with pytest.raises(MalformedModelError, match=r"'fq' \(FakeQuantize\): levels must be an "
                                                  r"integer >= 2, got 1"):
        import_model(fq_model(levels=1))
    with pytest.raises(UnsupportedModelError, match=r"'fq' \(FakeQuantize\): input_high 'ih' "
                                                    r"must be a constant"):
        import_model(fq_model(ranges_const=False))
    with pytest.raises(UnsupportedModelError, match="auto_broadcast 'pdpd'"):
        import_model(fq_model(auto_broadcast="pdpd"))
