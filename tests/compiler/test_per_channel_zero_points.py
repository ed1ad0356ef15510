"""NNCF's MIXED preset (asymmetric activations; also what ``model_type=TRANSFORMER`` sets)
quantizes a depthwise conv's input per channel, each channel with its own zero point. oneDNN
takes a per-channel source zero point only on ``ref:any``; passes/move_dequantize.py gives the
kernel zero point 0 and adds the exact integer correction to its accumulator (a binary_add
post-op). Checked here on NNCF's own output: the depthwise convs run int8 on a jit kernel, no
numpy kernel is left, and every integer tensor is within 1 LSB of onnxruntime's exact QDQ
evaluation op by op (`qfuse check`), ties only.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto
from onnx import helper as h
from onnx import numpy_helper as nh

from qfuse import compile_model
from qfuse.compiler.op_check import check_op_by_op
from qfuse.examples.realzoo.quantize import quantize
from tests.examples.test_quantize_variants import SHAPE, float_block


@pytest.fixture(scope="module")
def mixed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The MobileNetV3-like block without its residual (HardSwish outputs are signed, so
    MIXED quantizes them asymmetrically, the depthwise input per channel) quantized by NNCF
    with ``preset=MIXED`` (the zoo's ``nncf-mixed``)."""
    rng = np.random.default_rng(1)
    calibration = [{"x": rng.standard_normal(SHAPE).astype(np.float32)} for _ in range(4)]
    model, _ = quantize(float_block(residual=False), calibration, "nncf-mixed")
    path = tmp_path_factory.mktemp("mixed") / "mixed.onnx"
    onnx.save(model, path)
    return path


def test_nncf_mixed_depthwise_input_has_per_channel_zero_points(mixed: Path) -> None:
    model = onnx.load(mixed)
    inits = {i.name: nh.to_array(i) for i in model.graph.initializer}
    dw_input = next(n.input[0] for n in model.graph.node
                    if n.op_type == "Conv" and any(a.name == "group" and a.i == 16
                                                   for a in n.attribute))
    dq = next(n for n in model.graph.node if dw_input in n.output)
    assert dq.op_type == "DequantizeLinear"
    zero_points = inits[dq.input[2]]
    assert zero_points.size == 16 and len(set(zero_points.tolist())) > 1  # the premise


def test_depthwise_conv_runs_int8_with_the_correction(mixed: Path) -> None:
    compiled = compile_model(str(mixed))
    kernels = compiled.inspect()["kernels"]
    assert not [k["name"] for k in kernels if k["impl"] == "numpy" or "ref" in k["impl"]]
    depthwise = [k for k in kernels if k["primitive"] == "convolution"
                 and "binary_add(input 2)" in k["post_op_details"]]
    # int8 either way: NNCF's s8 values, or (AVX2) shifted to u8 with zero point + 128
    assert len(depthwise) == 1 and depthwise[0]["src_dtype"] in ("u8", "s8"), kernels
    assert not depthwise[0]["impl"].startswith("ref"), depthwise
    x = {"x": np.random.default_rng(3).standard_normal(SHAPE).astype(np.float32)}
    check = check_op_by_op(str(mixed), x, compiled=compiled)
    assert len(check.ints) >= 3 and check.max_lsb <= 1, check.to_json()
    dw_output = [r for r in check.ints if r.node == depthwise[0]["node"]]
    assert dw_output and dw_output[0].max_lsb <= 1


def test_outputs_match_the_reference(mixed: Path) -> None:
    x = {"x": np.random.default_rng(2).standard_normal(SHAPE).astype(np.float32)}
    fused = compile_model(str(mixed)).run(x)["y"]
    reference = compile_model(str(mixed), mode="reference").run(x)["y"]
    cosine = float(np.sum(fused * reference) / np.linalg.norm(fused) / np.linalg.norm(reference))
    assert cosine > 0.9999, cosine


def _aggregation_block() -> onnx.ModelProto:
    """HGNet's aggregation: a strided depthwise conv without activation (signed output), a
    conv + ReLU after it (unsigned), both concatenated and read by a 1x1 conv."""
    rng = np.random.default_rng(4)
    inits = [nh.from_array(rng.standard_normal(s).astype(np.float32) * k, n)
             for n, s, k in (("w0", (16, 3, 3, 3), 0.4), ("w1", (16, 1, 3, 3), 0.5),
                             ("w2", (16, 16, 3, 3), 0.2), ("b2", (16,), 0.3),
                             ("w3", (24, 32, 1, 1), 0.2), ("b3", (24,), 0.2))]
    nodes = [h.make_node("Conv", ["x", "w0"], ["c0"], pads=[1, 1, 1, 1]),
             h.make_node("Relu", ["c0"], ["a0"]),
             h.make_node("Conv", ["a0", "w1"], ["d"], pads=[1, 1, 1, 1], strides=[2, 2],
                         group=16),
             h.make_node("Conv", ["d", "w2", "b2"], ["c2"], pads=[1, 1, 1, 1]),
             h.make_node("Relu", ["c2"], ["a2"]),
             h.make_node("Concat", ["d", "a2"], ["cat"], axis=1),
             h.make_node("Conv", ["cat", "w3", "b3"], ["c3"]),
             h.make_node("Relu", ["c3"], ["y"])]
    graph = h.make_graph(nodes, "g", [h.make_tensor_value_info("x", TensorProto.FLOAT, SHAPE)],
                         [h.make_tensor_value_info("y", TensorProto.FLOAT, [1, 24, 8, 8])],
                         inits)
    return h.make_model(graph, opset_imports=[h.make_opsetid("", 17)])


def test_concat_of_signed_and_unsigned_tensors_of_one_scale_runs_int8(tmp_path: Path) -> None:
    """NNCF gives a Concat's inputs one scale (unified scales), here two s8 tensors with zero
    point 0, one of them a ReLU's output, which the zero level writes as u8 (zero point 0):
    the Concat holds the other as u8 with zero point 128, so the 1x1 conv reading it sees
    per-channel zero points under one scale. It runs int8 with the
    zero points' correction (it ran in float32 before: HGNet-Tiny NNCF's aggregation convs),
    and every integer tensor is within 1 LSB of onnxruntime's QDQ evaluation (ties)."""
    rng = np.random.default_rng(1)
    calibration = [{"x": rng.standard_normal(SHAPE).astype(np.float32)} for _ in range(4)]
    model, _ = quantize(_aggregation_block(), calibration, "nncf")
    path = tmp_path / "aggregation.onnx"
    onnx.save(model, path)
    inits = {i.name: nh.to_array(i) for i in model.graph.initializer}
    producers = {o: n for n in model.graph.node for o in n.output}
    concat = next(n for n in model.graph.node if n.op_type == "Concat")
    dqs = [producers[i] for i in concat.input]
    assert all(dq.op_type == "DequantizeLinear" for dq in dqs)  # the premise
    assert len({float(inits[dq.input[1]]) for dq in dqs}) == 1
    assert all(inits[dq.input[2]].dtype == np.int8 and not inits[dq.input[2]].any()
               for dq in dqs)
    compiled = compile_model(str(path))
    kernels = compiled.inspect()["kernels"]
    aggregation = [k for k in kernels if k["primitive"] == "convolution"
                   and "binary_add(input 2)" in k["post_op_details"]]
    assert len(aggregation) == 1 and aggregation[0]["src_dtype"] == "u8", kernels
    assert not [k for k in kernels if k["primitive"] == "convolution"
                and k["src_dtype"] == "f32"], kernels
    x = {"x": np.random.default_rng(3).standard_normal(SHAPE).astype(np.float32)}
    check = check_op_by_op(str(path), x, compiled=compiled)
    assert len(check.ints) >= 4 and check.max_lsb <= 1, check.to_json()
