"""An int8 convolution of few input channels and a long, overlapping kernel as a 1x1
convolution over its windows (an STFT written as a Conv1d).

``Conv(x, W)`` over ``x[N, C, L]`` with a kernel of k taps, stride s < k, no padding and no
dilation reads, for output position t, the window ``x[:, t·s : t·s + k]``. Laid out as
``P[n, c·k + j, t] = x[n, c, t·s + j]`` (the windows side by side, channels-last) it is the
1x1 convolution of P with the weights viewed as ``[O, C·k, 1]``: the same integer products,
summed exactly in int32, with the same chain: bit-exact. The same holds in 2-D, per spatial
dim (``windows_source`` builds it), but there it measured slower (``ONE_D``).

The windows overlap (k > s) and oneDNN's memory descriptors take no overlapping strides, so P
is copied in ⌈k/s⌉ column blocks (per dim; their product in 2-D): block a holds the taps
``a·s … a·s + s − 1`` of every window, and for those ``x[t·s + a·s + b]`` is a view of x with
stride s along t — no two of its elements overlap. One jit reorder a block.

Why: oneDNN 3.2 runs an int8 convolution of one input channel on ``jit_int8``, which walks
the taps with the channel as the vector dim. Measured on a 2-core AMD EPYC with AVX-512 VNNI,
2 threads, u8 → u8: openWakeWord's mel front end (1 → 257 channels, k 512, s 160, 16000
samples) 143 µs; as 4 block copies (18 µs) and a 1x1 convolution on ``brgconv_1x1`` (18 µs),
36 µs. wav2vec2's first convolution (1 → 512, k 10, s 5) 97 → 12 + 47 µs. Where the direct
kernel's cost is small the copies do not pay (1 → 64, k 400, s 160: 17.7 → 15 + 7 µs;
silero-vad's 1 → 258, k 256, s 128 over 576 samples: 6.8 → 3 + 5 µs; 3 → 64, k 64, s 8:
6.3 → 32 + 6 µs): the form is taken from ``MIN_MACS`` multiply-adds, up to ``MAX_CHANNELS``
input channels and ``MAX_BLOCKS`` copies. A kernel that equals its stride tiles its input
without overlap: passes/patch_conv.py rewrites those in the graph. Composer option
``conv_windows``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np

from qfuse.compiler.lower.context import LowerContext
from qfuse.compiler.lower.layouts import channels_last, row_major
from qfuse.ir import TensorInfo
from qfuse.runtime.onednn import MemoryDesc

MAX_CHANNELS = 4  # input channels up to which oneDNN's direct int8 kernels are slow
MIN_MACS = 4_000_000  # multiply-adds from which the direct kernel's cost passes the copies'
MAX_BLOCKS = 8  # column-block copies (one reorder each) at most
# Spatial ranks taken. 2-D works the same way, but measured it does not pay: PiT-Ti's
# 3-channel 16x16 stride-8 patch embedding 1.028x the model's latency as windows,
# Inception-v3's 3-channel 3x3 stride-2 stem 1.008x (in one process, alternating).
ONE_D = (1,)


@dataclass(frozen=True)
class Windows:
    """How a convolution's source is laid out as its windows."""

    kernel: tuple[int, ...]
    strides: tuple[int, ...]
    out: tuple[int, ...]  # output spatial dims

    @property
    def per_dim(self) -> tuple[int, ...]:
        """Column blocks per spatial dim, ⌈k / s⌉."""
        return tuple(-(-k // s) for k, s in zip(self.kernel, self.strides, strict=True))

    @property
    def blocks(self) -> int:
        return math.prod(self.per_dim)


def wanted(xinfo: TensorInfo, yinfo: TensorInfo, w: np.ndarray, group: int,
           geometry: dict[str, Sequence[int]]) -> Windows | None:
    """The windows form for an int8 convolution (weights ``w`` [O, C, k…]) where it pays
    (module docstring), else None."""
    kernel = tuple(int(k) for k in w.shape[2:])
    strides = tuple(int(s) for s in geometry["strides"])
    if (group != 1 or not xinfo.dtype.is_integer or len(kernel) not in ONE_D
            or xinfo.shape[1] > MAX_CHANNELS or any(geometry["padding_l"])
            or any(geometry["padding_r"]) or any(geometry["dilation"])
            or all(k <= s for k, s in zip(kernel, strides, strict=True))):
        return None
    windows = Windows(kernel, strides, tuple(yinfo.shape[2:]))
    macs = math.prod(yinfo.shape) * math.prod(w.shape[1:])
    if macs < MIN_MACS or windows.blocks > MAX_BLOCKS:
        return None
    return windows


def windows_source(ctx: LowerContext, value: str, windows: Windows) -> tuple[str, TensorInfo]:
    """``value`` ([N, C, spatial…]) as its windows P ([N, C·prod(k), out…], channels-last; a
    value only the lowering knows, shared by every reader), copied in ``windows.blocks``
    reorders (module docstring), with its tensor info."""
    info = ctx.info(value)
    n, c = info.shape[:2]
    depth = c * math.prod(windows.kernel)
    shape = (n, depth, *windows.out)
    wide = replace(info, shape=shape)
    name = f"{value}@windows"
    if name in ctx.home:
        return name, wide
    src = ctx.strided_home(value)
    md = ctx.slots[src].md
    x_strides = md.strides
    assert x_strides is not None
    rank = len(windows.kernel)
    copy = ctx.temp(name, channels_last(shape, md.dtype))
    # P's bytes as [N, out…, C, k…] (channels-last P: the window's values innermost)
    dense = row_major((n, *windows.out, c, *windows.kernel))
    itemsize = md.numpy_dtype.itemsize
    spatial, taps_dense = x_strides[2:], dense[2 + rank:]
    # window t's tap j of x, for the taps of one block: x's own strides, s-fold along t
    src_strides = (x_strides[0], *(s * st for s, st in zip(windows.strides, spatial,
                                                           strict=True)),
                   x_strides[1], *spatial)
    for block in np.ndindex(*windows.per_dim):
        first = [a * s for a, s in zip(block, windows.strides, strict=True)]  # its first tap
        taps = [min(s, k - f) for f, k, s in zip(first, windows.kernel, windows.strides,
                                                 strict=True)]
        view_dims = (n, *windows.out, c, *taps)
        src_offset = sum(f * st for f, st in zip(first, spatial, strict=True))
        dst_offset = sum(f * st for f, st in zip(first, taps_dense, strict=True))
        reads = ctx.temp(f"{name}_from", MemoryDesc.from_strides(view_dims, md.dtype,
                                                                 src_strides),
                         alias=src, offset=src_offset * itemsize)
        writes = ctx.temp(f"{name}_into", MemoryDesc.from_strides(view_dims, md.dtype, dense),
                          alias=copy, offset=dst_offset * itemsize)
        ctx.add_reorder(reads, writes, role="op",
                        note=f"'{value}' as its {'x'.join(map(str, windows.kernel))} windows "
                             f"with strides {windows.strides}: taps from {block} (module "
                             "conv_windows)")
    ctx.home[name] = copy
    return name, wide
