"""decompose_fake_quantize's zero level: an activation whose levels start at its zero point is
written as u8 with zero point 0 — s8 with zero point -128 (onnxruntime's s8 asymmetric
activations after a ReLU), an ONNX pair after ``Clip(lo >= 0, hi)`` whose saturation cannot
bind (PyTorch FX's ReLU6 keeping its input's zero point). Bit-exact: the reference before and
after, and the compiled models against onnxruntime; the convolutions then read sources without
a zero point."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper
from quant_helpers import F32, add, apply, finish, new_graph, qdq, reference

import qfuse.passes.decompose_fake_quantize as D
import qfuse.passes.qdq_to_fake_quantize as P
from qfuse.compiler.api import compile_model
from qfuse.compiler.op_check import check_op_by_op, format_text
from qfuse.ir import DType, Op
from qfuse.ir.ops import ClipAttrs, PoolAttrs
from qfuse.runtime.numerics import step_diff
from tests.compiler.onnx_builders import init, model, run_ort


def _pair(clip: tuple[float, float] | str | None, scale: float, zp: int, dtype: DType):
    """x [→ Clip or Relu] → Q/DQ (scale, zp, dtype) → y, after qdq_to_fake_quantize."""
    g = new_graph((2, 3, 5, 5))
    src = "x"
    if clip == "relu":
        add(g, Op.RELU, ["x"], "c")
        src = "c"
    elif clip is not None:
        add(g, Op.CLIP, ["x"], "c", ClipAttrs(*clip))
        src = "c"
    qdq(g, src, "y", scale, zp, dtype)
    finish(g, "y")
    apply(P, g)
    return g


def _quantized(g) -> tuple[DType, tuple[int, ...]]:
    info = g.info(g.producer(g.outputs[0]).inputs[0])
    return info.dtype, info.quant.zero_point


@pytest.mark.parametrize("clip,scale,zp,dtype,want,clamps", [
    (None, 0.02, -128, DType.S8, (DType.U8, (0,)), 0),       # any input: q + 128
    ((0.0, 6.0), 0.0806, 63, DType.U8, (DType.U8, (0,)), 0),  # rint(6/s) = 74 <= 255 - 63
    ((0.0, 6.0), 0.05, 3, DType.S8, (DType.U8, (0,)), 0),     # 120 <= 127 - 3
    ((0.0, 6.0), 0.03, 63, DType.U8, (DType.U8, (0,)), 1),    # 200 > 192: clamped at 192·s
    ("relu", 0.05, 0, DType.S8, (DType.U8, (0,)), 1),         # s8 symmetric: at 127·s
    ("relu", 0.0806, 63, DType.U8, (DType.U8, (0,)), 1),      # clamped at 192·s
    ((0.0, 6.0), 0.05, 0, DType.S8, (DType.U8, (0,)), 0),     # 120 <= 127
    ((-1.0, 6.0), 0.0806, 63, DType.U8, (DType.U8, (63,)), 0),  # negative values
    (None, 0.0806, 63, DType.U8, (DType.U8, (63,)), 0),       # no bound known
    ("relu", 0.05, 0, DType.U8, (DType.U8, (0,)), 0),         # zero level already
])
def test_which_tensors_take_zero_point_0(clip, scale, zp, dtype, want, clamps):
    g = _pair(clip, scale, zp, dtype)
    before = g.copy()
    assert apply(D, g).changed == 1
    assert _quantized(g) == want
    assert len([n for n in g if n.op is Op.CLIP and n.name.endswith("/saturation")]) == clamps
    for seed in range(3):
        x = (np.random.default_rng(seed).standard_normal((2, 3, 5, 5)) * 8).astype(F32)
        np.testing.assert_array_equal(reference(g, {"x": x})["y"],
                                      reference(before, {"x": x})["y"])


def _depthwise_model(activation: str, zp: int, dtype: int, pool: str = ""
                     ) -> onnx.ModelProto:
    """x → Q/DQ (u8) → 1x1 conv (16 channels) → ReLU or Clip(0, 6) → Q/DQ (``zp``,
    ``dtype``) → 3x3 depthwise conv → Q/DQ; with ``pool``: → GlobalAveragePool [→ Q/DQ
    (``pool="pair"``, as quantize_static places them)] → Flatten → Q/DQ (``zp``, ``dtype``);
    ``pool="view"``: the depthwise output's Q/DQ read by a 1x1 conv and, through a Transpose
    and a Q/DQ of the same parameters (quantize_static's pairs around ShuffleNet's
    shuffles), by another: two outputs."""
    rng = np.random.default_rng(7)
    np_type = np.int8 if dtype == TensorProto.INT8 else np.uint8
    inits = [init("s", np.array(0.03, F32)), init("z", np.array(128, np.uint8)),
             init("w1", rng.integers(-127, 128, (16, 8, 1, 1)).astype(np.int8)),
             init("w1s", np.full(16, 0.01, F32)), init("w1z", np.zeros(16, np.int8)),
             init("as", np.array(0.0806, F32)), init("az", np.array(zp, np_type)),
             init("w2", rng.integers(-127, 128, (16, 1, 3, 3)).astype(np.int8)),
             init("w2s", np.full(16, 0.02, F32)), init("w2z", np.zeros(16, np.int8)),
             init("os", np.array(0.1, F32)), init("oz", np.array(zp, np_type)),
             init("lo", np.array(0.0, F32)), init("hi", np.array(6.0, F32))]

    def pair(src: str, scale: str, z: str, dst: str) -> list[onnx.NodeProto]:
        return [helper.make_node("QuantizeLinear", [src, scale, z], [f"{dst}q"]),
                helper.make_node("DequantizeLinear", [f"{dst}q", scale, z], [dst])]

    act = (helper.make_node("Relu", ["c1"], ["a"]) if activation == "relu"
           else helper.make_node("Clip", ["c1", "lo", "hi"], ["a"]))
    nodes = [*pair("x", "s", "z", "xd"),
             helper.make_node("DequantizeLinear", ["w1", "w1s", "w1z"], ["w1d"], axis=0),
             helper.make_node("Conv", ["xd", "w1d"], ["c1"]), act, *pair("a", "as", "az", "ad"),
             helper.make_node("DequantizeLinear", ["w2", "w2s", "w2z"], ["w2d"], axis=0),
             helper.make_node("Conv", ["ad", "w2d"], ["c2"], name="dw", group=16,
                              pads=[1, 1, 1, 1])]
    if pool == "view":
        inits += [init("w3", rng.integers(-127, 128, (8, 16, 1, 1)).astype(np.int8)),
                  init("w3s", np.full(8, 0.01, F32)), init("w3z", np.zeros(8, np.int8))]
        nodes += [*pair("c2", "os", "oz", "c2d"),
                  helper.make_node("Transpose", ["c2d"], ["t"], perm=[0, 1, 3, 2]),
                  *pair("t", "os", "oz", "td"),
                  helper.make_node("DequantizeLinear", ["w3", "w3s", "w3z"], ["w3d"], axis=0),
                  helper.make_node("Conv", ["td", "w3d"], ["c3"]), *pair("c3", "os", "oz", "y"),
                  helper.make_node("Conv", ["c2d", "w3d"], ["c4"]),
                  *pair("c4", "os", "oz", "y2")]
        return model(nodes, {"x": ([1, 8, 12, 12], TensorProto.FLOAT)}, ["y", "y2"], inits)
    if pool:
        nodes += pair("c2", "os", "oz", "c2d")
        nodes.append(helper.make_node("GlobalAveragePool", ["c2d"], ["p"]))
        if pool == "pair":
            nodes += pair("p", "os", "oz", "pd")
        nodes += [helper.make_node("Flatten", ["pd" if pool == "pair" else "p"], ["f"]),
                  *pair("f", "os", "oz", "y")]
    else:
        nodes += pair("c2", "os", "oz", "y")
    return model(nodes, {"x": ([1, 8, 12, 12], TensorProto.FLOAT)}, ["y"], inits)


@pytest.mark.parametrize("activation,zp,dtype", [("relu", -128, TensorProto.INT8),
                                                 ("clip", 63, TensorProto.UINT8),
                                                 ("relu", 0, TensorProto.INT8),
                                                 ("relu", 100, TensorProto.UINT8)])
def test_the_depthwise_conv_reads_u8_without_a_zero_point(activation, zp, dtype):
    m = _depthwise_model(activation, zp, dtype)
    compiled = compile_model(m)
    depthwise = [k for k in compiled.inspect()["kernels"]
                 if k["primitive"] == "convolution" and k["node"] == "dw"]
    assert len(depthwise) == 1, compiled.inspect()["kernels"]
    assert depthwise[0]["src_dtype"] == "u8", depthwise
    assert "SRC" not in depthwise[0]["zero_points_masks"], depthwise
    x = np.random.default_rng(8).standard_normal((1, 8, 12, 12)).astype(F32)
    np.testing.assert_array_equal(compiled.run({"x": x})["y"],
                                  run_ort(m, {"x": x}, optimized=False)[0])


def _requantizes(kernels: list[dict]) -> list[dict]:
    """Kernels converting between u8 and s8 (a shift of one tensor into another's type)."""
    return [k for k in kernels if k["primitive"] in ("binary", "reorder")
            and {k["src_dtype"], k["dst_dtype"]} == {"u8", "s8"}]


@pytest.mark.parametrize("pool", ["flatten", "pair", "view"])
def test_a_pooling_keeps_its_s8_tensors_and_requantizes_stay_identities(pool):
    """GlobalAveragePool's int8 form folds the zero point into its float average: the
    quantize after its Flatten is written by it (``flatten``), or requantizes its s8 output
    (``pair``), so both stay s8 and the pooling int8; a Q/DQ of the same parameters after a
    view of a u8 tensor is u8 too (``view``), so no kernel requantizes between them."""
    m = _depthwise_model("relu", -128, TensorProto.INT8, pool=pool)
    compiled = compile_model(m)
    kernels = compiled.inspect()["kernels"]
    pools = [k for k in kernels if k["primitive"] == "pooling"]
    want = [] if pool == "view" else [("s8", "s8")]
    assert [(k["src_dtype"], k["dst_dtype"]) for k in pools] == want, kernels
    assert not _requantizes(kernels), kernels
    x = np.random.default_rng(9).standard_normal((1, 8, 12, 12)).astype(F32)
    ours, theirs = compiled.run({"x": x}), run_ort(m, {"x": x}, optimized=False)
    for name, expected in zip(compiled.outputs, theirs, strict=True):
        # ``view``: 2 of 1152 outputs 1 LSB apart, float32 rounding ties of the 1x1 convs'
        # rescale (the same with the package before the zero level); else bit-exact
        assert step_diff(ours[name], expected, 0.1).max_steps <= (pool == "view"), name


def test_the_pair_after_a_max_pooling_follows_the_pair_before_it():
    """ReLU → Q/DQ (s8 symmetric) → MaxPool → Q/DQ of the same parameters (quantize_static's
    pairs around a pooling): the first takes zero point 0 after a Clip to 127·s, the second
    finds its input bounded by the first's levels (``upper_bound``) and needs no Clip — the
    two stay one encoding, so the requantize between them is an identity."""
    g = new_graph((1, 4, 6, 6))
    add(g, Op.RELU, ["x"], "r")
    qdq(g, "r", "a", 0.05, 0, DType.S8)
    add(g, Op.MAX_POOL, ["a"], "p", PoolAttrs((2, 2), (2, 2), (0, 0, 0, 0), (1, 1)))
    qdq(g, "p", "y", 0.05, 0, DType.S8)
    finish(g, "y")
    apply(P, g)
    before = g.copy()
    assert apply(D, g).changed == 2
    quantized = [g.info(n.outputs[0]) for n in g if n.op is Op.FAKE_QUANTIZE]
    assert [(i.dtype, i.quant.zero_point) for i in quantized] == [(DType.U8, (0,))] * 2
    assert len([n for n in g if n.op is Op.CLIP]) == 1
    x = (np.random.default_rng(3).standard_normal((1, 4, 6, 6)) * 10).astype(F32)
    np.testing.assert_array_equal(reference(g, {"x": x})["y"], reference(before, {"x": x})["y"])


@pytest.mark.parametrize("activation,zp,dtype", [("relu", -128, TensorProto.INT8),
                                                 ("clip", 63, TensorProto.UINT8),
                                                 ("relu", 0, TensorProto.INT8)])
def test_qfuse_check_compares_the_reencoded_tensors_in_the_models_integers(activation, zp,
                                                                           dtype):
    """``qfuse check`` feeds each kernel the reference's integers and compares its output
    with them: a re-encoded tensor is shifted by its ``Graph.level_offsets`` both ways, so
    the zero level reads as identical, not as ``zp`` steps apart."""
    m = _depthwise_model(activation, zp, dtype)
    compiled = compile_model(m)
    assert compiled.compiled_graph.level_offsets, "nothing re-encoded"
    x = np.random.default_rng(8).standard_normal((1, 8, 12, 12)).astype(F32)
    check = check_op_by_op(m, {"x": x}, compiled=compiled)
    assert check.ints and not check.skipped, format_text(check)
    assert all(r.differing == 0 for r in check.ints), format_text(check)


def test_run_all_gives_the_models_integers():
    """``CompiledModel.run_all`` (``qfuse compare``'s fused baseline) returns a re-encoded
    activation in the model's type and zero point, the plan's own with ``as_planned``."""
    m = _depthwise_model("clip", 63, TensorProto.UINT8)
    compiled = compile_model(m)
    x = np.random.default_rng(8).standard_normal((1, 8, 12, 12)).astype(F32)
    ours, planned = compiled.run_all({"x": x}), compiled.run_all({"x": x}, as_planned=True)
    exposed = onnx.ModelProto()
    exposed.CopyFrom(m)
    exposed.graph.output.append(helper.make_tensor_value_info("adq", TensorProto.UINT8,
                                                              [1, 16, 12, 12]))
    ref = run_ort(exposed, {"x": x}, optimized=False)[1]
    np.testing.assert_array_equal(ours["adq"], ref)
    np.testing.assert_array_equal(planned["adq"].astype(np.int16), ref.astype(np.int16) - 63)
