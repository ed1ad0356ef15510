"""``--emulate tflite`` against an independent per-element implementation in Python ints.

The implementation here follows TFLite's C++ line by line with Python's unbounded ints (C
division and shifts spelled out), not runtime.numerics: QuantizeMultiplier (frexp, std::round),
SaturatingRoundingDoublingHighMul, RoundingDivideByPOT, the single-rounding multiply of
TFLITE_SINGLE_ROUNDING, the conv accumulator by nested loops, the add of kernels/add.cc and the
MEAN of reference_ops. QUANTIZED_OP.md's table picks D1 / D2 / F2 per conv kind and weight
quantization. Tolerance: 0 LSB.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from qfuse.compiler.api import import_graph
from qfuse.runtime.emulate import emulate, plan
from tests.runtime.emulate_models import ConvCase, qdq_add, qdq_conv

INT32_MIN, INT32_MAX = -(2**31), 2**31 - 1

# SNPS-Caffe QUANTIZED_OP.md: (per_channel, kind) -> variant.
SEED_001 = {
    (False, "regular"): "D2", (False, "depthwise"): "F2", (False, "pointwise"): "F2",
    (True, "regular"): "D1", (True, "depthwise"): "D2", (True, "pointwise"): "D1",
}


def quantize_multiplier(real: float) -> tuple[int, int]:
    if real == 0:
        return 0, 0
    frac, shift = math.frexp(real)
    q = math.floor(frac * 2**31 + 0.5)  # std::round of a positive value (exact: frac*2^31)
    if q == 2**31:
        q, shift = q // 2, shift + 1
    if shift < -31:
        return 0, 0
    if shift > 30:
        return INT32_MAX, 30
    return q, shift


def c_div(a: int, b: int) -> int:
    """C integer division (truncates toward zero)."""
    q = abs(a) // abs(b)
    return q if (a >= 0) == (b > 0) else -q


def srdhm(a: int, b: int) -> int:
    if a == b == INT32_MIN:
        return INT32_MAX
    ab = a * b
    nudge = (1 << 30) if ab >= 0 else 1 - (1 << 30)
    return c_div(ab + nudge, 1 << 31)


def rounding_divide_by_pot(x: int, exponent: int) -> int:
    mask = (1 << exponent) - 1
    remainder = x & mask
    threshold = (mask >> 1) + (1 if x < 0 else 0)
    return (x >> exponent) + (1 if remainder > threshold else 0)


def wrap32(x: int) -> int:
    return ((x + 2**31) % 2**32) - 2**31


def mbqm(x: int, q: int, shift: int, single: bool = False) -> int:
    if single:
        total = 31 - shift
        return max(INT32_MIN, min(INT32_MAX, (x * q + (1 << (total - 1))) >> total))
    left, right = max(shift, 0), max(-shift, 0)
    return rounding_divide_by_pot(srdhm(wrap32(x * (1 << left)), q), right)


def conv_reference(case: ConvCase, model_inits: dict[str, np.ndarray], x: np.ndarray
                   ) -> np.ndarray:
    """The whole TFLite conv, per output element, in Python ints."""
    w, b = model_inits["w"].astype(int), model_inits["b"].astype(int)
    xs, xzp = float(model_inits["xs"]), int(model_inits["xzp"])
    ws = np.broadcast_to(model_inits["ws"], (case.cout,))
    ys, yzp = float(model_inits["ys"]), int(model_inits["yzp"])
    kind = ("depthwise" if case.group > 1 and case.group == case.cin == case.cout
            else "pointwise" if case.k == 1 and case.group == 1 else "regular")
    variant = SEED_001[(case.per_channel, kind)]
    _, cin, h, wd = x.shape
    oh = (h + 2 * case.pad - case.k) // case.stride + 1
    ow = (wd + 2 * case.pad - case.k) // case.stride + 1
    cg, mg = cin // case.group, case.cout // case.group
    out = np.zeros((1, case.cout, oh, ow), dtype=np.uint8)
    for oc in range(case.cout):
        if variant.startswith("D"):
            real = xs * float(ws[oc]) / ys  # doubles from the float32 scales
        else:
            real = float(np.float32(np.float32(xs) * ws[oc]) / np.float32(ys))
        q, shift = quantize_multiplier(real)
        g = oc // mg
        for i in range(oh):
            for j in range(ow):
                acc = 0
                for c in range(cg):
                    for di in range(case.k):
                        for dj in range(case.k):
                            yy, xx = i * case.stride + di - case.pad, j * case.stride + dj - case.pad
                            if 0 <= yy < h and 0 <= xx < wd:
                                acc += (int(x[0, g * cg + c, yy, xx]) - xzp) * int(w[oc, c, di, dj])
                acc = wrap32(acc + int(b[oc]))
                y = mbqm(acc, q, shift, single=variant == "D1") + yzp
                out[0, oc, i, j] = min(255, max(0, y))
    return out


def _inits(model) -> dict[str, np.ndarray]:
    from onnx import numpy_helper

    return {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}


TFLITE_CASES = {
    "regular_per_channel_D1": ConvCase(4, 6, 3, pad=1),
    "regular_per_tensor_D2": ConvCase(4, 6, 3, pad=1, per_channel=False),
    "depthwise_per_channel_D2": ConvCase(6, 6, 3, group=6, pad=1),
    "depthwise_per_tensor_F2": ConvCase(6, 6, 3, group=6, pad=1, per_channel=False),
    "pointwise_per_channel_D1": ConvCase(8, 5, 1),
    "pointwise_per_tensor_F2": ConvCase(8, 5, 1, per_channel=False),
    "strided_regular": ConvCase(3, 4, 3, pad=1, stride=2),
}


@pytest.mark.parametrize("case", sorted(TFLITE_CASES))
def test_conv_matches_python_ints(case: str) -> None:
    spec = TFLITE_CASES[case]
    model, feeds = qdq_conv(spec, seed=3, hw=(6, 7))
    graph = import_graph(model)
    (decision,) = plan(graph, "tflite")
    assert decision.integer
    assert decision.how.split()[1] == case.split("_")[-1] or case == "strided_regular"
    got = emulate(graph, feeds, "tflite")["y"]
    want = conv_reference(spec, _inits(model), feeds["xq"])
    assert np.array_equal(got, want), f"{int((got != want).sum())} of {got.size} differ"


def test_d2_within_one_lsb_of_onnxruntime() -> None:
    """TFLite's double rounding (D2) moves results by at most 1 LSB from a single rounding."""
    spec = ConvCase(16, 16, 3, pad=1, per_channel=False)
    model, feeds = qdq_conv(spec, seed=5, hw=(12, 12))
    d2 = emulate(import_graph(model), feeds, "tflite")["y"]
    d1 = emulate(import_graph(model), feeds, "onnxruntime")["y"]
    assert np.abs(d2.astype(int) - d1.astype(int)).max() <= 1


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_add_matches_python_ints(seed: int) -> None:
    model, feeds = qdq_add(seed, shape=(1, 3, 5, 7))
    p = _inits(model)
    sa, sb, sy = (float(p[n]) for n in ("sa", "sb", "sy"))
    za, zb, zy = (int(p[n]) for n in ("za", "zb", "zy"))
    twice = 2 * max(sa, sb)
    qa, qb = quantize_multiplier(sa / twice), quantize_multiplier(sb / twice)
    qy = quantize_multiplier(twice / ((1 << 20) * sy))
    want = np.zeros(feeds["a"].shape, np.uint8)
    for idx in np.ndindex(*want.shape):
        a = (int(feeds["a"][idx]) - za) * (1 << 20)
        b = (int(feeds["b"][idx]) - zb) * (1 << 20)
        raw = mbqm(a, *qa) + mbqm(b, *qb)
        want[idx] = min(255, max(0, mbqm(raw, *qy) + zy))
    got = emulate(import_graph(model), feeds, "tflite")["y"]
    assert np.array_equal(got, want)


def test_mean_matches_python_ints() -> None:
    """GlobalAveragePool = TFLite MEAN over H, W (reference_ops::Mean, uint8)."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(4)
    x = rng.integers(0, 256, (1, 5, 6, 7)).astype(np.uint8)
    xs, xz, ys, yz = np.float32(0.031), np.uint8(117), np.float32(0.0123), np.uint8(9)
    inits = [numpy_helper.from_array(np.asarray(v), n)
             for n, v in [("xs", xs), ("xz", xz), ("ys", ys), ("yz", yz)]]
    nodes = [helper.make_node("DequantizeLinear", ["x", "xs", "xz"], ["xf"]),
             helper.make_node("GlobalAveragePool", ["xf"], ["pf"]),
             helper.make_node("QuantizeLinear", ["pf", "ys", "yz"], ["y"])]
    graph = helper.make_graph(nodes, "gap", [helper.make_tensor_value_info(
        "x", TensorProto.UINT8, list(x.shape))], [helper.make_tensor_value_info(
            "y", TensorProto.UINT8, None)], inits)
    model = onnx.shape_inference.infer_shapes(
        helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=8))
    n = np.float32(6 * 7)
    temp = np.float32(np.float32(np.float32(int(xz)) * xs) / ys)
    temp = np.float32(temp + np.float32(0.5)) if temp > 0 else np.float32(temp - np.float32(0.5))
    bias = int(yz) - int(temp)
    q, shift = quantize_multiplier(float(np.float32(xs / np.float32(n * ys))))
    want = np.zeros((1, 5, 1, 1), np.uint8)
    for c in range(5):
        acc = int(x[0, c].astype(int).sum())
        want[0, c, 0, 0] = min(255, max(0, mbqm(acc, q, shift) + bias))
    got = emulate(import_graph(model), {"x": x}, "tflite")["y"]
    assert np.array_equal(got, want)
