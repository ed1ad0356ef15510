"""The resampling primitive of the binding (f32, u8, s8; nearest and linear) against numpy.

The numpy side is runtime/onednn/reference.py's model of oneDNN (its module docstring).
Tolerances, stated once:
- nearest copies elements: 0, for every data type and layout (the source index model is what
  compiler/lower/lower_resize.py relies on to decide which Resize nodes oneDNN computes).
- linear f32: |got - ref| <= 4 ulps of max(|x|) per output, ref the float64 evaluation of
  oneDNN's weights (its own float32 evaluation order differs by up to ~2 ulps; a wrong index or
  weight is off by far more).
- linear u8 / s8: the f32 value is rounded half to even on store, so |got - ref| <= 0.5 plus
  that float32 slack (1e-3).

The module runs again under ONEDNN_MAX_CPU_ISA=AVX2 (jit:avx2 instead of jit:avx512_core_fp16):
same results.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from qfuse.runtime.onednn import (
    RESAMPLING_ALGS,
    Alg,
    Arg,
    DataType,
    DnnlError,
    FormatTag,
    Memory,
    MemoryDesc,
    PrimitiveDesc,
    resampling,
)
from qfuse.runtime.onednn import reference as ref

F32 = np.float32
RNG = np.random.default_rng(7)
TYPES = {DataType.f32: F32, DataType.u8: np.uint8, DataType.s8: np.int8}
TAGS = {3: (FormatTag.ncw, FormatTag.nwc), 4: (FormatTag.nchw, FormatTag.nhwc),
        5: (FormatTag.ncdhw, FormatTag.ndhwc)}


def _data(shape: tuple[int, ...], dt: DataType) -> np.ndarray:
    if dt == DataType.f32:
        return RNG.standard_normal(shape).astype(F32)
    lo, hi = (0, 256) if dt == DataType.u8 else (-128, 128)
    return RNG.integers(lo, hi, shape).astype(TYPES[dt])


def run(alg: Alg, x: np.ndarray, out: tuple[int, ...], dt: DataType,
        tag: FormatTag) -> tuple[np.ndarray, PrimitiveDesc]:
    """Resample x {N, C, spatial...} to spatial dims ``out`` with both sides in ``tag``."""
    dst_dims = (*x.shape[:2], *out)
    pd = resampling(alg, MemoryDesc.from_tag(x.shape, dt, tag),
                    MemoryDesc.from_tag(dst_dims, dt, tag))
    assert pd.src_md is not None and pd.dst_md is not None
    primitive = pd.create()
    src, dst = Memory(pd.src_md), Memory(pd.dst_md)
    src.write(x)
    primitive.execute(primitive.with_scratchpad({Arg.SRC: src, Arg.DST: dst}))
    return dst.read(), pd


def test_algorithms_are_the_resampling_ones() -> None:
    assert RESAMPLING_ALGS == {Alg.resampling_nearest, Alg.resampling_linear}
    with pytest.raises(ValueError, match="not a resampling algorithm"):
        resampling(Alg.eltwise_relu, MemoryDesc.from_tag((1, 1, 4), DataType.f32, FormatTag.ncw),
                   MemoryDesc.from_tag((1, 1, 8), DataType.f32, FormatTag.ncw))


@pytest.mark.parametrize("size", [1, 2, 3, 5, 8, 13, 16, 31, 64])
def test_nearest_index_model_every_output_size(size: int) -> None:
    """The source index of every (in, out) pair up to 4·in + 3, read back from an iota."""
    x = np.arange(size, dtype=F32).reshape(1, 1, size)
    for out in range(1, 4 * size + 4):
        got, _ = run(Alg.resampling_nearest, x, (out,), DataType.f32, FormatTag.ncw)
        np.testing.assert_array_equal(got.ravel().astype(np.int64),
                                      ref.resampling_nearest_index(size, out), f"{size}→{out}")


GEOMETRIES = [((2, 19, 8, 8), (16, 16)), ((1, 32, 5, 7), (11, 20)), ((1, 16, 10, 10), (5, 7)),
              ((2, 8, 9), (27,)), ((1, 5, 3, 4, 6), (6, 8, 12)), ((1, 3, 16, 16), (32, 32))]


@pytest.mark.parametrize("dt", list(TYPES), ids=lambda d: d.name)
@pytest.mark.parametrize("channels_last", [False, True], ids=["plain", "channels_last"])
@pytest.mark.parametrize("shape,out", GEOMETRIES)
def test_nearest_is_exact(shape: tuple[int, ...], out: tuple[int, ...], dt: DataType,
                          channels_last: bool) -> None:
    x = _data(shape, dt)
    got, pd = run(Alg.resampling_nearest, x, out, dt, TAGS[len(shape)][channels_last])
    np.testing.assert_array_equal(got, ref.resampling(x, out, linear=False))
    assert not pd.impl_name.startswith("ref"), pd.impl_name


@pytest.mark.parametrize("dt", list(TYPES), ids=lambda d: d.name)
@pytest.mark.parametrize("channels_last", [False, True], ids=["plain", "channels_last"])
@pytest.mark.parametrize("shape,out", GEOMETRIES)
def test_linear_within_stated_bound(shape: tuple[int, ...], out: tuple[int, ...], dt: DataType,
                                    channels_last: bool) -> None:
    x = _data(shape, dt)
    got, _ = run(Alg.resampling_linear, x, out, dt, TAGS[len(shape)][channels_last])
    expected = ref.resampling(x, out, linear=True)
    err = np.abs(got.astype(np.float64) - expected)
    if dt == DataType.f32:
        ulp = float(np.spacing(np.abs(x).max()))
        assert err.max() <= 4 * ulp, (err.max(), ulp)
    else:
        assert err.max() <= 0.5 + 1e-3
        # ×2: weights 1/4 and 3/4, every product and sum exact in float32, so exact ties
        # reach the store, which rounds them half to even
        ties = np.abs(expected - np.floor(expected) - 0.5) < 1e-9
        if all(o == 2 * i for o, i in zip(out, shape[2:], strict=True)):
            assert ties.any()
            np.testing.assert_array_equal(got[ties], np.round(expected[ties]).astype(got.dtype))


def test_factors_are_checked_and_do_not_change_the_result() -> None:
    x = np.arange(6, dtype=F32).reshape(1, 1, 6)
    src = MemoryDesc.from_tag(x.shape, DataType.f32, FormatTag.ncw)
    dst = MemoryDesc.from_tag((1, 1, 12), DataType.f32, FormatTag.ncw)
    with pytest.raises(ValueError, match="factors needs 1"):
        resampling(Alg.resampling_nearest, src, dst, factors=[1.0, 2.0])
    pd = resampling(Alg.resampling_nearest, src, dst, factors=[2.0])
    primitive = pd.create()
    out = Memory(dst)
    primitive.execute(primitive.with_scratchpad({Arg.SRC: Memory.from_array(x), Arg.DST: out}))
    np.testing.assert_array_equal(out.read().ravel(), np.repeat(np.arange(6, dtype=F32), 2))


def test_mismatched_ranks_are_refused() -> None:
    src = MemoryDesc.from_tag((1, 2, 4, 4), DataType.f32, FormatTag.nchw)
    with pytest.raises(ValueError, match="spatial"):
        resampling(Alg.resampling_nearest, src,
                   MemoryDesc.from_tag((1, 2, 8), DataType.f32, FormatTag.ncw))
    with pytest.raises(DnnlError):  # N or C resized: oneDNN refuses
        resampling(Alg.resampling_nearest, src,
                   MemoryDesc.from_tag((1, 4, 8, 8), DataType.f32, FormatTag.nchw))



@pytest.mark.skipif(os.environ.get("ONEDNN_MAX_CPU_ISA") == "AVX2", reason="already under AVX2")
def test_module_under_avx2() -> None:
    env = {**os.environ, "ONEDNN_MAX_CPU_ISA": "AVX2"}
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", __file__],
        cwd=Path(__file__).resolve().parents[2], env=env, capture_output=True, text=True,
        timeout=300, check=False)
    assert result.returncode == 0, result.stdout + result.stderr
