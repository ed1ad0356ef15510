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
from onnx import numpy_helper as nh

from qfuse import compile_model
from qfuse.compiler.op_check import check_op_by_op
from qfuse.examples.realzoo.quantize import quantize
from tests.examples.test_quantize_variants import SHAPE, float_block


@pytest.fixture(scope="module")
def mixed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The MobileNetV3-like block without its residual (HardSwish outputs are signed, so
    MIXED quantizes them asymmetrically, the depthwise input per channel) quantized by NNCF with ``preset=MIXED`` (the zoo's ``nncf-mixed``)."""
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
