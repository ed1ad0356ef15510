"""deconv_as_depth_to_space: a ConvTranspose whose kernel equals its stride, with few output
channels (DBNet's last layer) or, where an exact int8 deconvolution would be split (no VNNI),
any number, runs as a 1x1 Conv to b²·O channels and a DepthToSpace. Bit-identical to the
deconvolution plan in every mode (the same exact integer sums, the same float32 chain per
output channel); declined where its conditions fail."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from qfuse.compiler.api import compile_model, import_graph, random_inputs
from qfuse.compiler.pipeline import run_pipeline
from qfuse.ir import Op
from qfuse.ir.postops import ComposerOptions
from qfuse.passes.base import PassContext
from qfuse.runtime.numerics import step_diff
from tests.compiler.onnx_builders import init, model, qdq_pair

F32 = np.float32
OFF = ComposerOptions().without("deconv_as_depth_to_space")


def _head(out_channels: int = 1, *, kernel: int = 2, stride: int = 2, pads: int = 0,
          group: int = 1, tail: str = "sigmoid", quantized: bool = True) -> onnx.ModelProto:
    """x[1, 8, 6, 5] → [Q/DQ] → ConvTranspose(per-channel DQ(w) along axis 1, bias) → tail:
    "sigmoid" (a float output, as DBNet's), "relu_q" (Relu then Q/DQ: an 8-bit dst),
    "residual" (+ a second input of the output's shape)."""
    rng = np.random.default_rng(3)
    c = 8
    w_shape = (c, out_channels // group, kernel, kernel)
    inits = [init("b", rng.normal(0, 0.3, out_channels).astype(F32))]
    nodes, src = [], "x"
    if quantized:
        inits += [init("w", rng.integers(-127, 128, w_shape).astype(np.int8)),
                  init("ws", rng.uniform(0.002, 0.01, out_channels // group).astype(F32)
                       if group == 1 else F32(0.005)),
                  init("wz", np.zeros(out_channels // group, np.int8) if group == 1
                       else np.int8(0)),
                  init("xs", F32(0.03)), init("xz", np.uint8(90))]
        nodes += [*qdq_pair("x", "x", "xd"),
                  helper.make_node("DequantizeLinear", ["w", "ws", "wz"], ["wd"],
                                   axis=1 if group == 1 else 0)]
        src, weights = "xd", "wd"
    else:
        inits.append(init("w", rng.normal(0, 0.2, w_shape).astype(F32)))
        weights = "w"
    nodes.append(helper.make_node("ConvTranspose", [src, weights, "b"], ["t"],
                                  kernel_shape=[kernel, kernel], strides=[stride, stride],
                                  pads=[pads] * 4, group=group))
    inputs = {"x": ([1, c, 6, 5], TensorProto.FLOAT)}
    if tail == "sigmoid":
        nodes.append(helper.make_node("Sigmoid", ["t"], ["y"]))
    elif tail == "relu_q":
        inits += [init("ys", F32(0.02)), init("yz", np.uint8(0))]
        nodes += [helper.make_node("Relu", ["t"], ["r"]), *qdq_pair("y", "r", "y")]
    else:
        out = (6 - 1) * stride - 2 * pads + kernel, (5 - 1) * stride - 2 * pads + kernel
        inputs["r"] = ([1, out_channels, *out], TensorProto.FLOAT)
        nodes.append(helper.make_node("Add", ["t", "r"], ["y"]))
    return model(nodes, inputs, ["y"], inits, opset=13)


def _kinds(compiled) -> set[str]:
    return {k["primitive"] for k in compiled.inspect()["kernels"]}


@pytest.mark.parametrize("quantized", [True, False])
@pytest.mark.parametrize(("out_channels", "tail"), [(1, "sigmoid"), (4, "relu_q"),
                                                    (3, "sigmoid")])
def test_a_few_channel_upsampling_is_a_1x1_conv_bit_identical(out_channels: int, tail: str,
                                                               quantized: bool) -> None:
    m = _head(out_channels, tail=tail, quantized=quantized)
    for mode in ("fused", "unfused", "fp32"):
        on, off = compile_model(m, mode=mode), compile_model(m, mode=mode, composer=OFF)
        assert "deconvolution" in _kinds(off)
        assert "deconvolution" not in _kinds(on) and "convolution" in _kinds(on), mode
        kernels = on.inspect()["kernels"]
        assert not [k for k in kernels if k["impl"].startswith("ref")], kernels
        for seed in range(3):
            feeds = random_inputs(on, seed=seed)
            got, want = on.run(feeds)["y"], off.run(feeds)["y"]
            assert np.array_equal(got.view(np.uint8), want.view(np.uint8)), (mode, seed)
    if quantized and tail == "relu_q":  # and the plan is as close to exact QDQ as before
        feeds = random_inputs(on, seed=5)
        reference = compile_model(m, mode="reference").run(feeds)["y"]
        assert step_diff(compile_model(m).run(feeds)["y"], reference, 0.02).max_steps <= 1


@pytest.mark.parametrize("case", [
    {"out_channels": 16},  # oneDNN's deconvolution is as fast from one channel block on
    {"kernel": 3},  # overlapping windows
    {"kernel": 4, "stride": 2, "pads": 1},
    {"out_channels": 4, "group": 2},
    {"tail": "residual"},  # a chain reading a tensor of the output's shape
])
def test_declined(case: dict) -> None:
    m = _head(**{"out_channels": 4, **case})
    # 16 channels: declined where the int8 deconvolution is not split (below: where it is)
    exact = case.get("out_channels") != 16
    assert "deconvolution" in _kinds(compile_model(m, exact_int8=exact))


@pytest.mark.parametrize("quantized", [True, False])
def test_many_channels_where_exact_int8_splits_the_deconvolution(quantized: bool) -> None:
    """From 16 output channels the rewrite is taken only where an exact int8 deconvolution
    would be split (no VNNI / AMX): its halves would run bare and a binary kernel add them,
    where the 1x1 convolution takes its low half as a post-op. Decided by the PassContext
    flag compile_model sets from the CPU, so checked here on the pass; a float deconvolution
    is never split and keeps its kernel."""
    m = _head(24, tail="relu_q", quantized=quantized)
    for split in (True, False):
        graph = import_graph(m)
        run_pipeline(graph, PassContext(split_int8_deconvolutions=split))
        ops = {n.op for n in graph.topo_order()}
        rewritten = split and quantized
        assert (Op.DEPTH_TO_SPACE in ops) == rewritten, (split, quantized)
        assert (Op.CONV_TRANSPOSE in ops) != rewritten, (split, quantized)
    on, off = compile_model(m), compile_model(m, composer=OFF)  # this CPU's own decision
    for seed in range(3):
        feeds = random_inputs(on, seed=seed)
        assert np.array_equal(on.run(feeds)["y"].view(np.uint8),
                              off.run(feeds)["y"].view(np.uint8)), seed
