"""runtime/reference/fused.py: the graph-level meaning of a node that carries ``Fused``.

Checked against independent brute-force loops: the zero point is subtracted before padding
(a tensor equal to its zero point gives acc = 0 everywhere, borders included), the
accumulator is exact, the chain follows, integer outputs saturate, residuals read by port.
"""

from __future__ import annotations

import numpy as np

from qfuse.ir import DType, Graph, Op, TensorInfo
from qfuse.ir.chain import Fused, Residual, Scale, Shift
from qfuse.ir.ops import ConvAttrs, NoAttrs, PoolAttrs
from qfuse.runtime.reference.fused import evaluate_fused

RNG = np.random.default_rng(2)


def _node(op, attrs, inputs, out_info, fused):
    g = Graph("f")
    for i, name in enumerate(inputs):
        g.add_input(name, TensorInfo((1,) * (i + 1), DType.U8))
    node = g.add_node(op, inputs, ["y"], attrs, infos=[out_info])
    node.fused = fused
    return g, node


def _brute_conv(x: np.ndarray, w: np.ndarray, pad: int) -> np.ndarray:
    n, _, h, wd = x.shape
    m, _, k, _ = w.shape
    xp = np.pad(x, ((0, 0), (0, 0), (pad, pad), (pad, pad)))
    out = np.zeros((n, m, h + 2 * pad - k + 1, wd + 2 * pad - k + 1), np.int64)
    for o in range(m):
        for i in range(out.shape[2]):
            for j in range(out.shape[3]):
                out[:, o, i, j] = (xp[:, :, i:i + k, j:j + k] * w[o]).sum(axis=(1, 2, 3))
    return out


def test_conv_zero_point_before_padding_and_exact_accumulator():
    x = RNG.integers(0, 256, (1, 3, 5, 5)).astype(np.uint8)
    w = RNG.integers(-128, 128, (4, 3, 3, 3)).astype(np.int8)
    scale = np.linspace(0.5, 2.0, 4).astype(np.float32)
    fused = Fused(chain=[Scale.of(scale), Shift.of(0.25)], src_zero_point=77)
    g, node = _node(Op.CONV, ConvAttrs((3, 3), (1, 1), (1, 1, 1, 1), (1, 1)), ["x", "w"],
                    TensorInfo((1, 4, 5, 5), DType.F32), fused)
    y = evaluate_fused(node, [x, w], g)[0]
    acc = _brute_conv(x.astype(np.int64) - 77, w.astype(np.int64), 1)
    want = (acc.astype(np.float32) * scale.reshape(1, 4, 1, 1)) + np.float32(0.25)
    np.testing.assert_array_equal(y, want.astype(np.float32))
    flat = evaluate_fused(node, [np.full_like(x, 77), w], g)[0]
    assert np.all(flat == np.float32(0.25))  # padding taps are the real 0 too


def test_matmul_weight_zero_point_residual_and_saturation():
    a = RNG.integers(0, 256, (2, 3, 4)).astype(np.uint8)
    b = RNG.integers(0, 256, (2, 4, 5)).astype(np.uint8)
    r = RNG.integers(-128, 128, (2, 3, 5)).astype(np.int8)
    fused = Fused(chain=[Scale.of(0.01), Residual(2, 0.5, 3, DType.S8)], src_zero_point=128,
                  wei_zero_point=120)
    g, node = _node(Op.MATMUL, NoAttrs(), ["a", "b", "r"], TensorInfo((2, 3, 5), DType.U8),
                    fused)
    y = evaluate_fused(node, [a, b, r], g)[0]
    acc = np.matmul(a.astype(np.int64) - 128, b.astype(np.int64) - 120)
    x = acc.astype(np.float32) * np.float32(0.01)
    x = x + np.float32(0.5) * (r.astype(np.float32) - np.float32(3))
    np.testing.assert_array_equal(y, np.clip(np.rint(x), 0, 255).astype(np.uint8))
    assert y.dtype == np.uint8


def test_average_pool_on_shifted_integers():
    x = RNG.integers(0, 256, (1, 2, 4, 4)).astype(np.uint8)
    attrs = PoolAttrs((2, 2), (2, 2), (0, 0, 0, 0), (1, 1))
    fused = Fused(chain=[Scale.of(0.1)], src_zero_point=10)
    g, node = _node(Op.AVG_POOL, attrs, ["x"], TensorInfo((1, 2, 2, 2), DType.F32), fused)
    y = evaluate_fused(node, [x], g)[0]
    shifted = x.astype(np.float64) - 10
    avg = shifted.reshape(1, 2, 2, 2, 2, 2).mean(axis=(3, 5)).astype(np.float32)
    np.testing.assert_array_equal(y, avg * np.float32(0.1))
