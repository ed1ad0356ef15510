"""compiler/lower/reorder_check.py: a layout-changing reorder with zero points is checked
against the same reorder in two steps; oneDNN 3.2's jit reorder drops the zero point of an
nchw → nhwc reorder of more than 16 channels not a multiple of 4 (AVX-512; the check finds
whatever this ISA does), and the lowering then takes the two steps."""

from __future__ import annotations

import numpy as np
import pytest

from qfuse.compiler.lower import reorder_check
from qfuse.compiler.lower.reorder_check import two_step_middle
from qfuse.runtime.onednn import Arg, DataType, Memory, MemoryDesc, PrimitiveAttr, reorder
from qfuse.runtime.onednn.memory import default_stream
from qfuse.runtime.onednn.primitive import Primitive

ZP = -4


def _mds(channels: int) -> tuple[MemoryDesc, MemoryDesc]:
    shape = (1, channels, 8, 8)
    nchw = MemoryDesc.from_strides(shape, DataType.s8, (channels * 64, 64, 8, 1))
    nhwc = MemoryDesc.from_strides(shape, DataType.f32, (channels * 64, 1, 8 * channels,
                                                         channels))
    return nchw, nhwc


def _single_reorder_right(channels: int) -> bool:
    """The one reorder s8 nchw → f32 nhwc with src zero point ZP against numpy."""
    src_md, dst_md = _mds(channels)
    q = np.random.default_rng(1).integers(-128, 128, (1, channels, 8, 8)).astype(np.int8)
    src = Memory(src_md, np.ascontiguousarray(q).reshape(-1).view(np.uint8))
    out = np.zeros(dst_md.size, np.uint8)
    dst = Memory(dst_md, out)
    attr = PrimitiveAttr().set_zero_points_mask(int(Arg.SRC), 0)
    primitive = Primitive(reorder(src_md, dst_md, attr=attr))
    primitive.execute(primitive.with_scratchpad({
        int(Arg.SRC): src, int(Arg.DST): dst,
        int(Arg.ATTR_ZERO_POINTS | Arg.SRC): Memory.zero_points(ZP)}), default_stream())
    got = out.view(np.float32).reshape(1, 8, 8, channels).transpose(0, 3, 1, 2)
    return bool(np.array_equal(got, q.astype(np.float32) - ZP))


@pytest.mark.parametrize("channels", [7, 16, 20, 21, 33])
def test_the_check_says_whether_the_reorder_keeps_its_zero_point(channels: int) -> None:
    src_md, dst_md = _mds(channels)
    attr = PrimitiveAttr().set_zero_points_mask(int(Arg.SRC), 0)
    fixed = {int(Arg.ATTR_ZERO_POINTS | Arg.SRC): Memory.zero_points(ZP)}
    middle = two_step_middle(src_md, dst_md, attr, fixed)
    assert (middle is None) == _single_reorder_right(channels)
    if middle is not None:  # the source's layout in the destination's type
        assert middle.strides == src_md.strides and middle.dtype == DataType.f32


def test_no_zero_point_or_no_layout_change_runs_nothing(monkeypatch) -> None:
    """The check runs reorders at compile time only where a zero point meets a layout
    change: a reorder without zero points, or into the same layout, is not run."""
    def refuse(*args: object) -> None:
        raise AssertionError("a reorder ran")

    monkeypatch.setattr(reorder_check, "run_once", refuse)
    src_md, dst_md = _mds(21)
    assert two_step_middle(src_md, dst_md, None, {}) is None
    same = MemoryDesc.from_strides(src_md.dims, DataType.f32, src_md.strides)
    attr = PrimitiveAttr().set_zero_points_mask(int(Arg.SRC), 0)
    assert two_step_middle(src_md, same, attr,
                           {int(Arg.ATTR_ZERO_POINTS | Arg.SRC): Memory.zero_points(ZP)}) is None
