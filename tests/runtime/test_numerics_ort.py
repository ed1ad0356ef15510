"""ONNX Runtime's requantization, bit-exact against onnxruntime itself.

Each case builds a one-node ONNX model (QLinearConv or QLinearMatMul), runs it with
onnxruntime's default session options, and compares every output element with
``requantize(acc, scheme=ONNXRUNTIME, ...)`` where ``acc`` is the exact integer accumulation done
here in int64. Tolerance: 0 LSB (100% identical).

Weights are drawn from [-64, 63] where the weight zero point is 0: that keeps every pair of
u8 x s8 products inside int16, so the result does not depend on whether the CPU has VNNI (on
AVX2 without VNNI, MLAS's vpmaddubsw saturates pairs in int16 and the accumulator itself would
differ from the exact sum; that is an accumulation effect, not a requantization one).
"""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from qfuse.runtime.numerics import Scheme, requantize

_NP_TO_ONNX = {
    np.dtype(np.uint8): TensorProto.UINT8,
    np.dtype(np.int8): TensorProto.INT8,
    np.dtype(np.int32): TensorProto.INT32,
    np.dtype(np.float32): TensorProto.FLOAT,
}


def _session(nodes, inputs, outputs, inits):
    graph = helper.make_graph(nodes, "g", inputs, outputs, inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=8)
    return ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])


def _conv_acc(x, xzp, w, wzp, group, pad):
    """Exact int64 grouped conv (stride 1) of (x - xzp) and (w - wzp), NCHW / OIHW."""
    xs = np.pad(x.astype(np.int64) - xzp, ((0, 0), (0, 0), (pad, pad), (pad, pad)))
    ws = w.astype(np.int64) - wzp
    n, _, h, wd = xs.shape
    m, cg, kh, kw = ws.shape
    oh, ow = h - kh + 1, wd - kw + 1
    mg = m // group
    out = np.zeros((n, m, oh, ow), dtype=np.int64)
    for g in range(group):
        xg = xs[:, g * cg : (g + 1) * cg]
        wg = ws[g * mg : (g + 1) * mg]
        for i in range(kh):
            for j in range(kw):
                patch = xg[:, :, i : i + oh, j : j + ow]
                out[:, g * mg : (g + 1) * mg] += np.einsum("nchw,mc->nmhw", patch, wg[:, :, i, j])
    return out


CONV_CASES = {
    # name: (channels in, channels out, kernel, group, pad, weight dtype, weight zero point)
    "regular_3x3": (8, 16, 3, 1, 1, np.int8, 0),
    "pointwise_1x1": (16, 24, 1, 1, 0, np.int8, 0),
    "depthwise_3x3": (16, 16, 3, 16, 1, np.int8, 0),
    "grouped_3x3": (8, 8, 3, 2, 1, np.int8, 0),
    "u8_weights_zp": (8, 12, 3, 1, 1, np.uint8, 131),
}


@pytest.mark.parametrize("case", sorted(CONV_CASES))
@pytest.mark.parametrize("seed", [0, 1])
def test_qlinearconv_bit_exact(case: str, seed: int) -> None:
    cin, cout, k, group, pad, wdt, wzp_value = CONV_CASES[case]
    rng = np.random.default_rng(seed)
    x = rng.integers(0, 256, size=(2, cin, 9, 11), dtype=np.uint8)
    if wdt == np.int8:
        w = rng.integers(-64, 64, size=(cout, cin // group, k, k)).astype(np.int8)
    else:
        w = rng.integers(0, 256, size=(cout, cin // group, k, k)).astype(np.uint8)
    xzp = np.uint8(rng.integers(0, 256))
    x_scale = np.float32(rng.uniform(0.002, 0.05))
    w_scale = rng.uniform(0.001, 0.02, size=cout).astype(np.float32)
    wzp = np.full(cout, wzp_value, dtype=wdt)
    acc = _conv_acc(x, int(xzp), w, wzp.astype(np.int64)[:, None, None, None], group, pad)
    spread = int(acc.std()) + 1
    bias = rng.integers(-spread, spread, size=cout).astype(np.int32)
    # Output scale and zero point that centre the results in u8 (about +-2 sigma), so both
    # saturation ends and most levels occur.
    real = (acc + bias[None, :, None, None]) * (x_scale * w_scale[None, :, None, None])
    y_scale = np.float32(real.std() / 64.0)
    yzp = np.uint8(np.clip(np.rint(128 - real.mean() / y_scale), 0, 255))

    inits = [
        numpy_helper.from_array(np.array(x_scale), "xs"),
        numpy_helper.from_array(np.array(xzp), "xzp"),
        numpy_helper.from_array(w, "w"),
        numpy_helper.from_array(w_scale, "ws"),
        numpy_helper.from_array(wzp, "wzp"),
        numpy_helper.from_array(np.array(y_scale), "ys"),
        numpy_helper.from_array(np.array(yzp), "yzp"),
        numpy_helper.from_array(bias, "b"),
    ]
    node = helper.make_node(
        "QLinearConv",
        ["x", "xs", "xzp", "w", "ws", "wzp", "ys", "yzp", "b"],
        ["y"],
        group=group,
        pads=[pad] * 4,
        kernel_shape=[k, k],
    )
    sess = _session(
        [node],
        [helper.make_tensor_value_info("x", TensorProto.UINT8, list(x.shape))],
        [helper.make_tensor_value_info("y", TensorProto.UINT8, None)],
        inits,
    )
    got = sess.run(None, {"x": x})[0]
    want = requantize(
        acc,
        scheme=Scheme.ONNXRUNTIME,
        s_in=x_scale,
        s_w=w_scale,
        s_out=y_scale,
        zp_out=int(yzp),
        dtype=np.uint8,
        bias=bias,
        axis=1,
    )
    assert got.dtype == want.dtype == np.uint8
    assert got.shape == want.shape
    # The data must exercise the interesting parts: saturation at both ends and many levels.
    assert (want == 0).any() and (want == 255).any() and len(np.unique(want)) > 100
    mismatch = got != want
    assert not mismatch.any(), (
        f"{int(mismatch.sum())} of {got.size} elements differ, e.g. at "
        f"{np.argwhere(mismatch)[0]}: ort {got[mismatch][0]} vs ours {want[mismatch][0]}"
    )


@pytest.mark.parametrize("out_dtype", [np.uint8, np.int8])
@pytest.mark.parametrize("per_column", [False, True])
def test_qlinearmatmul_bit_exact(out_dtype: type, per_column: bool) -> None:
    rng = np.random.default_rng(7)
    signed = out_dtype == np.int8
    m, kdim, n = 37, 64, 29
    if signed:
        a = rng.integers(-128, 128, size=(m, kdim)).astype(np.int8)
        azp = np.int8(rng.integers(-20, 20))
    else:
        a = rng.integers(0, 256, size=(m, kdim)).astype(np.uint8)
        azp = np.uint8(rng.integers(0, 256))
    b = rng.integers(-64, 64, size=(kdim, n)).astype(np.int8)
    a_scale = np.float32(0.0173)
    b_scale = (
        rng.uniform(0.002, 0.03, size=n).astype(np.float32) if per_column else np.float32(0.0119)
    )
    bzp = np.zeros(n, np.int8) if per_column else np.int8(0)
    acc = (a.astype(np.int64) - int(azp)) @ b.astype(np.int64)
    y_scale = np.float32(np.std(acc * a_scale * b_scale) / 40.0)
    yzp = out_dtype(rng.integers(-30, 30) if signed else rng.integers(80, 180))
    inits = [
        numpy_helper.from_array(np.array(a_scale), "as"),
        numpy_helper.from_array(np.array(azp), "azp"),
        numpy_helper.from_array(b, "b"),
        numpy_helper.from_array(np.asarray(b_scale), "bs"),
        numpy_helper.from_array(np.asarray(bzp), "bzp"),
        numpy_helper.from_array(np.array(y_scale), "ys"),
        numpy_helper.from_array(np.array(yzp), "yzp"),
    ]
    node = helper.make_node(
        "QLinearMatMul", ["a", "as", "azp", "b", "bs", "bzp", "ys", "yzp"], ["y"]
    )
    ot = _NP_TO_ONNX[np.dtype(out_dtype)]
    sess = _session(
        [node],
        [helper.make_tensor_value_info("a", ot, [m, kdim])],
        [helper.make_tensor_value_info("y", ot, None)],
        inits,
    )
    got = sess.run(None, {"a": a})[0]
    want = requantize(
        acc,
        scheme=Scheme.ONNXRUNTIME,
        s_in=a_scale,
        s_w=b_scale,
        s_out=y_scale,
        zp_out=int(yzp),
        dtype=out_dtype,
        axis=-1,
    )
    assert got.dtype == want.dtype
    np.testing.assert_array_equal(got, want)


def _products_session(a_scale, b_scale, y_scale, yzp, out_dtype):
    """QLinearMatMul of a (256, 1) u8 column 0..255 by a (1, 256) s8 row -128..127: the
    accumulator grid is every product a * b, 65536 values in [-32640, 32385]."""
    a = np.arange(256, dtype=np.uint8).reshape(256, 1)
    b = np.arange(-128, 128, dtype=np.int8).reshape(1, 256)
    inits = [
        numpy_helper.from_array(np.array(np.float32(a_scale)), "as"),
        numpy_helper.from_array(np.array(np.uint8(0)), "azp"),
        numpy_helper.from_array(b, "b"),
        numpy_helper.from_array(np.array(np.float32(b_scale)), "bs"),
        numpy_helper.from_array(np.array(np.int8(0)), "bzp"),
        numpy_helper.from_array(np.array(np.float32(y_scale)), "ys"),
        numpy_helper.from_array(np.array(out_dtype(yzp)), "yzp"),
    ]
    node = helper.make_node(
        "QLinearMatMul", ["a", "as", "azp", "b", "bs", "bzp", "ys", "yzp"], ["y"]
    )
    ot = _NP_TO_ONNX[np.dtype(out_dtype)]
    sess = _session(
        [node],
        [helper.make_tensor_value_info("a", TensorProto.UINT8, [256, 1])],
        [helper.make_tensor_value_info("y", ot, None)],
        inits,
    )
    acc = a.astype(np.int64) @ b.astype(np.int64)
    return sess.run(None, {"a": a})[0], acc


def test_ties_round_half_to_even() -> None:
    """Scale exactly 1/2: every odd accumulator is a tie. ORT rounds ties to even."""
    got, acc = _products_session(0.5, 1.0, 256.0, 128, np.uint8)
    # acc * 0.5 / 256 = acc / 512; ties at acc = 256 mod 512 (e.g. 256 -> 0.5 -> 0 -> 128).
    kw = {"s_in": 0.5, "s_w": 1.0, "s_out": 256.0, "zp_out": 128, "dtype": np.uint8}
    want = requantize(acc, scheme=Scheme.ONNXRUNTIME, **kw)
    np.testing.assert_array_equal(got, want)
    ties = (acc % 512) == 256
    assert ties.sum() > 100
    assert (got[ties] % 2 == 0).all()  # even neighbours only (zero point 128 is even)
    away = requantize(acc, scheme=Scheme.TFLITE_D2, **kw)
    assert (away != got)[ties].any()  # half away from zero differs on half the ties


def _variant(kind: str, acc, s_in, s_w, s_out, zp, lo, hi):
    """Plausible alternatives to ORT's arithmetic that round some accumulators differently."""
    a, w, o = np.float32(s_in), np.float32(s_w), np.float32(s_out)
    if kind == "float64":  # scale and product in double
        v = acc * (float(a) * float(w) / float(o))
    else:  # "s_in * (s_w / s_out)": the same float32 operations in another order
        v = acc.astype(np.float32) * (a * (w / o))
    return np.clip(np.rint(v) + zp, lo, hi)


@pytest.mark.parametrize("kind", ["float64", "reordered"])
def test_float32_scale_arithmetic_is_what_ort_does(kind: str) -> None:
    """Pick output scales where an alternative arithmetic rounds some of the 65536 products
    differently; ORT must agree with ``requantize(ONNXRUNTIME)`` on all of them."""
    rng = np.random.default_rng(11)
    a_scale, b_scale = np.float32(0.0123), np.float32(0.0457)
    acc = np.arange(256, dtype=np.int64)[:, None] * np.arange(-128, 128, dtype=np.int64)[None, :]
    checked = 0
    for _ in range(3000):
        y_scale = np.float32(rng.uniform(1.0, 4.0) * a_scale * b_scale * 32640 / 127)
        ours = requantize(
            acc,
            scheme=Scheme.ONNXRUNTIME,
            s_in=a_scale,
            s_w=b_scale,
            s_out=y_scale,
            zp_out=128,
            dtype=np.uint8,
        )
        other = _variant(kind, acc, a_scale, b_scale, y_scale, 128, 0, 255)
        if not (ours != other).any():
            continue
        got, acc_ort = _products_session(a_scale, b_scale, y_scale, 128, np.uint8)
        np.testing.assert_array_equal(acc_ort, acc)
        np.testing.assert_array_equal(got, ours)
        assert (got != other).any()
        checked += 1
        if checked == 3:
            break
    assert checked == 3, f"no output scale separated the {kind} arithmetic from float32"
