"""Does a reorder that changes the layout keep its zero points? oneDNN 3.2 says so, not always.

oneDNN 3.2's ``jit:uni`` reorder from a row-major (nchw) source to a channels-last (nhwc)
destination drops the zero point — src or dst, s8 / u8 / f32 on either side — when there are
more than 16 channels and their count is not a multiple of 4 (measured on a 2-core AMD EPYC with
AVX-512, 1x{1..69}x8x8: every such count from 17 on wrong, by exactly the zero point; nhwc →
nchw, and the same layout on both sides, right). qfuse's dequantize of a Concat's nchw output
into the nhwc a convolution reads was 4 steps off everywhere (the fuzzer's seed 291980).

``two_step_middle`` runs the reorder once on deterministic data of its own descriptors
against the same reorder in two steps — the scales and zero points in the source's layout,
then a plain copy into the destination's — and compares the bytes. The lowering uses the two
steps wherever the one disagrees (LowerContext.add_reorder), and merge_copies does not merge a
copy into a reorder where it would (compiler/lower/merge_copies.py). Exact: the two steps are
the reorder's own arithmetic, done where it is right, and a copy.
"""

from __future__ import annotations

import numpy as np

from qfuse.compiler.lower.layouts import md_like
from qfuse.runtime.onednn import (
    Arg,
    DataType,
    Memory,
    MemoryDesc,
    PrimitiveAttr,
    PrimitiveDesc,
    reorder,
)
from qfuse.runtime.onednn.primitive import Primitive


def two_step_middle(src_md: MemoryDesc, dst_md: MemoryDesc, attr: PrimitiveAttr | None,
                    fixed: dict[int, Memory]) -> MemoryDesc | None:
    """The descriptor between the two steps — the source's layout, the destination's data
    type — when the reorder ``src_md → dst_md`` with ``attr`` and its ``fixed`` scale and
    zero-point arguments writes other bytes than those two steps (module docstring), else
    None. No run where there is nothing to check: no zero point, no layout change, or a
    blocked source."""
    if not any(int(arg) & int(Arg.ATTR_ZERO_POINTS) for arg in fixed) or (
            src_md.is_plain and dst_md.is_plain and src_md.strides == dst_md.strides):
        return None
    middle = md_like(src_md, dst_md.dtype)
    if middle is None:
        return None
    source = Memory(src_md, _data(src_md))
    one_bytes, two_bytes = np.zeros(dst_md.size, np.uint8), np.zeros(dst_md.size, np.uint8)
    run_once(reorder(src_md, dst_md, attr=attr),
             {int(Arg.SRC): source, int(Arg.DST): Memory(dst_md, one_bytes), **fixed})
    step = Memory(middle, np.zeros(middle.size, np.uint8))
    run_once(reorder(src_md, middle, attr=attr),
             {int(Arg.SRC): source, int(Arg.DST): step, **fixed})
    run_once(reorder(middle, dst_md),
             {int(Arg.SRC): step, int(Arg.DST): Memory(dst_md, two_bytes)})
    return None if np.array_equal(one_bytes, two_bytes) else middle


def _data(md: MemoryDesc) -> np.ndarray:
    """``md.size`` bytes of values of md's type (f32: −300..300, halves included; integers:
    every byte value)."""
    rng = np.random.default_rng(0)
    if md.dtype == DataType.f32:
        values = rng.integers(-600, 601, md.size // 4).astype(np.float32) / 2
        return values.view(np.uint8)
    return rng.integers(0, 256, md.size, dtype=np.uint8)


def run_once(pd: PrimitiveDesc, args: dict[int, Memory]) -> None:
    """Create ``pd``'s primitive and run it once on ``args`` (a scratchpad added), waiting:
    the compile-time checks that run a kernel on probe data (here, merge_copies)."""
    primitive = Primitive(pd)
    primitive.execute(primitive.with_scratchpad(args))
