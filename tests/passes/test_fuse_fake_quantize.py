"""fuse_fake_quantize (passes/fuse_post_ops.py ``run_fake_quantize``): a quantize whose
integers only its dequantize reads, and whose dequantized values only float ops read, is one
float32 → float32 kernel. NNCF quantizes a transformer's residual stream that way:

    h = x + pos;  LayerNorm(h) → Q/DQ → MatMul → Q/DQ → t;  h → Q/DQ → r;  y = t + r

Before: a quantize kernel and a dequantize kernel on h. After: one binary primitive writing
(Q(h) − zp)·s, bit-identical (the same float32 operations: the unfused mode runs them one
primitive each)."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper

from qfuse.compiler.api import compile_model, import_graph
from qfuse.compiler.lower import Options, lower
from qfuse.compiler.modes import run_passes
from qfuse.passes.base import PassContext
from qfuse.runtime.executor import Executor
from tests.compiler.onnx_builders import init, model, qdq_pair

F32 = np.float32


def _residual_stream(requantized: bool = False) -> onnx.ModelProto:
    """``requantized``: h itself is a dequantized 8-bit tensor (DQ → Q → DQ, a requantize,
    which reads the integers: not this pass's)."""
    rng = np.random.default_rng(3)
    c, t = 32, 8
    inits = [init("pos", rng.normal(0, 0.5, (1, t, c)).astype(F32)),
             init("g1", rng.uniform(0.5, 1.5, c).astype(F32)),
             init("b1", rng.normal(0, 0.1, c).astype(F32)),
             init("g2", rng.uniform(0.5, 1.5, c).astype(F32)),
             init("b2", rng.normal(0, 0.1, c).astype(F32)),
             init("w", rng.integers(-127, 128, (c, c)).astype(np.int8)),
             init("ws", np.float32(0.004)), init("bias", rng.normal(0, 0.2, c).astype(F32)),
             init("ns", np.float32(0.03)), init("nz", np.int8(0)),
             init("ts", np.float32(0.05)), init("tz", np.int8(0)),
             init("rs", np.float32(0.037)), init("rz", np.int8(0)),
             init("hs", np.float32(0.02)), init("hz", np.uint8(128))]
    nodes = [helper.make_node("Add", ["x", "pos"], ["h0"])]
    if requantized:
        nodes += qdq_pair("h", "h0", "h")
    else:
        nodes += [helper.make_node("Identity", ["h0"], ["h"])]
    nodes += [helper.make_node("LayerNormalization", ["h", "g1", "b1"], ["n"], axis=-1),
              *qdq_pair("n", "n", "nd"),
              helper.make_node("DequantizeLinear", ["w", "ws"], ["wd"]),
              helper.make_node("MatMul", ["nd", "wd"], ["mm"]),
              helper.make_node("Add", ["mm", "bias"], ["mb"]),
              *qdq_pair("t", "mb", "td"),
              *qdq_pair("r", "h", "rd"),
              helper.make_node("Add", ["td", "rd"], ["y0"]),
              helper.make_node("LayerNormalization", ["y0", "g2", "b2"], ["y"], axis=-1)]
    return model(nodes, {"x": ([1, t, c], TensorProto.FLOAT)}, ["y"], inits)


def _without_pass(m: onnx.ModelProto) -> Executor:
    graph = import_graph(m)
    run_passes(graph, "fused", PassContext(disabled_passes=frozenset({"fuse_fake_quantize"})))
    return Executor(lower(graph, Options(mode="fused")))


RESIDUAL_QDQ = {"QuantizeLinear_10", "DequantizeLinear_11"}


def test_quantize_and_dequantize_of_the_residual_stream_are_one_kernel() -> None:
    m = _residual_stream()
    on, off = compile_model(m), _without_pass(m)
    kernels = on.inspect()["kernels"]
    assert len(kernels) == len(off.plan.kernels) - 1
    kernel, = [k for k in kernels if RESIDUAL_QDQ & set(k["absorbed"])]
    assert kernel["primitive"] == "binary" and kernel["dst_dtype"] == "f32", kernel
    assert set(kernel["absorbed"]) == RESIDUAL_QDQ
    assert len([k for k in off.plan.kernels if RESIDUAL_QDQ & set(k.info.absorbed)]) == 2
    unfused = compile_model(m, mode="unfused")
    reference = compile_model(m, mode="reference")
    rng = np.random.default_rng(0)
    for _ in range(4):
        feeds = {"x": rng.normal(0, 2, (1, 8, 32)).astype(F32)}
        got = on.run(feeds)["y"]
        for other in (off, unfused):
            assert np.array_equal(got.view(np.uint32), other.run(feeds)["y"].view(np.uint32))
        # the integer parts agree exactly; the LayerNorms sum in another float32 order than
        # the reference's: a few ulps of the largest output (measured: at most 1.5)
        want = reference.run(feeds)["y"]
        assert np.abs(got - want).max() <= 4 * np.spacing(np.abs(want).max())


def test_a_requantize_keeps_its_integer_source() -> None:
    """h = DQ(Q(h0)) quantized again: lower_quant's requantize reads the integers, one
    kernel either way; the pass leaves it."""
    m = _residual_stream(requantized=True)
    on, off = compile_model(m), _without_pass(m)
    assert [k["name"] for k in on.inspect()["kernels"]] == [k.name for k in off.plan.kernels]
