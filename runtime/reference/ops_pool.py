"""AveragePool and GlobalAveragePool in float32, in the order ONNX Runtime's CPU kernels use.

Every sum below is a chain of float32 additions in the order given, and the average is one
float32 division ``sum / f32(count)``; the result is therefore bit-identical to ONNX Runtime
1.31's CPU kernel that the same order describes (checked element for element by
tests/runtime/test_reference_ort_kernels.py). A window's taps at ``o·s - pad_begin + j·d``
(``j < k``) are *valid* when they fall inside the input; padding contributes nothing to a sum.

ONNX Runtime picks the kernel from the attributes (``core/providers/cpu/nn/pool.cc``; the
ceil_mode + count_include_pad rule is measured, on 1.31 at opset 17, not read from its source):

- dilations > 1, or ceil_mode together with count_include_pad: the generic functor
  (``pool_functors.h`` ``AveragePool{1,2,3}DTask``): ``acc = 0``, then ``acc += x`` for every
  valid tap in row-major order (first kernel dim outermost). count_include_pad: the divisor is
  ``Π (min(start + k·d, size + pad_end) - start - 1) // d + 1`` (taps up to the end padding,
  ceil_mode's extra taps beyond it not counted), else the number of valid taps; no valid tap
  leaves 0.
- otherwise MLAS ``MlasPool`` (``mlas/lib/pooling.cpp``):

  - *global* (kernel = input spatial shape, strides 1, no padding; also GlobalAveragePool):
    the ``S`` spatial elements of a channel, flattened, are summed in four lanes, lane ``l``
    taking elements ``4i + l`` (``i < S // 4``) in order; then ``(l0 + l2) + (l1 + l3)``;
    then the ``S % 4`` remaining elements one by one; divided by ``f32(S)``.
  - *vector* (2-D or 3-D, last stride <= 2, every kernel dim <= 32, padded width <= 2045):
    for each output row, the valid input rows of the window (for 3-D: planes, then rows)
    are summed column by column into a row buffer; the buffer is framed with pad_begin zeros
    on the left and zeros on the right, and output ``w`` is
    ``buf[w·s] + buf[w·s + 1] + ... + buf[w·s + k - 1]`` (zeros included, left to right).
    Divisor: ``k_h·k_w`` (``·k_d``) with count_include_pad, else
    ``(min(w·s + k, pad + W) - max(w·s, pad)) · rows`` (rows: the valid leading taps).
  - *generic* (everything else, 1-D always): row-major sum of the valid taps as in the functor,
    divided by ``Π k`` with count_include_pad, else by the number of valid taps.

ONNX Runtime runs AveragePool of opset >= 19 with the functor whatever the attributes, so on
such models the reference (which follows the opset <= 18 choice above; the IR does not record
the opset) may differ from it in the last float32 bit where MLAS is picked. The sign of a zero
sum may also differ (MLAS starts some chains from a loaded value, not from +0.0); it does not
change any value that compares or quantizes differently.
"""

from __future__ import annotations

import itertools
import math

import numpy as np

from qfuse.ir.ops import PoolAttrs

F32 = np.float32
_MLAS_BUFFER = 2048 - 3  # MLAS_POOL_REDUCTION_BUFFER_STACK - MLAS_POOL_REDUCTION_BUFFER_PADDING


def average_pool(x: np.ndarray, attrs: PoolAttrs, outs: list[int]) -> np.ndarray:
    """AveragePool of float32 ``x`` into spatial sizes ``outs`` (module docstring)."""
    n = len(attrs.kernel_shape)
    spatial = x.shape[2:]
    pads_zero = not any(attrs.pads)
    if any(d != 1 for d in attrs.dilations) or (attrs.ceil_mode and attrs.count_include_pad):
        return _functor(x, attrs, outs)
    if tuple(attrs.kernel_shape) == spatial and all(s == 1 for s in attrs.strides) and pads_zero:
        return global_average_pool(x)
    width = spatial[-1] + attrs.pads[n - 1] + attrs.pads[2 * n - 1]
    if (2 <= n <= 3 and attrs.strides[-1] <= 2 and max(attrs.kernel_shape) <= 32
            and width <= _MLAS_BUFFER):
        return _mlas_vector(x, attrs, outs)
    return _mlas_generic(x, attrs, outs)


def global_average_pool(x: np.ndarray) -> np.ndarray:
    """MLAS ``MlasPoolGlobalKernel``: four-lane float32 sum, then the tail, then ``/ f32(S)``."""
    size = math.prod(x.shape[2:])
    flat = x.reshape(x.shape[:2] + (size,))
    quads = size // 4
    lanes = np.zeros(x.shape[:2] + (4,), dtype=F32)
    if quads:
        # ufunc.accumulate adds strictly in order (np.sum would sum pairwise).
        chunks = flat[..., :4 * quads].reshape(x.shape[:2] + (quads, 4))
        lanes = np.add.accumulate(chunks, axis=2, dtype=F32)[..., -1, :]
    total = (lanes[..., 0] + lanes[..., 2]) + (lanes[..., 1] + lanes[..., 3])
    for i in range(4 * quads, size):
        total = total + flat[..., i]
    return (total / F32(size)).reshape(x.shape[:2] + (1,) * (x.ndim - 2))


def _taps(size: int, k: int, s: int, d: int, begin: int, out: int) -> tuple[np.ndarray, ...]:
    """Per output position and tap of one dim: clipped index, validity, and window start."""
    start = np.arange(out) * s - begin
    pos = start[:, None] + np.arange(k)[None, :] * d
    valid = (pos >= 0) & (pos < size)
    return np.clip(pos, 0, size - 1), valid, start


def _dims(x: np.ndarray, attrs: PoolAttrs, outs: list[int]) -> list[tuple[np.ndarray, ...]]:
    n = len(outs)
    return [_taps(x.shape[2 + i], attrs.kernel_shape[i], attrs.strides[i], attrs.dilations[i],
                  attrs.pads[i], outs[i]) for i in range(n)]


def _outer(arrays: list[np.ndarray]) -> np.ndarray:
    """Outer product of per-dim 1-D arrays, shaped like the output grid."""
    result = np.ones((), dtype=arrays[0].dtype)
    for a in arrays:
        result = np.multiply.outer(result, a)
    return result


def _row_major_sum(x: np.ndarray, dims: list[tuple[np.ndarray, ...]]) -> tuple[np.ndarray, ...]:
    """``acc = 0; acc += x`` over the valid taps, first kernel dim outermost; and the count."""
    acc = np.zeros(x.shape[:2] + tuple(len(d[0]) for d in dims), dtype=F32)
    count = np.zeros(acc.shape[2:], dtype=np.int64)
    for tap in itertools.product(*(range(d[0].shape[1]) for d in dims)):
        index = np.ix_(*(d[0][:, j] for d, j in zip(dims, tap)))
        valid = _outer([d[1][:, j] for d, j in zip(dims, tap)])
        acc = np.where(valid, acc + x[(slice(None), slice(None)) + index], acc)
        count += valid
    return acc, count


def _divide(total: np.ndarray, divisor: np.ndarray) -> np.ndarray:
    with np.errstate(divide="ignore", invalid="ignore"):
        return (total / divisor.astype(F32)).astype(F32)


def _functor(x: np.ndarray, attrs: PoolAttrs, outs: list[int]) -> np.ndarray:
    dims = _dims(x, attrs, outs)
    total, count = _row_major_sum(x, dims)
    if attrs.count_include_pad:
        n = len(outs)
        per_dim = []
        for i, (_, _, start) in enumerate(dims):
            k, d = attrs.kernel_shape[i], attrs.dilations[i]
            end = np.minimum(start + k * d, x.shape[2 + i] + attrs.pads[n + i])
            per_dim.append((end - start - 1) // d + 1)
        divisor = _outer(per_dim)
    else:
        divisor = count
    return np.where(count > 0, _divide(total, divisor), F32(0))


def _mlas_generic(x: np.ndarray, attrs: PoolAttrs, outs: list[int]) -> np.ndarray:
    total, count = _row_major_sum(x, _dims(x, attrs, outs))
    if attrs.count_include_pad:
        count = np.full_like(count, math.prod(attrs.kernel_shape))
    return _divide(total, count)


def _mlas_vector(x: np.ndarray, attrs: PoolAttrs, outs: list[int]) -> np.ndarray:
    """``MlasPool{2,3}DVectorKernel``: column sums over the leading dims, then along the row."""
    n = len(outs)
    lead = _dims(x, attrs, outs)[:-1]
    width, kw, sw = x.shape[-1], attrs.kernel_shape[-1], attrs.strides[-1]
    pad = attrs.pads[n - 1]
    columns = np.zeros(x.shape[:2] + tuple(outs[:-1]) + (width,), dtype=F32)
    rows = np.zeros(tuple(outs[:-1]), dtype=np.int64)
    for tap in itertools.product(*(range(d[0].shape[1]) for d in lead)):
        index = np.ix_(*(d[0][:, j] for d, j in zip(lead, tap)))
        valid = _outer([d[1][:, j] for d, j in zip(lead, tap)])
        picked = x[(slice(None), slice(None)) + index + (slice(None),)]
        columns = np.where(valid[..., None], columns + picked, columns)
        rows += valid
    starts = np.arange(outs[-1]) * sw
    right = max(0, int(starts[-1]) + kw - (pad + width))
    buf = np.pad(columns, [(0, 0)] * (columns.ndim - 1) + [(pad, right)])
    total = buf[..., starts]
    for j in range(1, kw):
        total = total + buf[..., starts + j]
    if attrs.count_include_pad:
        divisor = np.full(tuple(outs), math.prod(attrs.kernel_shape), dtype=np.int64)
    else:
        span = np.minimum(starts + kw, pad + width) - np.maximum(starts, pad)
        divisor = np.maximum(np.multiply.outer(rows, span), 1)
    return _divide(total, divisor)
