"""Float ops, normalizations and data movement vs the reference interpreter.

Tolerances: exact ops (relu, clip, add, mul, data movement, max) bit-exact; transcendental
eltwise / softmax / layer norm / float conv within 1e-5 relative (oneDNN's polynomial
approximations and f32 accumulation vs the reference's float64)."""

from __future__ import annotations

import numpy as np
import pytest

from qfuse.ir import DType, Graph, Op, TensorInfo
from qfuse.ir.ops import (
    AlphaAttrs,
    AxesAttrs,
    AxisAttrs,
    BatchNormAttrs,
    CastAttrs,
    ClipAttrs,
    ConvAttrs,
    GeluApprox,
    GeluAttrs,
    GemmAttrs,
    HardSigmoidAttrs,
    HardSwishAttrs,
    LayerNormAttrs,
    NoAttrs,
    PadAttrs,
    PadMode,
    ReshapeAttrs,
    ResizeAttrs,
    ResizeMode,
    SliceAttrs,
    SplitAttrs,
    TransposeAttrs,
)
from tests.compiler.lower_helpers import int_input, random_int, ref_eval, run_plan

F32 = np.float32
RNG = np.random.default_rng(0)


def _graph(shapes: dict[str, tuple[int, ...]], dtype: DType = DType.F32) -> Graph:
    g = Graph("misc")
    for name, shape in shapes.items():
        g.add_input(name, TensorInfo(shape, dtype))
    return g


def _feeds(g: Graph) -> dict[str, np.ndarray]:
    feeds = {}
    for name in g.inputs:
        info = g.info(name)
        if info.dtype == DType.F32:
            feeds[name] = RNG.standard_normal(info.shape).astype(F32) * 3
        else:
            feeds[name] = random_int(RNG, info.shape, info.dtype)
    return feeds


def _check(g: Graph, rtol: float = 0.0, numpy_kernels: int = 0) -> None:
    feeds = _feeds(g)
    out, plan = run_plan(g, feeds)
    ref = ref_eval(g, feeds)
    for name in g.outputs:
        if rtol:
            np.testing.assert_allclose(out[name], ref[name], rtol=rtol, atol=rtol)
        else:
            np.testing.assert_array_equal(out[name], ref[name])
    assert sum(k.kind == "numpy" for k in plan.kernels) == numpy_kernels
    assert plan.inspect()["numpy_kernels"] == numpy_kernels


ELTWISE = {
    "relu": (Op.RELU, NoAttrs(), 0.0),
    "leaky": (Op.LEAKY_RELU, AlphaAttrs(0.1), 0.0),
    "clip": (Op.CLIP, ClipAttrs(-1.0, 2.0), 0.0),
    "clip_open": (Op.CLIP, ClipAttrs(0.0), 0.0),
    "sigmoid": (Op.SIGMOID, NoAttrs(), 1e-5),
    "tanh": (Op.TANH, NoAttrs(), 1e-5),
    "hardswish": (Op.HARD_SWISH, HardSwishAttrs(), 1e-5),
    "hardsigmoid": (Op.HARD_SIGMOID, HardSigmoidAttrs(0.2, 0.5), 1e-5),
    "gelu_erf": (Op.GELU, GeluAttrs(), 1e-5),
    "gelu_tanh": (Op.GELU, GeluAttrs(GeluApprox.TANH), 1e-5),
}


@pytest.mark.parametrize("name", list(ELTWISE))
def test_eltwise(name: str) -> None:
    op, attrs, rtol = ELTWISE[name]
    g = _graph({"x": (2, 8, 5, 5)})
    g.add_node(op, ["x"], ["y"], attrs, infos=[TensorInfo((2, 8, 5, 5), DType.F32)])
    g.outputs.append("y")
    _check(g, rtol)


@pytest.mark.parametrize("op", [Op.ADD, Op.SUB, Op.MUL, Op.DIV])
@pytest.mark.parametrize("b_shape,const", [((2, 8, 5, 5), False), ((1, 8, 1, 1), True),
                                           ((5,), False), ((8, 1, 1), True)])
def test_binary_broadcast(op: Op, b_shape: tuple[int, ...], const: bool) -> None:
    g = _graph({"a": (2, 8, 5, 5)} | ({} if const else {"b": b_shape}))
    if const:
        g.add_constant("b", RNG.uniform(0.5, 2.0, b_shape).astype(F32))
    g.add_node(op, ["a", "b"], ["y"], NoAttrs(), infos=[TensorInfo((2, 8, 5, 5), DType.F32)])
    g.outputs.append("y")
    _check(g, 1e-6 if op is Op.DIV else 0.0)


@pytest.mark.parametrize("op", [Op.ADD, Op.MUL])
def test_binary_with_a_constant_broadcast_in_the_middle_runs_on_jit(op: Op) -> None:
    """Swin's shifted-window mask [1, 6, 1, 7, 7] added to [1, 6, 3, 7, 7]: oneDNN 3.2 has
    that broadcast on ref:any only, so the constant is stored expanded; bit-exact."""
    shape = (1, 6, 3, 7, 7)
    g = _graph({"a": shape})
    g.add_constant("b", RNG.uniform(-2.0, 2.0, (1, 6, 1, 7, 7)).astype(F32))
    g.add_node(op, ["a", "b"], ["y"], NoAttrs(), infos=[TensorInfo(shape, DType.F32)])
    g.outputs.append("y")
    _check(g)
    _, plan = run_plan(g, _feeds(g))
    assert [k.impl for k in plan.kernels if k.kind == "binary"][0].startswith("jit"), \
        [k.impl for k in plan.kernels]


@pytest.mark.parametrize("op", [Op.ADD, Op.SUB, Op.MUL, Op.DIV])
@pytest.mark.parametrize(("shape", "b_shape"), [
    ((4, 3, 16, 8), (4, 3, 16, 1)),  # F.normalize's denominator over the last axis
    ((2, 5, 7, 9), (2, 5, 1, 9)),
    ((2, 5, 7, 9), (1, 5, 7, 1)),
    ((3, 1, 4, 5), (3, 1, 1, 1)),
], ids=str)
def test_binary_with_a_run_time_broadcast_oneDNN_has_on_ref_only_runs_merged(
        op: Op, shape: tuple[int, ...], b_shape: tuple[int, ...]) -> None:
    """oneDNN 3.2 runs these broadcasts of a run-time operand on ref:any; seen with their
    neighbouring dims merged ([4, 3, 16, 8] / [4, 3, 16, 1] as [192, 8] / [192, 1]) they
    run on jit: bit-exact against the reference, every kernel jit."""
    from qfuse.compiler.lower.lower_binary import collapsed_dims

    assert collapsed_dims(shape, b_shape) is not None
    g = _graph({"a": shape, "b": b_shape})
    g.add_node(op, ["a", "b"], ["y"], NoAttrs(), infos=[TensorInfo(shape, DType.F32)])
    g.outputs.append("y")
    _check(g)
    _, plan = run_plan(g, _feeds(g))
    impls = [k.impl for k in plan.kernels]
    assert not any(i.startswith("ref") for i in impls), impls


def test_collapsed_dims() -> None:
    from qfuse.compiler.lower.lower_binary import collapsed_dims

    assert collapsed_dims((64, 3, 64, 32), (64, 3, 64, 1)) == ((12288, 32), (12288, 1))
    assert collapsed_dims((2, 5, 7, 9), (1, 5, 7, 1)) == ((2, 35, 9), (1, 35, 1))
    assert collapsed_dims((3, 1, 4, 5), (3, 1, 1, 1)) == ((3, 20), (3, 1))
    assert collapsed_dims((8, 6), (1, 1)) == ((1, 48), (1, 1))
    assert collapsed_dims((2, 3, 4), (2, 1, 4)) is None  # nothing merges


def test_binary_with_broadcast_first_operand() -> None:
    g = _graph({"a": (2, 8, 5, 5), "b": (1, 8, 1, 1)})
    g.add_node(Op.ADD, ["b", "a"], ["y"], NoAttrs(), infos=[TensorInfo((2, 8, 5, 5), DType.F32)])
    g.add_node(Op.SUB, ["b", "y"], ["z"], NoAttrs(), infos=[TensorInfo((2, 8, 5, 5), DType.F32)])
    g.outputs.append("z")
    _check(g, 0.0, numpy_kernels=1)  # Add swaps its operands; Sub cannot: numpy


@pytest.mark.parametrize("axis", [1, 2])
def test_softmax(axis: int) -> None:
    g = _graph({"x": (2, 6, 10)})
    g.add_node(Op.SOFTMAX, ["x"], ["y"], AxisAttrs(axis), infos=[TensorInfo((2, 6, 10),
                                                                           DType.F32)])
    g.outputs.append("y")
    _check(g, 1e-5)


@pytest.mark.parametrize("axis", [2, 1])
def test_layer_norm(axis: int) -> None:
    g = _graph({"x": (2, 6, 16)})
    n = 16 if axis == 2 else 96
    g.add_constant("scale", RNG.uniform(0.5, 1.5, (6, 16)[axis - 1:]).astype(F32).reshape(-1)
                   .reshape((6, 16)[axis - 1:]) if n else None)
    g.add_constant("bias", RNG.standard_normal((6, 16)[axis - 1:]).astype(F32))
    g.add_node(Op.LAYER_NORM, ["x", "scale", "bias"], ["y"], LayerNormAttrs(axis, 1e-5),
               infos=[TensorInfo((2, 6, 16), DType.F32)])
    g.outputs.append("y")
    _check(g, 1e-4)


def test_batch_norm_and_float_conv_relu() -> None:
    g = _graph({"x": (1, 3, 12, 12)})
    g.add_constant("w", RNG.standard_normal((8, 3, 3, 3)).astype(F32))
    g.add_constant("b", RNG.standard_normal(8).astype(F32))
    g.add_node(Op.CONV, ["x", "w", "b"], ["c"], ConvAttrs((3, 3), (1, 1), (1, 1, 1, 1), (1, 1)),
               infos=[TensorInfo((1, 8, 12, 12), DType.F32)])
    for i, name in enumerate(("gamma", "beta", "mean", "var")):
        g.add_constant(name, RNG.uniform(0.5, 1.5, 8).astype(F32) + i)
    g.add_node(Op.BATCH_NORM, ["c", "gamma", "beta", "mean", "var"], ["n"], BatchNormAttrs(),
               infos=[TensorInfo((1, 8, 12, 12), DType.F32)])
    g.add_node(Op.RELU, ["n"], ["y"], NoAttrs(), infos=[TensorInfo((1, 8, 12, 12), DType.F32)])
    g.outputs.append("y")
    _check(g, 1e-5)


@pytest.mark.parametrize("shape", [(2, 8, 1, 1), (1, 8, 1, 1), (3, 8, 1)])
def test_batch_norm_on_single_pixels(shape: tuple[int, ...]) -> None:
    """A batch of 1x1 images (BN after a global pool): oneDNN's binary post-op pitfall."""
    g = _graph({"x": shape})
    for i, name in enumerate(("gamma", "beta", "mean", "var")):
        g.add_constant(name, RNG.uniform(0.5, 1.5, 8).astype(F32) + i)
    g.add_node(Op.BATCH_NORM, ["x", "gamma", "beta", "mean", "var"], ["y"], BatchNormAttrs(),
               infos=[TensorInfo(shape, DType.F32)])
    g.outputs.append("y")
    _check(g, 1e-5)


@pytest.mark.parametrize("dtype", [DType.F32, DType.U8])
def test_concat_in_mixed_layouts(dtype: DType) -> None:
    """One input straight from the graph (plain), one from a transpose (plain) — and int8."""
    g = _graph({"a": (1, 4, 6, 6), "b": (1, 6, 6, 4)}, dtype)
    g.add_node(Op.TRANSPOSE, ["b"], ["bt"], TransposeAttrs((0, 3, 1, 2)),
               infos=[TensorInfo((1, 4, 6, 6), dtype)])
    g.add_node(Op.CONCAT, ["a", "bt"], ["y"], AxisAttrs(1), infos=[TensorInfo((1, 8, 6, 6),
                                                                              dtype)])
    g.outputs.append("y")
    _check(g)


def test_data_movement_chain() -> None:
    """Reshape (view), Transpose (reorder), Flatten, Squeeze / Unsqueeze, Split, Slice."""
    g = _graph({"x": (2, 12, 4, 4)}, DType.S8)
    f = DType.S8
    g.add_node(Op.RESHAPE, ["x"], ["r"], ReshapeAttrs((2, 3, 4, 4, 4)),
               infos=[TensorInfo((2, 3, 4, 4, 4), f)])
    g.add_node(Op.TRANSPOSE, ["r"], ["t"], TransposeAttrs((0, 2, 1, 3, 4)),
               infos=[TensorInfo((2, 4, 3, 4, 4), f)])
    g.add_node(Op.RESHAPE, ["t"], ["s"], ReshapeAttrs((2, 12, 4, 4)),
               infos=[TensorInfo((2, 12, 4, 4), f)])
    g.add_node(Op.SPLIT, ["s"], ["p0", "p1"], SplitAttrs(1, (5, 7)),
               infos=[TensorInfo((2, 5, 4, 4), f), TensorInfo((2, 7, 4, 4), f)])
    g.add_node(Op.SLICE, ["p1"], ["sl"], SliceAttrs((1, 0), (7, 4), (1, 3), (2, 2)),
               infos=[TensorInfo((2, 3, 4, 2), f)])
    g.add_node(Op.UNSQUEEZE, ["sl"], ["u"], AxesAttrs((0,)), infos=[TensorInfo((1, 2, 3, 4, 2),
                                                                             f)])
    g.add_node(Op.SQUEEZE, ["u"], ["q"], AxesAttrs((0,)), infos=[TensorInfo((2, 3, 4, 2), f)])
    g.add_node(Op.FLATTEN, ["p0"], ["fl"], AxisAttrs(1), infos=[TensorInfo((2, 80), f)])
    g.outputs.extend(["q", "fl"])
    _check(g)


def test_numpy_fallbacks() -> None:
    g = _graph({"x": (1, 3, 4, 4)})
    # a reflection as long as its axis (numpy.pad reflects it again)
    g.add_node(Op.PAD, ["x"], ["p"], PadAttrs((0, 0, 1, 4, 0, 0, 1, 0), PadMode.REFLECT),
               infos=[TensorInfo((1, 3, 6, 8), DType.F32)])
    # asymmetric/ceil: oneDNN's nearest reads other indices (lower_resize.py), so numpy
    g.add_node(Op.RESIZE, ["p"], ["r"], ResizeAttrs(ResizeMode.NEAREST, (1, 3, 12, 16),
                                                    (1.0, 1.0, 2.0, 2.0), "asymmetric", "ceil"),
               infos=[TensorInfo((1, 3, 12, 16), DType.F32)])
    g.add_node(Op.CAST, ["r"], ["c"], CastAttrs(DType.S32), infos=[TensorInfo((1, 3, 12, 16),
                                                                             DType.S32)])
    g.outputs.append("c")
    _check(g, numpy_kernels=3)
    feeds = _feeds(g)
    _, plan = run_plan(g, feeds)
    assert {k["impl"] for k in plan.inspect()["kernels"]} == {"numpy"}


@pytest.mark.parametrize(("dtype", "value"), [(DType.F32, 0.0), (DType.F32, -1.5),
                                               (DType.U8, 128.0), (DType.S8, -3.0)])
@pytest.mark.parametrize("pads", [(0, 0, 1, 2, 0, 0, 1, 0), (0, 1, 0, 0, 0, 2, 1, 1),
                                  (1, 0, 0, 3, 0, 0, 2, 0)], ids=str)
def test_constant_pad_is_reorders_bit_exact(dtype: DType, value: float,
                                            pads: tuple[int, ...]) -> None:
    """A constant Pad: reorders into the output's interior and borders, no numpy kernel;
    every output byte written (the buffers start filled with garbage)."""
    g = _pad_graph(pads, PadMode.CONSTANT, dtype, value)
    _check(g)
    feeds = _feeds(g)
    np.testing.assert_array_equal(_pad_on_garbage(g, feeds), ref_eval(g, feeds)["p"])


def _pad_graph(pads: tuple[int, ...], mode: PadMode, dtype: DType, value: float = 0.0
               ) -> Graph:
    """x [1, 3, 4, 5] → Pad → p."""
    shape = (1, 3, 4, 5)
    out = tuple(d + pads[i] + pads[4 + i] for i, d in enumerate(shape))
    g = _graph({"x": shape}, dtype)
    g.add_node(Op.PAD, ["x"], ["p"], PadAttrs(pads, mode, value), infos=[TensorInfo(out, dtype)])
    g.outputs.append("p")
    return g


def _pad_on_garbage(g: Graph, feeds: dict[str, np.ndarray]) -> np.ndarray:
    """The Pad's output, its plan all reorders, run over buffers filled with garbage first."""
    from qfuse.runtime.execution import ExecutionContext

    _, plan = run_plan(g, feeds)
    assert {k.kind for k in plan.kernels} == {"reorder"}
    context = ExecutionContext(plan, fill=0x7F)
    for name, view in context.inputs:
        view[...] = feeds[name]
    context.run()
    return dict(context.outputs)["p"]


@pytest.mark.parametrize("mode", [PadMode.REFLECT, PadMode.EDGE])
@pytest.mark.parametrize("dtype", [DType.F32, DType.U8])
@pytest.mark.parametrize("pads", [(0, 0, 1, 1, 0, 0, 1, 1), (0, 2, 0, 3, 0, 1, 3, 0),
                                  (0, 0, 2, 0, 0, 0, 0, 4)], ids=str)
def test_reflect_and_edge_pads_are_reorders_bit_exact(mode: PadMode, dtype: DType,
                                                      pads: tuple[int, ...]) -> None:
    """Reflect and edge Pads: the interior, then each axis's borders copied from the slices
    they mirror (edge: from a view striding 0 over the border), corners included, no numpy
    kernel; every output byte written (the buffers start filled with garbage)."""
    g = _pad_graph(pads, mode, dtype)
    feeds = _feeds(g)
    width = [(pads[i], pads[4 + i]) for i in range(4)]
    want = np.pad(feeds["x"], width, mode="reflect" if mode is PadMode.REFLECT else "edge")
    np.testing.assert_array_equal(_pad_on_garbage(g, feeds), want)
    np.testing.assert_array_equal(want, ref_eval(g, feeds)["p"])


def test_a_long_reflection_runs_in_numpy() -> None:
    """silero-vad's STFT reflects 32 samples on each side of its 512-sample chunk: 64 one-sample
    reorders (~100 us) → one numpy kernel (MAX_REFLECT_ROWS), the same values."""
    g = _graph({"x": (1, 512)})
    g.add_node(Op.PAD, ["x"], ["p"], PadAttrs((0, 32, 0, 32), PadMode.REFLECT, 0.0),
               infos=[TensorInfo((1, 576), DType.F32)])
    g.outputs.append("p")
    feeds = _feeds(g)
    got, plan = run_plan(g, feeds)
    assert [k.kind for k in plan.kernels] == ["numpy"], [k.kind for k in plan.kernels]
    np.testing.assert_array_equal(got["p"], np.pad(feeds["x"], [(0, 0), (32, 32)], "reflect"))


def test_a_pad_read_by_a_convolution_is_written_in_its_layout() -> None:
    """TResNet's anti-aliasing: a reflect Pad between two convolutions ran in numpy, with a
    reorder to row-major before it and one back after it; now its reorders read the
    producer's channels-last output and write the convolution's channels-last input."""
    g = _graph({"x": (1, 8, 10, 10)})
    g.add_constant("w", (RNG.standard_normal((8, 8, 3, 3)) * 0.1).astype(F32))
    g.add_node(Op.CONV, ["x", "w"], ["c"], ConvAttrs((3, 3), (1, 1), (1, 1, 1, 1), (1, 1)),
               infos=[TensorInfo((1, 8, 10, 10), DType.F32)])
    g.add_node(Op.PAD, ["c"], ["p"], PadAttrs((0, 0, 1, 1, 0, 0, 1, 1), PadMode.REFLECT, 0.0),
               infos=[TensorInfo((1, 8, 12, 12), DType.F32)])
    g.add_node(Op.CONV, ["p", "w"], ["y"], ConvAttrs((3, 3), (1, 1), (0, 0, 0, 0), (1, 1)),
               infos=[TensorInfo((1, 8, 10, 10), DType.F32)])
    g.outputs.append("y")
    _check(g, 1e-4)  # float32 convolutions, their sums in oneDNN's order
    _, plan = run_plan(g, _feeds(g))
    assert [k.kind for k in plan.kernels if k.info.op == "Pad"] == ["reorder"] * 5
    assert not [k.name for k in plan.kernels if k.info.role == "reorder"]  # no layout change


def test_gemm_and_float_matmul() -> None:
    g = _graph({"x": (4, 32), "y": (3, 4, 8)})
    g.add_constant("w", RNG.standard_normal((16, 32)).astype(F32))
    g.add_constant("c", RNG.standard_normal(16).astype(F32))
    g.add_node(Op.GEMM, ["x", "w", "c"], ["g"], GemmAttrs(0.5, 2.0, False, True),
               infos=[TensorInfo((4, 16), DType.F32)])
    g.add_constant("m", RNG.standard_normal((8, 5)).astype(F32))
    g.add_node(Op.MATMUL, ["y", "m"], ["mm"], NoAttrs(), infos=[TensorInfo((3, 4, 5),
                                                                          DType.F32)])
    g.outputs.extend(["g", "mm"])
    _check(g, 1e-5)


def test_identity_of_an_int8_input() -> None:
    g = Graph("id")
    int_input(g, "x", (2, 3), DType.U8)
    g.add_node(Op.IDENTITY, ["x"], ["y"], NoAttrs(), infos=[g.info("x")])
    g.outputs.append("y")
    _check(g)


def test_a_transpose_back_to_nchw_stays_a_view_for_a_channels_last_residual() -> None:
    """ConvNeXt's block: an int8 convolution's output (channels-last) → Transpose to NHWC →
    per-channel Mul → Transpose back to NCHW → Add with the convolution's output. The Add
    asks for its other input's layout (probe_binary), so the Transpose back is a view of
    its NHWC source: no permute kernel and no reorder of the residual; bit-identical to the
    reference."""
    import onnx
    from onnx import TensorProto, helper

    from qfuse.compiler.api import compile_model
    from tests.compiler.onnx_builders import init, model, qdq_pair

    rng = np.random.default_rng(4)
    c = 16
    inits = [init("w", rng.integers(-60, 61, (c, c, 3, 3)).astype(np.int8)),
             init("ws", rng.uniform(0.002, 0.004, c).astype(F32)),
             init("wz", np.zeros(c, np.int8)),
             init("xs", F32(0.03)), init("xz", np.uint8(120)),
             init("as", F32(0.05)), init("az", np.uint8(128)),
             init("g", rng.uniform(0.5, 1.5, c).astype(F32))]
    nodes = [*qdq_pair("x", "x", "xd"),
             helper.make_node("DequantizeLinear", ["w", "ws", "wz"], ["wd"], axis=0),
             helper.make_node("Conv", ["xd", "wd"], ["conv"], pads=[1, 1, 1, 1]),
             *qdq_pair("a", "conv", "ad"),
             helper.make_node("Transpose", ["ad"], ["nhwc"], perm=[0, 2, 3, 1]),
             helper.make_node("Mul", ["nhwc", "g"], ["scaled"]),
             helper.make_node("Transpose", ["scaled"], ["nchw"], perm=[0, 3, 1, 2]),
             helper.make_node("Add", ["nchw", "ad"], ["y"])]
    m: onnx.ModelProto = model(nodes, {"x": ([1, c, 10, 10], TensorProto.FLOAT)}, ["y"], inits)
    fused = compile_model(m)
    kernels = fused.inspect()["kernels"]
    assert not any(k["op"] == "Transpose" for k in kernels), kernels
    assert not any(k["name"].startswith("reorder:") and "nchw" in k["name"] for k in kernels)
    reference = compile_model(m, mode="reference")
    for seed in range(3):
        feeds = {"x": np.random.default_rng(seed).normal(0, 1, (1, c, 10, 10)).astype(F32)}
        np.testing.assert_array_equal(fused.run(feeds)["y"], reference.run(feeds)["y"])


def test_a_source_equal_but_for_size_one_strides_is_a_view_with_the_strides_asked_for() -> None:
    """oneDNN calls a 1x1 image in acdb strides equal to the abcd one, but its AVX-512 jit
    binary compares the strides themselves (acdb src, abcd dst: ref:any; PP-LCNet QDQ's
    HardSigmoid gate after its 1x1 classifier conv). ``LowerContext.source`` gives a zero-copy
    view with the strides asked for, and no reorder."""
    from qfuse.compiler.lower.context import LowerContext
    from qfuse.compiler.lower.layouts import plain_md
    from qfuse.runtime.onednn import DataType, MemoryDesc

    g = Graph("strides")
    g.add_input("x", TensorInfo((1, 64, 1, 1), DType.F32))
    ctx = LowerContext(g)
    acdb = MemoryDesc.from_strides((1, 64, 1, 1), DataType.f32, (64, 1, 64, 64))
    home = ctx.define("x", acdb)
    plain = plain_md((1, 64, 1, 1), DataType.f32)
    assert acdb == plain and acdb.strides != plain.strides  # oneDNN's equality
    view = ctx.source("x", plain)
    assert view != home and ctx.slots[view].alias == home
    assert ctx.slots[view].md.strides == plain.strides and not ctx.kernels
    assert ctx.source("x", plain) == view and ctx.source("x", acdb) == home


def test_a_contiguous_slice_is_a_view_and_reads_right_downstream() -> None:
    """YOLOv8's box decoding: an int8 (1, 4, N) tensor split into rows 0:2 and 2:4 (one
    contiguous run each), each dequantized and subtracted from / added to constant anchors.
    The Slices are views of the tensor (no kernel); bit-exact. The views are described with
    dense strides: the source's stride of its size-1 dim reached the dequantize's output and
    the Sub's oneDNN binary then computed row 1 wrong (YOLOv8n's outputs at cosine 0.96, while
    this model's own kernels were right: the descriptor is what differed)."""
    from qfuse.ir import QuantParams
    from qfuse.ir.ops import DequantizeAttrs

    n = 2100
    g = Graph("box_decode")
    g.add_input("q", TensorInfo((1, 4, n), DType.U8, QuantParams.make(0.05, 0)))
    g.add_node(Op.RELU, ["q"], ["r"], infos=[TensorInfo((1, 4, n), DType.U8)])
    anchors = g.add_constant("anchors", RNG.standard_normal((1, 2, n)).astype(F32) * 40).name
    g.add_constant("s", np.array(0.05, F32))
    g.add_constant("z", np.array(0, np.uint8))
    for i, (op, out) in enumerate(((Op.SUB, "lt"), (Op.ADD, "rb"))):
        g.add_node(Op.SLICE, ["r"], [f"part{i}"], SliceAttrs((2 * i,), (2 * i + 2,), (1,), (1,)),
                   name=f"slice{i}", infos=[TensorInfo((1, 2, n), DType.U8)])
        g.add_node(Op.DEQUANTIZE_LINEAR, [f"part{i}", "s", "z"], [f"d{i}"], DequantizeAttrs(1),
                   infos=[TensorInfo((1, 2, n), DType.F32)])
        g.add_node(op, [anchors, f"d{i}"], [out], infos=[TensorInfo((1, 2, n), DType.F32)])
        g.outputs.append(out)
    feeds = {"q": random_int(RNG, (1, 4, n), DType.U8)}
    out, plan = run_plan(g, feeds)
    ref = ref_eval(g, feeds)
    for name in g.outputs:
        np.testing.assert_array_equal(out[name], ref[name])
    assert not [k for k in plan.kernels if k.info.node in ("slice0", "slice1")]
