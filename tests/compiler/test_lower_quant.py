"""Quantize / dequantize / requantize lowered to oneDNN reorders with scales and zero points."""

from __future__ import annotations

import numpy as np
import pytest

from qfuse.ir import DType, Graph, Op, QuantParams, TensorInfo
from qfuse.ir.ops import DequantizeAttrs, FakeQuantizeAttrs, QuantizeAttrs
from qfuse.runtime.numerics import step_diff
from qfuse.runtime.onednn import Arg, DataType, Memory, MemoryDesc, PrimitiveAttr, reorder
from tests.compiler.lower_helpers import (add_int8_conv, int_input, random_int, ref_eval,
                                          run_plan)

F32 = np.float32
U8, S8 = DType.U8, DType.S8


def _fq_node(g: Graph, x: str, y: str, scale: float, zp: int, dtype: DType) -> None:
    lo, hi = dtype.range
    for name, value in (("il", scale * (lo - zp)), ("ih", scale * (hi - zp)), ("ol", lo),
                        ("oh", hi)):
        g.add_constant(f"{y}_{name}", np.array(value, F32))
    shape = g.info(x).shape
    g.add_node(Op.FAKE_QUANTIZE, [x] + [f"{y}_{n}" for n in ("il", "ih", "ol", "oh")], [y],
               FakeQuantizeAttrs(256), name=f"fq_{y}",
               infos=[TensorInfo(shape, dtype, QuantParams.make(scale, zp))])


def _dq_node(g: Graph, x: str, y: str, scale: object, zp: object, axis: int = 1) -> None:
    g.add_constant(f"{y}_s", np.asarray(scale, F32))
    g.add_constant(f"{y}_zp", np.asarray(zp, g.info(x).dtype.np))
    g.add_node(Op.DEQUANTIZE_LINEAR, [x, f"{y}_s", f"{y}_zp"], [y], DequantizeAttrs(axis),
               name=f"dq_{y}", infos=[TensorInfo(g.info(x).shape, DType.F32)])


@pytest.mark.parametrize("dtype,zp", [(U8, 131), (S8, -7)])
def test_quantize_only_fake_quantize(dtype: DType, zp: int) -> None:
    g = Graph("fq")
    g.add_input("x", TensorInfo((2, 8, 7, 7), DType.F32))
    _fq_node(g, "x", "q", 0.037, zp, dtype)
    g.outputs.append("q")
    x = (np.random.default_rng(0).standard_normal((2, 8, 7, 7)) * 4).astype(F32)
    out, plan = run_plan(g, {"x": x})
    assert [k.kind for k in plan.kernels] == ["reorder"]
    worst, same = step_diff(out["q"], ref_eval(g, {"x": x})["q"])
    assert worst <= 1 and same >= 0.999
    saturated = np.clip(np.rint(x * (F32(1) / F32(0.037)) + F32(zp)), *dtype.range)
    np.testing.assert_array_equal(out["q"], saturated.astype(dtype.np))


def test_reorder_rounding_model_on_ties() -> None:
    """dst = saturate(rint(x·f32(1/s) + zp)): multiply by the reciprocal, zp before rounding."""
    s = F32(0.0371)
    x = ((np.arange(-300, 300) + 0.5) * s).astype(F32)
    src = Memory.from_array(x)
    dst = Memory(MemoryDesc.from_tag(x.shape, DataType.s8))
    attr = PrimitiveAttr().set_scales_mask(Arg.DST, 0).set_zero_points_mask(Arg.DST, 0)
    prim = reorder(src.md, dst.md, attr=attr).create()
    prim.execute(prim.with_scratchpad({Arg.SRC: src, Arg.DST: dst,
                                       Arg.scales(Arg.DST): Memory.scales(s),
                                       Arg.zero_points(Arg.DST): Memory.zero_points(3)}))
    model = np.clip(np.rint((x * (F32(1) / s)).astype(F32) + F32(3)), -128, 127)
    np.testing.assert_array_equal(dst.read(), model.astype(np.int8))


def test_dequantize_is_exact() -> None:
    g = Graph("dq")
    g.add_input("q", TensorInfo((2, 8, 5, 5), U8, QuantParams.make(0.02, 100)))
    _dq_node(g, "q", "y", 0.02, 100)
    g.outputs.append("y")
    q = random_int(np.random.default_rng(1), (2, 8, 5, 5), U8)
    out, _ = run_plan(g, {"q": q})
    np.testing.assert_array_equal(out["y"], ref_eval(g, {"q": q})["y"])


def test_per_channel_dequantize() -> None:
    g = Graph("dq_pc")
    g.add_input("q", TensorInfo((2, 4, 3, 3), S8))
    _dq_node(g, "q", "y", [0.1, 0.2, 0.3, 0.4], [0, 0, 0, 0])
    g.outputs.append("y")
    q = random_int(np.random.default_rng(2), (2, 4, 3, 3), S8)
    out, plan = run_plan(g, {"q": q})
    assert plan.kernels[0].primitive is not None
    assert dict(plan.kernels[0].primitive.pd.attr.scales_masks) == {int(Arg.SRC): 2}
    np.testing.assert_array_equal(out["y"], ref_eval(g, {"q": q})["y"])


def test_requantize_pair_is_one_reorder() -> None:
    g = Graph("requant")
    g.add_input("q", TensorInfo((1, 16, 6, 6), U8, QuantParams.make(0.05, 128)))
    _dq_node(g, "q", "f", 0.05, 128)
    _fq_node(g, "f", "r", 0.0731, -4, S8)
    g.outputs.append("r")
    q = random_int(np.random.default_rng(3), (1, 16, 6, 6), U8)
    out, plan = run_plan(g, {"q": q})
    assert len(plan.kernels) == 1
    info = plan.inspect()["kernels"][0]
    assert (info["src_dtype"], info["dst_dtype"]) == ("u8", "s8")
    assert "dq_f" in info["absorbed"] and "fq_r" in info["absorbed"]
    worst, same = step_diff(out["r"], ref_eval(g, {"q": q})["r"])
    assert worst <= 1 and same >= 0.999


def _onnx_requantize(q: np.ndarray, src: tuple[float, int], dst: tuple[float, int],
                     dtype: DType) -> np.ndarray:
    """QuantizeLinear(DequantizeLinear(q)) in ONNX's float32 steps: f32(q − zp)·s, / s',
    round half to even, + zp', saturate."""
    x = (q.astype(F32) - F32(src[1])) * F32(src[0])
    return np.clip(np.rint(x / F32(dst[0])) + dst[1], *dtype.range).astype(dtype.np)


def test_dequantize_read_by_several_quantizes_is_not_a_kernel() -> None:
    """One feature map read at three other scales (DenseNet's into each later Concat): each
    quantize requantizes q itself (binary_sub, linear, binary_div, round, + zp), no f32
    dequantize kernel; bit-exact with ONNX's formulas."""
    g = Graph("requant3")
    g.add_input("q", TensorInfo((1, 16, 6, 6), U8, QuantParams.make(0.05, 128)))
    _dq_node(g, "q", "f", 0.05, 128)
    targets = {"r0": (0.0731, 120, U8), "r1": (0.041, 0, U8), "r2": (0.0307, -3, S8)}
    for name, (scale, zp, dtype) in targets.items():
        g.add_node(Op.QUANTIZE_LINEAR, ["f", g.add_constant(f"{name}_s", F32(scale)).name,
                                        g.add_constant(f"{name}_z",
                                                       np.array(zp, dtype.np)).name],
                   [name], QuantizeAttrs(dtype, 1), name=f"q_{name}",
                   infos=[TensorInfo((1, 16, 6, 6), dtype)])
        g.outputs.append(name)
    q = random_int(np.random.default_rng(3), (1, 16, 6, 6), U8)
    q.flat[:256] = np.arange(256)
    out, plan = run_plan(g, {"q": q})
    assert [k.kind for k in plan.kernels] == ["binary"] * 3, [k.name for k in plan.kernels]
    for kernel in plan.inspect()["kernels"]:
        assert kernel["src_dtype"] == "u8" and "dq_f" in kernel["absorbed"], kernel
    for name, (scale, zp, dtype) in targets.items():
        np.testing.assert_array_equal(out[name], _onnx_requantize(q, (0.05, 128), (scale, zp),
                                                                  dtype))


def test_quantize_linear_matches_onnx_within_one_step() -> None:
    g = Graph("q")
    g.add_input("x", TensorInfo((4, 100), DType.F32))
    g.add_constant("s", np.array(0.013, F32))
    g.add_constant("zp", np.array(5, np.uint8))
    g.add_node(Op.QUANTIZE_LINEAR, ["x", "s", "zp"], ["y"], QuantizeAttrs(U8, 1),
               infos=[TensorInfo((4, 100), U8)])
    g.outputs.append("y")
    x = np.random.default_rng(4).uniform(-1, 4, (4, 100)).astype(F32)
    out, _ = run_plan(g, {"x": x})
    worst, same = step_diff(out["y"], ref_eval(g, {"x": x})["y"])
    assert worst <= 1 and same >= 0.999


def test_narrow_fake_quantize_runs_in_numpy() -> None:
    """[ol, oh] = [-127, 127] narrower than s8: the reorder's saturation cannot do it."""
    g = Graph("narrow")
    g.add_input("x", TensorInfo((3, 50), DType.F32))
    for name, value in (("il", -12.7), ("ih", 12.7), ("ol", -127), ("oh", 127)):
        g.add_constant(name, np.array(value, F32))
    g.add_node(Op.FAKE_QUANTIZE, ["x", "il", "ih", "ol", "oh"], ["y"], FakeQuantizeAttrs(255),
               infos=[TensorInfo((3, 50), S8, QuantParams.make(0.1, 0))])
    g.outputs.append("y")
    x = np.random.default_rng(5).uniform(-20, 20, (3, 50)).astype(F32)
    out, plan = run_plan(g, {"x": x})
    assert plan.kernels[0].kind == "numpy"
    np.testing.assert_array_equal(out["y"], ref_eval(g, {"x": x})["y"])


@pytest.mark.parametrize("shape", [(2, 4, 6, 5), (2, 4, 1, 1)], ids=str)
@pytest.mark.parametrize("dtype", [U8, S8])
def test_per_channel_zero_points_are_binary_primitives_bit_exact(
        dtype: DType, shape: tuple[int, ...]) -> None:
    """Per-channel zero points (NNCF's MIXED preset): the quantize is binary_div → round →
    binary_add(zp[c]), the dequantize a conversion to f32 then binary_sub(zp[c]) →
    binary_mul(s[c]); all on jit kernels and bit-exact
    with the reference (ONNX's formulas) on inputs built to sit on rounding ties. Also two
    images of one pixel each, where oneDNN 3.2's jit binary mis-applies per-channel operands
    (fuzz seed 424127: 55 steps off), over an (N, C) view."""
    rng = np.random.default_rng(6)
    scales = np.array([0.02, 0.05, 0.031, 0.0117], F32)
    lo, hi = dtype.range
    zps = np.array([lo, lo + 90, (lo + hi) // 2, hi - 3])
    g = Graph("pc_zp")
    g.add_input("x", TensorInfo(shape, DType.F32))
    g.add_constant("s", scales)
    g.add_constant("zp", zps.astype(dtype.np))
    g.add_node(Op.QUANTIZE_LINEAR, ["x", "s", "zp"], ["q"], QuantizeAttrs(dtype, 1),
               infos=[TensorInfo(shape, dtype)])
    _dq_node(g, "q", "y", scales, zps)
    g.outputs += ["q", "y"]
    levels = rng.integers(-200, 200, shape) + rng.choice([0.0, 0.5, 0.25], shape)
    x = (levels * scales.reshape(1, 4, 1, 1)).astype(F32)  # many exact .5 ties
    out, plan = run_plan(g, {"x": x})
    info = plan.inspect()["kernels"]
    assert [k["primitive"] for k in info] == ["binary", "reorder", "binary"]
    assert all(k["impl"].startswith("jit") for k in info), info
    want = ref_eval(g, {"x": x})
    np.testing.assert_array_equal(out["q"], want["q"])
    np.testing.assert_array_equal(out["y"], want["y"])
    onnx_q = np.clip(np.rint(x / scales.reshape(1, 4, 1, 1)) + zps.reshape(1, 4, 1, 1), lo, hi)
    np.testing.assert_array_equal(out["q"], onnx_q.astype(dtype.np))


@pytest.mark.parametrize("dtype", [U8, S8])
def test_per_channel_dequantize_into_quantizes_is_one_binary_each(dtype: DType) -> None:
    """A per-channel dequantize with per-channel zero points (an integer Concat of inputs with
    their own parameters, passes/propagate_dequantize.py) read only by per-tensor quantizes
    (QuantizeLinear, and an ONNX-form quantize-only FakeQuantize): each is one binary
    primitive reading q — q - zp[c], ·s[c], / s', round, + zp' — jit, bit-exact with ONNX's
    formulas, no f32 dequantize kernel."""
    lo, hi = dtype.range
    scales = np.array([0.02, 0.05, 0.031, 0.0117], F32)
    zps = np.array([lo, lo + 90, (lo + hi) // 2, hi - 3])
    g = Graph("pc_requant")
    g.add_input("q", TensorInfo((1, 4, 6, 5), dtype, QuantParams.make(scales, zps, 1)))
    _dq_node(g, "q", "f", scales, zps)
    g.add_node(Op.QUANTIZE_LINEAR, ["f", g.add_constant("r_s", F32(0.043)).name,
                                    g.add_constant("r_z", np.array(7, np.uint8)).name],
               ["r"], QuantizeAttrs(U8, 1), name="q_r", infos=[TensorInfo((1, 4, 6, 5), U8)])
    g.outputs.append("r")
    q = random_int(np.random.default_rng(4), (1, 4, 6, 5), dtype)
    out, plan = run_plan(g, {"q": q})
    info = plan.inspect()["kernels"]
    assert [k["primitive"] for k in info] == ["binary"], info
    assert info[0]["impl"].startswith("jit") and "dq_f" in info[0]["absorbed"], info
    x = (q.astype(F32) - zps.reshape(1, 4, 1, 1).astype(F32)) * scales.reshape(1, 4, 1, 1)
    want = np.clip(np.rint(x / F32(0.043)) + 7, 0, 255).astype(np.uint8)
    np.testing.assert_array_equal(out["r"], want)
    np.testing.assert_array_equal(out["r"], ref_eval(g, {"q": q})["r"])


@pytest.mark.parametrize(("shape", "axis"), [((1, 3, 5, 4, 2), 4), ((1, 7, 4, 3), 2),
                                            ((2, 5, 6), 2)], ids=str)
def test_per_channel_zero_points_along_another_axis_run_on_jit(shape: tuple[int, ...],
                                                               axis: int) -> None:
    """A Concat along a last or middle axis of tensors with their own zero points (EVA-02's
    rotary stack of two halves, its class token before the patches, under NNCF's MIXED
    preset) is dequantized per channel of that axis: oneDNN 3.2 broadcasts such an operand
    only on ref:any (43 kernels, EVA-02-Tiny 129 ms). Over a row-major (before, C[, after])
    view the operand is per channel of dim 1: jit, and bit-exact with ONNX's formula."""
    channels = shape[axis]
    rng = np.random.default_rng(8)
    scales = rng.uniform(0.01, 0.05, channels).astype(F32)
    zps = rng.integers(0, 256, channels)
    g = Graph("pc_axis")
    g.add_input("q", TensorInfo(shape, U8, QuantParams.make(scales, zps, axis)))
    _dq_node(g, "q", "y", scales, zps, axis)
    g.outputs.append("y")
    q = random_int(rng, shape, U8)
    out, plan = run_plan(g, {"q": q})
    info = plan.inspect()["kernels"]
    assert all(k["impl"].startswith("jit") for k in info), info
    along = [1] * len(shape)
    along[axis] = channels
    want = (q.astype(F32) - zps.reshape(along).astype(F32)) * scales.reshape(along)
    np.testing.assert_array_equal(out["y"], want)
    np.testing.assert_array_equal(out["y"], ref_eval(g, {"q": q})["y"])


def test_quantize_read_only_by_a_dequantize_keeps_its_source_layout() -> None:
    """A Q → DQ pair after a float op writing channels-last (the linear Resize of a QDQ
    segmentation head, before the graph output): the quantize writes u8 channels-last and the
    dequantize's reorder writes the row-major f32 output from it, no u8 reorder between them;
    bit-exact."""
    from qfuse.ir.ops import ResizeAttrs, ResizeMode

    shape, out = (1, 5, 6, 7), (1, 5, 12, 14)
    g = Graph("q_dq_after_resize")
    g.add_input("x", TensorInfo(shape, DType.F32))
    g.add_node(Op.RESIZE, ["x"], ["r"],
               ResizeAttrs(ResizeMode.LINEAR, out, (1.0, 1.0, 2.0, 2.0), "half_pixel"),
               infos=[TensorInfo(out, DType.F32)])
    g.add_node(Op.QUANTIZE_LINEAR, ["r", g.add_constant("q_s", F32(0.0257)).name,
                                    g.add_constant("q_z", np.array(118, np.uint8)).name],
               ["q"], QuantizeAttrs(U8, 1), name="q_q", infos=[TensorInfo(out, U8)])
    _dq_node(g, "q", "y", 0.0257, 118)
    g.outputs.append("y")
    x = np.random.default_rng(8).standard_normal(shape).astype(F32)
    got, plan = run_plan(g, {"x": x})
    np.testing.assert_array_equal(got["y"], ref_eval(g, {"x": x})["y"])
    kernels = {k["node"]: k for k in plan.inspect()["kernels"]}
    # the quantize writes q's channels-last bytes as one dim (5 channels: short rows)
    assert kernels["q_q"]["dst_layouts"] == ["u8 (840,) strides=(1,)"], kernels["q_q"]
    assert kernels["dq_y"]["src_layouts"] == ["u8 (1, 5, 12, 14) strides=(840, 1, 70, 5)"]
    assert kernels["dq_y"]["dst_layouts"] == ["f32 (1, 5, 12, 14) strides=(840, 168, 14, 1)"]
    assert not any(k["primitive"] == "reorder" and k["src_dtype"] == k["dst_dtype"] == "u8"
                   for k in kernels.values()), kernels


@pytest.mark.parametrize(("channels", "flat"), [(8, True), (24, True), (16, True), (1, False)])
def test_requantize_of_channels_last_runs_over_one_dim(channels: int, flat: bool) -> None:
    """A per-tensor requantize of a channels-last tensor (a Concat input GhostNet's ghost
    modules requantize) runs over its bytes as one dim: oneDNN 3.2's jit binary walks each
    pixel's channels in vector-length pieces, 8x slower on 8 channels. Bit-exact with ONNX's
    formulas; the output keeps the conv's channels-last layout. One channel is row-major
    already: nothing to merge."""
    g = Graph("requant_cl")
    x = int_input(g, "x", (1, 16, 12, 10), U8, 0.05, 128)
    conv = add_int8_conv(g, x, channels, out_scale=0.05, out_zp=128)
    q = conv.outputs[0]
    _dq_node(g, q, "f", 0.05, 128)
    g.add_node(Op.QUANTIZE_LINEAR, ["f", g.add_constant("r_s", F32(0.0731)).name,
                                    g.add_constant("r_z", np.array(3, np.uint8)).name],
               ["r"], QuantizeAttrs(U8, 1), name="q_r",
               infos=[TensorInfo(g.info(q).shape, U8)])
    g.outputs += [q, "r"]
    feeds = {"x": random_int(np.random.default_rng(5), (1, 16, 12, 10), U8)}
    got, plan = run_plan(g, feeds)
    kernels = {k["node"]: k for k in plan.inspect()["kernels"]}
    requant = kernels["q_r"]
    assert requant["src_dtype"] == "u8" and requant["impl"] == "jit:uni", requant
    assert ("memory_order" in requant["optimizations"]) == flat, requant
    size = 12 * 10 * channels
    if flat:
        assert requant["src_layouts"] == [f"u8 ({size},) strides=(1,)"], requant
    layout = kernels["conv"]["dst_layouts"][0]
    assert channels == 1 or f"strides=({size}, 1, {10 * channels}, {channels})" in layout
    np.testing.assert_array_equal(got["r"], _onnx_requantize(got[q], (0.05, 128), (0.0731, 3),
                                                              U8))
