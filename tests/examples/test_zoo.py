"""The example model zoo: float models are valid and run, QDQ models look the way
onnxruntime.quantization.quantize_static writes them and stay close to the float models.

Models come from `zoo.model_path` (the on-disk cache, $QFUSE_CACHE or ~/.cache/qfuse/zoo), so
a rerun only loads files; building and quantizing all small models from scratch takes ~1 s.
"""

from __future__ import annotations

import functools

import numpy as np
import onnx
import pytest
from onnx import numpy_helper

from qfuse.examples import zoo
from qfuse.runtime.numerics import cosine
from tests.ort_int8 import qdq_session

OUTPUT_SHAPES = {
    "resnet": (1, 10),
    "mobilenetv2": (1, 10),
    "inception": (1, 10),
    "unet": (1, 2, 32, 32),
    "vgg": (1, 10),
    "shufflenet": (1, 10),
    "transformer": (1, 16, 64),
    "resnet50": (1, 1000),
}

# Cosine similarity float vs. QDQ (onnxruntime 1.31.1, CPU), min over 8 unseen inputs (seed 1):
# resnet 0.99936, mobilenetv2 0.99984, inception 0.99962, unet 0.99971, vgg 0.99539,
# shufflenet 0.99435, transformer 0.99885; resnet50 0.99983 (4 calibration images, 4 inputs).
MIN_COSINE = 0.99



@functools.cache
def models(name: str) -> tuple[onnx.ModelProto, onnx.ModelProto]:
    return onnx.load(zoo.model_path(name, quantized=False)), onnx.load(
        zoo.model_path(name, quantized=True)
    )


def run(model: onnx.ModelProto, feeds: list[dict[str, np.ndarray]]) -> list[np.ndarray]:
    """ORT's default session; where its int8 kernels saturate, the unoptimized one, so a QDQ
    model is measured as quantized, not as MLAS's int16 pair sums (tests/ort_int8.py)."""
    sess = qdq_session(model)
    return [sess.run(None, f)[0] for f in feeds]


def initializer(model: onnx.ModelProto, name: str) -> np.ndarray | None:
    for t in model.graph.initializer:
        if t.name == name:
            return numpy_helper.to_array(t)
    return None


def producers(model: onnx.ModelProto) -> dict[str, onnx.NodeProto]:
    return {o: n for n in model.graph.node for o in n.output}


def axis_of(node: onnx.NodeProto) -> int | None:
    return next((a.i for a in node.attribute if a.name == "axis"), None)


# ---------------------------------------------------------------- float models


def check_float(name: str) -> None:
    fm, _ = models(name)
    onnx.checker.check_model(fm, full_check=True)
    assert fm.doc_string, f"{name} has no docstring"
    (out,) = run(fm, zoo.sample_inputs(fm, 1, seed=1))
    assert out.shape == OUTPUT_SHAPES[name]
    assert np.isfinite(out).all() and np.abs(out).max() > 1e-3


@pytest.mark.parametrize("name", zoo.SMALL_ARCHITECTURES)
def test_float_model_is_valid_and_runs(name: str) -> None:
    check_float(name)


# ---------------------------------------------------------------- quantized structure


def check_qdq_structure(name: str) -> None:
    _, qm = models(name)
    onnx.checker.check_model(qm, full_check=True)
    ops = [n.op_type for n in qm.graph.node]
    assert "QuantizeLinear" in ops and "DequantizeLinear" in ops
    assert "BatchNormalization" not in ops  # folded by quant_pre_process
    prod = producers(qm)

    # u8 activations: every QuantizeLinear writes uint8.
    for n in qm.graph.node:
        if n.op_type == "QuantizeLinear":
            zp = initializer(qm, n.input[2])
            assert zp is not None and zp.dtype == np.uint8, n.name

    def dq_const(tensor: str) -> tuple[onnx.NodeProto, np.ndarray, np.ndarray, np.ndarray]:
        dq = prod[tensor]
        assert dq.op_type == "DequantizeLinear", f"{tensor} comes from {dq.op_type}"
        q, s, zp = (initializer(qm, t) for t in dq.input[:3])
        assert q is not None, f"{tensor}: DequantizeLinear input is not an initializer"
        return dq, q, s, zp

    weighted = [n for n in qm.graph.node if n.op_type in ("Conv", "ConvTranspose", "Gemm")]
    weighted += [  # MatMul with a constant B (only without pre-processing: it becomes Gemm)
        n
        for n in qm.graph.node
        if n.op_type == "MatMul"
        and n.input[1] in prod
        and initializer(qm, prod[n.input[1]].input[0]) is not None
    ]
    assert weighted
    for n in weighted:
        # Per-channel s8 weights: int8 initializer -> DequantizeLinear(axis), zero points 0.
        dq, w, w_scale, w_zp = dq_const(n.input[1])
        assert w.dtype == np.int8 and w_zp.dtype == np.int8 and not w_zp.any(), n.name
        axis = axis_of(dq)
        assert axis is not None and w_scale.ndim == 1 and w_scale.size == w.shape[axis] > 1, n.name
        if len(n.input) > 2 and n.input[2]:
            # int32 bias, scale = s_x * s_w per output channel, zero point 0.
            _, bias, b_scale, b_zp = dq_const(n.input[2])
            assert bias.dtype == np.int32 and b_zp.dtype == np.int32 and not b_zp.any(), n.name
            x_scale = initializer(qm, prod[n.input[0]].input[1])
            np.testing.assert_allclose(b_scale, x_scale * w_scale, rtol=1e-6)
        elif n.op_type == "Conv":
            pytest.fail(f"{n.name}: conv lost its bias (BN folding gives every conv one)")


@pytest.mark.parametrize("name", zoo.SMALL_ARCHITECTURES)
def test_quantized_model_is_qdq_u8_s8_per_channel(name: str) -> None:
    check_qdq_structure(name)


# ---------------------------------------------------------------- numerics


def check_close(name: str, n: int = 8) -> None:
    fm, qm = models(name)
    feeds = zoo.sample_inputs(fm, n, seed=1)  # calibration used seed 0: these are unseen
    cos = [cosine(a, b) for a, b in zip(run(fm, feeds), run(qm, feeds), strict=True)]
    assert min(cos) >= MIN_COSINE, f"{name}: cosine {min(cos):.5f}"


@pytest.mark.parametrize("name", zoo.SMALL_ARCHITECTURES)
def test_quantized_outputs_close_to_float(name: str) -> None:
    check_close(name)


@pytest.mark.parametrize("gelu", ["erf", "tanh"])
def test_transformer_decomposed_gelu(gelu: str) -> None:
    fm = zoo.float_model("transformer", gelu=gelu)
    assert fm.opset_import[0].version == 17
    ops = {n.op_type for n in fm.graph.node}
    assert ("Erf" if gelu == "erf" else "Tanh") in ops and "Gelu" not in ops
    qm = zoo.quantized_model("transformer", gelu=gelu)
    feeds = zoo.sample_inputs(fm, 4, seed=1)
    assert (
        min(cosine(a, b) for a, b in zip(run(fm, feeds), run(qm, feeds), strict=True)) >= MIN_COSINE
    )


def test_without_preprocessing_batchnorm_is_quantized() -> None:
    fm = zoo.float_model("resnet")
    qm = zoo.quantized_model("resnet", preprocess=False)
    assert sum(n.op_type == "BatchNormalization" for n in qm.graph.node) == 10
    feeds = zoo.sample_inputs(fm, 4, seed=1)
    assert (
        min(cosine(a, b) for a, b in zip(run(fm, feeds), run(qm, feeds), strict=True)) >= MIN_COSINE
    )


# ---------------------------------------------------------------- inputs and cache


def test_sample_inputs_are_deterministic_and_image_like() -> None:
    fm = zoo.float_model("resnet")
    a, b = zoo.sample_inputs(fm, 2, seed=3), zoo.sample_inputs(fm, 2, seed=3)
    c = zoo.sample_inputs(fm, 1, seed=4)
    np.testing.assert_array_equal(a[0]["input"], b[0]["input"])
    assert not np.array_equal(a[0]["input"], c[0]["input"])
    x = a[0]["input"]
    assert x.dtype == np.float32 and x.shape == (1, 3, 32, 32)
    assert -2.2 < x.min() < -1.0 and 1.5 < x.max() < 2.7  # ImageNet-normalised [0, 1] pixels


@pytest.mark.parametrize("quantized", [False, True])
def test_cache_returns_identical_bytes(tmp_path, quantized: bool) -> None:
    p1 = zoo.model_path("vgg", quantized, cache_dir=tmp_path / "a")
    stamp, data = p1.stat().st_mtime_ns, p1.read_bytes()
    p2 = zoo.model_path("vgg", quantized, cache_dir=tmp_path / "a")
    assert p2 == p1 and p2.stat().st_mtime_ns == stamp and p2.read_bytes() == data
    assert not list((tmp_path / "a").glob("*.tmp"))
    # Building again from scratch gives the same bytes: models are deterministic.
    assert zoo.model_path("vgg", quantized, cache_dir=tmp_path / "b").read_bytes() == data
    # Different parameters, different file.
    assert zoo.model_path("vgg", quantized, cache_dir=tmp_path / "a", seed=1) != p1


def test_unknown_model_name() -> None:
    with pytest.raises(ValueError, match="unknown zoo model 'alexnet'"):
        zoo.float_model("alexnet")


# ---------------------------------------------------------------- resnet50


@pytest.mark.slow
def test_resnet50() -> None:
    """ResNet-50 at 224x224: ~2 s to build, ~6 s to quantize (4 calibration images), cached."""
    check_float("resnet50")
    check_qdq_structure("resnet50")
    check_close("resnet50", n=2)
