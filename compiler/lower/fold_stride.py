"""A strided int8 convolution of few input channels over the same bytes seen with the stride
folded into the channels (a raw-audio front end: Conv1d of 1 channel, stride 4 to 160).

``Conv(x, W)`` over ``x[N, C, L]`` with stride s reads, for output t, the samples
``x[c, s·t − p + j]``, j < k. With ``j + r = a·s + b`` (b < s; r zero taps put in front so
that the left padding ``p + r`` is a whole number of folds) the sample is
``X[n, b·C + c, t + a − (p + r)/s]`` of the source seen as ``X[N, s·C, L/s]``, and

    Σ_{c,j} W[o, c, j]·x[c, s·t − p + j] = Σ_{b·C+c, a} W'[o, b·C + c, a]·X[b·C + c, t + a − P]

with ``W'[o, b·C + c, a] = W[o, c, a·s + b − r]`` (zero outside the kernel): a convolution of
stride 1, ``s·C`` input channels and ⌈(k + r)/s⌉ taps, padded by ``P = (p + r)/s`` folds on
the left and as many on the right as give the same output length. The same integer products
plus products with zero weights, summed exactly in int32; the same chain after them:
bit-exact. Channels-last, X is x's own bytes (``X[n, b·C + c, t]`` is at ``(s·t + b)·C + c``):
no copy. Only positions a real tap reads must be in X (the tail of a length that is not a
multiple of s is left out when no window reaches it; else the form is not taken).

Why: oneDNN's int8 kernels take the dot product over 4 input channels a step (VNNI's
``vpdpbusd`` sums four u8·s8 products per lane); with one input channel 3 of 4 products are
zero and oneDNN 3.2 runs such a convolution on ``jit_int8``. Measured on a 2-core AMD EPYC
with AVX-512 VNNI, 2 threads, one kernel, as given → folded: an M5 audio classifier's first
layer (1 → 64, k 80, s 4, 16000 samples) 84 → 25 µs; wav2vec2's (1 → 512, k 10, s 5)
91 → 48; openWakeWord's mel STFT (1 → 257, k 512, s 160, 32000 samples) 266 → 39; silero-
vad's (1 → 258, k 256, s 128) 86 → 13 (16000 samples), 5.4 → 2.3 (576); 3 → 64, k 64, s 8
19 → 14; never slower on the shapes measured (3 → 32, k 3, s 2 2.2 → 2.2; 1 → 16, k 4, s 2
1.8 → 1.7); under ``ONEDNN_MAX_CPU_ISA=AVX2`` 1 → 64, k 400, s 160 68 → 13 µs, 3 → 32, k 3,
s 2 3.2 → 3.5. Taken for a one-group convolution of fewer than ``VNNI_GROUP`` input
channels whose last spatial axis has a stride and every other one is a single position
read by a kernel of 1 (1-D; jax2tf's ``[N, C, 1, L]`` as passes/wide_conv.py leaves it),
without dilation, over a channels-last source (for one channel: any layout with unit
position stride). Composer option ``fold_stride``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np

from qfuse.compiler.lower.context import LowerContext
from qfuse.ir import TensorInfo
from qfuse.runtime.onednn import MemoryDesc

VNNI_GROUP = 4  # input channels one VNNI step sums: fewer leave products at zero


@dataclass(frozen=True)
class Fold:
    """How a convolution's stride folds into its channels (module docstring)."""

    stride: int  # s: positions folded into one
    kernel: int  # k: the given kernel's taps
    lead: int  # r: zero taps in front of the kernel
    taps: int  # ⌈(k + r) / s⌉: the folded kernel's length
    length: int  # folds of the source the folded convolution reads
    pad_left: int  # P, in folds
    pad_right: int  # in folds

    @property
    def zero_taps(self) -> int:
        """Taps of the folded kernel (per channel of the source) that are zeros."""
        return self.taps * self.stride - self.kernel

    def weights(self, w: np.ndarray) -> np.ndarray:
        """W' ([O, s·C, 1…, taps]) of ``w`` ([O, C, 1…, k])."""
        o, c = w.shape[:2]
        ones = w.shape[2:-1]
        s = self.stride
        padded = np.zeros((o, c, *ones, self.taps * s), w.dtype)
        padded[..., self.lead:self.lead + self.kernel] = w
        # [O, C, 1…, a, b] → [O, b, C, 1…, a] → [O, b·C + c, 1…, a]
        split = padded.reshape(o, c, *ones, self.taps, s)
        rank = split.ndim
        order = (0, rank - 1, 1, *range(2, rank - 1))
        return np.ascontiguousarray(split.transpose(order).reshape(o, s * c, *ones, self.taps))

    def geometry(self, rank: int) -> dict[str, Sequence[int]]:
        """The folded convolution's oneDNN geometry over ``rank`` spatial dims."""
        ones, zeros = (1,) * rank, (0,) * rank
        return {"strides": ones, "padding_l": (*zeros[1:], self.pad_left),
                "padding_r": (*zeros[1:], self.pad_right), "dilation": zeros}


def wanted(xinfo: TensorInfo, yinfo: TensorInfo, w: np.ndarray, group: int,
           geometry: dict[str, Sequence[int]]) -> Fold | None:
    """The fold of an int8 convolution (weights ``w`` [O, C, k…]) where it is taken (module
    docstring), else None."""
    strides, pads_l = geometry["strides"], geometry["padding_l"]
    pads_r, dilation = geometry["padding_r"], geometry["dilation"]
    length, s, k = xinfo.shape[-1], int(strides[-1]), int(w.shape[-1])
    if (group != 1 or not xinfo.dtype.is_integer or w.shape[1] >= VNNI_GROUP or s < 2
            or any(dilation) or len(xinfo.shape) != len(w.shape)
            or any(n != 1 or kk != 1 or st != 1 or pl or pr for n, kk, st, pl, pr in zip(
                xinfo.shape[2:-1], w.shape[2:-1], strides[:-1], pads_l[:-1], pads_r[:-1],
                strict=True))):
        return None
    p = int(pads_l[-1])
    out = yinfo.shape[-1]
    lead = (-p) % s
    taps = -(-(k + lead) // s)
    pad_left = (p + lead) // s
    folds = min(length // s, out - 1 + taps - pad_left)
    last_read = min(length - 1, s * (out - 1) - p + k - 1)  # the last sample a real tap reads
    if folds < 1 or last_read >= s * folds:
        return None
    return Fold(s, k, lead, taps, folds, pad_left, out - 1 + taps - pad_left - folds)


def folded_source(ctx: LowerContext, value: str, fold: Fold) -> tuple[str, TensorInfo] | None:
    """``value`` ([N, C, 1…, L]) seen as X ([N, s·C, 1…, folds]): a view of its bytes, shared
    by every reader, with its tensor info; None where its layout gives no such view (channels
    not innermost, a blocked layout)."""
    info = ctx.info(value)
    n, c = info.shape[:2]
    s = fold.stride
    shape = (n, s * c, *info.shape[2:-1], fold.length)
    wide = replace(info, shape=shape)
    name = f"{value}@fold{s}"
    if name in ctx.home:
        return name, wide
    home = ctx.home_slot(value)
    md = ctx.slots[home].md
    strides = md.strides
    if strides is None or md.inner_blocks:
        return None
    step = strides[-1]  # one position
    if c == 1:
        channel = step
    elif step == c * strides[1]:
        channel = strides[1]
    else:
        return None
    view = MemoryDesc.from_strides(shape, md.dtype,
                                   (strides[0], channel, *strides[2:-1], s * step))
    ctx.home[name] = ctx.temp(name, view, alias=home)
    return name, wide
