"""int8 Conv / ConvTranspose / MatMul with fused chains: the plan vs oneDNN's model (0 LSB) and
vs the graph's meaning (≤ 1 LSB, ≥ 99.9 % identical); layouts, in-place sums, impl names."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from qfuse.compiler.lower import lower_compute
from qfuse.ir import DType, Graph, Op, TensorInfo
from qfuse.ir.chain import Act, Activation, PRelu, Residual, Scale, Shift
from qfuse.ir.ops import ConvTransposeAttrs
from qfuse.ir.types import OnnxQuantize, QuantParams
from qfuse.runtime.executor import Executor
from qfuse.runtime.numerics import step_diff
from qfuse.runtime.onednn import effective_cpu_isa
from qfuse.runtime.reference.fused import evaluate_fused
from tests.compiler.lower_helpers import (
    MATMUL_CASES,
    SPLITS_INT8,
    add_int8_conv,
    exact_expected,
    int_input,
    matmul_graph,
    quantize_item,
    random_int,
    ref_eval,
    requires_exact_int8,
    run_plan,
)

F32 = np.float32
U8, S8 = DType.U8, DType.S8

CONV_CASES = {
    "1x1": {"c": 32, "o": 64, "kernel": 1, "pads": (0, 0, 0, 0)},
    "3x3_pad": {"c": 16, "o": 32},
    "3x3_stride2": {"c": 16, "o": 32, "stride": 2},
    "dilated_asym_pad": {"c": 16, "o": 16, "dilation": 2, "pads": (2, 1, 1, 2)},
    "grouped": {"c": 16, "o": 32, "group": 4},
    "depthwise_s8": {"c": 32, "o": 32, "group": 32, "dst": S8, "out_zp": -3},
    "f32_dst": {"c": 16, "o": 16, "dst": DType.F32},
    "deconv_stride2_outpad": {"c": 16, "o": 16, "stride": 2, "deconv": True, "output_padding": 1},
    "deconv_grouped_k4": {"c": 16, "o": 32, "kernel": 4, "stride": 2, "group": 2, "deconv": True},
}


def _conv_graph(case: dict, zp: int = 7, seed: int = 0) -> tuple[Graph, dict[str, np.ndarray]]:
    case = dict(case)
    c = case.pop("c")
    g = Graph("conv")
    x = int_input(g, "x", (2, c, 9, 9), U8, 0.03, zp)
    node = add_int8_conv(g, x, case.pop("o"), seed=seed, **case)
    g.outputs.append(node.outputs[0])
    rng = np.random.default_rng(seed + 1)
    return g, {"x": random_int(rng, (2, c, 9, 9), U8)}


def _check(graph: Graph, feeds: dict[str, np.ndarray], node_name: str) -> None:
    out, plan = run_plan(graph, feeds)
    node = graph.node(node_name)
    values = Executor(plan).run_all(feeds)  # the node's inputs as the plan computed them
    inputs = [values.get(v, graph.constant(v)) for v in node.inputs]
    expected = exact_expected(graph, node, inputs)
    got = out[graph.outputs[0]]
    reference = evaluate_fused(node, inputs, graph)[0]  # the chain item by item
    if got.dtype == F32:
        np.testing.assert_allclose(got, expected, rtol=1e-6, atol=1e-6)
        np.testing.assert_allclose(got, reference, rtol=1e-5, atol=1e-5)
    else:
        np.testing.assert_array_equal(got, expected)  # oneDNN's model, bit for bit
        worst, same = step_diff(got, reference)
        assert worst <= 1 and same >= 0.999, (worst, same)
    for kernel in plan.kernels:
        if kernel.kind in ("convolution", "deconvolution", "matmul"):
            assert not kernel.impl.startswith("ref"), kernel.impl


@pytest.mark.parametrize("channels", [12, 36])
def test_depthwise_channel_tail_with_a_per_tensor_store_is_exact(channels: int) -> None:
    """A depthwise conv on a channel tail whose only binary post-op is the store's
    one-element divisor x / s: oneDNN 3.2's AVX2 depthwise kernel gets it wrong (118-128 LSB,
    lower_compute.WRONG_DEPTHWISE_CHANNEL_TAIL_BINARY), so the plan takes another kernel
    and is exact."""
    rng = np.random.default_rng(channels)
    g = Graph("dw")
    x = int_input(g, "x", (1, channels, 14, 14), U8, 0.03, 7)
    s_w = rng.uniform(0.002, 0.01, channels).astype(F32)
    store = replace(quantize_item(0.05, 3, U8), scale=0.05,
                    onnx=OnnxQuantize(U8, QuantParams.make(0.05, 3), dequantize=False))
    chain = [Scale.of(0.03 * s_w), Shift.of(rng.uniform(-0.5, 0.5, channels)), store]
    node = add_int8_conv(g, x, channels, group=channels, chain=chain, out_zp=3, seed=channels)
    g.outputs.append(node.outputs[0])
    feeds = {"x": random_int(np.random.default_rng(1), (1, channels, 14, 14), U8)}
    _check(g, feeds, "conv")
    conv = next(k for k in run_plan(g, feeds)[1].inspect()["kernels"] if k["name"] == "conv")
    assert "binary_div" in conv["post_ops"], conv["post_ops"]
    assert conv["impl"] not in lower_compute.WRONG_DEPTHWISE_CHANNEL_TAIL_BINARY or (
        channels % lower_compute.WRONG_DEPTHWISE_CHANNEL_TAIL_BINARY[conv["impl"]] == 0)


@requires_exact_int8
@pytest.mark.parametrize("name", list(CONV_CASES))
def test_int8_conv(name: str) -> None:
    graph, feeds = _conv_graph(CONV_CASES[name])
    _check(graph, feeds, "conv")
    _, plan = run_plan(graph, feeds)
    info = plan.inspect()
    conv = next(k for k in info["kernels"] if k["name"] == "conv")
    grouped = CONV_CASES[name].get("group", 1) > 1
    if "split weights" in info["exact_int8"].get("conv", ""):
        # no VNNI (no_vnni.py): weight scale 2 (a deconvolution's halves are added by a
        # binary primitive), the per-channel scales become a post-op
        assert conv["scales_masks"].get("WEIGHTS", 0) == 0
        assert "binary_mul" in conv["post_ops"][:2]
        conv = next(k for k in info["kernels"] if k["name"] == "conv:lo")  # reads the src
    else:
        assert conv["scales_masks"]["WEIGHTS"] == (3 if grouped else 1)  # per output channel
    assert conv["zero_points_masks"]["SRC"] == 0


@requires_exact_int8
def test_small_conv_avoids_amx_with_the_same_result(monkeypatch: pytest.MonkeyPatch) -> None:
    graph, feeds = _conv_graph(CONV_CASES["1x1"])  # 2·9·9·64·32 = 0.33 M MACs: below SMALL_MACS
    out, plan = run_plan(graph, feeds)
    impl = next(k.impl for k in plan.kernels if k.name == "conv")
    assert "amx" not in impl
    monkeypatch.setattr(lower_compute, "SMALL_MACS", 0)
    amx_out, amx_plan = run_plan(graph, feeds)
    np.testing.assert_array_equal(out[graph.outputs[0]], amx_out[graph.outputs[0]])
    if "amx" in effective_cpu_isa().name:
        assert "amx" in next(k.impl for k in amx_plan.kernels if k.name == "conv")


@requires_exact_int8
@pytest.mark.parametrize("items", ["binary_mul", "binary_add", "prelu", "leaky_clip"])
def test_conv_post_op_kinds(items: str) -> None:
    rng = np.random.default_rng(3)
    s = rng.uniform(0.0001, 0.0003, 16).astype(F32)
    per_c = rng.uniform(0.5, 1.5, 16).astype(F32)
    chains = {
        "binary_mul": [Scale.of(s), Activation(Act.TANH), Scale.of(per_c)],
        "binary_add": [Scale.of(s), Activation(Act.SIGMOID), Shift.of(per_c - 1)],
        "prelu": [Scale.of(s), Shift.of(per_c - 1), PRelu(tuple(float(v) for v in per_c / 4))],
        "leaky_clip": [Scale.of(s), Activation(Act.RELU, 0.1), Activation(Act.CLIP, -1.0, 2.5)],
    }
    chain = chains[items] + [quantize_item(0.02, 100, U8)]
    graph, feeds = _conv_graph({"c": 16, "o": 16, "chain": chain, "out_scale": 0.02, "out_zp": 100})
    _check(graph, feeds, "conv")
    _out, plan = run_plan(graph, feeds)
    names = next(k for k in plan.inspect()["kernels"] if k["name"] == "conv")["post_ops"]
    expected = {"binary_mul": "binary_mul", "binary_add": "binary_add", "prelu": "prelu",
                "leaky_clip": "eltwise_clip"}[items]
    assert expected in names, names


def _residual_graph(internal: bool, res_dtype: DType = U8) -> tuple[Graph, dict]:
    g = Graph("residual")
    x = int_input(g, "x", (1, 16, 8, 8), U8, 0.04, 5)
    feeds = {"x": random_int(np.random.default_rng(0), (1, 16, 8, 8), U8)}
    if internal:
        a = add_int8_conv(g, x, 32, kernel=1, pads=(0, 0, 0, 0), name="proj", dst=res_dtype,
                          out_scale=0.0613, out_zp=3 if res_dtype == U8 else -2, seed=4)
        r = a.outputs[0]
    else:
        r = int_input(g, "r", (1, 32, 8, 8), res_dtype, 0.0613, 3)
        feeds["r"] = random_int(np.random.default_rng(1), (1, 32, 8, 8), res_dtype)
    # scales in no simple ratio: s_r/s_out = 3/4 would put relu(·) = 0 outputs on exact ties,
    # which the FakeQuantize formula and oneDNN's x·(1/s) round apart (1 LSB, by design)
    node = add_int8_conv(g, x, 32, residual=r, name="conv", out_scale=0.0837, out_zp=2)
    g.outputs.append(node.outputs[0])
    return g, feeds


@requires_exact_int8
@pytest.mark.parametrize("internal", [True, False], ids=["in_place", "copied"])
def test_residual_sum(internal: bool) -> None:
    graph, feeds = _residual_graph(internal)
    _check(graph, feeds, "conv")
    _, plan = run_plan(graph, feeds)
    info = plan.inspect()
    kernel = next(k for k in info["kernels"] if k["name"] == "conv")
    assert "sum" in kernel["post_ops"]
    # in place: dst shares the residual's buffer; a graph input is copied into dst instead
    assert info["in_place_sums"] == (1 if internal else 0)
    assert info["reorders"] == (0 if internal else 1)


@requires_exact_int8
def test_residual_s8_into_u8_dst() -> None:
    graph, feeds = _residual_graph(True, S8)
    _check(graph, feeds, "conv")


@requires_exact_int8
def test_float_residual_into_an_int8_dst_is_a_binary_add() -> None:
    """TensorRT-style placement: a float32 residual added before the output quantize. oneDNN's
    sum reads the residual from the dst buffer (equal element sizes), so a binary_add post-op
    reads it instead; the dst is u8 (no float32 output and standalone quantize), jit, and
    oneDNN's model bit for bit."""
    g = Graph("residual_f32")
    x = int_input(g, "x", (1, 16, 8, 8), U8, 0.04, 5)
    g.add_input("r", TensorInfo((1, 32, 8, 8), DType.F32))
    chain = [Scale.of(0.0007), Shift.of(np.linspace(-0.3, 0.3, 32)),
             Residual(2, 1.0, 0, DType.F32), Activation(Act.RELU),
             quantize_item(0.0837, 2, U8)]
    node = add_int8_conv(g, x, 32, chain=chain, residual="r", name="conv", out_scale=0.0837,
                         out_zp=2)
    g.outputs.append(node.outputs[0])
    rng = np.random.default_rng(3)
    feeds = {"x": random_int(rng, (1, 16, 8, 8), U8),
             "r": rng.normal(0, 2, (1, 32, 8, 8)).astype(F32)}
    _check(g, feeds, "conv")
    _, plan = run_plan(g, feeds)
    kernel = next(k for k in plan.inspect()["kernels"] if k["name"] == "conv")
    assert "binary_add" in kernel["post_ops"] and "sum" not in kernel["post_ops"], kernel
    assert kernel["dst_dtype"] == "u8", kernel


def test_deconv_weights_are_transposed_not_flipped() -> None:
    """ONNX ConvTranspose against oneDNN deconvolution on an asymmetric kernel, float path."""
    g = Graph("deconv")
    g.add_input("x", TensorInfo((1, 4, 5, 5), DType.F32))
    rng = np.random.default_rng(0)
    w = rng.standard_normal((4, 3, 3, 3)).astype(F32)  # [Cin, Cout/g, kh, kw], g = 2
    w[:, :, 0, :] *= 5  # asymmetric: a flip would show
    g.add_constant("w", w)
    g.add_node(Op.CONV_TRANSPOSE, ["x", "w"], ["y"],
               ConvTransposeAttrs((3, 3), (2, 2), (1, 0, 0, 1), (1, 1), (1, 0), 2),
               infos=[TensorInfo((1, 6, 11, 10), DType.F32)])
    g.outputs.append("y")
    feeds = {"x": rng.standard_normal((1, 4, 5, 5)).astype(F32)}
    out, _ = run_plan(g, feeds)
    np.testing.assert_allclose(out["y"], ref_eval(g, feeds)["y"], rtol=1e-5, atol=1e-5)


@requires_exact_int8
@pytest.mark.parametrize("name", list(MATMUL_CASES))
def test_int8_matmul(name: str) -> None:
    graph, feeds = matmul_graph(**MATMUL_CASES[name])
    _check(graph, feeds, "mm")


@requires_exact_int8
def test_unfused_mode_matches_reference() -> None:
    """Unfused: the int8 primitive then one primitive per basic op; ≤ 1 LSB of the chain."""
    graph, feeds = _residual_graph(True)
    out, plan = run_plan(graph, feeds, mode="unfused")
    worst, same = step_diff(out[graph.outputs[0]], ref_eval(graph, feeds)[graph.outputs[0]])
    assert worst <= 1 and same >= 0.999
    kinds = [k.kind for k in plan.kernels]
    convs = 4 if SPLITS_INT8 else 2  # no VNNI: each split in two (no_vnni.py)
    assert kinds.count("convolution") == convs and "eltwise" in kinds and "binary" in kinds
    conv = next(k for k in plan.kernels if k.name == "conv")
    assert conv.primitive is not None
    # no VNNI: the only post-op adds the low half of the split weights' accumulator
    assert [p.kind for p in conv.primitive.pd.attr.post_ops] == (["binary"] if SPLITS_INT8
                                                                 else [])


@requires_exact_int8
@settings(max_examples=25, deadline=None, derandomize=True)
@given(c=st.sampled_from([3, 8, 16, 24]), o=st.sampled_from([8, 16, 32]),
       kernel=st.sampled_from([1, 3, 5]), stride=st.integers(1, 2), dilation=st.integers(1, 2),
       pad=st.integers(0, 2), group=st.sampled_from([1, 2, "dw"]), zp=st.integers(0, 255),
       out_zp=st.integers(0, 255), dst=st.sampled_from([U8, S8, DType.F32]),
       seed=st.integers(0, 1000))
def test_int8_conv_random_geometry(c: int, o: int, kernel: int, stride: int, dilation: int,
                                   pad: int, group: int | str, zp: int, out_zp: int,
                                   dst: DType, seed: int) -> None:
    """Random shapes, zero points and scales: bit-exact with oneDNN's model."""
    groups = c if group == "dw" else int(group)
    if c % groups or (group == "dw" and o != c) or (groups > 1 and o % groups):
        o = c if group == "dw" else o
        if c % groups or o % groups:
            return
    if dst == S8:
        out_zp -= 128
    case = {"c": c, "o": o, "kernel": kernel, "stride": stride, "dilation": dilation,
            "pads": (pad, pad, pad, pad), "group": groups, "dst": dst, "out_zp": out_zp}
    graph, feeds = _conv_graph(case, zp=zp, seed=seed)
    _check(graph, feeds, "conv")


def test_deconv_with_a_float_residual_is_not_on_the_gemm_fallback() -> None:
    """TensorRT-style decoder: int8 ConvTranspose + a float32 residual Add + Relu + Q/DQ.
    Without VNNI the split deconvolution's halves are added by a binary primitive that also
    adds the float32 residual (no_vnni.lower_with_binary); before, the main half took the sum
    and oneDNN ran it on its GEMM fallback (25 ms against 0.7 ms here). Within one step of the
    reference (0 measured), no ref: or GEMM-fallback kernel."""
    import onnx
    from onnx import TensorProto, helper

    from qfuse.compiler.api import compile_model
    from tests.compiler.onnx_builders import init, model

    rng = np.random.default_rng(0)
    inits = [init("xs", F32(0.03)), init("xz", np.int8(0)), init("ws", F32(0.004)),
             init("wz", np.int8(0)), init("ys", F32(0.05)), init("yz", np.int8(0)),
             init("w", rng.integers(-127, 128, (16, 32, 4, 4)).astype(np.int8)),
             init("w2", rng.integers(-127, 128, (16, 32, 1, 1)).astype(np.int8))]
    nodes = [helper.make_node("QuantizeLinear", ["x", "xs", "xz"], ["xq"]),
             helper.make_node("DequantizeLinear", ["xq", "xs", "xz"], ["xd"]),
             helper.make_node("DequantizeLinear", ["w", "ws", "wz"], ["wd"]),
             helper.make_node("ConvTranspose", ["xd", "wd"], ["d"], strides=[2, 2],
                              pads=[1, 1, 1, 1]),
             helper.make_node("DequantizeLinear", ["w2", "ws", "wz"], ["w2d"]),
             helper.make_node("ConvTranspose", ["xd", "w2d"], ["r"], strides=[2, 2],
                              output_padding=[1, 1]),
             helper.make_node("Add", ["d", "r"], ["s"]), helper.make_node("Relu", ["s"], ["a"]),
             helper.make_node("QuantizeLinear", ["a", "ys", "yz"], ["aq"]),
             helper.make_node("DequantizeLinear", ["aq", "ys", "yz"], ["y"])]
    m: onnx.ModelProto = model(nodes, {"x": ([1, 16, 8, 8], TensorProto.FLOAT)}, ["y"], inits)
    fused = compile_model(m)
    impls = [k["impl"] for k in fused.inspect()["kernels"]]
    assert not any(i.startswith("ref") or "gemm_s8u8s32" in i for i in impls), impls
    reference = compile_model(m, mode="reference")
    for seed in range(3):
        feeds = {"x": np.random.default_rng(seed).normal(0, 1, (1, 16, 8, 8)).astype(F32)}
        worst, _ = step_diff(fused.run(feeds)["y"], reference.run(feeds)["y"], 0.05)
        assert worst <= 1, worst


@requires_exact_int8
@pytest.mark.parametrize(("case", "direct"), [
    ({"c": 32, "o": 24, "residual": True}, True),   # 3x3, 24 output channels, a sum post-op
    ({"c": 16, "o": 16, "stride": 2}, True),
    ({"c": 16, "o": 32}, False),                     # 32 or more: brgconv kept
    ({"c": 16, "o": 72}, False),
    ({"c": 32, "o": 24, "kernel": 1, "pads": (0, 0, 0, 0)}, False),  # 1x1: brgconv_1x1 kept
])
def test_spatial_conv_with_few_channels_runs_direct(case: dict, direct: bool) -> None:
    """A k x k int8 conv with fewer than 32 output channels runs on jit_int8 where
    oneDNN lists brgconv first on an AVX-512 VNNI AMD CPU (lower_compute.prefer_direct_int8),
    with the same results as on brgconv, bit for bit (option off)."""
    from qfuse.compiler.lower.context import Options
    case = dict(case)
    g = Graph("conv")
    x = int_input(g, "x", (1, case.pop("c"), 20, 18), U8, 0.03, 7)
    residual = None
    if case.pop("residual", False):
        residual = int_input(g, "r", (1, case["o"], 20, 18), U8, 0.05, 3)
    node = add_int8_conv(g, x, case.pop("o"), residual=residual, **case)
    g.outputs.append(node.outputs[0])
    rng = np.random.default_rng(4)
    feeds = {name: random_int(rng, g.info(name).shape, U8) for name in g.inputs}
    out, plan = run_plan(g, feeds)
    off, off_plan = run_plan(g, feeds, direct_int8=False)
    np.testing.assert_array_equal(out[node.outputs[0]], off[node.outputs[0]])
    impl = next(k.impl for k in plan.kernels if k.name == "conv")
    first = next(k.impl for k in off_plan.kernels if k.name == "conv")
    assert Options().direct_int8
    if first == "brgconv:avx512_core_vnni" and direct and \
            lower_compute.cpu_vendor() == "AuthenticAMD":
        assert impl == "jit_int8:avx512_core_vnni", impl
    else:
        assert impl == first, (impl, first)
