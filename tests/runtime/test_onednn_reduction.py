"""The reduction and LRN primitives of the binding (f32) against numpy in float64.

Tolerances, stated once:
- max / min pick an element: 0.
- sum, mean, L1, L2, sum of squares, product: oneDNN accumulates in float32 in its own order,
  so |got - ref| <= 2·R·eps32·S, with S = Σ|term| the sum of the magnitudes of the R summands
  (Σ|x|, Σx², or |Πx| for the product) — the textbook bound of a float32 sum, a few ulps of
  the result on these inputs; a wrong algorithm or window is off by far more.
- LRN across channels: the window c ± (n-1)/2 (odd n), divisor n, k + alpha/n·Σx² raised to
  -beta in float32: relative 1e-6 (a few ulps) against the float64 evaluation.

Signatures are checked against the headers in test_onednn_enums.py (a wrong prototype
segfaults, so those checks run first in the suite's order).
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from qfuse.runtime.onednn import (
    LRN_ALGS,
    REDUCTION_ALGS,
    Alg,
    Arg,
    DataType,
    DnnlError,
    FormatTag,
    Memory,
    MemoryDesc,
    PrimitiveKind,
    lrn,
    reduction,
)

F32 = np.float32
EPS = float(np.finfo(F32).eps)
RNG = np.random.default_rng(11)
TAGS = {2: FormatTag.ab, 3: FormatTag.abc, 4: FormatTag.abcd}


def _reduce(alg: Alg, x: np.ndarray, axes: tuple[int, ...], p: float = 0.0,
            eps: float = 0.0) -> np.ndarray:
    kept = tuple(1 if i in axes else d for i, d in enumerate(x.shape))
    tag = TAGS[x.ndim]
    pd = reduction(alg, MemoryDesc.from_tag(x.shape, DataType.f32, tag),
                   MemoryDesc.from_tag(kept, DataType.f32, tag), p=p, eps=eps)
    assert pd.kind is PrimitiveKind.reduction
    assert set(pd.expected_args) == {Arg.SRC, Arg.DST} | (
        {Arg.SCRATCHPAD} if pd.scratchpad_md is not None else set())
    prim = pd.create()
    src, dst = Memory.from_array(np.ascontiguousarray(x)), Memory(pd.dst_md)
    prim.execute(prim.with_scratchpad({Arg.SRC: src, Arg.DST: dst}))
    return dst.read()


def _expected(alg: Alg, x: np.ndarray, axes: tuple[int, ...], p: float,
              eps: float) -> tuple[np.ndarray, np.ndarray]:
    """(value, S) in float64: the reduction and the magnitude sum bounding its rounding."""
    w = x.astype(np.float64)
    red = {"axis": axes, "keepdims": True}
    powered = np.abs(w) ** p if p else np.abs(w)
    if alg is Alg.reduction_max:
        return w.max(**red), np.zeros(1)
    if alg is Alg.reduction_min:
        return w.min(**red), np.zeros(1)
    if alg is Alg.reduction_sum:
        return w.sum(**red), np.abs(w).sum(**red)
    if alg is Alg.reduction_mean:
        return w.mean(**red), np.abs(w).mean(**red)
    if alg is Alg.reduction_mul:
        value = w.prod(**red)
        return value, np.abs(value)
    total = powered.sum(**red)
    if alg is Alg.reduction_norm_lp_sum:
        return (total + eps) ** (1 / p), (total + eps) ** (1 / p)
    if alg is Alg.reduction_norm_lp_max:
        return np.maximum(total, eps) ** (1 / p), np.maximum(total, eps) ** (1 / p)
    if alg is Alg.reduction_norm_lp_power_p_sum:
        return total + eps, total + eps
    assert alg is Alg.reduction_norm_lp_power_p_max
    return np.maximum(total, eps), np.maximum(total, eps)


CASES = [(Alg.reduction_max, 0.0, 0.0), (Alg.reduction_min, 0.0, 0.0),
         (Alg.reduction_sum, 0.0, 0.0), (Alg.reduction_mean, 0.0, 0.0),
         (Alg.reduction_mul, 0.0, 0.0),
         (Alg.reduction_norm_lp_sum, 1.0, 0.0), (Alg.reduction_norm_lp_sum, 2.0, 0.0),
         (Alg.reduction_norm_lp_sum, 2.0, 0.5), (Alg.reduction_norm_lp_max, 2.0, 1e3),
         (Alg.reduction_norm_lp_power_p_sum, 2.0, 0.0),
         (Alg.reduction_norm_lp_power_p_max, 3.0, 0.25)]
SHAPES = [((6, 40), (1,)), ((6, 40), (0,)), ((2, 5, 24), (2,)), ((2, 5, 24), (1,)),
          ((2, 5, 3, 4), (1, 3)), ((2, 5, 3, 4), (0, 1, 2, 3)), ((3, 17, 9), (1, 2))]


def test_every_reduction_algorithm_is_covered() -> None:
    assert {alg for alg, _, _ in CASES} == REDUCTION_ALGS


@pytest.mark.parametrize(("alg", "p", "eps"), CASES, ids=lambda v: getattr(v, "name", str(v)))
@pytest.mark.parametrize(("shape", "axes"), SHAPES, ids=str)
def test_reduction_matches_its_formula(alg: Alg, p: float, eps: float,
                                       shape: tuple[int, ...], axes: tuple[int, ...]) -> None:
    x = RNG.standard_normal(shape).astype(F32)
    if alg is Alg.reduction_mul:
        x = (1 + 0.1 * x).astype(F32)  # products near 1: no overflow or underflow
    got = _reduce(alg, x, axes, p, eps)
    want, magnitude = _expected(alg, x, axes, p, eps)
    count = int(np.prod([shape[a] for a in axes]))
    bound = 2 * count * EPS * magnitude
    assert got.shape == want.shape
    assert np.all(np.abs(got - want) <= bound), (np.abs(got - want) - bound).max()


def test_reduction_rejects_bad_descriptors() -> None:
    src = MemoryDesc.from_tag((4, 8), DataType.f32, FormatTag.ab)
    with pytest.raises(ValueError, match="not a reduction"):
        reduction(Alg.binary_add, src, MemoryDesc.from_tag((4, 1), DataType.f32, FormatTag.ab))
    with pytest.raises(ValueError, match="same rank"):
        reduction(Alg.reduction_sum, src, MemoryDesc.from_tag((4,), DataType.f32, FormatTag.a))
    with pytest.raises(DnnlError, match="invalid_arguments"):  # p < 1 is not a norm
        reduction(Alg.reduction_norm_lp_sum, src,
                  MemoryDesc.from_tag((4, 1), DataType.f32, FormatTag.ab), p=0.0)


def _lrn_expected(x: np.ndarray, n: int, alpha: float, beta: float, k: float,
                  across: bool) -> np.ndarray:
    w = x.astype(np.float64)
    half = (n - 1) // 2
    total = np.zeros_like(w)
    if across:
        for c in range(x.shape[1]):
            lo, hi = max(0, c - half), min(x.shape[1], c + half + 1)
            total[:, c] = np.square(w[:, lo:hi]).sum(axis=1)
        count = n
    else:
        h, wd = x.shape[2:]
        for i, j in itertools.product(range(h), range(wd)):
            window = w[:, :, max(0, i - half):i + half + 1, max(0, j - half):j + half + 1]
            total[:, :, i, j] = np.square(window).sum(axis=(2, 3))
        count = n * n
    return w * (k + alpha / count * total) ** -beta


@pytest.mark.parametrize("alg", sorted(LRN_ALGS), ids=lambda a: a.name)
@pytest.mark.parametrize(("channels", "size", "tag"),
                         [(16, 5, FormatTag.nchw), (16, 5, FormatTag.nhwc),
                          (5, 3, FormatTag.nchw), (7, 1, FormatTag.nhwc), (32, 7, FormatTag.nchw)],
                         ids=str)
def test_lrn_matches_its_formula(alg: Alg, channels: int, size: int, tag: FormatTag) -> None:
    x = (RNG.standard_normal((2, channels, 5, 6)) * 2).astype(F32)
    alpha, beta, k = 0.3, 0.75, 1.5
    md = MemoryDesc.from_tag(x.shape, DataType.f32, tag)
    pd = lrn(md, local_size=size, alpha=alpha, beta=beta, k=k, alg=alg)
    assert pd.kind is PrimitiveKind.lrn
    prim = pd.create()
    src, dst = Memory(md), Memory(md)
    src.write(x)
    prim.execute(prim.with_scratchpad({Arg.SRC: src, Arg.DST: dst}))
    want = _lrn_expected(x, size, alpha, beta, k, alg is Alg.lrn_across_channels)
    np.testing.assert_allclose(dst.read(), want, rtol=1e-6, atol=0)


def test_lrn_window_for_an_even_size_is_one_channel_short() -> None:
    """oneDNN's window is c ± (n-1)/2 for every n: with n = 4, three channels (c-1..c+1)
    divided by 4 — ONNX's LRN sums four (c-1..c+2), so the lowering keeps even sizes off it."""
    x = np.zeros((1, 6, 1, 1), F32)
    x[0, 3] = 2.0  # only channel 3 is non-zero: it enters c = 2..4 in oneDNN, 1..4 in ONNX
    md = MemoryDesc.from_tag(x.shape, DataType.f32, FormatTag.nchw)
    prim = lrn(md, local_size=4, alpha=4.0, beta=1.0, k=1.0).create()
    src, dst = Memory(md), Memory(md)
    src.write(x + np.ones_like(x))  # every channel 1, channel 3 is 3
    prim.execute(prim.with_scratchpad({Arg.SRC: src, Arg.DST: dst}))
    y = dst.read().ravel()
    # channel 2 sums 1 + 1 + 9 over c=1..3, channel 1 sums c=0..2: 3 (channel 3 not in it)
    np.testing.assert_allclose(y[1], 1 / (1 + 4 / 4 * 3), rtol=1e-6)
    np.testing.assert_allclose(y[2], 1 / (1 + 4 / 4 * 11), rtol=1e-6)


def test_lrn_rejects_bad_arguments() -> None:
    md = MemoryDesc.from_tag((1, 8, 4, 4), DataType.f32, FormatTag.nchw)
    with pytest.raises(ValueError, match="not an LRN"):
        lrn(md, local_size=3, alpha=1e-4, beta=0.75, k=1.0, alg=Alg.reduction_sum)
    with pytest.raises(ValueError, match="local_size"):
        lrn(md, local_size=0, alpha=1e-4, beta=0.75, k=1.0)
