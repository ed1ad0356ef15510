"""QOperator import (compiler/onnx_import/qoperator.py) against onnxruntime running the same
QOperator model.

- every single-op case (tests/compiler/qoperator_models.py): fused mode bit-exact, 0 LSB;
  reference mode bit-exact too, except where onnxruntime folds the scales into one float32
  multiplier (QLinearConv / QLinearMatMul / QGemm: ``acc·f32(sx·sw/sy)``, QLinearMul:
  ``(a-za)(b-zb)·f32(sa·sb/sc)``) while the reference computes the DQ → op → Q float formula:
  there 1 LSB at near-ties, on under 2 % of elements;
- QGemm without an output scale returns float: within 1 float32 ulp of the largest output
  (onnxruntime scales the int32 sum by ``f32(alpha·sa·sb)``, the rewrite by sa·sb·alpha in
  another order);
- with the output dequantized (as quantize_static ends a model) each compute op is one fused
  int8 kernel with an int8 dst;
- full-range weights: bit-exact against the exact integer reference (``--emulate
  onnxruntime``: exact int32 sums, MLAS's requantization); against onnxruntime itself only where
  its u8·s8 kernels are exact on this CPU (tests/ort_int8.py);
- the small zoo models quantized by quantize_static in QOperator format: fused output identical
  to the QDQ model's (same calibration) where both formats quantize the same tensors, and every
  integer kernel of the imported graph equal to onnxruntime's tensor from onnxruntime's own
  inputs (elements a saturating u8·s8 pair can touch exempt: tests/ort_int8.may_saturate).
"""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

import qfuse
from qfuse.compiler.api import import_graph
from qfuse.examples import zoo
from qfuse.runtime.emulate import emulate, plan
from tests.compiler.lower_helpers import computes_int8_node, float_matmul_copy
from tests.compiler.qoperator_models import CASES, MS, U8, dequantized, qlinear_conv
from tests.ort_int8 import may_saturate, ort_int8_exact

# Ops onnxruntime computes with one folded float32 multiplier (module docstring).
FOLDED_MULTIPLIER = ("QLinearConv", "QLinearMatMul", "QGemm", "QLinearMul")
# The conv runs with an f32 dst and its QuantizeLinear runs on its own, rounding ONNX's way,
# rint(x / s) + zp (compiler/lower/lower_quant.py), where onnxruntime's QLinearConv multiplies
# by its folded f32(s_x·s_w/s_y): one near-tie element of 972 is one step apart (measured).
SEPARATE_QUANTIZE = ("QLinearConv_s8_activations",)


def _ort(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(None, feeds)


def _run(model: onnx.ModelProto, feeds: dict[str, np.ndarray], mode: str) -> np.ndarray:
    compiled = qfuse.compile_model(model, mode=mode)
    return compiled.run(feeds)[compiled.outputs[0]]


def _lsb(a: np.ndarray, b: np.ndarray) -> int:
    return int(np.abs(a.astype(np.int64) - b.astype(np.int64)).max(initial=0))


@pytest.mark.parametrize("case", sorted(CASES))
def test_single_op_matches_onnxruntime(case: str, seed: int = 0) -> None:
    model, feeds = CASES[case](seed)
    (want,) = _ort(model, feeds)
    fused, ref = _run(model, feeds, "fused"), _run(model, feeds, "reference")
    assert fused.dtype == want.dtype and ref.dtype == want.dtype
    if want.dtype == np.float32:  # QGemm without y_scale
        ulp = np.spacing(np.abs(want).max())
        assert np.abs(fused - want).max() <= ulp and np.abs(ref - want).max() <= ulp
        return
    assert len(np.unique(want)) > min(10, want.size // 2)  # the data spreads over levels
    if case in SEPARATE_QUANTIZE:
        assert _lsb(fused, want) <= 1 and np.mean(fused == want) >= 0.998
    else:
        assert _lsb(fused, want) == 0, f"{int((fused != want).sum())} of {want.size} differ"
    if case.startswith(FOLDED_MULTIPLIER):
        assert _lsb(ref, want) <= 1 and np.mean(ref == want) >= 0.98
    else:
        assert _lsb(ref, want) == 0, f"{int((ref != want).sum())} of {want.size} differ"


# a MatMul by constant weights on oneDNN's GEMM (AVX2) runs as a 1x1 convolution
# (passes/vector_matmul_as_conv.py)
MATMUL = ("matmul", "convolution")
COMPUTE = {"QLinearConv": ("convolution",), "QLinearMatMul": MATMUL, "QGemm": MATMUL}


# Not fused: QGemm_float_output (no output quantization to fuse) and QLinearConv_u8w_zp_wide
# (u8 weights whose w - zw leaves int8: oneDNN convolutions take no weight zero point, so the
# conv runs in float32 — still bit-exact, checked above).
@pytest.mark.parametrize("case", sorted(c for c in CASES if c.startswith(tuple(COMPUTE))
                                        and c not in ("QGemm_float_output",
                                                      "QLinearConv_u8w_zp_wide")))
def test_compute_ops_fuse_into_one_int8_kernel(case: str) -> None:
    """Bit-exact with the op's exact QDQ form (examples/realzoo/exact.py: DQ → float op → Q,
    ONNX's division by y_scale); within one step of onnxruntime's own int8 kernel, which
    multiplies by f32(sx·sw/sy) (one element of QLinearConv_s8_activations, a near-tie)."""
    from qfuse.examples.realzoo.exact import exact_qdq

    model, feeds = dequantized(CASES[case](0))
    (ort_int8,) = _ort(model, feeds)
    exact = onnx.ModelProto.FromString(model.SerializeToString())
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    (want,) = ort.InferenceSession(exact_qdq(exact).SerializeToString(), options,
                                   providers=["CPUExecutionProvider"]).run(None, feeds)
    compiled = qfuse.compile_model(model)
    got = compiled.run(feeds)[compiled.outputs[0]]
    np.testing.assert_array_equal(got, want)
    assert np.count_nonzero(got != ort_int8) <= 1
    primitive = COMPUTE[case.split("_")[0]]
    kernels = [k for k in compiled.inspect()["kernels"] if k["primitive"] in primitive]
    assert kernels, compiled.inspect()["kernels"]
    last = kernels[-1]  # weights split for CPUs without VNNI give a :lo kernel before it
    assert computes_int8_node(last), last
    # an int8 store, or (the output's dequantize folded in: fold_output_dequantize) f32 with
    # nothing after it but the output's layout reorder (or a float32 matmul's 8-bit store)
    after = compiled.inspect()["kernels"][compiled.inspect()["kernels"].index(last) + 1:]
    assert last["dst_dtype"] in ("u8", "s8") or (
        last["dst_dtype"] == "f32"
        and all(k["role"] == "io" or float_matmul_copy(k) for k in after)), (last, after)
    assert case.split("_")[0] in last["name"] or last["absorbed"], last


@pytest.mark.parametrize("seed", [0, 1])
def test_full_range_weights_exact(seed: int) -> None:
    """|w| up to 127 with u8 activations: pairs of products can leave int16."""
    model, feeds = qlinear_conv(seed, w_span=127)
    graph = import_graph(model)
    exact = emulate(graph, feeds, "onnxruntime")["y"]
    np.testing.assert_array_equal(_run(model, feeds, "fused"), exact)
    (theirs,) = _ort(model, feeds)
    if ort_int8_exact():
        np.testing.assert_array_equal(theirs, exact)
    else:
        (decision,) = [d for d in plan(graph, "onnxruntime") if d.integer]
        assert decision.match is not None
        may = may_saturate(decision.match, lambda v: graph.constant(v)
                            if graph.constant(v) is not None else feeds[v])
        assert may is not None and not np.any((theirs != exact) & ~may)


def test_integer_linear_resize_truncates_like_onnxruntime() -> None:
    node = helper.make_node("Resize", ["x", "", "s"], ["y"], mode="linear")
    graph = helper.make_graph(
        [node], "g", [helper.make_tensor_value_info("x", U8, [1, 3, 5, 6])],
        [helper.make_tensor_value_info("y", U8, [1, 3, 10, 12])],
        [onnx.numpy_helper.from_array(np.array([1, 1, 2, 2], np.float32), "s")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=8)
    feeds = {"x": np.random.default_rng(0).integers(0, 256, (1, 3, 5, 6)).astype(np.uint8)}
    (want,) = _ort(model, feeds)
    for mode in ("fused", "reference"):
        np.testing.assert_array_equal(_run(model, feeds, mode), want)


def test_softmax_opset_12_attribute() -> None:
    x = helper.make_tensor_value_info("x", U8, [2, 1, 7])
    node = helper.make_node("QLinearSoftmax", ["x", "xs", "xz", "ys", "yz"], ["y"], domain=MS,
                            opset=12, axis=1)
    inits = [onnx.numpy_helper.from_array(np.array(v, t), n) for n, v, t in (
        ("xs", 0.05, np.float32), ("xz", 128, np.uint8), ("ys", 1 / 256, np.float32),
        ("yz", 0, np.uint8))]
    graph = helper.make_graph([node], "g", [x], [helper.make_tensor_value_info("y", U8,
                                                                              [2, 1, 7])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13),
                                                    helper.make_opsetid(MS, 1)], ir_version=8)
    feeds = {"x": np.random.default_rng(1).integers(0, 256, (2, 1, 7)).astype(np.uint8)}
    (want,) = _ort(model, feeds)
    np.testing.assert_array_equal(_run(model, feeds, "fused"), want)


def test_dynamic_quantize_linear_and_its_matmul_run_natively() -> None:
    """DynamicQuantizeLinear and a MatMulInteger reading its run-time zero point are native
    kernels (tests/compiler/test_dynamic_quantization.py has the rest), not islands."""
    nodes = [helper.make_node("DynamicQuantizeLinear", ["x"], ["q", "s", "z"], name="dql"),
             helper.make_node("MatMulInteger", ["q", "w", "z"], ["y"])]
    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 4])],
        [helper.make_tensor_value_info("y", TensorProto.INT32, [2, 3])],
        [onnx.numpy_helper.from_array(np.ones((4, 3), np.uint8), "w")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=8)
    compiled = qfuse.compile_model(model)
    assert not compiled.inspect()["islands"]
    x = np.random.default_rng(0).standard_normal((2, 4)).astype(np.float32)
    want = ort.InferenceSession(model.SerializeToString(),
                                providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    np.testing.assert_array_equal(compiled.run({"x": x})["y"], want)


def test_conv_integer_beyond_float32_exactness_runs_as_an_island() -> None:
    """576 taps of |w - zw| = 127 against u8 inputs with zero point 0: sums up to 18.65 M, past
    float32's exact integers, so not the float QDQ form: onnxruntime runs it, exactly."""
    node = helper.make_node("ConvInteger", ["x", "w"], ["y"], name="ci")
    graph = helper.make_graph(
        [node], "g", [helper.make_tensor_value_info("x", U8, [1, 64, 3, 3])],
        [helper.make_tensor_value_info("y", TensorProto.INT32, [1, 2, 1, 1])],
        [onnx.numpy_helper.from_array(np.full((2, 64, 3, 3), 127, np.int8), "w")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=8)
    compiled = qfuse.compile_model(model)
    assert any("18653760 > 2^24" in i["reason"] for i in compiled.inspect()["islands"])
    x = np.full((1, 64, 3, 3), 255, np.uint8)
    np.testing.assert_array_equal(compiled.run({"x": x})["y"], np.full((1, 2, 1, 1), 18653760))


def _zoo(name: str, fmt: str) -> str:
    return str(zoo.model_path(name, quantized=True, quant_format=fmt))


# Models whose QOperator and QDQ forms quantize the same tensors with the same parameters
# (inception's QLinearAveragePool has its own output scale where QDQ reuses the input's; unet
# resizes u8 data directly; the transformer keeps Reshapes in float between Q and DQ).
SAME_AS_QDQ = ("resnet", "mobilenetv2", "vgg", "shufflenet")


@pytest.mark.parametrize("name", SAME_AS_QDQ)
def test_zoo_qoperator_fuses_like_qdq(name: str) -> None:
    qop, qdq = qfuse.compile_model(_zoo(name, "qoperator")), qfuse.compile_model(_zoo(name, "qdq"))
    feeds = zoo.sample_inputs(zoo.float_model(name), 1, seed=3)[0]
    out = qop.outputs[0]
    np.testing.assert_array_equal(qop.run(feeds)[out], qdq.run(feeds)[out])
    assert len(qop.inspect()["kernels"]) == len(qdq.inspect()["kernels"])


# unet (QLinearConcat, u8 MaxPool, u8 nearest and linear Resize) takes 17 s here; inception
# covers QLinearAveragePool / QLinearConcat / u8 MaxPool, the transformer QLinearMatMul /
# QLinearMul / QLinearSoftmax / QGemm.
@pytest.mark.parametrize("name", ["inception", "transformer"])
def test_zoo_qoperator_kernels_match_onnxruntime(name: str) -> None:
    model = onnx.load(_zoo(name, "qoperator"))
    graph = import_graph(model)
    decisions = [d for d in plan(graph, "onnxruntime") if d.integer]
    assert decisions
    declared = {o.name for o in model.graph.output}
    for node in list(model.graph.node):  # every tensor, as ORT computes it
        model.graph.output.extend(onnx.ValueInfoProto(name=o) for o in node.output
                                  if o and o not in declared)
    feeds = zoo.sample_inputs(zoo.float_model(name), 1, seed=3)[0]
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    theirs = dict(zip([o.name for o in session.get_outputs()], session.run(None, feeds),
                      strict=True))

    def read(value: str) -> np.ndarray:
        const = graph.constant(value)
        return const if const is not None else theirs.get(value, feeds.get(value))

    exact_ort = ort_int8_exact()
    for d in decisions:
        assert d.prepared is not None and d.match is not None
        differ = d.prepared.run(read) != theirs[d.tensor]
        may = None if exact_ort else may_saturate(d.match, read)
        allowed = np.zeros_like(differ) if may is None else np.broadcast_to(may, differ.shape)
        assert not np.any(differ & ~allowed), f"{d.tensor} ({d.how})"
    compiled = qfuse.compile_model(_zoo(name, "qoperator"))
    assert compiled.run(feeds)[compiled.outputs[0]].size  # compiles and runs fused


@pytest.mark.parametrize("pad_mode", ["constant", "reflect"])
def test_u8_data_movement_keeps_the_producer_quantization(pad_mode: str) -> None:
    """QLinearLeakyRelu → Pad → MaxPool → Transpose → Reshape, all on u8 (as QOperator models
    write them): each becomes DQ → op → Q with the producer's scale and zero point. (ys is not
    0.04: with xs·alpha/ys = 1/4 the LeakyRelu lands on exact .5 ties, where qfuse's standalone
    f32→u8 reorder, ``x·f32(1/s)``, and ONNX's ``x/s`` round apart — docs/numerics.md.)"""
    f32, u8 = np.float32, np.uint8
    inits = [onnx.numpy_helper.from_array(np.array(v, t), n) for n, v, t in (
        ("xs", 0.05, f32), ("xz", 128, u8), ("ys", 0.03, f32), ("yz", 100, u8),
        ("pads", [0, 0, 1, 2, 0, 0, 2, 1], np.int64), ("c", 7, u8),
        ("shape", [1, -1], np.int64))]
    pad_inputs = ["a", "pads", "c"] if pad_mode == "constant" else ["a", "pads"]
    nodes = [helper.make_node("QLinearLeakyRelu", ["x", "xs", "xz", "ys", "yz"], ["a"],
                              domain=MS, alpha=0.2),
             helper.make_node("Pad", pad_inputs, ["p"], mode=pad_mode),
             helper.make_node("MaxPool", ["p"], ["m"], kernel_shape=[2, 2], strides=[2, 2]),
             helper.make_node("Transpose", ["m"], ["t"], perm=[0, 2, 3, 1]),
             helper.make_node("Reshape", ["t", "shape"], ["y"])]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", U8, [1, 3, 6, 7])],
                              [helper.make_tensor_value_info("y", U8, [1, 60])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17),
                                                    helper.make_opsetid(MS, 1)], ir_version=8)
    feeds = {"x": np.random.default_rng(2).integers(0, 256, (1, 3, 6, 7)).astype(np.uint8)}
    (want,) = _ort(model, feeds)
    for mode in ("fused", "reference"):
        np.testing.assert_array_equal(_run(model, feeds, mode), want)
